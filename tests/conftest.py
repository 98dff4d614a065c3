"""Shared real parts: one test CA, HTTP and HTTPS origins, a stub resolver and a running proxy.

The session proxy enforces `SESSION_RULES`; tests that need other rules start their own proxy.
Loopback is opened to the `ci` policy the way a user opens an internal range: allow_networks.

The whole session runs in a network namespace of its own with only `lo` (tests.netns), entered
here at import, before pytest or a fixture starts a thread. If that cannot be done the session
stops: the suite asks proxies to reach denied addresses, and with a broken guard they would
really dial them through the host's default route. Name lookups go to the tests' stub
(tests.dnsstub); a proxy started without `--resolver` gets SEALGATE_RESOLVER, port 9 of the
namespace's own loopback, where nothing answers, never the host's name server.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from sealgate.credentials.keys import PublicKeyEntry, generate
from tests.dnsstub import StubDNS
from tests.harness import Origin, OriginCA, Proxy, ProxyFactory, key_digest
from tests.netns import IsolationError, isolate_session

try:
    ISOLATION = isolate_session(worker="PYTEST_XDIST_WORKER" in os.environ)
except IsolationError as _exc:
    pytest.exit(
        f"sealgate tests: {_exc}. The suite runs in a network namespace of its own so that a "
        "broken guard reaches nothing; run it as root, or where unprivileged user namespaces "
        "are allowed (sysctl kernel.unprivileged_userns_clone=1, "
        "kernel.apparmor_restrict_unprivileged_userns=0).",
        returncode=4,
    )
os.environ["SEALGATE_RESOLVER"] = "127.0.0.1:9"


def pytest_report_header() -> str:
    return f"network: a namespace of the session's own, only lo ({ISOLATION})"


# The modules that start sandboxes or boot guests. They share what is the host's, not the
# namespace's: /run/sealgate-slots/<link>, /run/sealgate, the cgroup tree, uids from a fixed
# base, QEMU's CPU (and podman's containers, in the same cgroup tree). Under pytest-xdist they
# run one after another on one worker.
SANDBOXES = ("tests/sandboxd/", "tests/microvm/", "tests/integration/test_sandbox",
             "tests/integration/test_container_images")
# Among those names, the ones that start none: test_sandbox_table builds its own namespaces and
# loads the table alone; test_frames and test_availability boot no guest.
NO_SANDBOX = ("tests/integration/test_sandbox_table.py", "tests/microvm/test_frames.py",
              "tests/microvm/test_availability.py")


def starts_sandboxes(module: str) -> bool:
    return module.startswith(SANDBOXES) and module not in NO_SANDBOX


def work_unit(nodeid: str) -> str:
    """What one xdist worker runs whole: a test's module (its module- and package-scoped proxies
    and daemons start on one worker only), or all the modules that start sandboxes together."""
    module = nodeid.partition("::")[0]
    return "sandboxes" if starts_sandboxes(module) else module


@pytest.hookimpl(optionalhook=True)  # xdist's hook: pytest -p no:xdist knows none
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scheduling by scope, the scopes being `work_unit`s. (Its own xdist_group marks
    group nothing under pytest 9.2: xdist 3.8 renames the item's `_nodeid`, which pytest no
    longer reads.) Only called with -n."""
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return ByWorkUnit(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The sandboxes first: the longest run of the session, it starts at once on one worker while
    the others take the rest (with --no-loadscope-reorder, which keeps this order)."""
    items.sort(key=lambda item: work_unit(item.nodeid) != "sandboxes")


KEYS = {"bot-1": "bot-1-key-canary-7f3a", "rep-1": "rep-1-key", "closed-1": "closed-1-key"}


def session_rules(http_port: int, https_port: int) -> str:
    ports = f"[{http_port}, {https_port}]"
    return f"""
version: 1
policies:
  ci:
    mode: enforce
    allow:
      - host: api.test
        ports: {ports}
      - host: "*.svc.test"
        ports: {ports}
      - host: limited.test
        ports: {ports}
        methods: [GET]
        paths: ["/ok/**"]
      - host: 127.0.0.1
        ports: {ports}
      - host: evil.test
        ports: {ports}
      - host: mixed.test
        ports: {ports}
      - host: meta.test
        ports: {ports}
      - host: v6meta.test
        ports: {ports}
      - host: rebind.test
        ports: {ports}
      - host: nx.test
        ports: {ports}
      - host: slow.test
        ports: {ports}
      - host: localhost
        ports: {ports}
    allow_networks: [127.0.0.1/32]
  reporter:
    mode: report
    allow: []
    allow_networks: [127.0.0.1/32]
  closed:
    mode: enforce
    allow:
      - host: api.test
        ports: {ports}
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
  rep-1: {{policy: reporter, key_sha256: "{key_digest(KEYS['rep-1'])}"}}
  closed-1: {{policy: closed, key_sha256: "{key_digest(KEYS['closed-1'])}"}}
default_policy: null
"""


def rules_allowing(host: str, port: int, extra: str = "") -> str:
    """Rules with one policy, `ci` (bot-1's), allowing `host`:`port` and loopback; `extra` is
    more YAML under `policies:`."""
    return f"""
version: 1
policies:
  ci:
    allow:
      - host: {host}
        ports: [{port}]
    allow_networks: [127.0.0.1/32]
{extra}
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
default_policy: null
"""


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sealgate")


@pytest.fixture(scope="session")
def test_ca(workdir: Path) -> OriginCA:
    return OriginCA(workdir)


@pytest.fixture(scope="session")
def origin_http() -> Iterator[Origin]:
    origin = Origin()
    yield origin
    origin.stop()


@pytest.fixture(scope="session")
def origin_https(test_ca: OriginCA) -> Iterator[Origin]:
    origin = Origin(tls=test_ca.issue("api.test", "limited.test", "*.svc.test", "127.0.0.1"))
    yield origin
    origin.stop()


@pytest.fixture(scope="session")
def dns() -> Iterator[StubDNS]:
    stub = StubDNS().start()
    for name in ("api.test", "limited.test", "a.svc.test", "b.svc.test"):
        stub.set(name, "A 127.0.0.1")
    stub.set("evil.test", "A 10.0.0.1")
    stub.set("mixed.test", "A 127.0.0.1", "A 10.1.2.3")
    stub.set("meta.test", "A 169.254.169.254")
    stub.set("v6meta.test", "AAAA ::ffff:a9fe:a9fe")
    stub.nxdomain("nx.test")
    stub.drop("slow.test")
    yield stub
    stub.stop()


@pytest.fixture(scope="session")
def proxy(
    workdir: Path, origin_http: Origin, origin_https: Origin, dns: StubDNS, test_ca: OriginCA
) -> Iterator[Proxy]:
    directory = workdir / "session-proxy"
    directory.mkdir()
    p = Proxy(
        directory,
        session_rules(origin_http.port, origin_https.port),
        resolver=dns.address,
        upstream_ca=test_ca.path,
    )
    yield p
    p.stop()


@pytest.fixture(scope="session")
def proxy_with(
    tmp_path_factory: pytest.TempPathFactory, dns: StubDNS, test_ca: OriginCA
) -> ProxyFactory:
    """`with proxy_with(rules, secrets=..., token_keys=..., options=[...]) as p:` a proxy of a
    module's or a test's own (tests.harness.ProxyFactory)."""
    return ProxyFactory(tmp_path_factory, dns.address, test_ca.path)


@pytest.fixture(scope="session")
def token_keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PublicKeyEntry]:
    """A directory for --token-keys holding one key pair, and the public key tokens are sealed to.
    Shared: the proxies only read it (a test that revokes or adds keys makes a directory of its
    own)."""
    directory = tmp_path_factory.mktemp("token-keys")
    return directory, generate(directory)


@pytest.fixture()
def trust(proxy: Proxy, test_ca: OriginCA) -> Path:
    """The session proxy's CA (intercepted names) and the origins' (names tunnelled blind)."""
    path = proxy.workdir / "trust.pem"
    if not path.exists():
        path.write_text(proxy.ca.read_text() + test_ca.path.read_text())
    return path


@pytest.fixture()
def origins(origin_http: Origin, origin_https: Origin) -> Iterator[tuple[Origin, Origin]]:
    origin_http.reset()
    origin_https.reset()
    yield origin_http, origin_https


def client(proxy: Proxy, sandbox: str | None = "bot-1") -> requests.Session:
    """A client that trusts the proxy's CA (intercepted hosts) and the origins' (tunnelled)."""
    session = requests.Session()
    session.trust_env = False
    url = proxy.url(sandbox, KEYS.get(sandbox or "", "")) if sandbox else proxy.url()
    session.proxies = {"http": url, "https": url}
    bundle = proxy.workdir / "trust.pem"
    if not bundle.exists():
        origin_ca = proxy.upstream_ca.read_text() if proxy.upstream_ca else ""
        bundle.write_text(proxy.ca.read_text() + origin_ca)
    session.verify = str(bundle)
    return session
