"""The Python client of `sealgate sandboxd` (docs/sandbox-api.md), sync and asyncio:

    with Sandbox.create("ci-bot") as sb:
        sb.write("a.py", b"print(1)")
        result = sb.run(["python3", "a.py"])

    async with await AsyncSandbox.create("ci-bot") as sb:
        result = await sb.run(["pytest", "-q"])

The daemon is found at `daemon=` or `$SEALGATE_SANDBOXD`: a unix socket path (default
/run/sealgate/sandboxd.sock) or an `http(s)://host:port` URL, whose bearer key is `key=` or
`$SEALGATE_SANDBOXD_KEY`. The sync client uses only the standard library, so a harness (and the
CLI) pays nothing for aiohttp; the async one imports it when first used.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import os
import socket
import ssl
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlsplit

from sealgate.reasons import Reason, SealgateError

DEFAULT_DAEMON = "/run/sealgate/sandboxd.sock"
_TIMEOUT = 60.0


class DaemonError(SealgateError):
    """The daemon refused a call, or could not be reached: `reason` says which (a `Reason`;
    `code` its name), `status` the HTTP status (0: never answered)."""

    def __init__(self, message: str, *, reason: Reason, status: int) -> None:
        super().__init__(message, reason=reason)
        self.status = status

    @property
    def code(self) -> str:
        return self.reason.value


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
                idle_timeout: float | None, isolation: str | None = None) -> dict[str, Any]:
    name = sandbox or policy
    if not name:
        raise TypeError("name the sandbox id the rules know: Sandbox.create('ci-bot')")
    body: dict[str, Any] = {"sandbox": name}
    for key, value in (("limits", limits), ("env", env), ("ttl", ttl),
                       ("idle_timeout", idle_timeout), ("isolation", isolation)):
        if value is not None:
            body[key] = dict(value) if isinstance(value, Mapping) else value
    return body


def error_of(status: int, raw: bytes) -> DaemonError:
    try:
        body = json.loads(raw)
        reason = Reason.of(str(body["error"]))
        detail = str(body.get("detail", ""))
    except (ValueError, KeyError, TypeError):
        reason, detail = Reason.INTERNAL_ERROR, raw[:200].decode(errors="replace")
    return DaemonError(f"{reason.value}: {detail}", reason=reason, status=status)


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


class _Unix(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("sandboxd", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class Client:
    """One daemon; a connection per call (a unix socket costs next to nothing to open)."""

    def __init__(self, daemon: str | None = None, key: str | None = None,
                 timeout: float = _TIMEOUT) -> None:
        self.daemon = daemon or os.environ.get("SEALGATE_SANDBOXD") or DEFAULT_DAEMON
        self.key = key or os.environ.get("SEALGATE_SANDBOXD_KEY")
        self.timeout = timeout

    def _connection(self, timeout: float | None) -> http.client.HTTPConnection:
        wait = self.timeout if timeout is None else timeout
        if "://" not in self.daemon:
            return _Unix(self.daemon, wait)
        url = urlsplit(self.daemon)
        if url.scheme == "https":
            return http.client.HTTPSConnection(url.netloc, timeout=wait,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(url.netloc, timeout=wait)

    def _headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        headers = {"Content-Type": "application/json", **(extra or {})}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        return headers

    def open(self, method: str, path: str, body: bytes | None = None, *,
             headers: Mapping[str, str] | None = None,
             timeout: float | None = None) -> tuple[http.client.HTTPConnection,
                                                    http.client.HTTPResponse]:
        """The response, unread (the caller closes the connection); DaemonError for a refusal
        or a daemon that cannot be reached."""
        conn = self._connection(timeout)
        try:
            conn.request(method, path, body=body, headers=self._headers(headers))
            response = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise DaemonError(f"the sandbox daemon at {self.daemon} cannot be reached: {exc}",
                              reason=Reason.AT_CAPACITY, status=0) from None
        if response.status >= 300:
            raw = response.read(1 << 16)
            conn.close()
            raise error_of(response.status, raw)
        return conn, response

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None, *,
             timeout: float | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        conn, response = self.open(method, path, data, timeout=timeout)
        try:
            answer = json.loads(response.read())
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise DaemonError(f"the daemon's answer was cut or not JSON: {exc}",
                              reason=Reason.INTERNAL_ERROR, status=response.status) from None
        finally:
            conn.close()
        if not isinstance(answer, dict):
            raise DaemonError("the daemon answered with something other than an object",
                              reason=Reason.INTERNAL_ERROR, status=response.status)
        return answer

    def list(self) -> list[dict[str, Any]]:
        return list(self.call("GET", "/v1/sandboxes")["sandboxes"])

    def health(self) -> dict[str, Any]:
        try:
            return self.call("GET", "/v1/health")
        except DaemonError as exc:
            if exc.status == 503:
                return {"ready": False, "problem": str(exc)}
            raise


class Sandbox:
    """A live sandbox of the daemon; a context manager that deletes it on the way out."""

    def __init__(self, client: Client, info: dict[str, Any]) -> None:
        self.client = client
        self.info = info
        self.id: str = info["id"]

    @classmethod
    def create(cls, sandbox: str | None = None, *, policy: str | None = None,
               limits: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
               ttl: float | None = None, idle_timeout: float | None = None,
               isolation: str | None = None, daemon: str | None = None,
               key: str | None = None) -> Sandbox:
        """A new sandbox known to the proxy as `sandbox` (`policy` is the same field).
        `isolation` names the tier the caller requires; the daemon refuses another than its
        own (sandboxd --isolation) rather than run it weaker."""
        client = Client(daemon, key)
        body = create_body(sandbox, policy=policy, limits=limits, env=env, ttl=ttl,
                           idle_timeout=idle_timeout, isolation=isolation)
        return cls(client, client.call("POST", "/v1/sandboxes", body))

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.delete()

    def delete(self) -> None:
        """Delete the sandbox (everything of it); one already gone is fine."""
        try:
            self.client.call("DELETE", f"/v1/sandboxes/{quote(self.id, safe='')}")
        except DaemonError as exc:
            if exc.reason not in (Reason.NO_SUCH_SANDBOX, Reason.SANDBOX_ENDED):
                raise

    def refresh(self) -> dict[str, Any]:
        self.info = self.client.call("GET", f"/v1/sandboxes/{quote(self.id, safe='')}")
        return self.info

    def stream(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
               cwd: str | None = None, stdin: bytes | None = None,
               timeout: float | None = 600.0) -> Iterator[tuple[str, bytes | Result]]:
        """("stdout" | "stderr", bytes) as the command writes them, then ("exit", Result)."""
        body = json.dumps(exec_body(argv, env=env, cwd=cwd, stdin=stdin, timeout=timeout,
                                     stream=True)).encode()
        wait = None if timeout is None else timeout + 30
        conn, response = self.client.open(
            "POST", f"/v1/sandboxes/{quote(self.id, safe='')}/exec", body,
            timeout=wait if wait is not None else 24 * 3600.0)
        try:
            for line in response:
                name, data = event_of(line)
                yield name, data
                if name == "exit":
                    return
        except (OSError, http.client.HTTPException) as exc:
            raise DaemonError(f"the command's stream was cut: {exc}",
                              reason=Reason.INTERNAL_ERROR, status=200) from None
        finally:
            conn.close()
        raise stream_cut()

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            cwd: str | None = None, stdin: bytes | None = None, timeout: float | None = 600.0,
            check: bool = False) -> Result:
        """Run a command to its end: its output and how it ended (a CommandFailed for a
        non-zero exit with `check`)."""
        collected = Collected(check)
        for name, data in self.stream(argv, env=env, cwd=cwd, stdin=stdin, timeout=timeout):
            if (result := collected.add(name, data)) is not None:
                return result
        raise stream_cut()

    def write(self, path: str, data: bytes, *, mode: int = 0o644) -> int:
        """Write a file of the workspace (parents made); the bytes written."""
        conn, response = self.client.open(
            "PUT", f"{file_path(self.id, path)}?mode={mode:o}", bytes(data),
            headers={"Content-Type": "application/octet-stream"})
        try:
            return int(json.loads(response.read())["size"])
        finally:
            conn.close()

    def read(self, path: str) -> bytes:
        """A file of the workspace."""
        conn, response = self.client.open("GET", file_path(self.id, path))
        try:
            return response.read()
        finally:
            conn.close()


class CommandFailed(SealgateError):
    def __init__(self, result: Result) -> None:
        super().__init__(f"the command ended with {result.exit_code} ({result.ending})",
                         reason=Reason.BAD_REQUEST)
        self.result = result

