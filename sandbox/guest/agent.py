"""The agent inside a long-lived sandbox: what the daemon asks of it, it does as the sandbox.

This file runs *inside* the sandbox, under the host's `/usr/bin/python3 -I -S`, handed over in
memory like the sandbox's other files; it imports nothing of sealgate's. It is the sandbox's
first process (its PID namespace's init: bubblewrap runs it `--as-pid-1`, runsc as the
container's process), with the sandbox's namespaces, cgroups and built environment. The tier
says how it is kept from the workload (`_options`), and docs/sandbox.md why:

- **bubblewrap** (`--own-namespaces`): the agent has the sandbox's uid and two capabilities of
  the sandbox's own user namespace (nothing on the host) that its commands never get:
  CAP_SYS_ADMIN and CAP_SETPCAP. Each command runs as PID 2 of a PID and mount namespace of
  its own, nested under the agent's, below an init cloned from the agent (`_Command._init`:
  not dumpable, no capability, the seccomp filter), with a /proc of its own whose cmdline the
  agent covers (`--cover`). From inside, /proc shows the command's own processes and its
  init: the agent, its channel, other commands and their descriptors have no pid a command
  can name, so no signal (SIGSTOP and `kill -9 -1` included), /proc/N/mem, /proc/N/fd or
  prlimit reaches them. When the command ends its init says its status and exits, and the
  kernel kills whatever is left in the namespace, however it detached, before the agent reaps
  the init: nothing outlives its command, and its end is always learned (a timeout or kill is
  the agent's SIGKILL to the init, from outside).
- **gVisor** (`--user UID:GID`), whose namespaces do not serve (its mount namespaces are
  shared, its /proc fails `ps` in a nested PID namespace, and it lets the same uid open a
  non-dumpable process's /proc/N/fd): the agent is gVisor's uid 0 and each command a clone
  that takes the sandbox's uid and no capability, so nothing of the workload may signal the
  agent or open it. What a command leaves comes to the agent (the init) and is killed at its
  next look (`_orphans`).

Every command gets no capability in any set, no_new_privs, and the seccomp filter (`--seccomp`,
the same program on every tier: installed by the agent on each command, or on itself where it
needs nothing the filter refuses).

Wire (a SOCK_SEQPACKET pair, one JSON message per packet, descriptors by SCM_RIGHTS):

    agent -> daemon  {"op": "ready"}                          once, when it serves
    daemon -> agent  {"op": "exec", "id", "argv", "env", "cwd", "timeout", "pids"}
                         fds: stdin, stdout, stderr, status
                     {"op": "put", "id", "path", "size", "mode"}   fds: data (read), status
                     {"op": "get", "id", "path", "limit"}         fds: data (write), status
                     {"op": "kill", "id"}

An exec is answered on its status descriptor by the agent, one JSON line, when the command's
namespace is empty; a put or get by a child of the agent (a shim: no capability, the seccomp
filter), which writes its line and exits. The channel is the agent's standard input (the one
descriptor every isolation tier hands a sandbox's first process: gVisor's runsc passes no
other). The agent waits by SIGCHLD, not a pidfd (gVisor's kernel has no pidfd_open).

(Over 400 lines for a reason: the sandbox is handed this one file, which imports nothing.)
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
import sys
import time
from typing import Any

_MAX_MESSAGE = 1 << 20
_REAPS = 256  # children the agent reaps at one look
_CHUNK = 1 << 16
_WORKSPACE = "/workspace"
_COVERS = "/run/sealgate/covers"  # the agent's read-only tmpfs of what hides host files
_libc = ctypes.CDLL(None, use_errno=True)
# The clone runs Python on both sides: the call must keep the GIL (a PyDLL), or the child
# would start by taking a lock its parent's copy held.
_pylibc = ctypes.PyDLL(None, use_errno=True)
_pylibc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_void_p]

# linux/prctl.h, sched.h, mount.h, capability.h, seccomp.h (x86_64)
_PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP = 4, 38, 22
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_PR_CAPBSET_READ, _PR_CAPBSET_DROP = 23, 24
_SECCOMP_MODE_FILTER = 2
_SYS_CLONE, _SYS_CAPSET = 56, 126
_CLONE_NEWNS, _CLONE_NEWPID = 0x00020000, 0x20000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_CAP_VERSION_3 = 0x20080522


def _check(result: int, what: str) -> None:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _prctl(option: int, value: int, arg: int = 0) -> None:
    # Every argument a long: an address passed as a plain int would be cut to 32 bits.
    _check(_libc.prctl(*(ctypes.c_ulong(a) for a in (option, value, arg, 0, 0))),
           f"prctl {option}")


def _mount(source: str | None, target: str, kind: str | None, flags: int,
           data: str | None = None) -> None:
    _check(_libc.mount(_bytes(source), target.encode(), _bytes(kind), flags,
                       None if data is None else ctypes.c_char_p(data.encode())),
           f"mount {target}")


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


class _Filter(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


class _Confinement:
    """What the agent adds to each command (and shim) on top of the sandbox's own: the
    sandbox's uid where the agent's is another (`user`), no capability, no_new_privs, the
    seccomp filter, and, where the kernel's namespaces serve (`own_namespaces`), a command's
    own PID and mount namespaces with a /proc of their own, covered where it would show the
    host."""

    def __init__(self, seccomp: bytes | None, covers: list[str], own_namespaces: bool,
                 user: tuple[int, int] | None) -> None:
        self._program = ctypes.create_string_buffer(seccomp or b"", len(seccomp or b""))
        self._filter = _Filter(len(seccomp or b"") // 8, ctypes.cast(self._program,
                                                                      ctypes.c_char_p))
        self._seccomp = seccomp is not None
        self._installed = False
        # The agent's bounding set, read once: each exec drops these (a system call each costs
        # tens of microseconds under gVisor's ptrace platform; 64 reads were 2-5 ms of it).
        self._bounding = [cap for cap in range(64) if _libc.prctl(
            ctypes.c_ulong(_PR_CAPBSET_READ), ctypes.c_ulong(cap), 0, 0, 0) == 1]
        self.covers = covers  # /proc files (cmdline) whose host content must not show
        self.own_namespaces = own_namespaces
        self.user = user

    def prepare(self) -> None:
        """Once, in the agent: its own mount namespace (the one bubblewrap made belongs to an
        outer user namespace, where the agent may not mount), holding an empty read-only file
        to lay over each command's /proc files that would show the host."""
        if not self.own_namespaces:
            # Nothing the agent does here needs what the filter refuses: its commands and
            # shims inherit it from it rather than each installing it (5 ms under gVisor).
            self._install()
        if not self.covers:
            return
        _check(_libc.unshare(_CLONE_NEWNS), "unshare")
        _private()
        os.makedirs(_COVERS, mode=0o755, exist_ok=True)
        _mount("tmpfs", _COVERS, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
               "size=4k,nr_inodes=8,mode=0755")
        os.close(os.open(f"{_COVERS}/empty", os.O_WRONLY | os.O_CREAT, 0o444))
        _mount(None, _COVERS, None,
               _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)

    def namespaces(self) -> None:
        """In a command's first process, PID 1 of its new namespaces: its own /proc."""
        if not self.own_namespaces:
            return
        _private()
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        for path in self.covers:
            _mount(f"{_COVERS}/empty", path, None, _MS_BIND)
            _mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID
                   | _MS_NODEV | _MS_NOEXEC)

    def drop(self) -> None:
        """The sandbox's uid, no capability in any set, none to gain by exec, then the filter:
        last, since it refuses what the steps before need."""
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        for cap in self._bounding:  # while CAP_SETPCAP, which allows it, is still held
            _prctl(_PR_CAPBSET_DROP, cap)
        if self.user is not None:  # every capability left goes with the uid 0
            uid, gid = self.user
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            # Until it executes, this is a copy of the agent's memory (other commands' inputs
            # in it) with the workload's uid: a uid change may make it dumpable again.
            _prctl(_PR_SET_DUMPABLE, 0)
        try:
            _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
        except OSError as exc:  # a kernel without ambient capabilities (gVisor's) has none
            if exc.errno != errno.EINVAL:
                raise
        header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
        data = (ctypes.c_uint32 * 6)()
        _check(_libc.syscall(_SYS_CAPSET, header, data), "capset")
        self._install()

    def _install(self) -> None:
        if self._seccomp and not self._installed:
            _prctl(_PR_SET_NO_NEW_PRIVS, 1)
            _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(self._filter))
            self._installed = True


def _private() -> None:
    """No mount made from here on flows to another mount namespace. gVisor's kernel has no
    mount propagation to change (EINVAL): nothing flows there to begin with."""
    try:
        _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise


def _clone(namespaces: bool) -> int:
    """fork(), with `namespaces` the child the init of a new PID namespace with a new mount
    namespace: its pid, or 0 in the child. Python's os.fork cannot take flags (os.unshare is
    3.12's, and would move the agent's own later children too)."""
    flags = (_CLONE_NEWPID | _CLONE_NEWNS if namespaces else 0) | signal.SIGCHLD
    pid = _pylibc.syscall(ctypes.c_long(_SYS_CLONE), ctypes.c_ulong(flags), None, None, None,
                          ctypes.c_ulong(0))
    _check(pid, "clone")
    return int(pid)


def _report(fd: int, answer: dict[str, Any]) -> None:
    data = (json.dumps(answer) + "\n").encode()
    with contextlib.suppress(OSError):
        os.write(fd, data)


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
    def __init__(self, pid: int, status: int, report: int, deadline: float | None) -> None:
        self.pid, self.status, self.report, self.deadline = pid, status, report, deadline
        self.ending = "exit"

    def code(self, init: int) -> int:
        """The command's wait status as its init said it, or, where the init said nothing (it
        was killed: the command with it, or there is none: the child is the command), the
        child's own."""
        try:
            said = os.read(self.report, 64)
        except OSError:
            said = b""
        finally:
            os.close(self.report)
        try:
            return int(said) if said else init
        except ValueError:
            return init


class _Commands:
    """The agent's children, reaped here: the commands it starts (each command's init, or the
    command itself where it has no namespaces of its own), whose statuses it says, and the put
    and get shims."""

    def __init__(self, confinement: _Confinement) -> None:
        self.confinement = confinement
        self.running: dict[int, _Running] = {}  # request id -> its command
        self.own: list[int] = []  # the agent's own descriptors beyond the channel

    def start(self, ident: int, req: dict[str, Any], fds: list[int]) -> None:
        status = fds[3]
        try:
            command = _Command.of(req)
            pid, report = command.launch(fds[:3], self.confinement, self.descriptors())
        except _NotStarted as exc:
            _report(status, {"error": str(exc), "exit": 127})
            os.close(status)
            return
        finally:
            for fd in fds[:3]:
                os.close(fd)
        deadline = None if command.timeout is None else time.monotonic() + command.timeout
        self.running[ident] = _Running(pid, status, report, deadline)

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
            os.kill(run.pid, signal.SIGKILL)  # its namespace's init: the kernel kills the rest
        return True

    def descriptors(self) -> list[int]:
        """What a clone of the agent (a command's init, a shim) must close first: the channel,
        the loop's wake-up pipe, the running commands' status and report pipes (a copy kept
        open would hold their callers' statuses back until the clone ended)."""
        return [0, *self.own, *(fd for r in self.running.values() for fd in (r.status, r.report))]

    def wait_seconds(self) -> float:
        """Until the next look is due: half a second, or a deadline's sooner."""
        now = time.monotonic()
        due = [r.deadline - now for r in self.running.values()
               if r.deadline is not None and r.ending == "exit"]
        return max(0.0, min([0.5, *due]))

    def collect(self) -> set[int]:
        """Kill the commands past their deadline; reap children that have ended (a shim, a
        command: its status said), at most `_REAPS` a call; the pids reaped. A stopped or
        traced child is not an ended one (WEXITED only)."""
        now = time.monotonic()
        for overdue, run in list(self.running.items()):
            if run.deadline is not None and now >= run.deadline and run.ending == "exit":
                self.kill(overdue, "timed_out")
        by_pid = {r.pid: ident for ident, r in self.running.items()}
        reaped: set[int] = set()
        for _ in range(_REAPS):
            try:
                pid, code, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            reaped.add(pid)
            ident = by_pid.get(pid)
            if ident is not None:
                run = self.running.pop(ident)
                _report(run.status, _answer(run.ending, run.code(code),
                                            [ru.ru_utime, ru.ru_stime, float(ru.ru_maxrss)]))
                os.close(run.status)
        return reaped


class _NotStarted(Exception):
    """The command could not be started; the message says why (never a traceback)."""


# Reset to their default in the command: Python ignores SIGPIPE and SIGXFSZ, and the agent
# handles SIGCHLD.
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGINT,
                    signal.SIGTERM, signal.SIGUSR1)


class _Command:
    """An exec request, checked in the agent before anything is started."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, pids: int,
                 timeout: float | None) -> None:
        self.argv, self.env, self.cwd, self.pids, self.timeout = argv, env, cwd, pids, timeout

    @classmethod
    def of(cls, req: dict[str, Any]) -> _Command:
        try:
            argv = [str(a) for a in req["argv"]]
            env = {str(k): str(v) for k, v in req["env"].items()}
            pids = int(req["pids"])
            cwd = str(req.get("cwd") or _WORKSPACE)
            timeout = req.get("timeout")
            seconds = None if timeout is None else float(timeout)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise _NotStarted(f"bad request: {type(exc).__name__}") from None
        if not argv:
            raise _NotStarted("bad request: an empty argv")
        if any("\0" in part for part in (*argv, cwd, *env, *env.values())):
            raise _NotStarted("bad request: a NUL in the argv, the environment or the cwd")
        return cls(argv, env, cwd, pids, seconds)

    def launch(self, fds: list[int], confinement: _Confinement,
               others: list[int]) -> tuple[int, int]:
        """Start the command (`_child`): the pid of the agent's child (the command, or its
        namespace's init) and the descriptor on which an init says how the command ended, once
        the command is executing; _NotStarted with the reason if it could not be."""
        errors_r, errors_w = os.pipe2(os.O_CLOEXEC)
        report_r, report_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            try:
                pid = _clone(confinement.own_namespaces)
            except OSError as exc:  # the process limit, reached
                raise _NotStarted(f"cannot start: {exc.strerror}") from None
            if pid == 0:
                os.close(errors_r)
                os.close(report_r)
                self._child(fds, confinement, errors_w, report_w, others)  # never returns
            os.close(errors_w)
            errors_w = -1
            said = _read_all(errors_r)  # nothing, once the command runs
        except BaseException:
            os.close(report_r)
            raise
        finally:
            os.close(errors_r)
            os.close(report_w)
            if errors_w >= 0:
                os.close(errors_w)
        if said:
            os.close(report_r)
            os.waitpid(pid, 0)
            raise _NotStarted(said.decode(errors="replace")[:4000])
        return pid, report_r

    def _child(self, fds: list[int], confinement: _Confinement, errors: int, report: int,
               others: list[int]) -> None:
        """In the clone: the command's session, namespaces, directory, limits and confinement,
        then the command. Whatever fails before the command runs is said on `errors` and ends
        the clone (the agent reaps it)."""
        try:
            signal.set_wakeup_fd(-1)  # the agent's, closed next with the rest of its own
            for fd in others:
                os.close(fd)
            for number in _DEFAULT_SIGNALS:
                signal.signal(number, signal.SIG_DFL)
            os.setsid()
            confinement.namespaces()
            try:
                os.chdir(self.cwd)
            except OSError as exc:  # named as the directory's, not blamed on the program
                raise _NotStarted(f"cwd {self.cwd}: {exc.strerror or exc}") from None
            _limit_processes(self.pids)
            confinement.drop()
            try:
                program = _which(self.argv[0], self.env.get("PATH", os.defpath))
                if not confinement.own_namespaces:  # the clone becomes the command
                    for target, fd in enumerate(fds):
                        os.dup2(fd, target)
                    signal.pthread_sigmask(signal.SIG_SETMASK, ())
                    os.execve(program, self.argv, self.env)  # noqa: S606 argv, not a shell
                command = os.posix_spawn(
                    program, self.argv, self.env, setsid=True, setsigdef=_DEFAULT_SIGNALS,
                    setsigmask=(), file_actions=[(os.POSIX_SPAWN_DUP2, fd, target)
                                                 for target, fd in enumerate(fds)])
            except OSError as exc:
                raise _NotStarted(f"{self.argv[0]}: {exc.strerror or exc}") from None
        except _NotStarted as exc:
            said = str(exc)
        except BaseException as exc:  # the clone must never return into the agent
            said = f"cannot start: {exc}"
        else:
            for fd in (*fds, errors):  # the command's streams are its own; it has started
                os.close(fd)
            self._init(command, report)
        with contextlib.suppress(OSError):
            os.write(errors, said.encode()[:4000] or b"cannot start")
        os._exit(127)

    @staticmethod
    def _init(command: int, report: int) -> None:
        """PID 1 of the command's namespaces, the command PID 2 (so that it keeps a process's
        usual signals: an init ignores those it has no handler for, even its own): reap what
        comes, and once the command ends say its wait status on `report` and exit, which ends
        the namespace with whatever is left in it. It holds no capability and runs under the
        filter like the command; it is not dumpable (the agent's copy), so the command cannot
        open its descriptors or memory; the worst a command can do to it is to itself."""
        while True:
            try:
                pid, code = os.waitpid(-1, 0)
            except ChildProcessError:  # cannot be: the command is ours until reaped
                os._exit(1)
            if pid == command:
                with contextlib.suppress(OSError):
                    os.write(report, b"%d" % code)
                os._exit(0)


def _limit_processes(pids: int) -> None:
    """RLIMIT_NPROC, soft and hard, never above the hard limit the agent was given (raising it
    is refused): a create may ask for more processes than the host lets a uid have, and then
    gets the host's bound."""
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    limit = pids if hard == resource.RLIM_INFINITY else min(pids, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
    except (OSError, ValueError) as exc:
        raise _NotStarted(f"process limit {pids}: {exc}") from None


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks)


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


_OPS = {"put": _put, "get": _get}


def main(args: list[str]) -> None:
    """`args`: see `_options`."""
    chan = socket.socket(fileno=0)
    chan.set_inheritable(False)
    # Nothing but the channel (and 1, 2) is meant to come from whoever started us: anything
    # else would reach every command (commands inherit what is not close-on-exec).
    os.closerange(3, 1 << 16)
    # Its output goes nowhere; the sandbox's own /dev/null, not what was handed over (a host
    # descriptor under gVisor, which the self-test could not tell from a channel).
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (1, 2):
        os.dup2(null, fd, inheritable=False)
    os.close(null)
    # No process of the sandbox's uid may open our descriptors or memory through /proc,
    # should one ever see us.
    _prctl(_PR_SET_DUMPABLE, 0)
    confinement = _options(args)
    confinement.prepare()
    shims: dict[int, int] = {}  # request id -> the shim serving it
    commands = _Commands(confinement)
    wake_r, wake_w = os.pipe()  # a command's end wakes the loop at once
    commands.own += [wake_r, wake_w]
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


def _options(args: list[str]) -> _Confinement:
    """`--seccomp PATH`: the filter program every command and shim runs under;
    `--own-namespaces`: each command in PID and mount namespaces of its own, with its own /proc
    (where the kernel's serve: gVisor 2022-12's shares one mount namespace among all, and its
    /proc fails `ps` in a nested PID namespace); `--cover PATH`: a /proc file of the host's
    each command sees empty (repeatable); `--user UID:GID`: the sandbox's uid, where the agent
    runs as another (gVisor's uid 0: none of the host's)."""
    seccomp, covers, own_namespaces, user = None, [], False, None
    args = list(args)
    while args:
        flag = args.pop(0)
        if flag == "--own-namespaces":
            own_namespaces = True
        elif flag in ("--seccomp", "--cover", "--user") and args:
            value = args.pop(0)
            if flag == "--seccomp":
                with open(value, "rb") as fh:
                    seccomp = fh.read()
            elif flag == "--cover":
                covers.append(value)
            else:
                uid, gid = value.split(":")
                user = (int(uid), int(gid))
        else:
            raise SystemExit(f"agent: bad flag {flag[:40]!r}")
    return _Confinement(seccomp, covers, own_namespaces, user)


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
    except (ValueError, KeyError, TypeError, RecursionError):
        for fd in fds:
            os.close(fd)
        return
    if op == "kill":
        if not commands.kill(ident) and (pid := shims.get(ident)) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return
    if op == "exec" and len(fds) == 4:
        commands.start(ident, req, fds)
        return
    handler = _OPS.get(op)
    if handler is None or len(fds) != 2:
        for fd in fds:
            os.close(fd)
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
            chan.detach()  # a shim speaks only on its own descriptors (the channel is fd 0)
            for fd in commands.descriptors():
                os.close(fd)
            commands.confinement.drop()
            handler(req, fds)
        finally:
            os._exit(0)
    shims[ident] = pid
    for fd in fds:
        os.close(fd)


def _orphans(shims: dict[int, int], commands: _Commands) -> None:
    """Reap ended shims and commands (their statuses said); kill anything else that has come to
    the agent: where commands share its PID namespace (gVisor), what one left behind, however
    it detached, which must not outlive it. (In a namespace of its own it cannot come here.)"""
    reaped = commands.collect()
    for ident, pid in list(shims.items()):
        if pid in reaped:  # forgotten as it is reaped: its pid may be another's at once
            del shims[ident]
    live = {*shims.values(), *(r.pid for r in commands.running.values())}
    for pid in _children():
        if pid not in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


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


if __name__ == "__main__":
    main(sys.argv[1:])
