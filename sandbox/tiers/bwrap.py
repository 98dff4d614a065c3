"""The bubblewrap tier: the sandbox's processes run on the host's kernel, confined by its
namespaces, no capabilities and a seccomp filter.

- `setpriv` drops to the sandbox's unprivileged uid before bubblewrap runs, so the process is
  never root outside (a root-owned 0600 file stays unreadable even through a read-only bind);
- bubblewrap gives it new user, PID, IPC, UTS and cgroup namespaces (the network one stays the
  sandbox's), no capabilities, no nested user namespaces, a new session (no keystrokes pushed
  into the caller's terminal), and dies with its parent (a one-shot run's: sandboxd's slots die
  with their channel and watchdog, `sandbox.daemon.slot`);
- the filesystem is the host's system directories read-only (/usr, /etc and the /bin, /sbin,
  /lib links), fresh /proc, /dev and empty tmpfs on /tmp, /run and the home directory, and
  the workspace, if given, read-write at /workspace. Nothing else of the host is visible: not
  the proxy's state, not other users' files, not /run's sockets;
- the staged files are handed to bubblewrap by content, through memory file descriptors, and
  so are bubblewrap's own arguments: no host path of the run shows in the sandbox's mount
  table, nor on the command line of its PID 1 (bubblewrap), which it can read;
- the seccomp filter of `sandbox.host.seccomp` is installed last, just before the command runs;
- the command is its PID namespace's init (`--as-pid-1`): no process of bubblewrap's is in the
  sandbox for the workload to signal or write into, and when the command ends the kernel kills
  whatever it left.

sandboxd's agent (`launch.agent`) is started the same way but for three things it needs to give
each command namespaces of its own (`sandbox.guest.agent`): CAP_SYS_ADMIN and CAP_SETPCAP in the
sandbox's user namespace, no filter (it installs it on each command), and no file laid over
/proc (a fresh /proc may not be mounted where one is partly hidden): it lays its own over each
command's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..host import rootfs
from ..host.launch import (
    HOME,
    HOSTNAME,
    SYSTEM_DIRS,
    SYSTEM_LINKS,
    WORKSPACE,
    Launch,
    environment,
    host_prefix,
    tool,
    working_dir,
)
from . import Started, Tier


def _unavailable() -> str | None:
    try:
        for name in ("bwrap", "setpriv"):
            tool(name)
    except FileNotFoundError as exc:
        return f"{exc} (Debian: bubblewrap, util-linux)"
    return None


def start(launch: Launch, cgroups: Sequence[Path], undo: contextlib.ExitStack) -> Started:
    """Raises OSError (a descriptor that cannot be made, a missing program)."""
    staged = dict(launch.files)
    command = list(launch.command)
    if launch.agent:  # each command's own /proc, the agent's empty file over these
        command.append("--own-namespaces")
        for path in [p for p in staged if p.startswith("/proc/")]:
            del staged[path]
            command += ["--cover", path]
    files = {path: memfd(data, undo) for path, data in staged.items()}
    seccomp_fd = None if launch.agent else memfd(launch.seccomp, undo)
    args_fd = memfd(b"".join(os.fsencode(a) + b"\0" for a in args(launch, files, seccomp_fd)),
                    undo)
    passed = (args_fd, *files.values(), *([] if seccomp_fd is None else [seccomp_fd]))
    return Started(argv(launch, args_fd, cgroups, command), environment(launch), passed)


def argv(launch: Launch, args_fd: int, cgroups: Sequence[Path],
         command: Sequence[str] | None = None) -> list[str]:
    """The host's command line: into the cgroups, the namespace, the uid, then bubblewrap, whose
    arguments (`args`) are read from `args_fd`."""
    return [*host_prefix(launch, cgroups),
            tool("setpriv"), f"--reuid={launch.uid}", f"--regid={launch.gid}", "--clear-groups",
            "--", tool("bwrap"), "--args", str(args_fd), "--",
            *(launch.command if command is None else command)]


def args(launch: Launch, files: Mapping[str, int], seccomp_fd: int | None) -> list[str]:
    """bubblewrap's arguments; `files` are the staged files' descriptors, by path inside."""
    out = ["--unshare-all", "--unshare-user", "--share-net", "--disable-userns", "--as-pid-1",
           "--hostname", HOSTNAME, "--new-session"]
    if not launch.agent:
        # sandboxd's slot dies with the last daemon holding its channel and watchdog instead
        # (`sandbox.daemon.slot`): this signal would follow the daemon that started it, and
        # kill the sandbox at a hand-over to its successor.
        out.append("--die-with-parent")
    out += ["--cap-drop", "ALL"] + (
        ["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP"] if launch.agent else [])
    if launch.root is not None:
        # The image's, the sandbox's own to change: its files are the sandbox's one uid's,
        # which is root inside, or the ids the image's User names (all of the root theirs).
        uid, gid = launch.image_user or (0, 0)
        out += ["--bind", str(launch.root), "/", "--uid", str(uid), "--gid", str(gid)]
    else:
        for path in SYSTEM_DIRS:
            out += ["--ro-bind", path, path]
        for path in SYSTEM_LINKS:
            if os.path.islink(path):
                out += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                out += ["--ro-bind", path, path]
    out += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/run"]
    if launch.root is None:
        # The sandbox's own empty /tmp and home, not the host's. (An image's root has its
        # own, on the sandbox's capped tmpfs like the rest of what it writes.)
        out += ["--tmpfs", "/home"]
        if "/tmp" not in launch.writable:  # noqa: S108
            out += ["--tmpfs", "/tmp"]  # noqa: S108
        if HOME not in launch.writable:
            out += ["--dir", HOME]
    elif launch.agent:  # the agent's Python: the host's
        out += ["--ro-bind", "/usr", f"{rootfs.HOST}/usr"]
    for inside, host in launch.writable.items():
        out += ["--bind", str(host), inside]
    for path, fd in files.items():  # over /proc and /etc, so after them
        out += ["--perms", "0444", "--ro-bind-data", str(fd), path]
    if launch.workspace is not None:
        out += ["--bind", str(launch.workspace), WORKSPACE]
    out += ["--chdir", working_dir(launch)]
    if seccomp_fd is not None:
        out += ["--seccomp", str(seccomp_fd)]
    return out


def memfd(data: bytes, undo: contextlib.ExitStack) -> int:
    """A descriptor holding `data`, which the sandbox's bubblewrap reads once: in memory, under
    no path of the host's."""
    fd = os.memfd_create("sealgate")
    undo.callback(os.close, fd)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _clean_up(_: int) -> None:
    """Nothing: a bubblewrap run holds nothing on the host beyond its cgroups and link."""


TIER = Tier("bwrap", _unavailable, start, _clean_up, image_owner="sandbox",
            no_fork="its processes run on the host's kernel, which cannot checkpoint them "
                    "without CRIU (not used here)")
