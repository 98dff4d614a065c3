"""The OCI images the sandbox tests start from, built by `scripts/test-images` into
var/images-src/ (`make test` runs it before pytest: the test session's own network namespace
cannot reach Debian's mirror).

Each function returns an image's path, resolved (a rebuild during the session swaps the link,
not what a test already holds), or skips the test saying why the image is missing: the reason
the script left in `<dir>/<name>.why`, else that it has not been run.

- `busybox_layout()`: an OCI layout, one layer: /bin/busybox and its applets as symlinks in
  /bin, /etc/passwd and /etc/group (root, nobody), /tmp (1777), /root, /home;
  Env PATH=/bin:/usr/bin, WorkingDir /, Cmd ["/bin/sh"].
- `busybox_archive()`: the same layout as an oci-archive (one tar).
- `busybox_program()`: its /bin/busybox, a static program, for images a test builds itself
  (the host need not have busybox installed).
- `debian_layout()`: an OCI layout, two layers: Debian bookworm (debootstrap minbase with
  python3, python3-pip, ca-certificates; setuid /usr/bin/su, mount, passwd...; /dev empty),
  then `DEBIAN_MARKER` added and `DEBIAN_DELETED` removed through whiteouts;
  Cmd ["/bin/bash"].

Every layout's one manifest is tagged `REF`.
"""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIR_ENV = "SEALGATE_TEST_IMAGES_DIR"  # as scripts/test-images reads it
REF = "latest"
# The debian image's second layer, as scripts/test-images writes it.
DEBIAN_MARKER = "/etc/sealgate-test-image"
DEBIAN_MARKER_TEXT = "debian-test\n"
DEBIAN_DELETED = ("/etc/motd", "/usr/share/doc/ca-certificates")


def images_dir() -> Path:
    return Path(os.environ.get(DIR_ENV, str(ROOT / "var" / "images-src")))


def busybox_layout() -> Path:
    return _found("busybox", "busybox")


def busybox_archive() -> Path:
    return _found("busybox.tar", "busybox")


def busybox_program() -> bytes:
    layout = busybox_layout()

    def blob(digest: str) -> Path:
        return layout / "blobs" / "sha256" / digest.removeprefix("sha256:")

    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads(blob(index["manifests"][0]["digest"]).read_text())
    with tarfile.open(blob(manifest["layers"][0]["digest"])) as layer:
        member = layer.extractfile("bin/busybox")
        assert member is not None, "the busybox image has no bin/busybox"
        return member.read()


def debian_layout() -> Path:
    return _found("debian", "debian")


def _found(entry: str, image: str) -> Path:
    base = images_dir()
    path = base / entry
    ready = path.is_file() if entry.endswith(".tar") else (path / "index.json").is_file()
    if ready:
        return path.resolve()
    try:
        why = (base / f"{image}.why").read_text().strip()
    except OSError:
        why = "run scripts/test-images (make test does)"
    pytest.skip(f"no {image} test image: {why}")
