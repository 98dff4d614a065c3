"""What a request's JSON body may say, read and checked before anything is done with it: each
refusal a `BadRequest` (or a SessionError with its own reason) that says which field and why.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from typing import Any

from aiohttp import web

from sealgate.reasons import Reason

from ..errors import SandboxError
from ..guest.protocol import MAX_REQUEST, SIGNALS
from ..host.cgroup import CgroupError, Limits, parse_size
from .session import Command, SessionError

MAX_JSON = 24 << 20  # a command's stdin, base64'd, and its other fields
MAX_STDIN = 16 << 20
MAX_FILE = 1 << 30
MAX_ENV = 1024
MAX_CAPTURE = 16 << 20  # per stream, when the output is not streamed
_KEY = re.compile(r"[A-Za-z0-9_.\-/]{1,64}")
MAX_METADATA = 64
MAX_IDEMPOTENCY_KEY = 128
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
_MAX_PIDS = 1 << 22  # the kernel's PID_MAX_LIMIT
_MAX_MEMORY = 1 << 50
MAX_TIMEOUT = 7 * 24 * 3600.0  # a command's limit; None (no limit) is said as null



class BadRequest(SandboxError):
    reason = Reason.BAD_REQUEST


async def body(request: web.Request, allowed: set[str]) -> dict[str, Any]:
    try:
        body = await request.json(loads=json.loads)
    except web.HTTPRequestEntityTooLarge:
        raise SessionError("the request body is over its cap", reason=Reason.TOO_LARGE) \
            from None
    except (ValueError, UnicodeDecodeError):
        raise SessionError("the body must be a JSON object", reason=Reason.BAD_JSON) from None
    if not isinstance(body, dict):
        raise SessionError("the body must be a JSON object", reason=Reason.BAD_JSON)
    unknown = set(body) - allowed
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(sorted(unknown))[:200]}")
    return body


def number(body: dict[str, Any], name: str, default: float | None, *,
            low: float = 0.0, high: float = math.inf) -> float | None:
    value = body.get(name, default)
    if value is None:
        return None
    # Finite always (JSON as Python reads it has NaN and Infinity, and 1e400 is one): an
    # infinite limit is no limit, which is said as null where it is allowed at all.
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or not low <= value <= high:
        raise BadRequest(f"'{name}' must be a number of seconds from {low:g} to {high:g}")
    return float(value)


def env(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_ENV or not all(
            isinstance(k, str) and _NAME.fullmatch(k) and isinstance(v, str) and "\0" not in v
            for k, v in value.items()):
        raise BadRequest(f"'env' must map at most {MAX_ENV} names ([A-Za-z_][A-Za-z0-9_]*) "
                         "to strings without NUL")
    return dict(value)


def limits(value: Any) -> Limits:
    if value is None:
        return Limits()
    if not isinstance(value, dict) or set(value) - {"pids", "memory", "cpus"}:
        raise BadRequest("'limits' takes pids, memory and cpus")
    pids, memory, cpus = (value.get("pids", Limits.pids), value.get("memory", Limits.memory),
                          value.get("cpus", Limits.cpus))
    # Numbers as numbers: int() would take "12", True, 2.9 or fail on 1e400 with an
    # OverflowError no one catches.
    if not _whole(pids):
        raise BadRequest("limits: 'pids' must be a whole number")
    if not (_whole(memory) or isinstance(memory, str)):
        raise BadRequest("limits: 'memory' must be bytes or a size such as '2G'")
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int | float)
                             or not math.isfinite(cpus)):
        raise BadRequest("limits: 'cpus' must be a number or null")
    try:
        limits = Limits(pids=pids,
                        memory=parse_size(memory) if isinstance(memory, str) else memory,
                        cpus=None if cpus is None else float(cpus))
    except (TypeError, ValueError, OverflowError, CgroupError) as exc:
        raise BadRequest(f"limits: {exc}") from None
    # Above what the kernel takes, the cgroup write fails after the slot is taken (and lost).
    if limits.pids > _MAX_PIDS or limits.memory > _MAX_MEMORY:
        raise BadRequest(f"limits: at most {_MAX_PIDS} pids and {_MAX_MEMORY >> 40}T memory")
    return limits


def image(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= 256 or not value.isprintable():
        raise BadRequest("'image' must be an image's name or digest (sealgate image ls)")
    return value


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def command(body: dict[str, Any], default_timeout: float | None = 600.0) -> Command:
    argv = body.get("argv")
    # No count of its own: argv shares the agent's request (MAX_REQUEST, its JSON, checked as
    # it is sent) with env and cwd, and the kernel takes whatever fits in that. Each item is at
    # least 4 of those bytes (`"", `), so a longer list is refused before any work on it.
    if isinstance(argv, list) and len(argv) > MAX_REQUEST // 4:
        raise SessionError(f"argv, env and cwd together over {MAX_REQUEST} bytes",
                           reason=Reason.TOO_LARGE)
    if not isinstance(argv, list) or not argv or not all(
            isinstance(a, str) and "\0" not in a for a in argv):
        raise BadRequest("'argv' must be a list of at least one string without NUL")
    cwd = body.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/")
                            or "\0" in cwd):
        raise BadRequest("'cwd' must be an absolute path in the sandbox")
    try:
        stdin = base64.b64decode(body.get("stdin") or "", validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise BadRequest("'stdin' must be base64") from None
    if len(stdin) > MAX_STDIN:
        raise SessionError(f"stdin over {MAX_STDIN} bytes", reason=Reason.TOO_LARGE)
    return Command(argv=argv, env=env(body.get("env")), cwd=cwd, stdin=stdin,
                   timeout=number(body, "timeout", default_timeout, low=0.001,
                                  high=MAX_TIMEOUT))


def signal_name(value: Any) -> str:
    """A signal for a process's group, by name (`TERM` or `SIGTERM`; default KILL)."""
    name = "KILL" if value is None else value
    if isinstance(name, str) and name.upper().removeprefix("SIG") in SIGNALS:
        return name.upper().removeprefix("SIG")
    if name in ("STOP", "CONT", "SIGSTOP", "SIGCONT"):
        raise SessionError("STOP and CONT are not sent to one process: pause and resume the "
                           "sandbox to freeze it", reason=Reason.UNSUPPORTED)
    raise BadRequest(f"'signal' must be one of {', '.join(SIGNALS)}, not {str(name)[:20]!r}")


def metadata(value: Any) -> dict[str, str]:
    """A sandbox's labels: at most 64, names of letters, digits and `_.-/`, values printable."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_METADATA or not all(
            isinstance(k, str) and _KEY.fullmatch(k) and isinstance(v, str) and len(v) <= 512
            and v.isprintable() for k, v in value.items()):
        raise BadRequest(f"'metadata' must map at most {MAX_METADATA} names (1-64 of "
                         "A-Za-z0-9_.-/) to printable strings of at most 512 characters")
    return dict(value)


def idempotency_key(request: web.Request) -> str | None:
    """The create's `Idempotency-Key`, if it has one: printable ASCII, at most 128."""
    key = request.headers.get("Idempotency-Key")
    if key is not None and not (0 < len(key) <= MAX_IDEMPOTENCY_KEY and key.isascii()
                                and key.isprintable()):
        raise BadRequest(f"Idempotency-Key: 1 to {MAX_IDEMPOTENCY_KEY} printable ASCII "
                         "characters")
    return key


def metadata_filter(query: Any) -> dict[str, str]:
    """`?metadata.NAME=VALUE` (each must match); no other parameter."""
    wanted = {}
    for name, value in query.items():
        label = name.removeprefix("metadata.")
        if label == name or not _KEY.fullmatch(label):
            raise BadRequest(f"unknown parameter {name[:64]!r}: filter with metadata.NAME=VALUE")
        wanted[label] = value
    return wanted


async def raw(request: web.Request, cap: int) -> bytes:
    """The whole body, at most `cap` bytes (`too_large` past it). One `read(n)` would give
    whatever had arrived so far, not the body: a large one would be cut without a word."""
    data = bytearray()
    while chunk := await request.content.read(cap + 1 - len(data)):
        data += chunk
        if len(data) > cap:
            raise SessionError(f"a body over {cap} bytes", reason=Reason.TOO_LARGE)
    return bytes(data)
