"""A running sandbox's memory saved once, for `fork`: copies resumed from it (`Daemon.fork`).

Only where the tier can (`Tier.no_fork` None: the microVM, for a sandbox from an image, whose
guest has no 9p share): its launcher holds the guest agent between two frames, stops QEMU,
writes the VM's state into the file handed to it, and continues it (`hostserve`'s save).

The file holds everything the sandbox had in memory: it is made here, root's alone (0600, in
root's /run/sealgate, never a path a sandbox reaches), read by each copy's root launcher at its
start, and removed as soon as every copy has read it, whatever happened -- but a daemon killed
meanwhile leaves it. So its name begins with the daemon's pid, and a daemon starting removes
every such file of a pid no longer alive (`sweep`); a successor beside its predecessor (a
hand-over) leaves the live one's alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

from sealgate.reasons import Reason

from ..host.network import RUN_DIR
from . import workspace
from .session import Session, SessionError

PLACE = RUN_DIR / "forks"
MOST = 16  # copies per fork: each is a VM of the daemon's, counted against its capacity
_NAMED = re.compile(r"(\d+)-[^/]+\.mem")


def sweep(place: Path = PLACE) -> int:
    """Remove the memory files of daemons that died mid-fork; how many went."""
    removed = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in place.iterdir():
            if (named := _NAMED.fullmatch(entry.name)) is None or _alive(int(named.group(1))):
                continue
            with contextlib.suppress(FileNotFoundError):
                entry.unlink()
                removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.asynccontextmanager
async def saved(session: Session) -> AsyncIterator[Path]:
    """The sandbox's memory in a file, for as long as the block runs. A paused sandbox is
    resumed for the save (its guest must answer) and paused again. Raises SessionError."""
    PLACE.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = PLACE / f"{os.getpid()}-{session.id}-{secrets.token_hex(4)}.mem"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise SessionError(f"cannot make the memory snapshot's file: {exc.strerror}",
                           reason=Reason.SANDBOX_FAILED) from None
    try:
        was_paused = session.paused
        if was_paused:
            await session.pause(False)
        try:
            await workspace.save(session, fd)
        finally:
            if was_paused and not session.ended.is_set():
                await session.pause()
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()
