"""The built wheel, installed beside a package that claims the top-level name `proxy`.

proxy.py (PyPI) installs a top-level `proxy` package; sealgate's folders are called proxy/,
issuer/ and sandbox/ in the repository but install as sealgate.proxy, sealgate.issuer and
sealgate.sandbox. This builds the wheel (offline: --no-build-isolation, --no-index), installs it
into a fresh venv after a local stand-in for proxy.py (a wheel with `proxy/__init__.py`, which
is exactly the collision; the suite never reaches the network), and runs `sealgate --help` and
`sealgate proxy` with one request through it, from a directory outside the repository.

The venv gets its dependencies from the test venv's site-packages through a directory of
links that leaves sealgate's own editable install out, so nothing is downloaded and the test
venv is never written to.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.conftest import KEYS
from tests.harness import ROOT, Origin, free_port, key_digest
from tests.layout import modules, package_dirs

# What pip must not see of the test venv: sealgate's editable install.
_OWN = ("sealgate", "__editable__.sealgate", "__editable___sealgate")


@dataclass(frozen=True)
class Venv:
    root: Path
    wheel: Path

    def bin(self, name: str) -> str:
        return str(self.root / "bin" / name)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        return {**env, "PATH": f"{self.root / 'bin'}:{env.get('PATH', '')}",
                "PYTHONUNBUFFERED": "1"}


def _run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


def _build_wheel(work: Path) -> Path:
    # From a copy: building in the repository would leave build/ and egg-info there, and two
    # runs at once would share them.
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for folder in {path.relative_to(ROOT) for path in package_dirs(ROOT).values()}:
        shutil.copytree(ROOT / folder, src / folder, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    out = work / "dist"
    _run(sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
         "--no-index", "--disable-pip-version-check", "-q", "-w", str(out), cwd=work)
    [wheel] = out.glob("sealgate-*.whl")
    return wheel


def _stand_in_proxy_py(work: Path) -> Path:
    """A wheel named like proxy.py whose `proxy` package says whose it is."""
    files = {"proxy/__init__.py": b'OWNER = "proxy.py"\n',
             "proxy_py-2.4.4.dist-info/METADATA":
                 b"Metadata-Version: 2.1\nName: proxy.py\nVersion: 2.4.4\n",
             "proxy_py-2.4.4.dist-info/WHEEL":
                 b"Wheel-Version: 1.0\nGenerator: sealgate-tests\nRoot-Is-Purelib: true\n"
                 b"Tag: py3-none-any\n"}
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("proxy_py-2.4.4.dist-info/RECORD,,")
    path = work / "proxy.py-2.4.4-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr("proxy_py-2.4.4.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def _dependencies(work: Path) -> Path:
    """The test venv's site-packages as links, less sealgate itself."""
    deps = work / "deps"
    deps.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    for entry in site.iterdir():
        if not entry.name.startswith(_OWN) and entry.suffix != ".pth":
            (deps / entry.name).symlink_to(entry)
    return deps


def _can_build() -> bool:
    """setuptools with its own bdist_wheel (70.1 on), or the `wheel` package: without either
    a wheel cannot be built offline. (Looked up, not imported: importing setuptools would
    install its distutils shim in this process.)"""
    spec = importlib.util.find_spec("setuptools")
    own = spec is not None and spec.origin is not None and (
        Path(spec.origin).parent / "command" / "bdist_wheel.py").exists()
    return own or importlib.util.find_spec("wheel") is not None


@pytest.fixture(scope="session")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    if not _can_build():
        pytest.skip("neither setuptools >= 70.1 nor wheel in the test venv: no offline build")
    work = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(work)
    root = work / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", str(root), cwd=work)
    python = root / "bin" / "python"
    purelib = _run(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                   cwd=work).strip()
    (Path(purelib) / "sealgate-test-deps.pth").write_text(f"{_dependencies(work)}\n")
    # proxy.py first: were sealgate to install a top-level `proxy`, it would overwrite it.
    for package in (_stand_in_proxy_py(work), wheel):
        _run(sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
             "--no-index", "--disable-pip-version-check", "-q", str(package), cwd=work)
    return Venv(root, wheel)


def test_the_wheel_claims_no_generic_top_level_name(venv: Venv) -> None:
    with zipfile.ZipFile(venv.wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"sealgate", "sealgate-0.1.0.dist-info"}, tops
    top_level = [n for n in names if n.endswith("top_level.txt")]
    if top_level:
        with zipfile.ZipFile(venv.wheel) as archive:
            assert archive.read(top_level[0]).decode().split() == ["sealgate"]


def test_the_wheel_has_every_module(venv: Venv) -> None:
    # A subpackage missing from pyproject's list would install without its modules.
    with zipfile.ZipFile(venv.wheel) as archive:
        packed = {n for n in archive.namelist() if n.endswith(".py")}
    source = set()
    for module, path in modules(ROOT).items():
        stem = "/__init__.py" if path.name == "__init__.py" else ".py"
        source.add(module.replace(".", "/") + stem)
    assert source - packed == set()
    with zipfile.ZipFile(venv.wheel) as archive:
        assert "sealgate/clients/sealgate.mjs" in archive.namelist()  # package data too


def test_installed_beside_proxy_py_each_keeps_its_own(venv: Venv, tmp_path: Path) -> None:
    script = ("import proxy, sealgate, sealgate.proxy.process.master; "
              "print(proxy.OWNER); print(sealgate.__file__)")
    owner, where = _run(venv.bin("python"), "-c", script, cwd=tmp_path, env=venv.env()).split()
    assert owner == "proxy.py"
    assert Path(where).is_relative_to(venv.root)


def test_sealgate_help_from_the_wheel(venv: Venv, tmp_path: Path) -> None:
    out = _run(venv.bin("sealgate"), "--help", cwd=tmp_path, env=venv.env())
    for command in ("proxy", "rules", "sandbox", "mint"):
        assert command in out


@pytest.fixture()
def origin() -> Iterator[Origin]:
    server = Origin()
    yield server
    server.stop()


def test_sealgate_proxy_from_the_wheel_serves_a_request(
    venv: Venv, origin: Origin, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(f"""
version: 1
policies:
  ci:
    allow:
      - host: 127.0.0.1
        ports: [{origin.port}]
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
default_policy: null
""")
    port = free_port()
    stderr = tmp_path / "proxy.stderr"
    with stderr.open("wb") as sink:
        process = subprocess.Popen(
            [venv.bin("sealgate"), "proxy", "--listen", f"127.0.0.1:{port}",
             "--rules", str(rules), "--state", str(tmp_path / "state")],
            cwd=tmp_path, env=venv.env(), stdout=subprocess.DEVNULL, stderr=sink,
        )
    try:
        deadline = time.monotonic() + 30
        while "sealgate proxy ready" not in stderr.read_text(errors="replace"):
            assert process.poll() is None, stderr.read_text(errors="replace")
            assert time.monotonic() < deadline, stderr.read_text(errors="replace")
            time.sleep(0.05)
        session = requests.Session()
        session.trust_env = False
        url = f"http://bot-1:{KEYS['bot-1']}@127.0.0.1:{port}"
        session.proxies = {"http": url}
        answer = session.get(f"http://127.0.0.1:{origin.port}/through-the-wheel", timeout=10)
        assert answer.status_code == 200, answer.text
        assert origin.requests[-1].path == "/through-the-wheel"
    finally:
        process.terminate()
        process.wait(timeout=15)
    assert process.returncode == 0, stderr.read_text(errors="replace")
