"""The control API's client (process/control.py is the server): one request over its unix socket,
and the calls the sandbox runtime (and Kubernetes' pod watcher) makes: an address registered as
a sandbox's and unregistered, and what is registered. Standard library only: the sandbox
runtime imports it through the proxy's face.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Mapping
from ipaddress import IPv4Address, IPv6Address
from pathlib import Path
from typing import Any

from sealgate.reasons import Reason

from ..errors import ProxyError

Address = str | IPv4Address | IPv6Address


class ControlError(ProxyError, OSError):
    """The control API could not be reached, or did not answer in JSON."""

    reason = Reason.REGISTRY_UNAVAILABLE


class SourceRefused(ControlError):
    """The control API answered with a refusal: `reason` is the one it named (`internal_error`
    for a code this side does not know), `detail` its words."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}", reason=reason)
        self.detail = detail


def register_source(control_socket: Path, address: Address, sandbox: str) -> None:
    """Requests from `address` are `sandbox`'s from now on. Raises SourceRefused (an unknown
    sandbox, an address that is not one), ControlError (the proxy is not there)."""
    status, body = call(control_socket, "PUT", f"/v1/sources/{address}", {"sandbox": sandbox})
    if status != 200:
        raise _refused(body)


def unregister_source(control_socket: Path, address: Address) -> bool:
    """Requests from `address` are no sandbox's any more; False if they were none's already.
    Raises SourceRefused, ControlError."""
    status, body = call(control_socket, "DELETE", f"/v1/sources/{address}")
    if status == 200:
        return True
    refused = _refused(body)
    if refused.reason is Reason.NOT_REGISTERED:
        return False
    raise refused


def registered_sources(control_socket: Path) -> dict[str, str]:
    """Every address the registry holds, with its sandbox. Raises ControlError."""
    status, body = call(control_socket, "GET", "/v1/sources")
    sources = body.get("sources")
    if status != 200 or not isinstance(sources, dict):
        raise ControlError(f"control API answered {status} to GET /v1/sources")
    return {str(address): str(sandbox) for address, sandbox in sources.items()}


def _refused(body: Mapping[str, Any]) -> SourceRefused:
    try:
        reason = Reason.of(str(body.get("error")))
    except ValueError:
        reason = Reason.INTERNAL_ERROR
    return SourceRefused(reason, str(body.get("detail")))


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("sealgate", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(str(self._path))


def call(
    socket_path: Path, method: str, path: str, body: dict[str, Any] | None = None,
    *, timeout: float = 10.0,
) -> tuple[int, dict[str, Any]]:
    """One request to the control API: (status, JSON body). Raises ControlError."""
    conn = _UnixConnection(socket_path, timeout)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        status, raw = response.status, response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise ControlError(f"control API at {socket_path} unreachable: {exc}") from None
    finally:
        conn.close()
    try:
        answer = json.loads(raw)
    except ValueError:
        raise ControlError(f"control API answered {status} without JSON") from None
    if not isinstance(answer, dict):
        raise ControlError(f"control API answered {status} with {type(answer).__name__}")
    return status, answer
