"""`target.request_target` on HTTP/2 requests built directly: the `host` header beside
`:authority` is a name like any other. (Through the proxy, mitmproxy's HTTP/2 library already
ends such a connection before any hook; tests/security/test_http2.py covers that path.)"""

from __future__ import annotations

import pytest
from mitmproxy import http

from sealgate.hostname import canonical_host
from sealgate.proxy.errors import Denial
from sealgate.proxy.request.target import request_target

TUNNEL = (canonical_host("limited.test"), 8443)


def h2_request(authority: str, host: str | None) -> http.Request:
    request = http.Request.make("GET", f"https://{authority}/x")
    request.http_version = "HTTP/2.0"
    request.authority = authority
    request.headers.pop("host", None)  # make() writes one from the URL
    if host is not None:
        request.headers["host"] = host
    return request


@pytest.mark.parametrize("transparent", [False, True])
@pytest.mark.parametrize("host", ["other.test:8443", "limited.test:9443", "127.0.0.1:8443"])
def test_host_header_disagreeing_with_authority_is_refused(host: str, transparent: bool) -> None:
    request = h2_request("limited.test:8443", host)
    with pytest.raises(Denial) as info:
        request_target(request, None if transparent else TUNNEL, transparent)
    assert info.value.reason == "name_mismatch"


@pytest.mark.parametrize("host", [None, "limited.test:8443", "LIMITED.test.:8443"])
def test_host_header_naming_the_same_target_passes(host: str | None) -> None:
    assert request_target(h2_request("limited.test:8443", host), TUNNEL, False) == TUNNEL
