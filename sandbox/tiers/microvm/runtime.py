"""The guest's own Python: the host's python3 and what the guest's agent imports of its standard
library, carried in the initramfs, for a VM that gets no share of the host's /usr.

A sandbox from an image needs nothing of the host's /usr: its commands run in the image's root.
Only the agent ran from the host's /usr over 9p, and a 9p share mounted in the guest is what
stops QEMU from saving a running VM (a migration blocker for as long as it is mounted): its
memory snapshot, and so its fork, need a guest whose every file is its own. So the initramfs
holds, under its /usr (which a host-root VM replaces by the 9p share, `guest/init.sh`):

- the interpreter and the shared libraries it and the included extension modules link (as
  `ldd` names them: merged /usr, so /lib/... is usr/lib/...);
- the standard library modules the agent's and the shim's modules import, found by importing
  them under that interpreter (`_FIND`);
- as byte code only, compiled by that interpreter with unchecked hashes: no source to read
  or stat, nothing to compile at import (the root is read-only: a compiled module could not
  be cached), tracebacks without source lines.

Nothing here is secret (the host's own programs and libraries), and it is read from the host's
fixed paths by root at image build time only.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from ...errors import SandboxError
from ...guest import staging

PYTHON = Path("/usr/bin/python3")
# Run by the interpreter itself: the standard library files the guest's modules need, each
# module's byte code written under `out`. What a module imports only inside a function is
# missed by importing it: the guest's own modules are read for every import they name, and
# the standard library's lazy ones the guest reaches are named (`_LAZY`: codecs found by name,
# such as tarfile's for a member's name; its compressions come with shutil's imports).
# Prints JSON: {"python": its real path, "stdlib": its directory, "modules": [byte code,
# relative], "extensions": [.so modules, absolute]}.
_FIND = r"""
import ast, importlib, json, os, py_compile, sys, sysconfig
guest, out, lazy, names = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4:]
stdlib = sysconfig.get_paths()["stdlib"]
sys.path.insert(0, guest)
named = set(lazy)
for name in names:
    with open(os.path.join(guest, "guest", name + ".py")) as fh:
        for node in ast.walk(ast.parse(fh.read())):
            if isinstance(node, ast.Import):
                named |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                named.add(node.module)
for name in sorted(named):
    importlib.import_module(name)
for name in names:
    importlib.import_module("guest." + name)
files = {getattr(m, "__file__", None) for m in list(sys.modules.values())} - {None}
modules, extensions = [], []
for path in sorted(f for f in files if f.startswith(stdlib + os.sep)):
    rel = os.path.relpath(path, stdlib)
    if path.endswith(".py"):
        target = os.path.join(out, rel[:-3] + ".pyc")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        py_compile.compile(path, cfile=target, dfile=path, doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        modules.append(rel[:-3] + ".pyc")
    else:
        extensions.append(path)
outside = sorted(f for f in files if not f.startswith((stdlib + os.sep, guest + os.sep)))
if outside:
    sys.exit("the guest's modules import outside the standard library: " + ", ".join(outside))
print(json.dumps({"python": os.path.realpath(sys.executable), "stdlib": stdlib,
                  "modules": modules, "extensions": extensions}))
"""
_LAZY = ("encodings.ascii", "encodings.latin_1")
_TIMEOUT = 120


def files() -> list[tuple[str, int, bytes]]:
    """The runtime's files as (path in the initramfs, mode, bytes), parents before children.
    Raises SandboxError."""
    guest_names = sorted({n.removesuffix(".py") for n in (*staging.VM_MODULES,
                                                           *staging.AGENT_MODULES)} - {"__init__"})
    with tempfile.TemporaryDirectory(prefix="sealgate-runtime-") as tmp:
        try:
            done = subprocess.run([str(PYTHON), "-I", "-S", "-c", _FIND,
                                   str(staging.HERE.parent), tmp, ",".join(_LAZY),
                                   *guest_names],
                                  capture_output=True, text=True, timeout=_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxError(f"cannot run {PYTHON} to find the guest's modules: {exc}") from None
        if done.returncode != 0:
            raise SandboxError(f"finding the guest's modules failed: {done.stderr.strip()[-400:]}")
        found = json.loads(done.stdout)
        stdlib = found["stdlib"]
        out: dict[str, tuple[int, bytes]] = {}
        for rel in found["modules"]:
            out[f"{_inside(stdlib)}/{rel}"] = (0o100644, (Path(tmp) / rel).read_bytes())
    python = Path(found["python"])
    out[_inside(str(PYTHON.parent / python.name))] = (0o100755, python.read_bytes())
    for ext in found["extensions"]:
        out[_inside(ext)] = (0o100644, Path(ext).read_bytes())
    for lib in sorted({lib for elf in (python, *map(Path, found["extensions"]))
                       for lib in _linked(elf)}):
        out[_inside(lib)] = (0o100755, Path(lib).resolve().read_bytes())
    out[_inside(str(PYTHON))] = (0o120777, python.name.encode())
    # Its place-dependent modules' directory, which the interpreter looks for at start (and
    # warns on stderr without), even when none of them is needed.
    dynload = f"{_inside(stdlib)}/lib-dynload"
    dirs = {dynload} | {str(Path(p).parent) for p in out}
    every = {d for path in dirs for d in (path, *map(str, Path(path).parents))
             if d not in (".", "usr")}
    return ([(d, 0o040755, b"") for d in sorted(every, key=lambda d: (d.count("/"), d))]
            + [(path, mode, data) for path, (mode, data) in sorted(out.items())])


def key() -> bytes:
    """What the runtime is made of, for the image's cache key: the interpreter's bytes (the
    standard library comes in the same upload of Debian's python3.x) and this module."""
    return PYTHON.resolve().read_bytes() + Path(__file__).read_bytes()


def _linked(elf: Path) -> list[str]:
    """The shared libraries `elf` loads, its program interpreter included, as `ldd` names
    them."""
    try:
        done = subprocess.run(["ldd", str(elf)], capture_output=True, text=True,
                              timeout=_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"cannot run ldd on {elf}: {exc}") from None
    libs = []
    for line in done.stdout.splitlines():
        parts = line.split()
        path = parts[2] if len(parts) >= 3 and parts[1] == "=>" else parts[0] if parts else ""
        if path.startswith("/"):
            libs.append(path)
    return libs


def _inside(path: str) -> str:
    """A host path's place in the initramfs: under usr/, as merged /usr puts it."""
    rel = path.lstrip("/")
    return rel if rel.startswith("usr/") else f"usr/{rel}"
