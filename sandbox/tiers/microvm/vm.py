"""One microVM: QEMU's `microvm` machine, its command line, its start and its end.

- The machine has no firmware, no PCI, no legacy devices but what the kernel's clock needs, and
  only virtio over MMIO: a console port for the agent (`channel`), for a host-root sandbox the
  host's /usr shared read-only over 9p (`-fsdev ... readonly=on`), a random source, and, when
  it has a network, one virtio-net device on a tap. The kernel boots through its PVH entry
  from the uncompressed image (`image`): no decompression inside the guest, the largest cost
  of a boot here.
- A sandbox from an image (`Spec.disk`) also gets the image as a read-only virtio-blk disk
  (erofs, `sandbox.images.disk`), QEMU's side read-only too (`readonly=on`): the guest makes
  its root of it (`guest/vmroot.py`), and its agent runs on the initramfs's own Python
  (`image`'s standalone initramfs, `runtime`): such a guest sees nothing of the host's /usr.
- The agent's port is one end of a socket pair handed to QEMU as a descriptor, so no path of
  the host's is involved and nothing else can connect to it; so is QEMU's monitor (`qmp`),
  through which a VM from an image is saved and a copy of it resumed (`Spec.incoming`).
- QEMU never runs as root: `setpriv` starts it as the run's uid and gid with no other group
  (but /dev/kvm's, under KVM: `kvm_group`), no capability in any set and no_new_privs, and it
  dies with its starter (a parent-death signal that holds, being set after the uid changes,
  and checked for a starter dead before it was set: `parentdeath`).
  What that uid cannot open is handed to it as descriptors by the root starter: the image's
  kernel and initramfs (read through `/dev/fd/N`, so the root-only var/ on their path is never
  walked), an image's disk (through a descriptor set, `-add-fd`: QEMU duplicates the
  descriptor, never opens a path, and the store's directory is root's only) and the tap
  (opened and attached here, as root). It runs under its own seccomp
  filter (`-sandbox on` with everything optional denied: obsolete calls, privilege changes,
  spawning, resource changes). A 9p share of the workspace then writes as that uid, like the
  other tiers' workloads.
- Nothing secret is on its command line (which `ps` shows): the kernel's command line holds
  only fixed boot options; the sandbox's address and files come over the agent's channel.
- It is also in its starter's cgroups, which the runtime empties at the end of a run.

The accelerator: KVM where the host's KVM runs an ordinary kernel; where KVM is PVM (a nested
hypervisor that runs only kernels built as PVM guests, Debian's are not), or missing, the tier
is unavailable unless emulation (TCG) is allowed (`SEALGATE_MICROVM_ACCEL=tcg`): the guest
still has its own kernel, but every instruction is translated, several times slower.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ...errors import SandboxError
from ...host import parentdeath
from .image import Image
from .qmp import Monitor

QEMU = "qemu-system-x86_64"
ACCEL_ENV = "SEALGATE_MICROVM_ACCEL"
MEMORY_MIB = 512
_TUNSETIFF = 0x400454CA
_IFF_TAP, _IFF_NO_PI, _IFF_VNET_HDR = 0x0002, 0x1000, 0x4000
_BOOT = ("console=hvc0 quiet panic=-1 ipv6.disable=1 rdinit=/init random.trust_cpu=on "
         "i8042.noaux i8042.nokbd i8042.nopnp cryptomgr.notests audit=0")


@dataclass(frozen=True)
class Spec:
    image: Image
    accel: str  # "kvm" or "tcg"
    uid: int
    gid: int
    tap: str | None = None  # the tap device the guest's eth0 is on, None for no network
    mac: str = "52:54:00:12:34:56"
    workspace: Path | None = None  # shared read-write as /workspace
    memory_mib: int = MEMORY_MIB
    console: Path | None = None  # where the guest's console goes (debugging); else nowhere
    disk: Path | None = None  # an image's erofs disk, read-only (`sandbox.images.disk`)
    # A saved VM's state to resume (`qmp`) instead of a boot: the same machine, devices and
    # memory as the saved one's, an image's (no 9p share), on its own tap.
    incoming: Path | None = None


def accelerator() -> tuple[str | None, str]:
    """The accelerator to use and why: ("kvm", ...), ("tcg", ...) or (None, why neither)."""
    wanted = os.environ.get(ACCEL_ENV, "kvm")
    if wanted not in ("kvm", "tcg"):
        return None, f"{ACCEL_ENV}={wanted[:16]!r}: use kvm or tcg"
    problem = kvm_problem()
    if problem is None:
        return "kvm", "KVM"
    if wanted == "tcg":
        return "tcg", f"TCG emulation ({problem})"
    return None, f"{problem}; {ACCEL_ENV}=tcg runs the guest under emulation instead (slower)"


def kvm_problem() -> str | None:
    """Why KVM cannot run the guest's (Debian's) kernel here, or None."""
    try:
        fd = os.open("/dev/kvm", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return f"/dev/kvm cannot be opened: {exc.strerror}"
    os.close(fd)
    modules = Path("/sys/module")
    if (modules / "kvm_pvm").exists() and not any(
            (modules / m).exists() for m in ("kvm_intel", "kvm_amd")):
        return ("KVM here is PVM (nested, without VMX/SVM), which runs only kernels built as "
                "PVM guests; Debian's kernel is not one")
    if kvm_group() is None:
        return ("/dev/kvm is root's only, and QEMU runs as the sandbox's uid: give it a group "
                "of its own (chgrp kvm /dev/kvm && chmod 660 /dev/kvm, as Debian's udev rule does)")
    return None


def kvm_group() -> int | None:
    """The group through which an unprivileged QEMU may use /dev/kvm (Debian's `kvm`, mode
    0660), or None."""
    try:
        st = os.stat("/dev/kvm")
    except OSError:
        return None
    return st.st_gid if st.st_gid != 0 and st.st_mode & 0o060 == 0o060 else None


def qemu() -> str | None:
    return shutil.which(QEMU, path="/usr/bin:/usr/sbin:/bin:/sbin")


@dataclass(frozen=True)
class Handed:
    """The descriptors QEMU is started with, by what they are."""

    agent: int
    monitor: int
    kernel: int
    initrd: int
    tap: int | None
    disk: int | None = None
    incoming: int | None = None

    def all(self) -> tuple[int, ...]:
        return (self.agent, self.monitor, self.kernel, self.initrd,
                *(fd for fd in (self.tap, self.disk, self.incoming) if fd is not None))


def command(spec: Spec, fds: Handed) -> list[str]:
    program = qemu()
    if program is None:
        raise SandboxError(f"{QEMU} is not installed (Debian package qemu-system-x86)")
    # The RTC is the guest's only wall clock (read once at boot): certificates need the date.
    machine = "microvm,x-option-roms=off,isa-serial=off,rtc=on"
    boot = _BOOT
    if spec.accel == "kvm":
        machine += ",pit=off,pic=off"
        cpu, accel = "host", "kvm"
    else:
        # TCG gives the kernel nothing to calibrate its clock against but the PIT, which its
        # calibration here does not get through: it is told the TSC's rate (TCG's TSC runs at
        # the host's). The guest's own speculation mitigations only cost under emulation:
        # the guest is one sandbox's, with nothing of another's to protect inside it.
        # Without AVX (which TCG emulates slowly, and glibc's string functions pick when
        # offered) and 5-level paging (a longer walk for every emulated TLB miss): a boot
        # measured ~2.2 s instead of ~3 s, CPU-bound code ~10 % faster.
        cpu, accel = "max,-avx,-avx2,-avx512f,-la57", "tcg"
        boot += f" tsc_early_khz={_host_tsc_khz()} mitigations=off"
    # Its one supplementary group, under KVM: the one that may open /dev/kvm.
    group = kvm_group() if spec.accel == "kvm" else None
    groups = [f"--groups={group}"] if group is not None else ["--clear-groups"]
    argv = [
        *parentdeath.armed(f"--reuid={spec.uid}", f"--regid={spec.gid}", *groups,
                           "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs"),
        program, "-M", machine, "-accel", accel, "-cpu", cpu,
        "-m", str(spec.memory_mib), "-smp", "1", "-nodefaults", "-no-user-config",
        "-nographic", "-no-reboot",
        "-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
        "-kernel", f"/dev/fd/{fds.kernel}", "-initrd", f"/dev/fd/{fds.initrd}", "-append", boot,
        "-device", "virtio-serial-device",
        "-chardev", f"socket,id=agent,fd={fds.agent}",
        "-device", "virtserialport,chardev=agent,name=sealgate.agent",
        "-chardev", f"socket,id=qmp,fd={fds.monitor}", "-mon", "chardev=qmp,mode=control",
        "-chardev", (f"file,id=con,path={spec.console}" if spec.console else "null,id=con"),
        "-device", "virtconsole,chardev=con",
        "-object", "rng-random,id=rng,filename=/dev/urandom",
        "-device", "virtio-rng-device,rng=rng",
    ]
    if spec.disk is None:  # a host-root sandbox's commands run on the host's /usr
        argv += ["-fsdev", "local,id=usr,path=/usr,readonly=on,security_model=none",
                 "-device", "virtio-9p-device,fsdev=usr,mount_tag=usr"]
    if spec.workspace is not None:
        argv += ["-fsdev", f"local,id=ws,path={spec.workspace},security_model=none",
                 "-device", "virtio-9p-device,fsdev=ws,mount_tag=workspace"]
    if fds.disk is not None:
        # QEMU takes the descriptor from the set (opened read-only, as the drive is).
        argv += ["-add-fd", f"fd={fds.disk},set=1",
                 "-drive", "if=none,id=image,format=raw,readonly=on,file=/dev/fdset/1",
                 "-device", "virtio-blk-device,drive=image"]
    if fds.tap is not None:
        argv += ["-netdev", f"tap,id=net,fd={fds.tap}",
                 "-device", f"virtio-net-device,netdev=net,mac={spec.mac}"]
    if fds.incoming is not None:
        argv += ["-incoming", f"fd:{fds.incoming}"]
    return argv


def open_tap(name: str) -> int:
    """A descriptor of tap device `name` (made beforehand, in this namespace), with the
    virtio-net header QEMU's tap backend expects."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(),
                                                _IFF_TAP | _IFF_NO_PI | _IFF_VNET_HDR))
    except OSError:
        os.close(fd)
        raise
    return fd


def _host_tsc_khz() -> int:
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("cpu MHz"):
                return int(float(line.split(":")[1]) * 1000)
    raise SandboxError("cannot tell the host's TSC rate from /proc/cpuinfo")


class Machine:
    """A started QEMU and the host's end of its agent channel."""

    def __init__(self, spec: Spec) -> None:
        host_end, guest_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        monitor, qemu_monitor = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        opened: list[int] = []
        try:
            for path in (spec.image.kernel, spec.image.initramfs(spec.disk is None)):
                opened.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
            tap = disk = None
            if spec.tap is not None:
                tap = open_tap(spec.tap)
                opened.append(tap)
            if spec.disk is not None:
                disk = os.open(spec.disk, os.O_RDONLY | os.O_CLOEXEC)
                opened.append(disk)
            incoming = None
            if spec.incoming is not None:
                incoming = os.open(spec.incoming, os.O_RDONLY | os.O_CLOEXEC)
                opened.append(incoming)
            fds = Handed(guest_end.fileno(), qemu_monitor.fileno(), opened[0], opened[1], tap,
                         disk, incoming)
            self.proc = subprocess.Popen(command(spec, fds), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         pass_fds=fds.all())
        except OSError as exc:
            host_end.close()
            monitor.close()
            raise SandboxError(f"cannot start {QEMU}: {exc}") from None
        finally:
            guest_end.close()
            qemu_monitor.close()
            for fd in opened:
                os.close(fd)
        self.sock = host_end
        self.monitor = Monitor(monitor)

    def failure(self) -> str:
        """What QEMU said, ending it first if it still runs."""
        said = self.kill()
        return f"{QEMU} exited with {self.proc.returncode}: {said[-600:] or 'nothing said'}"

    def kill(self) -> str:
        """End the VM (at once: nothing in it is kept); what QEMU said on stderr."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.sock.close()
        self.monitor.sock.close()
        said = ""
        if self.proc.stderr is not None and not self.proc.stderr.closed:
            said = self.proc.stderr.read().decode(errors="replace").strip()
            self.proc.stderr.close()
        return said
