"""Credentials worked out once (credentials/inject.py): what they write, what an echo looks like."""

from __future__ import annotations

import base64

import pytest
from mitmproxy import http

from sealgate.issuer.processors import BasicProcessor, BearerProcessor, QueryProcessor
from sealgate.proxy.credentials.inject import Injected, credential, put
from sealgate.proxy.errors import Denial


def test_fixed_header_credentials_carry_their_header() -> None:
    cred = credential(BearerProcessor(), "sk-test-value", "token:k:-")
    assert cred.header == (b"Authorization", b"Bearer sk-test-value")
    assert cred.target == "authorization" and not cred.signs_body


def test_basic_credential_scrubs_the_base64_form_too() -> None:
    cred = credential(BasicProcessor(username="ci"), "pw-secret-value", "broker:x")
    encoded = base64.b64encode(b"ci:pw-secret-value").decode()
    assert {"pw-secret-value", f"Basic {encoded}"} <= set(cred.needles)


def test_query_credential_scrubs_the_percent_encoded_form_too() -> None:
    cred = credential(QueryProcessor(param="key"), "q/s+e=c d", "broker:x")
    assert cred.header is None and cred.target == "?key"
    assert {"q/s+e=c d", "q%2Fs%2Be%3Dc%20d", "q%2Fs%2Be%3Dc+d"} <= set(cred.needles)



# -- the query processor on a mitmproxy request ------------------------------------------------


def _request(target: str) -> http.Request:
    return http.Request(
        "api.test", 443, b"GET", b"https", b"", target.encode(), b"HTTP/1.1",
        http.Headers(), b"", None, 0.0, None,
    )


@pytest.mark.parametrize(
    ("before", "after", "overwrote"),
    [
        # Every api_key goes, the others keep their bytes (case, order, %20), the new one last.
        ("/v1?api_key=dummy&q=1&api_key=x&API_KEY=keep&z=a%20b",
         "/v1?q=1&API_KEY=keep&z=a%20b&api_key=s%2F%20%C3%BC", ["?api_key"]),
        ("/v1", "/v1?api_key=s%2F%20%C3%BC", []),
        ("/v1?", "/v1?api_key=s%2F%20%C3%BC", []),
        ("/v1?a=b+c&&d=%2f&", "/v1?a=b+c&&d=%2f&&api_key=s%2F%20%C3%BC", []),
        # Compared decoded: a server that decodes names would otherwise see a second api_key.
        ("/v1?api%5Fkey=smuggled&api_key", "/v1?api_key=s%2F%20%C3%BC", ["?api_key"]),
        # Decoded once, and `;` is no separator.
        ("/v1?api_key2=1&xapi_key=2&api_key%3D=3&api%255Fkey=4&x=1;api_key=5",
         "/v1?api_key2=1&xapi_key=2&api_key%3D=3&api%255Fkey=4&x=1;api_key=5"
         "&api_key=s%2F%20%C3%BC", []),
    ],
    ids=["issue-9", "no-query", "question-mark-only", "empty-elements", "encoded-name",
         "other-names"],
)
def test_query_credential_rewrites_only_its_parameter(
    before: str, after: str, overwrote: list[str]
) -> None:
    request = _request(before)
    into = Injected()
    cred = credential(QueryProcessor(param="api_key"), "s/ ü", "broker:x")
    put(request, cred, into)
    assert request.data.path == after.encode()
    assert into.overwrote == overwrote
    assert "s%2F%20%C3%BC" in cred.needles  # what was written is what the scrubber looks for


def test_query_credential_refuses_a_target_with_a_fragment() -> None:
    request = _request("/v1?a=1#api_key=x")
    with pytest.raises(Denial) as info:
        put(request, credential(QueryProcessor(param="api_key"), "s", "broker:x"), Injected())
    assert info.value.reason == "request_inapplicable"
    assert request.data.path == b"/v1?a=1#api_key=x"
