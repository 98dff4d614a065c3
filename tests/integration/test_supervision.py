"""The proxy's processes under faults: a dead worker is started again while the others serve, a
crash loop stops the supervisor saying so, and SIGTERM lets requests in flight finish."""

from __future__ import annotations

import http.server
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from sealgate.proxy.process.controlclient import call
from sealgate.proxy.process.statedir import control_socket as socket_path
from tests.conftest import KEYS, rules_allowing
from tests.harness import Origin, Proxy, ProxyFactory, free_port, log_lines

SLOW_SECONDS = 1.5


class SlowOrigin:
    """Answers every request after `delay` seconds; counts the requests that arrived."""

    def __init__(self, delay: float) -> None:
        self.arrived = 0
        lock = threading.Lock()
        origin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                with lock:
                    origin.arrived += 1
                time.sleep(delay)
                body = b"slow but whole\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def slow() -> Iterator[SlowOrigin]:
    origin = SlowOrigin(SLOW_SECONDS)
    yield origin
    origin.stop()


def session(proxy: Proxy) -> requests.Session:
    s = requests.Session()
    s.trust_env = False
    s.proxies = {"http": proxy.url("bot-1", KEYS["bot-1"])}
    return s


def workers(proxy: Proxy) -> dict[int, int]:
    """worker index -> pid, of the supervisor's children."""
    pid = proxy.process.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    found = {}
    for child in children:
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--worker-index" in argv:
            found[int(argv[argv.index(b"--worker-index") + 1])] = int(child)
    return found


def when(value: dict[int, int], test: Any) -> dict[int, int] | None:
    return value if test(value) else None


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_killed_worker_is_started_again_and_the_others_keep_serving(
    tmp_path: Path, origin_http: Origin, proxy_with: ProxyFactory
) -> None:
    with proxy_with(rules_allowing("api.test", origin_http.port), directory=tmp_path,
                    options=["--workers", "2"]) as p:
        before = wait_for(lambda: when(workers(p), lambda w: len(w) == 2), 20, "2 workers")
        wait_for(lambda: sum(e["event"] == "proxy_started" for e in p.audit()) == 2, 20,
                 "both workers up")
        url = f"http://api.test:{origin_http.port}/alive"
        failures: list[str] = []
        served = 0
        os.kill(before[0], signal.SIGKILL)
        # Connections the kernel queued on the dead worker's socket before it closed are lost
        # with it; from then on every new one goes to the survivor. Closed means reaped: a
        # killed process's main thread shows as a zombie while its other threads are still
        # exiting, and the descriptors they share (the listening socket) close with the last
        # one; the supervisor can reap it only after that.
        wait_for(lambda: not Path(f"/proc/{before[0]}").exists(), 10, "worker 0 reaped")
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # a new connection each time: any worker may get it
            try:
                with session(p) as s:
                    r = s.get(url, timeout=5)
                served += 1
                if r.status_code != 200:
                    failures.append(f"{r.status_code} {r.text[:200]}")
            except requests.RequestException as exc:
                failures.append(type(exc).__name__ + str(exc)[:200])
            time.sleep(0.02)  # under the default request budget
        assert served > 20 and not failures, (served, len(failures), failures[:5])
        after = wait_for(lambda: when(workers(p), lambda w: len(w) == 2 and w[0] != before[0]),
                         20, "worker 0 started again")
        assert after[1] == before[1]  # the survivor was left alone
        assert p.process.poll() is None
        assert any(line["event"] == "worker exited; starting it again" and line["worker"] == 0
                   and line["level"] == "warning" for line in log_lines(p.stderr()))


def test_a_crash_loop_stops_the_supervisor_and_says_so(
    tmp_path: Path, origin_http: Origin, proxy_with: ProxyFactory
) -> None:
    with proxy_with(rules_allowing("api.test", origin_http.port), directory=tmp_path,
                    options=["--workers", "2"]) as p:
        killed: set[int] = set()
        for _ in range(5):
            found = wait_for(lambda: when(workers(p), lambda w: w.get(1) not in {*killed, None}),
                             30, "worker 1 again")
            pid = found[1]
            killed.add(pid)
            os.kill(pid, signal.SIGKILL)
        assert p.process.wait(timeout=30) == 1
        (said,) = [line for line in log_lines(p.stderr()) if "crash loop" in line["event"]]
        assert (said["level"], said["worker"], said["deaths"]) == ("error", 1, 5), said
        assert not workers_alive(killed)


def workers_alive(pids: set[int]) -> bool:
    return any(Path(f"/proc/{pid}").exists() and "zombie" not in
               Path(f"/proc/{pid}/status").read_text().lower() for pid in pids)


@pytest.mark.parametrize("count", [1, 2])
def test_sigterm_lets_requests_in_flight_finish(
    tmp_path: Path, slow: SlowOrigin, proxy_with: ProxyFactory, count: int
) -> None:
    admin = free_port()
    with proxy_with(rules_allowing("api.test", slow.port), directory=tmp_path,
                    options=["--workers", str(count), "--admin", f"127.0.0.1:{admin}"]) as p:
        readyz = f"http://127.0.0.1:{admin}/readyz"
        wait_for(lambda: requests.get(readyz, timeout=5).status_code == 200, 20, "ready")
        assert requests.get(readyz, timeout=5).json() == {"ready": True, "workers": count}
        url = f"http://api.test:{slow.port}/slow"
        with ThreadPoolExecutor(10) as pool:
            futures = [pool.submit(lambda: session(p).get(url, timeout=30)) for _ in range(10)]
            wait_for(lambda: slow.arrived == 10, 10, "all 10 at the origin")
            p.signal(signal.SIGTERM)
            time.sleep(0.3)
            # Not ready any more, and no longer accepting.
            status, health = call(socket_path(p.state), "GET", "/v1/health")
            assert (status, health) == (503, {"ok": False, "draining": True})
            ready = requests.get(readyz, timeout=5)
            assert (ready.status_code, ready.json()) == (
                503, {"ready": False, "unready": ["draining"]})
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", p.port), timeout=2).close()
            answers = [f.result() for f in futures]
        assert [(r.status_code, r.text) for r in answers] == [(200, "slow but whole\n")] * 10
        assert p.process.wait(timeout=20) == 0
        drained = [e for e in p.audit() if e["event"] == "proxy_drained"]
        assert len(drained) == count and all(e["cut"] == 0 for e in drained), drained


def test_the_drain_timeout_cuts_what_is_left(
    tmp_path: Path, proxy_with: ProxyFactory
) -> None:
    hung = SlowOrigin(20)
    try:
        with proxy_with(rules_allowing("api.test", hung.port), directory=tmp_path,
                        options=["--drain-timeout", "0.5"]) as p:
            url = f"http://api.test:{hung.port}/hung"
            with ThreadPoolExecutor(1) as pool:
                future = pool.submit(lambda: session(p).get(url, timeout=30))
                wait_for(lambda: hung.arrived == 1, 10, "the request at the origin")
                started = time.monotonic()
                p.signal(signal.SIGTERM)
                assert p.process.wait(timeout=10) == 0
                assert time.monotonic() - started < 5
                with pytest.raises(requests.RequestException):
                    future.result()
            (drained,) = [e for e in p.audit() if e["event"] == "proxy_drained"]
            assert drained["cut"] == 1
    finally:
        hung.stop()


def test_refused_requests_are_not_waited_for(
    tmp_path: Path, origin_http: Origin, proxy_with: ProxyFactory
) -> None:
    """A request answered by the proxy itself (refused) ends its flight: the drain is at once."""
    with proxy_with(rules_allowing("api.test", origin_http.port), directory=tmp_path) as p:
        with session(p) as s:
            for _ in range(5):
                assert s.get(f"http://other.test:{origin_http.port}/", timeout=5).status_code == 403
            assert s.get(f"http://api.test:{origin_http.port}/", timeout=5).status_code == 200
        p.signal(signal.SIGTERM)
        assert p.process.wait(timeout=10) == 0
        (drained,) = [e for e in p.audit() if e["event"] == "proxy_drained"]
        assert drained["cut"] == 0 and drained["waited_ms"] < 100
