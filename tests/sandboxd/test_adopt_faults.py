"""A hand-over that goes wrong (`sealgate sandboxd --adopt`, `sandbox.daemon.handover`): a
record a successor cannot read is refused in words, never a traceback; a SIGTERM halfway leaves
every sandbox exactly one owner; a slot handed over twice is refused.

Real daemons and sandboxes; the other side, where a test needs it to stop halfway or lie, is a
process speaking the protocol with the daemon's own functions (tests/sandboxd/handtaker.py), or
the test itself on a real unix socket."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sealgate.sandbox.clients.client import DaemonError, Sandbox
from sealgate.sandbox.daemon import adopt, daemoncli, handover, serve
from sealgate.sandbox.host import network
from tests.harness import ROOT, Proxy, quiet
from tests.sandboxd.conftest import PLAN, UID_BASE, Daemon
from tests.sandboxd.test_adopt import _FLAGS, create, group_members, index_of, refused
from tests.sandboxd.test_lifecycle import host, until

pytestmark = pytest.mark.root


def want_of(proxy: Proxy, api: Path) -> dict[str, Any]:
    """What a daemon of the tests' settings (conftest.launch, `_FLAGS`) says in its hello,
    from the command line as the daemon parses it."""
    parser = argparse.ArgumentParser()
    daemoncli.register(parser.add_subparsers())
    args = parser.parse_args([
        "sandboxd", *PLAN, "--state", str(proxy.state), "--socket", str(api),
        "--proxy-port", str(proxy.port), "--transparent-port", str(proxy.transparent_port),
        "--uid-base", str(UID_BASE), *_FLAGS])
    return adopt.want(serve.Settings.of(args))


@contextlib.contextmanager
def taker(proxy: Proxy, old: Daemon, mode: str, relay: Path | None = None
          ) -> Iterator[subprocess.Popen[str]]:
    """tests/sandboxd/handtaker.py, once it has got as far as `mode`; killed after."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.sandboxd.handtaker",
         str(handover.path_for(proxy.state, old.socket)), json.dumps(want_of(proxy, old.socket)),
         mode, *([] if relay is None else [str(relay)])],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None
    try:
        assert process.stdout.readline() == f"{mode}\n", process.poll()
        yield process
    finally:
        process.stdin.close()
        process.wait(30)


def test_a_sigterm_halfway_leaves_every_sandbox_one_owner(
    daemons: Callable[..., Daemon], dproxy: Proxy
) -> None:
    # The successor committed (the leases its), its `taken` not yet read: they are its; the
    # old daemon's stop must not end them.
    old = daemons(*_FLAGS)
    index = index_of(create(old))
    with taker(dproxy, old, "committed") as successor:
        old.process.terminate()
        assert old.process.wait(30) == 0, old.log.read_text()
        assert "handed every sandbox over" in old.log.read_text()
        assert group_members(index), "the old daemon ended a sandbox another had taken"
        assert host().of(successor.pid)["leases"] == 2  # the sandbox and the pool's slot
    # Its holder gone, the sandbox goes (its channel and watchdog pipe closed with it).
    until(lambda: not group_members(index), 10, "the sandbox's processes dead")
    first = successor.pid
    # Not committed: still the old daemon's, so its stop ends them, as a stop does.
    old = daemons(*_FLAGS)  # and cleans up after the first successor
    assert host().of(first) == host().of(-1)
    index = index_of(create(old))
    with taker(dproxy, old, "received") as successor:
        old.process.terminate()
        assert old.process.wait(30) == 0, old.log.read_text()
        assert "handed every sandbox over" not in old.log.read_text()
        assert not group_members(index)
        assert host().of(successor.pid)["leases"] == 0
    assert host().orphans() == [], host().orphans()


def test_a_slot_handed_over_twice_is_refused(
    daemons: Callable[..., Daemon], dproxy: Proxy, tmp_path: Path
) -> None:
    old = daemons(*_FLAGS)
    sb = create(old)
    sb.write("f", b"x")
    api = tmp_path / "next.sock"
    # The middle one commits nothing: what it relays is refused before any commit.
    with taker(dproxy, old, "received", relay=api) as middle:
        assert middle.stdout is not None
        assert middle.stdout.readline() == "serving\n"
        new = daemons(*_FLAGS, "--adopt", sock=api, wait=False)
        answer = json.loads(middle.stdout.readline())
        words = refused(new)
        assert "handed over twice" in answer.get("refused", ""), answer
        assert "handed over twice" in words and quiet(words), words
    # The middle one gone, having committed nothing: the old daemon serves on.
    until(lambda: served(sb), 30, "the old daemon serving again")
    assert host().of(old.process.pid)["leases"] == 2
    assert sb.read("f") == b"x"


def served(sb: Sandbox) -> bool:
    try:
        return sb.run(["true"]).ok
    except DaemonError:  # 503 while held
        return False


def test_a_commit_that_fails_halfway_leaves_every_lease_as_it_was(
    daemons: Callable[..., Daemon]
) -> None:
    old = daemons(*_FLAGS)
    sb = create(old)

    def held() -> list[int]:
        return sorted(i for i, p in host().leases.items() if p == old.process.pid)
    until(lambda: len(held()) == 2, 30, "the pool refilled")  # the sandbox and a pool slot
    # The pool's slot was made after the sandbox's, so is handed over, and leased, second.
    second = next(i for i in held() if i != index_of(sb))
    before = {i: network.lease_path(i).read_bytes() for i in held()}
    blocker = network.lease_path(second).with_suffix(".tmp")  # where its lease is written
    blocker.mkdir()
    try:
        words = refused(daemons(*_FLAGS, "--adopt", sock=old.socket, wait=False))
    finally:
        blocker.rmdir()
    assert "Is a directory" in words and quiet(words), words
    until(lambda: served(sb), 30, "the old daemon serving again")
    # The first lease, rewritten before the second failed, is the old daemon's as it was.
    assert {i: network.lease_path(i).read_bytes() for i in held()} == before


@contextlib.contextmanager
def old_daemon_of(proxy: Proxy, api: Path) -> Iterator[socket.socket]:
    """The test as the daemon serving `api`: its hand-over socket, listening (and a listening
    socket itself, so it can stand for the API's at the end of a hand-over)."""
    path = handover.path_for(proxy.state, api)
    path.parent.mkdir(mode=0o700, exist_ok=True)  # as a daemon makes it
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as server:
        server.bind(str(path))
        server.listen(1)
        server.settimeout(60)
        try:
            yield server
        finally:
            path.unlink()


@contextlib.contextmanager
def offering(daemons: Callable[..., Daemon], proxy: Proxy, tmp_path: Path,
             count: int) -> Iterator[tuple[Daemon, socket.socket, socket.socket]]:
    """A successor started against the test as its old daemon, which has taken its hello and
    offered it `count` sandboxes: (the successor, the hand-over connection, the listener)."""
    api = tmp_path / "api.sock"
    with old_daemon_of(proxy, api) as server:
        new = daemons(*_FLAGS, "--adopt", sock=api, wait=False)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(60)
            handover.receive(conn)  # its hello
            handover.send(conn, {"offer": count, "pid": os.getpid()})
            yield new, conn, server


@pytest.mark.parametrize(("packet", "fds"), [
    (b'{"slot": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", 0),  # past the parser's depth
    (b'{"slot": [1, 2]}', 4),  # not an object, with its descriptors
    (b'{"slot": {"index": 0, "groups": "x", "session": [1]}}', 4),
])
def test_a_record_the_successor_cannot_read_is_refused_in_words(
    daemons: Callable[..., Daemon], dproxy: Proxy, tmp_path: Path, packet: bytes, fds: int
) -> None:
    with offering(daemons, dproxy, tmp_path, 1) as (new, conn, server):
        r, w = os.pipe()
        try:
            socket.send_fds(conn, [packet], [r, w, r, w][:fds])
            socket.send_fds(conn, [b'{"end": true}'], [server.fileno()])
        finally:
            os.close(r)
            os.close(w)
        words = refused(new)
    assert "serves on" in words and quiet(words), words


def test_a_successor_told_to_stop_halfway_takes_nothing(
    daemons: Callable[..., Daemon], dproxy: Proxy, tmp_path: Path
) -> None:
    with offering(daemons, dproxy, tmp_path, 0) as (new, conn, server):
        new.process.terminate()  # halfway: the end not sent yet
        until(lambda: '"event": "stop_requested"' in new.log.read_text(), 30,
              "the successor's SIGTERM handled")
        socket.send_fds(conn, [b'{"end": true}'], [server.fileno()])
        answer, _ = handover.receive(conn)
        words = refused(new)
    assert "told to stop" in answer["refused"], answer
    assert "told to stop" in words and quiet(words), words
