"""The agent's packets carried over one byte stream (`sandbox/guest/carry.py`): the daemon's
side (`Sender`) in this process, the pod's (`Receiver`, with the real agent) in a process of its
own under bubblewrap (its own /workspace), joined only by that process's standard input and
output, as the Kubernetes exec stream joins them. What the daemon gets is checked byte for
byte; a pod that speaks out of turn ends the link."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from sealgate.sandbox.guest.carry import POD_FRAME_MAX, Sender
from sealgate.sandbox.guest.carrylink import WINDOW, Link
from sealgate.sandbox.guest.protocol import GUEST_HEADER_MAX, Op, packet

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
_POD = [sys.executable, "-I", "-c", "from sealgate.sandbox.guest.carry import main; main([])"]


def _read(fd: int) -> bytes:
    out = b""
    while data := os.read(fd, 65536):
        out += data
    os.close(fd)
    return out


class Daemon:
    """The daemon's end of the packet pair, and the pod behind the link."""

    def __init__(self, pod: subprocess.Popen[bytes]) -> None:
        assert pod.stdout is not None and pod.stdin is not None
        self.pod = pod
        self.chan, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sender = Sender(theirs, Link(pod.stdout.fileno(), pod.stdin.fileno(),
                                          GUEST_HEADER_MAX, POD_FRAME_MAX))
        self.thread = threading.Thread(target=self.sender.run, daemon=True)
        self.thread.start()
        self.chan.settimeout(20)

    def request(self, op: Op, ident: int, ends: int, **fields: object) -> list[int]:
        """Send a request with `ends` pipes' agent ends (IN first for exec/put, as
        DESCRIPTORS says); our ends back, in the same order."""
        pipes = [os.pipe() for _ in range(ends)]
        ins = {Op.EXEC: 1, Op.PUT: 1}.get(op, 0)
        theirs = [r if i < ins else w for i, (r, w) in enumerate(pipes)]
        ours = [w if i < ins else r for i, (r, w) in enumerate(pipes)]
        socket.send_fds(self.chan, [packet(op, ident, **fields)], theirs)
        for fd in theirs:
            os.close(fd)
        return ours


@contextlib.contextmanager
def _scripted(says: str) -> Iterator[Daemon]:
    """A pod whose end is a script: it says ready, waits for the first request's first byte,
    then does `says` (Python, `encode` at hand) and waits for the link's end."""
    script = ("import os, sys\n"
              "from sealgate.sandbox.guest.protocol import encode\n"
              "os.write(1, encode({'op': 'ready', 'version': 1}))\n"
              "sys.stdin.buffer.read(1)\n"
              f"{says}\n"
              "sys.stdin.buffer.read()\n")
    pod = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE)
    d = Daemon(pod)
    try:
        assert json.loads(d.chan.recv(4096))["op"] == "ready"
        yield d
    finally:
        d.chan.close()
        pod.kill()
        pod.wait(10)
        d.thread.join(10)


@pytest.fixture
def daemon(tmp_path: object) -> Iterator[Daemon]:
    pod = subprocess.Popen(["bwrap", "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                            "--tmpfs", "/workspace", "--die-with-parent", *_POD],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           env={**os.environ, "POD_SAYS": "from-the-pod"})
    d = Daemon(pod)
    try:
        assert json.loads(d.chan.recv(4096)) == {"op": "ready", "version": 1}
        yield d
    finally:
        d.chan.close()
        pod.wait(20)
        d.thread.join(20)


def test_exec_streams_both_ways(daemon: Daemon) -> None:
    stdin, stdout, stderr, status = daemon.request(
        Op.EXEC, 1, 4, argv=["sh", "-c", "tr a-z A-Z; echo $POD_SAYS $ASKED >&2; exit 3"],
        env={"PATH": "/usr/bin:/bin", "ASKED": "asked"}, cwd=None, timeout=20, pids=64,
        tty=None)
    os.write(stdin, b"hello through the stream\n" * 5000)  # more than a frame's chunk
    os.close(stdin)
    assert _read(stdout) == b"HELLO THROUGH THE STREAM\n" * 5000
    # The pod's own environment under the request's.
    assert _read(stderr) == b"from-the-pod asked\n"
    said = json.loads(_read(status))
    assert said["exit"] == 3 and said["ending"] == "exit"


def test_files_put_then_get(daemon: Daemon) -> None:
    data, status = daemon.request(Op.PUT, 1, 2, path="notes/a.txt", size=11, mode=0o644)
    os.write(data, b"hello, pod\n")
    os.close(data)
    assert json.loads(_read(status))["size"] == 11
    data, status = daemon.request(Op.GET, 2, 2, path="notes/a.txt", limit=1 << 20)
    line = json.loads(_read(status))
    assert line["size"] == 11 and _read(data) == b"hello, pod\n"
    # The file is in the pod's own /workspace, not this machine's.
    assert not os.path.exists("/workspace/notes/a.txt")


def test_a_large_get_whose_data_waits_for_its_status(daemon: Daemon) -> None:
    """A get through the real agent: its status line read before a byte of its data."""
    body = os.urandom(3 << 20)
    data, status = daemon.request(Op.PUT, 1, 2, path="big.bin", size=len(body), mode=0o644)
    threading.Thread(target=lambda: (os.write(data, body), os.close(data)), daemon=True).start()
    assert json.loads(_read(status))["size"] == len(body)
    data, status = daemon.request(Op.GET, 2, 2, path="big.bin", limit=16 << 20)
    line = os.read(status, 4096)
    assert json.loads(line)["size"] == len(body)
    assert _read(data) == body
    os.close(status)


def test_data_ahead_of_a_status_holds_nothing_back() -> None:
    """The pod's end sends each descriptor's bytes as they come, in any order: a get's data,
    a window's worth, ahead of its status line must not hold the status back while the daemon
    reads the status first (it did, when one thread wrote every descriptor in turn)."""
    says = ("for _ in range(3):\n"
            "    os.write(1, encode({'op': 'data', 'id': 1, 'fd': 0}, b'd' * 65536))\n"
            "os.write(1, encode({'op': 'data', 'id': 1, 'fd': 0}))\n"
            "os.write(1, encode({'op': 'data', 'id': 1, 'fd': 1}, b'{\"size\": 196608}\\n'))\n"
            "os.write(1, encode({'op': 'data', 'id': 1, 'fd': 1}))")
    with _scripted(says) as d:
        data, status = d.request(Op.GET, 1, 2, path="big.bin", limit=16 << 20)
        ready = select.select([status], [], [], 20)[0]
        assert ready, "the status line was held behind the data"
        assert json.loads(_read(status)) == {"size": 3 << 16}
        assert _read(data) == b"d" * (3 << 16)


def test_kill_reaches_a_command_whose_input_is_never_read(daemon: Daemon) -> None:
    """A command that reads nothing holds its input back; the kill behind it still arrives."""
    stdin, stdout, stderr, status = daemon.request(
        Op.EXEC, 7, 4, argv=["sleep", "60"], env={"PATH": "/usr/bin:/bin"}, cwd=None,
        timeout=60, pids=64, tty=None)
    writer = threading.Thread(target=lambda: _fill(stdin), daemon=True)
    writer.start()
    socket.send_fds(daemon.chan, [packet(Op.KILL, 7)], [])
    said = json.loads(_read(status))
    assert said["ending"] == "killed"
    _read(stdout), _read(stderr)


def _fill(fd: int) -> None:
    try:
        while True:
            os.write(fd, b"x" * 65536)
    except OSError:
        pass
    finally:
        os.close(fd)


_OUT_OF_TURN = {
    "an answer never asked for": "os.write(1, encode({'op': 'exit', 'id': 1, 'code': 0}))",
    "ready twice": "os.write(1, encode({'op': 'ready', 'version': 1}))",
    "a frame over the pod's bound": "os.write(1, (1 << 20).to_bytes(4, 'big') + b'{}\\n')",
    "a header nested too deep": "os.write(1, encode({'op': 'data', 'fd': 1, 'id': "
                                "__import__('json').loads('[' * 40 + '1' + ']' * 40)}))",
    "a field of the wrong type": "os.write(1, encode({'op': 'data', 'id': '1', 'fd': 3}))",
    "a stream past its window": "for _ in range(5):\n"
                                "    os.write(1, encode({'op': 'data', 'id': 1, 'fd': 0}, "
                                "b'x' * 65536))",
    "a flood for no stream": "for _ in range(20000):\n"
                             "    os.write(1, encode({'op': 'data', 'id': 99, 'fd': 1}, b'x'))",
    "a credit out of range": "os.write(1, encode({'op': 'credit', 'id': 1, 'fd': 0, "
                             "'n': 1 << 40}))",
}


@pytest.mark.parametrize("said", _OUT_OF_TURN.values(), ids=list(_OUT_OF_TURN))
def test_a_pod_that_speaks_out_of_turn_ends_the_link(said: str) -> None:
    """What the pod sends is untrusted: anything but its one ready and data for what it may
    write ends the link, and every descriptor held closes (the request is lost, never left
    hanging)."""
    with _scripted(said) as d:
        data, status = d.request(Op.GET, 1, 2, path="a", limit=10)
        # No status line; of the data, at most what was within the stream's window.
        assert _read(status) == b"" and len(_read(data)) <= WINDOW
        d.thread.join(10)
        assert not d.thread.is_alive()
        assert d.chan.recv(4096) == b""  # the daemon's end sees the sandbox gone


def test_data_for_a_descriptor_the_pod_does_not_write_is_dropped() -> None:
    """A pod writing into a request's input, or into a request never made, reaches nothing."""
    says = ("os.write(1, encode({'op': 'data', 'id': 1, 'fd': 0}, b'into-stdin'))\n"
            "os.write(1, encode({'op': 'data', 'id': 99, 'fd': 1}, b'nobody'))\n"
            "os.write(1, encode({'op': 'data', 'id': 1, 'fd': 3}, b'{\"exit\": 0}\\n'))\n"
            "os.write(1, encode({'op': 'data', 'id': 1, 'fd': 3}))")
    with _scripted(says) as d:
        stdin, stdout, stderr, status = d.request(
            Op.EXEC, 1, 4, argv=["true"], env={}, cwd=None, timeout=5, pids=1, tty=None)
        assert _read(status) == b'{"exit": 0}\n'
        os.close(stdin)
    assert _read(stdout) == b"" and _read(stderr) == b""


def test_a_closed_link_never_writes_to_its_number_again() -> None:
    """Once a link is closed, a thread still sending (a stream's end, the last kill) must not
    write into whatever now holds its descriptor number: another sandbox's link, say."""
    ours, theirs = socket.socketpair()
    link = Link(ours.fileno(), ours.fileno(), GUEST_HEADER_MAX, POD_FRAME_MAX, sock=ours)
    number = ours.fileno()
    link.close()
    other, peer = socket.socketpair()  # the lowest free numbers: the link's among them
    try:
        assert number in (other.fileno(), peer.fileno())
        with pytest.raises(OSError):
            link.send({"op": "kill", "id": 0, "all": True})
        other.setblocking(False), peer.setblocking(False)
        for sock in (other, peer):
            with pytest.raises(BlockingIOError):
                sock.recv(100)
    finally:
        other.close(), peer.close(), theirs.close()


def test_requests_a_pod_ignores_leave_nothing_once_the_daemon_gives_up() -> None:
    """A pod that never answers: each abandoned request's streams end once the daemon has
    closed its ends (within the carry's look, bounded here), not when the sandbox ends."""
    with _scripted("pass") as d:
        before = threading.active_count()
        for ident in range(1, 51):
            for fd in d.request(Op.EXEC, ident, 4, argv=["true"], env={}, cwd=None, timeout=5,
                                pids=8, tty=None):
                os.close(fd)
        deadline = time.monotonic() + 20
        while threading.active_count() > before + 2:
            assert time.monotonic() < deadline, threading.active_count() - before
            time.sleep(0.1)


def test_a_kill_arrives_behind_input_a_command_never_reads(daemon: Daemon) -> None:
    """Megabytes of input a command never reads fill only its own stream's window: the kill
    behind them still arrives, and the sandbox's other requests are answered (the pod's end
    once stopped reading the link when a shared budget was spent)."""
    stdin, stdout, stderr, status = daemon.request(
        Op.EXEC, 1, 4, argv=["sleep", "60"], env={"PATH": "/usr/bin:/bin"}, cwd=None,
        timeout=60, pids=64, tty=None)
    written = [0]

    def fill() -> None:
        with contextlib.suppress(OSError):
            for _ in range(192):  # 12 MiB
                written[0] += os.write(stdin, b"x" * 65536)
        os.close(stdin)

    threading.Thread(target=fill, daemon=True).start()
    deadline = time.monotonic() + 10
    while written[0] < 1 << 18 and time.monotonic() < deadline:
        time.sleep(0.05)  # the window and the pipes absorb this much before the writer stops
    data, got = daemon.request(Op.GET, 2, 2, path="nothing-here", limit=10)
    assert select.select([got], [], [], 10)[0], "another request went unanswered"
    assert b"error" in _read(got)
    os.close(data)
    socket.send_fds(daemon.chan, [packet(Op.KILL, 1)], [])
    assert select.select([status], [], [], 10)[0], "the kill never arrived"
    assert json.loads(_read(status))["ending"] == "killed"
    _read(stdout), _read(stderr)
