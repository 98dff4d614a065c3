"""What the guest agent (`vmagent`) asks of the guest's system: its network, its files,
its channel's device, its processes. Standard library only, as the agent."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import selectors
import signal
import struct
import subprocess
import time

TYPE_CHECKING = False  # typing costs the guest's start; type checkers take this as true
if TYPE_CHECKING:
    from typing import Any

PORT_NAME = "sealgate.agent"
CGROUPS = "/sys/fs/cgroup"  # cgroup2, mounted by /init; the agent makes a group per command


def killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)


def born_in(cgroup: str, argv: list[str], **popen: Any) -> subprocess.Popen[bytes]:
    """`Popen` with the child born in `cgroup`, where everything it starts stays (only root
    could move it out): the agent joins it for the fork only, so none of the child's code runs
    outside it, and leaves it at once. (A kill of the group would spare the agent anyway: an
    init is sent no signal it has no handler for.)"""
    _join(cgroup)
    try:
        return subprocess.Popen(argv, **popen)
    finally:
        _join(CGROUPS)


def warm_up() -> None:
    """A child born in a group of its own and gone, at boot: the first move and fork into a
    group cost a sandbox's first command ~6 ms more than its later ones (through sandboxd,
    under TCG); it is paid here instead."""
    group = f"{CGROUPS}/warm-up"
    os.mkdir(group)
    born_in(group, ["/sealgate/busybox", "true"]).wait()
    os.rmdir(group)


def _join(cgroup: str) -> None:
    with open(f"{cgroup}/cgroup.procs", "w") as fh:
        fh.write(str(os.getpid()))


def kill_group(cgroup: str) -> bool:
    """SIGKILL for every process in `cgroup`, a fork under way included; False if it could
    not be asked."""
    try:
        with open(f"{cgroup}/cgroup.kill", "w") as fh:
            fh.write("1")
    except OSError:
        return False
    return True


def configure(address: str, gateway: str) -> None:
    for argv in (["ip", "addr", "add", address, "dev", "eth0"], ["ip", "link", "set", "eth0", "up"],
                 ["ip", "route", "add", "default", "via", gateway]):
        _busybox(argv)


def seal() -> None:
    """The guest's root (the initramfs: /etc, the agent, busybox) read-only, for root too."""
    _busybox(["mount", "-o", "remount,ro", "/"])


def _busybox(argv: list[str]) -> None:
    done = subprocess.run(["/sealgate/busybox", *argv], capture_output=True, check=False)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv)}: {done.stderr.decode(errors='replace').strip()}")


def put(path: str, data: bytes, mode: int, uid: int, gid: int) -> None:
    os.makedirs(os.path.dirname(path) or "/", exist_ok=True)
    tmp = f"{path}.sealgate-tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    try:
        os.write(fd, data)
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def port_path() -> str:
    """The device of the agent's channel (a virtio console port found by its name)."""
    base = "/sys/class/virtio-ports"
    for name in sorted(os.listdir(base)):
        try:
            with open(f"{base}/{name}/name") as fh:
                if fh.read().strip() == PORT_NAME:
                    return f"/dev/{name}"
        except FileNotFoundError:  # a console port has no name
            continue
    raise FileNotFoundError(f"no virtio port named {PORT_NAME}")


def wait_writable(fd: int) -> None:
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_WRITE)
        sel.select(1.0)


def drain(fd: int) -> None:
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def freeze(groups: list[str], frozen: bool, seconds: float = 2.0) -> None:
    """cgroup v2's freezer on each command's group (a group gone meanwhile is skipped);
    freezing waits, for at most `seconds`, until each says it is frozen: a layer copied from
    then on is one instant of the root."""
    for group in groups:
        try:
            with open(f"{group}/cgroup.freeze", "w") as fh:
                fh.write("1" if frozen else "0")
        except OSError:
            continue
    deadline = time.monotonic() + seconds
    for group in groups if frozen else ():
        while time.monotonic() < deadline:
            try:
                with open(f"{group}/cgroup.events") as fh:
                    if "frozen 1" in fh.read().splitlines():
                        break
            except OSError:
                break
            time.sleep(0.005)


def kill_all(cmd: Any) -> None:
    """SIGKILL for every process of a command's (the agent's `_Command`), at once (its cgroup's)."""
    if cmd.group is not None and not kill_group(cmd.group):
        killpg(cmd.pid, signal.SIGKILL)  # never expected; its session, at least


def gone(cmd: Any) -> bool:
    """Whether nothing of the ended command runs any more (its group removed, which only an
    empty one can be), or what is left has had its time to die: its exit is said then, and an
    empty group that cannot be removed is left behind."""
    if cmd.group is None:
        return True
    try:
        os.rmdir(cmd.group)
    except OSError as exc:
        if exc.errno == errno.EBUSY and time.monotonic() < cmd.gone_by:
            return False
    cmd.group = None
    return True


# Linux's <linux/random.h>: RNDADDENTROPY, _IOW('R', 3, int[2]); RNDRESEEDCRNG, _IO('R', 7).
_RNDADDENTROPY, _RNDRESEEDCRNG = 0x40085203, 0x5207


def renew(request: dict[str, Any]) -> None:
    """A copy resumed from another VM's memory made its own (`vmagent`'s renew): what it
    shares with its siblings and its original is replaced before any command of it runs on.

    - its randomness: the kernel's pool given `seed` (the host's, credited) and its generator
      rekeyed at once, so /dev/urandom and getrandom part from the original's from here;
    - its clock (`time`), stopped while the VM was saved and copied;
    - its `address` and route (`gateway`): its own slot's link;
    - the staged `files` that name the sandbox (resolv.conf, its own new machine-id...):
      rewritten in place, which the binds over the image's root show (a new file would not
      be theirs)."""
    seed = bytes.fromhex(str(request["seed"]))
    address, gateway = str(request["address"]), str(request["gateway"])
    files = {str(k): str(v).encode("latin-1") for k, v in request["files"].items()}
    fd = os.open("/dev/urandom", os.O_WRONLY | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, _RNDADDENTROPY, struct.pack("ii", len(seed) * 8, len(seed)) + seed)
        fcntl.ioctl(fd, _RNDRESEEDCRNG)
    finally:
        os.close(fd)
    time.clock_settime(time.CLOCK_REALTIME, float(request["time"]))
    _busybox(["ip", "addr", "flush", "dev", "eth0"])
    _busybox(["ip", "addr", "add", address, "dev", "eth0"])
    _busybox(["ip", "route", "replace", "default", "via", gateway])
    _busybox(["mount", "-o", "remount,rw", "/"])
    try:
        for path, data in files.items():
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
    finally:
        seal()
