"""sealgate's mitmproxy patches, each checked in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any


def test_the_proxy_refuses_to_start_on_an_untested_mitmproxy(tmp_path: Any) -> None:
    script = textwrap.dedent(f"""
        import sys
        from mitmproxy.proxy.layers.http import _http1
        _http1.make_error_response = lambda code: b""
        from sealgate.cli import main
        sys.exit(main(["proxy", "--listen", "127.0.0.1:1", "--state", {str(tmp_path)!r}]))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert "mitmproxy is not as tested" in done.stderr
    assert "_http1.make_error_response: expected parameters" in done.stderr
    assert not (tmp_path / "ca").exists()  # refused before anything was set up


def test_install_patches_only_mitmproxys_own_modules() -> None:
    # In a process of its own: the patches are for the life of a proxy process.
    script = textwrap.dedent("""
        import asyncio, functools
        from mitmproxy import flow, http
        from mitmproxy.proxy import mode_servers, server
        from mitmproxy.proxy.layers.http import _http1
        from sealgate.proxy.engine import mitm, pool, upstream

        real_dial, real_bind = asyncio.open_connection, asyncio.start_server
        mitm.install(3.0, reuse_port=True)
        assert asyncio.open_connection is real_dial and asyncio.start_server is real_bind
        assert server.asyncio is not asyncio and server.asyncio.sleep is asyncio.sleep
        assert server.asyncio.open_connection == pool.installed().dial
        bind = mode_servers.asyncio.start_server
        assert isinstance(bind, functools.partial) and bind.keywords == {"reuse_port": True}
        assert _http1.make_error_response is upstream.error_response
        assert http.MessageData.__post_init__(None) is None
        assert len(flow.uuid.uuid4()) == 36
        try:
            mitm.install(3.0, reuse_port=False)
        except RuntimeError as exc:
            assert "already installed" in str(exc)
        else:
            raise AssertionError("installed twice")
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


def test_without_workers_the_bind_is_mitmproxys_own() -> None:
    script = textwrap.dedent("""
        import asyncio
        from mitmproxy.proxy import mode_servers
        from sealgate.proxy.engine import mitm
        mitm.install(3.0, reuse_port=False)
        assert mode_servers.asyncio is asyncio
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "ok", done.stderr
