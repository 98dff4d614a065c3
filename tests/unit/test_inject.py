"""Credentials worked out once (credentials/inject.py): what they write, what an echo looks like."""

from __future__ import annotations

import base64

import pytest
from mitmproxy import http

from sealgate.credentials.processors import BasicProcessor, BearerProcessor, QueryProcessor
from sealgate.proxy.credentials.inject import (
    MAX_NEEDLE_BYTES,
    MAX_NEEDLES,
    Injected,
    credential,
    put,
)
from sealgate.proxy.errors import Denial
from sealgate.reasons import Reason


def test_fixed_header_credentials_carry_their_header() -> None:
    cred = credential(BearerProcessor(), "sk-test-value", "token:k:-")
    assert cred.header == (b"Authorization", b"Bearer sk-test-value")
    assert cred.target == "authorization"


def test_basic_credential_scrubs_the_base64_form_too() -> None:
    cred = credential(BasicProcessor(username="ci"), "pw-secret-value", "broker:x")
    encoded = base64.b64encode(b"ci:pw-secret-value").decode()
    assert {"pw-secret-value", f"Basic {encoded}", encoded} <= set(cred.needles)


def test_basic_credentials_base64_alone_is_masked() -> None:
    # The review's F6: an origin that returns just the token part of the header (what it
    # decoded the user from, say) handed the credential back; docs/rules.md says its base64
    # form is masked.
    cred = credential(BasicProcessor(username="u"), "pw-SECRET-0123456789", "broker:x")
    injected = Injected()
    injected.record(cred)
    body = b'{"credential": "dTpwdy1TRUNSRVQtMDEyMzQ1Njc4OQ=="}'
    out = injected.scrubber().data(body)
    assert b"dTpwdy1TRUNSRVQtMDEyMzQ1Njc4OQ" not in out and b"[REDACTED]" in out
    assert len(out) == len(body)


def test_query_credential_scrubs_the_percent_encoded_form_too() -> None:
    cred = credential(QueryProcessor(param="key"), "q/s+e=c d", "broker:x")
    assert cred.header is None and cred.target == "?key"
    assert {"q/s+e=c d", "q%2Fs%2Be%3Dc%20d", "q%2Fs%2Be%3Dc+d"} <= set(cred.needles)


# -- how much a request may give the scrubber to look for (the review's F5) ---------------------


def _injected(*creds: tuple[object, str]) -> Injected:
    injected = Injected()
    for i, (processor, secret) in enumerate(creds):
        injected.record(credential(processor, secret, f"token:{i}"))  # type: ignore[arg-type]
    return injected


def test_the_review_s_decoy_tokens_are_refused() -> None:
    # 8 self-minted query tokens, 'a' * 2047 + ' ' + 2048 bytes each: 24 needles, 96 KiB.
    injected = _injected(
        *((QueryProcessor(param="k"), "a" * 2047 + " " + chr(65 + i) * 2048) for i in range(8))
    )
    with pytest.raises(Denial) as info:
        injected.scrubber()
    assert info.value.reason == "credentials_too_large"
    assert Reason.CREDENTIALS_TOO_LARGE.status == 400


def test_too_many_forms_are_refused() -> None:
    secrets = [f"sk-{i:04d}-" + "x" * 20 for i in range(MAX_NEEDLES + 1)]
    assert _injected(*((BearerProcessor(), s) for s in secrets[:MAX_NEEDLES])).scrubber()
    with pytest.raises(Denial) as info:
        _injected(*((BearerProcessor(), s) for s in secrets)).scrubber()
    assert info.value.reason == "credentials_too_large"


@pytest.mark.parametrize(
    "creds",
    [
        # The longest secret a processor takes, 4096 characters, each of its forms: as a query
        # parameter needing escaping throughout (3 forms, 28 KiB), as Basic with the longest
        # username, as a bearer.
        [(QueryProcessor(param="k"), "/+" * 2048)],
        [(BasicProcessor(username="u" * 256), "p" * 4096)],
        [(BearerProcessor(), "t" * 4096), (QueryProcessor(param="k"), "q" * 4096)],
        # The 8 tokens a request may carry, three forms each, of a realistic length.
        [(QueryProcessor(param=f"k{i}"), f"s/{i} " + "v" * 300) for i in range(8)],
    ],
    ids=["query-4096-escaped", "basic-4096", "bearer-and-query-4096", "8-query-tokens"],
)
def test_real_credential_sets_are_within_the_limits(creds: list[tuple[object, str]]) -> None:
    scrubber = _injected(*creds).scrubber()
    assert len(scrubber.needles) <= MAX_NEEDLES
    assert sum(map(len, scrubber.needles)) <= MAX_NEEDLE_BYTES



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
