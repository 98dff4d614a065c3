"""The daemon's side of the image store (`sandbox.images`): an image as a sandbox's root, and a
sandbox's filesystem as a new image (a snapshot)."""

from __future__ import annotations

import asyncio
import time

from sealgate.reasons import Reason

from .. import tiers
from ..host.rootfs import ImageRoot
from ..images import Image, ImageError, Store
from ..runtime import image_of
from .events import log
from .session import Session, SessionError


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


async def snapshot(store: Store | None, isolation: str, session: Session, name: str | None
                   ) -> Image:
    """The sandbox's filesystem, its image's layers and what it wrote over them, as a
    new image of its policy's (frozen meanwhile, so one instant of it). Raises
    SessionError."""
    ident = session.id
    tier = tiers.get(isolation)
    if session.base is not None and tier.no_snapshot is not None:
        raise SessionError(f"the {tier.name} tier cannot snapshot sandbox {ident[:64]}: "
                           f"{tier.no_snapshot}", reason=Reason.UNSUPPORTED)
    upper = session.upper
    if store is None or session.base is None or upper is None:
        raise SessionError(f"sandbox {ident[:64]} has no image to snapshot (create it with "
                           "an image)", reason=Reason.BAD_REQUEST)
    was_paused = session.paused
    await session.pause()
    try:
        layer = await asyncio.to_thread(store.add_layer, upper)
    except OSError as exc:  # a full disk, say: its own words, the sandbox thawed below
        raise SessionError(f"cannot snapshot sandbox {ident[:64]}: the image store: "
                           f"{exc.strerror or exc}", reason=Reason.SANDBOX_FAILED) from None
    except ImageError as exc:
        raise SessionError(f"cannot snapshot sandbox {ident[:64]}: {exc}",
                           reason=Reason.SANDBOX_FAILED) from None
    finally:
        if not was_paused and not session.ended.is_set():
            await session.pause(False)
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
