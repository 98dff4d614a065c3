"""The agent inside a long-lived sandbox: what the daemon asks of it, it does as the sandbox.

This package runs *inside* the sandbox, under the host's `/usr/bin/python3 -I -S`, handed
over in memory like the sandbox's other files (`staging`); it imports nothing of sealgate's.
The agent is the sandbox's first process (its PID namespace's init: bubblewrap runs it
`--as-pid-1`, runsc as the container's process), with the sandbox's namespaces, cgroups and
built environment. The tier
says how it is kept from the workload (`_options`), and docs/sandbox.md why:

- **bubblewrap** (`--own-namespaces`): the agent has the sandbox's uid and two capabilities of
  the sandbox's own user namespace (nothing on the host) that its commands never get:
  CAP_SYS_ADMIN and CAP_SETPCAP. Each command runs as PID 2 of a PID and mount namespace of
  its own, nested under the agent's, below an init cloned from the agent (`commands`:
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

The wire is `protocol`'s packets (a request and its descriptors per packet on the agent's
standard input: the one descriptor every isolation tier hands a sandbox's first process;
gVisor's runsc passes no other). An exec (`commands`) is answered on its status descriptor by
the agent when the command's namespace is empty; a put or get (`shim`) by a child of the agent
(a shim: no capability, the seccomp filter), which writes its line and exits. The agent waits
by SIGCHLD, not a pidfd (gVisor's kernel has no pidfd_open).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket

from .commands import Commands
from .confine import PR_SET_DUMPABLE, Confinement, prctl
from .protocol import NOT_STARTED, Op, hello, parse, receive, report, terminal_size
from .shim import SHIMS


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
    prctl(PR_SET_DUMPABLE, 0)
    confinement = _options(args)
    confinement.prepare()
    shims: dict[int, int] = {}  # request id -> the shim serving it
    commands = Commands(confinement)
    wake_r, wake_w = os.pipe()  # a command's end wakes the loop at once
    commands.own += [wake_r, wake_w]
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    chan.send(hello())
    while True:
        ready, _, _ = select.select([chan.fileno(), wake_r], [], [], commands.wait_seconds())
        if wake_r in ready:
            os.read(wake_r, 512)
        if chan.fileno() in ready:
            if (got := receive(chan)) is None:
                return
            _serve(chan, *got, shims, commands)
        _orphans(shims, commands)


def _options(args: list[str]) -> Confinement:
    """`--seccomp PATH`: the filter program every command and shim runs under;
    `--own-namespaces`: each command in PID and mount namespaces of its own, with its own /proc
    (where the kernel's serve: gVisor 2022-12's shares one mount namespace among all, and its
    /proc fails `ps` in a nested PID namespace); `--cover PATH`: a /proc file of the host's
    each command sees empty (repeatable); `--hide DIR`: a directory of the agent's each command
    sees empty (repeatable: the host's /usr an image sandbox's agent runs from); `--user
    UID:GID`: the sandbox's uid, where the agent runs as another (gVisor's uid 0: none of the
    host's)."""
    seccomp, covers, hides, own_namespaces, user = None, [], [], False, None
    args = list(args)
    while args:
        flag = args.pop(0)
        if flag == "--own-namespaces":
            own_namespaces = True
        elif flag in ("--seccomp", "--cover", "--hide", "--user") and args:
            value = args.pop(0)
            if flag == "--seccomp":
                with open(value, "rb") as fh:
                    seccomp = fh.read()
            elif flag == "--cover":
                covers.append(value)
            elif flag == "--hide":
                hides.append(value)
            else:
                uid, gid = value.split(":")
                user = (int(uid), int(gid))
        else:
            raise SystemExit(f"agent: bad flag {flag[:40]!r}")
    return Confinement(seccomp, covers, own_namespaces, user, hides)


def _serve(chan: socket.socket, message: bytes, fds: list[int], shims: dict[int, int],
           commands: Commands) -> None:
    got = parse(message, fds)
    op, ident, req = got if got is not None else (None, 0, {})
    if op == Op.KILL:
        if not commands.kill(ident) and (pid := shims.get(ident)) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return
    if op == Op.EXEC:
        commands.start(ident, req, fds)
        return
    if op == Op.SIGNAL:
        commands.signal(ident, req.get("signal"))
        return
    if op == Op.RESIZE:
        if (size := terminal_size([req.get("rows"), req.get("cols")])) is not None:
            commands.resize(ident, *size)
        return
    handler = SHIMS.get(op) if op is not None else None
    if handler is None:
        for fd in fds:
            os.close(fd)
        return
    try:
        pid = os.fork()
    except OSError as exc:  # the sandbox's process limit, reached
        report(fds[-1], {"error": f"cannot start: {exc.strerror}", "exit": NOT_STARTED})
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


def _orphans(shims: dict[int, int], commands: Commands) -> None:
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

