"""One request and its response on the fast path (fastpath.py), driven through the same hooks
as mitmproxy's HTTP layer drives them, on the same flow objects, in the same order:

    requestheaders -> (body read) -> request -> [answered by an addon: response]
        -> dial the pinned address -> responseheaders -> (body, streamed or whole) -> response
    and `error` for a flow that fails after its head, with the JSON answer mitmproxy's patched
    error page gives (upstream.py)

So every decision is the pipeline's (proxy/request/pipeline.py): refusals, injection, the
scrubbing of headers, bodies and streams, the slice refusal, the audit line. What is here is
only what mitmproxy's layers would have done between the hooks: read and write the bytes,
stream a body through the function an addon set, kill what an addon killed, and say when a
connection must end.

The upstream is the one the pipeline pinned for this request (its record's `pin`, for its
`tenant`), dialed or taken kept by fastdial.py. A request safe to send twice (GET, HEAD or
OPTIONS without a body) whose kept connection the origin closed before any answer goes once
more on a new connection, as keeping.py's `retried_once` does for mitmproxy's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Final, NamedTuple, Protocol

from mitmproxy import connection, ctx, flow, hooks, http
from mitmproxy.net.http import http1
from mitmproxy.net.http.validate import validate_headers
from mitmproxy.proxy.layers.http import _hooks as http_layer

from . import deadline, keeping, upstream
from .fastdial import Lease, Line
from .fastwire import Wire, WireError, body, chunked, framed
from .limits import META, HttpLimits
from .pool import Key


class FastPath(Protocol):
    """What an exchange reads of the fast path (fastpath.py's addon)."""

    @property
    def bounds(self) -> HttpLimits: ...
    @property
    def validate(self) -> bool: ...


_SAFE: Final = frozenset({"GET", "HEAD", "OPTIONS"})
_ENDED: Final = "sealgate_fast_ended"  # in a flow's metadata: its response or error hook ran
_RESPONSE_HEAD_BYTES: Final = 64 * 1024
_INTERIM_MAX: Final = 8  # informational answers skipped before the final one, at most


class ClientGone(WireError):
    """The client's connection ended while its request waited for an answer."""


class _Failed(Exception):
    """The exchange failed after the request head: `status` and `message` as mitmproxy reports
    such a failure (upstream.failure reads the reason from the message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def hook(event: hooks.Hook) -> None:
    await ctx.master.addons.handle_lifecycle(event)


class Taken(NamedTuple):
    """A request the fast path took (fastpath.py), and its body's length as its head framed
    it (no other framing is taken)."""

    request: http.Request
    length: int


async def exchange(fast: FastPath, wire: Wire, lease: Lease, client: connection.Client,
                   taken: Taken) -> bool:
    """Serve `request` on the client connection `wire`; whether the connection may carry
    another request. Every flow ends with a `response` or an `error` hook, as mitmproxy's
    do: a flow an addon killed, or one its client left, gets the error hook (the pipeline's
    audit line, and the end of its time in flight, which a drain waits for; found by
    tests/security/test_fast_path_attacks.py)."""
    flow_ = http.HTTPFlow(client, connection.Server(address=None))
    flow_.request = taken.request
    flow_.live = True
    try:
        return await _served(fast, wire, lease, flow_, taken.length)
    finally:
        if not flow_.metadata.get(_ENDED):
            if flow_.error is None:
                flow_.error = flow.Error("Client disconnected.")
            flow_.live = False
            await hook(http_layer.HttpErrorHook(flow_))


async def _served(fast: FastPath, wire: Wire, lease: Lease, flow_: http.HTTPFlow,
                  expected: int) -> bool:
    request = flow_.request
    await hooked(http_layer.HttpRequestHeadersHook(flow_))
    if killed(flow_):
        return False
    try:
        content = b"".join([chunk async for chunk in body(wire, expected)]) if expected else b""
    except WireError:
        # The client stopped sending its body: mitmproxy's words for it.
        flow_.error = flow.Error("Client disconnected.")
        await hooked(http_layer.HttpErrorHook(flow_))
        return False
    request.timestamp_end = time.time()
    if flow_.response is not None and expected:
        # Refused at its head with a body to come: mitmproxy answers before the body (here,
        # at most TAKEN_BODY, it has come) and closes (linger.py).
        flow_.response.headers["connection"] = "close"
    else:
        request.data.content = content
        await hooked(http_layer.HttpRequestHook(flow_))
        if killed(flow_):
            return False
    if flow_.response is not None:  # answered by an addon (a refusal, say)
        return await _answered(wire, flow_)
    try:
        return await _forwarded(fast, wire, lease, flow_)
    except _Failed as failed:
        flow_.error = flow.Error(failed.message)
        await hooked(http_layer.HttpErrorHook(flow_))
        if flow_.response is None:  # nothing of an answer has gone to the client yet
            wire.writer.write(upstream.error_response(failed.status, failed.message))
        return False


async def _answered(wire: Wire, flow_: http.HTTPFlow) -> bool:
    """The answer an addon set, after the hooks mitmproxy runs for one (responseheaders, as
    though it had come, then response), as mitmproxy sends it."""
    assert flow_.response is not None
    flow_.response.timestamp_start = time.time()
    await hooked(http_layer.HttpResponseHeadersHook(flow_))
    if killed(flow_):
        return False
    await hooked(http_layer.HttpResponseHook(flow_))
    if killed(flow_):
        return False
    response = flow_.response
    assert response is not None
    response.timestamp_end = time.time()
    await _send_whole(wire, flow_.request, response)
    return keeps(flow_.request, response)


async def _forwarded(fast: FastPath, wire: Wire, lease: Lease, flow_: http.HTTPFlow) -> bool:
    request = flow_.request
    record = flow_.metadata.get(META)
    pin, tenant = getattr(record, "pin", None), getattr(record, "tenant", "")
    if pin is None or not tenant:  # allowed with nowhere checked to go: never dialed
        raise _Failed(502, "sealgate: internal_error: no pinned upstream")
    key = Key((str(pin.address), request.port), pin.host.name, request.scheme == "https", (),
              tenant)
    sent = keeping.kept_request(request)
    message = http1.assemble_request_head(sent) + (request.raw_content or b"")
    line, response = await _asked(fast, wire, lease, flow_, key=key, message=message)
    expected = _framing(request, response)
    flow_.response = response
    await hooked(http_layer.HttpResponseHeadersHook(flow_))
    try:
        if killed(flow_):
            return False
        answer = flow_.response
        if answer.stream:
            kept = await _relay(wire, flow_, line, expected)
        else:
            kept = await _buffered(wire, flow_, line, expected)
    except BaseException:
        line.close()
        raise
    # A client that left before its answer (its end read meanwhile, or its TLS reset):
    # closed, not kept, as mitmproxy closes a flow's connection when its client goes.
    gone = wire.writer.is_closing() or wire.reader.at_eof()
    if kept and expected != -1 and not gone and not http1.connection_close(
            response.http_version, response.headers):
        lease.keep(line)
    else:
        line.close()
    return kept and keeps(request, flow_.response)


async def _asked(fast: FastPath, wire: Wire, lease: Lease, flow_: http.HTTPFlow, *, key: Key,
                 message: bytes) -> tuple[Line, http.Response]:
    """The request sent, and the final response head read (within the response deadline),
    on a kept or new connection."""
    wait = deadline.seconds(flow_, fast.bounds.response_seconds)
    for attempt in (1, 2):
        try:
            line = await lease.line(key, fresh=attempt > 1)  # sent again: on a new one
        except OSError as exc:
            raise _Failed(502, str(exc) or type(exc).__name__) from None
        _record_dial(flow_.server_conn, key, line)
        line.writer.write(message)
        try:
            response = await _head_while_there(wire, line, wait)
        except ClientGone:
            line.close()
            raise
        except TimeoutError:
            line.close()
            raise _Failed(504, deadline.message(wait)) from None
        except (OSError, WireError, ValueError) as exc:
            line.close()
            if not (isinstance(exc, OSError) and _stale(line, attempt, flow_.request)):
                raise _Failed(502, f"Cannot parse HTTP response: {exc}") from None
            continue  # reset before any answer
        if response is not None:
            if fast.validate:
                _valid(response, line)
            return line, response
        line.close()
        if not _stale(line, attempt, flow_.request):
            break
    raise _Failed(502, "server closed connection")


async def _head_while_there(client: Wire, line: Line, wait: float) -> http.Response | None:
    """The final response head within `wait` (TimeoutError after it), cut short when the
    client's connection ends meanwhile (ClientGone): as mitmproxy ends a flow whose client
    left, the request is answered to no one and its upstream connection, mid-exchange, closed;
    nothing is held until the deadline for a client that is gone."""
    task = asyncio.current_task()
    closed: asyncio.Future[None] = vars(client.writer)["_protocol"]._get_close_waiter(
        client.writer)
    left: list[bool] = []

    def gone(_: object) -> None:
        if task is not None:
            left.append(True)
            task.cancel()

    closed.add_done_callback(gone)
    deadline.FAST_WAITING[0] += 1
    try:
        async with asyncio.timeout(wait):
            return await _final_head(line.wire)
    except asyncio.CancelledError:
        if left and task is not None and task.uncancel() == 0:
            raise ClientGone("the client left before its answer") from None
        raise
    finally:
        deadline.FAST_WAITING[0] -= 1
        closed.remove_done_callback(gone)


def _valid(response: http.Response, line: Line) -> None:
    """mitmproxy's check of a response head against request smuggling, and its answer."""
    try:
        validate_headers(response)
    except ValueError as exc:
        line.close()
        raise _Failed(502, f"Received {exc} from server, refusing to prevent request smuggling "
                           "attacks. Disable the validate_inbound_headers option to skip this "
                           "security check.") from None


def _stale(line: Line, attempt: int, request: http.Request) -> bool:
    """Whether a request whose connection ended before any answer goes once more: the first
    time, on a kept connection (closed by its origin as the request came), and only a request
    safe to send twice."""
    return (attempt == 1 and line.reused and not len(line.wire.buf)
            and request.method in _SAFE and not request.raw_content)


async def _final_head(wire: Wire) -> http.Response | None:
    """The final response head (informational ones skipped: the fast path never asks for
    one, and an origin's 103 is only a hint); None if the connection ended before a byte."""
    for _ in range(_INTERIM_MAX):
        head = await wire.head(_RESPONSE_HEAD_BYTES)
        if head is None:
            return None
        response = http1.read_response_head(head[1])
        if not 100 <= response.status_code < 200 or response.status_code == 101:
            response.timestamp_start = time.time()
            return response
    raise WireError(f"more than {_INTERIM_MAX} informational responses")


def _framing(request: http.Request, response: http.Response) -> int | None:
    try:
        return http1.expected_http_body_size(request, response)
    except ValueError as exc:
        raise _Failed(502, f"Cannot parse HTTP response: {exc}") from None


async def _relay(wire: Wire, flow_: http.HTTPFlow, line: Line, expected: int | None) -> bool:
    """A streamed response: the head at once, the body as it comes, each piece through the
    stream function an addon set (the scrubber, or the refusal that stands in for it)."""
    answer = flow_.response
    assert answer is not None
    writer = wire.writer
    writer.write(http1.assemble_response_head(answer))
    out_chunked = chunked(answer.headers)
    stream = answer.stream if callable(answer.stream) else None
    try:
        async for chunk in body(line.wire, expected):
            for piece in _pieces(stream(chunk) if stream else chunk):
                writer.write(framed(piece, out_chunked))
            if killed(flow_):  # cut off on the way (a body that failed to decode)
                return False
            await wire.drain()
    except (WireError, OSError) as exc:
        flow_.error = flow.Error(f"HTTP/1 protocol error: {exc}")
        await hooked(http_layer.HttpErrorHook(flow_))
        return False
    if stream is not None:
        for piece in _pieces(stream(b"")):
            writer.write(framed(piece, out_chunked))
    answer.timestamp_end = time.time()
    await hooked(http_layer.HttpResponseHook(flow_))
    if killed(flow_):
        return False
    if out_chunked and flow_.request.method.upper() != "HEAD":
        writer.write(b"0\r\n\r\n")
    await wire.drain()
    return True


async def _buffered(wire: Wire, flow_: http.HTTPFlow, line: Line, expected: int | None
                    ) -> bool:
    """A response read whole (of a declared size the pipeline chose not to stream), given to
    the response hook, then sent as it left it."""
    response = flow_.response
    assert response is not None
    try:
        pieces = [chunk async for chunk in body(line.wire, expected)]
    except (WireError, OSError) as exc:
        # Nothing of the answer has gone to the client: it gets the JSON failure instead.
        message = f"HTTP/1 protocol error: {exc}"
        flow_.error = flow.Error(message)
        await hooked(http_layer.HttpErrorHook(flow_))
        wire.writer.write(upstream.error_response(502, message))
        return False
    response.raw_content = b"".join(pieces)
    response.timestamp_end = time.time()
    await hooked(http_layer.HttpResponseHook(flow_))
    if killed(flow_) or flow_.response is None:
        return False
    await _send_whole(wire, flow_.request, flow_.response)
    return True


async def _send_whole(wire: Wire, request: http.Request, response: http.Response) -> None:
    """A response with its whole body, written as mitmproxy's HTTP/1 server writes one."""
    content = response.raw_content or b""
    out_chunked = chunked(response.headers)
    data = http1.assemble_response_head(response) + framed(content, out_chunked)
    if out_chunked and request.method.upper() != "HEAD":
        data += b"0\r\n\r\n"
    wire.writer.write(data)
    await wire.drain()


def keeps(request: http.Request, response: http.Response | None) -> bool:
    """Whether the client connection carries another request (mitmproxy's `mark_done`)."""
    if response is None:
        return False
    try:
        until_end = http1.expected_http_body_size(request, response) == -1
    except ValueError:
        until_end = False
    return not (until_end or http1.connection_close(request.http_version, request.headers)
                or http1.connection_close(response.http_version, response.headers))


def _pieces(out: bytes | Iterable[bytes]) -> Iterable[bytes]:
    return (out,) if isinstance(out, bytes) else out


async def hooked(event: hooks.Hook) -> None:
    """A flow hook, and what mitmproxy does after one: wait while an addon holds the flow.
    The flow's last hook (`response` or `error`) is noted on it."""
    flow_ = event.args()[0]
    if isinstance(event, http_layer.HttpResponseHook | http_layer.HttpErrorHook):
        flow_.metadata[_ENDED] = True
    await hook(event)
    if flow_.intercepted:
        await flow_.wait_for_resume()


def killed(flow_: http.HTTPFlow) -> bool:
    return flow_.error is not None and flow_.error.msg == flow.Error.KILLED_MESSAGE


def _record_dial(server: connection.Server, key: Key, line: Line) -> None:
    """The flow's server connection says where it went (the audit line's connect time).
    Written into its fields directly: `Server.__setattr__` checks, for every field, that an
    open connection's address does not change, which a flow's own closed record never is
    (its cost was ~2 % of a kept-alive request)."""
    fields = vars(server)
    fields["address"], fields["sni"] = key.address, key.sni
    if line.dialed_at is not None:
        fields["timestamp_start"], fields["timestamp_tcp_setup"] = line.dialed_at
