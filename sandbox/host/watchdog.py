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
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Sequence
from pathlib import Path

from .cgroup import PARENT
from .launch import tool

# Up to 100 rounds, 20 ms apart while there was something to kill (the pids limit bounds
# what a round must kill); over once the groups read empty twice running, for a fork that was
# under way as its parent was killed.
_SCRIPT = """trap '' INT TERM HUP
read -r done && exit 0
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

    def stop(self) -> None:
        """The run's own teardown is under way: the watchdog has nothing left to do."""
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.write(b"done\n")
                self._proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(5)
