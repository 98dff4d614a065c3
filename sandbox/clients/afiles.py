"""`sb.files` of the asyncio client: the sync client's `files.Files`, each call awaited, on
the same routes, entries and events (`fsshared`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, Protocol

import aiohttp

from sealgate.reasons import Reason

from .clientshared import DEFAULT, CallLimit, DaemonError, call_limit
from .fsshared import SPOOL, Entry, WatchEvent, clean, json_object, pack, route, unpack


class _AsyncSandbox(Protocol):
    """What of `aclient.AsyncSandbox` the files use (that module imports this one)."""

    id: str
    timeout: float | None
    _base: str

    def _answer(self, method: str, url: str, limit: float | None, **send: Any
                ) -> contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse]: ...

    async def read(self, path: str, *, call_timeout: CallLimit = DEFAULT) -> bytes: ...

    async def write(self, path: str, data: bytes, *, mode: int = 0o644,
                    call_timeout: CallLimit = DEFAULT) -> int: ...


class AsyncFiles:
    def __init__(self, sandbox: _AsyncSandbox) -> None:
        self._sb = sandbox

    def _url(self, tail: str, **query: Any) -> str:
        return self._sb._base + route(self._sb.id, tail, **query)

    def _limit(self, call_timeout: CallLimit) -> float | None:
        return call_limit(call_timeout, self._sb.timeout)

    async def _json(self, method: str, tail: str, body: dict[str, Any] | None = None,
                    call_timeout: CallLimit = DEFAULT, **query: Any) -> dict[str, Any]:
        async with self._sb._answer(method, self._url(tail, **query), self._limit(call_timeout),
                                    **({} if body is None else {"json": body})) as response:
            return json_object(await response.read())

    async def list(self, path: str = "", *, call_timeout: CallLimit = DEFAULT) -> list[Entry]:
        answer = await self._json("GET", "/fs/list", call_timeout=call_timeout,
                                  path=clean(path))
        return [Entry.of(raw) for raw in answer.get("entries", [])]

    async def stat(self, path: str, *, call_timeout: CallLimit = DEFAULT) -> Entry:
        return Entry.of(await self._json("GET", "/fs/stat", call_timeout=call_timeout,
                                         path=clean(path)))

    async def exists(self, path: str, *, call_timeout: CallLimit = DEFAULT) -> bool:
        try:
            await self.stat(path, call_timeout=call_timeout)
        except DaemonError as exc:
            if exc.reason is Reason.NO_SUCH_FILE:
                return False
            raise
        return True

    async def mkdir(self, path: str, *, parents: bool = False, mode: int = 0o755,
                    call_timeout: CallLimit = DEFAULT) -> bool:
        answer = await self._json("POST", "/fs/mkdir", {"path": clean(path), "mode": f"{mode:o}",
                                                        "parents": parents}, call_timeout)
        return bool(answer.get("created"))

    async def remove(self, path: str, *, recursive: bool = False,
                     call_timeout: CallLimit = DEFAULT) -> None:
        await self._json("DELETE", "/fs", call_timeout=call_timeout, path=clean(path),
                         recursive=recursive)

    async def rename(self, source: str, target: str, *,
                     call_timeout: CallLimit = DEFAULT) -> None:
        await self._json("POST", "/fs/rename", {"from": clean(source), "to": clean(target)},
                         call_timeout)

    async def read(self, path: str, *, call_timeout: CallLimit = DEFAULT) -> bytes:
        return await self._sb.read(path, call_timeout=call_timeout)

    async def write(self, path: str, data: bytes, *, mode: int = 0o644,
                    call_timeout: CallLimit = DEFAULT) -> int:
        return await self._sb.write(path, data, mode=mode, call_timeout=call_timeout)

    async def upload_tar(self, data: bytes, path: str = "", *,
                         call_timeout: CallLimit = DEFAULT) -> dict[str, Any]:
        """As `Files.upload_tar`."""
        async with self._sb._answer("PUT", self._url("/tar", path=clean(path)),
                                    self._limit(call_timeout), data=data) as response:
            return json_object(await response.read())

    async def upload_dir(self, local: str | os.PathLike[str], path: str = "", *,
                         call_timeout: CallLimit = DEFAULT) -> dict[str, Any]:
        archive = await asyncio.to_thread(pack, local)
        with archive:
            return await self.upload_tar(archive.read(), path, call_timeout=call_timeout)

    async def download_tar(self, path: str = "", *,
                           call_timeout: CallLimit = DEFAULT) -> bytes:
        async with self._sb._answer("GET", self._url("/tar", path=clean(path)),
                                    self._limit(call_timeout)) as response:
            return await response.read()

    async def download_dir(self, path: str, local: str | os.PathLike[str], *,
                           call_timeout: CallLimit = DEFAULT) -> None:
        """As `Files.download_dir`: unpacked here as hostile input."""
        with tempfile.SpooledTemporaryFile(SPOOL) as spool:
            async with self._sb._answer("GET", self._url("/tar", path=clean(path)),
                                        self._limit(call_timeout)) as response:
                async for chunk in response.content.iter_chunked(1 << 16):
                    spool.write(chunk)
            spool.seek(0)
            await asyncio.to_thread(unpack, spool, local)

    async def watch(self, path: str = "", *, recursive: bool = True,
                    call_timeout: CallLimit = None) -> AsyncWatch:
        """As `Files.watch`: once the watch is in place; `async for` its events, `close()`
        (or leave its `async with`) to end it."""
        answer = self._sb._answer("GET", self._url("/watch", path=clean(path),
                                                   recursive=recursive),
                                  call_limit(call_timeout, None))
        response = await answer.__aenter__()
        watch = AsyncWatch(answer, response)
        try:
            first = json_object(await response.content.readline() or b"null")
            if first.get("event") != "watching":
                raise DaemonError("the watch did not start", reason=Reason.INTERNAL_ERROR,
                                  status=200)
        except BaseException:
            await watch.close()
            raise
        watch.directories = int(first.get("directories", 0))
        return watch


class AsyncWatch:
    def __init__(self, answer: contextlib.AbstractAsyncContextManager[aiohttp.ClientResponse],
                 response: aiohttp.ClientResponse) -> None:
        self._answer, self._response = answer, response
        self.directories = 0

    async def __aiter__(self) -> AsyncIterator[WatchEvent]:
        async for line in self._response.content:
            yield WatchEvent.of(line)

    async def close(self) -> None:
        self._response.close()
        with contextlib.suppress(DaemonError, aiohttp.ClientError):
            await self._answer.__aexit__(None, None, None)

    async def __aenter__(self) -> AsyncWatch:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, value: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.close()

