"""Reading the proxy's refusal out of a response: any object with `status_code`, `headers` and
`content`, which a requests and an httpx response both are.

A refusal carries `X-Sealgate-Error: <reason>` and a JSON body (docs/clients.md):

    {"error": {"type": "egress_denied", "code": "not_allowed", "message": "...",
               "request_id": "..."},
     "reason": "not_allowed", "detail": "...", "host": "...", "policy": "...",
     "request_id": "..."}

The upstream cannot forge one: the proxy removes `X-Sealgate-*` from every upstream response.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

ERROR_HEADER: Final = "X-Sealgate-Error"


class _Response(Protocol):
    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the proxy refused a request. `reason` is a code of docs/rules.md's table."""

    status: int
    reason: str
    type: str  # egress_denied, proxy_auth_required, budget_exceeded, bad_request, ...
    message: str
    detail: str
    host: str | None
    policy: str | None
    request_id: str | None

    def __str__(self) -> str:
        return self.message or f"sealgate refused the request ({self.reason})"


def refusal(response: _Response) -> Refusal | None:
    """The proxy's refusal this response is, or None when it is not one (no X-Sealgate-Error).
    A body that is unread (a streamed httpx response), not JSON or not the expected shape still
    gives the reason from the header."""
    reason = response.headers.get(ERROR_HEADER)
    if not reason:
        return None
    body: Any = None
    try:
        body = json.loads(response.content)
    except Exception:  # unread, not JSON, not UTF-8: the header still says why
        body = None
    if not isinstance(body, dict):
        body = {}
    error = body.get("error")
    if isinstance(error, str):  # the shape before the SDK-readable one: {"error": "<type>"}
        error = {"type": error}
    error = error if isinstance(error, dict) else {}

    def text(value: Any) -> str | None:
        return value if isinstance(value, str) else None

    return Refusal(
        status=response.status_code,
        reason=text(body.get("reason")) or reason,
        type=text(error.get("type")) or "",
        message=text(error.get("message")) or "",
        detail=text(body.get("detail")) or "",
        host=text(body.get("host")),
        policy=text(body.get("policy")),
        request_id=text(body.get("request_id")) or text(error.get("request_id")),
    )
