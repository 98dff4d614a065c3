"""Resource limits for a sandbox, against fork bombs, memory exhaustion and miners: a cgroup per
run with a cap on processes, memory (swap included) and CPU time.

cgroup v2 (one tree, `/sys/fs/cgroup/sealgate/<run>`) where the host has it, as Debian 12 does by
default; on hybrid hosts whose controllers are still mounted as v1 hierarchies, one group per
controller (`/sys/fs/cgroup/<controller>/sealgate/<run>`). The process joins its groups before
it executes anything, so nothing it starts is ever outside them; at the end every process left
in them is killed and the groups are removed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import SandboxError

ROOT = Path("/sys/fs/cgroup")
PARENT = "sealgate"
_PERIOD_US = 100_000


class CgroupError(SandboxError):
    """The limits could not be put in place; the sandbox must not start without them."""



@dataclass(frozen=True)
class Limits:
    pids: int = 1024
    memory: int = 4 << 30  # bytes, swap included
    cpus: float | None = 1.0  # cores of CPU time; None: no quota

    def __post_init__(self) -> None:
        if self.pids < 8:
            raise CgroupError("--pids must be at least 8 (the sandbox's own helpers need some)")
        if self.memory < 16 << 20:
            raise CgroupError("--memory must be at least 16M")
        if self.cpus is not None and not 0.01 <= self.cpus <= 1024:
            raise CgroupError("--cpus must be between 0.01 and 1024")


def parse_size(text: str) -> int:
    """`512M`, `2G`, `1048576`: bytes."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    number, unit = text[:-1], units.get(text[-1:].lower())
    if unit is None:
        number, unit = text, 1
    if not number.isdigit():
        raise CgroupError(f"not a size: {text[:32]!r} (write 512M, 2G or a byte count)")
    return int(number) * unit


class Group:
    """The run's groups: created with their limits, joined by the sandbox's first process."""

    def __init__(self, dirs: list[Path]) -> None:
        self.dirs = dirs

    @classmethod
    def create(cls, name: str, limits: Limits) -> Group:
        """New groups with the limits; nothing left behind if that fails."""
        group = cls([])
        try:
            if (ROOT / "cgroup.controllers").exists():
                group._v2(name, limits)
            else:
                group._v1(name, limits)
        except OSError as exc:
            group.remove()
            raise CgroupError(f"cannot set resource limits: {exc}") from None
        except CgroupError:
            group.remove()
            raise
        return group

    def _v2(self, name: str, limits: Limits) -> None:
        parent = ROOT / PARENT
        parent.mkdir(exist_ok=True)
        available = (ROOT / "cgroup.controllers").read_text().split()
        missing = {"pids", "memory", "cpu"} - set(available)
        if missing:
            raise CgroupError(f"cgroup v2 lacks controllers: {', '.join(sorted(missing))}")
        for level in (ROOT, parent):
            (level / "cgroup.subtree_control").write_text("+pids +memory +cpu")
        group = parent / name
        group.mkdir()
        self.dirs.append(group)
        self.apply(limits)

    def _v1(self, name: str, limits: Limits) -> None:
        for controller in ("pids", "memory", "cpu"):
            if not (ROOT / controller).is_dir():
                raise CgroupError(f"no cgroup v1 {controller} hierarchy at {ROOT / controller}")
            group = ROOT / controller / PARENT / name
            group.mkdir(parents=True)
            self.dirs.append(group)
        if (ROOT / "freezer").is_dir():  # for pause and resume (`freeze`), where there is one
            group = ROOT / "freezer" / PARENT / name
            group.mkdir(parents=True)
            self.dirs.append(group)
        self.apply(limits)

    def apply(self, limits: Limits) -> None:
        """Set the limits on groups that exist (a warm sandbox gets its caller's at create).
        Raises OSError."""
        quota = "max" if limits.cpus is None else str(int(limits.cpus * _PERIOD_US))
        values = {
            "pids.max": str(limits.pids),
            "memory.max": str(limits.memory), "memory.swap.max": "0",  # v2
            "cpu.max": f"{quota} {_PERIOD_US}",
            "memory.limit_in_bytes": str(limits.memory),  # v1
            # v1 with swap accounting: swap counts against the limit too
            "memory.memsw.limit_in_bytes": str(limits.memory),
            "cpu.cfs_period_us": str(_PERIOD_US),
            "cpu.cfs_quota_us": "-1" if limits.cpus is None else quota,
        }
        for group in self.dirs:
            for file, value in values.items():
                if (group / file).exists():
                    (group / file).write_text(value)

    def freeze(self, frozen: bool, seconds: float = 2.0) -> None:
        """Freeze (or thaw) every process of the groups, and wait until the kernel says they
        are: a frozen process runs nothing and is charged no CPU. cgroup v2's freezer, or v1's
        freezer hierarchy. Raises CgroupError."""
        states = []  # (the file, what to write, what it reads when done)
        for group in self.dirs:
            if (group / "cgroup.freeze").exists():
                states.append((group / "cgroup.freeze", "1" if frozen else "0",
                               group / "cgroup.events", f"frozen {int(frozen)}"))
            elif (group / "freezer.state").exists():
                word = "FROZEN" if frozen else "THAWED"
                states.append((group / "freezer.state", word, group / "freezer.state", word))
        if not states:
            raise CgroupError("pausing needs a cgroup freezer (v2, or v1's freezer hierarchy)")
        for control, value, _, _ in states:
            control.write_text(value)
        deadline = time.monotonic() + seconds
        while any(done not in report.read_text() for _, _, report, done in states):
            if time.monotonic() > deadline:
                raise CgroupError(f"the sandbox did not {'freeze' if frozen else 'thaw'} "
                                  f"within {seconds:g} s")
            time.sleep(0.001)

    def limit_hits(self) -> dict[str, int]:
        """How often the kernel held the groups to their limits: processes it killed for
        memory (`oom_kill` of v2's memory.events or v1's memory.oom_control) and forks it
        refused at the process limit (`max` of pids.events). A file that is missing or gone
        counts 0: the figures are for an operator's dashboard, not a decision."""
        hits = {"memory": 0, "pids": 0}
        for group in self.dirs:
            for file, word, limit in (("memory.events", "oom_kill", "memory"),
                                      ("memory.oom_control", "oom_kill", "memory"),
                                      ("pids.events", "max", "pids")):
                try:
                    text = (group / file).read_text()
                except OSError:
                    continue
                for line in text.splitlines():
                    name, _, value = line.partition(" ")
                    if name == word and value.isdigit():
                        hits[limit] += int(value)
        return hits

    @classmethod
    def left_by(cls, name: str) -> Group:
        """The groups a run of that name created, to remove after it died without doing so."""
        try:
            controllers = list(ROOT.iterdir())  # v1: one hierarchy each
        except OSError:
            controllers = []
        places = [ROOT / PARENT / name, *(c / PARENT / name for c in controllers)]
        return cls([d for d in places if d.is_dir()])

    def _members(self) -> Iterator[int]:
        for group in self.dirs:
            try:
                text = (group / "cgroup.procs").read_text()
            except OSError:
                continue
            yield from (int(p) for p in text.split())

    def kill(self, seconds: float = 1.0) -> None:
        """Kill whatever is in the groups until they are empty, looking again at once and then
        less and less often: a sandbox killed a moment ago is usually gone within a millisecond
        or two. What will not die within `seconds` is left for `remove` to report by failing."""
        for group in self.dirs:  # v1's frozen processes do not die until thawed
            if (group / "freezer.state").exists():
                with contextlib.suppress(OSError):
                    (group / "freezer.state").write_text("THAWED")
        deadline = time.monotonic() + seconds
        pause = 0.0005
        while (members := set(self._members())) and time.monotonic() < deadline:
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(pause)
            pause = min(pause * 2, 0.02)

    def remove(self, seconds: float = 2.0) -> None:
        """Kill whatever is left in the groups, then remove them: again for a while if a v1
        hierarchy refuses (EBUSY) while a killed member is a zombie not yet reaped, though the
        group looks empty. A group that stays is left for the operator to see."""
        self.kill()
        deadline = time.monotonic() + seconds
        pause = 0.001
        while True:
            for group in reversed(self.dirs):
                with contextlib.suppress(OSError):
                    group.rmdir()
            if not any(d.is_dir() for d in self.dirs) or time.monotonic() >= deadline:
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
