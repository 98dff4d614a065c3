"""The asyncio client of `sealgate sandboxd`: `AsyncSandbox`, the same calls as the sync
`Sandbox` (`client`; both on `clientshared`'s request bodies, results, errors and call
limits), on aiohttp.

    async with AsyncSandbox.create("ci-bot") as sb:
        await sb.write("a.py", b"print(1)")
        result = await sb.run(["python3", "a.py"])

or `sb = await AsyncSandbox.create(...)` and `await sb.delete()` yourself. Every call takes
`call_timeout` as the sync client's do (the whole call; CallTimeout past it).

Why one module of ~430 lines: it is `client`'s twin call for call (each method a few lines over
`clientshared`), kept in one place so that the two are read side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Generator, Mapping, Sequence
from types import TracebackType
from typing import Any
from urllib.parse import quote

import aiohttp

from sealgate.reasons import Reason

from .afiles import AsyncFiles
from .clientshared import (
    DEFAULT,
    DEFAULT_DAEMON,
    GRACE,
    TIMEOUT,
    CallLimit,
    Collected,
    DaemonError,
    Result,
    call_limit,
    create_body,
    error_of,
    event_of,
    exec_body,
    file_path,
    output_events,
    signed_url,
    stream_cut,
    timed_out,
    unreachable,
    update_body,
    url_request,
)
from .terminal import closed_early, ending, exec_message, resize_message


class AsyncSandbox:
    """A live sandbox of the daemon; `timeout` is the limit of a call that names none."""

    def __init__(self, http: aiohttp.ClientSession, base: str, headers: Mapping[str, str],
                 info: dict[str, Any], where: str) -> None:
        self._http = http
        self._base = base
        self._headers = dict(headers)
        self._where = where
        self.info = info
        self.id: str = info["id"]
        self.timeout: float | None = TIMEOUT

    @classmethod
    def create(cls, sandbox: str | None = None, *, policy: str | None = None,
               limits: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
               ttl: float | None = None, idle_timeout: float | None = None,
               isolation: str | None = None, image: str | None = None,
               metadata: Mapping[str, str] | None = None,
               idempotency_key: str | None = None, daemon: str | None = None,
               key: str | None = None, call_timeout: CallLimit = DEFAULT) -> _Creating:
        """Awaitable (the sandbox) and an async context manager (deleted on the way out); the
        arguments are `Sandbox.create`'s."""
        body = create_body(sandbox, policy=policy, limits=limits, env=env, ttl=ttl,
                           idle_timeout=idle_timeout, isolation=isolation, image=image,
                           metadata=metadata)
        once = {} if idempotency_key is None else {"Idempotency-Key": idempotency_key}
        return _Creating(cls._open("POST", "/v1/sandboxes", body, daemon=daemon, key=key,
                                   limit=call_limit(call_timeout, TIMEOUT), extra=once))

    @classmethod
    async def connect(cls, ident: str, *, daemon: str | None = None, key: str | None = None,
                      call_timeout: CallLimit = DEFAULT) -> AsyncSandbox:
        """A live sandbox by its id (`Sandbox.connect`)."""
        return await cls._open("GET", f"/v1/sandboxes/{quote(ident, safe='')}", None,
                               daemon=daemon, key=key,
                               limit=call_limit(call_timeout, TIMEOUT), extra={})

    @classmethod
    async def _open(cls, method: str, path: str, body: dict[str, Any] | None, *,
                    daemon: str | None, key: str | None, limit: float | None,
                    extra: Mapping[str, str]) -> AsyncSandbox:
        where = daemon or os.environ.get("SEALGATE_SANDBOXD") or DEFAULT_DAEMON
        key = key or os.environ.get("SEALGATE_SANDBOXD_KEY")
        http, base = _session(where)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            info = await _json(http, method, base + path, headers=headers | dict(extra),
                               limit=limit, where=where, body=body)
        except BaseException:
            await http.close()
            raise
        return cls(http, base, headers, info, where)

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, value: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.delete()

    async def delete(self, *, call_timeout: CallLimit = DEFAULT) -> None:
        """Delete the sandbox (one already gone is fine) and close this client."""
        try:
            await _json(self._http, "DELETE", self._url(""), headers=self._headers,
                        limit=call_limit(call_timeout, self.timeout), where=self._where)
        except DaemonError as exc:
            if exc.reason not in (Reason.NO_SUCH_SANDBOX, Reason.SANDBOX_ENDED):
                raise
        finally:
            await self._http.close()

    async def close(self) -> None:
        """Close this client's connections and leave the sandbox alive (a handle from
        `connect`, say, whose sandbox another caller deletes)."""
        await self._http.close()

    async def _call(self, tail: str, body: Mapping[str, Any] | None,
                    call_timeout: CallLimit, method: str = "POST") -> dict[str, Any]:
        return await _json(self._http, method, self._url(tail), headers=self._headers,
                           limit=call_limit(call_timeout, self.timeout), where=self._where,
                           body=body)

    async def update(self, *, ttl: float | None = None, idle_timeout: float | None = None,
                     metadata: Mapping[str, str] | None = None, sandbox: str | None = None,
                     call_timeout: CallLimit = DEFAULT) -> dict[str, Any]:
        """As `Sandbox.update`."""
        body = update_body(ttl=ttl, idle_timeout=idle_timeout, metadata=metadata,
                           sandbox=sandbox)
        self.info = await self._call("", body, call_timeout, "PATCH")
        return self.info

    async def snapshot(self, name: str | None = None, *,
                       call_timeout: CallLimit = DEFAULT) -> dict[str, Any]:
        """As `Sandbox.snapshot`: the new image's record."""
        return await self._call("/snapshot", {} if name is None else {"name": name},
                                call_timeout)

    async def fork(self, n: int, *, call_timeout: CallLimit = DEFAULT) -> list[AsyncSandbox]:
        """As `Sandbox.fork`: the copies, each with a client of its own (the caller deletes
        each, which closes it)."""
        made = await self._call("/fork", {"n": n}, call_timeout)
        return [AsyncSandbox(_session(self._where)[0], self._base, self._headers, info,
                             self._where) for info in made.get("sandboxes", [])]

    async def pause(self, *, call_timeout: CallLimit = DEFAULT) -> None:
        self.info = await self._call("/pause", None, call_timeout)

    async def resume(self, *, call_timeout: CallLimit = DEFAULT) -> None:
        self.info = await self._call("/resume", None, call_timeout)

    async def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                    cwd: str | None = None, stdin: bytes | None = None,
                    timeout: float | None = None,
                    call_timeout: CallLimit = DEFAULT) -> AsyncProcess:
        """As `Sandbox.start`: a command in the background, its handle at once."""
        body = exec_body(argv, env=env, cwd=cwd, stdin=stdin, timeout=timeout, stream=False)
        info = await self._call("/exec", {**body, "background": True}, call_timeout)
        return AsyncProcess(self, info)

    async def pty(self, rows: int = 24, cols: int = 80, argv: Sequence[str] | None = None, *,
                  env: Mapping[str, str] | None = None, cwd: str | None = None,
                  timeout: float | None = None,
                  call_timeout: CallLimit = DEFAULT) -> AsyncTerminal:
        """As `Sandbox.pty`: `argv` (a login shell by default) on a terminal inside."""
        limit = call_limit(call_timeout, self.timeout)
        try:
            ws = await self._http.ws_connect(self._url("/pty"), headers=self._headers,
                                             timeout=aiohttp.ClientWSTimeout(ws_close=limit))
        except aiohttp.WSServerHandshakeError as exc:  # its body unread: the reason's header
            reason = exc.headers.get("X-Sealgate-Error") if exc.headers else None
            said = json.dumps({"error": reason,
                               "detail": f"the daemon refused the terminal ({exc.status})"})
            raise error_of(exc.status, said.encode()) from None
        except aiohttp.ClientError as exc:
            raise unreachable(self._where, exc) from None
        await ws.send_str(json.dumps(exec_message(rows, cols, argv, env=env, cwd=cwd,
                                                  timeout=timeout)))
        return AsyncTerminal(ws)

    async def url(self, port: int, *, expires_in: float | None = None,
                  call_timeout: CallLimit = DEFAULT) -> str:
        """As `Sandbox.url`: a signed URL of `port` for a browser, no key needed."""
        return signed_url(await self._call("/urls", url_request(port, expires_in),
                                           call_timeout))

    def websocket(self, port: int, path: str = "/", *, headers: Mapping[str, str] | None = None,
                  call_timeout: CallLimit = DEFAULT
                  ) -> contextlib.AbstractAsyncContextManager[aiohttp.ClientWebSocketResponse]:
        """A WebSocket to the server the sandbox runs on `port`, through the daemon (its
        upgrade relayed). `call_timeout` bounds the handshake; DaemonError when refused."""
        return self._websocket(f"/ports/{int(port)}/{path.lstrip('/')}", headers, call_timeout)

    def tcp(self, port: int, *, call_timeout: CallLimit = DEFAULT
            ) -> contextlib.AbstractAsyncContextManager[aiohttp.ClientWebSocketResponse]:
        """A TCP connection to `port` in the sandbox, its bytes in binary messages both ways
        (at most 1 MiB each; an empty one ends our sending); closed when the server closes."""
        return self._websocket(f"/tcp/{int(port)}", None, call_timeout)

    @contextlib.asynccontextmanager
    async def _websocket(self, tail: str, headers: Mapping[str, str] | None,
                         call_timeout: CallLimit) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
        limit = call_limit(call_timeout, self.timeout)
        try:
            async with asyncio.timeout(limit):
                ws = await self._http.ws_connect(self._url(tail),
                                                 headers={**(headers or {}), **self._headers})
        except aiohttp.WSServerHandshakeError as exc:
            said = exc.headers.get("X-Sealgate-Error") if exc.headers is not None else None
            if said is None:
                raise  # the sandbox's server's own refusal, as it answered
            raise error_of(exc.status, json.dumps({"error": said, "detail": exc.message})
                           .encode()) from None
        except TimeoutError:
            raise timed_out(self._where, limit) from None
        except aiohttp.ClientError as exc:
            raise unreachable(self._where, exc) from None
        async with ws:
            yield ws

    def _url(self, tail: str) -> str:
        return f"{self._base}/v1/sandboxes/{quote(self.id, safe='')}{tail}"

    def _answer(self, method: str, url: str, limit: float | None,
                **send: Any) -> contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse]:
        return _answer(self._http, method, url, headers=self._headers, limit=limit,
                       where=self._where, **send)

    async def stream(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                     cwd: str | None = None, stdin: bytes | None = None,
                     timeout: float | None = 600.0, call_timeout: CallLimit = DEFAULT
                     ) -> AsyncIterator[tuple[str, bytes | Result]]:
        body = exec_body(argv, env=env, cwd=cwd, stdin=stdin, timeout=timeout, stream=True)
        limit = call_limit(call_timeout, None if timeout is None else timeout + GRACE)
        async with self._answer("POST", self._url("/exec"), limit, json=body) as response:
            async for line in response.content:
                name, data = event_of(line)
                yield name, data
                if name == "exit":
                    return
        raise stream_cut()

    async def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  cwd: str | None = None, stdin: bytes | None = None,
                  timeout: float | None = 600.0, check: bool = False,
                  call_timeout: CallLimit = DEFAULT) -> Result:
        collected = Collected(check)
        async for name, data in self.stream(argv, env=env, cwd=cwd, stdin=stdin,
                                            timeout=timeout, call_timeout=call_timeout):
            if (result := collected.add(name, data)) is not None:
                return result
        raise stream_cut()

    async def write(self, path: str, data: bytes, *, mode: int = 0o644,
                    call_timeout: CallLimit = DEFAULT) -> int:
        url = self._base + file_path(self.id, path) + f"?mode={mode:o}"
        answer = await _json(self._http, "PUT", url, headers=self._headers,
                             limit=call_limit(call_timeout, self.timeout), where=self._where,
                             data=bytes(data))
        return int(answer["size"])

    @property
    def files(self) -> AsyncFiles:
        """As `Sandbox.files`, each call awaited (`afiles.AsyncFiles`)."""
        return AsyncFiles(self)

    async def read(self, path: str, *, call_timeout: CallLimit = DEFAULT) -> bytes:
        async with self._answer("GET", self._base + file_path(self.id, path),
                                call_limit(call_timeout, self.timeout)) as response:
            return await response.read()


class AsyncProcess:
    """As `sealgate.sandbox.clients.process.Process`, for asyncio."""

    def __init__(self, sandbox: AsyncSandbox, info: dict[str, Any]) -> None:
        self._sandbox = sandbox
        self.pid = int(info["pid"])
        self.info = info
        self.offset = 0

    async def output(self, offset: int | None = None, *, follow: bool = False,
                     call_timeout: CallLimit = None) -> AsyncIterator[tuple[str, Any]]:
        """("stdout" | "stderr", bytes), ("lost", n), then ("exit", Result) once it ended."""
        start = self.offset if offset is None else offset
        url = self._sandbox._url(f"/processes/{self.pid}/output?offset={start}"
                                 f"&follow={'true' if follow else 'false'}")
        async with self._sandbox._answer("GET", url, call_limit(call_timeout, None)) as answer:
            async for line in answer.content:
                self.offset, events = output_events(line)
                for event in events:
                    yield event

    async def write(self, data: bytes, *, close: bool = False,
                    call_timeout: CallLimit = DEFAULT) -> None:
        url = self._sandbox._url(f"/processes/{self.pid}/stdin"
                                 f"?close={'true' if close else 'false'}")
        async with self._sandbox._answer("POST", url, call_limit(call_timeout, TIMEOUT),
                                         data=bytes(data)) as answer:
            self.info = await answer.json()

    async def wait(self, *, call_timeout: CallLimit = None) -> Result:
        status = await self._sandbox._call(f"/processes/{self.pid}/wait", None, call_timeout,
                                           "GET")
        return Result.of(status, b"", b"")

    async def signal(self, name: str = "TERM", *, call_timeout: CallLimit = DEFAULT) -> None:
        self.info = await self._sandbox._call(f"/processes/{self.pid}/signal",
                                              {"signal": name}, call_timeout)

    async def kill(self, *, call_timeout: CallLimit = DEFAULT) -> None:
        await self.signal("KILL", call_timeout=call_timeout)


class AsyncTerminal:
    """As `sealgate.sandbox.clients.terminal.Terminal`, for asyncio (aiohttp's WebSocket)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self.result: Result | None = None

    async def write(self, data: bytes) -> None:
        if data:
            await self._ws.send_bytes(bytes(data))

    async def resize(self, rows: int, cols: int) -> None:
        await self._ws.send_str(resize_message(rows, cols))

    async def read(self) -> bytes:
        """What the terminal shows next; b"" once it ended, its status in `result`."""
        while self.result is None:
            message = await self._ws.receive()
            if message.type == aiohttp.WSMsgType.BINARY:
                return bytes(message.data)
            if message.type != aiohttp.WSMsgType.TEXT:
                raise closed_early(self._ws.close_code)
            self.result = ending(message.data)
        return b""

    async def wait(self) -> Result:
        while await self.read():
            pass
        assert self.result is not None
        return self.result

    async def close(self) -> None:
        await self._ws.close()

    async def __aenter__(self) -> AsyncTerminal:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


def _session(where: str) -> tuple[aiohttp.ClientSession, str]:
    """A client session to the daemon at `where` (a URL or a unix socket's path) and the base
    URL its calls take."""
    if "://" in where:
        return aiohttp.ClientSession(), where.rstrip("/")
    return aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=where)), "http://sandboxd"


class _Creating:
    def __init__(self, pending: Any) -> None:
        self._pending = pending
        self._sandbox: AsyncSandbox | None = None

    def __await__(self) -> Generator[Any, None, AsyncSandbox]:
        return self._pending.__await__()  # type: ignore[no-any-return]

    async def __aenter__(self) -> AsyncSandbox:
        self._sandbox = await self._pending
        return self._sandbox

    async def __aexit__(self, kind: type[BaseException] | None, value: BaseException | None,
                        traceback: TracebackType | None) -> None:
        if self._sandbox is not None:
            await self._sandbox.delete()


@contextlib.asynccontextmanager
async def _answer(http: aiohttp.ClientSession, method: str, url: str, *,
                  headers: Mapping[str, str], limit: float | None, where: str,
                  **send: Any) -> AsyncIterator[aiohttp.ClientResponse]:
    """A call's answer, read within its limit (the whole call: aiohttp's `total`), or a
    DaemonError: a refusal, a daemon that cannot be reached, an answer cut, CallTimeout."""
    answered = False
    try:
        async with http.request(method, url, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=limit), **send) as response:
            if response.status >= 300:
                raise error_of(response.status, await response.content.read(1 << 16))
            answered = True
            yield response
    except TimeoutError:  # aiohttp's own time-outs are TimeoutErrors too
        raise timed_out(where, limit) from None
    except aiohttp.ClientError as exc:
        if answered:
            raise DaemonError(f"the daemon's answer was cut: {exc}",
                              reason=Reason.INTERNAL_ERROR, status=200) from None
        raise unreachable(where, exc) from None


async def _json(http: aiohttp.ClientSession, method: str, url: str, *,
                headers: Mapping[str, str], limit: float | None, where: str,
                body: Any = None, data: bytes | None = None) -> dict[str, Any]:
    send: dict[str, Any] = {"data": data} if data is not None else {"json": body}
    async with _answer(http, method, url, headers=headers, limit=limit, where=where,
                       **send) as response:
        raw = await response.read()
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise DaemonError("the daemon answered with something other than an object",
                          reason=Reason.INTERNAL_ERROR, status=response.status)
    return answer
