"""The agent inside a long-lived sandbox: what the daemon asks of it, it does as the sandbox.

This file runs *inside* the sandbox, under the host's `/usr/bin/python3 -I -S`, handed over in
memory like the sandbox's other files; it imports nothing of sealgate's. It is started by
bubblewrap with everything a sandbox's command gets (its uid, no capabilities, the seccomp
filter, the namespaces, the cgroup, a built environment), and every command it starts inherits
exactly that: nothing here can grant more, so the confinement of each exec is the first one's
by construction, not by repeating a set-up.

The workload may tamper with the agent (same uid): the most it gains is to lie about its own
commands or end its own sandbox; the daemon bounds and checks whatever comes back.

Wire (a SOCK_SEQPACKET pair, one JSON message per packet, descriptors by SCM_RIGHTS):

    agent -> daemon  {"op": "ready"}                          once, when it serves
    daemon -> agent  {"op": "exec", "id", "argv", "env", "cwd", "timeout", "pids"}
                         fds: stdin, stdout, stderr, status
                     {"op": "put", "id", "path", "size", "mode"}   fds: data (read), status
                     {"op": "get", "id", "path", "limit"}         fds: data (write), status
                     {"op": "kill", "id"}

Each request is served by a child of the agent (a shim) that writes one JSON line to its
status descriptor and exits. A shim is a child subreaper: whatever its command starts stays
below it however it detaches (double fork, setsid), and when the command ends, times out or is
killed, everything left below it is killed too. Nothing outlives its exec. A process that
escapes even that (its shim killed under it) lands on the agent, which kills it.

Under gVisor a shim cannot be a subreaper, so there the agent starts each command itself
(`_Commands`: no shim, no fork of this process on an exec), and a process that detaches from its
command goes to the agent at once and is killed at the agent's next look (half a second at
most), even while its command still runs. Puts and gets still have their shims.

(Over 400 lines for a reason: the sandbox is handed this one file, which imports nothing.)

The channel is the agent's standard input (the one descriptor every isolation tier hands a
sandbox's first process: gVisor's runsc passes no other). A shim waits for its command by
SIGCHLD, not a pidfd (gVisor's kernel has no pidfd_open), and each command gets the sandbox's
process limit as RLIMIT_NPROC (`pids`: what gVisor's kernel counts; under bubblewrap the
cgroup already holds it, and the uid is the sandbox's own), set on its shim, which starts it
(`_spawn`).
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import errno
import json
import os
import resource
import select
import signal
import socket
import stat
import time
from typing import Any

_MAX_MESSAGE = 1 << 20
_PR_SET_DUMPABLE = 4
_PR_SET_CHILD_SUBREAPER = 36
_KILL_ROUNDS = 10_000  # each round kills every child; a tree is gone long before
_REAPS = 256  # children the agent reaps at one look
_CHUNK = 1 << 16
_WORKSPACE = "/workspace"
_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl")


def _children() -> list[int]:
    me = os.getpid()
    try:
        with open(f"/proc/self/task/{me}/children") as fh:
            return [int(p) for p in fh.read().split()]
    except OSError:
        pass
    # gVisor's kernel has no `children` file: each process's parent, from its stat.
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:  # not a process, or gone
            continue
        if int(stat[stat.rindex(b")") + 2:].split()[1]) == me:
            found.append(int(entry))
    return found


def _reap(usage: list[float]) -> None:
    """Collect every child that has ended, adding up what it used."""
    while True:
        try:
            pid, _, ru = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        usage[0] += ru.ru_utime
        usage[1] += ru.ru_stime
        usage[2] = max(usage[2], ru.ru_maxrss)


def _kill_tree(usage: list[float]) -> None:
    """Kill everything below this process: a killed child's own children are handed to us
    (we are their subreaper), so round after round the tree empties."""
    for _ in range(_KILL_ROUNDS):
        alive = _children()
        if not alive:
            break
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)
        _reap(usage)
    _reap(usage)


def _report(fd: int, answer: dict[str, Any]) -> None:
    data = (json.dumps(answer) + "\n").encode()
    with contextlib.suppress(OSError):
        os.write(fd, data)


def _exec(req: dict[str, Any], fds: list[int]) -> None:
    status = fds[3]
    # A shim serves execs only where the agent is not its namespace's init (bubblewrap), and
    # there it may be a subreaper (gVisor's kernel would refuse: `_Commands`).
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    stop_r, stop_w = os.pipe()
    os.set_blocking(stop_w, False)
    signal.set_wakeup_fd(stop_w)  # wakes the wait below on either signal
    killed: list[int] = []
    signal.signal(signal.SIGUSR1, lambda *_: killed.append(1))  # the daemon's "kill it"
    signal.signal(signal.SIGCHLD, lambda *_: None)
    started = _start(req, fds)
    if started is None:
        return
    pid, deadline = started
    ending, ended = "exit", None
    while True:
        ended = os.wait4(pid, os.WNOHANG)
        if ended[0] == pid:
            break
        if killed:
            ending = "killed"
            break
        if deadline is not None and time.monotonic() >= deadline:
            ending = "timed_out"
            break
        # Any SIGCHLD (an orphan handed to us ends too) or SIGUSR1 wakes this; the timeout is
        # the deadline's, and a bound in case a wakeup was lost to a full pipe.
        left = 1.0 if deadline is None else min(1.0, max(0.0, deadline - time.monotonic()))
        if select.select([stop_r], [], [], left)[0]:
            os.read(stop_r, 512)
    if ending != "exit":
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        ended = os.wait4(pid, 0)
    _, code, ru = ended
    usage = [ru.ru_utime, ru.ru_stime, float(ru.ru_maxrss)]
    _kill_tree(usage)
    _report(status, _answer(ending, code, usage))


def _start(req: dict[str, Any], fds: list[int]) -> tuple[int, float | None] | None:
    """The request's command started on its descriptors (all closed here but the status):
    its pid and deadline, or None, said on the status, if it could not be started."""
    stdin, stdout, stderr, status = fds
    try:
        timeout = req.get("timeout")
        try:
            seconds = None if timeout is None else float(timeout)
        except (TypeError, ValueError):
            raise _NotStarted("bad request: timeout") from None
        pid = _spawn(req, stdin, stdout, stderr)
    except _NotStarted as exc:
        _report(status, {"error": str(exc), "exit": 127})
        return None
    finally:
        for fd in (stdin, stdout, stderr):
            os.close(fd)
    return pid, None if seconds is None else time.monotonic() + seconds


def _answer(ending: str, code: int, usage: list[float]) -> dict[str, Any]:
    """The status line of a command that ended (`code` as wait4 gives it)."""
    answer: dict[str, Any] = {"ending": ending, "usage": {
        "user_seconds": round(usage[0], 6), "system_seconds": round(usage[1], 6),
        "max_rss_kib": int(usage[2])}}
    if os.WIFSIGNALED(code):
        answer["signal"] = os.WTERMSIG(code)
        answer["exit"] = 128 + os.WTERMSIG(code)
    else:
        answer["exit"] = os.WEXITSTATUS(code)
    if ending == "timed_out":
        answer["exit"] = 124
    return answer


class _Running:
    def __init__(self, pid: int, status: int, deadline: float | None) -> None:
        self.pid, self.status, self.deadline = pid, status, deadline
        self.ending = "exit"


class _Commands:
    """The agent's children, reaped here (a command's status said), and the commands it starts
    itself, without a shim (`starts`): where it is its PID namespace's init, as under gVisor
    (bubblewrap keeps an init of its own), a shim cannot be a subreaper anyway (gVisor's kernel
    refuses it), so what detaches from a command comes to the agent either way, and a shim
    would only cost a fork of this Python process on every exec: 27 ms under gVisor's ptrace
    platform, half of an exec then. The command's process limit is then the agent's own
    (`_spawn` sets it here: it can only be lowered, and the create's is the same for every
    command), which its put and get shims count against too."""

    def __init__(self, *, starts: bool) -> None:
        self.starts = starts  # execs are started here, not by shims
        self.running: dict[int, _Running] = {}  # request id -> its command

    def start(self, ident: int, req: dict[str, Any], fds: list[int]) -> None:
        started = _start(req, fds)
        if started is None:
            os.close(fds[3])
            return
        self.running[ident] = _Running(started[0], fds[3], started[1])

    def kill(self, ident: int, ending: str = "killed") -> bool:
        run = self.running.get(ident)
        if run is None:
            return False
        try:  # one that has ended already (not yet reaped) keeps its own status
            ended = os.waitid(os.P_PID, run.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            ended = None
        if run.ending == "exit" and ended is None:
            run.ending = ending
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)  # its session's group: setsid made it the leader
        return True

    def descriptors(self) -> list[int]:
        """What a shim forked now must close first: the running commands' status pipes (a copy
        kept open would hold their callers' statuses back until the shim ended)."""
        return [r.status for r in self.running.values()]

    def wait_seconds(self) -> float:
        """Until the next look is due: half a second, or a deadline's sooner."""
        now = time.monotonic()
        due = [r.deadline - now for r in self.running.values()
               if r.deadline is not None and r.ending == "exit"]
        return max(0.0, min([0.5, *due]))

    def collect(self) -> set[int]:
        """Kill the commands past their deadline; reap children that have ended (a shim, an
        orphan, a command: its status said), at most `_REAPS` a call, so that a workload making
        dead orphans without end cannot keep the agent from its requests; the pids reaped."""
        now = time.monotonic()
        for overdue, run in list(self.running.items()):
            if run.deadline is not None and now >= run.deadline and run.ending == "exit":
                self.kill(overdue, "timed_out")
        by_pid = {r.pid: ident for ident, r in self.running.items()}
        reaped: set[int] = set()
        for _ in range(_REAPS):
            try:  # looked at first, reaped after: a pid cannot be reused while it is a zombie
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                break
            if info is None:
                break
            ident = by_pid.get(info.si_pid)
            if ident is not None:  # what it left in its session goes with it
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(info.si_pid, signal.SIGKILL)
            _, code, ru = os.wait4(info.si_pid, 0)
            reaped.add(info.si_pid)
            if ident is not None:
                run = self.running.pop(ident)
                _report(run.status, _answer(run.ending, code,
                                            [ru.ru_utime, ru.ru_stime, float(ru.ru_maxrss)]))
                os.close(run.status)
        return reaped


class _NotStarted(Exception):
    """The command could not be started; the message says why (never a traceback)."""


# Reset to their default in the command: Python ignores SIGPIPE and SIGXFSZ, and the shim
# handles the rest. (glibc's posix_spawn leaves its own two internal signals, 32 and 33,
# ignored: no program sends them.)
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGUSR1, signal.SIGCHLD,
                    signal.SIGINT, signal.SIGTERM)


def _spawn(req: dict[str, Any], stdin: int, stdout: int, stderr: int) -> int:
    """Start the command in its own session with its descriptors, the process limit and
    default signals: by posix_spawn (vfork, then exec), not a fork of the shim, whose copy of
    a Python address space costs 16 ms under gVisor's ptrace platform (fork and exec 25 ms,
    posix_spawn 10 ms, measured in runsc). What the command needs set that posix_spawn cannot
    set is set on the caller first: a shim, which does nothing after but wait, or the agent,
    whose own work needs neither its cwd nor more processes than the sandbox may have."""
    try:
        argv = [str(a) for a in req["argv"]]
        env = {str(k): str(v) for k, v in req["env"].items()}
        pids = int(req["pids"])
        cwd = str(req.get("cwd") or _WORKSPACE)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _NotStarted(f"bad request: {type(exc).__name__}") from None
    if not argv:
        raise _NotStarted("bad request: an empty argv")
    try:
        os.chdir(cwd)
    except ValueError:  # an embedded NUL
        raise _NotStarted("bad request: cwd") from None
    except OSError as exc:  # named as the directory's, not blamed on the program
        raise _NotStarted(f"cwd {cwd}: {exc.strerror or exc}"[:4000]) from None
    # Never above the hard limit the agent was given (raising it is refused): a create may
    # ask for more processes than the host lets a uid have, and then gets the host's bound.
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    limit = pids if hard == resource.RLIM_INFINITY else min(pids, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
    except (OSError, ValueError) as exc:
        raise _NotStarted(f"process limit {pids}: {exc}") from None
    # Only 0, 1 and 2 go to the command: every other descriptor here is close-on-exec (the
    # request's came so, `main`; Python opens its own so; none was inherited, `main`).
    try:
        program = _which(argv[0], env.get("PATH", os.defpath))
        return os.posix_spawn(
            program, argv, env, setsid=True, setsigdef=_DEFAULT_SIGNALS, setsigmask=(),
            file_actions=[(os.POSIX_SPAWN_DUP2, stdin, 0), (os.POSIX_SPAWN_DUP2, stdout, 1),
                          (os.POSIX_SPAWN_DUP2, stderr, 2)],
        )
    except OSError as exc:
        raise _NotStarted(f"{argv[0]}: {exc.strerror or exc}"[:4000]) from None
    except ValueError:  # an embedded NUL in the argv or the environment
        raise _NotStarted("bad request: a NUL in the argv or the environment") from None


def _which(name: str, path: str) -> str:
    """The program execvp would run for `name`: itself if it names a path, else the first
    executable file of that name in `path`'s directories. OSError (ENOENT, or EACCES for one
    found but not executable) otherwise. Unlike execvp, a first match that cannot be executed
    (ENOEXEC: a script without `#!`, another architecture) is not passed over for a later one."""
    if "/" in name:
        return name
    denied = False
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        try:
            info = os.stat(candidate)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        if os.access(candidate, os.X_OK):
            return candidate
        denied = True
    code = errno.EACCES if denied else errno.ENOENT
    raise OSError(code, os.strerror(code))


def _walk(path: str, create: bool) -> tuple[int, str]:
    """The directory holding `path` (under /workspace) and the last name, never through a
    symbolic link; missing directories are made when `create`."""
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError("a path inside the workspace: names joined by '/', no '..'")
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(_WORKSPACE, flags)
    try:
        for name in parts[:-1]:
            try:
                nxt = os.open(name, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, 0o755, dir_fd=fd)
                nxt = os.open(name, flags, dir_fd=fd)
            except OSError:
                _refuse_link(fd, name)
                raise
            _same_entry(fd, name, nxt)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd, parts[-1]


def _same_entry(parent: int, name: str, opened: int) -> None:
    """What was opened is the directory entry itself, not where a link there leads: gVisor's
    kernel (2022-12) follows a link to a directory even under O_NOFOLLOW | O_DIRECTORY. A link
    put there after the open is refused the same way (it is not what was opened)."""
    try:
        entry = os.lstat(name, dir_fd=parent)
        got = os.fstat(opened)
        same = (entry.st_dev, entry.st_ino) == (got.st_dev, got.st_ino)
    except OSError:
        same = False
    if not same:
        os.close(opened)
        _refuse_link(parent, name)
        raise ValueError(f"{name[:255]!r} changed while it was opened")


def _refuse_link(parent: int, name: str) -> None:
    """A link where a directory or file is wanted is refused as one (O_NOFOLLOW says only
    "not a directory" or "too many levels"), so the caller learns it is never followed."""
    try:
        info = os.lstat(name, dir_fd=parent)
    except OSError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise ValueError(f"{name[:255]!r} is a symbolic link: never followed")


def _put(req: dict[str, Any], fds: list[int]) -> None:
    data, status = fds
    try:
        parent, name = _walk(str(req["path"]), create=True)
        # A short temporary name: the final one may already be as long as a name can be.
        tmp = f".sealgate-put-{os.getpid()}"
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                      int(req.get("mode", 0o644)) & 0o777, dir_fd=parent)
        size, want = 0, int(req["size"])
        try:
            try:
                while chunk := os.read(data, _CHUNK):
                    size += len(chunk)
                    if size > want:
                        break
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(out, view):]
            finally:
                os.close(out)
            if size != want:
                raise ValueError(f"received {size} bytes of {want}")
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            # Never a partial file left behind: after ENOSPC it would hold the space it took.
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=parent)
            raise
        _report(status, {"size": size})
    except (OSError, ValueError, KeyError) as exc:
        _report(status, {"error": _said(exc)})


def _get(req: dict[str, Any], fds: list[int]) -> None:
    data, status = fds
    try:
        parent, name = _walk(str(req["path"]), create=False)
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=parent)
        except OSError:
            _refuse_link(parent, name)
            raise
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            _report(status, {"error": "not a regular file"})
            return
        if info.st_size > int(req["limit"]):
            _report(status, {"error": f"{info.st_size} bytes: over the limit of {req['limit']}",
                             "too_large": True})
            return
        _report(status, {"size": info.st_size})
        os.set_blocking(fd, True)
        left = info.st_size
        while left > 0 and (chunk := os.read(fd, min(_CHUNK, left))):
            left -= len(chunk)
            view = memoryview(chunk)
            while view:
                view = view[os.write(data, view):]
    except (OSError, ValueError, KeyError) as exc:
        _report(status, {"error": _said(exc)})


def _said(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    return str(exc) if isinstance(exc, ValueError) else f"missing field {exc}"


_OPS = {"exec": _exec, "put": _put, "get": _get}


def main() -> None:
    chan = socket.socket(fileno=0)
    chan.set_inheritable(False)
    # Nothing but the channel (and 1, 2) is meant to come from whoever started us: anything
    # else would reach every command (commands inherit what is not close-on-exec).
    os.closerange(3, 1 << 16)
    # Other processes of the sandbox's uid may not open our descriptors through /proc.
    _prctl(_PR_SET_DUMPABLE, 0)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    shims: dict[int, int] = {}  # request id -> the shim serving it
    # The reaper of every child, and the starter of execs where the agent is the init.
    commands = _Commands(starts=os.getpid() == 1)
    wake_r, wake_w = os.pipe()  # a command's end wakes the loop at once
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    chan.send(b'{"op": "ready"}')
    while True:
        ready, _, _ = select.select([chan.fileno(), wake_r], [], [], commands.wait_seconds())
        if wake_r in ready:
            os.read(wake_r, 512)
        if chan.fileno() in ready:
            if (got := request(chan)) is None:
                return
            _serve(chan, *got, shims, commands)
        _orphans(shims, commands)


def request(chan: socket.socket) -> tuple[bytes, list[int]] | None:
    """The daemon's next request and its descriptors; None once the daemon is gone (and with
    it the sandbox)."""
    try:
        message, fds = receive(chan)
    except OSError:
        return None
    return (message, fds) if message else None


def receive(chan: socket.socket) -> tuple[bytes, list[int]]:
    """One request and its descriptors, close-on-exec: they reach a command only as its 0, 1
    and 2. (socket.recv_fds drops its `flags` argument in CPython 3.11: recvmsg, then.)"""
    fds = array.array("i")
    message, ancillary, _, _ = chan.recvmsg(_MAX_MESSAGE, socket.CMSG_LEN(8 * fds.itemsize),
                                            socket.MSG_CMSG_CLOEXEC)
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return message, list(fds)


def _serve(chan: socket.socket, message: bytes, fds: list[int], shims: dict[int, int],
           commands: _Commands) -> None:
    try:
        req = json.loads(message)
        op, ident = req["op"], int(req["id"])
    except (ValueError, KeyError, TypeError):
        for fd in fds:
            os.close(fd)
        return
    if op == "kill":
        if commands.kill(ident):
            return
        pid = shims.get(ident)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)
        return
    handler = _OPS.get(op)
    if handler is None or len(fds) != (4 if op == "exec" else 2):
        for fd in fds:
            os.close(fd)
        return
    if commands.starts and op == "exec":
        commands.start(ident, req, fds)
        return
    try:
        pid = os.fork()
    except OSError as exc:  # the sandbox's process limit, reached
        _report(fds[-1], {"error": f"cannot start: {exc.strerror}", "exit": 127})
        for fd in fds:
            os.close(fd)
        return
    if pid == 0:
        try:
            signal.set_wakeup_fd(-1)  # the agent's
            chan.close()  # a shim speaks only on its own descriptors
            for fd in commands.descriptors():
                os.close(fd)
            handler(req, fds)
        finally:
            os._exit(0)
    shims[ident] = pid
    for fd in fds:
        os.close(fd)


def _orphans(shims: dict[int, int], commands: _Commands) -> None:
    """Reap ended shims (and commands: their status said); kill anything else that has come
    to us: a process whose shim was killed under it, which must not outlive its exec."""
    reaped = commands.collect()
    for ident, pid in list(shims.items()):
        if pid in reaped:  # forgotten as it is reaped: its pid may be another's at once
            del shims[ident]
    live = {*shims.values(), *(r.pid for r in commands.running.values())}
    for pid in _children():
        if pid not in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
