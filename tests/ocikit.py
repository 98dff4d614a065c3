"""A small builder of OCI image layouts for tests: layers from tar members (or raw tar bytes),
blobs, a config with right or deliberately wrong diff_ids, a manifest, index.json, an index
over several platforms, and an oci-archive of a layout.

    layer = ocikit.layer([ocikit.file("etc/motd", b"hi"), ocikit.symlink("bin/sh", "/x")])
    built = ocikit.write(tmp_path / "img", [layer], env=["A=1"])
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_MEDIA = {"": "application/vnd.oci.image.layer.v1.tar",
               "gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
               "zstd": "application/vnd.oci.image.layer.v1.tar+zstd"}
MTIME = 1_700_000_000


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class Member:
    """One tar member: a regular file unless `type` says otherwise."""

    name: str
    type: bytes = tarfile.REGTYPE
    data: bytes = b""
    mode: int = 0o644
    linkname: str = ""
    pax: dict[str, str] = field(default_factory=dict)
    uid: int = 1000
    gid: int = 1000
    devmajor: int = 0
    devminor: int = 0


def file(name: str, data: bytes = b"", mode: int = 0o644, **kw: Any) -> Member:
    return Member(name, tarfile.REGTYPE, data, mode, **kw)


def directory(name: str, mode: int = 0o755, **kw: Any) -> Member:
    return Member(name, tarfile.DIRTYPE, b"", mode, **kw)


def symlink(name: str, target: str) -> Member:
    return Member(name, tarfile.SYMTYPE, b"", 0o777, target)


def hardlink(name: str, target: str) -> Member:
    return Member(name, tarfile.LNKTYPE, b"", 0o644, target)


def tar_bytes(members: list[Member]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for m in members:
            info = tarfile.TarInfo(m.name)
            info.type, info.mode, info.linkname = m.type, m.mode, m.linkname
            info.uid, info.gid, info.mtime = m.uid, m.gid, MTIME
            info.devmajor, info.devminor = m.devmajor, m.devminor
            info.pax_headers = dict(m.pax)
            if m.type in (tarfile.REGTYPE, tarfile.AREGTYPE):
                info.size = len(m.data)
                tar.addfile(info, io.BytesIO(m.data))
            else:
                tar.addfile(info)
    return out.getvalue()


@dataclass
class Layer:
    raw: bytes  # the uncompressed tar: its sha256 is the diff_id
    blob: bytes  # as stored (compressed or not)
    media_type: str

    @property
    def diff_id(self) -> str:
        return sha(self.raw)

    @property
    def digest(self) -> str:
        return sha(self.blob)


def layer(content: list[Member] | bytes, compression: str = "gzip") -> Layer:
    raw = content if isinstance(content, bytes) else tar_bytes(content)
    if compression == "gzip":
        blob = gzip.compress(raw, compresslevel=6, mtime=0)
    elif compression == "zstd":
        blob = zstandard.ZstdCompressor(level=3).compress(raw)
    else:
        blob = raw
    return Layer(raw, blob, LAYER_MEDIA[compression])


def gzip_bomb(size: int) -> Layer:
    """A layer whose one file is `size` zero bytes: a few hundred KB compressed."""
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9, mtime=0) as gz:
        header = tarfile.TarInfo("zeros")
        header.size = size
        gz.write(header.tobuf(format=tarfile.PAX_FORMAT))
        chunk = bytes(1 << 20)
        for _ in range(size >> 20):
            gz.write(chunk)
        gz.write(bytes(1024))
    blob = out.getvalue()
    return Layer(b"", blob, LAYER_MEDIA["gzip"])  # raw unused: its diff_id is not needed


@dataclass
class Built:
    root: Path
    digest: str  # the manifest's
    config: str
    diff_ids: list[str]


def put(root: Path, data: bytes) -> str:
    digest = sha(data)
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    (blobs / digest.removeprefix("sha256:")).write_bytes(data)
    return digest


def manifest(root: Path, layers: list[Layer], *, env: list[str] | None = None,
             cmd: list[str] | None = None, diff_ids: list[str] | None = None,
             digests: dict[int, str] | None = None, sizes: dict[int, int] | None = None,
             skip: set[int] | None = None, corrupt: dict[int, str] | None = None,
             user: str = "1000") -> Built:
    """Blobs, config and manifest of one image in `root`; `diff_ids` replaces the config's,
    `digests`/`sizes` (layer index -> value) falsify a layer's descriptor, `skip` (layer
    indexes, or -1 for the config) leaves blobs out, `corrupt` (layer index -> "flip" or
    "append") stores other bytes than its descriptor names."""
    skip = skip or set()
    ids = diff_ids if diff_ids is not None else [layer.diff_id for layer in layers]
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": env or ["PATH=/usr/bin:/bin"], "Cmd": cmd or ["/bin/sh"],
                   "WorkingDir": "/work", "User": user},
        "rootfs": {"type": "layers", "diff_ids": ids}}).encode()
    config_digest = sha(config) if -1 in skip else put(root, config)
    descs = []
    for i, item in enumerate(layers):
        if i not in skip:
            put(root, item.blob)
        how = (corrupt or {}).get(i)
        if how is not None:
            path = root / "blobs" / "sha256" / item.digest.removeprefix("sha256:")
            data = bytearray(item.blob)
            if how == "flip":
                data[len(data) // 2] ^= 0xFF
            else:
                data += b"more"
            path.write_bytes(bytes(data))
        descs.append({"mediaType": item.media_type,
                      "digest": (digests or {}).get(i, item.digest),
                      "size": (sizes or {}).get(i, len(item.blob))})
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                       "config": {"mediaType": OCI_CONFIG, "digest": config_digest,
                                  "size": len(config)},
                       "layers": descs}).encode()
    return Built(root, put(root, body), config_digest, ids)


def finish(root: Path, entries: list[dict[str, Any]]) -> None:
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": entries}))


def descriptor(root: Path, digest: str, media: str, **extra: Any) -> dict[str, Any]:
    size = (root / "blobs" / "sha256" / digest.removeprefix("sha256:")).stat().st_size
    return {"mediaType": media, "digest": digest, "size": size, **extra}


def write(root: Path, layers: list[Layer], **kw: Any) -> Built:
    """A whole layout of one image (index.json -> manifest)."""
    built = manifest(root, layers, **kw)
    finish(root, [descriptor(root, built.digest, OCI_MANIFEST,
                             annotations={"org.opencontainers.image.ref.name": "latest"})])
    return built


def write_platforms(root: Path, platforms: dict[str, list[Layer]], *,
                    nested: bool = True) -> dict[str, Built]:
    """A layout of a multi-platform image: "os/arch[/variant]" -> its layers; index.json
    names an image index blob (`nested`) or lists the manifests itself."""
    built = {p: manifest(root, layers, env=[f"PLATFORM={p}"]) for p, layers in
             platforms.items()}
    entries = []
    for p, b in built.items():
        os_, arch, *variant = p.split("/")
        plat = {"os": os_, "architecture": arch, **({"variant": variant[0]} if variant else {})}
        entries.append(descriptor(root, b.digest, OCI_MANIFEST, platform=plat))
    if nested:
        index = put(root, json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX,
                                      "manifests": entries}).encode())
        finish(root, [descriptor(root, index, OCI_INDEX)])
    else:
        finish(root, entries)
    return built


def archive(layout: Path, out: Path, extra: list[Member] | None = None) -> Path:
    """An oci-archive (plain tar) of `layout`, with `extra` members appended."""
    with tarfile.open(out, "w") as tar:
        for path in sorted(layout.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(layout)), recursive=False)
    if extra:
        data = out.read_bytes()
        # drop the end-of-archive blocks, then append the extra members and new ones
        with tarfile.open(fileobj=io.BytesIO(data)) as body:
            body.getmembers()
            end = body.offset
        out.write_bytes(data[:end] + tar_bytes(extra))
    return out
