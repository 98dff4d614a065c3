"""The image store: images imported from OCI layouts or archives, or pulled with skopeo; their
layers unpacked once each (shared between images) in overlayfs lower-layer format; snapshots of
a sandbox's upper directory as new layers and images derived from them.

Under the root (0700, the daemon's state directory's `images/` by default):

    index.json          the images and the layers' sizes (record.py: atomic, fcntl-locked)
    blobs/sha256/<hex>  manifests and configs, as imported (JSON)
    layers/sha256/<hex> one unpacked layer per diff_id (or snapshot id): an overlay lowerdir
    tmp/                layers being unpacked, archives being opened, pulls under way

A layer is unpacked into `tmp/` and renamed into place only once it passed every check (its
blob's size and sha256, its diff_id, the unpacker's rules); an import that fails removes the
layers it added that no image references, and whatever else it left in `tmp/`. gc removes
layers and blobs no image references, and anything left in `tmp/` by a process that died.

Why one module of ~430 lines: every operation of the store takes the same lock, the same `tmp/`
discipline and the same index transaction; split, the rule that keeps a crash from leaving a
half layer in place would be in two places.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from . import archive, disk, oci
from .errors import ImageError
from .record import Catalog, Image, Index, human, short, write_atomic
from .snapshot import copy_upper
from .unpack import unpack_blob

Progress = Callable[[str], None] | None
SKOPEO = "/usr/bin/skopeo"
PULL_TIMEOUT = 1800.0


class Store:
    """The image store under `root` (made 0700 if missing; it must be this user's)."""

    def __init__(self, root: Path, *, max_layer_bytes: int = 8 << 30,
                 max_layer_entries: int = 1_000_000) -> None:
        self.root = root
        self.max_layer_bytes = max_layer_bytes
        self.max_layer_entries = max_layer_entries
        _own_directory(root)
        for sub in ("blobs", "blobs/sha256", "layers", "layers/sha256", "tmp"):
            (root / sub).mkdir(exist_ok=True, mode=0o700)
        self._index = Index(root)

    # -- getting images in ------------------------------------------------------------------

    def import_path(self, path: Path, name: str | None = None,
                    progress: Progress = None) -> Image:
        """Import an OCI image layout directory, or an `oci-archive` tar file of one."""
        if name is not None:
            _check_name(name)

        def work(new: list[str]) -> Image:
            if path.is_dir():
                return self._import(oci.Layout(path), name, progress, new)
            if not path.is_file():
                raise ImageError(f"{path}: no such file or directory")
            with self.staging("archive-") as temp:
                _say(progress, f"opening archive {path}")
                archive.extract(path, temp, max_member=self.max_layer_bytes,
                                max_total=16 * self.max_layer_bytes)
                return self._import(oci.Layout(temp), name, progress, new)

        return self._guarded(work)

    def pull(self, ref: str, progress: Progress = None, *, cert_dir: Path | None = None,
             timeout: float = PULL_TIMEOUT) -> Image:
        """Pull `ref` from its registry with skopeo (docker://REF), then import it; the
        image's name is `ref`, with ":latest" when it names neither tag nor digest.
        `cert_dir`: the registry's CA (and client) certificates, for a private registry."""
        name = _reference(ref)
        skopeo = shutil.which("skopeo") or SKOPEO
        if not os.access(skopeo, os.X_OK):
            raise ImageError(f"cannot pull {ref}: skopeo is not installed "
                             "(Debian: apt-get install skopeo)")
        if ":" in str(self.root):
            raise ImageError(f"cannot pull {ref}: the store's path {self.root} holds a ':', "
                             "which skopeo's oci: destination cannot carry")

        def work(new: list[str]) -> Image:
            with self.staging("pull-") as temp:
                _say(progress, f"pulling {name} with skopeo")
                certs = [f"--src-cert-dir={cert_dir}"] if cert_dir is not None else []
                argv = [skopeo, "copy", "--quiet", *certs, f"docker://{name}",
                        f"oci:{temp / 'layout'}:latest"]
                try:
                    done = subprocess.run(argv, capture_output=True, text=True,
                                          stdin=subprocess.DEVNULL, timeout=timeout,
                                          check=False)
                except subprocess.TimeoutExpired:
                    raise ImageError(f"cannot pull {ref}: skopeo did not finish within "
                                     f"{timeout:g} s") from None
                except OSError as exc:
                    raise ImageError(f"cannot pull {ref}: skopeo could not be run "
                                     f"({exc.strerror})") from None
                if done.returncode != 0:
                    lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
                    said = lines[-1][:300] if lines else f"exit status {done.returncode}"
                    raise ImageError(f"cannot pull {ref}: skopeo failed: {said}")
                return self._import(oci.Layout(temp / "layout"), name, progress, new)

        return self._guarded(work)

    def _import(self, layout: oci.Layout, name: str | None, progress: Progress,
                new: list[str]) -> Image:
        desc, manifest, raw = layout.resolve()
        config_desc, layer_descs = oci.manifest_parts(manifest, desc.digest)
        missing = [d.digest for d in (config_desc, *layer_descs)
                   if not layout.has_blob(d.digest)]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise ImageError(f"manifest {desc.digest} names blob {missing[0]}{more}, which "
                             f"the layout does not hold")
        config_json, config_raw = layout.read_json(config_desc, "config")
        config = oci.parse_config(config_json, config_desc.digest, len(layer_descs))
        known = self._index.read().layers
        sizes: dict[str, int] = {}
        for i, (layer, diff_id) in enumerate(zip(layer_descs, config.diff_ids, strict=True)):
            label = f"layer {i + 1}/{len(layer_descs)} {short(diff_id)}"
            sizes[diff_id] = self._layer(layout, layer, diff_id, label=label, progress=progress,
                                         known=known, new=new)
        self._put_blob(desc.digest, raw)
        self._put_blob(config_desc.digest, config_raw)
        image = Image(name=name or desc.digest, digest=desc.digest, layers=config.diff_ids,
                      env=config.env, workdir=config.workdir, user=config.user,
                      entrypoint=config.entrypoint, cmd=config.cmd,
                      size=sum(sizes[d] for d in config.diff_ids), created=time.time())
        with self._index.change() as catalog:
            catalog.layers.update(sizes)
            catalog.images = [i for i in catalog.images if i.name != image.name] + [image]
        _say(progress, f"imported {image.name} {short(image.digest)} "
                       f"({human(image.size)}, {len(image.layers)} "
                       f"layer{'' if len(image.layers) == 1 else 's'})")
        return image

    def _layer(self, layout: oci.Layout, desc: oci.Descriptor, diff_id: str, *,
               label: str, progress: Progress, known: dict[str, int], new: list[str]) -> int:
        """The layer `diff_id` in the store (unpacked from `desc`'s blob unless there);
        returns its size."""
        final = self._layer_path(diff_id)
        if _is_dir(final):
            _say(progress, f"{label} already present")
            return known.get(diff_id) or _du(final)
        with self.staging("layer-") as temp:
            reader = layout.open_blob(desc, "layer")
            try:
                try:
                    done = unpack_blob(reader, oci.LAYERS[desc.media_type], temp,
                                       max_bytes=self.max_layer_bytes,
                                       max_entries=self.max_layer_entries,
                                       what=f"layer {desc.digest}")
                except ImageError:
                    reader.finish()  # a blob that is not what it claims: say that instead
                    raise
                reader.finish()
            finally:
                reader.close()
            if done.diff_id != diff_id:
                raise ImageError(f"layer {desc.digest}: its uncompressed content is "
                                 f"{short(done.diff_id)}, the config's diff_id says {diff_id}")
            try:
                os.rename(temp, final)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                return done.size  # another import placed the same layer meanwhile
        new.append(diff_id)
        _say(progress, f"{label} {human(done.size)} unpacked")
        return done.size

    def _guarded(self, work: Callable[[list[str]], Image]) -> Image:
        """`work(new)` while the store is being worked on; if it fails, the layers it added
        (`new`) that no image references are removed."""
        new: list[str] = []
        try:
            with self._index.working():
                return work(new)
        except BaseException:
            if new:
                with self._index.sweeping():
                    referenced = self._index.read().referenced_layers()
                    for layer in new:
                        if layer not in referenced:
                            shutil.rmtree(self._layer_path(layer), ignore_errors=True)
            raise

    # -- snapshots ----------------------------------------------------------------------------

    def add_layer(self, upper: Path, max_bytes: int | None = None) -> str:
        """Copy an overlayfs upper directory into a new layer (normalised: snapshot.py), of at
        most `max_bytes` (and never more than max_layer_bytes); returns its id. Unreferenced
        until `derive` names it (gc removes it before then)."""
        limit = min(self.max_layer_bytes, max_bytes or self.max_layer_bytes)
        with self._index.working():
            with self.staging("snapshot-") as temp:
                layer, size = copy_upper(upper, temp, max_bytes=limit,
                                         max_entries=self.max_layer_entries)
                try:
                    os.rename(temp, self._layer_path(layer))
                except OSError as exc:  # the same content is there already
                    if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                        raise ImageError(f"snapshot of {upper}: layer {layer} could not be "
                                         f"placed ({exc.strerror})") from None
            with self._index.change() as catalog:
                catalog.layers[layer] = size
        return layer

    def derive(self, base: Image, layer: str, name: str, owner: str | None) -> Image:
        """A new image: `base`'s layers and config with `layer` on top, parent `base.name`."""
        _check_name(name)
        oci.check_digest(layer, "layer")
        with self._index.working():
            if not _is_dir(self._layer_path(layer)):
                raise ImageError(f"no layer {layer} in the store")
            with self._index.change() as catalog:
                if catalog.find(name) is not None:
                    raise ImageError(f"an image named {name!r} exists already")
                layers = (*base.layers, layer)
                described = json.dumps({"layers": layers, "env": base.env,
                                        "workdir": base.workdir, "user": base.user,
                                        "entrypoint": base.entrypoint, "cmd": base.cmd},
                                       sort_keys=True).encode()
                digest = "sha256:" + hashlib.sha256(described).hexdigest()
                image = Image(name=name, digest=digest, layers=layers, env=base.env,
                              workdir=base.workdir,
                              user=base.user, entrypoint=base.entrypoint, cmd=base.cmd,
                              size=base.size + catalog.layers.get(layer, 0),
                              created=time.time(), owner=owner, parent=base.name)
                catalog.images.append(image)
        return image

    # -- looking, removing --------------------------------------------------------------------

    def get(self, name_or_digest: str) -> Image:
        return _lookup(self._index.read(), name_or_digest)

    def list(self) -> list[Image]:
        return list(self._index.read().images)

    def remove(self, name: str) -> None:
        with self._index.change() as catalog:
            image = _lookup(catalog, name)
            catalog.images = [i for i in catalog.images if i.name != image.name]

    def layer_dirs(self, image: Image) -> builtins.list[Path]:
        """The image's layer directories, top first (overlayfs' `lowerdir=` order)."""
        dirs = [self._layer_path(layer) for layer in reversed(image.layers)]
        for layer, path in zip(reversed(image.layers), dirs, strict=True):
            if not _is_dir(path):
                raise ImageError(f"image {image.name}: layer {layer} is missing from the store")
        return dirs

    def gc(self) -> builtins.list[str]:
        """Remove layers and blobs no image references, and leftovers in tmp/; returns what
        went, as paths relative to the root."""
        removed: builtins.list[str] = []
        with self._index.sweeping():
            catalog = self._index.read()
            layers = {d.removeprefix("sha256:") for d in catalog.referenced_layers()}
            # A layer a live sandbox has mounted stays, referenced or not (an image removed
            # under it): a lower layer must not change while an overlay uses it.
            layers |= _mounted(self.root / "layers/sha256")
            blobs = self._referenced_blobs(catalog)
            for sub, keep in (("layers/sha256", layers), ("blobs/sha256", blobs)):
                for entry in sorted(os.listdir(self.root / sub)):
                    if entry not in keep:
                        _remove(self.root / sub / entry)
                        removed.append(f"{sub}/{entry}")
            for entry in sorted(os.listdir(self.root / "tmp")):
                _remove(self.root / "tmp" / entry)
                removed.append(f"tmp/{entry}")
            # The microVM's disks (`disk`) of images no longer here (one a VM has open stays
            # readable by it); a build's own files start with a dot and are left to it.
            disks = {disk.name(",".join(image.layers)) for image in catalog.images}
            with contextlib.suppress(FileNotFoundError):
                for entry in sorted(os.listdir(self.root / "disks")):
                    if not entry.startswith(".") and entry not in disks:
                        _remove(self.root / "disks" / entry)
                        removed.append(f"disks/{entry}")
            with self._index.change() as catalog:
                catalog.layers = {k: v for k, v in catalog.layers.items()
                                  if k.removeprefix("sha256:") in layers}
        return removed

    def _referenced_blobs(self, catalog: Catalog) -> set[str]:
        """The manifests of the images and the configs they name (a derived image's digest
        names no blob)."""
        found: set[str] = set()
        for image in catalog.images:
            path = self.root / "blobs" / "sha256" / image.digest.removeprefix("sha256:")
            try:
                manifest = json.loads(path.read_bytes())
            except (OSError, ValueError):
                continue
            found.add(path.name)
            config = manifest.get("config") if isinstance(manifest, dict) else None
            if isinstance(config, dict) and isinstance(config.get("digest"), str):
                found.add(config["digest"].removeprefix("sha256:"))
        return found

    # -- places -------------------------------------------------------------------------------

    def _layer_path(self, layer: str) -> Path:
        return self.root / "layers" / "sha256" / layer.removeprefix("sha256:")

    def _put_blob(self, digest: str, data: bytes) -> None:
        path = self.root / "blobs" / "sha256" / digest.removeprefix("sha256:")
        if not path.exists():
            write_atomic(path, data)

    @contextlib.contextmanager
    def staging(self, prefix: str) -> Iterator[Path]:
        """A fresh directory in tmp/, removed afterwards (unless renamed away); gc, which
        empties tmp/, waits while one is in use."""
        with self._index.working():
            path = Path(tempfile.mkdtemp(prefix=prefix, dir=self.root / "tmp"))
            try:
                yield path
            finally:
                shutil.rmtree(path, ignore_errors=True)


def _mounted(layers: Path) -> set[str]:
    """The layers (by hex) that are the root of a mount of this host (a sandbox's idmapped
    lower layer, `sandbox.host.rootfs`): a mount of the store's filesystem whose root is
    `.../sha256/<hex>`."""
    try:
        device = os.stat(layers).st_dev
        table = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return set()
    found = set()
    for line in table.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        major, _, minor = fields[2].partition(":")
        parent, _, name = fields[3].rpartition("/")
        if (parent.endswith("/sha256") and major.isdigit() and minor.isdigit()
                and os.makedev(int(major), int(minor)) == device):
            found.add(name)
    return found


def _lookup(catalog: Catalog, key: str) -> Image:
    """By name; else by digest, whole or a prefix of at least 6 hex digits ("sha256:" or not)."""
    found = catalog.find(key)
    if found is not None:
        return found
    hexa = key.removeprefix("sha256:")
    if len(hexa) >= 6 and all(c in "0123456789abcdef" for c in hexa):
        matches = [i for i in catalog.images if i.digest.removeprefix("sha256:").startswith(hexa)]
        if len({i.digest for i in matches}) == 1:
            return matches[0]
        if matches:
            raise ImageError(f"{key!r} names more than one image: "
                             f"{', '.join(sorted({i.name for i in matches}))}")
    raise ImageError(f"no image {key}")


def _check_name(name: str) -> None:
    if not name or len(name) > 256 or not name.isprintable() or any(c.isspace() for c in name):
        raise ImageError(f"{name!r} is not a valid image name (printable, no spaces, "
                         "1 to 256 characters)")


def _reference(ref: str) -> str:
    """A pull reference, checked, with ":latest" added when it names no tag or digest."""
    _check_name(ref)
    if ref.startswith("-") or "://" in ref:
        raise ImageError(f"{ref!r} is not an image reference (like debian:12 or "
                         "ghcr.io/org/image@sha256:...)")
    if "@" not in ref and ":" not in ref.rsplit("/", 1)[-1]:
        return ref + ":latest"
    return ref


def _own_directory(root: Path) -> None:
    """`root` exists, is a directory of this user's (not a link) and is 0700."""
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.lstat(root)
    except OSError as exc:
        raise ImageError(f"the image store {root} cannot be made ({exc.strerror})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise ImageError(f"the image store {root} is not a directory")
    if st.st_uid != os.geteuid():
        raise ImageError(f"the image store {root} belongs to uid {st.st_uid}, not to this user")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(root, 0o700)


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _remove(path: Path) -> None:
    if _is_dir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _du(path: Path) -> int:
    """The bytes of the regular files under `path` (a layer whose size the index lacks)."""
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(directory, name))
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def _say(progress: Progress, line: str) -> None:
    if progress is not None:
        progress(line)
