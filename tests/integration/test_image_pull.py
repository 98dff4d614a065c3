"""`sealgate image pull` against a real registry: Debian's docker-registry (the CNCF
distribution registry) on loopback over TLS with the tests' own CA, pushed to with the real
skopeo, pulled through the real skopeo by the store (`--cert-dir`: a private registry's CA),
every blob's digest checked on import. Nothing of the host's trust or registries
configuration changes."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.harness import ROOT, OriginCA, free_port
from tests.images import busybox_layout

REGISTRY = shutil.which("docker-registry")
SKOPEO = shutil.which("skopeo")
pytestmark = pytest.mark.skipif(REGISTRY is None or SKOPEO is None,
                                reason="no docker-registry or skopeo (Debian packages)")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA
             ) -> Iterator[tuple[str, Path]]:
    """The registry's address, and a directory of the CA its certificate is signed by."""
    where = tmp_path_factory.mktemp("registry")
    port = free_port()
    cert, key = test_ca.issue("127.0.0.1")
    (where / "config.yml").write_text(f"""
version: 0.1
log: {{level: error}}
storage: {{filesystem: {{rootdirectory: {where / 'data'}}}, delete: {{enabled: true}}}}
http: {{addr: "127.0.0.1:{port}", tls: {{certificate: {cert}, key: {key}}}}}
""")
    certs = where / "certs"
    certs.mkdir()
    shutil.copy(test_ca.path, certs / "ca.crt")
    assert REGISTRY is not None
    server = subprocess.Popen([REGISTRY, "serve", str(where / "config.yml")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if requests.get(f"https://127.0.0.1:{port}/v2/", timeout=2,
                                verify=str(test_ca.path)).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "no registry"
            time.sleep(0.1)
        yield f"127.0.0.1:{port}", certs
    finally:
        server.terminate()
        server.wait(10)


def sealgate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "sealgate.cli", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})


def test_an_image_pushed_to_a_registry_is_pulled_and_verified(
    registry: tuple[str, Path], tmp_path: Path, test_ca: OriginCA
) -> None:
    address, certs = registry
    assert SKOPEO is not None
    pushed = subprocess.run([SKOPEO, "copy", "--quiet", f"--dest-cert-dir={certs}",
                             f"oci:{busybox_layout()}", f"docker://{address}/tools/busybox:1"],
                            capture_output=True, text=True, timeout=120, check=False)
    assert pushed.returncode == 0, pushed.stderr
    store = tmp_path / "store"
    ref = f"{address}/tools/busybox:1"
    # Without the registry's CA: refused in words, nothing stored.
    untrusted = sealgate("image", "pull", ref, "--store", str(store))
    assert untrusted.returncode != 0 and "certificate" in untrusted.stderr, untrusted.stderr
    assert "Traceback" not in untrusted.stderr
    done = sealgate("image", "pull", ref, "--cert-dir", str(certs), "--store", str(store))
    assert done.returncode == 0, done.stderr
    listed = json.loads(sealgate("image", "ls", "--json", "--store", str(store)).stdout)
    assert [i["name"] for i in listed] == [ref], listed
    # What the registry serves is what the store holds: its manifest (by digest), and each
    # layer unpacked under the diff id its config names.
    manifest = requests.get(f"https://{address}/v2/tools/busybox/manifests/1", timeout=10,
                            verify=str(test_ca.path),
                            headers={"Accept": "application/vnd.oci.image.manifest.v1+json"})
    assert listed[0]["digest"] == manifest.headers["Docker-Content-Digest"]
    config = requests.get(f"https://{address}/v2/tools/busybox/blobs/"
                          f"{manifest.json()['config']['digest']}", timeout=10,
                          verify=str(test_ca.path)).json()
    diff_ids = config["rootfs"]["diff_ids"]
    assert diff_ids and listed[0]["layers"] == diff_ids
    for diff_id in diff_ids:
        assert (store / "layers" / "sha256" / diff_id.split(":", 1)[1] / "bin").is_dir()


def test_a_name_the_registry_does_not_have_is_refused_in_words(
    registry: tuple[str, Path], tmp_path: Path
) -> None:
    address, certs = registry
    store = tmp_path / "store"
    done = sealgate("image", "pull", f"{address}/nothing/here:1", "--cert-dir", str(certs),
                    "--store", str(store))
    assert done.returncode != 0
    assert "cannot pull" in done.stderr and "Traceback" not in done.stderr, done.stderr
    listed = json.loads(sealgate("image", "ls", "--json", "--store", str(store)).stdout)
    assert listed == []
