"""`GET /metrics` (--metrics-listen) and the control socket's /v1/metrics: every worker's
requests by decision and reason, its refusals and gauges, in Prometheus' text format."""

from __future__ import annotations

import http.client
import re
import socket
import time
from collections.abc import Callable, Iterator

import pytest
import requests

from tests.conftest import KEYS, client, rules_allowing
from tests.harness import Origin, Proxy, ProxyFactory, free_port

CANARY = "sk-metrics-canary-not-a-label-7c1d"


@pytest.fixture(scope="module")
def mproxy(proxy_with: ProxyFactory, origin_http: Origin) -> Iterator[tuple[Proxy, int]]:
    port = free_port()
    with proxy_with(rules_allowing("api.test", origin_http.port), name="metrics",
                    options=["--workers", "2", "--metrics-listen", f"127.0.0.1:{port}"]) as p:
        yield p, port


def scrape(port: int) -> str:
    r = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
    return r.text


def workers(text: str) -> set[str]:
    return set(re.findall(r'worker="(\d+)"', text))


def scrape_until(port: int, ready: Callable[[str], bool], timeout: float = 20.0) -> str:
    """Scrape until `ready` says the figures are in (or the timeout), and return the last.
    A worker writes its snapshot a second after it starts serving and every second after, and
    the proxy says it is ready once worker 0 is: the other may still be starting (seconds, on a
    loaded machine), while one keep-alive client's requests all go to one worker."""
    deadline = time.monotonic() + timeout
    text = scrape(port)
    while not ready(text) and time.monotonic() < deadline:
        time.sleep(0.25)
        text = scrape(port)
    return text


def total(text: str, name: str, **labels: str) -> float:
    """The sum over workers of the samples of `name` that carry `labels`."""
    found = 0.0
    for line in text.splitlines():
        match = re.fullmatch(r"(\w+)\{([^}]*)\} (\S+)", line)
        if match is None or match.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        if all(have.get(k) == v for k, v in labels.items()):
            found += float(match.group(3))
    return found


def test_requests_are_counted_by_decision_and_reason(
    mproxy: tuple[Proxy, int], origin_http: Origin
) -> None:
    p, port = mproxy
    with client(p) as c:
        for _ in range(3):
            assert c.get(f"http://api.test:{origin_http.port}/m", timeout=5).status_code == 200
        denied = c.get(f"http://other.test:{origin_http.port}/m?k={CANARY}", timeout=5)
        assert denied.status_code == 403
    text = scrape_until(port, lambda t: len(workers(t)) == 2 and total(
        t, "sealgate_requests_total", decision="allow") >= 3 and total(
        t, "sealgate_requests_total", decision="deny", reason="not_allowed") >= 1)
    assert total(text, "sealgate_requests_total", decision="allow", reason="") >= 3
    assert total(text, "sealgate_requests_total", decision="deny", reason="not_allowed") >= 1
    assert total(text, "sealgate_request_duration_ms_count") >= 4
    assert "# TYPE sealgate_request_duration_ms histogram" in text
    assert total(text, "sealgate_resident_bytes") > 10 * 1024 * 1024
    assert len(workers(text)) == 2  # each worker's own series
    assert CANARY not in text and KEYS["bot-1"] not in text


def test_the_control_socket_serves_the_same(mproxy: tuple[Proxy, int]) -> None:
    p, port = mproxy
    both = workers(scrape_until(port, lambda t: len(workers(t)) == 2))
    conn = _UnixHTTP(str(p.state / "control.sock"))
    conn.request("GET", "/v1/metrics")
    answer = conn.getresponse()
    assert answer.status == 200
    text = answer.read().decode()
    assert "# TYPE sealgate_requests_total counter" in text
    assert workers(text) == both


def test_only_metrics_are_on_the_tcp_listener(mproxy: tuple[Proxy, int]) -> None:
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
