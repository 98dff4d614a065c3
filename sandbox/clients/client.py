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

Every call takes `call_timeout`: the seconds it may take in all, its answer read to the end
included (None: no limit). By default 60 s, and for a command its own `timeout` plus 30 s (the
daemon reports a command's time-out as its answer). Past it the call raises `CallTimeout`
(reason `client_timeout`), never the "cannot be reached" of a daemon that refused or was not
there; the connection is closed, and a command whose caller left is killed.

Why one module of ~450 lines: the connection, its deadline, the answer being read, `Client` and
`Sandbox` are one object graph that every call walks; what the two clients share is apart
(`clientshared`, `files`, `process`, `terminal`), and the asyncio one is `aclient`.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote, urlencode, urlsplit

from sealgate.reasons import Reason

from .clientshared import (
    DEFAULT,
    DEFAULT_DAEMON,
    GRACE,
    TIMEOUT,
    CallLimit,
    CallTimeout,
    Collected,
    CommandFailed,
    DaemonError,
    Result,
    call_limit,
    create_body,
    error_of,
    event_of,
    exec_body,
    file_path,
    signed_url,
    stream_cut,
    timed_out,
    unreachable,
    update_body,
    url_request,
)
from .files import Files
from .process import Process
from .terminal import Terminal, exec_message

__all__ = ["DEFAULT", "DEFAULT_DAEMON", "Answer", "CallLimit", "CallTimeout", "Client",
           "CommandFailed", "DaemonError", "Process", "Result", "Sandbox", "Terminal"]
_T = TypeVar("_T")

class _Unix(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float | None) -> None:
        super().__init__("sandboxd", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class _Deadline:
    """One call's limit, kept as socket time-outs: each wait is given what is left of it."""

    def __init__(self, seconds: float | None, where: str) -> None:
        self.seconds, self.where = seconds, where
        self._at = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float | None:
        if self._at is None:
            return None
        left = self._at - time.monotonic()
        if left <= 0:
            raise timed_out(self.where, self.seconds)
        return left


class Answer:
    """A call's answer as it is read, every read within the call's limit; a context manager
    that closes its connection."""

    def __init__(self, conn: http.client.HTTPConnection, sock: socket.socket,
                 response: http.client.HTTPResponse, deadline: _Deadline) -> None:
        self._conn, self._sock, self.response, self._deadline = conn, sock, response, deadline
        self.status = response.status

    def __enter__(self) -> Answer:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._conn.close()
        self.response.close()

    def _wait(self, read: Callable[[], _T]) -> _T:
        try:
            self._sock.settimeout(self._deadline.left())
            return read()
        except TimeoutError:  # the socket's, or the deadline's own CallTimeout
            raise timed_out(self._deadline.where, self._deadline.seconds) from None
        except (OSError, http.client.HTTPException) as exc:
            raise DaemonError(f"the daemon's answer was cut: {exc}", reason=Reason.INTERNAL_ERROR,
                              status=self.status) from None

    def read(self, most: int | None = None) -> bytes:
        """The body (its first `most` bytes), a chunk per wait so that none outlasts the limit."""
        got = bytearray()
        while most is None or len(got) < most:
            chunk = self._wait(lambda: self.response.read1(1 << 16))
            if not chunk:
                # read1 ends a body of a known length quietly when the connection closes
                # before it: what it still expected is a cut answer, never a whole one.
                if self.response.length:
                    raise DaemonError(f"the daemon's answer was cut: {self.response.length} "
                                      "bytes of its length missing",
                                      reason=Reason.INTERNAL_ERROR, status=self.status)
                break
            got += chunk
        return bytes(got if most is None else got[:most])

    def lines(self) -> Iterator[bytes]:
        while line := self._wait(self.response.readline):
            yield line

    def chunks(self) -> Iterator[bytes]:
        while chunk := self._wait(lambda: self.response.read1(1 << 16)):
            yield chunk


class Client:
    """One daemon; a connection per call (a unix socket costs next to nothing to open).
    `timeout` is the limit of a call that names none (None: no limit)."""

    def __init__(self, daemon: str | None = None, key: str | None = None,
                 timeout: float | None = TIMEOUT) -> None:
        self.daemon = daemon or os.environ.get("SEALGATE_SANDBOXD") or DEFAULT_DAEMON
        self.key = key or os.environ.get("SEALGATE_SANDBOXD_KEY")
        self.timeout = timeout

    def _connection(self, wait: float | None) -> http.client.HTTPConnection:
        if "://" not in self.daemon:
            return _Unix(self.daemon, wait)
        url = urlsplit(self.daemon)
        if url.scheme == "https":
            return http.client.HTTPSConnection(url.netloc, timeout=wait,
                                               context=ssl.create_default_context())
        return http.client.HTTPConnection(url.netloc, timeout=wait)

    def connect(self, wait: float | None) -> tuple[socket.socket, str, dict[str, str]]:
        """A connection of its own, its Host and the headers every call carries (a terminal's
        WebSocket: `terminal`)."""
        conn = self._connection(wait)
        conn.connect()
        return conn.sock, conn.host, self._headers()

    def _headers(self, extra: Mapping[str, str] | None = None, *,
                 forwarded: bool = False) -> dict[str, str]:
        # A port's request is the caller's own: no content type of ours goes with it.
        headers = {**({} if forwarded else {"Content-Type": "application/json"}), **(extra or {})}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        return headers

    def open(self, method: str, path: str, body: bytes | None = None, *,
             headers: Mapping[str, str] | None = None, forwarded: bool = False,
             call_timeout: CallLimit = DEFAULT) -> Answer:
        """The answer, its body unread (`with` it); DaemonError for a refusal or a daemon that
        cannot be reached, CallTimeout past the call's limit. `forwarded`: the answer may be a
        sandbox server's (a port route), whatever its status; only the daemon's own refusals
        (marked `X-Sealgate-Error`) raise."""
        deadline = _Deadline(call_limit(call_timeout, self.timeout), self.daemon)
        conn = self._connection(deadline.left())
        try:
            conn.request(method, path, body=body,
                         headers=self._headers(headers, forwarded=forwarded))
            # Kept: http.client lets go of its socket once the answer is to close it.
            sock = conn.sock
            sock.settimeout(deadline.left())
            response = conn.getresponse()
        except TimeoutError:
            conn.close()
            raise timed_out(deadline.where, deadline.seconds) from None
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise unreachable(self.daemon, exc) from None
        answer = Answer(conn, sock, response, deadline)
        if response.status >= 300 and (not forwarded or response.getheader("X-Sealgate-Error")):
            with answer:
                raise error_of(response.status, answer.read(1 << 16))
        return answer

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None, *,
             headers: Mapping[str, str] | None = None,
             call_timeout: CallLimit = DEFAULT) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        with self.open(method, path, data, headers=headers,
                       call_timeout=call_timeout) as answer:
            raw = answer.read()
        try:
            parsed = json.loads(raw)
        except ValueError as exc:
            raise DaemonError(f"the daemon's answer is not JSON: {exc}",
                              reason=Reason.INTERNAL_ERROR, status=answer.status) from None
        if not isinstance(parsed, dict):
            raise DaemonError("the daemon answered with something other than an object",
                              reason=Reason.INTERNAL_ERROR, status=answer.status)
        return parsed

    def list(self, *, metadata: Mapping[str, str] | None = None,
             call_timeout: CallLimit = DEFAULT) -> list[dict[str, Any]]:
        """The live sandboxes; with `metadata`, those whose labels have all of these."""
        query = urlencode({f"metadata.{k}": v for k, v in (metadata or {}).items()})
        return list(self.call("GET", "/v1/sandboxes" + (f"?{query}" if query else ""),
                              call_timeout=call_timeout)["sandboxes"])

    def health(self, *, call_timeout: CallLimit = DEFAULT) -> dict[str, Any]:
        try:
            return self.call("GET", "/v1/health", call_timeout=call_timeout)
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
               isolation: str | None = None, image: str | None = None,
               metadata: Mapping[str, str] | None = None,
               idempotency_key: str | None = None, daemon: str | None = None,
               key: str | None = None, call_timeout: CallLimit = DEFAULT) -> Sandbox:
        """A new sandbox known to the proxy as `sandbox` (`policy` is the same field).
        `isolation` names the tier the caller requires; the daemon refuses another than its
        own (sandboxd --isolation) rather than run it weaker. `image` names an image, template
        or snapshot of the daemon's store to be its root (default: the host's system
        directories, read-only). `metadata` labels it (`Client.list(metadata=...)` finds it). With
        an `idempotency_key`, a retry after a lost answer gets the sandbox the first call made.
        `call_timeout` is this call's (a cold create can take long: a microVM's boot)."""
        client = Client(daemon, key)
        body = create_body(sandbox, policy=policy, limits=limits, env=env, ttl=ttl,
                           idle_timeout=idle_timeout, isolation=isolation, image=image,
                           metadata=metadata)
        headers = None if idempotency_key is None else {"Idempotency-Key": idempotency_key}
        return cls(client, client.call("POST", "/v1/sandboxes", body, headers=headers,
                                       call_timeout=call_timeout))

    @classmethod
    def connect(cls, ident: str, *, daemon: str | None = None, key: str | None = None,
                call_timeout: CallLimit = DEFAULT) -> Sandbox:
        """A live sandbox by its id, made earlier by this caller or another (a harness that
        restarted, a second worker): DaemonError `no_such_sandbox` / `sandbox_ended` when it
        is not alive."""
        client = Client(daemon, key)
        return cls(client, client.call("GET", f"/v1/sandboxes/{quote(ident, safe='')}",
                                       call_timeout=call_timeout))

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.delete()

    def delete(self, *, call_timeout: CallLimit = DEFAULT) -> None:
        """Delete the sandbox (everything of it); one already gone is fine."""
        try:
            self.client.call("DELETE", f"/v1/sandboxes/{quote(self.id, safe='')}",
                             call_timeout=call_timeout)
        except DaemonError as exc:
            if exc.reason not in (Reason.NO_SUCH_SANDBOX, Reason.SANDBOX_ENDED):
                raise

    def update(self, *, ttl: float | None = None, idle_timeout: float | None = None,
               metadata: Mapping[str, str] | None = None, sandbox: str | None = None,
               call_timeout: CallLimit = DEFAULT) -> dict[str, Any]:
        """Change it while it runs: `ttl` seconds left from now, its idle timeout, its labels
        (all replaced), and who it is to the proxy (`sandbox`: another id of the rules, whose
        policy its next request meets)."""
        body = update_body(ttl=ttl, idle_timeout=idle_timeout, metadata=metadata,
                           sandbox=sandbox)
        self.info = self.client.call("PATCH", f"/v1/sandboxes/{quote(self.id, safe='')}", body,
                                     call_timeout=call_timeout)
        return self.info

    def snapshot(self, name: str | None = None, *,
                 call_timeout: CallLimit = DEFAULT) -> dict[str, Any]:
        """Its filesystem as an image of the store (its policy's alone): the image's record,
        whose "name" a create's `image` takes."""
        body = {} if name is None else {"name": name}
        return self.client.call("POST", f"/v1/sandboxes/{quote(self.id, safe='')}/snapshot",
                                body, call_timeout=call_timeout)

    def fork(self, n: int, *, call_timeout: CallLimit = DEFAULT) -> list[Sandbox]:
        """`n` sandboxes resumed from one memory snapshot of this one, each its own (id,
        address, randomness): the microVM tier's, of a sandbox from an image; elsewhere a
        DaemonError `unsupported` saying why. The caller deletes them."""
        made = self.client.call("POST", f"/v1/sandboxes/{quote(self.id, safe='')}/fork",
                                {"n": n}, call_timeout=call_timeout)
        return [Sandbox(self.client, info) for info in made.get("sandboxes", [])]

    def pause(self, *, call_timeout: CallLimit = DEFAULT) -> None:
        """Freeze every process of it (no CPU; its memory kept) until `resume`."""
        self.info = self.client.call("POST", f"/v1/sandboxes/{quote(self.id, safe='')}/pause",
                                     call_timeout=call_timeout)

    def resume(self, *, call_timeout: CallLimit = DEFAULT) -> None:
        self.info = self.client.call("POST", f"/v1/sandboxes/{quote(self.id, safe='')}/resume",
                                     call_timeout=call_timeout)

    def refresh(self, *, call_timeout: CallLimit = DEFAULT) -> dict[str, Any]:
        self.info = self.client.call("GET", f"/v1/sandboxes/{quote(self.id, safe='')}",
                                     call_timeout=call_timeout)
        return self.info

    def stream(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
               cwd: str | None = None, stdin: bytes | None = None,
               timeout: float | None = 600.0,
               call_timeout: CallLimit = DEFAULT) -> Iterator[tuple[str, bytes | Result]]:
        """("stdout" | "stderr", bytes) as the command writes them, then ("exit", Result).
        `timeout` is the command's (exit 124 past it), `call_timeout` this call's."""
        body = json.dumps(exec_body(argv, env=env, cwd=cwd, stdin=stdin, timeout=timeout,
                                     stream=True)).encode()
        limit = call_limit(call_timeout, None if timeout is None else timeout + GRACE)
        with self.client.open("POST", f"/v1/sandboxes/{quote(self.id, safe='')}/exec", body,
                              call_timeout=limit) as answer:
            for line in answer.lines():
                name, data = event_of(line)
                yield name, data
                if name == "exit":
                    return
        raise stream_cut()

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | None = None, stdin: bytes | None = None,
              timeout: float | None = None, idempotency_key: str | None = None,
              call_timeout: CallLimit = DEFAULT) -> Process:
        """A command in the background: its handle at once (`Process`: output from an offset,
        stdin, wait, kill). It runs until it ends, is killed, or the sandbox ends (`timeout`:
        a limit of its own, none by default). A retry with the same `idempotency_key` gets the
        same process."""
        body = exec_body(argv, env=env, cwd=cwd, stdin=stdin, timeout=timeout, stream=False)
        headers = None if idempotency_key is None else {"Idempotency-Key": idempotency_key}
        info = self.client.call("POST", f"/v1/sandboxes/{quote(self.id, safe='')}/exec",
                                {**body, "background": True}, headers=headers,
                                call_timeout=call_timeout)
        return Process(self.client, self.id, info)

    def pty(self, rows: int = 24, cols: int = 80, argv: Sequence[str] | None = None, *,
            env: Mapping[str, str] | None = None, cwd: str | None = None,
            timeout: float | None = None, call_timeout: CallLimit = DEFAULT) -> Terminal:
        """`argv` (by default a login shell) on a terminal of `rows` x `cols` inside the
        sandbox (`Terminal`: write, read, resize, wait); `call_timeout` bounds the opening."""
        message = exec_message(rows, cols, argv, env=env, cwd=cwd, timeout=timeout)
        return Terminal.open(self.client, f"/v1/sandboxes/{quote(self.id, safe='')}/pty",
                             message, call_limit(call_timeout, self.client.timeout))

    def port(self, port: int, path: str = "/", *, method: str = "GET", body: bytes | None = None,
             headers: Mapping[str, str] | None = None,
             call_timeout: CallLimit = DEFAULT) -> tuple[int, http.client.HTTPMessage, bytes]:
        """An HTTP request to `port` of the sandbox's own loopback, through the daemon (no one
        else can reach it): the server's status, headers and body, whatever the status. The
        headers are looked up by name in any case (`headers["content-type"]`), and a repeated
        one keeps every value (`headers.get_all("Set-Cookie")`). DaemonError `port_unreachable`
        when nothing there answers HTTP, or when its answer is cut short."""
        where = f"/v1/sandboxes/{quote(self.id, safe='')}/ports/{int(port)}/{path.lstrip('/')}"
        with self.client.open(method, where, body, headers=headers, forwarded=True,
                              call_timeout=call_timeout) as answer:
            return answer.status, answer.response.headers, answer.read()

    def url(self, port: int, *, expires_in: float | None = None,
            call_timeout: CallLimit = DEFAULT) -> str:
        """A URL of `port` to hand to a browser: signed for this sandbox and port, usable without
        the daemon's key until `expires_in` seconds from now (default: an hour, or the daemon's
        longest time to live if shorter), or the daemon's restart."""
        return signed_url(self.client.call(
            "POST", f"/v1/sandboxes/{quote(self.id, safe='')}/urls",
            url_request(port, expires_in), call_timeout=call_timeout))

    def processes(self, *, call_timeout: CallLimit = DEFAULT) -> list[Process]:
        """Its background processes (the ended ones it still keeps included)."""
        listed = self.client.call("GET", f"/v1/sandboxes/{quote(self.id, safe='')}/processes",
                                  call_timeout=call_timeout)
        return [Process(self.client, self.id, info) for info in listed["processes"]]

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            cwd: str | None = None, stdin: bytes | None = None, timeout: float | None = 600.0,
            check: bool = False, call_timeout: CallLimit = DEFAULT) -> Result:
        """Run a command to its end: its output and how it ended (a CommandFailed for a
        non-zero exit with `check`)."""
        collected = Collected(check)
        for name, data in self.stream(argv, env=env, cwd=cwd, stdin=stdin, timeout=timeout,
                                      call_timeout=call_timeout):
            if (result := collected.add(name, data)) is not None:
                return result
        raise stream_cut()

    def write(self, path: str, data: bytes, *, mode: int = 0o644,
              call_timeout: CallLimit = DEFAULT) -> int:
        """Write a file of the workspace (parents made); the bytes written."""
        with self.client.open("PUT", f"{file_path(self.id, path)}?mode={mode:o}", bytes(data),
                              headers={"Content-Type": "application/octet-stream"},
                              call_timeout=call_timeout) as answer:
            raw = answer.read()
        try:
            return int(json.loads(raw)["size"])
        except (ValueError, KeyError, TypeError):
            raise DaemonError("the daemon's answer to a write has no size",
                              reason=Reason.INTERNAL_ERROR, status=answer.status) from None

    @property
    def files(self) -> Files:
        """The workspace's files beyond write and read: list, stat, mkdir, remove, rename,
        directories as tar streams, watch (`files.Files`)."""
        return Files(self)

    def read(self, path: str, *, call_timeout: CallLimit = DEFAULT) -> bytes:
        """A file of the workspace."""
        with self.client.open("GET", file_path(self.id, path),
                              call_timeout=call_timeout) as answer:
            return answer.read()
