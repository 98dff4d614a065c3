"""What a run killed outright cannot do itself: kill its sandbox.

A parent-death signal takes the runtime's own child with it, but not reliably what that child
starts in turn: bubblewrap arms its sandbox's signal only at the end of the sandbox's set-up,
so a runtime killed in between (a harness's SIGKILL, the OOM killer) left the sandbox running,
orphaned and past its time limit, until the next run cleaned up (seen here: `sleep 60` under
pid 1). Everything of a run is in its cgroups from its first process on, so a watchdog outside
them empties them: it waits on a pipe only the runtime holds, and at its end of file (however
the runtime ended, unless it was told first that the run's own teardown is under way) kills
their members until none is left. It has a session of its own and ignores the terminal's
signals, so a Ctrl-C or a kill of the caller's process group does not take it first.

The pipe's end is a descriptor like any other: sandboxd hands it to the daemon that takes its
sandboxes over (`sandbox.daemon.handover`), and the watchdog then ends with that one's death,
not with its own parent's (`Watchdog.held`), which parent-death signals cannot do.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .cgroup import PARENT
from .launch import tool

# A paused sandbox's groups thawed first: cgroup v1's frozen processes do not die until then.
# Up to 100 rounds, 20 ms apart while there was something to kill (the pids limit bounds
# what a round must kill); over once the groups read empty twice running, for a fork that was
# under way as its parent was killed.
_SCRIPT = """trap '' INT TERM HUP
read -r done && exit 0
for d do [ -f "$d/freezer.state" ] && echo THAWED > "$d/freezer.state"; done
empty=0 n=0
while [ $n -lt 100 ] && [ $empty -lt 2 ]; do
  n=$((n + 1)) empty=$((empty + 1))
  for d do
    for p in $(cat "$d/cgroup.procs" 2>/dev/null); do empty=0; kill -9 "$p" 2>/dev/null; done
  done
  [ $empty -gt 0 ] || sleep 0.02
done
"""


class Watchdog:
    _proc: subprocess.Popen[bytes] | None

    def __init__(self, groups: Sequence[Path]) -> None:
        # It kills whatever the groups hold: never anything but a run's own groups, below
        # sealgate's parent (handed the host's root group, it would kill every process).
        if not groups or any(g.parent.name != PARENT or not g.name.startswith("run-")
                             for g in groups):
            raise ValueError(f"not a run's cgroups: {[str(g) for g in groups]}")
        self._proc = subprocess.Popen(
            [tool("sh"), "-c", _SCRIPT, "sh", *(str(g) for g in groups)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        assert self._proc.stdin is not None
        self.pipe = self._proc.stdin.fileno()  # its end: while it is open anywhere, no kill

    @classmethod
    def held(cls, pipe: int) -> Watchdog:
        """The watchdog whose pipe end `pipe` is, started by another process (a daemon that
        handed its sandboxes over): never our child, so never waited for."""
        made = cls.__new__(cls)
        made._proc, made.pipe = None, pipe
        return made

    def stop(self) -> None:
        """The run's own teardown is under way: the watchdog has nothing left to do."""
        with contextlib.suppress(OSError):
            os.write(self.pipe, b"done\n")
        self.close()
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5)

    def close(self) -> None:
        """Our end closed: the watchdog kills the groups unless another holder's end is still
        open (a successor's), or it was stopped."""
        if self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()  # the file object owns the descriptor
        elif self.pipe >= 0:
            os.close(self.pipe)
        self.pipe = -1
