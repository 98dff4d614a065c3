"""The daemon's HTTP API (docs/sandbox-api.md): versioned paths, JSON in and out, errors as
`{"error": <reason>, "detail": ...}` with the reason's status, never a traceback.

Over the unix socket the caller is whoever may open it (root, mode 0600); over TCP every request
carries `Authorization: Bearer <key>`, compared in constant time.

A command's output streams as NDJSON, one event a line, bytes in base64:
`{"stdout": "..."}`, `{"stderr": "..."}`, then `{"exit": 0, ...}`. A caller that goes away
mid-stream ends its command.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hmac
import json
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from sealgate.reasons import Reason, SealgateError

from . import admin, bodies, fsapi, terminals, transfer
from .backend import Backend
from .background import STDIN_WRITE, Background
from .bodies import MAX_CAPTURE, MAX_FILE, MAX_JSON, BadRequest
from .portroutes import PortRoutes, loggable
from .session import Options, SessionError, check_path

_DAEMON = web.AppKey("daemon", Backend)
_KEY = web.AppKey("key", bytes)
# The routes served without the daemon's key, as registered (never told by a name or a path):
# each checks a credential of its own.
_OPEN = web.AppKey("open routes", frozenset)
_STREAMING = "sealgate.streaming"  # set on a request once its answer has begun
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(daemon: Backend, key: bytes | None) -> web.Application:
    app = web.Application(client_max_size=MAX_JSON, middlewares=[_guard])
    app[_DAEMON] = daemon
    app[_KEY] = key or b""
    app.router.add_get("/v1/health", _health)
    app.router.add_post("/v1/sandboxes", _create)
    app.router.add_get("/v1/sandboxes", _list)
    app.router.add_get("/v1/sandboxes/{id}", _show)
    app.router.add_delete("/v1/sandboxes/{id}", _delete)
    app.router.add_patch("/v1/sandboxes/{id}", _update)
    app.router.add_post("/v1/sandboxes/{id}/exec", _exec)
    app.router.add_post("/v1/sandboxes/{id}/pause", _pause)
    app.router.add_post("/v1/sandboxes/{id}/resume", _resume)
    app.router.add_post("/v1/sandboxes/{id}/snapshot", _snapshot)
    app.router.add_post("/v1/sandboxes/{id}/fork", _fork)
    app.router.add_get("/v1/sandboxes/{id}/processes", _processes)
    app.router.add_get("/v1/sandboxes/{id}/processes/{pid}", _process)
    app.router.add_get("/v1/sandboxes/{id}/processes/{pid}/output", _output)
    app.router.add_get("/v1/sandboxes/{id}/processes/{pid}/wait", _wait)
    app.router.add_post("/v1/sandboxes/{id}/processes/{pid}/stdin", _stdin)
    app.router.add_post("/v1/sandboxes/{id}/processes/{pid}/signal", _signal)
    app.router.add_get("/v1/sandboxes/{id}/pty", _pty)
    app[_OPEN] = PortRoutes(_DAEMON, _STREAMING).add_to(app)
    app.router.add_put("/v1/sandboxes/{id}/files/{path:.+}", _put)
    app.router.add_get("/v1/sandboxes/{id}/files/{path:.+}", _get)
    fsapi.register(app, lambda r: r.app[_DAEMON].get(r.match_info["id"]), _STREAMING)
    return app


def error(reason: Reason, detail: str) -> web.Response:
    # The header tells the daemon's own refusal from an answer forwarded from a sandbox's port.
    return web.json_response({"error": reason.value, "detail": detail}, status=reason.status,
                             headers={"X-Sealgate-Error": reason.value})


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    # aiohttp's parser takes a request line without a version as HTTP/0.9 and would answer
    # it; its other refusals of what is not HTTP/1.x are apiserver.py's.
    if request.version.major != 1:
        return error(Reason.BAD_REQUEST, "not an HTTP/1.x request: no HTTP version")
    # Only the unix socket's own connections go without the key: a connection whose transport
    # is already gone (so its listener cannot be told) must show it like a TCP one.
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if not isinstance(sockname, str) and request.match_info.route not in request.app[_OPEN]:
        given = request.headers.get("Authorization", "").encode(errors="surrogateescape")
        key = request.app[_KEY]
        if not key or not hmac.compare_digest(given, b"Bearer " + key):
            return error(Reason.UNAUTHORIZED, "Authorization: Bearer <the daemon's key>")
    try:
        return await handler(request)
    except SealgateError as exc:
        if request.get(_STREAMING):
            raise  # the answer has begun: only closing the connection can say it failed
        return error(exc.reason, str(exc))
    except web.HTTPException as exc:
        if exc.status == 413:
            return error(Reason.TOO_LARGE, "the request body is over its cap")
        if exc.status in (404, 405):
            return error(Reason.BAD_REQUEST, f"{request.method} {request.path[:80]}: no such "
                         "call (see docs/sandbox-api.md)")
        if exc.status >= 400:  # aiohttp's own refusals (a bad header, ...) answered as ours
            return error(Reason.BAD_REQUEST, exc.reason)
        raise
    except (ConnectionError, asyncio.CancelledError):
        raise  # the caller went away: there is no one to answer
    except Exception as exc:  # a bug: said as one, never a traceback
        if request.get(_STREAMING):
            raise
        logging.getLogger(__name__).exception("%s %s", request.method, loggable(request))
        return error(Reason.INTERNAL_ERROR, type(exc).__name__)


async def _health(request: web.Request) -> web.Response:
    status = request.app[_DAEMON].status()
    return web.json_response(status, status=200 if status["ready"] else 503)


async def _create(request: web.Request) -> web.Response:
    key = bodies.idempotency_key(request)
    body = await bodies.body(request, {"sandbox", "limits", "env", "ttl", "idle_timeout",
                                       "isolation", "image", "metadata"})
    sandbox = _sandbox_id(body.get("sandbox"))
    if sandbox is None:
        raise BadRequest("'sandbox' (the id the rules name) is required")
    offered = request.app[_DAEMON].isolation
    isolation = body.get("isolation", offered)
    if isolation != offered:
        raise BadRequest(f"isolation {str(isolation)[:32]!r}: this daemon's sandboxes are "
                         f"{offered!r} (sandboxd --isolation)")
    options = Options(
        sandbox=sandbox, limits=bodies.limits(body.get("limits")),
        env=bodies.env(body.get("env")),
        ttl=bodies.number(body, "ttl", 600.0, low=1) or 600.0,
        idle_timeout=bodies.number(body, "idle_timeout", 180.0, low=1) or 180.0,
        isolation=offered, image=bodies.image(body.get("image")),
        metadata=bodies.metadata(body.get("metadata")),
    )
    session = await request.app[_DAEMON].create(options, key)
    return web.json_response(session.info(), status=201)


def _sandbox_id(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= 256 or not value.isprintable():
        raise BadRequest("'sandbox' must be a sandbox id the rules name")
    return value


async def _list(request: web.Request) -> web.Response:
    wanted = bodies.metadata_filter(request.query).items()
    sessions = [s for s in request.app[_DAEMON].sessions.values()
                if all(s.options.metadata.get(k) == v for k, v in wanted)]
    return web.json_response({"sandboxes": [s.info() for s in sessions]})


async def _update(request: web.Request) -> web.Response:
    daemon = request.app[_DAEMON]
    body = await bodies.body(request, {"ttl", "idle_timeout", "metadata", "sandbox"})
    high = daemon.max_ttl
    session = await daemon.update(
        request.match_info["id"], ttl=bodies.number(body, "ttl", None, low=1, high=high),
        idle_timeout=bodies.number(body, "idle_timeout", None, low=1, high=high),
        metadata=None if "metadata" not in body else bodies.metadata(body["metadata"]),
        sandbox=_sandbox_id(body.get("sandbox")))
    return web.json_response(session.info())


async def _show(request: web.Request) -> web.Response:
    return web.json_response(request.app[_DAEMON].get(request.match_info["id"]).info())


async def _delete(request: web.Request) -> web.Response:
    ident = request.match_info["id"]
    await request.app[_DAEMON].delete(ident)
    return web.json_response({"deleted": ident})


async def _pause(request: web.Request) -> web.Response:
    session = request.app[_DAEMON].get(request.match_info["id"])
    await session.pause()
    return web.json_response(session.info())


async def _resume(request: web.Request) -> web.Response:
    session = request.app[_DAEMON].get(request.match_info["id"])
    await session.pause(False)
    return web.json_response(session.info())


async def _snapshot(request: web.Request) -> web.Response:
    body = await bodies.body(request, {"name"}) if request.can_read_body else {}
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or not 0 < len(name) <= 128
                             or not name.isprintable() or "/" in name):
        raise BadRequest("'name' must be a printable name of at most 128 characters, no '/'")
    image = await request.app[_DAEMON].snapshot(request.match_info["id"], name)
    return web.json_response(dataclasses.asdict(image), status=201)


async def _fork(request: web.Request) -> web.Response:
    body = await bodies.body(request, {"n"}) if request.can_read_body else {}
    n = body.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool):
        raise BadRequest("'n' must be a whole number")
    copies = await request.app[_DAEMON].fork(request.match_info["id"], n)
    return web.json_response({"sandboxes": [c.info() for c in copies]}, status=201)


async def _exec(request: web.Request) -> web.StreamResponse:
    session = request.app[_DAEMON].get(request.match_info["id"])
    body = await bodies.body(request, {"argv", "env", "cwd", "stdin", "timeout", "stream",
                                       "background"})
    background = body.get("background", False)
    stream = body.get("stream", True)
    if not isinstance(stream, bool) or not isinstance(background, bool):
        raise BadRequest("'stream' and 'background' must be true or false")
    # In the background no limit unless asked: it ends with its sandbox.
    command = bodies.command(body, None if background else 600.0)
    key = bodies.idempotency_key(request)
    if background:
        return web.json_response(session.start(command, key).info(), status=201)
    if key is not None:  # a stream cannot be given twice
        raise BadRequest("Idempotency-Key is taken by creates and background execs")
    events = session.run(command)
    if not stream:
        return await _collected(request, events)
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    async with contextlib.aclosing(events):
        first = True
        async for name, data in events:
            if first:  # the refusals above are plain answers; from here on it streams
                request[_STREAMING] = True
                await response.prepare(request)
                first = False
            if isinstance(data, bytes):
                line = {name: base64.b64encode(data).decode()}
            else:
                line = {**data}
                admin.ended(request.app, data)
            try:
                await response.write(json.dumps(line).encode() + b"\n")
            except (ConnectionError, RuntimeError):
                break  # the caller went away: closing the events ends the command
    with contextlib.suppress(ConnectionError, RuntimeError):
        await response.write_eof()
    return response


async def _processes(request: web.Request) -> web.Response:
    session = request.app[_DAEMON].get(request.match_info["id"])
    return web.json_response({"processes": [p.info() for p in
                                            session.processes.table.values()]})


def _background(request: web.Request) -> Background:
    session = request.app[_DAEMON].get(request.match_info["id"])
    pid = request.match_info["pid"]
    found = session.processes.table.get(int(pid)) if pid.isdigit() and len(pid) < 10 else None
    if found is None:
        raise SessionError(f"no background process {pid[:16]!r} in sandbox {session.id}",
                           reason=Reason.NO_SUCH_PROCESS)
    return found


async def _process(request: web.Request) -> web.Response:
    return web.json_response(_background(request).info())


async def _output(request: web.Request) -> web.StreamResponse:
    """NDJSON from `?offset=N` (default 0); `?follow=true` waits for more until it ends."""
    process = _background(request)
    offset, follow = request.query.get("offset", "0"), request.query.get("follow", "false")
    if not offset.isdigit() or len(offset) > 18 or follow not in ("true", "false"):
        raise BadRequest("?offset=N (a byte offset, 0 the first) and ?follow=true|false")
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    request[_STREAMING] = True
    await response.prepare(request)
    try:
        async for event in process.output(int(offset), follow == "true"):
            await response.write(json.dumps(event).encode() + b"\n")
        await response.write_eof()
    except (ConnectionError, RuntimeError):
        pass  # the reader went away; the process goes on
    return response


async def _wait(request: web.Request) -> web.Response:
    return web.json_response(await _background(request).wait())


async def _stdin(request: web.Request) -> web.Response:
    """The body's bytes to the process's stdin; `?close=true` ends it after them."""
    process = _background(request)
    close = request.query.get("close", "false")
    if close not in ("true", "false"):
        raise BadRequest("?close=true|false")
    data = await bodies.raw(request, STDIN_WRITE)
    try:
        process.write(data, close == "true")
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    except asyncio.QueueFull:
        raise SessionError("the process has not read what was written before",
                           reason=Reason.SANDBOX_BUSY) from None
    return web.json_response(process.info())


async def _signal(request: web.Request) -> web.Response:
    process = _background(request)
    process.signal(bodies.signal_name((await bodies.body(request, {"signal"})).get("signal")))
    return web.json_response(process.info())


async def _pty(request: web.Request) -> web.StreamResponse:
    return await terminals.serve(request, request.app[_DAEMON].get(request.match_info["id"]))


async def _collected(request: web.Request, events: AsyncGenerator[Any, None]) -> web.Response:
    captured = {"stdout": bytearray(), "stderr": bytearray()}
    truncated = False
    status: dict[str, Any] = {}
    async with contextlib.aclosing(events):
        async for name, data in events:
            if name == "exit":
                status = data
                admin.ended(request.app, data)
            elif len(captured[name]) < MAX_CAPTURE:
                captured[name] += data[:MAX_CAPTURE - len(captured[name])]
            else:
                truncated = True
    return web.json_response({**status, "truncated": truncated,
                              **{k: base64.b64encode(v).decode() for k, v in captured.items()}})


async def _put(request: web.Request) -> web.Response:
    session = request.app[_DAEMON].get(request.match_info["id"])
    path = check_path(request.match_info["path"])
    size = request.content_length
    if size is None:
        raise SessionError("Content-Length is required", reason=Reason.BAD_REQUEST)
    if size > MAX_FILE:
        raise SessionError(f"a file over {MAX_FILE} bytes", reason=Reason.TOO_LARGE)
    mode_text = request.query.get("mode", "644")
    if not re.fullmatch(r"[0-7]{3,4}", mode_text):
        raise BadRequest("mode: octal, e.g. 644 or 755")

    async def chunks() -> AsyncIterator[bytes]:
        async for chunk in request.content.iter_chunked(1 << 16):
            yield chunk

    written = await transfer.put(session, path, size, int(mode_text, 8) & 0o777, chunks())
    return web.json_response({"path": path, "size": written})


async def _get(request: web.Request) -> web.StreamResponse:
    session = request.app[_DAEMON].get(request.match_info["id"])
    size, data = await transfer.get(session, request.match_info["path"], MAX_FILE)
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    response.content_length = size
    sent = 0
    async with contextlib.aclosing(data):
        request[_STREAMING] = True
        await response.prepare(request)
        async for chunk in data:
            try:
                await response.write(chunk)
            except (ConnectionError, RuntimeError):
                break
            sent += len(chunk)
    if sent != size:
        # Fewer bytes than announced (the file shrank as it was read, or the caller left):
        # the connection is closed, so the caller sees a cut body rather than waiting.
        if request.transport is not None:
            request.transport.close()
        return response
    with contextlib.suppress(ConnectionError, RuntimeError):
        await response.write_eof()
    return response
