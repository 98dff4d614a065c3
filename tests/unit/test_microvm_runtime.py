"""The standalone initramfs's Python (`tiers/microvm/runtime`): with nothing of the host's but
those files, the interpreter starts and imports every module the guest's agent and shim run,
and the standard library's lazy ones they reach. Checked in a chroot of the files alone, as a
VM from an image has them (no /usr of the host's: `test_microvm_images` runs the real guest)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from sealgate.sandbox.guest import staging
from sealgate.sandbox.tiers.microvm import runtime

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root")


def _lay_out(root: Path) -> None:
    (root / "usr").mkdir()
    for name, mode, data in runtime.files():
        path = root / name
        if mode & 0o170000 == 0o040000:
            path.mkdir()
        elif mode & 0o170000 == 0o120000:
            path.symlink_to(data.decode())
        else:
            path.write_bytes(data)
            path.chmod(mode & 0o7777)
    for name in ("bin", "lib", "lib64"):  # merged /usr, as the initramfs has it
        (root / name).symlink_to(f"usr/{name}")
    guest = root / "sealgate" / staging.PACKAGE
    guest.mkdir(parents=True)
    for name in {*staging.VM_MODULES, *staging.AGENT_MODULES}:
        (guest / name).write_bytes((staging.HERE / name).read_bytes())


def test_the_guests_modules_run_on_the_runtime_alone(tmp_path: Path) -> None:
    _lay_out(tmp_path)
    modules = sorted({n.removesuffix(".py") for n in (*staging.VM_MODULES,
                                                       *staging.AGENT_MODULES)} - {"__init__"})
    script = ("import sys; sys.path.insert(0, '/sealgate')\n"
              f"for name in {modules!r}: __import__('guest.' + name)\n"
              "import io, tarfile\n"
              "for kind in ('gz', 'bz2', 'xz'):  # tarfile imports each only when asked\n"
              "    with tarfile.open(fileobj=io.BytesIO(), mode='w:' + kind): pass\n"
              "import codecs\n"
              "for name in ('ascii', 'latin-1'): codecs.lookup(name)  # imported when asked\n"
              "print(sys.prefix, len(sys.modules))\n")
    done = subprocess.run(["chroot", str(tmp_path), "/usr/bin/python3", "-I", "-S", "-c", script],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("/usr "), done.stdout
    assert done.stderr == ""  # no warning of a missing platform library directory


def test_the_runtime_is_byte_code_under_usr() -> None:
    names = [name for name, mode, _ in runtime.files() if mode & 0o170000 == 0o100000]
    assert not [n for n in names if n.endswith(".py")]
    assert "usr/lib/python3.11/json/__init__.pyc" in names
    assert all(n.startswith("usr/") for n in names)
