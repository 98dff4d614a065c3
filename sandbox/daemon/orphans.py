"""The daemon reaps what its sandboxes leave when they end on their own.

When a sandbox's agent exits (killed from inside, or crashed), bubblewrap's monitor exits as
soon as its init reports the agent's status, while that init is still taking down the rest of
the PID namespace; the init is then orphaned. Its new parent would be the host's pid 1, which
in a container or a microVM is often an init that reaps late or never: a zombie per such
sandbox. So the daemon is a child subreaper (orphans of its descendants come to it) and reaps
them: only each sandbox's init, known by its pid from the start, and only while that pid is
a zombie of a sandbox uid whose parent we are. Never a scan (a sandbox may fork thousands of
processes to make one slow), never bubblewrap's monitor (a Popen of ours that must keep its
status), never a root child (a `subprocess.run` of ours about to be waited for).
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


def init_of(bubblewrap: int) -> int | None:
    """The sandbox's init: bubblewrap's one child."""
    try:
        children = Path(f"/proc/{bubblewrap}/task/{bubblewrap}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if len(children) == 1 else None


def reap(pid: int, uids: range) -> bool:
    """Reap `pid` if it is our zombie of a sandbox uid (never anything else: a pid reused by
    one of our own root children must keep its status); True once it is gone either way."""
    proc = Path(f"/proc/{pid}")
    if not _sandbox_zombie(proc, os.getpid(), uids):
        return not proc.exists()
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    return not proc.exists()


def _sandbox_zombie(proc: Path, parent: int, uids: range) -> bool:
    try:
        fields = dict(line.split(":", 1) for line in
                      (proc / "status").read_text().splitlines() if ":" in line)
        return (fields["State"].split()[0] == "Z" and int(fields["PPid"]) == parent
                and int(fields["Uid"].split()[0]) in uids)
    except (OSError, KeyError, IndexError, ValueError):
        return False
