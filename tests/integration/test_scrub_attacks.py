"""The outside review's attacks on response scrubbing, through the real proxy.

F4: a sandbox that may send sealed tokens mints one (anyone with the proxy's public key can)
whose secret is the text around an echo of a real credential, the real secret's public
beginning included, and pads its request so that the text is there: needles replaced one after
another, longest first, let the decoy take the real secret's beginning, and the rest of the
secret went out. F5: the needles of one request are bounded (`credentials_too_large`). F6: a
Basic credential's base64 form, alone, is masked too.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from sealgate.credentials import Claims, Destination, seal
from sealgate.credentials.keys import PublicKeyEntry
from sealgate.credentials.processors import (
    BasicProcessor,
    BearerProcessor,
    Processor,
    QueryProcessor,
)
from tests.conftest import KEYS, client
from tests.harness import Origin, Proxy, ProxyFactory, key_digest

REAL = "sk-live-SECRET-0123456789abcdef"
UNKNOWN = "SECRET-0123456789abcdef"  # the part of REAL a sandbox does not know


@pytest.fixture(scope="module")
def aproxy(
    proxy_with: ProxyFactory, token_keys: tuple[Path, PublicKeyEntry], origin_https: Origin
) -> Iterator[Proxy]:
    rules = f"""
version: 1
policies:
  agent:
    tokens: true
    allow:
      - host: api.test
        ports: [{origin_https.port}]
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: agent, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
default_policy: null
"""
    with proxy_with(rules, name="scrub-attacks", token_keys=token_keys[0],
                    canaries=(UNKNOWN,)) as proxy:
        yield proxy


@pytest.fixture()
def origin(origin_https: Origin) -> Iterator[Origin]:
    origin_https.reset()
    yield origin_https
    origin_https.echo = False
    origin_https.reset()


def mint(public: PublicKeyEntry, processor: Processor, port: int, secret: str) -> str:
    now = int(time.time())
    claims = Claims(
        kid=public.kid, secret=secret, processor=processor,
        hosts=(Destination("api.test", port),), exp=now + 300, iat=now,
    )
    return seal(claims, public)


def call(proxy: Proxy, url: str, tokens: list[str], headers: dict[str, str] | None = None,
         session: requests.Session | None = None) -> requests.Response:
    prepared = requests.Request("GET", url, headers=headers or {}).prepare()
    prepared.headers["Proxy-Tokenizer"] = ", ".join(tokens)
    return (session or client(proxy)).send(prepared, timeout=10)


def test_a_decoy_token_around_an_echo_does_not_unmask_the_secret(
    aproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    origin.echo = True  # the request's headers, as JSON, in the order they came
    real = mint(token_keys[1], BearerProcessor(), origin.port, REAL)
    decoy = mint(token_keys[1], QueryProcessor(param="q"), origin.port,
                 "P" * 40 + '", "Authorization": "Bearer sk-live-')
    r = call(aproxy, f"https://api.test:{origin.port}/echo", [real, decoy],
             headers={"X-Pad": "P" * 64})
    assert r.status_code == 200, r.text
    # The echo came, with the pad and the credential next to each other, and all of it from
    # the decoy's text to the secret's end is masked.
    assert '"X-Pad": "' + "P" * 24 + "[REDACTED]" in r.text
    assert UNKNOWN not in r.text and "0123456789abcdef" not in r.text
    assert origin.requests[-1].headers["authorization"] == f"Bearer {REAL}"


def test_a_basic_credentials_base64_alone_is_masked(
    aproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    encoded = base64.b64encode(f"u:{REAL}".encode())
    origin.response_body = b'{"seen": "' + encoded + b'"}'
    r = call(aproxy, f"https://api.test:{origin.port}/basic",
             [mint(token_keys[1], BasicProcessor(username="u"), origin.port, REAL)])
    assert r.status_code == 200, r.text
    assert encoded not in r.content and b"[REDACTED]" in r.content
    assert len(r.content) == len(origin.response_body)


def test_too_many_or_too_long_forms_to_scrub_are_refused(
    aproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    # The review's F5 decoys: 8 query tokens whose secrets make 24 needles, 96 KiB.
    tokens = [
        mint(token_keys[1], QueryProcessor(param=f"k{i}"), origin.port,
             "a" * 2047 + " " + chr(65 + i) * 2048)
        for i in range(8)
    ]
    r = call(aproxy, f"https://api.test:{origin.port}/dos", tokens)
    assert r.status_code == 400, r.text
    assert r.json()["reason"] == "credentials_too_large"
    assert origin.untouched()


def test_a_range_never_goes_with_an_injected_credential(
    aproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    """An answer that echoes the credential, asked for a range at a time, comes back in
    slices the scrubber (which finds whole secrets) cannot see: with a credential injected,
    Range, If-Range and Request-Range (Apache's and squid's older name), under any spelling a
    CGI-style server reads as theirs, never reach the origin, so the answer comes whole and is
    scrubbed whole (found by review). Without a credential they go on: the control."""
    origin.echo = True
    r = call(aproxy, f"https://api.test:{origin.port}/echo",
             [mint(token_keys[1], BearerProcessor(), origin.port, REAL)],
             headers={"Range": "bytes=20-27", "If-Range": '"v1"',
                      "Request-Range": "bytes=20-27", "Request_Range": "bytes=20-27",
                      "If_Range": '"v1"'})
    assert r.status_code == 200, r.text
    seen = origin.requests[-1].headers
    assert seen["authorization"] == f"Bearer {REAL}"
    assert not {n.replace("_", "-") for n in seen} & {"range", "if-range", "request-range"}, seen
    assert UNKNOWN not in r.text and "[REDACTED]" in r.text
    plain = client(aproxy).get(f"https://api.test:{origin.port}/echo", timeout=10,
                               headers={"Range": "bytes=20-27"})
    assert plain.status_code == 200
    assert origin.requests[-1].headers.get("range") == "bytes=20-27"


SLICE = ("Bearer " + REAL)[:27].encode()  # an echo's slice: the secret cut inside UNKNOWN


@pytest.mark.parametrize("answer", ["206 with Content-Range", "206 alone",
                                    "200 with Content-Range", "206 streamed", "206 empty"])
def test_a_slice_answered_to_an_injected_request_never_reaches_the_client(
    aproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin, answer: str
) -> None:
    """No range header the proxy knows of is sent with a credential, but one nobody listed (an
    API's own X-Range) could still make the origin slice an echo of it, and a slice cut inside
    the secret is not the secret the scrubber looks for. So an answer that is a slice (206, or
    a Content-Range) to a request a credential was injected into is replaced by the proxy's
    refusal, and its bytes never reach the client (defence in depth; found by review)."""
    origin.response_status = 200 if answer.startswith("200") else 206
    if "Content-Range" in answer:
        origin.response_headers = {"Content-Range": f"bytes 0-{len(SLICE) - 1}/90"}
    if "streamed" in answer:
        origin.response_chunks = [SLICE[:10], SLICE[10:]]
    elif "empty" in answer:  # no body: mitmproxy's head ends the message
        origin.response_body = b""
    else:
        origin.response_body = SLICE
    path = "/slice/" + answer.replace(" ", "-")
    session = client(aproxy)
    r = call(aproxy, f"https://api.test:{origin.port}{path}",
             [mint(token_keys[1], BearerProcessor(), origin.port, REAL)],
             headers={"X-Range": "bytes=0-26"}, session=session)
    assert origin.requests[-1].headers["authorization"] == f"Bearer {REAL}"
    assert (r.status_code, r.headers.get("x-sealgate-error")) == (502, "response_sliced"), r.text
    assert r.json()["reason"] == "response_sliced" and "content-range" not in r.headers
    assert SLICE not in r.content and UNKNOWN[:8].encode() not in r.content
    request = aproxy.wait_audit(lambda e: e.get("event") == "request" and e.get("path") == path)
    assert (request["status"], request["reason"]) == (502, "response_sliced")
    line = aproxy.wait_audit(lambda e: e.get("event") == "response_refused"
                             and e.get("request_id") == request["request_id"])
    assert (line["reason"], line["status"]) == ("response_sliced", str(origin.response_status))
    # The connection goes on: the upstream's body was read to its end, the refusal's sent whole.
    origin.response_status, origin.response_chunks = 200, None
    origin.response_headers, origin.response_body = {}, b"whole"
    again = call(aproxy, f"https://api.test:{origin.port}/whole{path}",
                 [mint(token_keys[1], BearerProcessor(), origin.port, REAL)], session=session)
    assert (again.status_code, again.content) == (200, b"whole")
    after = aproxy.wait_audit(lambda e: e.get("event") == "request"
                              and e.get("path") == f"/whole{path}")
    assert after["connection_id"] == request["connection_id"]


def test_a_slice_to_a_request_without_a_credential_passes_unchanged(
    aproxy: Proxy, origin: Origin
) -> None:
    """The control: nothing was injected, so nothing can be echoed; a 206 is the origin's."""
    origin.response_status = 206
    origin.response_headers = {"Content-Range": "bytes 20-27/90"}
    origin.response_body = b"20-to-27"
    r = client(aproxy).get(f"https://api.test:{origin.port}/plain-slice", timeout=10,
                           headers={"Range": "bytes=20-27"})
    assert (r.status_code, r.headers["content-range"], r.content) == (
        206, "bytes 20-27/90", b"20-to-27")
    assert "authorization" not in origin.requests[-1].headers
