"""One sandboxed run in a microVM, on the host: the command the microVM tier hands the runtime
(`sandbox.tiers.microvm`), started as root in the sandbox's network namespace and cgroups.

It reads what to run from a descriptor (`Order`, JSON: the command, its environment, the
staged files, the addresses; never on a command line, which `ps` shows), then:

1. wires the namespace for a guest: the sandbox's end of the veth gives its address up and
   joins a bridge with a tap device, so the guest's eth0 takes the sandbox's address and its
   packets leave through the same veth; the host's side (its end of the veth, its firewall
   table, its name server, the proxy) sees exactly what it sees for any tier;
2. boots the VM on that tap (`vm`), as the run's uid, with the workspace shared read-write;
3. gives the guest its address and route, and the staged files (the CA bundle, resolv.conf,
   ...), over the agent's channel, for a sandbox from an image (sandboxd's: `disk`) has the
   image's root made of its disk with those files laid over, and then has the guest's own
   root made read-only;
4. runs the command as the run's uid with the clean environment, its input and output this
   process's own, its time limit kept by the guest from the command's start (a boot under
   emulation takes seconds of it otherwise), and exits with its status (125 when the VM could
   not be had).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ...errors import SandboxError
from ...guest.protocol import over_time
from . import image, pool, vm
from .channel import Channel
from .pool import Booted

SETUP_FAILED = 125
BRIDGE = "sgvmbr"
TAP = "sgvmtap"
_BOOT_SECONDS = 60.0  # emulated boots on a loaded host take seconds; KVM's a fraction of one


@dataclass(frozen=True)
class Order:
    command: list[str]
    env: dict[str, str]
    files: dict[str, str]  # path in the guest -> its content, latin-1 (bytes as they are)
    sandbox_if: str
    address: str  # the sandbox's, with its prefix
    gateway: str  # the host's end of the link
    uid: int
    gid: int
    cwd: str
    pids: int
    memory_mib: int
    workspace: str | None = None  # the host's directory shared as /workspace
    # Without one, with `disk` (a served image's): the guest's own tmpfs of this many bytes.
    workspace_bytes: int | None = None
    disk: str | None = None  # an image's erofs disk (`sandbox.images.disk`), read-only
    root_dirs: dict[str, int] | None = None  # with `disk`: what to make in its root, by mode
    # A saved VM's memory (`qmp`): resumed here as a copy of it (`resume`) instead of a boot.
    restore: str | None = None
    # With `disk`: the image's User (uid, gid) its commands and file ops run as, and its home
    # (`ImageRoot.user`, `home`); without one, the guest's root.
    user: list[int] | None = None
    home: str | None = None

    def image_ids(self) -> tuple[int, int]:
        """Who a command of an image's guest is: its User, else the guest's root."""
        return (self.user[0], self.user[1]) if self.user else (0, 0)
    timeout: float | None = None  # the command's, kept by the guest from its start

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Order:
        return cls(**json.loads(data))


def wire(sandbox_if: str) -> None:
    """The bridge and tap in this (the sandbox's) namespace; see the module's step 1."""
    commands = [f"addr flush dev {sandbox_if}",
                f"link add {BRIDGE} type bridge",
                f"link set {sandbox_if} master {BRIDGE}",
                f"tuntap add {TAP} mode tap",
                f"link set {TAP} master {BRIDGE}",
                f"link set {TAP} up", f"link set {BRIDGE} up"]
    done = subprocess.run(["ip", "-batch", "-"], input="\n".join(commands) + "\n",
                          capture_output=True, text=True, timeout=20, check=False)
    if done.returncode != 0:
        raise SandboxError(f"cannot wire the sandbox's namespace for a VM: "
                           f"{done.stderr.strip()}")


def _spec(order: Order) -> vm.Spec:
    """The VM's, with the namespace wired (step 1). Raises SandboxError."""
    found = image.find()
    if found is None:
        raise SandboxError("no microVM image: run scripts/microvm-image")
    accel, why = vm.accelerator()
    if accel is None:
        raise SandboxError(why)
    wire(order.sandbox_if)
    return vm.Spec(found, accel, order.uid, order.gid, tap=TAP,
                   workspace=Path(order.workspace) if order.workspace else None,
                   memory_mib=order.memory_mib,
                   disk=Path(order.disk) if order.disk else None,
                   incoming=Path(order.restore) if order.restore else None)


def resume(order: Order) -> Booted:
    """A copy of the saved VM `order.restore` on this slot's link: resumed, then made its own
    (`Channel.renew`: this slot's address and staged files, fresh randomness, the clock) before
    anything else reaches it. The staged files renewed are those the image's root shows (not
    the agent's own, the same for every slot). Raises SandboxError."""
    machine = vm.Machine(_spec(order))
    try:
        machine.monitor.resumed(_BOOT_SECONDS)
        channel = Channel(machine.sock)
        channel.renew(order.address, order.gateway,
                      {path: text.encode("latin-1") for path, text in order.files.items()
                       if not path.startswith(("/proc/", "/run/"))})
    except SandboxError as exc:
        raise SandboxError(f"the microVM did not resume: {exc}: {machine.failure()}") from None
    except BaseException:
        machine.kill()
        raise
    return Booted(machine, channel)


def start(order: Order) -> Booted:
    """Steps 1 to 3: the namespace wired, the VM booted on it and given its address and the
    staged files; the caller kills it (`Booted.close`). Raises SandboxError."""
    spec = _spec(order)
    try:
        booted = pool.boot(spec, _BOOT_SECONDS)
    except SandboxError as exc:
        raise SandboxError(f"the microVM did not start: {exc}") from None
    try:
        booted.channel.network(order.address, order.gateway)
        for path, text in order.files.items():
            if not path.startswith("/proc/"):  # the guest's /proc is its own kernel's
                booted.channel.put(path, text.encode("latin-1"))
        if order.disk:
            # A workspace of the guest's own is its commands' (the User's, else the guest's
            # root, as the image's root is); the host's share is the slot's uid's.
            owned = order.workspace_bytes is not None or order.user is not None
            booted.channel.root(order.root_dirs or {},
                                [p for p in order.files if not p.startswith("/proc/")],
                                order.image_ids() if owned else (order.uid, order.gid),
                                order.workspace_bytes, order.home if order.user else None)
        booted.channel.seal()  # here, at set-up, rather than at the first command
    except BaseException:
        booted.close()
        raise
    return booted


def run(order: Order) -> int:
    booted = start(order)
    uid, gid = order.image_ids() if order.disk else (order.uid, order.gid)
    try:
        ended = booted.channel.stream(order.command, order.env, uid=uid, gid=gid,
                                      cwd=order.cwd, timeout=order.timeout, pids=order.pids,
                                      stdin_fd=0, in_root=order.disk is not None)
    finally:
        booted.close()
    if ended.timed_out and order.timeout is not None:
        print(over_time(order.timeout), file=sys.stderr)
    return ended.code


def main() -> int:
    started = time.monotonic()
    try:
        fd = int(sys.argv[1])
        with os.fdopen(fd, "rb") as fh:
            order = Order.from_json(fh.read())
        code = run(order)
    except (SandboxError, OSError, ValueError, IndexError, TypeError) as exc:
        print(f"sealgate: the microVM run failed after {time.monotonic() - started:.1f} s: "
              f"{exc}", file=sys.stderr)
        return SETUP_FAILED
    return code


if __name__ == "__main__":
    sys.exit(main())
