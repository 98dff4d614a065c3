"""The daemon's side of the image store (`sandbox.images`): an image as a sandbox's root, and a
sandbox's filesystem as a new image (a snapshot)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import time
from pathlib import Path

from sealgate.reasons import Reason

from .. import tiers
from ..host.rootfs import ImageRoot
from ..images import Image, ImageError, Store
from ..images.unpack import unpack_blob
from ..images.user import UserError
from ..runtime import image_of
from . import workspace
from .events import log
from .session import Session, SessionError

_STALL_SECONDS = 60.0


def image_root(store: Store | None, isolation: str, name: str, policy: str | None
               ) -> tuple[Image, ImageRoot]:
    """Image `name` from the store, as a root for `policy`'s sandbox (None: for a pool,
    which any policy may take from). Raises SessionError."""
    if store is None:
        raise SessionError("this daemon has no image store (sandboxd --images)",
                           reason=Reason.BAD_REQUEST)
    tier = tiers.get(isolation)
    if tier.image_owner is None:
        raise SessionError(f"images do not run on the {tier.name} tier yet",
                           reason=Reason.BAD_REQUEST)
    try:
        image, root = image_of(store, name)
    except UserError as exc:
        raise SessionError(f"image {name[:64]!r}: {exc}", reason=Reason.IMAGE_REFUSED) from None
    except ImageError as exc:
        raise SessionError(str(exc), reason=Reason.NO_SUCH_IMAGE) from None
    except OSError as exc:  # the store unreadable: said, never a traceback
        raise SessionError(f"the image store: {exc.strerror or exc}",
                           reason=Reason.SANDBOX_FAILED) from None
    if image.owner is not None and image.owner != policy:
        # A snapshot or template carries what its policy's sandbox wrote: its files are
        # that policy's, never another's (nor a pool's, which any policy takes from).
        raise SessionError(f"image {name[:64]!r} belongs to another policy",
                           reason=Reason.IMAGE_REFUSED)
    return image, root


async def snapshot(store: Store | None, isolation: str, session: Session, name: str | None,
                   disk: int | None = None) -> Image:
    """The sandbox's filesystem, its image's layers and what it wrote over them, as a
    new image of its policy's (one instant of it: its processes frozen meanwhile). `disk`:
    the sandbox's scratch disk, which what a host upper's copy writes may not pass (a sparse
    file or hard links would otherwise make its small disk a host disk's worth). Raises
    SessionError."""
    ident = session.id
    upper = session.upper
    if store is None or session.base is None or upper is None:
        raise SessionError(f"sandbox {ident[:64]} has no image to snapshot (create it with "
                           "an image)", reason=Reason.BAD_REQUEST)
    try:
        if tiers.get(isolation).image_owner == "guest":
            layer = await _from_guest(store, session)
        else:
            layer = await _from_upper(store, session, upper, disk)
    except OSError as exc:  # a full disk, say: its own words, the sandbox running on
        raise SessionError(f"cannot snapshot sandbox {ident[:64]}: the image store: "
                           f"{exc.strerror or exc}", reason=Reason.SANDBOX_FAILED) from None
    except ImageError as exc:
        raise SessionError(f"cannot snapshot sandbox {ident[:64]}: {exc}",
                           reason=Reason.SANDBOX_FAILED) from None
    try:
        made = store.derive(session.base, layer, name or f"{ident}-{int(time.time())}",
                                 owner=session.options.sandbox)
    except ImageError as exc:
        raise SessionError(str(exc), reason=Reason.BAD_REQUEST) from None
    except OSError as exc:
        raise SessionError(f"the image store: {exc.strerror or exc}",
                           reason=Reason.SANDBOX_FAILED) from None
    log("snapshot", id=ident, sandbox=session.options.sandbox, image=made.name, layer=layer)
    return made


async def _from_upper(store: Store, session: Session, upper: Path, disk: int | None) -> str:
    """Its overlay's upper directory on the host, copied while its cgroup is frozen."""
    was_paused = session.paused
    await session.pause()
    try:
        return await asyncio.to_thread(store.add_layer, upper, disk)
    finally:
        if not was_paused and not session.ended.is_set():
            await session.pause(False)


async def _from_guest(store: Store, session: Session) -> str:
    """A microVM's: its guest makes the layer's tar stream (its upper is in the guest's
    memory; its commands frozen there meanwhile), which is unpacked here by the image
    unpacker's rules and caps, as any untrusted layer is, and then copied into the store as
    a host upper is. A paused VM runs its guest for the copy and is paused again after."""
    was_paused = session.paused
    if was_paused:
        await session.pause(False)
    try:
        stream = await workspace.layer(session)
        try:
            with store.staging("guest-layer-") as staged:
                await _unpacked(store, stream, staged)
                if not await stream.whole():
                    raise ImageError("the sandbox's copy of its files was cut short")
                return await asyncio.to_thread(store.add_layer, staged)
        finally:
            await stream.aclose()
    finally:
        if was_paused and not session.ended.is_set():
            await session.pause()


async def _unpacked(store: Store, stream: workspace.Stream, staged: Path) -> None:
    """The stream unpacked into `staged` by a thread. Cancelled, the guest's copier is ended
    first (its pipe's end: the thread reads to its end or fails) and the thread waited for,
    so that it never writes into the staging directory after it is removed."""
    thread = asyncio.ensure_future(asyncio.to_thread(_unpack, store, stream.detach(), staged))
    try:
        await asyncio.shield(thread)
    except asyncio.CancelledError:
        await stream.aclose()
        with contextlib.suppress(Exception):
            await thread
        raise


def _unpack(store: Store, fd: int, staged: Path) -> None:
    with _Pipe(fd) as pipe:
        unpack_blob(pipe, "", staged, max_bytes=store.max_layer_bytes,
                    max_entries=store.max_layer_entries, what="the sandbox's files")


class _Pipe:
    """A pipe read in a thread, for at most `_STALL_SECONDS` between two reads: a guest that
    stops sending ends the copy, never holds a thread."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def read(self, size: int = -1, /) -> bytes:
        if not self._poll.poll(_STALL_SECONDS * 1000):
            raise ImageError(f"the sandbox sent nothing for {_STALL_SECONDS:.0f} s")
        return os.read(self.fd, size if size > 0 else 1 << 20)

    def __enter__(self) -> _Pipe:
        return self

    def __exit__(self, *_: object) -> None:
        os.close(self.fd)
