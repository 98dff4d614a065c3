"""One tool call, from the agent's arguments to what it reads back, in the proxy's order:

1. the tool, of the caller's policy; its arguments against its JSON Schema; its template
   filled (tools.py), the path normalised as the proxy normalises one;
2. `decide`: the one decision, asked exactly as for the same request through the proxy; with a
   `credential`, the rule that allows the call must inject it;
3. the budget (the policy's rate and bytes, per sandbox, in this process);
4. the guard: the host resolved, every answer checked (metadata, internal, the host's own and
   the sandbox networks refused whatever the rules say), the address pinned, and a credential
   over plain HTTP only to an allow_networks address (`Decision.secure_for`);
5. the credentials the allowing rule injects, from the broker, written by their processors;
6. the call, to the pinned address (upstream.py), on a connection kept for that address, host,
   port, scheme, TLS settings and sandbox alone (pool.py), or a new one; its answer capped;
7. the answer, refused when it is a slice (206, Content-Range) and a credential was injected,
   scrubbed of every form of those credentials, its `returns` fields picked, and
   scrubbed again as the text the agent reads (a JSON escape decoded could spell a secret);
8. one audit line: the tool, its arguments (secret-looking fields masked, credentials
   scrubbed), the decision and its reason.

A refusal or a failure is the tool's error result (`isError`), with its reason code, as the
proxy's refusal body carries one: never a credential, never an address the guard refused.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from jsonschema import Draft202012Validator

from sealgate.credentials.errors import InjectionError, RequestInapplicable
from sealgate.credentials.httprequest import InMemoryRequest
from sealgate.proxy.calls import (
    Credential,
    Decision,
    Denial,
    HttpRequestTool,
    Identity,
    PathError,
    Policy,
    Question,
    Scrubber,
    Tool,
    ToolArgumentError,
    decide,
    hold,
    is_slice,
    normalize_path,
    select,
)
from sealgate.reasons import Reason

from .service import Service
from .upstream import Answer, send

__all__ = ["Result", "call_tool", "masked", "write_credentials"]

log = logging.getLogger("sealgate.mcp")
_SECRET_KEY: Final = re.compile(r"pass|secret|token|key|auth|cookie|credential|session", re.I)
_URL: Final = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_MAX_AUDIT_ARGUMENTS: Final = 2048
_MAX_AUDIT_VALUE: Final = 256
_ERROR_BODY: Final = 2048  # of an API's error answer, what the agent reads
# Refusals of a call the rules allowed, by what went wrong on the way: the audit's `error`.
_FAILURES: Final = frozenset({
    Reason.CONNECT_FAILED, Reason.UPSTREAM_TLS_FAILED, Reason.UPSTREAM_RESET,
    Reason.UPSTREAM_TIMEOUT, Reason.RESPONSE_TOO_LARGE, Reason.RESPONSE_NOT_JSON,
    Reason.ENCODING_UNSCRUBBABLE, Reason.RESPONSE_SLICED, Reason.SECRET_UNAVAILABLE,
})


@dataclass(frozen=True, slots=True)
class Result:
    """What the agent reads: text, the same as JSON when it is an object, and whether the call
    failed (a refusal, an error answer)."""

    text: str
    structured: dict[str, Any] | None = None
    error: bool = False


@dataclass
class _Call:
    """What the audit line says of one call, filled in as it goes."""

    tool: str
    identity: Identity
    policy: str | None = None
    arguments: Any = None
    decision: str = "deny"
    reason: str | None = None
    detail: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    needles: list[str] = field(default_factory=list)


async def call_tool(service: Service, identity: Identity, policy: Policy,
                    tool: Tool | HttpRequestTool, arguments: dict[str, Any]) -> Result:
    started = time.monotonic()
    record = _Call(tool.name, identity, policy.name, arguments)
    try:
        if not service.audit.healthy:
            # As the proxy: nothing goes out that the audit log cannot account for.
            raise Denial(Reason.AUDIT_UNAVAILABLE, "the audit log cannot be written")
        result = await _run(service, record, policy, tool, arguments)
    except Exception as exc:  # fail closed, as every proxy hook does
        if not isinstance(exc, Denial):
            log.exception("sealgate mcp: tool %s failed", tool.name)  # stderr only
            exc = Denial(Reason.INTERNAL_ERROR, "the call could not be made")
        # Refused (by the schema, the rules, the budget, the guard, a processor), or allowed
        # and then failed on the way (the API, its answer).
        record.decision = "error" if exc.reason in _FAILURES else "deny"
        record.reason = exc.reason.value
        record.detail = record.detail or exc.detail
        result = _refusal(exc.reason, exc.detail, Scrubber(record.needles))
        refused: Denial | None = exc
    else:
        refused = None
    service.audit.emit("tool_call", **_line(record, started))
    if refused is not None:
        # A spent budget's refusal comes late, as the proxy's does: an agent that retries at
        # once gets one refusal a second, not a busy server.
        await hold(refused)
    return result


async def _run(service: Service, record: _Call, policy: Policy, tool: Tool | HttpRequestTool,
               arguments: dict[str, Any]) -> Result:
    errors = sorted(Draft202012Validator(tool.schema).iter_errors(arguments),
                    key=lambda e: list(e.path))
    if errors:
        # The agent reads the validator's words; the audit line only where and which check,
        # since the words quote values the line's own `arguments` may mask.
        record.detail = "arguments: " + ", ".join(
            f"{_where(e)} ({e.validator})" for e in errors[:5])
        shown = "; ".join(f"{_where(e)}: {str(e.message)[:160]}" for e in errors[:5])
        raise Denial(Reason.TOOL_ARGUMENTS_INVALID, f"arguments: {shown}")
    try:
        call = tool.request(arguments)
        path = normalize_path(call.path)
    except (ToolArgumentError, PathError) as exc:
        raise Denial(exc.reason, f"arguments: {exc}") from None
    record.fields.update(method=call.method, scheme=call.scheme, host=call.host.name,
                         port=call.port, path=path)
    decision = decide(service.rules, Question(record.identity, call.host, call.port, call.scheme,
                                              call.method, path, tool=tool.rules_made,
                                              overrides=call.overrides))
    _allowed(decision, record)
    rule = decision.rule
    if tool.credential is not None and not (
            rule is not None and any(i.name == tool.credential for i in rule.inject)):
        raise Denial(Reason.TOOL_CREDENTIAL, f"the rule that allows this call does not inject "
                                             f"{tool.credential!r}")
    key = record.identity.sandbox or f"policy:{policy.name}"
    service.budgets.admit_request(key, policy.budgets, len(call.body or b""))
    pin = await service.guard.pin(call.host, call.port, policy)
    record.fields["address"] = str(pin.address)
    _allowed(decision.secure_for(pin.address), record)
    credentials = await service.broker.credentials(rule.inject if rule else (),
                                                   guard=service.guard, policy=policy)
    request = InMemoryRequest(
        headers=[("Accept", "application/json"), ("Accept-Encoding", "identity"),
                 ("User-Agent", "sealgate-mcp")], path=call.target, body=call.body or b"",
        method=call.method)
    # The caller's own headers (http_request's, checked there) go over ours; then the
    # credentials over both.
    given = {name.lower() for name, _ in call.headers}
    request.headers[:] = [h for h in request.headers if h[0].lower() not in given]
    request.headers.extend(call.headers)
    if call.body is not None and "content-type" not in given:
        request.headers.append(("Content-Type", "application/json"))
    _inject(credentials, request, record)
    if record.needles:  # the answer will be scrubbed, so it comes whole, as the proxy's does
        request.headers[:] = [h for h in request.headers if not is_slice(h[0])]
    service.budgets.open_connection(key, policy.budgets)  # calls at once, per sandbox
    try:
        answer = await send(call, request.path, request.headers,
                            request.body if call.body is not None else None, pin=pin,
                            tls=service.tls, pool=service.pool,
                            owner=(record.identity.sandbox, policy.name),
                            limit=tool.max_response_bytes, timeout=tool.timeout,
                            whole=bool(record.needles))
    finally:
        service.budgets.close_connection(key)
    scrubber = Scrubber(record.needles)
    result = _answered(tool, answer, scrubber)
    record.fields.update(status=answer.status, bytes_in=len(answer.body),
                         scrubbed=scrubber.hits or None)
    if result.error:
        record.decision, record.reason = "error", "upstream_status"
    return result


def _allowed(decision: Decision, record: _Call) -> None:
    record.fields["rule"] = decision.rule.source if decision.rule else None
    if not decision.allowed:
        raise Denial(decision.reason or Reason.NOT_ALLOWED, decision.detail)
    record.decision = decision.verdict
    record.reason = decision.reason.value if decision.reason else None


def _inject(credentials: list[Credential], request: InMemoryRequest, record: _Call) -> None:
    write_credentials(credentials, request, record.needles)
    record.fields["injected"] = [c.label for c in credentials] or None


def write_credentials(credentials: list[Credential], request: InMemoryRequest,
                      needles: list[str]) -> None:
    """Each credential written by its processor; every form of it, and what it wrote besides
    the secret (a signature that is a capability), added to `needles`, to be scrubbed."""
    for cred in credentials:
        needles.extend(cred.needles)
        try:
            written = cred.processor.inject(cred.secret, request, now=time.time())
        except InjectionError as exc:
            raise Denial(cred.inapplicable if isinstance(exc, RequestInapplicable)
                         else exc.reason, str(exc)) from None
        if written is not None:
            needles.append(written)


def _answered(tool: Tool | HttpRequestTool, answer: Answer, scrubber: Scrubber) -> Result:
    body = scrubber.data(answer.body)
    if not 200 <= answer.status < 300:
        shown = body[:_ERROR_BODY].decode("utf-8", "replace")
        return _text(f"the API answered {answer.status}: {shown}", scrubber, error=True)
    try:
        value: Any = json.loads(body) if body.strip() else None
    except ValueError:
        if tool.returns is not None:
            raise Denial(Reason.RESPONSE_NOT_JSON, "the API's answer is not JSON, so its "
                                                   "fields cannot be picked") from None
        return _text(body.decode("utf-8", "replace"), scrubber)
    if tool.returns is not None:
        value = select(value, tool.returns)
    return _text(json.dumps(value, ensure_ascii=False), scrubber)


def _text(text: str, scrubber: Scrubber, *, error: bool = False) -> Result:
    """The text the agent reads, scrubbed as such; its JSON form when it is an object."""
    safe = scrubber.data(text.encode("utf-8", "surrogatepass")).decode("utf-8", "replace")
    try:
        structured = json.loads(safe)
    except ValueError:
        structured = None
    return Result(safe, structured if isinstance(structured, dict) else None, error)


def _refusal(reason: Reason, detail: str, scrubber: Scrubber) -> Result:
    message = f"sealgate refused the call ({reason.value}): {detail}"
    safe = scrubber.data(message.encode()).decode("utf-8", "replace")
    return Result(safe, {"error": {"reason": reason.value, "message": safe}}, error=True)


def _where(error: Any) -> str:
    return "/".join(map(str, error.absolute_path)) or "(the arguments)"


def _line(record: _Call, started: float) -> dict[str, Any]:
    return {
        "request_id": str(uuid.uuid4()),
        "sandbox": record.identity.sandbox,
        "identified_by": record.identity.via,
        "policy": record.policy,
        "tool": record.tool,
        "arguments": masked(record.arguments, Scrubber(record.needles)),
        **record.fields,
        "decision": record.decision,
        "reason": record.reason,
        "detail": record.detail or None,
        "total_ms": round((time.monotonic() - started) * 1000, 1),
    }


def masked(arguments: Any, scrubber: Scrubber) -> str:
    """The arguments as the audit line shows them: fields whose names look secret masked,
    headers' values masked whatever their names (an http_request's: a token fits in any
    header), URLs without query or user information, long values cut, every form of the
    call's credentials scrubbed, at most 2 KiB."""

    def mask(value: Any, key: str = "") -> Any:
        if key and _SECRET_KEY.search(key):
            return "[MASKED]"
        if key.lower() == "headers" and isinstance(value, dict):
            return {str(name): "[MASKED]" for name in value}
        if isinstance(value, str) and _URL.match(value):
            # A URL's query and user information, as the proxy's audit line never logs them
            # (an http_request's `url`, a template's argument that is one).
            try:
                parts = urlsplit(value)
            except ValueError:  # a malformed one: nothing of it is sure to be harmless
                return "[MASKED]"
            value = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path,
                                "[MASKED]" if parts.query else "", ""))
        if isinstance(value, dict):
            return {str(k): mask(v, str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [mask(v) for v in value]
        if isinstance(value, str) and len(value) > _MAX_AUDIT_VALUE:
            return value[:_MAX_AUDIT_VALUE] + "…"
        return value

    text = json.dumps(mask(arguments), ensure_ascii=False)[:_MAX_AUDIT_ARGUMENTS]
    return scrubber.data(text.encode("utf-8", "surrogatepass")).decode("utf-8", "replace")
