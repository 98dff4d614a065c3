"""The canonical audit lines: one per decided request, one per closed client connection.

Their fields are documented in docs/operations.md; credentials, tokens and query strings never
appear in them (the path is the normalised path without its query).
"""

from __future__ import annotations

import time
from typing import Any

from mitmproxy import http

from sealgate.hostname import Host
from sealgate.hostport import format_hostport

from ..credentials.scrub import Scrubber
from .flowstate import SCRUB, Conn, RequestRecord, header


def request_line(flow: http.HTTPFlow, record: RequestRecord) -> dict[str, Any]:
    request, response = flow.request, flow.response
    server = flow.server_conn
    connect_ms = None
    if server.timestamp_tcp_setup and server.timestamp_start:
        connect_ms = _ms(server.timestamp_tcp_setup - server.timestamp_start)
    scrubbed: Scrubber | None = flow.metadata.get(SCRUB)
    return {
        "request_id": flow.id,
        "connection_id": flow.client_conn.id,
        "sandbox": record.identity.sandbox if record.identity else None,
        "identified_by": record.identity.via if record.identity else None,
        "policy": record.policy,
        "method": request.method,
        "scheme": request.scheme,
        "base_url": True if record.base_url else None,
        "host": record.host,
        "port": record.port,
        "path": record.path,
        "address": str(record.pin.address) if record.pin else None,
        "decision": record.decision,
        "reason": record.reason,
        "rule": record.rule,
        "injected": record.injected or None,
        "overwrote": record.overwrote or None,
        "scrubbed": scrubbed.hits if scrubbed else None,
        "status": response.status_code if response is not None else None,
        "error": None if flow.error is None else flow.error.msg[:200],
        "bytes_out": len(request.raw_content or b""),
        "bytes_in": _body_size(response),
        "dns_ms": _ms(record.pin.dns_seconds) if record.pin else None,
        "connect_ms": connect_ms,
        "total_ms": _ms(time.monotonic() - record.started),
    }


def connection_line(connection_id: str, conn: Conn, *, spliced: bool) -> dict[str, Any]:
    """A closed connection's line; `spliced`: a tunnel relayed socket to socket (engine/splice.py),
    which the engine, not the connection's state, knows."""
    return {
        "connection_id": connection_id,
        "sandbox": conn.identity.sandbox if conn.identity else None,
        "policy": conn.policy.name if conn.policy else None,
        "target": target_text(conn.target),
        "tunnel": conn.tunnel,
        "spliced": spliced,
        "requests": conn.requests,
        "denied": conn.denied,
        "duration_ms": _ms(time.monotonic() - conn.opened),
    }


def target_text(target: tuple[Host, int] | None) -> str | None:
    return None if target is None else format_hostport(target[0].name, target[1])


def _body_size(response: http.Response | None) -> int:
    if response is None:
        return 0
    if response.raw_content is not None:
        return len(response.raw_content)
    length = header(response.headers, b"content-length")
    return int(length) if length.isdigit() else 0


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)
