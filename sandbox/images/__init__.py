"""OCI images for sandboxes: the store (`store.Store`: imported and pulled images, their
unpacked layers in overlayfs lower-layer format, snapshots of a sandbox's upper layer) and
the unpacker for untrusted layers (`unpack.py`). docs/sandbox.md, "Images: the store and the
unpacker"."""

from __future__ import annotations

from .errors import ImageError
from .record import Image
from .store import Store

__all__ = ["Image", "ImageError", "Store"]
