"""The asyncio client of `sealgate sandboxd`: `AsyncSandbox`, the same calls as the sync
`Sandbox` (sandbox/client.py, which shares its request bodies, results and errors), on aiohttp.

    async with AsyncSandbox.create("ci-bot") as sb:
        await sb.write("a.py", b"print(1)")
        result = await sb.run(["python3", "a.py"])

or `sb = await AsyncSandbox.create(...)` and `await sb.delete()` yourself.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Generator, Mapping, Sequence
from types import TracebackType
from typing import Any
from urllib.parse import quote

import aiohttp

from sealgate.reasons import Reason
from sealgate.sandbox.client import (
    DEFAULT_DAEMON,
    Collected,
    DaemonError,
    Result,
    create_body,
    error_of,
    event_of,
    exec_body,
    file_path,
    stream_cut,
)


class AsyncSandbox:
    def __init__(self, http: aiohttp.ClientSession, base: str, headers: Mapping[str, str],
                 info: dict[str, Any]) -> None:
        self._http = http
        self._base = base
        self._headers = dict(headers)
        self.info = info
        self.id: str = info["id"]

    @classmethod
    def create(cls, sandbox: str | None = None, *, policy: str | None = None,
               limits: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
               ttl: float | None = None, idle_timeout: float | None = None,
               isolation: str | None = None, daemon: str | None = None,
               key: str | None = None) -> _Creating:
        """Awaitable (the sandbox) and an async context manager (deleted on the way out)."""
        body = create_body(sandbox, policy=policy, limits=limits, env=env, ttl=ttl,
                           idle_timeout=idle_timeout, isolation=isolation)
        return _Creating(cls._create(body, daemon, key))

    @classmethod
    async def _create(cls, body: dict[str, Any], daemon: str | None,
                      key: str | None) -> AsyncSandbox:
        where = daemon or os.environ.get("SEALGATE_SANDBOXD") or DEFAULT_DAEMON
        key = key or os.environ.get("SEALGATE_SANDBOXD_KEY")
        if "://" in where:
            http = aiohttp.ClientSession()
            base = where.rstrip("/")
        else:
            http = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=where))
            base = "http://sandboxd"
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            info = await _json(http, "POST", base + "/v1/sandboxes", headers, body)
        except BaseException:
            await http.close()
            raise
        return cls(http, base, headers, info)

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, value: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.delete()

    async def delete(self) -> None:
        """Delete the sandbox (one already gone is fine) and close this client."""
        try:
            await _json(self._http, "DELETE", self._url(""), self._headers)
        except DaemonError as exc:
            if exc.reason not in (Reason.NO_SUCH_SANDBOX, Reason.SANDBOX_ENDED):
                raise
        finally:
            await self._http.close()

    def _url(self, tail: str) -> str:
        return f"{self._base}/v1/sandboxes/{quote(self.id, safe='')}{tail}"

    async def stream(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                     cwd: str | None = None, stdin: bytes | None = None,
                     timeout: float | None = 600.0) -> AsyncIterator[tuple[str, bytes | Result]]:
        body = exec_body(argv, env=env, cwd=cwd, stdin=stdin, timeout=timeout, stream=True)
        async with self._http.post(self._url("/exec"), json=body, headers=self._headers,
                                   timeout=aiohttp.ClientTimeout(total=None)) as response:
            if response.status >= 300:
                raise error_of(response.status, await response.read())
            async for line in response.content:
                name, data = event_of(line)
                yield name, data
                if name == "exit":
                    return
        raise stream_cut()

    async def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  cwd: str | None = None, stdin: bytes | None = None,
                  timeout: float | None = 600.0, check: bool = False) -> Result:
        collected = Collected(check)
        async for name, data in self.stream(argv, env=env, cwd=cwd, stdin=stdin,
                                            timeout=timeout):
            if (result := collected.add(name, data)) is not None:
                return result
        raise stream_cut()

    async def write(self, path: str, data: bytes, *, mode: int = 0o644) -> int:
        url = self._base + file_path(self.id, path) + f"?mode={mode:o}"
        async with self._http.put(url, data=bytes(data), headers=self._headers) as response:
            if response.status >= 300:
                raise error_of(response.status, await response.read())
            return int((await response.json())["size"])

    async def read(self, path: str) -> bytes:
        async with self._http.get(self._base + file_path(self.id, path),
                                  headers=self._headers) as response:
            if response.status >= 300:
                raise error_of(response.status, await response.read())
            return await response.read()


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


async def _json(http: aiohttp.ClientSession, method: str, url: str,
                headers: Mapping[str, str], body: Any = None) -> dict[str, Any]:
    try:
        async with http.request(method, url, json=body, headers=headers) as response:
            raw = await response.read()
            if response.status >= 300:
                raise error_of(response.status, raw)
    except aiohttp.ClientError as exc:
        raise DaemonError(f"the sandbox daemon cannot be reached: {exc}",
                          reason=Reason.AT_CAPACITY, status=0) from None
    answer = json.loads(raw)
    if not isinstance(answer, dict):
        raise DaemonError("the daemon answered with something other than an object",
                          reason=Reason.INTERNAL_ERROR, status=response.status)
    return answer
