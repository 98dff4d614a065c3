"""The answer a refused request gets: the JSON the sandbox reads.

Every refusal is a `Denial` (proxy/errors.py) carrying a `Reason` (sealgate.reasons), whose
member gives the HTTP status, so a code always means the same status wherever it is raised, and
the client always gets the same JSON shape: enough for an agent to correct itself, never a stack
trace, never a credential. The shape is the one the official SDKs parse (openai and anthropic
read `error.message` and `error.type`, and show them in their exceptions), with sealgate's own
fields beside it for tools that read those:

    {"type": "error",
     "error": {"type": "egress_denied", "code": "not_allowed", "message": "sealgate: ...",
               "request_id": "..."},
     "reason": "not_allowed", "detail": "...", "host": "...", "policy": "...", "request_id": "..."}

The request path answers with it, and so does the engine: a failed dial, a head over its bounds.
"""

from __future__ import annotations

import json
import re
from typing import Final
from urllib.parse import quote

from mitmproxy import http
from mitmproxy.net.http import status_codes

from sealgate.reasons import Reason

from ..errors import Denial

# How the engine names its own reason inside a failure message mitmproxy carries: `said` writes
# it, upstream.failure reads it back (OWN_REASON) for the audit line and the refusal.
OWN_REASON: Final = re.compile(r"sealgate: ([a-z0-9_]+)")


def said(reason: Reason, detail: str) -> str:
    return f"sealgate: {reason.value}: {detail}"

ERROR_HEADER: Final = "X-Sealgate-Error"
REALM: Final = 'Basic realm="sealgate"'


def deny_response(
    denial: Denial, *, host: str | None, policy: str | None, request_id: str,
    grpc: bool = False,
) -> http.Response:
    """The refusal a client reads. A gRPC call (`grpc`) gets it in gRPC's own terms besides:
    HTTP 200 with `grpc-status` and `grpc-message` trailers, which gRPC libraries raise as the
    call's error (a bare HTTP status they report only as "status: 403")."""
    message = f"sealgate refused the request ({denial.reason})"
    if denial.detail:
        message += f": {denial.detail}"
    body = {
        "type": "error",
        "error": {
            "type": _error_kind(denial.status),
            "code": denial.reason,
            "message": message,
            "request_id": request_id,
        },
        "reason": denial.reason,
        "detail": denial.detail,
        "host": host,
        "policy": policy,
        "request_id": request_id,
    }
    headers = {
        "Content-Type": "application/json",
        ERROR_HEADER: denial.reason,
        "Cache-Control": "no-store",
    }
    if denial.status == 407:
        headers["Proxy-Authenticate"] = REALM
    if denial.retry_after is not None:
        headers["Retry-After"] = str(denial.retry_after)
    if grpc:
        headers["Content-Type"] = "application/grpc"
        response = http.Response.make(200, b"", headers)
        response.trailers = http.Headers(
            grpc_status=str(_grpc_status(denial.status)),
            grpc_message=quote(message, safe=_GRPC_SAFE),  # gRPC's percent-encoding
        )
        return response
    response = http.Response.make(
        denial.status, json.dumps(body, separators=(",", ":")).encode() + b"\n", headers
    )
    # The reason phrase is what requests' and httpx's raise_for_status() put in their
    # exception ("403 Client Error: Forbidden (sealgate: not_allowed) for url ..."); HTTP/2 has
    # none, and the body says it all anyway.
    phrase = status_codes.RESPONSES.get(denial.status, "Refused")
    response.reason = f"{phrase} (sealgate: {denial.reason})"
    return response


# gRPC status codes (grpc/doc/statuscodes.md) for the HTTP status a refusal has.
_GRPC_CODES: Final = {400: 3, 401: 16, 403: 7, 407: 16, 411: 3, 413: 8, 429: 8, 500: 13}
_GRPC_SAFE: Final = " !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~"  # printable ASCII but %


def _grpc_status(status: int) -> int:
    return _GRPC_CODES.get(status, 14 if status >= 500 else 7)  # 14 UNAVAILABLE


def _error_kind(status: int) -> str:
    if status == 407:
        return "proxy_auth_required"
    if status == 401:
        return "credential_rejected"  # a sealed token outside its time window
    if status in (413, 429):
        return "budget_exceeded"
    if status == 500:
        return "internal_error"
    if status == 503:
        return "proxy_unavailable"  # its audit log, rules or a secret store: not the upstream
    if status > 500:
        return "upstream_unavailable"
    if status in (400, 411):
        return "bad_request"
    return "egress_denied"
