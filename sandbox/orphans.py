"""The daemon reaps what its sandboxes leave when they end on their own.

When a sandbox's agent exits (killed from inside, or crashed), bubblewrap's monitor exits as
soon as its init reports the agent's status, while that init is still taking down the rest of
the PID namespace; the init is then orphaned. Its new parent would be the host's pid 1, which
in a container or a microVM is often an init that reaps late or never: a zombie per such
sandbox. So the daemon is a child subreaper (orphans of its descendants come to it) and reaps
them, but only those running as a sandbox uid: a zombie of root's may be a `subprocess.run`
of ours (ip, nft) about to be waited for, whose status must not be taken from it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap(uids: range) -> int:
    """Reap the zombies of a sandbox uid whose parent we are; how many. (Every process is
    looked at: a thread's `children` file does not always list an orphan given to the
    process, so it cannot be trusted to find them.)"""
    reaped = 0
    me = os.getpid()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and _sandbox_zombie(proc, me, uids):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(int(proc.name), os.WNOHANG)[0] != 0:
                    reaped += 1
    return reaped


def _sandbox_zombie(proc: Path, parent: int, uids: range) -> bool:
    try:
        fields = dict(line.split(":", 1) for line in
                      (proc / "status").read_text().splitlines() if ":" in line)
        return (fields["State"].split()[0] == "Z" and int(fields["PPid"]) == parent
                and int(fields["Uid"].split()[0]) in uids)
    except (OSError, KeyError, IndexError, ValueError):
        return False
