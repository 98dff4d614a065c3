"""Terminals: `GET /v1/sandboxes/{id}/pty` upgraded to a WebSocket, a command on a
pseudo-terminal inside the sandbox (docs/sandbox-api.md, "Terminals").

The caller's first message is a text frame, the exec: `{"tty": {"rows", "cols"}, "argv",
"env", "cwd", "timeout"}` (`argv` by default a login shell); then binary frames are typed into
the terminal and a text frame `{"resize": {"rows", "cols"}}` resizes it. The daemon sends what
the terminal shows as binary frames and, last, a text frame with the exec's status (`{"exit",
"ending", ...}`, as an exec's last event), then closes (1000). The terminal is opened by the
agent inside the sandbox (`guest/terminal.py`), the command its session leader; here it is an
ordinary exec of the session's whose stdin and stdout the agent's side relays.

A refusal after the upgrade is a text frame `{"error": reason, "detail"}` and a close whose
code says its kind (`_CLOSE`); a frame over `MAX_MESSAGE` is closed by aiohttp with 1009. A
caller that goes away ends its command, as a streamed exec's does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from sealgate.reasons import Reason, SealgateError

from ..guest.protocol import Op, terminal_size
from . import bodies
from .bodies import BadRequest
from .session import Command, Session, SessionError

MAX_MESSAGE = 1 << 20  # one frame of the caller's: typed input, a paste, the exec
_FIRST_SECONDS = 30.0  # for the exec to come, after the upgrade
_TYPED_QUEUED = 16  # frames not yet taken by the terminal before the caller is read no more
_FIELDS = {"tty", "argv", "env", "cwd", "timeout"}
# A login shell: bash where the sandbox has it (an image may not), else sh.
LOGIN_SHELL = ["/bin/sh", "-c", "command -v bash >/dev/null && exec bash -l; exec sh -l"]
_CLOSE = {Reason.TOO_LARGE: WSCloseCode.MESSAGE_TOO_BIG, Reason.BAD_JSON: WSCloseCode.INVALID_TEXT,
          Reason.BAD_REQUEST: WSCloseCode.INVALID_TEXT,
          Reason.INTERNAL_ERROR: WSCloseCode.INTERNAL_ERROR}


async def serve(request: web.Request, session: Session) -> web.WebSocketResponse:
    # No permessage-deflate: a terminal's frames are small, and a frame's size is then what
    # crossed the wire (Node 20's WebSocket offers it and cannot read it back).
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE, compress=False)
    if not ws.can_prepare(request).ok:
        raise BadRequest("a terminal is a WebSocket: GET with Upgrade: websocket")
    await ws.prepare(request)
    try:
        command = await _exec(ws)
        ident = session.begin()
    except SealgateError as exc:
        await _refuse(ws, exc.reason, str(exc))
        return ws
    typed: asyncio.Queue[bytes | None] = asyncio.Queue(_TYPED_QUEUED)
    shown = asyncio.create_task(_show(ws, session.run(command, (ident, typed))))
    reader = asyncio.create_task(_read(ws, typed, lambda rows, cols: session.control(
        Op.RESIZE, ident, rows=rows, cols=cols)))
    try:
        await asyncio.wait({shown, reader}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (shown, reader):  # the exec's generator, closed, ends the command
            task.cancel()
        await asyncio.gather(shown, reader, return_exceptions=True)
    return ws


async def _exec(ws: web.WebSocketResponse) -> Command:
    """The caller's first message, the command and its terminal's size."""
    try:
        first = await asyncio.wait_for(ws.receive(), _FIRST_SECONDS)
    except TimeoutError:
        raise BadRequest(f"no exec within {_FIRST_SECONDS:g} s of the upgrade") from None
    if first.type == WSMsgType.ERROR:
        raise SessionError(f"the first frame: {first.data}", reason=Reason.TOO_LARGE)
    if first.type != WSMsgType.TEXT:
        raise BadRequest("the first frame is the exec, a JSON text frame")
    body = _json(first.data)
    if unknown := set(body) - _FIELDS:
        raise BadRequest(f"unknown field(s): {', '.join(sorted(unknown))[:200]}")
    tty = body.get("tty")
    size = terminal_size([tty.get("rows"), tty.get("cols")]) if isinstance(tty, dict) else None
    if size is None:
        raise BadRequest("'tty' must be {\"rows\": R, \"cols\": C}, each 1-4096")
    command = bodies.command({**body, "argv": body.get("argv", LOGIN_SHELL)}, None)
    return dataclasses.replace(command, tty=size)


def _json(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise SessionError("a text frame must be a JSON object", reason=Reason.BAD_JSON)
    return value


async def _show(ws: web.WebSocketResponse, events: Any) -> None:
    """The terminal's output, then the exec's status, then the close."""
    async with contextlib.aclosing(events):
        async for name, data in events:
            if name == "exit":
                await ws.send_str(json.dumps(data))
            elif data:  # a terminal has no stderr: its stream is closed at once
                await ws.send_bytes(data)
    await ws.close()


async def _read(ws: web.WebSocketResponse, typed: asyncio.Queue[bytes | None],
                resize: Callable[[int, int], None]) -> None:
    """The caller's frames until it closes: input typed into the terminal (held back while the
    terminal has not taken `_TYPED_QUEUED` frames), resizes; anything else ends the session."""
    async for message in ws:
        if message.type == WSMsgType.BINARY:
            if message.data:
                await typed.put(message.data)
        elif message.type == WSMsgType.TEXT:
            try:
                size = _json(message.data).get("resize")
                rows_cols = terminal_size([size.get("rows"), size.get("cols")]) \
                    if isinstance(size, dict) else None
                if rows_cols is None:
                    raise BadRequest("a text frame is {\"resize\": {\"rows\": R, \"cols\": C}}, "
                                     "each 1-4096; input goes in binary frames")
            except SealgateError as exc:
                await _refuse(ws, exc.reason, str(exc))
                return
            resize(*rows_cols)
        else:  # an error: aiohttp has closed it with its code (1009 for a frame too large)
            return


async def _refuse(ws: web.WebSocketResponse, reason: Reason, detail: str) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await ws.send_str(json.dumps({"error": reason.value, "detail": detail}))
        await ws.close(code=_CLOSE.get(reason, WSCloseCode.POLICY_VIOLATION),
                       message=reason.value.encode())
