"""Terminals and signals (#25): a command on a pseudo-terminal opened inside the sandbox,
driven through the daemon's WebSocket (typed, echoed, resized, its exit status at the end) on
every tier that serves one, from the Python clients and from `sealgate sandbox shell` driven
through a pty of the test's; the filter's TIOCSTI and TIOCLINUX refusals on that terminal;
huge and malformed frames closed with their codes; a background process's signals sent to its
process group inside (a trap's handler seen running), and names that are not signals refused."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import os
import re
import select
import struct
import termios
import time
from collections.abc import Iterator

import aiohttp
import pytest

from sealgate.reasons import Reason
from sealgate.sandbox.clients.aclient import AsyncSandbox
from sealgate.sandbox.clients.client import DaemonError, Process, Sandbox, Terminal
from tests.harness import SEALGATE, quiet
from tests.integration.tiers import TIERS
from tests.sandboxd.conftest import Daemon, TierDaemons

pytestmark = [pytest.mark.root]


@pytest.fixture(scope="module", params=TIERS)
def tierd(request: pytest.FixtureRequest, tier_daemons: TierDaemons) -> tuple[str, Daemon]:
    tier = str(request.param)
    return tier, tier_daemons.get(tier)


@pytest.fixture
def sb(sandboxd: Daemon) -> Iterator[Sandbox]:
    with Sandbox.create("ci-bot", daemon=str(sandboxd.socket)) as made:
        yield made


def _until(terminal: Terminal, mark: bytes, seconds: float = 20) -> bytes:
    """What the terminal shows until `mark` has been shown (bounded)."""
    seen = b""
    deadline = time.monotonic() + seconds
    while mark not in seen:
        left = deadline - time.monotonic()
        assert left > 0, seen
        chunk = terminal.read(timeout=left)
        assert chunk, (seen, terminal.result)
        seen += chunk
    return seen


def test_a_terminal_session(tierd: tuple[str, Daemon]) -> None:
    _, daemon = tierd
    with Sandbox.create("ci-bot", daemon=str(daemon.socket), call_timeout=300) as sb, \
            sb.pty(30, 100, ["sh", "-i"]) as terminal:
        terminal.write(b"echo typed-$((6*7)); tty; stty size\n")
        shown = _until(terminal, b"30 100")
        assert b"echo typed-$((6*7))" in shown  # the terminal's echo of what was typed
        assert b"typed-42\r\n" in shown and b"/dev/pts/" in shown  # \r\n: a terminal's
        # A resize reaches the terminal beside what is typed, not in line with it: asked again
        # until it shows (bounded), as a person would look again.
        terminal.resize(12, 34)
        deadline = time.monotonic() + 20
        shown = b""
        while b"12 34" not in shown:
            assert time.monotonic() < deadline, shown
            terminal.write(b"stty size\n")
            shown += _until(terminal, b"$ ")
        terminal.write(b"exit 3\n")
        assert terminal.wait(timeout=20).exit_code == 3


def test_a_command_that_ends_at_once(tierd: tuple[str, Daemon]) -> None:
    """Its end is seen however soon it comes (before its supervisor looks, even), and what it
    showed first."""
    _, daemon = tierd
    with Sandbox.create("ci-bot", daemon=str(daemon.socket), call_timeout=300) as sb:
        for _ in range(5):
            with sb.pty(24, 80, ["printf", "x"]) as terminal:
                assert terminal.read(timeout=20) == b"x"
                assert terminal.wait(timeout=20).exit_code == 0
            with sb.pty(24, 80, ["true"]) as terminal:
                assert terminal.wait(timeout=20).exit_code == 0


_STI = """
import fcntl, termios, sys, os
assert os.isatty(0), "not on a terminal"
for name in ("TIOCSTI", "TIOCLINUX"):
    try:
        fcntl.ioctl(0, getattr(termios, name), b"\\x0c")
        print(name, "allowed")
    except OSError as exc:
        print(name, "refused", exc.errno)
"""


def test_tiocsti_and_tioclinux_stay_refused_on_its_terminal(tierd: tuple[str, Daemon]) -> None:
    tier, daemon = tierd
    if tier == "microvm":  # docs/sandbox.md: no filter in the guest, whose kernel is the wall
        pytest.skip("the microVM guest's commands run without the host's seccomp filter: "
                    "TIOCSTI there types into the guest's own terminal, the command's")
    with Sandbox.create("ci-bot", daemon=str(daemon.socket), call_timeout=300) as sb, \
            sb.pty(24, 80, ["python3", "-c", _STI]) as terminal:
        shown = _until(terminal, b"TIOCLINUX")
        assert terminal.wait(timeout=20).exit_code == 0, shown
        assert b"TIOCSTI refused %d" % errno.EPERM in shown, shown
        assert b"TIOCLINUX refused %d" % errno.EPERM in shown, shown


def test_the_async_client(sandboxd: Daemon) -> None:
    async def session() -> tuple[bytes, int | None]:
        async with AsyncSandbox.create("ci-bot", daemon=str(sandboxd.socket)) as sb:
            terminal = await sb.pty(20, 60, ["sh", "-c", "stty size; read x; echo got $x"])
            async with terminal:
                await terminal.write(b"it\n")
                shown = b""
                while chunk := await asyncio.wait_for(terminal.read(), 20):
                    shown += chunk
                assert terminal.result is not None
                return shown, terminal.result.exit_code

    shown, code = asyncio.run(session())
    assert b"20 60" in shown and b"got it" in shown and code == 0, shown


async def _raw(socket_path: str, ident: str, *frames: tuple[str, object]
               ) -> tuple[list[object], int | None]:
    """The daemon's frames and close code after `frames` ("text"/"bytes", data) are sent."""
    got: list[object] = []
    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=socket_path)) as http, \
            http.ws_connect(f"http://sandboxd/v1/sandboxes/{ident}/pty",
                            max_msg_size=0) as ws:
        for kind, data in frames:
            with_send = ws.send_str if kind == "text" else ws.send_bytes
            try:
                await with_send(data)  # type: ignore[operator]
            except ConnectionError:
                break
        while True:
            message = await asyncio.wait_for(ws.receive(), 20)
            if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                                aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.ERROR):
                break
            got.append(message.data)
        return got, ws.close_code


def _refusals(got: list[object]) -> list[str]:
    return [json.loads(m)["error"] for m in got if isinstance(m, str) and "error" in m]


def test_huge_and_malformed_frames_close_with_their_codes(sb: Sandbox, sandboxd: Daemon) -> None:
    where = str(sandboxd.socket)
    start = json.dumps({"tty": {"rows": 24, "cols": 80}, "argv": ["sleep", "60"]})
    # A frame over the 1 MiB cap: closed with 1009 by aiohttp's reader (which a sender still
    # sending may see as a reset instead, its unread bytes dropped), and the command ended.
    _, code = asyncio.run(_raw(where, sb.id, ("text", start), ("bytes", b"x" * (2 << 20))))
    assert code in (aiohttp.WSCloseCode.MESSAGE_TOO_BIG, aiohttp.WSCloseCode.ABNORMAL_CLOSURE)
    # The exec that is not JSON, or has no terminal size, or fields it may not have.
    for first, reason in (("not json", "bad_json"), ('{"argv": ["sh"]}', "bad_request"),
                          ('{"tty": {"rows": 0, "cols": 80}}', "bad_request"),
                          ('{"tty": {"rows": 9, "cols": 9}, "stdin": "x"}', "bad_request"),
                          ('{"tty": {"rows": 9, "cols": 9}, "argv": []}', "bad_request")):
        got, code = asyncio.run(_raw(where, sb.id, ("text", first)))
        assert _refusals(got) == [reason] and code == aiohttp.WSCloseCode.INVALID_TEXT, first
    # A text frame after the start that is not a resize.
    got, code = asyncio.run(_raw(where, sb.id, ("text", start), ("text", '{"resize": 5}')))
    assert _refusals(got) == ["bad_request"] and code == aiohttp.WSCloseCode.INVALID_TEXT
    deadline = time.monotonic() + 10  # every terminal's command ends with its socket
    while sb.refresh()["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sb.refresh()["running"] == 0
    # Not a WebSocket at all, and a sandbox that is not there: the API's own refusals.
    with pytest.raises(DaemonError) as refused:
        sb.client.call("GET", f"/v1/sandboxes/{sb.id}/pty")
    assert refused.value.reason is Reason.BAD_REQUEST
    with pytest.raises(DaemonError) as refused:
        Sandbox(sb.client, {"id": "sb-nothere"}).pty(24, 80)
    assert refused.value.reason is Reason.NO_SUCH_SANDBOX
    assert quiet(sandboxd.log.read_text())


def test_the_shell_cli_through_a_terminal(sb: Sandbox, sandboxd: Daemon) -> None:
    """`sealgate sandbox shell` on a pty of the test's: raw mode, the window's size, a resize
    that follows, the command's exit status, and our terminal as it was after."""
    master, pid = _shell_cli(sb, sandboxd)
    try:
        seen = _pty_until(master, b"$ ")
        os.write(master, b"stty size\n")
        seen += _pty_until(master, b"40 120")
        # The window resized: the kernel says so to the CLI (SIGWINCH), which tells the daemon.
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 20, 70, 0, 0))
        deadline = time.monotonic() + 20
        while b"20 70" not in seen[seen.rindex(b"40 120"):]:  # asked again until it shows
            assert time.monotonic() < deadline, seen
            os.write(master, b"stty size\n")
            seen += _pty_until(master, b"$ ")
        os.write(master, b"exit 5\n")
        seen += _pty_until(master, None)  # to its end (EIO: the child's side is closed)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(master)
    assert os.waitstatus_to_exitcode(status) == 0 and b"status=5" in seen, seen
    settings = [line for line in seen.decode(errors="replace").splitlines()
                if line.count(":") > 30]
    assert len(settings) == 2 and settings[0] == settings[1], seen  # raw mode undone


def _shell_cli(sb: Sandbox, sandboxd: Daemon) -> tuple[int, int]:
    """`sealgate sandbox shell ... -- sh -i` on a new pty of 40x120 (its master, and the pid of
    the shell that runs the CLI between two looks at its terminal's settings)."""
    command = " ".join([*SEALGATE, "sandbox", "shell", "--daemon", str(sandboxd.socket), sb.id,
                        "--", "sh", "-i"])
    master, slave = os.openpty()
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    pid = os.fork()
    if pid == 0:  # the child
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
        for target in (0, 1, 2):
            os.dup2(slave, target)
        os.execv("/bin/sh", ["sh", "-c", f"stty -g; {command}; echo status=$?; stty -g"])
    os.close(slave)
    return master, pid


def test_the_shell_cli_takes_resizes_while_typing(sb: Sandbox, sandboxd: Daemon) -> None:
    """A window resized again and again while a paste is being sent: each SIGWINCH comes while
    the CLI may be inside a send, or inside the handling of the signal before. It once sent the
    new size from the signal handler, which then waited for the lock the interrupted send held,
    for good (seen once in CI under load), and then set an Event there, whose own lock a second
    signal inside the first's set waited on (this test hung it one run in three). Everything
    here is non-blocking and bounded: a CLI that stops reading fails the test at its deadline
    instead of hanging it."""
    master, pid = _shell_cli(sb, sandboxd)
    os.set_blocking(master, False)
    try:
        _pty_until(master, b"$ ")
        os.write(master, b"stty -echo; cat > /dev/null\n")
        time.sleep(0.2)  # cat reading before the paste comes
        paste = b"".join(b"pasted line %05d " % n + b"x" * 48 + b"\n" for n in range(4000))
        sent, resizes, size = 0, 0, (40, 120)
        deadline = time.monotonic() + 60
        while sent < len(paste):
            assert time.monotonic() < deadline, f"stuck: {sent} of {len(paste)} bytes sent, " \
                                                f"{resizes} resizes"
            size = (20 + resizes % 30, 60 + resizes % 90)
            fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
            resizes += 1
            readable, writable, _ = select.select([master], [master], [], 1)
            if readable:  # what the sandbox's terminal shows, drained so it never blocks
                with contextlib.suppress(BlockingIOError):
                    os.read(master, 65536)
            if writable:
                with contextlib.suppress(BlockingIOError):
                    sent += os.write(master, paste[sent:sent + 1024])
        os.write(master, b"\x04")  # cat's end of input
        os.write(master, b"stty echo; stty size\n")
        deadline = time.monotonic() + 20
        seen = b""
        while f"{size[0]} {size[1]}".encode() not in seen:  # the last size, once it is there
            assert time.monotonic() < deadline, (size, seen[-400:])
            seen += _pty_until(master, b"$ ", seconds=max(0.1, deadline - time.monotonic()))
            os.write(master, b"stty size\n")
        os.write(master, b"exit 7\n")
        seen += _pty_until(master, None)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(master)
    assert resizes > 100, resizes
    assert os.waitstatus_to_exitcode(status) == 0 and b"status=7" in seen, seen[-400:]


def _pty_until(master: int, mark: bytes | None, seconds: float = 30) -> bytes:
    """What the CLI's terminal shows until `mark` (None: its end), bounded."""
    seen = b""
    deadline = time.monotonic() + seconds
    while mark is None or mark not in seen:
        left = deadline - time.monotonic()
        assert left > 0, seen
        ready, _, _ = select.select([master], [], [], left)
        if ready:
            try:
                chunk = os.read(master, 4096)
            except BlockingIOError:  # a master set non-blocking, and select's wake was spurious
                continue
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    return seen


_TRAPS = """trap 'echo got TERM; exit 3' TERM; trap 'echo got INT; exit 4' INT
trap 'echo got USR1' USR1; echo ready
while :; do sleep 0.1; done"""


def _said(proc: Process, what: bytes) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if what in b"".join(d for k, d in proc.output(0) if isinstance(d, bytes)):
            return
        time.sleep(0.05)
    raise AssertionError(f"the process never said {what!r}")


@pytest.mark.parametrize("name", ["TERM", "SIGINT"])
def test_a_signal_reaches_the_process_group(tierd: tuple[str, Daemon], name: str) -> None:
    _, daemon = tierd
    with Sandbox.create("ci-bot", daemon=str(daemon.socket), call_timeout=300) as sb:
        proc = sb.start(["sh", "-c", _TRAPS])
        _said(proc, b"ready")
        proc.signal("USR1")  # handled, and it runs on
        _said(proc, b"got USR1")  # (a shell runs the traps of signals pending at once by number)
        proc.signal(name)
        result = proc.wait(call_timeout=30)
        out = b"".join(d for k, d in proc.output(0) if k == "stdout" and isinstance(d, bytes))
        expected = (b"got TERM", 3) if name == "TERM" else (b"got INT", 4)
        assert expected[0] in out and result.exit_code == expected[1], (out, result)
        assert b"got USR1" in out and result.ending == "exit", out


def test_names_that_are_not_signals_are_refused(sb: Sandbox) -> None:
    proc = sb.start(["sleep", "60"])
    for name, reason in (("BOGUS", Reason.BAD_REQUEST), (15, Reason.BAD_REQUEST),
                         ("STOP", Reason.UNSUPPORTED), ("SIGCONT", Reason.UNSUPPORTED)):
        with pytest.raises(DaemonError) as refused:
            sb.client.call("POST", f"/v1/sandboxes/{sb.id}/processes/{proc.pid}/signal",
                           {"signal": name})
        assert refused.value.reason is reason, name
    assert proc.refresh()["state"] == "running"
    proc.kill()
    assert proc.wait(call_timeout=20).ending == "killed"
    proc.signal("TERM")  # to one that has ended: nothing to do, no error


_REACH = """
import socket, sys
try:
    socket.socket(socket.AF_UNIX).connect(sys.argv[1])
    print("connected")
except OSError as exc:
    print("refused", exc.errno)
"""


def test_another_sandbox_cannot_reach_a_terminal(sb: Sandbox, sandboxd: Daemon) -> None:
    with sb.pty(24, 80, ["sh", "-c", "read x; echo still-$x"]) as terminal, \
            Sandbox.create("ci-bot", daemon=str(sandboxd.socket)) as other:
        probe = other.run(["python3", "-c", _REACH, str(sandboxd.socket)])
        assert probe.ok and b"refused" in probe.stdout, probe
        terminal.write(b"mine\n")
        assert b"still-mine" in _until(terminal, b"still-mine")
        assert terminal.wait(timeout=20).exit_code == 0



# Writes a mark to the terminal named, as one that could open it would (or read from it).
_OPEN_TTY = """
import os, sys
try:
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_NOCTTY)
    os.write(fd, b"INJECTED-BY-" + sys.argv[2].encode() + b"\\n")
    os.close(fd)
    print("opened", sys.argv[1])
except OSError as exc:
    print("refused", exc.errno)
"""


def test_another_command_cannot_reach_its_terminal(tierd: tuple[str, Daemon]) -> None:
    """A command's pty is out of another command's reach (one of the same uid would read and
    type into it): under bubblewrap each command has its own devpts, where the same name is
    another terminal (its own); in a microVM the terminal stays root's. What each writes to
    the first's name never shows on the first's terminal; the first's own write does (the
    probe works)."""
    tier, daemon = tierd
    if tier == "gvisor":  # docs/sandbox-api.md: one PID namespace and uid for all commands
        pytest.skip("under gVisor a sandbox's commands share one uid, PID and mount namespace "
                    "(and so each other's /proc/N/fd): nothing there parts one from another")
    own = 'echo "at $(tty) ."; python3 -c "$0" /dev/tty own; read x; echo still-$x'
    with Sandbox.create("ci-bot", daemon=str(daemon.socket), call_timeout=300) as sb, \
            sb.pty(24, 80, ["sh", "-c", own, _OPEN_TTY]) as first:
        shown = _until(first, b"opened /dev/tty")
        assert b"INJECTED-BY-own" in shown, shown  # the probe writes to a terminal it opens
        name = re.search(rb"at (/dev/pts/\d+) \.", shown)[1].decode()  # type: ignore[index]
        plain = sb.run(["python3", "-c", _OPEN_TTY, name, "plain"])
        assert plain.ok, plain
        with sb.pty(24, 80, ["python3", "-c", _OPEN_TTY, name, "pty"]) as second:
            assert second.wait(timeout=20).exit_code == 0
        first.write(b"mine\n")
        later = _until(first, b"still-mine")
        assert b"INJECTED-BY-plain" not in later and b"INJECTED-BY-pty" not in later, later
        assert first.wait(timeout=20).exit_code == 0


# Writes a forged status into every pipe its supervisor (its parent) holds that it can open.
_FORGE = """
import os
forged, where = 0, f"/proc/{os.getppid()}/fd"
try:
    names = os.listdir(where)
except OSError:  # not dumpable, or not ours to see
    names = []
for name in names:
    path = f"{where}/{name}"
    try:
        if not os.readlink(path).startswith(("pipe:", "host:")):
            continue
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b'{"exit": 77, "ending": "exit"}\\n')
        os.close(fd)
        forged += 1
    except OSError:
        pass
print("forged", forged, "said")
"""


def test_a_command_cannot_say_its_own_status(tierd: tuple[str, Daemon]) -> None:
    """Whatever a command writes into what it can open of its terminal's supervisor's
    descriptors (gVisor lets the same uid open a non-dumpable process's pipes; the status
    pipe is the daemon's, a host descriptor there, which it cannot), its status is its own
    exit's."""
    _, daemon = tierd
    with Sandbox.create("ci-bot", daemon=str(daemon.socket), call_timeout=300) as sb, \
            sb.pty(24, 80, ["python3", "-c", _FORGE]) as terminal:
        shown = _until(terminal, b" said")
        assert terminal.wait(timeout=20).exit_code == 0, shown


def test_a_terminal_command_holds_only_its_terminal(tierd: tuple[str, Daemon]) -> None:
    """A command on a terminal inherits its three streams (the terminal) and nothing of its
    supervisor's or the agent's: no status, report or size pipe."""
    _, daemon = tierd
    listing = "import os; print(sorted(os.listdir('/proc/self/fd')), 'listed')"
    with Sandbox.create("ci-bot", daemon=str(daemon.socket), call_timeout=300) as sb, \
            sb.pty(24, 80, ["python3", "-c", listing]) as terminal:
        shown = _until(terminal, b"listed")
        assert b"['0', '1', '2', '3'] listed" in shown, shown  # 3: the listing's own
        assert terminal.wait(timeout=20).exit_code == 0
