"""The images part's one error: anything refused or failed while importing, pulling, unpacking,
snapshotting or looking up an image. Its message is a one-line reason naming the image, blob,
layer or tar member concerned, fit to show a user as is."""

from __future__ import annotations

from ..errors import SandboxError


class ImageError(SandboxError):
    """An image, blob or layer was refused or could not be had; `str()` says which and why."""
