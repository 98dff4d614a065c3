"""The response side: nothing the upstream sends reaches the sandbox with a credential in it.

Every allowed response loses the headers only the proxy may set (`X-Sealgate-*`). A response to
a request that carried a credential is scrubbed (credentials.scrub): headers at once; HTTP/2
trailers and a buffered body in `response`; a large or unknown-length body on the way, decoded
first when the upstream compressed it although asked not to; WebSocket messages one by one.
What cannot be scrubbed (a coding that cannot be decoded, one that fails to decode, a transfer
coding) is refused, and a protocol switch to anything but WebSocket too: what followed would be
relayed raw. A slice (206, or a `Content-Range`) answered to a request that carried a credential
is replaced by the proxy's refusal (`response_sliced`): the request's range headers were not
sent (policy/reshaping.py), so one nobody listed asked for it, and a secret it echoes could be
cut where the scrubber, which finds whole secrets, would not see it. Each refusal writes a
`response_refused` audit line through `emit`.
"""

from __future__ import annotations

import logging
from typing import Final, Protocol

from mitmproxy import http

from sealgate.reasons import Reason

from ..credentials.decode import Undecodable, decode_whole, decoder
from ..credentials.scrub import Scrubber
from ..engine import mitm
from ..engine.refusal import deny_response
from ..errors import Denial
from ..policy import reshaping
from . import baseurl, target
from .flowstate import META, REJECTED, SCRUB, STREAM_OVER, header

logger = logging.getLogger("sealgate")

# The body of the proxy's refusal that stands for the upstream's answer.
_ANSWERED: Final = "sealgate_answered"


class Emit(Protocol):
    def __call__(self, event: str, **fields: object) -> None: ...


def on_headers(flow: http.HTTPFlow, emit: Emit) -> None:
    record = flow.metadata.get(META)
    response = flow.response
    if response is None or record is None or record.decision == "deny":
        return
    if response.status_code == 101 and not _websocket_switch(flow.request, response):
        # What follows another protocol switch would be relayed raw, past every rule.
        upgrade = header(response.headers, b"upgrade")
        _refuse(flow, emit, Reason.PROTOCOL_NOT_ALLOWED, upgrade=upgrade[:64])
        return
    if response.status_code == 401:
        # A token the proxy obtained was refused: the next request asks for a new one. This
        # one is answered as it is, never retried (it may not be idempotent).
        for forget in flow.metadata.get(REJECTED, ()):
            forget()
    target.strip_downstream_headers(response.headers)
    scrubber: Scrubber | None = flow.metadata.get(SCRUB)
    if not scrubber:
        _point_back(response, record.base_url)
        _stream_if_large(response)
        return
    if (denial := reshaping.sliced(response.status_code,
                                   "content-range" in response.headers)) is not None:
        _answer_instead(flow, emit, denial, status=str(response.status_code))
        return
    coding = header(response.headers, b"transfer-encoding").lower().replace(" ", "")
    if coding not in ("", "chunked", "identity"):
        # A transfer coding (gzip, chunked): mitmproxy passes the body on coded, and a
        # credential inside could not be found. Injected requests send no TE asking for one,
        # so only a misbehaving upstream gets here.
        _refuse(flow, emit, Reason.ENCODING_UNSCRUBBABLE, encoding=coding[:64])
        return
    fields = response.headers.fields
    if (scrubbed := scrubber.fields(fields)) is not fields:
        response.headers.fields = scrubbed
    names = b"\n".join(name for name, _ in scrubbed)
    if scrubber.data(names) != names:
        # A name cannot be masked into a valid one: such a field is dropped.
        response.headers.fields = tuple((n, v) for n, v in scrubbed if scrubber.data(n) == n)
    if response.data.reason and (reason := scrubber.data(response.data.reason)) != (
        response.data.reason
    ):
        response.data.reason = reason
    # Rewritten once scrubbed: the rewrite writes the host canonical (lower case), and a secret
    # echoed into it would no longer be the needle the scrubber looks for.
    _point_back(response, record.base_url)
    if response.status_code == 101:
        # A WebSocket follows: its control frames are masked as mitmproxy relays them.
        flow.metadata[mitm.CONTROL_SCRUB] = scrubber.data
    if _stream_if_large(response):
        _stream_scrubbed(flow, response, scrubber, emit)
    # else: buffered, and scrubbed whole in on_response


def on_response(flow: http.HTTPFlow, emit: Emit) -> None:
    scrubber: Scrubber | None = flow.metadata.get(SCRUB)
    response = flow.response
    if not scrubber or response is None:
        return
    if (answered := flow.metadata.get(_ANSWERED)) is not None:
        # The refusal that replaced the upstream's head: a head that ended the message (no
        # body) had mitmproxy write the upstream's empty body over the refusal's; the upstream's
        # trailers came after it.
        response.raw_content = answered
        response.trailers = None
        return
    if response.trailers and (
        (fields := scrubber.fields(response.trailers.fields)) is not response.trailers.fields
    ):
        response.trailers.fields = fields
    if not response.raw_content or response.stream:
        return
    if encoding := _content_coding(response):
        # Asked for identity but compressed anyway: passed on decoded, as when streamed.
        try:
            body = decode_whole(encoding, response.raw_content)
        except Undecodable as exc:
            _refuse(flow, emit, exc.reason, encoding=encoding[:64])
            return
        _decoded(response)
        response.content = scrubber.data(body)
    elif (clean := scrubber.data(response.raw_content)) != response.raw_content:
        response.raw_content = clean


def on_websocket_message(flow: http.HTTPFlow) -> None:
    """A message from an upstream that was sent a credential is scrubbed like a body. mitmproxy
    hands over whole messages (fragments joined, permessage-deflate undone) and keeps the
    framing of one whose length did not change, which masking never changes."""
    scrubber: Scrubber | None = flow.metadata.get(SCRUB)
    if not scrubber or flow.websocket is None:
        return
    message = flow.websocket.messages[-1]
    if message.from_client:
        return
    try:
        if (clean := scrubber.data(message.content)) != message.content:
            message.content = clean
    except Exception:
        logger.exception("internal error scrubbing a WebSocket message; dropped",
                         extra={"request_id": flow.id})
        message.drop()
        flow.kill()


def _stream_scrubbed(
    flow: http.HTTPFlow, response: http.Response, scrubber: Scrubber, emit: Emit
) -> None:
    """Stream a response through the scrubber; a compressed one is decoded on the way (its
    framing headers rewritten to match). A coding that cannot be decoded kills the flow: a
    credential inside it could not be found."""
    encoding = _content_coding(response)
    bodiless = flow.request.method == "HEAD" or response.status_code in (204, 304)
    if not encoding or bodiless:
        response.stream = scrubber.stream()
        return
    decode = decoder(encoding)
    if decode is None:
        _refuse(flow, emit, Reason.ENCODING_UNSCRUBBABLE, encoding=encoding[:64])
        return
    _decoded(response)
    if response.http_version == "HTTP/1.1" and "chunked" not in header(
        response.headers, b"transfer-encoding"
    ).lower():
        response.headers["transfer-encoding"] = "chunked"
    # (HTTP/1.0 ends the body by closing; HTTP/2 and 3 frame it themselves.)
    scrub = scrubber.stream(decode)
    failed = False

    def stream(chunk: bytes) -> list[bytes]:
        nonlocal failed
        if failed:
            return []
        try:
            return scrub(chunk)
        except Undecodable as exc:
            # Corrupt, cut short or a bomb: what came so far was scrubbed, the rest must not
            # come, and the client must see that the response broke off.
            failed = True
            emit("response_refused", request_id=flow.id, connection_id=flow.client_conn.id,
                 reason=exc.reason, encoding=encoding[:64])
            mitm.cut_off(flow)
            return []

    response.stream = stream


def _point_back(response: http.Response, named: baseurl.BaseUrl | None) -> None:
    """A base-URL client follows a redirect through the proxy, never around it."""
    if named is not None and (location := response.headers.get("location")) and (
        back := baseurl.redirected(location, named)
    ):
        response.headers["location"] = back


def _refused(flow: http.HTTPFlow, emit: Emit, reason: Reason, **detail: str) -> None:
    emit("response_refused", request_id=flow.id, connection_id=flow.client_conn.id,
         reason=reason, **detail)


def _refuse(flow: http.HTTPFlow, emit: Emit, reason: Reason, **detail: str) -> None:
    """A response that cannot be passed on: its audit line, and the flow killed."""
    _refused(flow, emit, reason, **detail)
    flow.kill()


def _answer_instead(flow: http.HTTPFlow, emit: Emit, denial: Denial, **detail: str) -> None:
    """A response head that cannot be passed on, replaced by the proxy's refusal: its audit
    line, and the upstream's body read and dropped (it is never buffered) while the refusal's
    goes in its place once it has ended (on_response, when the head ended the message)."""
    _refused(flow, emit, denial.reason, **detail)
    record = flow.metadata[META]
    record.reason = denial.reason
    answer = deny_response(denial, host=record.host, policy=record.policy, request_id=flow.id)
    body = b"" if flow.request.method == "HEAD" else answer.raw_content or b""

    def instead(chunk: bytes) -> list[bytes]:
        return [] if chunk or not body else [body]  # b"": the upstream's body has ended

    answer.stream = instead
    flow.response = answer
    flow.metadata[_ANSWERED] = body


def _websocket_switch(request: http.Request, response: http.Response) -> bool:
    """A 101 that mitmproxy turns into its WebSocket layer (the same test it applies)."""
    return (
        header(response.headers, b"upgrade").strip().lower() == "websocket"
        and header(request.headers, b"sec-websocket-version").strip() == "13"
    )


def _content_coding(response: http.Response) -> str:
    """The response's content coding as sent, or "" for none (`identity` is none)."""
    encoding = header(response.headers, b"content-encoding")
    return "" if encoding.strip().lower() in ("", "identity") else encoding


def _decoded(response: http.Response) -> None:
    """The headers of a response passed on decoded."""
    del response.headers["content-encoding"]
    response.headers.pop("content-length", None)


def _stream_if_large(response: http.Response) -> bool:
    """Stream a response of unknown or large size; True if it will stream."""
    length = header(response.headers, b"content-length")
    if not length.isdigit() or int(length) > STREAM_OVER:
        response.stream = True
        return True
    return False
