"""Credentials worked out once (proxy/inject.py): what they write and what an echo looks like."""

from __future__ import annotations

import base64

from issuer.processors import BasicProcessor, BearerProcessor, QueryProcessor
from proxy.inject import credential


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

