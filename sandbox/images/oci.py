"""Reading an OCI image layout: descriptors, verified blobs, an index resolved to this host's
platform, the manifest and the config.

Every blob is read through `BlobReader`, which counts and hashes what passes and refuses a blob
longer than its descriptor says; `finish()` checks the size and the sha256. JSON blobs
(indexes, manifests, configs) are read whole, bounded, and verified before they are parsed.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ImageError

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEXES = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFESTS = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})

# layer media type -> compression ("" for none)
LAYERS = {
    "application/vnd.oci.image.layer.v1.tar": "",
    "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd": "zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar": "",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip": "gzip",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd": "zstd",
    "application/vnd.docker.image.rootfs.diff.tar": "",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
    "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip": "gzip",
}

MAX_JSON = 16 << 20  # an index, manifest or config
MAX_INDEX_DEPTH = 4
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_CHUNK = 1 << 20


def check_digest(digest: object, what: str) -> str:
    """`digest` if it is "sha256:<64 lowercase hex>", else ImageError."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        shown = digest if isinstance(digest, str) and len(digest) < 100 else "?"
        raise ImageError(f"{what}: {shown!r} is not a sha256 digest (only sha256 is supported)")
    return digest


@dataclass(frozen=True)
class Descriptor:
    """A content descriptor: what a blob is, its digest and size (and platform, in an index)."""

    media_type: str
    digest: str
    size: int
    platform: str | None = None  # "os/arch[/variant]"

    @property
    def hex(self) -> str:
        return self.digest.removeprefix("sha256:")

    @classmethod
    def of(cls, value: object, what: str) -> Descriptor:
        if not isinstance(value, dict):
            raise ImageError(f"{what}: a descriptor is not a JSON object")
        digest = check_digest(value.get("digest"), what)
        size = value.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ImageError(f"{what} {digest}: no valid size in its descriptor")
        media = value.get("mediaType", "")
        plat = value.get("platform")
        shown = None
        if isinstance(plat, dict):
            parts = [str(plat.get("os", "?")), str(plat.get("architecture", "?"))]
            if plat.get("variant"):
                parts.append(str(plat["variant"]))
            shown = "/".join(parts)
        return cls(str(media), digest, size, shown)


@dataclass(frozen=True)
class Config:
    """What of an image's config a sandbox uses, and the layers' diff_ids (bottom first)."""

    diff_ids: tuple[str, ...]
    env: tuple[str, ...]
    workdir: str
    user: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]


def host_platforms() -> tuple[str, ...]:
    """This host's platforms as an index names them, best first."""
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64",
            "arm64": "arm64"}.get(platform.machine().lower(), platform.machine().lower())
    if arch == "arm64":
        return ("linux/arm64/v8", "linux/arm64")
    return (f"linux/{arch}",)


class BlobReader:
    """A blob read from an open file: counted, hashed, refused past its descriptor's size."""

    def __init__(self, fd: int, desc: Descriptor, what: str) -> None:
        self._file = os.fdopen(fd, "rb", buffering=0)
        self.desc, self.what = desc, what
        self._hash = hashlib.sha256()
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        want = _CHUNK if size is None or size < 0 else min(size, _CHUNK)
        data = self._file.read(want) or b""
        self.count += len(data)
        if self.count > self.desc.size:
            raise ImageError(f"{self.what} {self.desc.digest}: longer than its descriptor's "
                             f"size ({self.desc.size} bytes)")
        self._hash.update(data)
        return data

    def finish(self) -> None:
        """Read what is left and check the size and the digest."""
        while self.read(_CHUNK):
            pass
        if self.count != self.desc.size:
            raise ImageError(f"{self.what} {self.desc.digest}: {self.count} bytes, its "
                             f"descriptor says {self.desc.size}")
        if "sha256:" + self._hash.hexdigest() != self.desc.digest:
            raise ImageError(f"{self.what} {self.desc.digest}: content does not match its "
                             f"digest (sha256:{self._hash.hexdigest()[:12]}…)")

    def close(self) -> None:
        self._file.close()


class Layout:
    """An OCI image layout directory (read only, never written)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / digest.removeprefix("sha256:")

    def open_blob(self, desc: Descriptor, what: str) -> BlobReader:
        """The blob as a BlobReader; a missing, linked or non-regular blob is refused."""
        return BlobReader(_open_regular(self.blob_path(desc.digest), f"{what} {desc.digest}"),
                          desc, what)

    def has_blob(self, digest: str) -> bool:
        try:
            return stat.S_ISREG(os.lstat(self.blob_path(digest)).st_mode)
        except OSError:
            return False

    def read_json(self, desc: Descriptor, what: str) -> tuple[dict[str, Any], bytes]:
        """A JSON blob, verified, parsed (it must be an object), and its bytes."""
        if desc.size > MAX_JSON:
            raise ImageError(f"{what} {desc.digest}: {desc.size} bytes, over the "
                             f"{MAX_JSON >> 20} MiB limit")
        reader = self.open_blob(desc, what)
        try:
            data = b"".join(iter(lambda: reader.read(_CHUNK), b""))
            reader.finish()
        finally:
            reader.close()
        return _object(data, f"{what} {desc.digest}"), data

    def index(self) -> dict[str, Any]:
        """index.json, after checking oci-layout says this is an image layout."""
        try:
            fd = _open_regular(self.root / "oci-layout", "oci-layout")
        except ImageError:
            raise ImageError(f"{self.root}: not an OCI image layout (no oci-layout file)") \
                from None
        with os.fdopen(fd, "rb") as f:
            layout = _object(f.read(MAX_JSON), "oci-layout")
        if not isinstance(layout.get("imageLayoutVersion"), str):
            raise ImageError(f"{self.root}: oci-layout names no imageLayoutVersion")
        with os.fdopen(_open_regular(self.root / "index.json", "index.json"), "rb") as f:
            return _object(f.read(MAX_JSON + 1), "index.json")

    def resolve(self) -> tuple[Descriptor, dict[str, Any], bytes]:
        """The manifest for this host (following indexes): descriptor, parsed, bytes."""
        doc: dict[str, Any] = self.index()
        what = "index.json"
        for _ in range(MAX_INDEX_DEPTH):
            desc = _choose(doc, what)
            if desc.media_type and desc.media_type not in INDEXES | MANIFESTS:
                raise ImageError(f"{what}: entry {desc.digest} has media type "
                                 f"{desc.media_type!r}, not an image manifest or index")
            blob, raw = self.read_json(desc, "manifest")
            kind = blob.get("mediaType") or desc.media_type
            if kind in INDEXES or ("manifests" in blob and "layers" not in blob):
                doc, what = blob, f"index {desc.digest}"
                continue
            return desc, blob, raw
        raise ImageError(f"{what}: indexes nested more than {MAX_INDEX_DEPTH} deep")


def _choose(index: dict[str, Any], what: str) -> Descriptor:
    """The one entry of an index, or the entry for this host's platform."""
    entries = index.get("manifests")
    if not isinstance(entries, list) or not entries:
        raise ImageError(f"{what}: lists no manifests")
    descs = [Descriptor.of(e, f"{what} entry") for e in entries]
    if len(descs) == 1:
        return descs[0]
    for wanted in host_platforms():
        for desc in descs:
            if desc.platform == wanted:
                return desc
    offered = sorted({d.platform or "unknown" for d in descs})
    raise ImageError(f"{what}: no manifest for this host's platform ({host_platforms()[-1]}); "
                     f"it offers {', '.join(offered)}")


def manifest_parts(manifest: dict[str, Any], digest: str) -> tuple[Descriptor,
                                                                    list[Descriptor]]:
    """A manifest's config descriptor and its layers' descriptors, bottom first."""
    what = f"manifest {digest}"
    config = Descriptor.of(manifest.get("config"), f"{what} config")
    layers = manifest.get("layers")
    if not isinstance(layers, list):
        raise ImageError(f"{what}: no layers list")
    descs = [Descriptor.of(layer, f"{what} layer") for layer in layers]
    for desc in descs:
        compression = LAYERS.get(desc.media_type)
        if compression is None:
            raise ImageError(f"layer {desc.digest}: unsupported media type {desc.media_type!r}")
    return config, descs


def parse_config(config: dict[str, Any], digest: str, layers: int) -> Config:
    what = f"config {digest}"
    rootfs = config.get("rootfs")
    diff_ids = rootfs.get("diff_ids") if isinstance(rootfs, dict) else None
    if not isinstance(diff_ids, list):
        raise ImageError(f"{what}: no rootfs.diff_ids")
    ids = tuple(check_digest(d, f"{what} diff_id") for d in diff_ids)
    if len(ids) != layers:
        raise ImageError(f"{what}: {len(ids)} diff_ids for {layers} layers in the manifest")
    inner = config.get("config") or {}
    if not isinstance(inner, dict):
        raise ImageError(f"{what}: its config is not an object")
    return Config(ids, _strings(inner.get("Env"), f"{what} Env"),
                  _string(inner.get("WorkingDir"), f"{what} WorkingDir"),
                  _string(inner.get("User"), f"{what} User"),
                  _strings(inner.get("Entrypoint"), f"{what} Entrypoint"),
                  _strings(inner.get("Cmd"), f"{what} Cmd"))


def _strings(value: object, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ImageError(f"{what}: not a list of strings")
    return tuple(value)


def _string(value: object, what: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ImageError(f"{what}: not a string")
    return value


def _object(data: bytes, what: str) -> dict[str, Any]:
    if len(data) > MAX_JSON:
        raise ImageError(f"{what}: over the {MAX_JSON >> 20} MiB limit")
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ImageError(f"{what}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ImageError(f"{what}: not a JSON object")
    return value


def _open_regular(path: Path, what: str) -> int:
    """An O_RDONLY descriptor of `path` if it is a regular file (never through a final link,
    never blocking on a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ImageError(f"{what}: missing ({path})") from None
    except OSError as exc:
        raise ImageError(f"{what}: cannot be opened ({exc.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ImageError(f"{what}: not a regular file ({path})")
    os.set_blocking(fd, True)
    return fd
