"""The store's records: `Image`, and the catalog that holds them (`index.json` in the store,
written atomically, read and changed under an fcntl lock so concurrent processes agree).

The catalog also keeps each layer's unpacked size, so an image's size is known without walking
its layers. Two locks: `index.lock` (exclusive, held only while the catalog is read and
rewritten) and `store.lock` (shared while an import or snapshot works, exclusive for gc, so gc
never removes a layer an unfinished import has just placed or reused).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .errors import ImageError

VERSION = 1


@dataclass(frozen=True)
class Image:
    """An image in the store: its layers (diff_ids, or snapshot layer ids), bottom first, and
    what of its config a sandbox uses."""

    name: str
    digest: str
    layers: tuple[str, ...]
    env: tuple[str, ...]
    workdir: str
    user: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    size: int
    created: float
    owner: str | None = None
    parent: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def of(cls, value: dict[str, Any]) -> Image:
        try:
            return cls(
                name=str(value["name"]), digest=str(value["digest"]),
                layers=tuple(map(str, value["layers"])), env=tuple(map(str, value["env"])),
                workdir=str(value["workdir"]), user=str(value["user"]),
                entrypoint=tuple(map(str, value["entrypoint"])),
                cmd=tuple(map(str, value["cmd"])), size=int(value["size"]),
                created=float(value["created"]),
                owner=None if value.get("owner") is None else str(value["owner"]),
                parent=None if value.get("parent") is None else str(value["parent"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ImageError(f"the store's index holds a malformed image record ({exc})") \
                from None


@dataclass
class Catalog:
    """The catalog's contents: images in order of arrival, and layer id -> unpacked bytes."""

    images: list[Image]
    layers: dict[str, int]

    def find(self, name: str) -> Image | None:
        return next((i for i in self.images if i.name == name), None)

    def referenced_layers(self) -> set[str]:
        return {layer for image in self.images for layer in image.layers}


class Index:
    """The catalog file under `root`, and the store's two locks."""

    def __init__(self, root: Path) -> None:
        self.path = root / "index.json"
        self._index_lock = root / "index.lock"
        self._store_lock = root / "store.lock"

    @contextlib.contextmanager
    def change(self) -> Iterator[Catalog]:
        """The catalog, locked; written back (atomically) when the block ends normally."""
        with _flock(self._index_lock, fcntl.LOCK_EX):
            catalog = self._read()
            yield catalog
            self._write(catalog)

    def read(self) -> Catalog:
        with _flock(self._index_lock, fcntl.LOCK_SH):
            return self._read()

    def working(self) -> contextlib.AbstractContextManager[None]:
        """Held (shared) while layers are made or reused: gc waits for it."""
        return _flock(self._store_lock, fcntl.LOCK_SH)

    def sweeping(self) -> contextlib.AbstractContextManager[None]:
        """Held (exclusive) while unreferenced layers and blobs are removed."""
        return _flock(self._store_lock, fcntl.LOCK_EX)

    def _read(self) -> Catalog:
        try:
            data = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return Catalog([], {})
        except (OSError, ValueError) as exc:
            raise ImageError(f"the store's index {self.path} cannot be read ({exc})") from None
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise ImageError(f"the store's index {self.path} is not a version {VERSION} index")
        images = data.get("images", [])
        layers = data.get("layers", {})
        if not isinstance(images, list) or not isinstance(layers, dict):
            raise ImageError(f"the store's index {self.path} is malformed")
        return Catalog([Image.of(i) for i in images],
                       {str(k): int(v) for k, v in layers.items()})

    def _write(self, catalog: Catalog) -> None:
        data = json.dumps({"version": VERSION, "images": [i.to_json() for i in catalog.images],
                           "layers": catalog.layers}, indent=1, sort_keys=True).encode()
        write_atomic(self.path, data)


def write_atomic(path: Path, data: bytes) -> None:
    """`path` holds `data` or what it held before, never half of either (same directory,
    fsync'd, renamed over)."""
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


@contextlib.contextmanager
def _flock(path: Path, how: int) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, how)
        yield
    finally:
        os.close(fd)


def short(digest: str) -> str:
    """"sha256:" and the first 12 hex digits, with an ellipsis."""
    return digest[:19] + "…"


def human(size: float) -> str:
    """A size for people: 512 B, 3.4 MiB, 31 MiB, 2.0 GiB."""
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            break
        size /= 1024
    return f"{size:.0f} {unit}" if unit == "B" or size >= 10 else f"{size:.1f} {unit}"
