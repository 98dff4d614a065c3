"""What a run holds, written down while it holds it, so that a run that died without its
teardown (SIGKILL, the OOM killer) is cleaned up by the next one.

A lease names the link index, the process and its start time (a PID alone may have been
reused), and where the proxy's registration of the sandbox's address lives. Leases are taken
and checked under the links' lock (`sandbox.host.network.lock`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from .network import RUN_DIR, lease_path


@dataclass(frozen=True)
class Lease:
    index: int
    pid: int
    started: str  # the process's start time in clock ticks since boot
    state: str  # the proxy's state directory
    address: str  # the sandbox's address, registered with that proxy
    # Its cgroups' name, if not run-INDEX-PID: a daemon that took a predecessor's sandbox over
    # holds groups named for that one (`sandbox.daemon.handover`).
    group: str = ""

    def __post_init__(self) -> None:
        # A path's last part (`sandbox.host.cgroup.Group.left_by`): never "..", a "/", a NUL
        # or anything else a clean-up could be walked out of its cgroup parent by.
        if self.group and not _GROUP.fullmatch(self.group):
            raise ValueError(f"lease {self.index}: not a run's cgroup name: {self.group[:64]!r}")

    @property
    def groups(self) -> str:
        return self.group or f"run-{self.index}-{self.pid}"


_GROUP = re.compile(r"run-[0-9]{1,10}-[0-9]{1,10}")


def _start_time(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields resume after the last ')'.
    return raw[raw.rindex(b")") + 2 :].split()[19].decode()


def take(index: int, state: Path, address: str, group: str = "") -> None:
    pid = os.getpid()
    lease = Lease(index, pid, _start_time(pid) or "", str(state), address, group)
    path = lease_path(index)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(lease)))
    tmp.replace(path)


def saved(index: int) -> bytes | None:
    """Lease `index` as it is (None: none), to `restore` should a change of several fail."""
    try:
        return lease_path(index).read_bytes()
    except FileNotFoundError:
        return None


def restore(index: int, was: bytes | None) -> None:
    path = lease_path(index)
    if was is None:
        release(index)
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(was)
    tmp.replace(path)


def release(index: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        lease_path(index).unlink()


def stale() -> list[Lease]:
    """Leases whose process is gone (or is another process now); unreadable ones as well,
    with what could be read of them."""
    found = []
    for path in sorted(RUN_DIR.glob("lease-*.json")):
        try:
            # Fields a newer sealgate may add are not a reason to think its holder is dead.
            lease = parse(path.read_text())
        except (OSError, ValueError, TypeError, KeyError, RecursionError):
            index = path.stem.removeprefix("lease-")
            if index.isdigit():
                found.append(Lease(int(index), 0, "", "", ""))
            continue
        if _start_time(lease.pid) != lease.started:
            found.append(lease)
    return found


def parse(text: str) -> Lease:
    """A lease as written; ValueError, TypeError or KeyError (RecursionError for JSON nested
    past the parser's depth) for what is not one."""
    data = json.loads(text)
    return Lease(**{k: data[k] for k in Lease.__dataclass_fields__ if k != "group"},
                 group=str(data.get("group", "")))


def holder(index: int) -> int | None:
    """The pid holding lease `index`, if that process is alive (and the one that took it);
    None for no lease, an unreadable one, or a dead holder's."""
    try:
        data = json.loads(lease_path(index).read_text())
        pid, started = int(data["pid"]), str(data["started"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return pid if _start_time(pid) == started else None
