"""How long an upstream may take to start its response, and what the client gets when it does not.

mitmproxy waits for an upstream's response head as long as the connection lives: an upstream that
accepts a request and never answers held its client for ten minutes with nothing. Here a request,
once sent in full, has `--response-timeout` seconds (60 by default; a rule's `response_timeout`
for a long-polling API) until the response head arrives; past it, the client gets 504
`upstream_timeout` and the upstream's side is dropped: an HTTP/1 connection is closed (a late
answer on it would otherwise be read as the next request's), an HTTP/2 stream is reset.

The timer is mitmproxy's own wake-up (a command the connection's handler turns into a timer task
and, when it fires, an event routed back to the stream), with one change: a deadline that is met
ends its task at once. Left to fire, every answered request on a busy keep-alive connection
would keep a sleeping task (about 1.5 KB) for the whole timeout: at 5,000 requests a second and
60 s, 300,000 of them. mitm.py wires the two functions here into mitmproxy.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

from mitmproxy import http
from mitmproxy.net.http import status_codes
from mitmproxy.proxy import commands, events, server
from mitmproxy.proxy.events import Event
from mitmproxy.proxy.layer import CommandGenerator
from mitmproxy.proxy.layers.http import HttpLayer, HttpStream, SendHttp
from mitmproxy.proxy.layers.http._events import RequestProtocolError, ResponseProtocolError

from sealgate.reasons import Reason

from .limits import META, Bounds
from .refusal import said

_KEY = "_sealgate_deadline"  # the stream's armed deadline, in its instance dict
class Deadline(commands.RequestWakeup):
    """A response deadline: a wake-up that can be called off once the response has come."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay)
        self.met = False
        self.woken: asyncio.Future[bool] | None = None  # its timer's, while that waits


_WAITING: weakref.WeakSet[Deadline] = weakref.WeakSet()  # timers waiting now, this worker


def pending() -> int:
    """How many response deadlines are waiting: requests sent in full, no response head yet.
    A met deadline's timer ends at once, so this is never more than the requests waiting."""
    return len(_WAITING)


def seconds(flow: http.HTTPFlow, default: float) -> float:
    """The response timeout of `flow`: its rule's, else the proxy's."""
    record: Bounds | None = flow.metadata.get(META)
    if record is not None and record.response_timeout is not None:
        return record.response_timeout
    return default


def message(delay: float) -> str:
    return said(Reason.UPSTREAM_TIMEOUT, f"no response head in {delay:g} s")


_Handler = Callable[[HttpStream, Event], CommandGenerator[None]]


def bounded_wait(handle: _Handler, default: float) -> _Handler:
    """HttpStream's event handler, with the deadline armed once the request is sent in full
    and the stream waits for a response head, and called off when anything else happens to it."""

    @functools.wraps(handle)
    def handle_event(self: HttpStream, event: Event) -> CommandGenerator[None]:
        armed: Deadline | None = vars(self).get(_KEY)
        if isinstance(event, events.Wakeup) and isinstance(event.command, Deadline):
            if event.command is armed and not armed.met and _waiting(self):
                armed.met = True
                yield from _time_out(self, armed.delay)
            return
        yield from handle(self, event)
        if armed is None:
            if _waiting(self) and self.flow.request.method != "CONNECT":
                deadline = Deadline(seconds(self.flow, default))
                vars(self)[_KEY] = deadline
                yield deadline
        elif not armed.met and not _waiting(self):
            _call_off(self, armed)

    return handle_event


def _waiting(stream: HttpStream) -> bool:
    return bool(stream.client_state == stream.state_done
                and stream.server_state == stream.state_wait_for_response_headers)


def _time_out(stream: HttpStream, delay: float) -> CommandGenerator[None]:
    said = message(delay)
    # Upstream first: an HTTP/1 connection closes, an HTTP/2 stream is reset (CANCEL).
    yield SendHttp(RequestProtocolError(stream.stream_id, said,
                                        status_codes.CLIENT_CLOSED_REQUEST),
                   stream.context.server)
    yield from stream.handle_protocol_error(
        ResponseProtocolError(stream.stream_id, said, status_codes.GATEWAY_TIMEOUT))


def _call_off(stream: HttpStream, deadline: Deadline) -> None:
    """The response came (or the stream ended): the timer goes now, and with it the entry the
    HTTP layer keeps to route its event back here."""
    deadline.met = True
    if deadline.woken is not None and not deadline.woken.done():
        deadline.woken.set_result(False)
    layers = stream.context.layers
    parent = layers[layers.index(stream) - 1]  # as HttpStream.mode finds it
    if isinstance(parent, HttpLayer):
        parent.command_sources.pop(deadline, None)


def _wake(woken: asyncio.Future[bool]) -> None:
    if not woken.done():
        woken.set_result(True)


_Wakeup = Callable[[server.ConnectionHandler, commands.RequestWakeup], Coroutine[Any, Any, None]]


def endable(wakeup: _Wakeup) -> _Wakeup:
    """The connection handler's timer, which a met deadline ends early: it then sends nothing."""

    @functools.wraps(wakeup)
    async def timer(self: server.ConnectionHandler, request: commands.RequestWakeup) -> None:
        if not isinstance(request, Deadline):
            await wakeup(self, request)
            return
        if request.met:
            self.wakeup_timer.discard(asyncio.current_task())
            return
        # Woken by its timer (True) or by `_call_off` (False). Not cancelled: a cancelled
        # task keeps its exception, whose traceback holds this frame and so the deadline, in
        # a cycle only a full collection frees (60 MiB over 30,000 keep-alive requests).
        loop = asyncio.get_running_loop()
        request.woken = woken = loop.create_future()
        timer = loop.call_later(request.delay, _wake, woken)
        _WAITING.add(request)
        try:
            fired = await woken
        finally:
            _WAITING.discard(request)
            timer.cancel()
            request.woken = None
            self.wakeup_timer.discard(asyncio.current_task())
        if fired:
            await self.server_event(events.Wakeup(request))

    return timer
