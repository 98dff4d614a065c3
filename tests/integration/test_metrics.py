"""`GET /metrics` (--admin) and the control socket's /v1/metrics: the workers' requests by
decision and reason, injections, latencies and gauges, summed over the workers, in Prometheus'
text format, checked with Prometheus' own `promtool check metrics` after real traffic."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest
import requests

from tests.conftest import KEYS, client, rules_allowing
from tests.harness import ROOT, Origin, Proxy, ProxyFactory, free_port

CANARY = "sk-metrics-canary-not-a-label-7c1d"
REFRESH = "rt-metrics-canary-3e9a"
OAUTH = json.dumps({"refresh_token": REFRESH, "client_id": "c", "client_secret": "s"})


@pytest.fixture(scope="module")
def mproxy(proxy_with: ProxyFactory, origin_http: Origin,
           origin_https: Origin) -> Iterator[tuple[Proxy, int]]:
    port, dead = free_port(), free_port()  # nothing listens on `dead`: its token call fails
    injecting = f"""
      - host: api.test
        ports: [{origin_https.port}]
        paths: ["/inject"]
        inject: [{{secret: "file:api_key", as: bearer}}]
      - host: api.test
        ports: [{origin_https.port}]
        paths: ["/exchange"]
        inject: [{{secret: "file:oauth", as: {{type: oauth2,
                   token_url: "https://127.0.0.1:{dead}/token"}}}}]"""
    rules = rules_allowing("api.test", origin_http.port).replace(
        "    allow_networks:", injecting.lstrip("\n") + "\n    allow_networks:", 1)
    secrets = {"api_key": CANARY, "oauth": json.dumps(OAUTH)}  # YAML reads JSON's quoting
    with proxy_with(rules, name="metrics", secrets=secrets,
                    options=["--workers", "2", "--admin", f"127.0.0.1:{port}"]) as p:
        yield p, port


def scrape(port: int) -> str:
    r = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    return r.text


def workers(text: str) -> int:
    return int(total(text, "sealgate_workers"))


def scrape_until(port: int, ready: Callable[[str], bool], timeout: float = 20.0) -> str:
    """Scrape until `ready` says the figures are in (or the timeout), and return the last.
    A worker writes its snapshot a second after it starts serving and every second after: the
    other may still be starting (seconds, on a loaded machine)."""
    deadline = time.monotonic() + timeout
    text = scrape(port)
    while not ready(text) and time.monotonic() < deadline:
        time.sleep(0.25)
        text = scrape(port)
    return text


def total(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` that carry `labels`."""
    found = 0.0
    for line in text.splitlines():
        match = re.fullmatch(r"(\w+)(?:\{([^}]*)\})? (\S+)", line)
        if match is None or match.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            found += float(match.group(3))
    return found


def test_requests_are_counted_by_decision_and_reason(
    mproxy: tuple[Proxy, int], origin_http: Origin, origin_https: Origin
) -> None:
    p, port = mproxy
    scrape_until(port, lambda t: workers(t) == 2)
    time.sleep(1.2)  # a snapshot a second old may lack the start-up probe's request yet
    before = scrape(port)
    with client(p) as c:
        for _ in range(3):
            assert c.get(f"http://api.test:{origin_http.port}/m", timeout=5).status_code == 200
        denied = c.get(f"http://other.test:{origin_http.port}/m?k={CANARY}", timeout=5)
        assert denied.status_code == 403
        for _ in range(3):  # one tunnel, one worker: after the first, from the cache
            injected = c.get(f"https://api.test:{origin_https.port}/inject", timeout=5)
            assert injected.status_code == 200
        failed = c.get(f"https://api.test:{origin_https.port}/exchange", timeout=15)
        assert failed.status_code >= 500 and REFRESH not in failed.text
    # Three plain GETs, and the HTTPS tunnel's CONNECT and three GETs (a CONNECT has its own
    # line).
    allowed = total(before, "sealgate_requests_total", decision="allow", reason="") + 7
    text = scrape_until(port, lambda t: total(
        t, "sealgate_requests_total", decision="allow", reason="") >= allowed and total(
        t, "sealgate_injections_total", source="broker") >= 3 and total(
        t, "sealgate_token_exchanges_total") >= 1)
    assert total(text, "sealgate_requests_total", decision="allow", reason="") == allowed
    # The secret stores and token endpoints: the file store read for both credentials, the
    # token endpoint called once (a failed call is not repeated for 5 s) and failed.
    assert total(text, "sealgate_secret_fetches_total", store="file", outcome="ok") >= 2
    assert total(text, "sealgate_secret_lookups_total", store="file") >= 2
    # Served from the cache on the request path (the broker asks `fresh` first): counted too.
    assert total(text, "sealgate_secret_lookups_total", store="file", result="hit") >= 2
    assert total(text, "sealgate_secret_fetch_duration_seconds_count", store="file") == total(
        text, "sealgate_secret_fetches_total", store="file")
    assert total(text, "sealgate_token_exchanges_total", kind="oauth2", outcome="failed") == 1
    assert total(text, "sealgate_token_exchanges_total", outcome="obtained") == 0
    assert REFRESH not in text
    assert total(text, "sealgate_requests_total", decision="deny", reason="not_allowed") == (
        total(before, "sealgate_requests_total", decision="deny", reason="not_allowed") + 1)
    assert total(text, "sealgate_injections_total", source="broker") == 3 + total(
        before, "sealgate_injections_total", source="broker")
    count = total(text, "sealgate_request_duration_seconds_count")
    assert count >= 6 and total(text, "sealgate_request_duration_seconds_bucket",
                                le="+Inf") == count
    assert total(text, "sealgate_dns_duration_seconds_count") >= 4
    assert "# TYPE sealgate_request_duration_seconds histogram" in text
    assert total(text, "sealgate_resident_bytes") > 20 * 1024 * 1024  # two workers' RSS
    assert workers(text) == 2 and 'worker="' not in text  # summed, not a series per pid
    assert CANARY not in text and KEYS["bot-1"] not in text
    promtool = shutil.which("promtool", path=f"{ROOT / 'var' / 'tools'}:{os.environ['PATH']}")
    if promtool is None:
        pytest.skip("no promtool (Debian's prometheus package) to check the exposition with")
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                             text=True, timeout=30, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_control_socket_serves_the_same(mproxy: tuple[Proxy, int]) -> None:
    p, port = mproxy
    scrape_until(port, lambda t: workers(t) == 2)
    conn = _UnixHTTP(str(p.state / "control.sock"))
    conn.request("GET", "/v1/metrics")
    answer = conn.getresponse()
    assert answer.status == 200
    text = answer.read().decode()
    assert "# TYPE sealgate_requests_total counter" in text
    assert workers(text) == 2


def test_only_health_and_metrics_are_on_the_admin_listener(mproxy: tuple[Proxy, int]) -> None:
    _, port = mproxy
    for path in ("/v1/sources", "/v1/health", "/v1/metrics"):
        assert requests.get(f"http://127.0.0.1:{port}{path}", timeout=5).status_code == 404


class _UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("sealgate", timeout=5)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(self._path)


def test_kept_upstream_connections_are_counted(
    mproxy: tuple[Proxy, int], origin_http: Origin
) -> None:
    """upstream_connections_total{how}: six client connections to one origin over two
    workers: one worker had three at least, and all but its first rode a kept connection."""
    p, port = mproxy
    before = scrape_until(port, lambda t: workers(t) == 2)
    for _ in range(6):
        with client(p) as c:  # a client connection of its own each
            assert c.get(f"http://api.test:{origin_http.port}/k", timeout=5).status_code == 200
    reused = total(before, "sealgate_upstream_connections_total", how="reused") + 2
    text = scrape_until(port, lambda t: total(
        t, "sealgate_upstream_connections_total", how="reused") >= reused)
    assert total(text, "sealgate_upstream_connections_total", how="reused") >= reused
    assert total(text, "sealgate_upstream_connections_total", how="dialed") >= 1
    assert "# TYPE sealgate_upstream_connections_idle gauge" in text
