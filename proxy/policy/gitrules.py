"""Rules as of a git revision, for `sealgate rules diff OLD NEW -- PATH` (a pull request's base
and head): PATH (a rules file or directory, relative to the working directory) read from git's
objects, never from the work tree, and written under a temporary directory to load as the proxy
would."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .model import RulesError


def checkout(revision: str, path: str, into: Path) -> Path:
    """`path` as of `revision`, written at `into / path`; that path. Raises RulesError."""
    if revision.startswith("-") or not revision or "\n" in revision:
        raise RulesError(Path(path), None, "", f"not a git revision: {revision[:64]!r}")
    relative = Path(path)
    if relative.is_absolute() or ".." in relative.parts:
        raise RulesError(relative, None, "", "give the rules' path inside the repository, "
                         "relative to the working directory")
    spec = f"{revision}:./{relative.as_posix()}"
    kind = _git("cat-file", "-t", spec, what=spec).strip()
    target = into / relative
    if kind == "blob":
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(_git_bytes("show", spec, what=spec))
    elif kind == "tree":
        target.mkdir(parents=True, exist_ok=True)
        for name in _git("ls-tree", "--name-only", spec, what=spec).splitlines():
            # What load_rules reads of a directory: *.yaml and *.yml, no dotfiles.
            if not name.startswith(".") and name.endswith((".yaml", ".yml")) and "/" not in name:
                (target / name).write_bytes(_git_bytes("show", f"{spec}/{name}", what=spec))
    else:
        raise RulesError(relative, None, "", f"{spec} is a {kind}, not rules")
    return target


def _git(*args: str, what: str) -> str:
    return _git_bytes(*args, what=what).decode(errors="replace")


def _git_bytes(*args: str, what: str) -> bytes:
    try:
        done = subprocess.run(["git", *args], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RulesError(Path(what), None, "", f"git could not be run: {exc}") from None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise RulesError(Path(what), None, "",
                         f"git: {said[-1][:200] if said else 'failed'}")
    return done.stdout
