"""The agent inside the microVM: PID 1 of the guest, run by the host's python3 (`-I -S`, the
standard library only) through the /usr the host shares read-only, or, in a VM from an image,
from the initramfs's copy of it (`tiers/microvm/runtime`), driven by the host over a
virtio console port (`tiers/microvm/channel.py`). In the guest it is `guest.vmagent`, beside
`protocol` and `vmos` in /sealgate (the image's), so its imports of this package's are relative.

The frames are `protocol`'s. The host asks; the agent answers with the request's `id`:

- `net` (address, gateway): puts the sandbox's address on eth0 and its route via the host end;
- `put` (path, mode, uid, gid, payload) and `get` (path): files, whole;
- `seal`: the guest's root read-only, once the host has put what it stages there (the first
  `exec` does it if the host has not), so that only the scratch mounts are writable;
- `root` (dirs, files, owner, workspace, home): a sandbox from an image: its root made of the
  image's disk, with the staged files laid over and what the image has in /workspace (a
  snapshot's) copied into the workspace as `owner` (`vmroot`), before the seal; the workspace
  is the host's 9p share, or, with `workspace` (bytes), a tmpfs of the guest's own, `owner`'s,
  as is `home` (its User's home, one of `dirs`);
- `hold`: nothing more sent or served until `release` (the host saved the VM's memory,
  the channel between two frames) or `renew` (address, gateway, files, seed, time: this is a
  copy resumed from that save, made its own: `vmos.renew`);
- `layer`: an image's root's writes and the workspace as a layer's tar stream (`tarout.layer`,
  its snapshot), run as the guest's root outside the image's root (where nothing the sandbox
  can change is run) with every running command frozen meanwhile (cgroup v2's freezer), so
  that the layer is one instant of the root; its stream and status come as an exec's output
  (fd 1, fd 2) and exit;
- `exec` (argv, env, cwd, uid, gid, timeout, pids, tty): starts the command in a new session and a
  cgroup of its own as that uid with no supplementary groups, only the environment given, and
  at most `pids` processes of that uid (RLIMIT_NPROC); `stdin` frames feed it (an empty
  payload closes it), `kill` signals its process group (SIGKILL, the default: its cgroup);
  the agent sends `out` frames (fd 1 or 2) and finally `exit` (code, 128 + N for signal N, 124
  past its timeout, 127 when it could not be started; and `signal` N or `timed_out`, so that
  a command's own exit 143 or 124 is not read as one), after all its output. When the command
  ends or times out, everything it started is killed, whatever session it moved to (nothing
  leaves its cgroup without root), and its exit is said once they are gone. With `root` (once
  the image's root is made) it runs chrooted there as the guest's root (uid 0, the only uid
  an image's files are writable by): there the VM is the boundary, not a uid, and the process
  limit is its cgroup's `pids.max` (root is not held to RLIMIT_NPROC). Without it, as root
  only in an image's guest (its shims, on its own workspace), never in a host-root one. With
  `tty` ([rows, cols]) its streams are a terminal of the guest's devpts, its controlling
  terminal, whose output comes as fd 1 and which `resize` (rows, cols) resizes.

The agent holds nothing the host has not handed it: no credential, no key.

Why one module of ~480 lines: it is PID 1's one loop, and every op's handler shares its
selector, its commands, its channel and its hold; what stands apart has left (`vmos`: the
guest's system; `vmroot`: an image's root; `terminal`; `tarout`, run as a program of its own).
"""

from __future__ import annotations

import itertools
import os
import resource
import select
import selectors
import signal
import subprocess
import sys
import time

from . import terminal
from .protocol import MAX_FRAME, NOT_STARTED, TIMED_OUT, VERSION, Frames, Op, encode, terminal_size
from .vmos import (
    CGROUPS,
    born_in,
    configure,
    drain,
    freeze,
    gone,
    kill_all,
    killpg,
    port_path,
    put,
    renew,
    seal,
    wait_writable,
    warm_up,
)

# Neither dataclasses nor typing at run time: every module the agent imports is read (over 9p
# in a host-root VM) and run under emulation where there is no KVM, and those two (with
# inspect, which dataclasses pulls in) cost ~150 ms of its start there. Type checkers take
# any TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, BinaryIO

_CHUNK = 65536
_GONE_SECONDS = 5.0  # for what a command left to die of its kill before its exit is said anyway
_GONE_POLL = 0.02  # how often the agent looks meanwhile
# A layer's copy: the agent's own code (tarout.layer), from its own /sealgate, never the
# image's; the commands stay frozen while it runs, so it has a time limit.
_LAYER_ARGV = ["/usr/bin/python3", "-I", "-S", "-c", "import sys; sys.path.insert(0, '/sealgate'); "
               "from guest.tarout import layer; layer({}, [1, 2])"]
_LAYER_SECONDS = 600.0


class _Command:
    def __init__(self, ident: int, pid: int, group: str, deadline: float | None,
                 stdin: int | None) -> None:
        self.id = ident
        self.pid = pid
        self.group: str | None = group  # its cgroup, until it is removed (empty)
        self.gone_by = 0.0  # once it ended: when its exit is said, whatever is left of it
        self.deadline = deadline
        self.stdin = stdin
        self.pending = bytearray()
        self.closing = False
        self.outputs: set[int] = set()
        self.status: int | None = None
        self.timed_out = False
        self.thaws: list[str] = []  # a layer's copy: the groups it froze, thawed at its end


class Agent:
    def __init__(self, port: BinaryIO) -> None:
        self.port = port
        self.sel = selectors.DefaultSelector()
        self.commands: dict[int, _Command] = {}
        self.by_pid: dict[int, _Command] = {}
        self.frames = Frames()
        self.groups = itertools.count(1)
        self.sealed = False
        self.root: str | None = None  # an image's root, once made (`vmroot`)
        self.wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.sel.register(self.wake_r, selectors.EVENT_READ, ("wake", None))
        os.set_blocking(port.fileno(), False)
        self.sel.register(port.fileno(), selectors.EVENT_READ, ("port", None))

    def send(self, header: dict[str, Any], payload: bytes = b"") -> None:
        data = encode(header, payload)
        fd = self.port.fileno()
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                wait_writable(fd)

    def run(self) -> None:
        self.send({"op": Op.READY, "kernel": os.uname().release, "version": VERSION})
        while True:
            for key, _ in self.sel.select(self._wait()):
                kind, target = key.data
                try:
                    self._event(kind, target, key.fd)
                except Exception as exc:
                    if kind == "port":
                        raise  # the host's channel is broken: nothing more can be served
                    # Anything else is one command's trouble, never the agent's end: PID 1's
                    # end is the VM's, with every other command running in it.
                    print(f"sealgate guest agent: {kind}: {exc!r}", file=sys.stderr)
            self._timeouts()
            for cmd in [c for c in self.commands.values() if c.status is not None]:
                self._finish(cmd)  # once what it left is gone

    def _wait(self) -> float | None:
        """Until the next deadline, or a short look while an ended command's group empties."""
        now = time.monotonic()
        waits = [c.deadline - now for c in self.commands.values()
                 if c.deadline is not None and c.status is None]
        if any(c.status is not None and c.group for c in self.commands.values()):
            waits.append(_GONE_POLL)
        return max(0.0, min(waits)) if waits else None

    def _event(self, kind: str, cmd: Any, fd: int) -> None:
        if kind == "port":
            self._from_host()
        elif kind == "wake":
            drain(self.wake_r)
            self._reap()
        elif kind == "out":
            self._output(cmd, fd)
        elif kind == "in":
            self._feed(cmd)

    def _from_host(self) -> None:
        try:
            data = os.read(self.port.fileno(), _CHUNK)
        except BlockingIOError:
            return
        if not data:  # the host is not connected yet or went away: nothing to do but wait
            time.sleep(0.01)
            return
        for header, payload in self.frames.feed(data):
            self._answer(header, payload)

    def _answer(self, header: dict[str, Any], payload: bytes) -> None:
        try:
            self._handle(header, payload)
        except Exception as exc:  # any failure is the request's answer, not the agent's end
            self.send({"op": Op.ERROR, "id": header.get("id"), "message": str(exc)[:500]})

    def _hold(self) -> None:
        """Nothing sent, no command served, until the host releases the guest (its memory
        saved, with the channel between two frames) or renews it (this is a copy resumed
        from that save). What else comes meanwhile is served after."""
        later: list[tuple[dict[str, Any], bytes]] = []
        fd = self.port.fileno()
        while True:
            select.select([fd], [], [])
            try:
                data = os.read(fd, _CHUNK)
            except BlockingIOError:
                continue
            if not data:  # the host's end not connected yet (a copy's QEMU starting)
                time.sleep(0.01)
                continue
            frames = self.frames.feed(data)
            for at, (header, payload) in enumerate(frames):
                if header.get("op") in (Op.RELEASE, Op.RENEW):
                    if header.get("op") == Op.RENEW:
                        renew(header)
                    self.send({"op": Op.OK, "id": header.get("id")})
                    for frame in [*later, *frames[at + 1:]]:
                        self._answer(*frame)
                    return
                later.append((header, payload))

    def _handle(self, header: dict[str, Any], payload: bytes) -> None:
        op, ident = header.get("op"), header.get("id")
        if op == Op.PING:
            self.send({"op": Op.OK, "id": ident})
        elif op == Op.HOLD:
            self.send({"op": Op.OK, "id": ident})
            self._hold()
        elif op == Op.NET:
            configure(str(header["address"]), str(header["gateway"]))
            self.send({"op": Op.OK, "id": ident})
        elif op == Op.SEAL:
            self._seal()
            self.send({"op": Op.OK, "id": ident})
        elif op == Op.ROOT:
            self._make_root(header)
            self.send({"op": Op.OK, "id": ident})
        elif op == Op.LAYER:
            self._layer(int(header["id"]))
        elif op == Op.PUT:
            put(str(header["path"]), payload, int(header.get("mode", 0o644)),
                int(header.get("uid", 0)), int(header.get("gid", 0)))
            self.send({"op": Op.OK, "id": ident})
        elif op == Op.GET:
            with open(str(header["path"]), "rb") as fh:
                self.send({"op": Op.DATA, "id": ident}, fh.read(MAX_FRAME - 4096))
        elif op == Op.EXEC:
            self._exec(header)
        elif op == Op.STDIN:
            cmd = self.commands[int(header["id"])]
            cmd.pending += payload
            cmd.closing = cmd.closing or not payload
            self._feed(cmd)
        elif op == Op.RESIZE:
            cmd = self.commands[int(header["id"])]
            size = terminal_size([header.get("rows"), header.get("cols")])
            if size is not None and cmd.outputs:  # a terminal's master, until it ends
                terminal.resize(next(iter(cmd.outputs)), *size)
        elif op == Op.KILL:
            cmd = self.commands[int(header["id"])]
            sig = int(header.get("signal", signal.SIGKILL))
            if cmd.status is None and sig == signal.SIGKILL:
                kill_all(cmd)
            elif cmd.status is None:
                killpg(cmd.pid, sig)
        else:
            raise ValueError(f"unknown op {op!r}")

    def _exec(self, header: dict[str, Any], *, ours: bool = False) -> None:
        ident = int(header["id"])
        argv = [str(a) for a in header["argv"]]
        env = {str(k): str(v) for k, v in header.get("env", {}).items()}
        uid, gid = int(header["uid"]), int(header["gid"])
        in_root = header.get("root") is True
        if in_root and self.root is None:
            raise ValueError("this guest has no image root")
        # An image's guest is its commands' as its root (they could reach its own root through
        # /proc/1/root): its shims may be root there too, on a workspace that is root's.
        if (uid == 0 or gid == 0) and self.root is None and not ours:
            raise ValueError("a command never runs as root in a guest with no image's root")
        self._seal()  # if the host has not: no command runs with the root writable
        home = env.get("HOME")
        cwd = header.get("cwd") or home or "/"
        if home and not in_root and not os.path.isdir(home):
            os.makedirs(home, mode=0o700)
            os.chown(home, uid, gid)
        # The child inherits the agent's limit; the agent, root, is not held to it.
        pids = int(header.get("pids") or resource.RLIM_INFINITY)
        resource.setrlimit(resource.RLIMIT_NPROC, (pids, pids))
        group = f"{CGROUPS}/command-{next(self.groups)}"
        os.mkdir(group)
        enter = None
        tty = terminal_size(header.get("tty"))
        # The terminal stays root's (0620, group root): the command holds it open as its
        # streams and controlling terminal, and no other command of its uid, which shares
        # this devpts, can open its /dev/pts/N to read or type into it.
        master, slave = terminal.open_pty(*tty) if tty else (-1, -1)
        if in_root:
            root = self.root or "/"  # set: checked above
            # Root is not held to RLIMIT_NPROC: its group is (the agent in it for the fork).
            if header.get("pids"):
                with open(f"{group}/pids.max", "w") as fh:
                    fh.write(str(pids + 1))

            def enter() -> None:  # in the child, before its exec
                # Its ids are taken here, after the chroot (which needs root): Popen sets a
                # `user` before it calls this. The supplementary groups are cleared already.
                os.chroot(root)
                os.chdir(cwd)
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
        streams = subprocess.PIPE if slave < 0 else slave

        def started() -> None:  # in the child: its terminal, then the image's root if any
            terminal.take(0)
            if enter is not None:
                enter()
        try:
            child = born_in(group, argv, env=env, cwd=None if in_root else cwd,
                            user=None if in_root else uid, group=None if in_root else gid,
                            extra_groups=[], start_new_session=True,
                            stdin=streams, stdout=streams, stderr=streams, close_fds=True,
                            preexec_fn=enter if slave < 0 else started)
        except (OSError, subprocess.SubprocessError) as exc:
            if master >= 0:
                os.close(master)
            os.rmdir(group)  # the failed child was reaped: nothing is in it
            said = (f"cannot run {argv[0]!r}: {exc.strerror or exc}" if isinstance(exc, OSError)
                    else f"cannot enter {cwd!r} in the image's root" if in_root else str(exc))
            self.send({"op": Op.OUT, "id": ident, "fd": 2}, f"sealgate: {said}\n".encode())
            self.send({"op": Op.EXIT, "id": ident, "code": NOT_STARTED})
            return
        finally:
            if slave >= 0:
                os.close(slave)
        # The pipes are read by the select loop; the Popen object's own waiting is never used
        # (the agent, PID 1, reaps every child itself). A terminal is its master, both ways.
        pipes = [p for p in (child.stdin, child.stdout, child.stderr) if p is not None]
        stdin = os.dup(master if slave >= 0 else pipes[0].fileno())
        timeout = header.get("timeout")
        cmd = _Command(ident, child.pid, group,
                       time.monotonic() + float(timeout) if timeout else None, stdin)
        os.set_blocking(stdin, False)
        for out, fd in ([(master, 1)] if slave >= 0 else
                        [(os.dup(pipes[1].fileno()), 1), (os.dup(pipes[2].fileno()), 2)]):
            os.set_blocking(out, False)
            cmd.outputs.add(out)
            self.sel.register(out, selectors.EVENT_READ, ("out", (cmd, fd)))
        for pipe in pipes:
            pipe.close()
        child.returncode = 0  # so its finaliser never waits for what the agent reaps
        self.commands[ident] = cmd
        self.by_pid[child.pid] = cmd
        self.send({"op": Op.STARTED, "id": ident, "pid": child.pid})

    def _layer(self, ident: int) -> None:
        if self.root is None:
            raise ValueError("this guest has no image root to copy")
        frozen = [c.group for c in self.commands.values() if c.status is None and c.group]
        freeze(frozen, True)
        try:
            self._exec({"id": ident, "argv": _LAYER_ARGV, "uid": 0, "gid": 0, "cwd": "/",
                        "env": {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                        "timeout": _LAYER_SECONDS}, ours=True)
        finally:
            if ident in self.commands:
                self.commands[ident].thaws = frozen
            else:  # it could not start (its exit said already)
                freeze(frozen, False)

    def _make_root(self, header: dict[str, Any]) -> None:
        if self.sealed or self.root is not None:
            raise ValueError("the root is made once, before the seal")
        from . import vmroot  # an image's sandbox only: ctypes costs every other's start

        dirs = {str(k): int(v) for k, v in header["dirs"].items()}
        with open(f"{CGROUPS}/cgroup.subtree_control", "w") as fh:
            fh.write("+pids")  # each command's process limit is its group's (see _exec)
        uid, gid = (int(n) for n in header["owner"])
        size, home = header.get("workspace"), header.get("home")
        self.root = vmroot.make(dirs, [str(p) for p in header["files"]], (uid, gid),
                                None if size is None else int(size),
                                None if home is None else str(home))

    def _seal(self) -> None:
        if not self.sealed:
            seal()
            self.sealed = True

    def _output(self, target: tuple[_Command, int], fd: int) -> None:
        cmd, which = target
        try:
            data = os.read(fd, _CHUNK)
        except BlockingIOError:
            return
        except OSError:  # a terminal's master once no one holds its other side (EIO)
            data = b""
        if data:
            self.send({"op": Op.OUT, "id": cmd.id, "fd": which}, data)
            return
        self.sel.unregister(fd)
        os.close(fd)
        cmd.outputs.discard(fd)
        self._finish(cmd)

    def _feed(self, cmd: _Command) -> None:
        if cmd.stdin is None:
            return
        while cmd.pending:
            try:
                del cmd.pending[:os.write(cmd.stdin, cmd.pending)]
            except BlockingIOError:
                break
            except BrokenPipeError:
                cmd.pending.clear()
                cmd.closing = True
        registered = cmd.stdin in self.sel.get_map()
        if cmd.pending and not registered:
            self.sel.register(cmd.stdin, selectors.EVENT_WRITE, ("in", cmd))
        elif not cmd.pending and registered:
            self.sel.unregister(cmd.stdin)
        if not cmd.pending and cmd.closing:
            os.close(cmd.stdin)
            cmd.stdin = None

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if not (os.WIFEXITED(status) or os.WIFSIGNALED(status)):
                # A stop is not an end. Without WUNTRACED, only a child the agent traces
                # reports one: a command that asked it to (PTRACE_TRACEME). The agent resumes
                # no one, so it stays stopped until its end or timeout kills it, as under any
                # parent that traces no one.
                continue
            cmd = self.by_pid.pop(pid, None)
            if cmd is None:
                continue  # an orphan of some command's, reparented to PID 1
            cmd.status = os.waitstatus_to_exitcode(status)
            # Everything it started goes with it, whatever session it moved to: nothing
            # outlives it or holds its output open.
            kill_all(cmd)
            cmd.gone_by = time.monotonic() + _GONE_SECONDS
            self._finish(cmd)

    def _timeouts(self) -> None:
        now = time.monotonic()
        for cmd in self.commands.values():
            if cmd.status is None and cmd.deadline is not None and now >= cmd.deadline:
                cmd.timed_out = True
                cmd.deadline = None
                kill_all(cmd)

    def _finish(self, cmd: _Command) -> None:
        if cmd.status is None or cmd.outputs or not gone(cmd):
            return
        if cmd.stdin is not None:
            if cmd.stdin in self.sel.get_map():
                self.sel.unregister(cmd.stdin)
            os.close(cmd.stdin)
            cmd.stdin = None
        status = cmd.status
        ended: dict[str, Any] = {"op": Op.EXIT, "id": cmd.id}
        if cmd.timed_out:
            ended.update(code=TIMED_OUT, timed_out=True)
        elif status < 0:
            ended.update(code=128 - status, signal=-status)
        else:
            ended["code"] = status
        del self.commands[cmd.id]
        freeze(cmd.thaws, False)
        self.send(ended)


def main() -> None:
    try:
        warm_up()
        with open(port_path(), "r+b", buffering=0) as port:
            Agent(port).run()
    finally:
        # PID 1 must not return: the guest would panic. The host sees the VM end.
        print(f"sealgate guest agent ended: {sys.exc_info()[1]!r}", file=sys.stderr)
        os.execv("/sealgate/busybox", ["reboot", "-f"])  # noqa: S606 - a fixed program
