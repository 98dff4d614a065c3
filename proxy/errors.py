"""Why a request was refused, and the answer the sandbox gets.

Every refusal is a `Denial` carrying a reason code. The HTTP status follows from the code through
one table, so a code always means the same status wherever it is raised, and the client always
gets the same JSON shape: enough for an agent to correct itself, never a stack trace, never a
credential.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from mitmproxy import http

ERROR_HEADER: Final = "X-Sealgate-Error"
REALM: Final = 'Basic realm="sealgate"'

# Reason codes whose status is not the default 403. Everything else that denies egress
# (address and name classes, policy misses, name mismatches) is a 403.
_STATUS: Final[Mapping[str, int]] = {
    # 400: we cannot even parse what was asked for.
    "host_invalid_char": 400,
    "host_userinfo": 400,
    "host_empty": 400,
    "host_empty_label": 400,
    "host_too_long": 400,
    "host_numeric": 400,
    "host_ipv6_unbracketed": 400,
    "host_idna": 400,
    "port_invalid": 400,
    "path_invalid": 400,
    "scheme_invalid": 400,
    "bad_request": 400,
    # Sealed tokens and injection (issuer.token, issuer.processors).
    "token_malformed": 400,
    "token_invalid": 400,
    "token_inapplicable": 400,
    "request_inapplicable": 400,
    "injection_conflict": 400,
    "secret_invalid": 400,
    "processor_invalid": 400,
    "token_expired": 401,
    "length_required": 411,
    # 407: identity.
    "identity_required": 407,
    "identity_invalid": 407,
    "token_binding": 407,
    # 413/429: budgets.
    "request_too_large": 413,
    "budget_exceeded": 429,
    # 5xx: something upstream of the decision failed; the request was not forwarded.
    "dns_nxdomain": 502,
    "dns_no_answer": 502,
    "dns_error": 502,
    "dns_timeout": 504,
    "connect_failed": 502,
    "connect_timeout": 504,
    "internal_error": 500,
    "audit_unavailable": 503,
    "secret_unavailable": 503,
    "rules_unavailable": 503,
}


def status_for(reason: str) -> int:
    return _STATUS.get(reason, 403)


class Denial(Exception):
    """A request the proxy refuses. `detail` is shown to the client; keep secrets out of it."""

    def __init__(self, reason: str, detail: str = "", *, retry_after: int | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
        self.retry_after = retry_after

    @property
    def status(self) -> int:
        return status_for(self.reason)


def deny_response(
    denial: Denial, *, host: str | None, policy: str | None, request_id: str
) -> http.Response:
    body = {
        "error": _error_kind(denial.status),
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
    return http.Response.make(
        denial.status, json.dumps(body, separators=(",", ":")).encode() + b"\n", headers
    )


def _error_kind(status: int) -> str:
    if status == 407:
        return "proxy_auth_required"
    if status in (413, 429):
        return "budget_exceeded"
    if status == 500:
        return "internal_error"
    if status > 500:
        return "upstream_unavailable"
    if status == 400:
        return "bad_request"
    return "egress_denied"
