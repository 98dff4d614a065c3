"""The routes of the workspace's files beyond put and get (`workspace`), registered by
`api.make_app`; docs/sandbox-api.md, "Files", says what each takes and answers:

    GET    /v1/sandboxes/{id}/fs/list?path=          {"path", "entries": [entry...]}
    GET    /v1/sandboxes/{id}/fs/stat?path=          entry
    POST   /v1/sandboxes/{id}/fs/mkdir               {"path", "mode"?, "parents"?}
    POST   /v1/sandboxes/{id}/fs/rename              {"from", "to"}
    DELETE /v1/sandboxes/{id}/fs?path=&recursive=
    PUT    /v1/sandboxes/{id}/tar?path=              a tar (or gzipped tar) body, unpacked
    GET    /v1/sandboxes/{id}/tar?path=              the directory as a tar stream
    GET    /v1/sandboxes/{id}/watch?path=&recursive= NDJSON events until the caller leaves
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from . import bodies, workspace
from .bodies import BadRequest
from .session import IO_STALL, Session, SessionError

SessionOf = Callable[[web.Request], Session]
_WATCH_LOOK = 0.5  # seconds between looks at whether a quiet watch's caller is still there


def register(app: web.Application, session_of: SessionOf, streaming: str) -> None:
    """The routes, given how a request finds its session and the key that marks a request
    whose answer has begun (`api._guard` then closes the connection rather than answer)."""
    async def ls(request: web.Request) -> web.Response:
        path = _path(request)
        entries = await workspace.listing(session_of(request), path)
        return web.json_response({"path": path, "entries": entries})

    async def stat(request: web.Request) -> web.Response:
        return web.json_response(await workspace.stat(session_of(request), _path(request)))

    async def mkdir(request: web.Request) -> web.Response:
        body = await bodies.body(request, {"path", "mode", "parents"})
        mode, parents = str(body.get("mode", "755")), body.get("parents", False)
        if not re.fullmatch(r"[0-7]{3,4}", mode) or not isinstance(parents, bool):
            raise BadRequest("mode: octal as a string, e.g. \"755\"; parents: true or false")
        path = _string(body, "path")
        created = await workspace.mkdir(session_of(request), path, int(mode, 8) & 0o777,
                                        parents)
        return web.json_response({"path": path, "created": created})

    async def rename(request: web.Request) -> web.Response:
        body = await bodies.body(request, {"from", "to"})
        to = _string(body, "to")
        await workspace.rename(session_of(request), _string(body, "from"), to)
        return web.json_response({"path": to})

    async def remove(request: web.Request) -> web.Response:
        path = _path(request, required=True)
        await workspace.remove(session_of(request), path, _flag(request, "recursive"))
        return web.json_response({"removed": path})

    async def untar(request: web.Request) -> web.Response:
        async def chunks() -> AsyncIterator[bytes]:
            # Each read bounded from the sender's last bytes (aiohttp's has no limit): a caller
            # gone silent mid-body would hold the request, and its sandbox awake, for ever.
            while True:
                try:
                    chunk = await asyncio.wait_for(request.content.readany(), IO_STALL)
                except TimeoutError:
                    raise BadRequest(f"the archive stopped coming for {IO_STALL:g} s: "
                                     "nothing was changed") from None
                if not chunk:
                    return
                yield chunk

        return web.json_response(
            await workspace.untar(session_of(request), _path(request), chunks()))

    async def tar(request: web.Request) -> web.StreamResponse:
        stream = await workspace.tar(session_of(request), _path(request))
        response = web.StreamResponse(headers={"Content-Type": "application/x-tar"})
        try:
            request[streaming] = True
            await response.prepare(request)
            async for chunk in stream.chunks():
                await response.write(chunk)
            if not await stream.whole():
                # Cut in the sandbox: the caller's connection is cut too, before the chunked
                # body's end, so its client sees a broken stream, never a complete-looking one.
                if request.transport is not None:
                    request.transport.close()
                return response
            await response.write_eof()
        except SessionError:
            # Cut in the sandbox (or it stalled): the answer has begun, so only a connection
            # closed before the chunked end says so; aiohttp then finds it closed, quietly.
            if request.transport is not None:
                request.transport.close()
        except (ConnectionError, RuntimeError):
            pass  # the caller left: the shim is killed below
        finally:
            await stream.aclose()
        return response

    async def watch(request: web.Request) -> web.StreamResponse:
        path = _path(request)
        recursive = _flag(request, "recursive", True)
        directories, stream = await workspace.watch(session_of(request), path, recursive)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        events = workspace.events(stream)
        try:
            request[streaming] = True
            await response.prepare(request)
            await response.write(json.dumps({"event": "watching", "path": path,
                                             "directories": directories}).encode() + b"\n")
            await _relay(request, response, events)
        except (ConnectionError, RuntimeError):
            pass  # the caller left: its watch ends with it
        finally:
            await events.aclose()
            await stream.aclose()
        return response

    base = "/v1/sandboxes/{id}"
    app.router.add_get(f"{base}/fs/list", ls)
    app.router.add_get(f"{base}/fs/stat", stat)
    app.router.add_post(f"{base}/fs/mkdir", mkdir)
    app.router.add_post(f"{base}/fs/rename", rename)
    app.router.add_delete(f"{base}/fs", remove)
    app.router.add_put(f"{base}/tar", untar)
    app.router.add_get(f"{base}/tar", tar)
    app.router.add_get(f"{base}/watch", watch)


async def _relay(request: web.Request, response: web.StreamResponse,
                 events: AsyncIterator[bytes]) -> None:
    """Each event as it comes, until the watch ends or its caller leaves: aiohttp does not
    cancel a handler whose caller left, so a quiet watch looks for its connection now and
    then (one with events finds out on its next write)."""
    waiting: asyncio.Task[bytes] | None = None
    try:
        while True:
            if waiting is None:
                waiting = asyncio.ensure_future(anext(events))
            done, _ = await asyncio.wait({waiting}, timeout=_WATCH_LOOK)
            if not done:
                if request.transport is None or request.transport.is_closing():
                    return
                continue
            try:
                line = waiting.result()
            except StopAsyncIteration:
                await response.write_eof()
                return
            waiting = None
            await response.write(line)
    finally:
        if waiting is not None:
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                await waiting


def _path(request: web.Request, required: bool = False) -> str:
    path = request.query.get("path", "")
    if required and not path:
        raise BadRequest("?path=: a path inside the workspace (never the workspace itself)")
    return path


def _string(body: dict[str, object], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise BadRequest(f"'{name}': a path inside the workspace, as a string")
    return value


def _flag(request: web.Request, name: str, default: bool = False) -> bool:
    value = request.query.get(name, "true" if default else "false")
    if value not in ("true", "false"):
        raise BadRequest(f"?{name}=true|false")
    return value == "true"
