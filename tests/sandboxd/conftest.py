"""A real proxy on a gateway of its own and a real `sealgate sandboxd` beside it, for the
sandbox sessions' tests (root: namespaces, nftables, cgroups, bubblewrap)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sealgate.sandbox.clients.client import Client, DaemonError
from tests.dnsstub import StubDNS
from tests.harness import (
    ROOT,
    SEALGATE,
    Origin,
    OriginCA,
    Proxy,
    key_digest,
    log_lines,
    sandbox_gateway,
)
from tests.integration import tiers

RANGE, GATEWAY = "10.216.0.0/16", "10.216.255.254"
PLAN = ["--range", RANGE, "--gateway", GATEWAY]
UID_BASE = 3_100_000


def sealgate(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    return subprocess.run([*SEALGATE, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture(scope="package")
def gateway() -> Iterator[None]:
    with sandbox_gateway(PLAN, "/usr/bin/python3"):  # the agent runs the host system's
        yield


@pytest.fixture(scope="package")
def dproxy(
    gateway: None, tmp_path_factory: pytest.TempPathFactory, origin_https: Origin,
    dns: StubDNS, test_ca: OriginCA,
) -> Iterator[Proxy]:
    rules = f"""
version: 1
policies:
  ci:
    allow:
      - host: api.test
        ports: [{origin_https.port}]
        methods: [GET]
    allow_networks: [127.0.0.1/32]
  other:
    allow:
      - host: other.test
        ports: [{origin_https.port}]
    allow_networks: [127.0.0.1/32]
sandboxes:
  ci-bot: {{policy: ci, key_sha256: "{key_digest('never-used-ci-key')}"}}
  other-bot: {{policy: other, key_sha256: "{key_digest('never-used-other-key')}"}}
"""
    p = Proxy(tmp_path_factory.mktemp("sandboxd-proxy"), rules, resolver=dns.address,
              upstream_ca=test_ca.path, listen_host=GATEWAY, transparent_host=GATEWAY)
    yield p
    p.stop()


@dataclass
class Daemon:
    process: subprocess.Popen[str]
    socket: Path
    log: Path

    @property
    def client(self) -> Client:
        return Client(str(self.socket))

    def lines(self) -> list[dict[str, Any]]:
        """Its output parsed: the events (stdout) and the operational log (stderr), each line
        one JSON object with the operational log's fields."""
        return log_lines(self.log.read_text())

    def said(self, event: str) -> list[dict[str, Any]]:
        return [line for line in self.lines() if line["event"] == event]

    def wait_ready(self, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            if self.socket.exists():
                with contextlib.suppress(DaemonError):  # not listening yet
                    if self.client.health().get("ready"):
                        return
            time.sleep(0.05)
        raise AssertionError(f"sandboxd not ready: {self.log.read_text()[-2000:]}")

    def stop(self) -> int:
        self.process.terminate()
        try:
            return self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def launch(proxy: Proxy, where: Path, *extra: str, sock: Path | None = None) -> Daemon:
    """A daemon started, its log in `where`, its API socket there too unless given (a
    successor's is its predecessor's)."""
    sock = sock or where / "sandboxd.sock"
    log = where / "sandboxd.log"
    with open(log, "a") as out:
        process = subprocess.Popen(
            [*SEALGATE, "sandboxd", *PLAN, "--state", str(proxy.state), "--socket", str(sock),
             "--proxy-port", str(proxy.port), "--transparent-port", str(proxy.transparent_port),
             "--uid-base", str(UID_BASE), *extra],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **tiers.ENV})
    return Daemon(process, sock, log)


def start_daemon(proxy: Proxy, where: Path, *extra: str, ready: float = 30,
                 sock: Path | None = None) -> Daemon:
    daemon = launch(proxy, where, *extra, sock=sock)
    try:
        daemon.wait_ready(ready)
    except BaseException:
        daemon.stop()  # never left running past its test
        raise
    return daemon


@pytest.fixture
def daemons(dproxy: Proxy, tmp_path: Path) -> Iterator[Callable[..., Daemon]]:
    """Daemons started in the test's directories (a successor given its predecessor's
    socket), all stopped after it whatever happened (test_adopt, test_adopt_faults)."""
    started: list[Daemon] = []

    def start(*flags: str, sock: Path | None = None, wait: bool = True,
              ready: float = 60) -> Daemon:
        where = tmp_path / f"d{len(started)}"
        where.mkdir()
        daemon = start_daemon(dproxy, where, *flags, sock=sock, ready=ready) if wait \
            else launch(dproxy, where, *flags, sock=sock)
        started.append(daemon)
        return daemon

    yield start
    for daemon in reversed(started):
        if daemon.process.poll() is None:
            daemon.stop()


class TierDaemons:
    """A daemon per tier (`--pool 1`, its self-test on), started when a module first asks for it
    and stopped with the package. test_agent_reach, test_gvisor, test_microvm_guest and test_tiers
    each need a daemon of a tier, not one of their own (each test ends with what it made deleted),
    and a tier's start is the package's longest wait: the microVM's self-test boots a guest."""

    def __init__(self, proxy: Proxy, directories: pytest.TempPathFactory) -> None:
        self.proxy = proxy
        self.directories = directories
        self.started: dict[str, Daemon] = {}

    def get(self, tier: str) -> Daemon:
        if tier not in self.started:
            self.started[tier] = start_daemon(
                self.proxy, self.directories.mktemp(f"sandboxd-{tier}"), "--pool", "1",
                "--isolation", tier, ready=240)
        return self.started[tier]


@pytest.fixture(scope="package")
def tier_daemons(dproxy: Proxy, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[TierDaemons]:
    daemons = TierDaemons(dproxy, tmp_path_factory)
    yield daemons
    for daemon in daemons.started.values():
        daemon.stop()


@pytest.fixture(scope="package")
def sandboxd(dproxy: Proxy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    daemon = start_daemon(dproxy, tmp_path_factory.mktemp("sandboxd"), "--pool", "2",
                          "--no-selftest")
    yield daemon
    daemon.stop()
