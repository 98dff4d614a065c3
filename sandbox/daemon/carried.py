"""What a daemon hands its successor of each slot and session (`sandbox.daemon.handover`): the
facts as JSON, the live parts as descriptors, and their rebuilding on the other side.

A slot's descriptors, in this order: the agent's channel, a pidfd of its first process, its
watchdog's pipe, its name server's socket. Each is checked for what it must be (a pidfd for the
process the record names, a UDP socket on the link's host address, ...) before anything is built
of it: a record that does not hold together is a refusal of the whole hand-over.

Times travel as CLOCK_MONOTONIC readings (`time.monotonic`): both daemons read the same clock
(one host and one boot, the socket being a unix one), which the wall clock, stepped by NTP, is
not. So a sandbox keeps exactly its time to live and its idle time across the hand-over.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import stat
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import tiers
from ..host import cgroup
from ..host.cgroup import Group, Limits
from ..host.dns import LoopDns
from ..host.network import link_at
from ..host.rootfs import ImageRoot
from ..host.watchdog import Watchdog
from ..images import Image, ImageError
from .session import Options, Session
from .slot import Slot, SlotConfig

FDS = 4  # per slot: channel, pidfd, watchdog pipe, name server
ENDED_KEPT = 4096  # ended ids a daemon remembers (`Daemon._ended`)
_ID = re.compile(r"sb-[0-9a-f]{16}")


class Held:
    """A slot's first process that a predecessor started: not our child (its parent is whoever
    adopts the predecessor's orphans once that one exits), so known by a pidfd, which never
    names another process after it ended, and never waited for (its status is its parent's)."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self._pidfd = pidfd

    def wait(self, timeout: float | None = None) -> int:
        if self._pidfd >= 0:
            # poll, not select: a daemon of many sandboxes holds descriptors past select's
            # 1024, and select refuses those (ValueError) rather than wait.
            ready = select.poll()
            ready.register(self._pidfd, select.POLLIN)
            if not ready.poll(None if timeout is None else max(0, round(timeout * 1000))):
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            self.close()
        return 0  # over; how it ended only its parent learns

    def kill(self) -> None:
        if self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def close(self) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1


def slot_record(made: Slot, pidfd: int, pool: str | None) -> tuple[dict[str, Any], list[int]]:
    """A slot as JSON and its descriptors (still ours: the caller closes them once handed).
    `pool`: the key of the pool it waits in (`Daemon._pools`), for a slot no sandbox has."""
    image = made.image
    return {
        "index": made.index, "uid": made.uid, "pid": made.process.pid, "init": made.init,
        "tier": made.tier.name, "groups": [str(d) for d in made.group.dirs],
        "environment": made.environment, "pool": pool,
        "image": None if image is None else {
            "key": image.key, "layers": [str(p) for p in image.layers], "env": list(image.env),
            "workdir": image.workdir, "disks": None if image.disks is None else str(image.disks),
            "user": None if image.user is None else list(image.user), "home": image.home},
    }, [made.channel.fileno(), pidfd, made.guard.pipe, made.names.fileno()]


def session_record(session: Session) -> dict[str, Any]:
    options, limits = session.options, session.options.limits
    return {
        "id": session.id, "created": session.created, "commands": session.commands,
        "started": session._started, "last_active": session.last_active,
        "paused": session.paused, "next_pid": session.processes._next,
        "base": None if session.base is None else session.base.to_json(),
        "options": {"sandbox": options.sandbox, "env": dict(options.env), "ttl": options.ttl,
                    "idle_timeout": options.idle_timeout, "isolation": options.isolation,
                    "image": options.image, "metadata": dict(options.metadata),
                    "limits": {"pids": limits.pids, "memory": limits.memory,
                               "cpus": limits.cpus}},
    }


def rebuild_slot(data: Mapping[str, Any], fds: list[int], config: SlotConfig
                 ) -> tuple[Slot, int]:
    """The slot a record and its descriptors describe, and the pidfd to watch it by (the
    descriptors are the slot's from here on). Raises ValueError saying what does not fit."""
    if len(fds) != FDS:
        raise ValueError(f"a slot comes with {FDS} descriptors, not {len(fds)}")
    if not isinstance(data, Mapping):
        raise ValueError("a slot's record is not a JSON object")
    index, uid, pid = _int(data, "index"), _int(data, "uid"), _int(data, "pid")
    if not 0 <= index < len(config.plan.links) or uid != config.uid_base + index:
        raise ValueError(f"slot {index}: not one of this daemon's links and uids")
    if data.get("tier") != config.isolation:
        raise ValueError(f"slot {index}: of the {str(data.get('tier'))[:32]} tier")
    link = link_at(config.plan, index)
    # Checked whole, not by their parts' names: "/sys/fs/cgroup/../../etc/sealgate/run-3-1"
    # is lexically under the root and named like a run's group.
    group = re.compile(rf"{re.escape(str(cgroup.ROOT))}(/[a-z0-9_,]{{1,64}})?/"
                       rf"{re.escape(cgroup.PARENT)}/run-{index}-[0-9]{{1,10}}")
    raw = _list(data, "groups")
    if not 0 < len(raw) <= 64 or not all(isinstance(g, str) and group.fullmatch(g)
                                         for g in raw):
        raise ValueError(f"slot {index}: not its cgroups: {[str(g)[:100] for g in raw][:4]}")
    groups = [Path(g) for g in raw]
    if len({g.name for g in groups}) != 1:
        raise ValueError(f"slot {index}: its cgroups are not one run's")
    env = data.get("environment")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ValueError(f"slot {index}: a malformed environment")
    root = _image_root(data.get("image"), index)
    init = data.get("init")
    channel_fd, pidfd, pipe, dns_fd = fds
    if _pidfd_of(pidfd) != pid:
        raise ValueError(f"slot {index}: its process descriptor is not pid {pid}'s")
    if not stat.S_ISFIFO(os.fstat(pipe).st_mode):
        raise ValueError(f"slot {index}: its watchdog's descriptor is not a pipe")
    if not all(stat.S_ISSOCK(os.fstat(fd).st_mode) for fd in (channel_fd, dns_fd)):
        raise ValueError(f"slot {index}: its channel or name server is not a socket")
    # Wrapped last, and let go of on a refusal: the caller closes the numbers once (a wrapped
    # one dropped would close its number itself, and the caller's close would be a second,
    # of whatever had that number by then).
    channel, dns = socket.socket(fileno=channel_fd), socket.socket(fileno=dns_fd)
    held = -1
    try:
        if (channel.family, channel.type) != (socket.AF_UNIX, socket.SOCK_SEQPACKET) \
                or (dns.family, dns.type) != (socket.AF_INET, socket.SOCK_DGRAM) \
                or dns.getsockname()[0] != str(link.host_ip):
            raise ValueError(f"slot {index}: its channel or name server is not what it must "
                             "be")
        channel.setblocking(False)
        dns.setblocking(False)
        held = os.dup(pidfd)
        made = Slot(link, LoopDns(link.host_ip, link.host_ip, dns), Group(groups), uid,
                    Held(pid, held), channel, {str(k): v for k, v in env.items()},
                    tiers.get(config.isolation), Watchdog.held(pipe), root,
                    init if isinstance(init, int) else None)
    except BaseException:
        channel.detach()
        dns.detach()
        if held >= 0:
            os.close(held)
        raise
    return made, pidfd


def ended(value: Any) -> dict[str, str]:
    """The ids of sandboxes that ended on the old daemon, and why (`Daemon._ended`): so a
    caller still learns why, and no new sandbox is ever given one. Raises ValueError."""
    if value is None:  # a predecessor of before they were handed over
        return {}
    if not isinstance(value, dict) or len(value) > ENDED_KEPT or not all(
            isinstance(k, str) and _ID.fullmatch(k) and isinstance(v, str)
            for k, v in value.items()):
        raise ValueError("a malformed list of ended sandboxes")
    return {k: v[:200] for k, v in value.items()}


def rebuild_session(data: Mapping[str, Any], made: Slot) -> Session:
    """The session a record describes, on `made` (on the event loop). Raises ValueError."""
    if not isinstance(data, Mapping):
        raise ValueError(f"slot {made.index}: its sandbox's record is not a JSON object")
    ident = str(data.get("id"))
    if not _ID.fullmatch(ident):
        raise ValueError(f"not a sandbox id: {ident[:32]!r}")
    raw = data.get("options")
    if not isinstance(raw, dict):
        raise ValueError(f"sandbox {ident}: malformed options")
    try:
        limits = Limits(int(raw["limits"]["pids"]), int(raw["limits"]["memory"]),
                        None if raw["limits"]["cpus"] is None else float(raw["limits"]["cpus"]))
        options = Options(str(raw["sandbox"]), limits, _strings(raw["env"]),
                          float(raw["ttl"]), float(raw["idle_timeout"]),
                          str(raw["isolation"]), None if raw["image"] is None
                          else str(raw["image"]), _strings(raw["metadata"]))
        base = None if data.get("base") is None else Image.of(data["base"])
    except (KeyError, TypeError, ValueError, ImageError, cgroup.CgroupError) as exc:
        raise ValueError(f"sandbox {ident}: malformed options ({exc})") from None
    session = Session(ident, made, options)
    # What `Session` keeps of its past: set here rather than through its constructor, which
    # every create calls with none.
    session.created = float(data.get("created", session.created))
    session._started = float(data.get("started", session._started))
    session.last_active = float(data.get("last_active", session.last_active))
    session.commands = _int(data, "commands")
    session.paused = data.get("paused") is True
    session.processes._next = max(1, _int(data, "next_pid"))  # its old pids never name another
    session.base = base
    return session


def _int(data: Mapping[str, Any], key: str) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key}: not a count")
    return value


def _list(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    if not isinstance(value, list):
        raise ValueError(f"{key}: not a list")
    return value


def _strings(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValueError("not a mapping of strings")
    return dict(value)


def _image_root(image: Any, index: int) -> ImageRoot | None:
    if image is None:
        return None
    try:
        user = image.get("user")  # absent from a predecessor's older record: none
        return ImageRoot(str(image["key"]), tuple(Path(str(p)) for p in image["layers"]),
                         tuple(str(e) for e in image["env"]), str(image["workdir"]),
                         None if image["disks"] is None else Path(str(image["disks"])),
                         None if user is None else (int(user[0]), int(user[1])),
                         str(image.get("home", "")))
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise ValueError(f"slot {index}: a malformed image root ({exc})") from None


def _pidfd_of(fd: int) -> int | None:
    """The pid a pidfd refers to (its fdinfo's Pid line), None for another kind of descriptor."""
    try:
        info = Path(f"/proc/self/fdinfo/{fd}").read_text()
    except OSError:
        return None
    for line in info.splitlines():
        if line.startswith("Pid:"):
            return int(line.split()[1])
    return None
