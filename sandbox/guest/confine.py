"""What the agent (`agent`) adds to each command and shim on top of the sandbox's own
confinement: no capability, no_new_privs, the seccomp filter, the sandbox's uid where the
agent's is another, and, where the kernel's namespaces serve, a command's own PID and mount
namespaces with a /proc of their own. Standard library only (ctypes for what os lacks).
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal

_COVERS = "/run/sealgate/covers"  # the agent's read-only tmpfs of what hides host files
_libc = ctypes.CDLL(None, use_errno=True)
# The clone runs Python on both sides: the call must keep the GIL (a PyDLL), or the child
# would start by taking a lock its parent's copy held.
_pylibc = ctypes.PyDLL(None, use_errno=True)
_pylibc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_void_p]

# linux/prctl.h, sched.h, mount.h, capability.h, seccomp.h (x86_64)
PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP = 4, 38, 22
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


def prctl(option: int, value: int, arg: int = 0) -> None:
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


class Confinement:
    """What the agent adds to each command (and shim) on top of the sandbox's own: the
    sandbox's uid where the agent's is another (`user`), no capability, no_new_privs, the
    seccomp filter, and, where the kernel's namespaces serve (`own_namespaces`), a command's
    own PID and mount namespaces with a /proc of their own, covered where it would show the
    host."""

    def __init__(self, seccomp: bytes | None, covers: list[str], own_namespaces: bool,
                 user: tuple[int, int] | None, hides: list[str] | None = None) -> None:
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
        self.hides = hides or []  # the agent's own directories, empty to each command
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
        """In a command's first process, PID 1 of its new namespaces: its own /proc, and its
        own devpts: bubblewrap's `--dev` mounts one instance for the sandbox, where every pty
        is the sandbox's uid's (mode 0620), so one command could open another's /dev/pts/N
        and read or type into it. A new instance over /dev/pts (bubblewrap's /dev/ptmx is the
        link pts/ptmx) shows this command only the terminals made in it. Fails closed: a
        command that cannot have its own is not started."""
        if not self.own_namespaces:
            return
        _private()
        _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        _mount("devpts", "/dev/pts", "devpts", _MS_NOSUID | _MS_NOEXEC,
               "newinstance,ptmxmode=0666,mode=0620")
        if os.path.realpath("/dev/ptmx") != "/dev/pts/ptmx":  # a device node, not the link
            _mount("/dev/pts/ptmx", "/dev/ptmx", None, _MS_BIND)
        for path in self.covers:
            _mount(f"{_COVERS}/empty", path, None, _MS_BIND)
            _mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID
                   | _MS_NODEV | _MS_NOEXEC)
        for path in self.hides:
            _mount("tmpfs", path, "tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV | _MS_NOEXEC,
                   "size=4k,nr_inodes=2,mode=0555")

    def drop(self) -> None:
        """The sandbox's uid, no capability in any set, none to gain by exec, then the filter:
        last, since it refuses what the steps before need."""
        prctl(_PR_SET_NO_NEW_PRIVS, 1)
        for cap in self._bounding:  # while CAP_SETPCAP, which allows it, is still held
            prctl(_PR_CAPBSET_DROP, cap)
        if self.user is not None:  # every capability left goes with the uid 0
            uid, gid = self.user
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            # Until it executes, this is a copy of the agent's memory (other commands' inputs
            # in it) with the workload's uid: a uid change may make it dumpable again.
            prctl(PR_SET_DUMPABLE, 0)
        try:
            prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
        except OSError as exc:  # a kernel without ambient capabilities (gVisor's) has none
            if exc.errno != errno.EINVAL:
                raise
        header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
        data = (ctypes.c_uint32 * 6)()
        _check(_libc.syscall(_SYS_CAPSET, header, data), "capset")
        self._install()

    def _install(self) -> None:
        if self._seccomp and not self._installed:
            prctl(_PR_SET_NO_NEW_PRIVS, 1)
            prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(self._filter))
            self._installed = True


def _private() -> None:
    """No mount made from here on flows to another mount namespace. gVisor's kernel has no
    mount propagation to change (EINVAL): nothing flows there to begin with."""
    try:
        _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise


def clone(namespaces: bool) -> int:
    """fork(), with `namespaces` the child the init of a new PID namespace with a new mount
    namespace: its pid, or 0 in the child. Python's os.fork cannot take flags (os.unshare is
    3.12's, and would move the agent's own later children too)."""
    flags = (_CLONE_NEWPID | _CLONE_NEWNS if namespaces else 0) | signal.SIGCHLD
    pid = _pylibc.syscall(ctypes.c_long(_SYS_CLONE), ctypes.c_ulong(flags), None, None, None,
                          ctypes.c_ulong(0))
    _check(pid, "clone")
    return int(pid)
