"""What a message must be before the SDK's server sees it: an ASGI app in front of it.

The SDK parses and checks messages too; this gate is sealgate's own line, stricter and in one
place, so that what reaches a tool is decided here and every refusal is a JSON-RPC error that
says why (never a bare 413 or an HTML page), and nothing of a refused message goes further:

- `POST /mcp` only (405), no `Origin` (403: the endpoint is an agent's, never a web page's,
  whose Origin the spec says must be checked);
- who asks, before the body is read (service.py): credentials that prove nothing, or no policy,
  are 401 offering both schemes, `WWW-Authenticate: Bearer resource_metadata=...` (with
  `error="invalid_token"` when a bearer failed) and `Basic`; a bearer beside another
  credential is 400 (`invalid_request`: which one would it be?);
- a body of at most `max_body` bytes, declared or counted as it comes (413);
- one JSON-RPC 2.0 object: not JSON is -32700, a batch or anything else -32600;
- the 2026-07-28 revision only (`MCP-Protocol-Version`, -32022 naming it): stateless, each
  request whole, with `Mcp-Method` and `Mcp-Name` headers the body must agree with (-32020);
- only the methods this server has (-32601 otherwise) and, for `tools/call`, a tool name
  that is a tool name (no control characters: -32602).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from sealgate.proxy.calls import Decision, Denial, Identity, Policy
from sealgate.reasons import Reason, SealgateError

from .bearer import InvalidToken, challenges
from .service import Service

__all__ = ["IDENTITY", "METHODS", "PROTOCOL_VERSION", "Gate", "Refused", "answer_refused",
           "check_headers", "identify", "parse_message", "posted", "read_body",
           "request_headers"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

PROTOCOL_VERSION: Final = "2026-07-28"
# The 2026-07-28 methods this server has (ping and initialize are gone from that revision).
METHODS: Final = frozenset({"server/discover", "tools/list", "tools/call"})
IDENTITY: Final = "sealgate_identity"  # the scope's state key the handlers read
_TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_B64: Final = re.compile(r"=\?base64\?(.*)\?=")
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS = -32700, -32600, -32601, -32602
MAX_DEPTH: Final = 64  # arrays and objects in a message, nested
BODY_SECONDS: Final = 10.0  # for a request's whole body, from its headers
HEADER_MISMATCH, UNSUPPORTED_VERSION = -32020, -32022


class Refused(SealgateError):
    """A message refused before anything is called: its HTTP status and JSON-RPC error."""

    reason = Reason.BAD_REQUEST

    def __init__(self, status: int, code: int, message: str, *, data: Any = None,
                 headers: tuple[tuple[bytes, bytes], ...] = (), id: Any = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.data = status, code, message, data
        self.headers, self.id = headers, id


class Gate:
    def __init__(self, app: App, service: Service, *, path: str = "/mcp") -> None:
        self.app, self.service, self.path = app, service, path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the lifespan: the SDK's session manager starts there
            await self.app(scope, receive, send)
            return
        try:
            body = await self._admit(scope, receive)
        except Refused as refused:
            await answer_refused(send, refused)
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()  # the client's disconnect, when it comes
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _admit(self, scope: Scope, receive: Receive) -> bytes:
        if scope["path"] != self.path:
            raise Refused(404, INVALID_REQUEST, f"the MCP endpoint is POST {self.path}")
        headers = posted(scope, self.path)
        scope.setdefault("state", {})[IDENTITY] = identify(self.service, scope, headers)[0]
        body = await read_body(scope, receive, headers, self.service.settings.max_body)
        message = parse_message(body)
        check_headers(message, headers)
        return body


def identify(service: Service, scope: Scope, headers: dict[str, str]) -> tuple[Identity, Policy]:
    """Who asks and their policy; Refused (400, 401, 403) when nobody is proven, a bearer comes
    with another credential, or there is no policy."""
    client = scope.get("client")
    authorization = headers.get("authorization")
    resource = service.settings.resource
    try:
        token = _bearer(authorization, resource)
        identity = (service.bearer(token) if token is not None
                    else service.identify(authorization, client[0] if client else None))
    except InvalidToken as exc:
        raise Refused(401, INVALID_REQUEST, f"invalid_token: {exc}",
                      headers=challenges(resource, "invalid_token", str(exc))) from None
    except Denial as exc:
        raise _unauthorized(resource, f"{exc.reason.value}: {exc.detail}") from None
    found = service.policy(identity)
    if isinstance(found, Decision):
        reason = found.reason or Reason.NOT_ALLOWED
        if reason is Reason.IDENTITY_REQUIRED:
            raise _unauthorized(resource, "identify with Authorization: Basic <sandbox id:key> "
                                "or Bearer <token>, or call from a registered sandbox address")
        # Not the spec's 403 insufficient_scope: no token scope could widen a sandbox's policy,
        # so a client's step-up authorization would have nothing to ask for (docs/mcp.md).
        raise Refused(403, INVALID_REQUEST, f"{reason.value}: {found.detail}")
    return identity, found


def _bearer(authorization: str | None, resource: str) -> str | None:
    """The token of `Authorization: Bearer <token>`; None for another scheme or none. A value
    holding a bearer and anything else (`Bearer x, Basic y`, as two credentials joined into
    one header read) is refused: taking either would be a guess (RFC 6750's invalid_request)."""
    if authorization is None:
        return None
    credentials = [one.strip() for one in authorization.split(",")]
    if "bearer" not in (one.partition(" ")[0].lower() for one in credentials):
        return None
    if len(credentials) > 1:
        raise Refused(400, INVALID_REQUEST, "invalid_request: one credential only, a bearer "
                      "or the sandbox's Basic", headers=challenges(
                          resource, "invalid_request", "one credential only"))
    return credentials[0].partition(" ")[2].strip()


def _unauthorized(resource: str, message: str) -> Refused:
    return Refused(401, INVALID_REQUEST, message, headers=challenges(resource))


def posted(scope: Scope, endpoint: str) -> dict[str, str]:
    """The headers of a POST to `endpoint` (named in a refusal) that no web page sent;
    Refused (405, 403) for anything else. Both endpoints' first checks (serve's, the
    gateway's)."""
    if scope["method"] != "POST":
        raise Refused(405, INVALID_REQUEST, f"only POST {endpoint[:80]}",
                      headers=((b"allow", b"POST"),))
    headers = request_headers(scope)
    if "origin" in headers:
        raise Refused(403, INVALID_REQUEST, "requests with an Origin are refused: this "
                                            "endpoint is not for web pages")
    return headers


def request_headers(scope: Scope) -> dict[str, str]:
    """Lower-case name -> value; a routing header sent twice is refused (two readers could
    take different copies)."""
    found: dict[str, str] = {}
    for raw_name, raw_value in scope["headers"]:
        name = raw_name.decode("latin-1").lower()
        if name in found and name in ("mcp-protocol-version", "mcp-method", "mcp-name",
                                      "authorization", "content-length"):
            raise Refused(400, HEADER_MISMATCH, f"the {name} header appears more than once")
        found[name] = raw_value.decode("latin-1")
    return found


async def read_body(scope: Scope, receive: Receive, headers: dict[str, str], limit: int) -> bytes:
    """The request's body, whole, within `limit` bytes and `BODY_SECONDS`: found by review, a
    sandbox could hold every one of the server's connections with bodies that never came."""
    try:
        async with asyncio.timeout(BODY_SECONDS):
            return await _read_body(receive, headers, limit)
    except TimeoutError:
        raise Refused(408, INVALID_REQUEST, f"the body did not come within {BODY_SECONDS:g} s"
                      ) from None


async def _read_body(receive: Receive, headers: dict[str, str], limit: int) -> bytes:
    declared = headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise Refused(413, INVALID_REQUEST, f"a message is at most {limit} bytes")
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Refused(400, INVALID_REQUEST, "the client went away")
        body += message.get("body", b"")
        if len(body) > limit:
            raise Refused(413, INVALID_REQUEST, f"a message is at most {limit} bytes")
        if not message.get("more_body", False):
            return bytes(body)


def parse_message(body: bytes) -> dict[str, Any]:
    try:
        message = json.loads(body, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise Refused(400, PARSE_ERROR, "Parse error: the body is not JSON (NaN and "
                                        "Infinity are not JSON)") from None
    if _deeper_than(message, MAX_DEPTH):
        # What reads a message on (the audit's masking, an upstream's parser) recurses:
        # found by review, a call nested 600 deep went upstream and its audit line failed.
        raise Refused(400, PARSE_ERROR, f"Parse error: nested deeper than {MAX_DEPTH}")
    if not_text(message):
        raise Refused(400, PARSE_ERROR, "Parse error: a string holds a lone surrogate (a "
                                        "\\ud800-\\udfff escape alone), which is no Unicode text")
    if isinstance(message, list):
        raise Refused(400, INVALID_REQUEST, "batch requests are not accepted: send one "
                                            "JSON-RPC request per POST")
    if (not isinstance(message, dict) or message.get("jsonrpc") != "2.0"
            or not isinstance(message.get("method"), str)):
        raise Refused(400, INVALID_REQUEST, "the body must be one JSON-RPC 2.0 request")
    request_id = message.get("id")
    if "id" in message and (isinstance(request_id, bool)
                            or not isinstance(request_id, str | int)):
        raise Refused(400, INVALID_REQUEST, "a request id is a string or an integer")
    return message


def not_text(value: Any) -> bool:
    """Whether a parsed JSON value holds a lone surrogate: JSON's escapes can spell one, no
    UTF-8 can carry it, and what writes the value on (upstream, the audit line, the answer)
    would fail on it mid-way (found by review: internal_error)."""
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return True
    return False


def _no_constant(name: str) -> Any:
    # Python's json takes NaN and Infinity, which no JSON Schema bound refuses (every
    # comparison with NaN is false): found by review, a NaN passed `minimum` and `maximum`.
    raise ValueError(f"{name} is not JSON")


def _deeper_than(value: Any, most: int) -> bool:
    """Whether arrays and objects nest deeper than `most` in `value` (no recursion)."""
    level: list[tuple[Any, int]] = [(value, 0)]
    while level:
        item, depth = level.pop()
        if isinstance(item, dict | list):
            if depth >= most:
                return True
            level.extend((inner, depth + 1)
                         for inner in (item.values() if isinstance(item, dict) else item))
    return False


def check_headers(message: dict[str, Any], headers: dict[str, str]) -> None:
    request_id = message.get("id")
    method: str = message["method"]
    version = headers.get("mcp-protocol-version")
    if version != PROTOCOL_VERSION:
        raise Refused(400, UNSUPPORTED_VERSION, "Unsupported protocol version",
                      data={"supported": [PROTOCOL_VERSION], "requested": version},
                      id=request_id)
    if headers.get("mcp-method") != method:
        raise Refused(400, HEADER_MISMATCH, "the Mcp-Method header does not match the body's "
                                            "method", id=request_id)
    if "id" not in message:
        return  # a notification: acknowledged and dropped by the SDK, nothing is called
    if method not in METHODS:
        raise Refused(404, METHOD_NOT_FOUND, f"Method not found: {method[:64]!r}",
                      id=request_id)
    if method != "tools/call":
        return
    params = message.get("params")
    name = params.get("name") if isinstance(params, dict) else None
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        shown = repr(name)[:80] if isinstance(name, str) else "none"
        raise Refused(400, INVALID_PARAMS, f"tools/call needs the name of a tool (A-Z a-z 0-9 "
                                           f"_ . -), got {shown}", id=request_id)
    if _decoded(headers.get("mcp-name")) != name:
        raise Refused(400, HEADER_MISMATCH, "the Mcp-Name header does not match the body's "
                                            "tool name", id=request_id)


def _decoded(value: str | None) -> str | None:
    """A header value, its `=?base64?...?=` form decoded (the spec's form for non-ASCII)."""
    if value is None or not (match := _B64.fullmatch(value)):
        return value
    try:
        return base64.b64decode(match.group(1), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


async def answer_refused(send: Send, refused: Refused) -> None:
    error: dict[str, Any] = {"code": refused.code, "message": refused.message}
    if refused.data is not None:
        error["data"] = refused.data
    body = json.dumps({"jsonrpc": "2.0", "id": refused.id, "error": error}).encode()
    await send({"type": "http.response.start", "status": refused.status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *refused.headers]})
    await send({"type": "http.response.body", "body": body, "more_body": False})
