"""mitmproxy's internals that proxy/mitm.py patches: as tested, scoped to mitmproxy, guarded."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
from mitmproxy.proxy import server
from mitmproxy.proxy.layers.http import _http1, _http2

from sealgate.proxy.engine import mitm, mitmcheck, upstream


def test_every_patched_symbol_is_as_tested() -> None:
    problems = mitmcheck.mismatches()
    assert not problems, (
        f"mitmproxy changed where sealgate patches it (tested: {mitm.TESTED}.x):\n  "
        + "\n  ".join(problems)
    )


def test_a_changed_signature_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def make_error_response(code: int) -> bytes:
        return b""

    monkeypatch.setattr(_http1, "make_error_response", make_error_response)
    [problem] = mitmcheck.mismatches()
    assert problem == (
        "mitmproxy.proxy.layers.http._http1.make_error_response: expected parameters "
        "(status_code, message=), found (code)"
    )


def test_a_gone_method_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(_http2.Http2Connection, "is_open_for_us")
    [problem] = mitmcheck.mismatches()
    assert problem.startswith("mitmproxy.proxy.layers.http._http2.Http2Server._handle_event: ")
    assert "is_open_for_us" in problem


def test_a_call_no_longer_made_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # mitmproxy dialing some other way than asyncio.open_connection: the bound would be lost.
    async def open_connection(self: Any, command: Any) -> None:
        pass

    monkeypatch.setattr(server.ConnectionHandler, "open_connection", open_connection)
    [problem] = mitmcheck.mismatches()
    assert problem.startswith("mitmproxy.proxy.server.asyncio.open_connection: no longer uses ")


def test_require_tested_refuses_and_lists_every_symbol(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(_http2.Http2Connection, "is_open_for_us")
    monkeypatch.setattr(_http1, "make_error_response", lambda: b"")
    with pytest.raises(mitm.MitmproxyMismatch) as raised:
        mitm.require_tested()
    assert "_http1.make_error_response" in str(raised.value)
    assert "_http2.Http2Server._handle_event" in str(raised.value)


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
        from sealgate.proxy.engine import mitm, upstream

        real_dial, real_bind = asyncio.open_connection, asyncio.start_server
        mitm.install(3.0, reuse_port=True)
        assert asyncio.open_connection is real_dial and asyncio.start_server is real_bind
        assert server.asyncio is not asyncio and server.asyncio.sleep is asyncio.sleep
        assert server.asyncio.open_connection.__wrapped__ is real_dial
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


def test_bounded_dial_says_it_timed_out() -> None:
    async def black_hole(*args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(10)

    dial = upstream.bounded(black_hole, 0.05)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^connect timed out after 0.05 s$"):
        asyncio.run(dial("192.0.2.1", 443))
    assert time.monotonic() - started < 2


def test_listen_endpoints_fill_in_the_defaults() -> None:
    modes = ["regular@127.0.0.1:8080", "transparent@10.200.0.1:8081", "regular"]
    assert mitm.listen_endpoints(modes, "", 3128) == [
        ("127.0.0.1", 8080), ("10.200.0.1", 8081), ("0.0.0.0", 3128)
    ]
    assert mitm.listen_endpoints(["regular"], "10.0.0.1", None) == [("10.0.0.1", 8080)]
