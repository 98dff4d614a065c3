"""How long an upstream may take to start its response, and what the client gets when it does not.

mitmproxy waits for an upstream's response head as long as the connection lives: an upstream that
accepts a request and never answers held its client for ten minutes with nothing. Here a request,
once sent in full, has `--response-timeout` seconds (60 by default; a rule's `response_timeout`
for a long-polling API) until the response head arrives; past it, the client gets 504
`upstream_timeout` and the upstream's side is dropped: an HTTP/1 connection is closed (a late
answer on it would otherwise be read as the next request's), an HTTP/2 stream is reset.

The timer is a plain `call_later` handle per waiting request, in the connection handler's set
of wake-up timers (so a client's disconnect cancels it with mitmproxy's own); only a deadline
that fires makes a task, to deliver its event through the handler as mitmproxy's wake-ups are.
mitmproxy's own wake-up (a command the handler turns into a sleeping task) cost a task, a
future and three turns of the loop for every request, met or not; and left to run, every
answered request on a busy keep-alive connection would keep a sleeping task (about 1.5 KB) for
the whole timeout: at 5,000 requests a second and 60 s, 300,000 of them. mitm.py wires
`bounded_wait` into mitmproxy.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Callable

from mitmproxy import http
from mitmproxy.net.http import status_codes
from mitmproxy.proxy import commands, events, server
from mitmproxy.proxy.events import Event
from mitmproxy.proxy.layer import CommandGenerator
from mitmproxy.proxy.layers.http import HttpLayer, HttpStream, SendHttp
from mitmproxy.proxy.layers.http._events import RequestProtocolError, ResponseProtocolError
from mitmproxy.utils import asyncio_utils

from sealgate.reasons import Reason

from .handlers import handler_of
from .limits import META, Bounds
from .refusal import said

_KEY = "_sealgate_deadline"  # the stream's armed deadline, in its instance dict


class Deadline(commands.RequestWakeup):
    """A response deadline: the event a fired timer sends is a wake-up of this command."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay)
        self.met = False
        self.timer: asyncio.TimerHandle | None = None  # while it waits
        self.handler: server.ConnectionHandler | None = None
        self.routes: list[tuple[HttpLayer, object]] = []


# Armed deadlines, this worker; weak: a client's disconnect cancels a timer without us.
_WAITING: weakref.WeakSet[Deadline] = weakref.WeakSet()


# The fast path's waits (fastexchange.py, timed by asyncio.timeout), counted up and down there
# without a context manager's cost per request.
FAST_WAITING = [0]


def pending() -> int:
    """How many response deadlines are waiting: requests sent in full, no response head yet.
    A met deadline's timer ends at once, so this is never more than the requests waiting."""
    return FAST_WAITING[0] + sum(
        1 for d in _WAITING if d.timer is not None and not d.timer.cancelled())


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
                _arm(self, deadline)
        elif not armed.met and not _waiting(self):
            _call_off(armed)

    return handle_event


def _waiting(stream: HttpStream) -> bool:
    return bool(stream.client_state == stream.state_done
                and stream.server_state == stream.state_wait_for_response_headers)


def _routes(stream: HttpStream) -> list[tuple[HttpLayer, object]]:
    """Each HTTP layer above the stream and its child towards it. A wake-up enters at the top
    and each HTTP layer on the way sends it to the child it came from (an intercepted CONNECT's
    inner HTTP layer is below the outer one's CONNECT stream)."""
    layers = stream.context.layers
    below = layers[:layers.index(stream) + 1]
    return [(layer, below[i + 1]) for i, layer in enumerate(below[:-1])
            if isinstance(layer, HttpLayer)]


def _arm(stream: HttpStream, deadline: Deadline) -> None:
    """The timer, and the HTTP layers' entries that route its wake-up back to this stream (as
    each makes for a wake-up a stream asks for)."""
    handler, routes = handler_of(stream.context.client.id), _routes(stream)
    if handler is None or not routes:  # the client is gone: nothing waits for an answer
        deadline.met = True
        return
    for layer, child in routes:
        layer.command_sources[deadline] = child  # type: ignore[assignment]
    deadline.handler, deadline.routes = handler, routes
    deadline.timer = asyncio.get_running_loop().call_later(deadline.delay, _fire, deadline)
    handler.wakeup_timer.add(deadline.timer)  # type: ignore[arg-type]  # cancelled alike
    _WAITING.add(deadline)


def _fire(deadline: Deadline) -> None:
    handler = deadline.handler
    _forget(deadline)
    if not deadline.met and handler is not None:
        task = asyncio_utils.create_task(handler.server_event(events.Wakeup(deadline)),
                                         name="response deadline", client=handler.client.peername)
        handler.wakeup_timer.add(task)
        task.add_done_callback(handler.wakeup_timer.discard)


def _forget(deadline: Deadline) -> None:
    _WAITING.discard(deadline)
    if deadline.timer is not None and deadline.handler is not None:
        deadline.timer.cancel()
        deadline.handler.wakeup_timer.discard(deadline.timer)
    deadline.timer = None


def _time_out(stream: HttpStream, delay: float) -> CommandGenerator[None]:
    said = message(delay)
    # Upstream first: an HTTP/1 connection closes, an HTTP/2 stream is reset (CANCEL).
    yield SendHttp(RequestProtocolError(stream.stream_id, said,
                                        status_codes.CLIENT_CLOSED_REQUEST),
                   stream.context.server)
    yield from stream.handle_protocol_error(
        ResponseProtocolError(stream.stream_id, said, status_codes.GATEWAY_TIMEOUT))


def _call_off(deadline: Deadline) -> None:
    """The response came (or the stream ended): the timer goes now, and with it the entry the
    HTTP layer keeps to route its event back here."""
    deadline.met = True
    _forget(deadline)
    for layer, _ in deadline.routes:
        layer.command_sources.pop(deadline, None)
    deadline.routes = []
