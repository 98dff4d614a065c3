"""The proxy's face (sealgate.proxy) is what the sandbox runtime calls: importing it, or the
sandbox's daemon, runtime and client, must not import mitmproxy (nor aiohttp, nor cryptography),
which the proxy process alone needs. Each check runs in a fresh interpreter: this one has
imported everything already."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sealgate.proxy import (
    ControlError,
    ProxyError,
    SourceRefused,
    ca_bundle_path,
    control_socket,
    register_source,
    unregister_source,
)
from sealgate.proxy.process import statedir
from sealgate.reasons import SealgateError

HEAVY = ("mitmproxy", "aiohttp", "cryptography")


def _imported(*modules: str) -> set[str]:
    """The top-level packages loaded by importing `modules` in a fresh interpreter."""
    script = (f"import sys\nfor m in {list(modules)!r}: __import__(m)\n"
              "import json; print(json.dumps(sorted({n.split('.')[0] for n in sys.modules})))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, timeout=60)
    return set(json.loads(done.stdout))


@pytest.mark.parametrize("module", [
    "sealgate.proxy", "sealgate.sandbox", "sealgate.sandbox.daemon.daemon",
    "sealgate.sandbox.runtime",
])
def test_the_face_and_the_sandbox_runtime_import_no_proxy_machinery(module: str) -> None:
    assert _imported(module).isdisjoint(HEAVY)


def test_the_sandbox_client_imports_neither_mitmproxy_nor_aiohttp() -> None:
    assert _imported("sealgate.sandbox.clients.client").isdisjoint(HEAVY)


def test_the_face_names_the_proxys_own_paths(tmp_path: Path) -> None:
    assert ca_bundle_path(tmp_path) == statedir.ca_paths(statedir.confdir(tmp_path))[1]
    assert control_socket(tmp_path) == tmp_path / "control.sock"


def test_errors_are_the_proxys(tmp_path: Path) -> None:
    assert issubclass(SourceRefused, ControlError)
    assert issubclass(ControlError, ProxyError) and issubclass(ControlError, OSError)
    assert issubclass(ProxyError, SealgateError)
    with pytest.raises(ControlError) as raised:
        register_source(control_socket(tmp_path), "10.200.0.2", "bot-1")  # no proxy there
    assert raised.value.reason == "registry_unavailable"
    with pytest.raises(ControlError):
        unregister_source(control_socket(tmp_path), "10.200.0.2")


def test_a_source_registered_refused_and_unregistered_through_the_face(tmp_path: Path) -> None:
    # The control API's server (process/control.py) on its socket; the face's calls are
    # blocking, so they run in a thread beside its loop.
    from sealgate.proxy.process import control
    from sealgate.proxy.request.registry import SourceRegistry

    rules = tmp_path / "rules.yaml"
    rules.write_text('version: 1\npolicies: {p: {}}\nsandboxes:\n'
                     f'  bot-1: {{policy: p, key_sha256: "{"ab" * 32}"}}\n')
    registry = SourceRegistry(tmp_path / "registry.json")
    sock = control_socket(tmp_path)

    def calls() -> list[object]:
        said: list[object] = [register_source(sock, "10.200.0.2", "bot-1")]
        said.append(dict(registry.entries()))
        try:
            register_source(sock, "10.200.0.3", "nobody")
        except SourceRefused as exc:
            said.append((exc.reason, exc.detail))
        said += [unregister_source(sock, "10.200.0.2"), unregister_source(sock, "10.200.0.2")]
        return said

    async def scenario() -> list[object]:
        runner = await control.start(sock, registry, rules)
        try:
            return await asyncio.to_thread(calls)
        finally:
            await runner.cleanup()

    said = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert said == [None, {"10.200.0.2": "bot-1"},
                    ("unknown_sandbox", "no sandbox 'nobody' in the rules"), True, False]


def test_the_services_face_imports_no_mitmproxy() -> None:
    # sealgate.proxy.calls is what the MCP server (its own virtualenv, no mitmproxy in it)
    # decides, dials, injects and scrubs with: the proxy's own code, without its process.
    assert "mitmproxy" not in _imported("sealgate.proxy.calls")
