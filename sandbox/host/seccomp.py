"""The seccomp filter every sandboxed process runs under, as the classic-BPF program bubblewrap
installs with `--seccomp FD` just before it executes the command.

A deny list on top of namespaces and dropped capabilities, aimed at what those leave open:

- kernel attack surface a build or an agent never needs (io_uring, bpf, perf_event_open,
  userfaultfd, keyrings, module and kexec loading);
- ways around other filters or into other processes: io_uring performs socket and file
  operations without the syscalls a filter sees; ptrace, process_vm_*, pidfd_getfd,
  process_madvise and kcmp reach into processes of the same user; open_by_handle_at opens
  files by handle past mount restrictions;
- system calls newer than this list (ENOSYS, as if the kernel did not have them);
- new namespaces and mounts (a user namespace gives back capabilities inside it);
- TIOCSTI and TIOCLINUX, which push keystrokes into the terminal the sandbox was started from;
- socket families other than UNIX, IPv4 and IPv6 (netlink, packet, vsock, alg, ...);
- socket options that need CAP_NET_ADMIN on Linux (a packet mark, transparent proxying, buffers
  past the system's bounds): refused by the host's kernel anyway under bubblewrap, refused here
  so that a kernel that would grant them (gVisor's Sentry, for one) never sees them: a mark
  could meet a host rule that trusts marks.

Only the native x86_64 ABI may make system calls: an i386 or x32 call (other numbers, which a
per-number filter would misread) kills the process. Other architectures are refused when the
filter is built, so a sandbox never starts without it.
"""

from __future__ import annotations

import errno
import platform
import struct
from typing import Final

from ..errors import SandboxError

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24
# BPF opcodes (linux/filter.h, linux/bpf_common.h)
_LD_W_ABS: Final = 0x20
_JEQ_K: Final = 0x15
_JGE_K: Final = 0x35
_JSET_K: Final = 0x45
_RET_K: Final = 0x06
# linux/seccomp.h, linux/audit.h
_KILL_PROCESS: Final = 0x80000000
_ALLOW: Final = 0x7FFF0000
_ERRNO: Final = 0x00050000
_AUDIT_ARCH_X86_64: Final = 0xC000003E
_X32_BIT: Final = 0x40000000

_X86_64_DENIED: Final = {
    # kernel surface
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
    "add_key": 248, "request_key": 249, "keyctl": 250,
    "init_module": 175, "finit_module": 313, "delete_module": 176,
    "kexec_load": 246, "kexec_file_load": 320,
    "reboot": 169, "swapon": 167, "swapoff": 168, "acct": 163, "quotactl": 179,
    # other processes, files by handle
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
    "pidfd_getfd": 438, "process_madvise": 440,
    "name_to_handle_at": 303, "open_by_handle_at": 304,
    # namespaces and mounts
    "unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "pivot_root": 155,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
    "fspick": 433, "mount_setattr": 442,
}
_CLONE, _CLONE3, _SOCKET, _IOCTL, _SETSOCKOPT = 56, 435, 41, 16, 54
# Calls newer than the kernels this list was written against (6.17 ends at 469) are not
# implemented as far as the sandbox knows: a deny list must not let tomorrow's through.
_FIRST_UNKNOWN = 470
# Every namespace flag of clone(2): only threads and plain forks.
_CLONE_NEW = 0x10000000 | 0x20000000 | 0x40000000 | 0x08000000 | 0x04000000 | 0x00020000 \
    | 0x02000000 | 0x00000080
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
_FAMILIES = (1, 2, 10)  # AF_UNIX, AF_INET, AF_INET6
# level -> option names refused: SOL_SOCKET's SO_SNDBUFFORCE, SO_RCVBUFFORCE, SO_MARK; SOL_IP's
# IP_TRANSPARENT; SOL_IPV6's IPV6_TRANSPARENT.
REFUSED_OPTIONS: Final = {1: (32, 33, 36), 0: (19,), 41: (75,)}
_ARG2: Final = 32

Instruction = tuple[int, int, int, int]  # code, jt, jf, k


class SeccompUnsupported(SandboxError):
    """No filter for this machine's architecture: the sandbox must not start."""



def program(machine: str | None = None) -> bytes:
    """The filter as bytes of `struct sock_filter`, what `bwrap --seccomp FD` reads."""
    arch = machine or platform.machine()
    if arch != "x86_64":
        raise SeccompUnsupported(f"no seccomp filter for {arch}; only x86_64 is supported")
    return b"".join(struct.pack("<HBBI", *i) for i in _x86_64())


def _x86_64() -> list[Instruction]:
    deny = _ret(_ERRNO | errno.EPERM)
    body: list[list[Instruction]] = [
        [_ld(_ARCH), (_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64), _ret(_KILL_PROCESS)],
        [_ld(_NR), (_JGE_K, 0, 1, _X32_BIT), _ret(_KILL_PROCESS)],
        [(_JGE_K, 0, 1, _FIRST_UNKNOWN), _ret(_ERRNO | errno.ENOSYS)],
    ]
    for nr in sorted(_X86_64_DENIED.values()):
        body.append([(_JEQ_K, 0, 1, nr), deny])
    # clone3 passes its flags in memory a filter cannot read: ENOSYS makes libc use clone.
    body.append([(_JEQ_K, 0, 1, _CLONE3), _ret(_ERRNO | errno.ENOSYS)])
    # The blocks below load an argument: each ends in its own verdict, never falls through.
    body.append([(_JEQ_K, 0, 4, _CLONE), _ld(_ARG0), (_JSET_K, 0, 1, _CLONE_NEW), deny,
                 _ret(_ALLOW)])
    families = [(_JEQ_K, len(_FAMILIES) - i, 0, f) for i, f in enumerate(_FAMILIES)]
    body.append([(_JEQ_K, 0, len(families) + 3, _SOCKET), _ld(_ARG0), *families,
                 _ret(_ERRNO | errno.EAFNOSUPPORT), _ret(_ALLOW)])
    body.append(_setsockopt(deny))
    body.append([(_JEQ_K, 0, 5, _IOCTL), _ld(_ARG1),
                 (_JEQ_K, 1, 0, _TIOCSTI), (_JEQ_K, 0, 1, _TIOCLINUX), deny, _ret(_ALLOW)])
    body.append([_ret(_ALLOW)])
    return [instruction for block in body for instruction in block]


def _setsockopt(deny: Instruction) -> list[Instruction]:
    """setsockopt(fd, level, name, ...): the refused options denied, every other allowed."""
    levels: list[Instruction] = []
    for level, names in REFUSED_OPTIONS.items():
        test = [_ld(_ARG2), *((_JEQ_K, len(names) - i, 0, name) for i, name in enumerate(names)),
                _ret(_ALLOW), deny]
        levels += [(_JEQ_K, 0, len(test), level), *test]
    levels.append(_ret(_ALLOW))
    return [(_JEQ_K, 0, len(levels) + 1, _SETSOCKOPT), _ld(_ARG1), *levels]


def _ld(offset: int) -> Instruction:
    return (_LD_W_ABS, 0, 0, offset)


def _ret(value: int) -> Instruction:
    return (_RET_K, 0, 0, value)
