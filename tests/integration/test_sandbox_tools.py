"""The tools a build runs, inside a real sandbox of every tier, through the proxy with its CA
trusted from the environment the runtime gives: pip installing from a package index over HTTPS,
git cloning over HTTPS (the "dumb" protocol: plain GETs of a bare repository's files).

The index and the repository are served by one HTTPS origin on loopback under the name
`pkgs.test` (the stub DNS answers it; the test CA issued its certificate, which only the proxy
trusts): the client in the sandbox trusts the proxy's CA and nothing else, so each request that
arrived went through the proxy. The origin records every path it served.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import ssl
import subprocess
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dnsstub import StubDNS
from tests.harness import ROOT, SEALGATE, OriginCA, Proxy, key_digest, sandbox_gateway
from tests.integration.tiers import ENV as TIER_ENV
from tests.integration.tiers import TIERS

pytestmark = pytest.mark.root

RANGE, GATEWAY = "10.233.0.0/16", "10.233.255.254"
PLAN = ["--range", RANGE, "--gateway", GATEWAY]
HOST = "pkgs.test"
VALUE = "sgtool from the local index"


class StaticOrigin:
    """HTTPS static files from `root`, every path served recorded."""

    def __init__(self, root: Path, tls: tuple[Path, Path]) -> None:
        self.paths: list[str] = []
        seen = self.paths

        class Handler(http.server.SimpleHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.path)
                super().do_GET()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*map(str, tls))
        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _wheel(directory: Path) -> str:
    """A pure-Python wheel, written by hand: what pip installs from the index."""
    name = "sgtool-1.0-py3-none-any.whl"
    files = {
        "sgtool.py": f"VALUE = {VALUE!r}\n",
        "sgtool-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: sgtool\nVersion: 1.0\n",
        "sgtool-1.0.dist-info/WHEEL": ("Wheel-Version: 1.0\nGenerator: sealgate-tests\n"
                                       "Root-Is-Purelib: true\nTag: py3-none-any\n"),
    }
    files["sgtool-1.0.dist-info/RECORD"] = "".join(f"{f},,\n" for f in files) + \
        "sgtool-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(directory / name, "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
    return name


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, timeout=30,
                   env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "GIT_AUTHOR_NAME": "t",
                        "GIT_AUTHOR_EMAIL": "t@test", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@test"})


@pytest.fixture(scope="module")
def origin(test_ca: OriginCA, dns: StubDNS) -> Iterator[StaticOrigin]:
    root = Path(tempfile.mkdtemp(prefix="sealgate-tools-origin-"))
    try:
        (root / "files").mkdir()
        wheel = _wheel(root / "files")
        index = root / "simple" / "sgtool"
        index.mkdir(parents=True)
        (index / "index.html").write_text(
            f'<html><body><a href="../../files/{wheel}">{wheel}</a></body></html>\n')
        work = root / "work"
        work.mkdir()
        (work / "README").write_text("cloned through sealgate\n")
        _git("init", "-q", "-b", "main", cwd=work)
        _git("add", "README", cwd=work)
        _git("commit", "-q", "-m", "one", cwd=work)
        _git("clone", "-q", "--bare", str(work), str(root / "repo.git"), cwd=root)
        _git("update-server-info", cwd=root / "repo.git")
        dns.set(HOST, "A 127.0.0.1")
        served = StaticOrigin(root, test_ca.issue(HOST))
        yield served
        served.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def tproxy(tmp_path_factory: pytest.TempPathFactory, origin: StaticOrigin, dns: StubDNS,
           test_ca: OriginCA) -> Iterator[Proxy]:
    with sandbox_gateway(PLAN, "/usr/bin/python3", "/usr/bin/git"):
        rules = f"""
version: 1
policies:
  build:
    allow:
      - host: {HOST}
        ports: [{origin.port}]
        methods: [GET]
    allow_networks: [127.0.0.1/32]
sandboxes:
  build-1: {{policy: build, key_sha256: "{key_digest('never-used-build-key')}"}}
"""
        p = Proxy(tmp_path_factory.mktemp("sandbox-tools"), rules, resolver=dns.address,
                  upstream_ca=test_ca.path, listen_host=GATEWAY, transparent_host=GATEWAY)
        yield p
        p.stop()


def run(p: Proxy, tier: str, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SEALGATE, "sandbox", "run", *PLAN, "--sandbox", "build-1", "--state", str(p.state),
         "--proxy-port", str(p.port), "--transparent-port", str(p.transparent_port),
         "--isolation", tier, "--", "/bin/sh", "-c", script],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **TIER_ENV},
    )


@pytest.mark.parametrize("tier", TIERS)
def test_pip_installs_from_an_index_over_https(tproxy: Proxy, origin: StaticOrigin,
                                               tier: str) -> None:
    origin.paths.clear()
    done = run(tproxy, tier, (
        "cd /tmp && python3 -m pip install -q --no-cache-dir --disable-pip-version-check "
        f"--index-url https://{HOST}:{origin.port}/simple/ --target /tmp/t sgtool && "
        "PYTHONPATH=/tmp/t python3 -c 'import sgtool; print(sgtool.VALUE)'"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert VALUE in done.stdout
    assert "/simple/sgtool/" in origin.paths
    assert "/files/sgtool-1.0-py3-none-any.whl" in origin.paths
    line = tproxy.wait_audit(lambda e: e.get("path") == "/files/sgtool-1.0-py3-none-any.whl")
    assert (line["sandbox"], line["decision"]) == ("build-1", "allow")


@pytest.mark.parametrize("tier", TIERS)
def test_git_clones_over_https(tproxy: Proxy, origin: StaticOrigin, tier: str) -> None:
    origin.paths.clear()
    done = run(tproxy, tier, (
        f"cd /tmp && HOME=/tmp git clone -q https://{HOST}:{origin.port}/repo.git r && "
        "cat r/README"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cloned through sealgate" in done.stdout
    assert any(p.startswith("/repo.git/info/refs") for p in origin.paths), origin.paths
    assert any(p.startswith("/repo.git/objects/") for p in origin.paths), origin.paths
    line = tproxy.wait_audit(lambda e: str(e.get("path")).startswith("/repo.git/objects/"))
    assert (line["sandbox"], line["decision"]) == ("build-1", "allow")
