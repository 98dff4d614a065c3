"""What the issuer's commands share: how an error is reported, JSON output, durations, and
reading a secret.

Secrets are read from stdin, a file or an environment variable, never from argv (which any local
user can read in the process table), and no output of these commands ever contains one.
"""

from __future__ import annotations

import getpass
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final

from sealgate import credentials as tk
from sealgate.credentials import keys
from sealgate.credentials import processors as pr
from sealgate.files import read_regular
from sealgate.reasons import Reason, SealgateError

from . import callers

__all__ = ["CliError", "emit_json", "format_age", "parse_duration", "read_source", "run"]

_MAX_SECRET_BYTES: Final = pr.MAX_SECRET_LENGTH * 4


class CliError(SealgateError):
    """A problem with what the user asked for; printed as one line, exit status 1."""

    reason = Reason.INVALID_REQUEST


# --- durations ------------------------------------------------------------------------------


def parse_duration(text: str) -> int:
    """Seconds in "900", "15m", "1h30m", "2d" (units s, m, h, d)."""
    try:
        return callers.parse_duration(text)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def format_age(seconds: int) -> str:
    """The two largest units: '3d4h', '2h5m', '7m30s', '12s'."""
    remaining = max(0, seconds)
    parts: list[str] = []
    for unit in ("d", "h", "m", "s"):
        count, remaining = divmod(remaining, callers.UNIT_SECONDS[unit])
        if count or parts or unit == "s":
            parts.append(f"{count}{unit}")
    return "".join(parts[:2])


# --- secrets --------------------------------------------------------------------------------


def _strip_newline(text: str) -> str:
    # Files and here-strings end in one newline that is not part of the secret.
    if text.endswith("\r\n"):
        return text[:-2]
    return text.removesuffix("\n")


def _read_stdin(what: str) -> str:
    if sys.stdin.isatty():
        return getpass.getpass(f"{what}: ")
    data = sys.stdin.buffer.read(_MAX_SECRET_BYTES + 3)
    return _decode(data, f"{what} on stdin")


def _decode(data: bytes, where: str) -> str:
    if len(data) > _MAX_SECRET_BYTES + 2:
        raise CliError(f"{where} is too long")
    try:
        return _strip_newline(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise CliError(f"{where} is not UTF-8") from None


def _read_file(path: Path, what: str) -> str:
    try:
        data, _ = read_regular(path, _MAX_SECRET_BYTES + 2)
    except OSError as exc:
        raise CliError(f"cannot read {what} file {path}: {exc.strerror}") from None
    return _decode(data, f"{what} file {path}")


def _read_env(name: str, what: str) -> str:
    value = os.environ.get(name)
    if value is None:
        raise CliError(f"environment variable {name} (for the {what}) is not set")
    return value


def read_source(stdin: bool, file: Path | None, env: str | None, what: str) -> str | None:
    """The `what` from whichever source its options name (stdin, a file, an environment
    variable), or None if they name none. An empty value is an error."""
    if stdin:
        value = _read_stdin(what)
    elif file is not None:
        value = _read_file(file, what)
    elif env is not None:
        value = _read_env(env, what)
    else:
        return None
    if not value:
        raise CliError(f"the {what} is empty")
    return value


# --- output ---------------------------------------------------------------------------------


def emit_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def run(command: str, body: Callable[[], int]) -> int:
    """`body()`'s exit status; an error the user can act on is one line on stderr and status 1
    (anything else is a bug and keeps its traceback)."""
    try:
        return body()
    except (
        CliError,
        tk.TokenError,
        pr.InjectionError,
        keys.KeyFileError,
        callers.CallersFileError,
    ) as exc:
        sys.stderr.write(f"sealgate {command}: error: {exc}\n")
        return 1
