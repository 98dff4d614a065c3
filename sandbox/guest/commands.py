"""The agent's commands (`agent`): an exec request checked, started in a clone of the agent
under its confinement (`confine`), supervised until it ends, and its status said. Standard
library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import signal
import stat
import time
from typing import Any

from . import terminal
from .confine import Confinement, clone
from .protocol import NOT_STARTED, SIGNALS, TIMED_OUT, WORKSPACE, Ending, report, terminal_size

_REAPS = 256  # children the agent reaps at one look
# What a command's supervisor passes on to its process group (the `signal` op): the agent
# signals the supervisor, never a process id of the workload's it could not know is its.
_FORWARDED = frozenset(n for n in SIGNALS.values() if n != signal.SIGKILL)


def _answer(ending: Ending, code: int, usage: list[float]) -> dict[str, Any]:
    """The status line of a command that ended (`code` as wait4 gives it)."""
    answer: dict[str, Any] = {"ending": ending, "usage": {
        "user_seconds": round(usage[0], 6), "system_seconds": round(usage[1], 6),
        "max_rss_kib": int(usage[2])}}
    if os.WIFSIGNALED(code):
        answer["signal"] = os.WTERMSIG(code)
        answer["exit"] = 128 + os.WTERMSIG(code)
    else:
        answer["exit"] = os.WEXITSTATUS(code)
    if ending == Ending.TIMED_OUT:
        answer["exit"] = TIMED_OUT
    return answer


class _Running:
    def __init__(self, pid: int, status: int, report: int, deadline: float | None, *,
                 supervised: bool, sizes: int) -> None:
        self.pid, self.status, self.report, self.deadline = pid, status, report, deadline
        self.ending = Ending.EXIT
        self.supervised = supervised  # pid is the command's supervisor (an init, a relay)
        self.sizes = sizes  # its terminal's relay's pipe (`terminal.SIZE`), or -1

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


class Commands:
    """The agent's children, reaped here: the commands it starts (each command's init, or the
    command itself where it has no namespaces of its own), whose statuses it says, and the put
    and get shims."""

    def __init__(self, confinement: Confinement) -> None:
        self.confinement = confinement
        self.running: dict[int, _Running] = {}  # request id -> its command
        self.own: list[int] = []  # the agent's own descriptors beyond the channel

    def start(self, ident: int, req: dict[str, Any], fds: list[int]) -> None:
        status = fds[3]
        try:
            command = _Command.of(req)
            # The clone closes this exec's status too: only the agent says it (a supervisor
            # that held it would be one more process a command might reach it through).
            pid, ending_fd, sizes = command.launch(fds[:3], self.confinement,
                                                    [*self.descriptors(), status])
        except NotStarted as exc:
            report(status, {"error": str(exc), "exit": NOT_STARTED})
            os.close(status)
            return
        finally:
            for fd in fds[:3]:
                os.close(fd)
        deadline = None if command.timeout is None else time.monotonic() + command.timeout
        supervised = self.confinement.own_namespaces or command.tty is not None
        self.running[ident] = _Running(pid, status, ending_fd, deadline,
                                       supervised=supervised, sizes=sizes)

    def signal(self, ident: int, number: object) -> None:
        """`number` (one of `_FORWARDED`) to the command's process group: through its
        supervisor where it has one, else to the group it leads (its own session's)."""
        run = self.running.get(ident)
        if run is None or not isinstance(number, int) or number not in _FORWARDED:
            return
        with contextlib.suppress(ProcessLookupError):
            (os.kill if run.supervised else os.killpg)(run.pid, number)

    def resize(self, ident: int, rows: int, cols: int) -> None:
        run = self.running.get(ident)
        if run is not None and run.sizes >= 0:
            with contextlib.suppress(OSError):  # a full pipe: the relay is behind, or stopped
                os.write(run.sizes, terminal.SIZE.pack(rows, cols))

    def kill(self, ident: int, ending: Ending = Ending.KILLED) -> bool:
        run = self.running.get(ident)
        if run is None:
            return False
        try:  # one that has ended already (not yet reaped) keeps its own status
            ended = os.waitid(os.P_PID, run.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            ended = None
        if run.ending == Ending.EXIT and ended is None:
            run.ending = ending
        with contextlib.suppress(ProcessLookupError):
            os.kill(run.pid, signal.SIGKILL)  # its namespace's init: the kernel kills the rest
        return True

    def descriptors(self) -> list[int]:
        """What a clone of the agent (a command's init, a shim) must close first: the channel,
        the loop's wake-up pipe, the running commands' status and report pipes (a copy kept
        open would hold their callers' statuses back until the clone ended)."""
        return [0, *self.own, *(fd for r in self.running.values()
                                for fd in (r.status, r.report, r.sizes) if fd >= 0)]

    def wait_seconds(self) -> float:
        """Until the next look is due: half a second, or a deadline's sooner."""
        now = time.monotonic()
        due = [r.deadline - now for r in self.running.values()
               if r.deadline is not None and r.ending == Ending.EXIT]
        return max(0.0, min([0.5, *due]))

    def collect(self) -> set[int]:
        """Kill the commands past their deadline; reap children that have ended (a shim, a
        command: its status said), at most `_REAPS` a call; the pids reaped. A stopped or
        traced child is not an ended one (WEXITED only)."""
        now = time.monotonic()
        for overdue, run in list(self.running.items()):
            if run.deadline is not None and now >= run.deadline and run.ending == Ending.EXIT:
                self.kill(overdue, Ending.TIMED_OUT)
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
                report(run.status, _answer(run.ending, run.code(code),
                                            [ru.ru_utime, ru.ru_stime, float(ru.ru_maxrss)]))
                os.close(run.status)
                if run.sizes >= 0:
                    os.close(run.sizes)
        return reaped


class NotStarted(Exception):
    """The command could not be started; the message says why (never a traceback)."""


# Reset to their default in the command: Python ignores SIGPIPE and SIGXFSZ, and the agent
# handles SIGCHLD.
_DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGINT,
                    signal.SIGTERM, signal.SIGUSR1)


class _Command:
    """An exec request, checked in the agent before anything is started."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str, pids: int,
                 timeout: float | None, *, tty: tuple[int, int] | None) -> None:
        self.argv, self.env, self.cwd, self.pids, self.timeout = argv, env, cwd, pids, timeout
        self.tty = tty

    @classmethod
    def of(cls, req: dict[str, Any]) -> _Command:
        try:
            argv = [str(a) for a in req["argv"]]
            env = {str(k): str(v) for k, v in req["env"].items()}
            pids = int(req["pids"])
            cwd = str(req.get("cwd") or WORKSPACE)
            timeout = req.get("timeout")
            seconds = None if timeout is None else float(timeout)
            tty = None if req.get("tty") is None else terminal_size(req["tty"]) or ()
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise NotStarted(f"bad request: {type(exc).__name__}") from None
        if not argv or tty == ():
            raise NotStarted("bad request: an empty argv or a bad terminal size")
        if any("\0" in part for part in (*argv, cwd, *env, *env.values())):
            raise NotStarted("bad request: a NUL in the argv, the environment or the cwd")
        return cls(argv, env, cwd, pids, seconds, tty=tty or None)

    def launch(self, fds: list[int], confinement: Confinement,
               others: list[int]) -> tuple[int, int, int]:
        """Start the command (`_child`): the pid of the agent's child (the command, or its
        supervisor: its namespace's init, or its terminal's relay), the descriptor on which a
        supervisor says how the command ended, once the command is executing, and the pipe
        its terminal's sizes go to (-1 without one); NotStarted with the reason if it could
        not be."""
        sizes_r, sizes_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK) if self.tty else (-1, -1)
        errors_r, errors_w = os.pipe2(os.O_CLOEXEC)
        report_r, report_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            try:
                pid = clone(confinement.own_namespaces)
            except OSError as exc:  # the process limit, reached
                raise NotStarted(f"cannot start: {exc.strerror}") from None
            if pid == 0:
                os.close(errors_r)
                os.close(report_r)
                mine = [sizes_w] if self.tty else []  # the agent's end
                self._child(fds, confinement, errors_w, report_w, [*others, *mine],
                            sizes=sizes_r)  # never returns
            os.close(errors_w)
            errors_w = -1
            said = _read_all(errors_r)  # nothing, once the command runs
        except BaseException:
            os.close(report_r)
            if sizes_w >= 0:
                os.close(sizes_w)
            raise
        finally:
            for fd in (errors_r, report_w, errors_w, sizes_r):
                if fd >= 0:
                    os.close(fd)
        if said:
            os.close(report_r)
            if sizes_w >= 0:
                os.close(sizes_w)
            os.waitpid(pid, 0)
            raise NotStarted(said.decode(errors="replace")[:4000])
        return pid, report_r, sizes_w

    def _child(self, fds: list[int], confinement: Confinement, errors: int, report: int,
               others: list[int], *, sizes: int) -> None:
        """In the clone: the command's session, namespaces, directory, limits and confinement,
        then the command. Whatever fails before the command runs is said on `errors` and ends
        the clone (the agent reaps it)."""
        try:
            # Held until a supervisor's handlers pass them on: one sent right after the start
            # is not lost (an init ignores what it has no handler for).
            signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)
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
                raise NotStarted(f"cwd {self.cwd}: {exc.strerror or exc}") from None
            _limit_processes(self.pids)
            confinement.drop()
            try:  # as the command's uid, its terminal its own: the sandbox's devpts
                master, slave = terminal.open_pty(*self.tty) if self.tty else (-1, -1)
            except OSError as exc:
                raise NotStarted(f"cannot open a terminal: {exc.strerror or exc}") from None
            try:
                program = _which(self.argv[0], self.env.get("PATH", os.defpath))
                if not confinement.own_namespaces and self.tty is None:  # it becomes the command
                    for target, fd in enumerate(fds):
                        os.dup2(fd, target)
                    signal.pthread_sigmask(signal.SIG_SETMASK, ())
                    os.execve(program, self.argv, self.env)  # noqa: S606 argv, not a shell
                command = os.posix_spawn(
                    program, self.argv, self.env, setsid=True, setsigdef=_DEFAULT_SIGNALS,
                    setsigmask=(), file_actions=terminal.controlling(slave) if self.tty
                    else [(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate(fds)])
            except OSError as exc:
                raise NotStarted(f"{self.argv[0]}: {exc.strerror or exc}") from None
        except NotStarted as exc:
            said = str(exc)
        except BaseException as exc:  # the clone must never return into the agent
            said = f"cannot start: {exc}"
        else:
            # The command's streams are its own; it has started. A terminal's relay keeps the
            # exec's stdin and stdout, the master and the pipe of sizes.
            for fd in (errors, *([*fds[2:], slave] if self.tty else fds)):
                os.close(fd)
            self._init(command, report, [*fds[:2], master, sizes] if self.tty else None)
        with contextlib.suppress(OSError):
            os.write(errors, said.encode()[:4000] or b"cannot start")
        os._exit(NOT_STARTED)

    @staticmethod
    def _init(command: int, report: int, relayed: list[int] | None) -> None:
        """PID 1 of the command's namespaces, the command PID 2 (so that it keeps a process's
        usual signals: an init ignores those it has no handler for, even its own): reap what
        comes, and once the command ends say its wait status on `report` and exit, which ends
        the namespace with whatever is left in it. It holds no capability and runs under the
        filter like the command; it is not dumpable (the agent's copy), so the command cannot
        open its descriptors or memory; the worst a command can do to it is to itself.

        It passes the `signal` op's signals on to the command's process group, and on a
        terminal (`relayed`: the exec's stdin and stdout, the master) relays it meanwhile."""
        for number in _FORWARDED:
            signal.signal(number, lambda n, _: _killpg(command, n))
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
        code = None
        try:
            if relayed is not None:
                code = terminal.relay(command, *relayed)
            while code is None:
                pid, status = os.waitpid(-1, 0)
                code = status if pid == command else None
        except (ChildProcessError, OSError):  # cannot be: the command is ours until reaped
            os._exit(1)
        with contextlib.suppress(OSError):
            os.write(report, b"%d" % code)
        os._exit(0)


def _killpg(group: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, number)


def _limit_processes(pids: int) -> None:
    """RLIMIT_NPROC, soft and hard, never above the hard limit the agent was given (raising it
    is refused): a create may ask for more processes than the host lets a uid have, and then
    gets the host's bound."""
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    limit = pids if hard == resource.RLIM_INFINITY else min(pids, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NPROC, (limit, limit))
    except (OSError, ValueError) as exc:
        raise NotStarted(f"process limit {pids}: {exc}") from None


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
