"""Where each sealgate.* module lives in the repository, read from pyproject's package-dir.

The parts sit at the top (proxy/, issuer/, sandbox/) and install under sealgate.*; the mapping
is declared once, in pyproject.toml. Tests that walk the source (the import graph, the wheel's
contents) read it here instead of assuming a folder is named as its package.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path


def package_dirs(root: Path) -> dict[str, Path]:
    """Package -> folder: pyproject's package-dir, or `sealgate/` itself in a tree without one."""
    pyproject = root / "pyproject.toml"
    if not pyproject.exists():
        return {"sealgate": root / "sealgate"}
    mapping = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-dir"]
    return {package: root / folder for package, folder in mapping.items()}


def modules(root: Path, top: str = "sealgate") -> dict[str, Path]:
    """Module name -> file for every .py installed under `top` (or, for tests/ and bench/,
    found in that folder)."""
    dirs = package_dirs(root) if top == "sealgate" else {top: root / top}
    found: dict[str, Path] = {}
    for package, folder in dirs.items():
        for directory, subdirs, files in os.walk(folder):
            subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
            inner = Path(directory).relative_to(folder).parts
            for name in files:
                if name.endswith(".py"):
                    stem = name[:-3]
                    parts = (*package.split("."), *inner)
                    if stem != "__init__":
                        parts = (*parts, stem)
                    found[".".join(parts)] = Path(directory) / name
    return found
