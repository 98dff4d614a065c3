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
import binascii
import contextlib
import dataclasses
import hmac
import json
import logging
import math
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from sealgate.reasons import Reason, SealgateError

from .. import tiers
from ..errors import SandboxError
from ..guest.protocol import MAX_REQUEST
from ..host.cgroup import CgroupError, Limits, parse_size
from .daemon import Daemon
from .session import Command, Options, SessionError, check_path

MAX_JSON = 24 << 20  # a command's stdin, base64'd, and its other fields
MAX_STDIN = 16 << 20
MAX_FILE = 1 << 30
MAX_ENV = 1024
MAX_CAPTURE = 16 << 20  # per stream, when the output is not streamed
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
_DAEMON = web.AppKey("daemon", Daemon)
_KEY = web.AppKey("key", bytes)
_STREAMING = "sealgate.streaming"  # set on a request once its answer has begun
_MAX_PIDS = 1 << 22  # the kernel's PID_MAX_LIMIT
_MAX_MEMORY = 1 << 50
MAX_TIMEOUT = 7 * 24 * 3600.0  # a command's limit; None (no limit) is said as null

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BadRequest(SandboxError):
    reason = Reason.BAD_REQUEST


def make_app(daemon: Daemon, key: bytes | None) -> web.Application:
    app = web.Application(client_max_size=MAX_JSON, middlewares=[_guard])
    app[_DAEMON] = daemon
    app[_KEY] = key or b""
    app.router.add_get("/v1/health", _health)
    app.router.add_post("/v1/sandboxes", _create)
    app.router.add_get("/v1/sandboxes", _list)
    app.router.add_get("/v1/sandboxes/{id}", _show)
    app.router.add_delete("/v1/sandboxes/{id}", _delete)
    app.router.add_post("/v1/sandboxes/{id}/exec", _exec)
    app.router.add_post("/v1/sandboxes/{id}/pause", _pause)
    app.router.add_post("/v1/sandboxes/{id}/resume", _resume)
    app.router.add_post("/v1/sandboxes/{id}/snapshot", _snapshot)
    app.router.add_post("/v1/sandboxes/{id}/fork", _fork)
    app.router.add_put("/v1/sandboxes/{id}/files/{path:.+}", _put)
    app.router.add_get("/v1/sandboxes/{id}/files/{path:.+}", _get)
    return app


def error(reason: Reason, detail: str) -> web.Response:
    return web.json_response({"error": reason.value, "detail": detail}, status=reason.status)


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    # aiohttp's parser takes a request line without a version as HTTP/0.9 and would answer
    # it; its other refusals of what is not HTTP/1.x are apiserver.py's.
    if request.version.major != 1:
        return error(Reason.BAD_REQUEST, "not an HTTP/1.x request: no HTTP version")
    # Only the unix socket's own connections go without the key: a connection whose transport
    # is already gone (so its listener cannot be told) must show it like a TCP one.
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if not isinstance(sockname, str):
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
        logging.getLogger(__name__).exception("%s %s", request.method, request.path[:80])
        return error(Reason.INTERNAL_ERROR, type(exc).__name__)


async def _body(request: web.Request, allowed: set[str]) -> dict[str, Any]:
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


def _number(body: dict[str, Any], name: str, default: float | None, *,
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


def _env(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_ENV or not all(
            isinstance(k, str) and _NAME.fullmatch(k) and isinstance(v, str) and "\0" not in v
            for k, v in value.items()):
        raise BadRequest(f"'env' must map at most {MAX_ENV} names ([A-Za-z_][A-Za-z0-9_]*) "
                         "to strings without NUL")
    return dict(value)


def _limits(value: Any) -> Limits:
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


def _image(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= 256 or not value.isprintable():
        raise BadRequest("'image' must be an image's name or digest (sealgate image ls)")
    return value


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


async def _health(request: web.Request) -> web.Response:
    status = request.app[_DAEMON].status()
    return web.json_response(status, status=200 if status["ready"] else 503)


async def _create(request: web.Request) -> web.Response:
    body = await _body(request, {"sandbox", "limits", "env", "ttl", "idle_timeout",
                                 "isolation", "image"})
    sandbox = body.get("sandbox")
    if not isinstance(sandbox, str) or not sandbox:
        raise BadRequest("'sandbox' (the id the rules name) is required")
    offered = request.app[_DAEMON].config.slots.isolation
    isolation = body.get("isolation", offered)
    if isolation != offered:
        raise BadRequest(f"isolation {str(isolation)[:32]!r}: this daemon's sandboxes are "
                         f"{offered!r} (sandboxd --isolation)")
    options = Options(
        sandbox=sandbox, limits=_limits(body.get("limits")), env=_env(body.get("env")),
        ttl=_number(body, "ttl", 600.0, low=1) or 600.0,
        idle_timeout=_number(body, "idle_timeout", 180.0, low=1) or 180.0,
        isolation=offered, image=_image(body.get("image")),
    )
    session = await request.app[_DAEMON].create(options)
    return web.json_response(session.info(), status=201)


async def _list(request: web.Request) -> web.Response:
    sessions = request.app[_DAEMON].sessions.values()
    return web.json_response({"sandboxes": [s.info() for s in sessions]})


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
    body = await _body(request, {"name"}) if request.can_read_body else {}
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or not 0 < len(name) <= 128
                             or not name.isprintable() or "/" in name):
        raise BadRequest("'name' must be a printable name of at most 128 characters, no '/'")
    image = await request.app[_DAEMON].snapshot(request.match_info["id"], name)
    return web.json_response(dataclasses.asdict(image), status=201)


async def _fork(request: web.Request) -> web.Response:
    daemon = request.app[_DAEMON]
    daemon.get(request.match_info["id"])  # an unknown or ended id says so first
    tier = tiers.get(daemon.config.slots.isolation)
    raise SessionError(f"fork needs a memory snapshot, which the {tier.name} tier cannot take: "
                       f"{tier.no_fork}; snapshot the filesystem and create from it instead",
                       reason=Reason.UNSUPPORTED)


def _command(body: dict[str, Any]) -> Command:
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
    return Command(argv=argv, env=_env(body.get("env")), cwd=cwd, stdin=stdin,
                   timeout=_number(body, "timeout", 600.0, low=0.001, high=MAX_TIMEOUT))


async def _exec(request: web.Request) -> web.StreamResponse:
    session = request.app[_DAEMON].get(request.match_info["id"])
    body = await _body(request, {"argv", "env", "cwd", "stdin", "timeout", "stream"})
    command = _command(body)
    stream = body.get("stream", True)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be true or false")
    events = session.run(command)
    if not stream:
        return await _collected(events)
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    async with contextlib.aclosing(events):
        first = True
        async for name, data in events:
            if first:  # the refusals above are plain answers; from here on it streams
                request[_STREAMING] = True
                await response.prepare(request)
                first = False
            line = {name: base64.b64encode(data).decode()} if isinstance(data, bytes) \
                else {**data}
            try:
                await response.write(json.dumps(line).encode() + b"\n")
            except (ConnectionError, RuntimeError):
                break  # the caller went away: closing the events ends the command
    with contextlib.suppress(ConnectionError, RuntimeError):
        await response.write_eof()
    return response


async def _collected(events: AsyncGenerator[Any, None]) -> web.Response:
    captured = {"stdout": bytearray(), "stderr": bytearray()}
    truncated = False
    status: dict[str, Any] = {}
    async with contextlib.aclosing(events):
        async for name, data in events:
            if name == "exit":
                status = data
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

    written = await session.put(path, size, int(mode_text, 8) & 0o777, chunks())
    return web.json_response({"path": path, "size": written})


async def _get(request: web.Request) -> web.StreamResponse:
    session = request.app[_DAEMON].get(request.match_info["id"])
    size, data = await session.get(request.match_info["path"], MAX_FILE)
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
