"""HTTP/2 inside an intercepted tunnel: the same decisions as HTTP/1.1, on the names HTTP/2 uses.

An HTTP/2 client names its destination in `:authority` and may send a `host` header beside it.
mitmproxy speaks HTTP/2 to the client (the proxy chooses the client's ALPN before any upstream
is dialed) and HTTP/1.1 to these origins, adding `Host` from `:authority` only when the client
sent none: a `host` header that disagrees with `:authority` would reach the origin as sent, so
it is a name the guard must check (domain fronting over HTTP/2). Requests are written with h2's
own validation off, through the session proxy, whose `ci` policy intercepts `limited.test`
(GET /ok/** only) and, in the token tests, a proxy of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.conftest import KEYS
from tests.harness import Origin, Proxy
from tests.security.rawclient import NoResponse, RawResponse, h2_through_tunnel

SESSION = ("bot-1", KEYS["bot-1"])


def h2_request(
    proxy: Proxy, trust: Path, target: str, headers: Sequence[tuple[str, str]]
) -> tuple[RawResponse, str | None]:
    return h2_through_tunnel(proxy.port, target, SESSION, trust, headers)


def get(authority: str, path: str, *extra: tuple[str, str]) -> list[tuple[str, str]]:
    return [(":method", "GET"), (":scheme", "https"), (":authority", authority),
            (":path", path), *extra]


def test_allowed_request_over_h2(
    proxy: Proxy, origins: tuple[Origin, Origin], trust: Path
) -> None:
    _, origin = origins
    target = f"limited.test:{origin.port}"
    response, alpn = h2_request(proxy, trust, target, get(target, "/ok/h2"))
    assert alpn == "h2"
    assert response.status == 200, response.body[:300]
    assert response.body == origin.response_body
    assert [(r.path, r.headers.get("host")) for r in origin.requests] == [("/ok/h2", target)]


def test_policy_miss_over_h2_is_the_json_refusal(
    proxy: Proxy, origins: tuple[Origin, Origin], trust: Path
) -> None:
    _, origin = origins
    target = f"limited.test:{origin.port}"
    response, _ = h2_request(proxy, trust, target, get(target, "/elsewhere"))
    assert (response.status, response.reason) == (403, "not_allowed"), response.body[:300]
    assert response.json()["reason"] == "not_allowed"
    assert origin.untouched()


@pytest.mark.parametrize(
    ("authority", "host"),
    [
        ("other.test:{port}", None),
        ("api.test:{port}", None),
        ("127.0.0.1:{port}", None),
        ("limited.test:{other}", None),
        ("limited.test:{port}", "other.test:{port}"),  # fronting: :authority checked, host sent
        ("limited.test:{port}", "127.0.0.1:{port}"),
        ("limited.test:{port}", "limited.test:{other}"),
    ],
)
def test_every_name_must_be_the_connect_target(
    proxy: Proxy, origins: tuple[Origin, Origin], trust: Path, authority: str, host: str | None
) -> None:
    http_origin, origin = origins
    ports = {"port": origin.port, "other": http_origin.port}
    target = f"limited.test:{origin.port}"
    extra = [("host", host.format(**ports))] if host is not None else []
    try:
        response, _ = h2_request(proxy, trust, target,
                                 get(authority.format(**ports), "/ok/x", *extra))
    except NoResponse:
        # mitmproxy's HTTP/2 library ends the connection (PROTOCOL_ERROR) on a `host` that
        # differs from `:authority` before any hook runs; the guard refuses it too, should that
        # check ever go.
        assert host is not None
    else:
        assert (response.status, response.reason) == (403, "name_mismatch"), response.body[:300]
    assert origin.untouched() and http_origin.untouched()


def test_host_header_equal_to_authority_is_fine(
    proxy: Proxy, origins: tuple[Origin, Origin], trust: Path
) -> None:
    _, origin = origins
    target = f"limited.test:{origin.port}"
    response, _ = h2_request(proxy, trust, target, get(target, "/ok/same", ("host", target)))
    assert response.status == 200, response.body[:300]
    assert [r.path for r in origin.requests] == ["/ok/same"]
