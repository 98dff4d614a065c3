"""The TypeScript client (`@sealgate/sandbox`, sandbox/clients/typescript) as tests run it: with
`node` (>= 20; the test skips, saying why, without it) and an environment of their own. Shared by
tests/sandboxd/test_typescript_client.py (its `node --test` suite against a daemon on this host)
and tests/integration/test_sandbox_kubernetes.py (the client against the Kubernetes backend).

The client is plain JavaScript with nothing to build and no runtime dependency; `make ts-client`
installs its dev dependencies and type-checks it before pytest (the test session's network
namespace cannot reach npm)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.harness import ROOT

PACKAGE = ROOT / "sandbox" / "clients" / "typescript"


def find_node() -> str:
    """`node` (>= 20) and the client's package, or a skip that says which is missing."""
    found = shutil.which("node")
    if found is None:
        pytest.skip("no node on PATH: the TypeScript client's tests need Node.js >= 20")
    version = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30,
                             check=False).stdout.strip()
    major = re.match(r"v(\d+)\.", version)
    if major is None or int(major.group(1)) < 20:
        pytest.skip(f"node {version or '?'} is older than the client's 20")
    if not (PACKAGE / "index.js").is_file():
        pytest.skip(f"no TypeScript client at {PACKAGE} (index.js)")
    return found


def node_env(node: str, daemon: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a node process driving `daemon` (a socket path or URL), nothing of
    the test session's beyond PATH."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(PACKAGE),
           "SEALGATE_SANDBOXD": daemon, "NO_COLOR": "1", **(extra or {})}
    # Node 20 and 21 have the global WebSocket (the client's terminals) behind a flag.
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    if re.match(r"v2[01]\.", version):
        env["NODE_OPTIONS"] = "--experimental-websocket"
    return env
