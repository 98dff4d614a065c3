"""A sandbox changed while it runs (#25's lifecycle part): labels and finding by them, its time
left extended and shortened, another identity the proxy applies at the next request (on a
connection already open too), and creates that a retry cannot double."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator

import pytest

from sealgate.reasons import Reason
from sealgate.sandbox.clients.client import DaemonError, Sandbox
from tests.harness import Origin, Proxy

from .conftest import Daemon, sealgate


@pytest.fixture
def made(sandboxd: Daemon) -> Iterator[list[Sandbox]]:
    sandboxes: list[Sandbox] = []
    yield sandboxes
    for sb in sandboxes:
        sb.delete()


def _create(daemon: Daemon, made: list[Sandbox], sandbox: str = "ci-bot",
            **options: object) -> Sandbox:
    sb = Sandbox.create(sandbox, daemon=str(daemon.socket), **options)  # type: ignore[arg-type]
    made.append(sb)
    return sb


def test_labels_filter_the_list(sandboxd: Daemon, made: list[Sandbox]) -> None:
    one = _create(sandboxd, made, metadata={"team": "red", "run": "1"})
    two = _create(sandboxd, made, metadata={"team": "blue"})
    assert one.info["metadata"] == {"team": "red", "run": "1"}
    found = sandboxd.client.list(metadata={"team": "red"})
    assert [s["id"] for s in found] == [one.id]
    assert sandboxd.client.list(metadata={"team": "red", "run": "2"}) == []
    two.update(metadata={"team": "red"})
    assert {s["id"] for s in sandboxd.client.list(metadata={"team": "red"})} == {one.id, two.id}
    listed = sealgate("sandbox", "ls", "--metadata", "team=blue", "--daemon",
                      str(sandboxd.socket))
    assert listed.returncode == 0 and one.id not in listed.stdout, listed
    for bad in ({"x": 1}, {"": "v"}, {"k" * 65: "v"}, {f"k{i}": "v" for i in range(65)},
                {"k": "line\nbreak"}):
        with pytest.raises(DaemonError) as refused:
            _create(sandboxd, made, metadata=bad)
        assert refused.value.reason is Reason.BAD_REQUEST, bad
    with pytest.raises(DaemonError) as refused:
        sandboxd.client.call("GET", "/v1/sandboxes?team=red")
    assert refused.value.reason is Reason.BAD_REQUEST


def test_time_left_extended_then_shortened_to_its_end(sandboxd: Daemon,
                                                      made: list[Sandbox]) -> None:
    sb = _create(sandboxd, made, ttl=5)
    assert sb.update(ttl=3000)["expires_in"] > 2900
    assert sb.update(idle_timeout=50)["idle_timeout"] == 50
    with pytest.raises(DaemonError) as refused:
        sb.update(ttl=10 ** 9)  # over the daemon's maximum
    assert refused.value.reason is Reason.BAD_REQUEST
    sb.update(ttl=1)
    deadline = time.monotonic() + 20  # the daemon looks every half second
    while time.monotonic() < deadline:
        try:
            sb.refresh()
        except DaemonError as exc:
            assert exc.reason is Reason.SANDBOX_ENDED and "ttl" in str(exc)
            return
        time.sleep(0.2)
    raise AssertionError("the shortened sandbox did not end")


_KEEP_ALIVE = """
import http.client, os, ssl, sys, time
host, port = sys.argv[1], int(sys.argv[2])
proxy = os.environ["HTTPS_PROXY"].rsplit("/", 1)[-1].rsplit(":", 1)
conn = http.client.HTTPSConnection(proxy[0], int(proxy[1]), timeout=20,
                                   context=ssl.create_default_context())
conn.set_tunnel(host, port)
for path in ("/before", "/after"):
    conn.request("GET", path)
    answer = conn.getresponse()
    print(answer.status, answer.read().decode().strip(), flush=True)
    for _ in range(300 if path == "/before" else 0):  # the test changes the identity meanwhile
        if os.path.exists("/tmp/go"):
            break
        time.sleep(0.1)
"""


def test_another_identity_applies_at_the_next_request(sandboxd: Daemon, made: list[Sandbox],
                                                      dproxy: Proxy,
                                                      origin_https: Origin) -> None:
    """ci-bot may GET api.test, other-bot may not: one kept-alive connection, its first request
    as ci-bot, its second after the switch as other-bot, refused."""
    sb = _create(sandboxd, made)
    origin_https.reset()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(sb.run, ["python3", "-c", _KEEP_ALIVE, "api.test",
                                       str(origin_https.port)], timeout=60)
        dproxy.wait_audit(lambda e: e.get("path") == "/before", timeout=20)
        assert sb.update(sandbox="other-bot")["sandbox"] == "other-bot"
        assert sb.run(["touch", "/tmp/go"]).ok
        done = running.result(timeout=60)
    lines = done.text.splitlines()
    assert lines[0] == "200 hello from origin", done
    assert lines[1].startswith("403"), done
    assert [r.path for r in origin_https.requests] == ["/before"]
    after = dproxy.wait_audit(lambda e: e.get("path") == "/after")
    assert (after["sandbox"], after["decision"]) == ("other-bot", "deny")
    with pytest.raises(DaemonError) as refused:
        sb.update(sandbox="no-such-bot")
    assert refused.value.reason is Reason.UNKNOWN_SANDBOX
    assert sb.refresh()["sandbox"] == "other-bot"  # unchanged by the refusal


def test_a_retried_create_gets_the_same_sandbox(sandboxd: Daemon, made: list[Sandbox]) -> None:
    first = _create(sandboxd, made, idempotency_key="op-123", metadata={"try": "1"})
    again = _create(sandboxd, made, idempotency_key="op-123", metadata={"try": "1"})
    assert again.id == first.id
    with pytest.raises(DaemonError) as refused:  # the same key for another create
        _create(sandboxd, made, idempotency_key="op-123", metadata={"try": "2"})
    assert refused.value.reason is Reason.BAD_REQUEST
    # Concurrent retries (the first answer still being made) share one create too.
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        ids = {f.result().id for f in [pool.submit(_create, sandboxd, made,
                                                   idempotency_key="op-456")
                                       for _ in range(4)]}
    assert len(ids) == 1
    with pytest.raises(DaemonError) as refused:
        sandboxd.client.call("POST", "/v1/sandboxes", {"sandbox": "ci-bot"},
                             headers={"Idempotency-Key": "x" * 129})
    assert refused.value.reason is Reason.BAD_REQUEST
