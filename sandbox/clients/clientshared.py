"""What the sandbox daemon's two clients share (`client`, sync, and `aclient`, asyncio):
request bodies, results, the stream's events, errors and call limits.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias
from urllib.parse import quote

from sealgate.reasons import Reason

from ..errors import SandboxError

DEFAULT_DAEMON = "/run/sealgate/sandboxd.sock"
TIMEOUT = 60.0  # a call's limit unless it names one (Client(timeout=...) changes it)
GRACE = 30.0  # an exec's: its command's timeout and this, for the answer after it


class _Default(enum.Enum):
    LIMIT = "the call's default limit"


DEFAULT = _Default.LIMIT
# A call_timeout: seconds, None (no limit) or DEFAULT (the call's own default).
CallLimit: TypeAlias = float | _Default | None


class DaemonError(SandboxError):
    """The daemon refused a call, or could not be reached: `reason` says which (a `Reason`;
    `code` its name), `status` the HTTP status (0: never answered)."""

    def __init__(self, message: str, *, reason: Reason, status: int) -> None:
        super().__init__(message, reason=reason)
        self.status = status

    @property
    def code(self) -> str:
        return self.reason.value


class CallTimeout(DaemonError, TimeoutError):
    """The call's own limit (`call_timeout`) passed before the daemon's answer ended; reason
    `client_timeout`, status 0. The daemon may have begun what was asked; a command whose
    caller left is killed by the daemon, a create run to its end and undone."""


def call_limit(given: CallLimit, default: float | None) -> float | None:
    return default if isinstance(given, _Default) else given


# Said as the daemon's refusals are (error_of): the reason first.
def timed_out(where: str, seconds: float | None) -> CallTimeout:
    return CallTimeout(f"client_timeout: no answer from the sandbox daemon at {where} within "
                       f"this call's {seconds:g} s (call_timeout)",
                       reason=Reason.CLIENT_TIMEOUT, status=0)


def unreachable(where: str, exc: BaseException) -> DaemonError:
    return DaemonError(f"at_capacity: the sandbox daemon at {where} cannot be reached: {exc}",
                       reason=Reason.AT_CAPACITY, status=0)


@dataclass(frozen=True)
class Result:
    """How a command ended. `exit_code` is None when it was lost (its supervisor inside the
    sandbox was killed); a signal shows as 128 + N, a timeout as 124 with `ending` "timed_out".
    """

    exit_code: int | None
    stdout: bytes = b""
    stderr: bytes = b""
    ending: str = "exit"  # exit | timed_out | killed | lost
    signal: int | None = None
    usage: Mapping[str, float] = field(default_factory=dict)
    duration_ms: float = 0.0
    error: str | None = None  # e.g. the command was not found
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")

    @classmethod
    def of(cls, status: Mapping[str, Any], stdout: bytes, stderr: bytes) -> Result:
        return cls(exit_code=status.get("exit"), stdout=stdout, stderr=stderr,
                   ending=str(status.get("ending", "exit")), signal=status.get("signal"),
                   usage=dict(status.get("usage") or {}),
                   duration_ms=float(status.get("duration_ms", 0.0)),
                   error=status.get("error"), truncated=bool(status.get("truncated", False)))


def exec_body(argv: Sequence[str], *, env: Mapping[str, str] | None, cwd: str | None,
              stdin: bytes | None, timeout: float | None, stream: bool) -> dict[str, Any]:
    if isinstance(argv, str):
        raise TypeError("argv is a list of strings, not one string (no shell is implied)")
    body: dict[str, Any] = {"argv": list(argv), "timeout": timeout, "stream": stream}
    if env:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    if stdin:
        body["stdin"] = base64.b64encode(stdin).decode()
    return body


def create_body(sandbox: str | None, *, policy: str | None, limits: Mapping[str, Any] | None,
                env: Mapping[str, str] | None, ttl: float | None,
                idle_timeout: float | None, isolation: str | None = None,
                image: str | None = None,
                metadata: Mapping[str, str] | None = None) -> dict[str, Any]:
    name = sandbox or policy
    if not name:
        raise TypeError("name the sandbox id the rules know: Sandbox.create('ci-bot')")
    body: dict[str, Any] = {"sandbox": name}
    for key, value in (("limits", limits), ("env", env), ("ttl", ttl),
                       ("idle_timeout", idle_timeout), ("isolation", isolation),
                       ("image", image), ("metadata", metadata)):
        if value is not None:
            body[key] = dict(value) if isinstance(value, Mapping) else value
    return body


def update_body(**fields: Any) -> dict[str, Any]:
    """A PATCH of a sandbox: the fields given, no others."""
    body = {k: dict(v) if isinstance(v, Mapping) else v for k, v in fields.items()
            if v is not None}
    if not body:
        raise TypeError("say what to change: ttl, idle_timeout, metadata or sandbox")
    return body


def error_of(status: int, raw: bytes) -> DaemonError:
    try:
        body = json.loads(raw)
        reason = Reason.of(str(body["error"]))
        detail = str(body.get("detail", ""))
    except (ValueError, KeyError, TypeError):
        reason, detail = Reason.INTERNAL_ERROR, raw[:200].decode(errors="replace")
    return DaemonError(f"{reason.value}: {detail}", reason=reason, status=status)


def url_request(port: int, expires_in: float | None) -> dict[str, Any]:
    """A signed URL call's body: the daemon's default lifetime unless one is asked for."""
    return {"port": port} if expires_in is None else {"port": port, "expires_in": expires_in}


def signed_url(answer: dict[str, Any]) -> str:
    """A signed URL call's URL: absolute when asked over TCP; over the unix socket, whose
    address no browser can use, its path (for whatever serves the daemon to the browser)."""
    return str(answer.get("url") or answer["path"])


def event_of(line: bytes) -> tuple[str, bytes | Result]:
    """One line of an exec's stream: ("stdout" | "stderr", bytes) or ("exit", Result)."""
    try:
        event = json.loads(line)
        if "exit" in event:
            return "exit", Result.of(event, b"", b"")
        name = "stdout" if "stdout" in event else "stderr"
        return name, base64.b64decode(event[name])
    except (ValueError, KeyError, TypeError, AttributeError):
        raise DaemonError("the daemon's stream held a line that is not an event",
                          reason=Reason.INTERNAL_ERROR, status=200) from None


def output_events(line: bytes) -> tuple[int, list[tuple[str, Any]]]:
    """One line of a background process's output (`.../output`): the offset it ends at and
    its events: ("lost", n), ("exit", Result), ("stdout" | "stderr", bytes)."""
    try:
        event = json.loads(line)
        offset = int(event["offset"])
        events: list[tuple[str, Any]] = []
        if "lost" in event:
            events.append(("lost", int(event["lost"])))
        elif "exit" in event:
            events.append(("exit", Result.of(event, b"", b"")))
        for name in ("stdout", "stderr"):
            if name in event:
                data = base64.b64decode(event[name])
                offset += len(data)
                events.append((name, data))
    except (ValueError, KeyError, TypeError, AttributeError):
        raise DaemonError("the daemon's output held a line that is not an event",
                          reason=Reason.INTERNAL_ERROR, status=200) from None
    return offset, events


def stream_cut() -> DaemonError:
    return DaemonError("the command's stream ended without its exit status",
                       reason=Reason.INTERNAL_ERROR, status=200)


class Collected:
    """A command's output gathered as it streams; its Result, output included, at the end."""

    def __init__(self, check: bool) -> None:
        self._check = check
        self._out, self._err = bytearray(), bytearray()

    def add(self, name: str, data: bytes | Result) -> Result | None:
        if isinstance(data, Result):
            result = dataclasses.replace(data, stdout=bytes(self._out), stderr=bytes(self._err))
            if self._check and not result.ok:
                raise CommandFailed(result)
            return result
        (self._out if name == "stdout" else self._err).extend(data)
        return None


def file_path(ident: str, path: str) -> str:
    return f"/v1/sandboxes/{quote(ident, safe='')}/files/{quote(path.lstrip('/'), safe='/')}"


class CommandFailed(SandboxError):
    def __init__(self, result: Result) -> None:
        super().__init__(f"the command ended with {result.exit_code} ({result.ending})",
                         reason=Reason.BAD_REQUEST)
        self.result = result

