"""The gVisor tier: the sandbox's processes run on gVisor's user-space kernel (`runsc`, Debian's
package), so an escape needs a bug in gVisor's Sentry and then one in the host's kernel through
the few calls the Sentry's own seccomp filter lets it make.

The workload runs with `runsc run` on an OCI bundle generated for the run (never `runsc do`,
which serves the host's whole root through its gofer and copies the caller's environment):

- the bundle, the staged files and runsc's state (`--root`) live in one directory per link,
  `/run/sealgate/gvisor-<n>` (root only, on tmpfs), removed with the run and by the next run
  after one that died without its teardown (`clean_up`). What of the sandbox still runs is
  killed with the run's cgroups, which hold every process of it (runsc, the Sentry, the gofer,
  the Sentry's ptrace stubs), not by `runsc delete`: runsc reaches a sandbox over an abstract
  socket of the sandbox's network namespace, and there is nothing else to undo;
- the root is an empty read-only directory of that bundle holding the mount points and the
  /bin, /sbin, /lib links; the host's /usr and /etc (and any /lib* that is a directory) are
  bound read-only over it, /proc is gVisor's own, /tmp, /run, /home and the home directory are
  gVisor's tmpfs (in the Sentry's memory, counted against the run's memory limit), the
  workspace is bound read-write at /workspace;
- the staged files are bound read-only over their paths; the Sentry shows its mounts with no
  host path (`9p none`), so the bundle's location never shows. /proc/cmdline is the Sentry's
  own (a gVisor boot line, nothing of the host's);
- the process: the sandbox's uid and gid and no other group, the clean environment of
  `launch.environment` in config.json (root only, for the run's life; nothing in it is a
  secret of the host's: the sandbox holds none), no capability in any set, no_new_privileges,
  the runtime's own open-files limit, host name `sandbox`, new PID, IPC, UTS and mount
  namespaces, and the network namespace of the sandbox's link;
- runsc itself, the Sentry and the gofer run as root on the host, in the run's cgroups and the
  sandbox's network namespace (`launch.host_prefix`): their processes, threads and memory (the
  workload's memory is the Sentry's) count against the run's limits, and runsc is told not to
  manage cgroups itself (`--ignore-cgroups`);
- networking (`--network`) and platform (`--platform`): see `NETWORK` and `PLATFORM`;
- from an image (sandboxd, `Launch.root`): the root is the sandbox's overlay of the image's
  layers (`sandbox.host.rootfs`, not idmapped: the gofer writes for it as host root, into the
  upper on the sandbox's capped tmpfs), writable; /tmp, the home and /workspace are its own;
  the host's /usr is bound read-only where the agent runs its Python from. The agent runs as
  the sandbox's uid with its capabilities and its commands as gVisor's root with none: the
  image's files are root's, and a uid apart from theirs still keeps them from the agent.

bubblewrap's seccomp filter is not installed on one-shot runs: the workload's calls never reach
the host's kernel, and the Sentry implements none of what the filter refuses that touches the
host (io_uring, bpf, perf events, userfaultfd, kernel modules, kexec); the Sentry is itself
confined by runsc's own filter. The socket options the filter refuses are refused here too, by
the spec's own seccomp rules (`_seccomp`, runsc's `--oci-seccomp`): gVisor's kernel would grant
a mark or transparent proxying. sandboxd's agent installs the whole filter on its commands.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..host import rootfs
from ..host.cgroup import Limits
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
from ..host.network import RUN_DIR
from ..host.seccomp import REFUSED_OPTIONS
from . import Started, Tier

# Both measured on this runsc (0.0~20221219) and a 6.18 host, in docs/sandbox.md:
# - `--network=sandbox` (gVisor's netstack) refuses to start: it takes a namespace holding
#   net.core.rmem_default for the host's root namespace, and recent kernels (this host's 6.18)
#   have that sysctl in every namespace. `host` is left: the Sentry makes its sockets in the
#   sandbox's namespace, so every packet still leaves through the link and meets its table;
# - `--platform=kvm` hangs while the Sentry sets up its virtual machine (this host's /dev/kvm
#   is a nested PVM); ptrace is the one that runs.
NETWORK = "host"
PLATFORM = "ptrace"
# Host tasks per workload process under ptrace (its stub process and threads), and the Sentry's
# and gofer's own: measured 347 host tasks for 48 processes inside, 2263 for 400.
_TASKS_PER_PROCESS, _RUNTIME_TASKS = 8, 512


def place(index: int) -> Path:
    """Everything of a gVisor run on link `index`: bundle, staged files, runsc's state."""
    return RUN_DIR / f"gvisor-{index}"


def _unavailable() -> str | None:
    try:
        tool("runsc")
    except FileNotFoundError as exc:
        return f"{exc} (Debian: apt-get install runsc)"
    return None


def start(launch: Launch, cgroups: Sequence[Path], undo: contextlib.ExitStack) -> Started:
    """Raises OSError (the bundle cannot be written, runsc is missing)."""
    index = launch.link.index
    base = place(index)
    _remove(index)  # a directory no lease accounts for any more
    bundle = base / "bundle"
    base.mkdir(mode=0o700)
    # Traversable by the sandbox's user (it is its /): the run's directory above keeps it
    # closed on the host.
    (bundle / "rootfs").mkdir(mode=0o755, parents=True)
    mounts = _root(bundle / "rootfs", launch) if launch.root is None else _image_root(launch)
    mounts += _staged(base / "files", launch)
    config = _config(launch, mounts)
    (bundle / "config.json").write_text(json.dumps(config))
    # runsc dies with the runtime (the prefix's parent-death signal outlives its exec), and
    # the sandbox's processes with runsc (it starts them attached): nothing of a run killed
    # outright goes on running until the next run cleans up.
    argv = [*host_prefix(launch, cgroups), tool("runsc"), *_flags(base), "run",
            "--bundle", str(bundle), container(index)]
    # runsc's own environment: nothing of the sandbox's, which is in config.json.
    return Started(argv, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})


def _flags(base: Path) -> list[str]:
    return ["--root", str(base / "state"), "--ignore-cgroups", f"--network={NETWORK}",
            f"--platform={PLATFORM}", "--oci-seccomp"]  # the spec's filter (`_seccomp`)


def container(index: int) -> str:
    """The runsc container of link `index`'s run."""
    return f"sg-{index}"


def _root(rootfs: Path, launch: Launch) -> list[dict[str, Any]]:
    """The empty root's links and mount points; the mounts over it, in order."""
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
    ]
    binds = list(SYSTEM_DIRS)
    for path in SYSTEM_LINKS:
        if os.path.islink(path):
            (rootfs / path.lstrip("/")).symlink_to(os.readlink(path))
        elif os.path.isdir(path):
            binds.append(path)
    for path in binds:
        mounts.append(_bind(path, path, "ro"))
    for path in ("/tmp", "/run", "/home"):  # noqa: S108 the sandbox's own, not the host's
        if path not in launch.writable:
            mounts.append({"destination": path, "type": "tmpfs", "source": "tmpfs"})
    if HOME not in launch.writable:
        mounts.append({"destination": HOME, "type": "tmpfs", "source": "tmpfs",
                       "options": ["mode=0700", f"uid={launch.uid}", f"gid={launch.gid}"]})
    for inside, host in launch.writable.items():  # the scratch layer's places (sandboxd)
        mounts.append(_bind(str(host), inside, "rw"))
    if launch.workspace is not None:
        mounts.append(_bind(str(launch.workspace), WORKSPACE, "rw"))
    for mount in mounts:
        (rootfs / mount["destination"].lstrip("/").split("/")[0]).mkdir(exist_ok=True)
    return mounts


def _image_root(launch: Launch) -> list[dict[str, Any]]:
    """Over an image's root (`sandbox.host.rootfs`: an overlay of the host's, its upper on the
    sandbox's capped tmpfs, the gofer writing as root): gVisor's /proc, /dev and /run, and for
    the agent the host's /usr it runs its Python from. /tmp, the home and /workspace are the
    image root's own, on that tmpfs."""
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
        {"destination": "/run", "type": "tmpfs", "source": "tmpfs"},
    ]
    if launch.agent:
        mounts.append(_bind("/usr", f"{rootfs.HOST}/usr", "ro"))
    return mounts


def _staged(where: Path, launch: Launch) -> list[dict[str, Any]]:
    """The staged files, written under the run's root-only directory and bound read-only."""
    where.mkdir(mode=0o700)
    mounts = []
    for n, (path, data) in enumerate(launch.files.items()):
        if path.startswith("/proc/"):
            continue  # the Sentry's /proc is its own, with nothing of the host's in it
        file = where / str(n)
        file.write_bytes(data)
        file.chmod(0o444)
        mounts.append(_bind(str(file), path, "ro"))
    return mounts


def _bind(source: str, destination: str, mode: str) -> dict[str, Any]:
    return {"destination": destination, "type": "bind", "source": source,
            "options": ["rbind", mode, "nosuid", "nodev"]}


def _config(launch: Launch, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    # sandboxd's agent and its commands have uids of their own (`_capabilities`): the agent
    # gVisor's 0 and its commands the sandbox's uid; over an image, whose files are root's,
    # the other way round (the commands root there, with no capability, as on bubblewrap),
    # or the ids the image's User names, whose the root is then (`runtime.image_root`).
    ours, theirs = (0, 0), (launch.uid, launch.gid)
    agent, command = ((theirs, launch.image_user or ours) if launch.root is not None
                      else (ours, theirs))
    if not launch.agent:  # a one-shot run: its process is the workload, with no capability
        agent = command
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": agent[0], "gid": agent[1], "additionalGids": []},
            "args": [*launch.command, *(["--user", f"{command[0]}:{command[1]}"]
                                       if launch.agent else [])],
            "env": [f"{name}={value}" for name, value in environment(launch).items()],
            "cwd": working_dir(launch),
            "capabilities": _capabilities(launch),
            "noNewPrivileges": True,
            # The workload's process limit, counted by gVisor's kernel (the sandbox's uid has
            # no other process there); the host's cgroup bounds the runtime (`_host_limits`).
            "rlimits": [{"type": "RLIMIT_NOFILE", "soft": nofile[0], "hard": nofile[1]},
                        {"type": "RLIMIT_NPROC", "soft": launch.limits.pids,
                         "hard": launch.limits.pids}],
        },
        "root": {"path": "rootfs", "readonly": True} if launch.root is None
        else {"path": str(launch.root), "readonly": False},
        "hostname": HOSTNAME,
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"},
                           {"type": "mount"},
                           {"type": "network", "path": f"/run/netns/{launch.link.netns}"}],
            "seccomp": _seccomp(),
        },
    }


def _seccomp() -> dict[str, Any]:
    """The socket options `sandbox.host.seccomp` refuses on every tier (those Linux grants only with
    CAP_NET_ADMIN), refused by gVisor's kernel too, which would take them: EPERM, as bubblewrap's
    host kernel says. (sandboxd's agent installs the whole filter on each command as well.)"""
    rules = [{"names": ["setsockopt"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
              "args": [{"index": 1, "value": level, "op": "SCMP_CMP_EQ"},
                       {"index": 2, "value": name, "op": "SCMP_CMP_EQ"}]}
             for level, names in REFUSED_OPTIONS.items() for name in names]
    return {"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_X86_64"],
            "syscalls": rules}


def _capabilities(launch: Launch) -> dict[str, list[str]]:
    """None for the workload. sandboxd's agent runs as uid 0 of gVisor's kernel (none of the
    host's: the Sentry's own; over an image the sandbox's uid, its commands uid 0) with the
    capabilities it needs to start each command as the other uid with none (SETUID, SETGID,
    SETPCAP) and to kill what it leaves (KILL); never in the inheritable or ambient sets
    (`sandbox.guest.agent`). A uid of its own is what keeps the workload from the agent here:
    this kernel lets a process of the same uid open a non-dumpable one's /proc/N/fd, and its
    mount namespaces do not keep a command's /proc its own."""
    held = ["CAP_SETPCAP", "CAP_SETUID", "CAP_SETGID", "CAP_KILL"] if launch.agent else []
    return {"bounding": held, "effective": held, "permitted": held, "inheritable": [],
            "ambient": []}


def _remove(index: int) -> None:
    """The run's directory. Never raises."""
    shutil.rmtree(place(index), ignore_errors=True)


def _host_limits(limits: Limits) -> Limits:
    """The workload's processes are capped inside (RLIMIT_NPROC); on the host each costs
    several tasks, and the Sentry, which panics (ending the sandbox) when it cannot make one,
    needs its own: a host cap at the workload's would kill the sandbox instead of failing a
    fork inside."""
    return Limits(limits.pids * _TASKS_PER_PROCESS + _RUNTIME_TASKS, limits.memory, limits.cpus)


TIER = Tier("gvisor", _unavailable, start, _remove, _host_limits, image_owner="root",
            no_adopt="runsc runs as root under a parent-death signal armed for the daemon that "
                     "started it (the uid never changes, so nothing disarms it), and its "
                     "sandbox goes with it: the sandbox would die as that daemon exits",
            no_fork=f"runsc refuses to checkpoint a sandbox on --network={NETWORK} ('checkpoint "
                    "not supported when using hostinet'), and its own netstack does not start "
                    "on this kernel (see NETWORK)")
