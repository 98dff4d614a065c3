"""One admitted message (gateway.py) sent to its upstream MCP server, and the answer back, in the
proxy's order, with the proxy's code:

1. `decide`, asked as for a POST of the server's url through the proxy; with a `credential`,
   the rule that allows it must inject that one (`tool_credential`);
2. the policy's budget; the guard (resolved, every answer checked, the address pinned); the
   allowing rule's credentials from the broker, written by their processors;
3. the body as it was parsed and checked (serialized again: what was checked is what goes), with
   only the routing headers; on a connection of this sandbox's to the pinned address (pool.py);
4. the answer, JSON or an SSE stream, read up to the server's `max_response_bytes` in all, each
   message scrubbed of every form of the credentials (its raw bytes, and again as written back,
   so an escape decoded cannot spell a secret), `tools/list`'s tools filtered to the listed
   ones; of a stream, only notifications and the answer to this request go on (a server's
   request to the client cannot be answered on a stateless exchange), each event as it comes;
5. one `mcp_gateway` audit line.

A refusal or failure before the answer starts is a JSON-RPC error (for `tools/call`, an error
result the model reads), with its reason code; one in the middle of a stream is a last event
carrying it. The upstream's own 401 or 403 never reaches the agent as such (its challenge would
point the agent at the upstream's authorization server): it is a JSON-RPC error naming the status.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

import aiohttp
from aiohttp.http_exceptions import LineTooLong
from yarl import URL

from sealgate.credentials.httprequest import InMemoryRequest
from sealgate.hostname import Host
from sealgate.hostport import format_hostport
from sealgate.proxy.calls import (
    Decision,
    Denial,
    Identity,
    Pin,
    Policy,
    Question,
    Scrubber,
    decide,
    hold,
    normalize_path,
)
from sealgate.reasons import Reason

from .calls import masked, write_credentials
from .gate import PROTOCOL_VERSION, Send, not_text
from .pool import PoolKey
from .service import Service
from .upstream import failures, read_capped

__all__ = ["Exchange", "relay", "reply", "tool_error"]

log = logging.getLogger("sealgate.mcp")
INTERNAL, INVALID_PARAMS = -32603, -32602
# 2026-07-28's multi-round-trip requests are not relayed either way: an upstream's
# InputRequiredResult (its elicitation or sampling: questions for a user the rules never
# named) and an agent's retry carrying the answers and the upstream's opaque state, which the
# upstream ties to its caller -- here the gateway's credential, shared by every sandbox.
_RELAYED_INPUT = frozenset({"inputResponses", "requestState"})
_NO_INPUT = ("the gateway relays no input requests (elicitation, sampling): not an upstream's, "
             "nor answers to one")
_FAILURES: Final = frozenset({
    Reason.CONNECT_FAILED, Reason.UPSTREAM_TLS_FAILED, Reason.UPSTREAM_RESET,
    Reason.UPSTREAM_TIMEOUT, Reason.RESPONSE_TOO_LARGE, Reason.RESPONSE_NOT_JSON,
    Reason.ENCODING_UNSCRUBBABLE, Reason.SECRET_UNAVAILABLE,
})
_IDENTITY: Final = frozenset({"", "identity"})


class Listed(Protocol):
    @property
    def name(self) -> str: ...


class Upstream(Protocol):
    """What the flow reads of a policy's `mcp_servers` entry (proxy/policy/gateways.py)."""

    @property
    def name(self) -> str: ...
    @property
    def scheme(self) -> Literal["http", "https"]: ...
    @property
    def host(self) -> Host: ...
    @property
    def port(self) -> int: ...
    @property
    def path(self) -> str: ...
    @property
    def credential(self) -> str | None: ...
    @property
    def tools(self) -> tuple[Listed, ...]: ...
    @property
    def max_response_bytes(self) -> int: ...
    @property
    def timeout(self) -> float: ...


@dataclass
class Exchange:
    identity: Identity
    policy: Policy
    server: Upstream
    message: dict[str, Any]
    mcp_name: str | None
    tool: str | None = None
    arguments: Any = None
    refused: str | None = None  # the arguments' refusal by the rules' constraints
    unlisted: bool = False  # a tools/call of a tool the rules do not list
    started: float = 0.0
    fields: dict[str, Any] = field(default_factory=dict)
    needles: list[str] = field(default_factory=list)
    answering: bool = False  # the answer's status line is sent: errors go in the stream
    answered: bool = False  # the answer to the agent's request went out
    ended: bool = False  # the stream's last part went out


async def relay(service: Service, x: Exchange, send: Send) -> None:
    decision, reason, detail = "deny", None, None
    if x.unlisted:
        # What the specification has for an unknown tool: a protocol error. The agent learns
        # no more than that it may not call it; nothing is sent.
        detail = f"no tool named {x.tool!r}"
        service.audit.emit("mcp_gateway", **_line(x, "deny", Reason.NOT_ALLOWED.value, detail))
        await reply(send, 200, json.dumps({"jsonrpc": "2.0", "id": x.message["id"], "error": {
            "code": INVALID_PARAMS, "message": detail}}).encode())
        return
    try:
        if x.refused is not None:
            raise Denial(Reason.TOOL_ARGUMENTS_INVALID, f"arguments: {x.refused}")
        if not service.audit.healthy:
            raise Denial(Reason.AUDIT_UNAVAILABLE, "the audit log cannot be written")
        decision = await _forward(service, x, send)
        reason = "upstream_status" if decision == "error" else None
    except Exception as exc:  # fail closed: the agent gets a refusal, never a traceback
        if not isinstance(exc, Denial):
            log.exception("sealgate mcp gateway: %s failed", x.server.name)  # stderr only
            exc = Denial(Reason.INTERNAL_ERROR, "the request could not be made")
        decision = "error" if exc.reason in _FAILURES else "deny"
        reason, detail = exc.reason.value, exc.detail
        # A spent budget's refusal comes late, as the proxy's and the tools' do: an agent that
        # retries at once gets one refusal a second.
        await hold(exc)
        with contextlib.suppress(OSError):  # the agent went away: nobody left to tell
            await _refuse(x, send, exc.reason.value, exc.detail)
    service.audit.emit("mcp_gateway", **_line(x, decision, reason, detail))


async def _forward(service: Service, x: Exchange, send: Send) -> str:
    server, policy = x.server, x.policy
    params = x.message.get("params")
    if isinstance(params, dict) and not _RELAYED_INPUT.isdisjoint(params):
        raise Denial(Reason.PROTOCOL_NOT_ALLOWED, _NO_INPUT)
    path = normalize_path(server.path)
    x.fields.update(scheme=server.scheme, host=server.host.name, port=server.port, path=path)
    decision = decide(service.rules, Question(x.identity, server.host, server.port,
                                              server.scheme, "POST", path, tool=True))
    _allowed(decision, x)
    rule = decision.rule
    if server.credential is not None and not (
            rule is not None and any(i.name == server.credential for i in rule.inject)):
        raise Denial(Reason.TOOL_CREDENTIAL, f"the rule that allows this server does not "
                                             f"inject {server.credential!r}")
    body = json.dumps(x.message, ensure_ascii=False).encode()
    key = x.identity.sandbox or f"policy:{policy.name}"
    service.budgets.admit_request(key, policy.budgets, len(body))
    pin = await service.guard.pin(server.host, server.port, policy)
    x.fields["address"] = str(pin.address)
    _allowed(decision.secure_for(pin.address), x)
    credentials = await service.broker.credentials(rule.inject if rule else (),
                                                   guard=service.guard, policy=policy)
    method = x.message["method"]
    headers = [("Content-Type", "application/json"),
               ("Accept", "application/json, text/event-stream"),
               ("Accept-Encoding", "identity"), ("MCP-Protocol-Version", PROTOCOL_VERSION),
               ("Mcp-Method", method)]
    if method == "tools/call" and x.mcp_name is not None:
        headers.append(("Mcp-Name", x.mcp_name))  # checked against the body by the gate
    request = InMemoryRequest(headers=headers, path=server.path, body=body, method="POST")
    write_credentials(credentials, request, x.needles)
    x.fields["injected"] = [c.label for c in credentials] or None
    service.budgets.open_connection(key, policy.budgets)
    try:
        outcome = await _send(service, x, pin, request, send)
    finally:
        service.budgets.close_connection(key)
    return decision.verdict if outcome == "allow" else outcome


async def _send(service: Service, x: Exchange, pin: Pin, request: InMemoryRequest,
                send: Send) -> str:
    server = x.server
    default = 443 if server.scheme == "https" else 80
    authority = server.host.name if server.port == default else format_hostport(
        server.host.name, server.port)
    url = URL(f"{server.scheme}://{format_hostport(server.host.name, server.port)}"
              f"{request.path}", encoded=True)
    key = PoolKey(x.identity.sandbox, x.policy.name, server.scheme, server.host.name,
                  server.port, str(pin.address), service.tls if server.scheme == "https"
                  else None)
    with failures(server.host.name, server.timeout):
        async with asyncio.timeout(server.timeout), service.pool.session(key) as session, \
                session.post(url, headers=[("Host", authority), *request.headers],
                             data=request.body, allow_redirects=False) as answer:
            x.fields["status"] = answer.status
            coding = answer.headers.get("Content-Encoding", "").strip().lower()
            if coding not in _IDENTITY:
                raise Denial(Reason.ENCODING_UNSCRUBBABLE,
                             "the upstream answered compressed although asked not to")
            kind = answer.headers.get("Content-Type", "").partition(";")[0].strip().lower()
            x.fields["content_type"] = kind[:64] or None
            if 200 <= answer.status < 300 and kind == "text/event-stream":
                await _stream(x, answer, send)
                return "allow"
            data = await read_capped(answer, server.max_response_bytes)
            x.fields["bytes_in"] = len(data)
            message = _message(x, data)
            if not 200 <= answer.status < 300 and (message is None or "error" not in message):
                await _refuse(x, send, "upstream_status",
                              f"the upstream MCP server answered {answer.status}")
                return "error"
            if message is None:
                raise Denial(Reason.RESPONSE_NOT_JSON, "the upstream's answer is not a JSON-RPC "
                                                       "answer to this request")
            await reply(send, 200, _written(x, message))
            x.answered = True
            return "allow"


async def _stream(x: Exchange, answer: aiohttp.ClientResponse, send: Send) -> None:
    """The upstream's SSE stream, event by event, each scrubbed and filtered as it comes."""
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"text/event-stream"), (b"cache-control", b"no-store")]})
    x.answering = True
    limit, seen, data = x.server.max_response_bytes, 0, bytearray()
    too_large = Denial(Reason.RESPONSE_TOO_LARGE, f"the upstream's stream is over its {limit} "
                                                  "bytes")
    while True:  # ends: the stream's end, the cap, or the server's timeout
        try:
            line = await answer.content.readline(max_line_length=limit + 2)
        except LineTooLong:
            raise too_large from None
        if not line:
            break
        text = line.rstrip(b"\r\n")
        # Every line counts, a dropped one too: found by review, comment lines were free, so
        # an upstream could stream them without end until its timeout.
        seen += len(line)
        x.fields["bytes_in"] = seen
        if seen > limit:
            raise too_large
        if text.startswith(b":") or not (text or data):
            continue  # a comment (a keep-alive ping) or an empty event: dropped as read
        if text.startswith(b"data:"):
            value = text[5:]
            data += (value[1:] if value.startswith(b" ") else value) + b"\n"
        elif not text and data:
            message = _message(x, bytes(data), stream=True)
            data.clear()
            if message is not None:
                await send({"type": "http.response.body", "more_body": True,
                            "body": b"event: message\ndata: " + _written(x, message) + b"\n\n"})
    if not x.answered:
        raise Denial(Reason.RESPONSE_NOT_JSON, "the upstream's stream ended without an answer")
    x.ended = True
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _message(x: Exchange, data: bytes, *, stream: bool = False) -> dict[str, Any] | None:
    """What of an upstream message goes on: the answer to the agent's request (tools/list's
    filtered), or in a stream a notification; None for anything else."""
    scrubber = Scrubber(x.needles)
    try:
        message = json.loads(scrubber.data(data))
    except (ValueError, RecursionError):
        return None
    finally:
        _count(x, scrubber)
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0" or not_text(message):
        return None
    if "method" in message:  # from the server: a notification goes on, a request cannot
        return message if stream and "id" not in message else None
    if (message.get("id") != x.message["id"] or ("result" in message) == ("error" in message)
            or x.answered):  # not this request's answer, or a second one
        return None
    result = message.get("result")
    if isinstance(result, dict) and result.get("resultType") == "input_required":
        raise Denial(Reason.PROTOCOL_NOT_ALLOWED, _NO_INPUT)
    if x.message["method"] == "tools/list" and isinstance(result, dict):
        tools = result.get("tools")
        if isinstance(tools, list):
            listed = {tool.name for tool in x.server.tools}
            kept = [t for t in tools
                    if isinstance(t, dict) and isinstance(t.get("name"), str)
                    and t["name"] in listed]
            x.fields["filtered"] = len(tools) - len(kept)
            result["tools"] = kept
    if stream:
        x.answered = True
    return message


def _written(x: Exchange, message: dict[str, Any]) -> bytes:
    """The message as the agent gets it: written again, and scrubbed again as written.

    Written with its characters as they are (an escape would hide a non-ASCII secret from the
    scrubber), except U+2028, U+2029 and U+0085, escaped after the scrubbing: JSON allows
    them raw, but a client that splits an event stream's lines as Python's splitlines() does
    would take them for line ends, and an upstream's string could then spell an event of its
    own (found by review, NEL by a second one; the other characters splitlines() splits on are
    below U+0020, which JSON escapes)."""
    scrubber = Scrubber(x.needles)
    out = scrubber.data(json.dumps(message, ensure_ascii=False).encode())
    _count(x, scrubber)
    return (out.replace(b"\xe2\x80\xa8", b"\\u2028").replace(b"\xe2\x80\xa9", b"\\u2029")
            .replace(b"\xc2\x85", b"\\u0085"))


def _count(x: Exchange, scrubber: Scrubber) -> None:
    x.fields["scrubbed"] = (x.fields.get("scrubbed") or 0) + scrubber.hits or None


async def _refuse(x: Exchange, send: Send, reason: str, detail: str) -> None:
    """The refusal as the agent reads it: a response, or the stream's last event."""
    if x.answered:  # the answer went out: the stream only needs its end
        if x.answering and not x.ended:
            x.ended = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    request_id = x.message["id"]
    message = (tool_error(request_id, reason, detail) if x.message["method"] == "tools/call"
               else {"jsonrpc": "2.0", "id": request_id, "error": {
                   "code": INTERNAL, "message": f"sealgate refused the request ({reason}): "
                                                f"{detail}", "data": {"reason": reason}}})
    body = Scrubber(x.needles).data(json.dumps(message).encode())
    x.answered = x.ended = True
    if x.answering:
        await send({"type": "http.response.body", "more_body": False,
                    "body": b"event: message\ndata: " + body + b"\n\n"})
    else:
        await reply(send, 200, body)


def tool_error(request_id: Any, reason: str, detail: str) -> dict[str, Any]:
    text = f"sealgate refused the call ({reason}): {detail}"
    return {"jsonrpc": "2.0", "id": request_id, "result": {
        "resultType": "complete", "content": [{"type": "text", "text": text}], "isError": True,
        "structuredContent": {"error": {"reason": reason, "message": text}}}}


async def reply(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _allowed(decision: Decision, x: Exchange) -> None:
    x.fields["rule"] = decision.rule.source if decision.rule else None
    if not decision.allowed:
        raise Denial(decision.reason or Reason.NOT_ALLOWED, decision.detail)


def _line(x: Exchange, decision: str, reason: str | None, detail: str | None
          ) -> dict[str, Any]:
    return {
        "request_id": str(uuid.uuid4()), "sandbox": x.identity.sandbox,
        "identified_by": x.identity.via, "policy": x.policy.name, "server": x.server.name,
        "method": x.message["method"], "tool": x.tool,
        "arguments": None if x.tool is None else masked(x.arguments, Scrubber(x.needles)),
        **x.fields, "decision": decision, "reason": reason, "detail": detail,
        "total_ms": round((time.monotonic() - x.started) * 1000, 1),
    }
