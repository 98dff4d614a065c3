"""Sealed tokens through the real proxy to a real HTTPS origin.

The sandbox holds only tokens sealed to the proxy's key; the origin must receive the credential
exactly as each processor says, and the canary secret must appear nowhere the sandbox or the
logs can see it.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import hmac
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import brotli
import pytest
import requests
import zstandard

from sealgate.credentials import (
    AuthDigestBinding,
    Claims,
    Destination,
    SandboxBinding,
    seal,
)
from sealgate.credentials.keys import PublicKeyEntry, generate
from sealgate.credentials.processors import (
    BasicProcessor,
    BearerProcessor,
    HeaderProcessor,
    HmacProcessor,
    PlaceholderProcessor,
    Processor,
    QueryProcessor,
)
from tests.conftest import KEYS, client
from tests.harness import Origin, Proxy, ProxyFactory, key_digest
from tests.security.rawclient import (
    RawResponse,
    h2_get,
    open_tunnel,
    proxy_auth,
    read_response,
    request_bytes,
    tls_wrap,
)

CANARY = "sk_live_CANARY_4b1d9f2e7c"


@pytest.fixture(scope="module")
def tproxy(
    proxy_with: ProxyFactory, token_keys: tuple[Path, PublicKeyEntry], origin_https: Origin,
    origin_http: Origin,
) -> Iterator[Proxy]:
    rules = f"""
version: 1
policies:
  agent:
    tokens: true
    allow:
      - host: api.test
        ports: [{origin_https.port}, {origin_http.port}]
    allow_networks: [127.0.0.1/32]
  plain:
    allow:
      - host: api.test
        ports: [{origin_https.port}]
        methods: [GET]
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: agent, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
  closed-1: {{policy: plain, key_sha256: "{key_digest(KEYS['closed-1'])}"}}
default_policy: null
"""
    with proxy_with(rules, name="tokens", token_keys=token_keys[0], canaries=(CANARY,)) as p:
        yield p


def mint(
    public: PublicKeyEntry, processor: Processor, port: int, *, secret: str = CANARY,
    ttl: int = 300, host: str = "api.test", **extra: object,
) -> str:
    now = int(time.time())
    claims = Claims(
        kid=public.kid, secret=secret, processor=processor,
        hosts=(Destination(host, port),), exp=now + ttl, iat=now, **extra,  # type: ignore[arg-type]
    )
    return seal(claims, public)


def call(proxy: Proxy, url: str, token: str | list[str], sandbox: str = "bot-1",
         **kwargs: object) -> requests.Response:
    headers = dict(kwargs.pop("headers", {}) or {})  # type: ignore[call-overload]
    session = client(proxy, sandbox)
    tokens = [token] if isinstance(token, str) else token
    prepared = requests.Request(kwargs.pop("method", "GET"), url, headers=headers,  # type: ignore[arg-type]
                                **kwargs).prepare()  # type: ignore[arg-type]
    for t in tokens:
        prepared.headers["Proxy-Tokenizer"] = t  # requests folds repeats; one is enough here
    return session.send(prepared, timeout=10)


def raw_call(
    proxy: Proxy, port: int, target: str, headers: list[tuple[str, str]], sandbox: str = "bot-1"
) -> RawResponse:
    """One HTTP/1.1 request to api.test:`port`, its request line and header fields exactly as
    given (requests would requote the target and fold repeated fields)."""
    authority = f"api.test:{port}"
    sock, head = open_tunnel(
        proxy.port, authority, [("Proxy-Authorization", proxy_auth(sandbox, KEYS[sandbox]))]
    )
    with sock:
        assert head.status == 200, head.body[:300]
        with tls_wrap(sock, "api.test", proxy.ca) as tls:
            tls.sendall(request_bytes(
                "GET", target, [("Host", authority), *headers, ("Connection", "close")]
            ))
            return read_response(tls)


@pytest.fixture()
def origin(origin_https: Origin) -> Iterator[Origin]:
    origin_https.reset()
    yield origin_https
    origin_https.echo = False


@pytest.mark.parametrize(
    ("processor", "check"),
    [
        (BearerProcessor(), lambda s: s.headers["authorization"] == f"Bearer {CANARY}"),
        (HeaderProcessor(header="X-Api-Key", format="key={secret}"),
         lambda s: s.headers["x-api-key"] == f"key={CANARY}"),
        (BasicProcessor(username="ci"),
         lambda s: s.headers["authorization"]
         == "Basic " + base64.b64encode(f"ci:{CANARY}".encode()).decode()),
        (QueryProcessor(param="api_key"), lambda s: f"api_key={CANARY}" in s.path),
    ],
    ids=["bearer", "header", "basic", "query"],
)
def test_processors_round_trip(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin, processor: Processor,
    check: object,
) -> None:
    token = mint(token_keys[1], processor, origin.port)
    r = call(tproxy, f"https://api.test:{origin.port}/v1/x?a=1", token,
             headers={"X-Api-Key": "sandbox-tried-this"})
    assert r.status_code == 200, r.text
    seen = origin.requests[-1]
    assert check(seen)  # type: ignore[operator]
    assert "proxy-tokenizer" not in seen.headers
    if isinstance(processor, HeaderProcessor):  # the injected value overwrites the sandbox's
        assert "sandbox-tried-this" not in str(seen.headers)


def test_hmac_signs_the_exact_body(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    processor = HmacProcessor(header="X-Signature", format="sha256={signature}", encoding="hex")
    body = b'{"amount": 100}'
    r = call(tproxy, f"https://api.test:{origin.port}/hook",
             mint(token_keys[1], processor, origin.port), method="POST", data=body)
    assert r.status_code == 200, r.text
    seen = origin.requests[-1]
    expected = hmac.new(CANARY.encode(), body, hashlib.sha256).hexdigest()
    assert seen.body == body
    assert seen.headers["x-signature"] == f"sha256={expected}"


def test_placeholder_replaced_only_where_put(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    processor = PlaceholderProcessor(header="Authorization", placeholder="sg-placeholder-1")
    token = mint(token_keys[1], processor, origin.port)
    r = call(tproxy, f"https://api.test:{origin.port}/p", token,
             headers={"Authorization": "Bearer sg-placeholder-1"})
    assert r.status_code == 200
    assert origin.requests[-1].headers["authorization"] == f"Bearer {CANARY}"


def test_echoed_secret_is_scrubbed(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    origin.echo = True
    r = call(tproxy, f"https://api.test:{origin.port}/echo",
             mint(token_keys[1], BasicProcessor(username="u"), origin.port))
    assert r.status_code == 200
    assert CANARY not in r.text
    assert base64.b64encode(f"u:{CANARY}".encode()).decode() not in r.text
    assert "[REDACTED]" in r.text
    line = tproxy.wait_audit(lambda e: e.get("path") == "/echo")
    assert line["scrubbed"] >= 1


@pytest.mark.parametrize(
    ("mutate", "status", "reason"),
    [
        (lambda t: "not-a-token", 400, "token_malformed"),
        (lambda t: t[:-10], 400, "token_invalid"),
        (lambda t: t[:-2] + ("A" if t[-2] != "A" else "B") + t[-1], 400, "token_invalid"),
        (lambda t: t.replace(t.split(".")[1], "0" * 16), 400, "token_invalid"),
    ],
    ids=["garbage", "truncated", "flipped", "unknown-kid"],
)
def test_bad_tokens(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin, mutate: object,
    status: int, reason: str,
) -> None:
    token = mutate(mint(token_keys[1], BearerProcessor(), origin.port))  # type: ignore[operator]
    r = call(tproxy, f"https://api.test:{origin.port}/bad", token)
    assert r.status_code == status, r.text
    assert r.json()["reason"] == reason
    assert token not in r.text
    assert origin.untouched()


def test_expired_token_401(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    now = int(time.time())
    claims = Claims(kid=token_keys[1].kid, secret=CANARY, processor=BearerProcessor(),
                    hosts=(Destination("api.test", origin.port),), exp=now - 120, iat=now - 600)
    r = call(tproxy, f"https://api.test:{origin.port}/old", seal(claims, token_keys[1]))
    assert r.status_code == 401
    assert r.json()["reason"] == "token_expired"
    assert origin.untouched()


def test_token_for_another_host_403(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    token = mint(token_keys[1], BearerProcessor(), origin.port, host="other.test")
    r = call(tproxy, f"https://api.test:{origin.port}/scope", token)
    assert r.status_code == 403
    assert r.json()["reason"] == "token_scope"
    assert origin.untouched()


def test_binding_to_another_sandbox_407(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    token = mint(token_keys[1], BearerProcessor(), origin.port,
                 binding=SandboxBinding("someone-else"))
    r = call(tproxy, f"https://api.test:{origin.port}/bind", token)
    assert r.status_code == 407
    assert r.json()["reason"] == "token_binding"
    ok = mint(token_keys[1], BearerProcessor(), origin.port, binding=SandboxBinding("bot-1"))
    assert call(tproxy, f"https://api.test:{origin.port}/bind", ok).status_code == 200


def test_auth_digest_binding(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    token = mint(token_keys[1], BearerProcessor(), origin.port,
                 binding=AuthDigestBinding.of_secret("bearer-secret-1"))
    assert call(tproxy, f"https://api.test:{origin.port}/d", token).status_code == 407


def test_policy_without_tokens_refuses_them(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    token = mint(token_keys[1], BearerProcessor(), origin.port)
    r = call(tproxy, f"https://api.test:{origin.port}/nt", token, sandbox="closed-1")
    assert r.status_code == 403
    assert r.json()["reason"] == "tokens_not_allowed"
    assert origin.untouched()


def test_no_injection_over_plain_http(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin_http: Origin
) -> None:
    origin_http.reset()
    token = mint(token_keys[1], BearerProcessor(), origin_http.port)
    r = call(tproxy, f"http://api.test:{origin_http.port}/plain", token)
    assert r.status_code == 403
    assert r.json()["reason"] == "insecure_upstream"
    assert origin_http.untouched()


def test_large_streamed_echo_is_scrubbed(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    pad = b"p" * (1536 * 1024)  # past the 1 MiB streaming threshold
    origin.response_body = pad + CANARY.encode() + pad
    try:
        r = call(tproxy, f"https://api.test:{origin.port}/big-echo",
                 mint(token_keys[1], BearerProcessor(), origin.port))
    finally:
        origin.response_body = b"hello from origin\n"
    assert r.status_code == 200
    assert len(r.content) == 2 * len(pad) + len(CANARY)
    assert CANARY.encode() not in r.content
    assert b"[REDACTED]" in r.content


def test_missing_placeholder_is_token_inapplicable(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    processor = PlaceholderProcessor(header="Authorization", placeholder="sg-placeholder-1")
    r = call(tproxy, f"https://api.test:{origin.port}/p",
             mint(token_keys[1], processor, origin.port),
             headers={"Authorization": "Bearer something-else"})
    assert r.status_code == 400
    assert r.json()["reason"] == "token_inapplicable"
    assert origin.untouched()


def test_scope_and_binding_checked_again_for_another_request(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    """The proxy remembers the request a token last passed for; nothing else may ride on it."""
    base = f"https://api.test:{origin.port}"
    token = mint(token_keys[1], BearerProcessor(), origin.port, methods=("GET",), paths=("/v1",),
                 binding=AuthDigestBinding.of_secret("bearer-secret-1"))
    bound = {"Proxy-Authorization": "Bearer bearer-secret-1"}
    outcomes = [
        call(tproxy, f"{base}/v1/a", token, headers=bound).status_code,
        call(tproxy, f"{base}/v2", token, headers=bound).status_code,
        call(tproxy, f"{base}/v1/a", token, method="POST", headers=bound).status_code,
        call(tproxy, f"{base}/v1/a", token).status_code,
        call(tproxy, f"{base}/v1/a", token, headers=bound).status_code,
    ]
    assert outcomes == [200, 403, 403, 407, 200]
    assert [r.path for r in origin.requests] == ["/v1/a", "/v1/a"]


def test_conflicting_credentials_refused(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    bearer = mint(token_keys[1], BearerProcessor(), origin.port)
    placeholder = mint(token_keys[1], PlaceholderProcessor(header="Authorization",
                                                     placeholder="sg-placeholder-1"), origin.port)
    r = call(tproxy, f"https://api.test:{origin.port}/both", f"{placeholder}, {bearer}",
             headers={"Authorization": "Bearer sg-placeholder-1"})
    assert r.status_code == 400
    assert r.json()["reason"] == "injection_conflict"
    assert origin.untouched()


def test_two_fixed_credentials_for_one_header_the_later_wins(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    first = mint(token_keys[1], HeaderProcessor(header="X-Api-Key", format="{secret}"),
                 origin.port, secret="first-secret-value")
    second = mint(token_keys[1], HeaderProcessor(header="x-api-key", format="{secret}"),
                  origin.port)
    r = call(tproxy, f"https://api.test:{origin.port}/two", f"{first}, {second}",
             headers={"X-Api-Key": "from-the-sandbox"})
    assert r.status_code == 200, r.text
    assert origin.requests[-1].values("x-api-key") == [CANARY]
    line = tproxy.wait_audit(lambda e: e.get("path") == "/two")
    assert line["overwrote"] == ["x-api-key"]
    assert len(line["injected"]) == 2


def test_token_over_http2(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    origin.echo = True
    target = f"api.test:{origin.port}"
    token = mint(token_keys[1], BearerProcessor(), origin.port)
    r = h2_get(tproxy.port, target, ("bot-1", KEYS["bot-1"]), tproxy.ca, "/h2",
               [("proxy-tokenizer", token)])
    assert r.status == 200, r.body[:300]
    seen = origin.requests[-1]
    assert seen.headers["authorization"] == f"Bearer {CANARY}"
    assert "proxy-tokenizer" not in seen.headers
    assert CANARY.encode() not in r.body and b"[REDACTED]" in r.body


def test_chunked_echo_in_small_pieces_arrives_whole_and_scrubbed(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    # Chunks shorter than the secret: the scrubber holds bytes back, and must never hand
    # mitmproxy an empty chunk (which would end the chunked body early).
    body = b"head-" + CANARY.encode() + b"-middle-" + CANARY.encode() + b"-tail"
    origin.response_chunks = [body[i : i + 3] for i in range(0, len(body), 3)]
    r = call(tproxy, f"https://api.test:{origin.port}/chunks",
             mint(token_keys[1], BearerProcessor(), origin.port))
    assert r.status_code == 200
    assert r.content == body.replace(CANARY.encode(), (b"[REDACTED]" * 3)[: len(CANARY)])
    assert CANARY.encode() not in r.content


def refused(proxy: Proxy, path: str) -> dict[str, Any]:
    """The `response_refused` audit line of the request to `path`."""
    request = proxy.wait_audit(lambda e: e.get("event") == "request" and e.get("path") == path)
    return proxy.wait_audit(lambda e: e.get("event") == "response_refused"
                            and e.get("request_id") == request["request_id"])


def _compress(coding: str, body: bytes) -> bytes:
    if coding in ("gzip", "x-gzip"):
        return gzip.compress(body)
    if coding == "br":
        return bytes(brotli.compress(body))
    return zstandard.ZstdCompressor().compress(body)


@pytest.mark.parametrize("coding", ["gzip", "zstd"])
def test_large_compressed_echo_is_decoded_and_scrubbed(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin, coding: str
) -> None:
    """An upstream that compresses although asked for identity, with a body too large to
    buffer: streamed, decoded on the way, scrubbed."""
    # Incompressible: past 1 MiB compressed.
    body = os.urandom(768 * 1024) + CANARY.encode() + os.urandom(768 * 1024)
    origin.response_headers = {"Content-Encoding": coding}
    origin.response_body = _compress(coding, body)
    r = call(tproxy, f"https://api.test:{origin.port}/zipped",
             mint(token_keys[1], BearerProcessor(), origin.port))
    assert r.status_code == 200
    assert "content-encoding" not in r.headers
    assert len(r.content) == len(body)
    assert CANARY.encode() not in r.content
    assert b"[REDACTED]" in r.content


@pytest.mark.parametrize("coding", ["gzip", "x-gzip", "zstd"])
def test_small_compressed_echo_is_passed_on_decoded_and_scrubbed(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin, coding: str
) -> None:
    body = b"echo " + CANARY.encode() + b" done"
    origin.response_headers = {"Content-Encoding": coding}
    origin.response_body = _compress(coding, body)
    r = call(tproxy, f"https://api.test:{origin.port}/small-zip",
             mint(token_keys[1], BearerProcessor(), origin.port))
    assert r.status_code == 200
    assert "content-encoding" not in r.headers
    assert r.headers["content-length"] == str(len(body))
    assert r.content == body.replace(CANARY.encode(), (b"[REDACTED]" * 3)[: len(CANARY)])


@pytest.mark.parametrize("chunked", [False, True], ids=["buffered", "streamed"])
def test_identity_named_as_a_coding_is_scrubbed_as_it_is(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin, chunked: bool
) -> None:
    body = b"echo " + CANARY.encode()
    origin.response_headers = {"Content-Encoding": "identity"}
    if chunked:
        origin.response_chunks = [body[:7], body[7:]]
    else:
        origin.response_body = body
    r = call(tproxy, f"https://api.test:{origin.port}/identity/{chunked}",
             mint(token_keys[1], BearerProcessor(), origin.port))
    assert r.status_code == 200
    assert r.content == body.replace(CANARY.encode(), (b"[REDACTED]" * 3)[: len(CANARY)])


@pytest.mark.parametrize("chunked", [False, True], ids=["buffered", "streamed"])
@pytest.mark.parametrize("coding", ["x-secret-sauce", "br", "gzip, gzip", "gzip\ngzip"])
def test_echo_in_a_coding_that_cannot_be_decoded_is_refused(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin, coding: str,
    chunked: bool,
) -> None:
    """An unknown coding, stacked codings (in one header or two), or brotli (whose decoder
    here cannot be bounded): the secret inside could not be found, so the response never
    reaches the sandbox."""
    path = f"/opaque/{len(coding)}{coding[:4]}/{chunked}"
    body = b"echo " + CANARY.encode()
    if coding == "br":
        body = _compress("br", body)
    elif coding.startswith("gzip"):
        body = gzip.compress(gzip.compress(body))
    origin.response_headers = {"Content-Encoding": coding}
    if "\n" in coding:  # two Content-Encoding fields, the first alone would look decodable
        origin.response_headers = {"Content-Encoding": "gzip", "content-encoding": "gzip"}
        coding = "gzip, gzip"
    if chunked:
        origin.response_chunks = [body[:5], body[5:]]
    else:
        origin.response_body = body
    with pytest.raises(requests.ConnectionError):
        call(tproxy, f"https://api.test:{origin.port}{path}",
             mint(token_keys[1], BearerProcessor(), origin.port))
    line = refused(tproxy, path)
    assert (line["reason"], line["encoding"]) == ("encoding_unscrubbable", coding)


def test_buffered_echo_that_fails_to_decode_is_refused(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    body = gzip.compress(b"echo " + CANARY.encode())
    origin.response_headers = {"Content-Encoding": "gzip"}
    origin.response_body = body[:-8] + b"\0" * 8  # CRC and length wrong
    with pytest.raises(requests.ConnectionError):
        call(tproxy, f"https://api.test:{origin.port}/corrupt",
             mint(token_keys[1], BearerProcessor(), origin.port))
    assert refused(tproxy, "/corrupt")["reason"] == "decode_failed"


@pytest.mark.parametrize("broken", ["corrupt", "bomb"])
def test_streamed_echo_that_fails_to_decode_cuts_the_client_off(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin, broken: str
) -> None:
    """Part of the body went out when the rest turns out corrupt (or a chunk decodes past the
    limit): the client's connection is closed at once, without the end of the chunked body,
    so it sees a broken response instead of waiting, or of taking a cut one as whole."""
    first = b"first part " + CANARY.encode() + os.urandom(4096)
    if broken == "corrupt":
        coding, good, rest = "gzip", gzip.compress(first), b"\xff" * 64
    else:
        # The limit holds per decoding call, so the bomb must arrive in one read: 64 MiB of
        # zstd in 2 KiB does (a gzip bomb needs 64 KiB, which TLS records may split into
        # pieces each within the limit: the test once passed the whole body as allowed).
        params = zstandard.ZstdCompressionParameters.from_level(
            19, window_log=20, write_content_size=False
        )
        zstd = zstandard.ZstdCompressor(compression_params=params)
        coding, good = "zstd", zstd.compress(first)
        rest = zstd.compress(bytes(64 << 20))
        assert len(rest) < 4096
    origin.response_headers = {"Content-Encoding": coding}
    origin.response_chunks = [good, rest]
    started = time.monotonic()
    with pytest.raises((requests.ConnectionError, requests.exceptions.ChunkedEncodingError)):
        call(tproxy, f"https://api.test:{origin.port}/broken/{broken}",
             mint(token_keys[1], BearerProcessor(), origin.port))
    assert time.monotonic() - started < 9  # closed, not left to call()'s 10 s read timeout
    line = refused(tproxy, f"/broken/{broken}")
    assert line["reason"] == ("decode_failed" if broken == "corrupt" else "decoded_too_large")


def test_transfer_codings_are_not_asked_for_on_injected_requests(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    token = mint(token_keys[1], BearerProcessor(), origin.port)
    call(tproxy, f"https://api.test:{origin.port}/te1", token,
         headers={"TE": "gzip;q=1.0, Trailers"})
    call(tproxy, f"https://api.test:{origin.port}/te2", token, headers={"TE": "gzip, deflate"})
    assert origin.requests[0].values("te") == ["trailers"]
    assert origin.requests[1].values("te") == []


def test_response_in_a_transfer_coding_is_refused(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    """mitmproxy passes a transfer-coded body on as it came: it cannot be scrubbed."""
    origin.response_headers = {"Transfer-Encoding": "gzip, chunked"}
    origin.response_chunks = [gzip.compress(b"echo " + CANARY.encode())]
    with pytest.raises(requests.ConnectionError):
        call(tproxy, f"https://api.test:{origin.port}/te",
             mint(token_keys[1], BearerProcessor(), origin.port))
    line = refused(tproxy, "/te")
    assert (line["reason"], line["encoding"]) == ("encoding_unscrubbable", "gzip,chunked")


@pytest.mark.parametrize(
    "fields",
    [[""], [" , "], ["{t},"], ["{t}", ""], [", ".join(["{t}"] * 9)]],
    ids=["empty", "commas", "trailing-comma", "empty-second-field", "nine-tokens"],
)
def test_a_tokenizer_header_without_a_token_in_every_element_is_refused(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin, fields: list[str]
) -> None:
    """A present Proxy-Tokenizer header is read as a list of tokens, even when empty: an
    element that holds none is `token_malformed`, never a request forwarded without its
    credential."""
    token = mint(token_keys[1], BearerProcessor(), origin.port)
    r = raw_call(tproxy, origin.port, "/list",
                 [("Proxy-Tokenizer", f.format(t=token)) for f in fields])
    assert (r.status, r.reason) == (400, "token_malformed"), r.body[:300]
    assert origin.untouched()


def test_policy_without_tokens_refuses_even_an_empty_tokenizer_header(
    tproxy: Proxy, origin: Origin
) -> None:
    r = raw_call(tproxy, origin.port, "/empty", [("Proxy-Tokenizer", "")], sandbox="closed-1")
    assert (r.status, r.reason) == (403, "tokens_not_allowed"), r.body[:300]
    assert origin.untouched()


def test_tokens_in_two_tokenizer_fields_are_all_applied(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin
) -> None:
    a = mint(token_keys[1], HeaderProcessor(header="X-A", format="{secret}"), origin.port)
    b = mint(token_keys[1], HeaderProcessor(header="X-B", format="{secret}"), origin.port)
    r = raw_call(tproxy, origin.port, "/fields",
                 [("Proxy-Tokenizer", f" {a}\t"), ("Proxy-Tokenizer", b)])
    assert r.status == 200, r.body[:300]
    seen = origin.requests[-1]
    assert (seen.values("x-a"), seen.values("x-b")) == ([CANARY], [CANARY])
    assert seen.values("proxy-tokenizer") == []


@pytest.mark.parametrize(
    ("target", "forwarded", "overwrote"),
    [
        ("/q/1?api_key=dummy&q=1&api_key=x&API_KEY=keep&z=a%20b",
         "/q/1?q=1&API_KEY=keep&z=a%20b&api_key={s}", ["?api_key"]),
        ("/q/2?X-Amz-Signature=ab%2Fc&X-Amz-Date=20250101T000000Z&a=b+c&&api%5Fkey=2",
         "/q/2?X-Amz-Signature=ab%2Fc&X-Amz-Date=20250101T000000Z&a=b+c&&api_key={s}",
         ["?api_key"]),
        ("/q/3?", "/q/3?api_key={s}", []),
        ("/q/4", "/q/4?api_key={s}", []),
    ],
    ids=["issue-9", "presigned", "question-mark-only", "no-query"],
)
def test_query_token_rewrites_only_its_parameter_on_the_wire(
    tproxy: Proxy, token_keys: tuple[Path, PublicKeyEntry], origin: Origin, target: str,
    forwarded: str, overwrote: list[str],
) -> None:
    """The request line the origin reads: every other parameter byte for byte as the sandbox
    sent it, the secret percent-encoded in the one parameter, appended last."""
    secret = f"{CANARY} /&=+ü"
    token = mint(token_keys[1], QueryProcessor(param="api_key"), origin.port, secret=secret)
    r = raw_call(tproxy, origin.port, target, [("Proxy-Tokenizer", token)])
    assert r.status == 200, r.body[:300]
    encoded = f"{CANARY}%20%2F%26%3D%2B%C3%BC"
    assert origin.requests[-1].path.encode("latin-1") == forwarded.format(s=encoded).encode()
    path = target.partition("?")[0]
    line = tproxy.wait_audit(lambda e: e.get("event") == "request" and e.get("path") == path)
    assert line["overwrote"] == (overwrote or None)


def test_a_revoked_key_goes_on_reload_even_when_the_rules_are_broken(
    tmp_path: Path, proxy_with: ProxyFactory, origin_https: Origin
) -> None:
    """Keys and rules reload each on their own: removing a key file revokes its tokens at the
    next SIGHUP although the rules file is broken meanwhile (the rules in force stay)."""
    key_dir = tmp_path / "keys"
    key_dir.mkdir()
    revoked, kept = generate(key_dir), generate(key_dir)
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
"""
    url = f"https://api.test:{origin_https.port}/revoke"
    processor = BearerProcessor()
    with proxy_with(rules, directory=tmp_path, token_keys=key_dir) as p:
        assert call(p, url, mint(revoked, processor, origin_https.port)).status_code == 200
        for path in key_dir.glob(f"{revoked.kid}.*"):
            path.unlink()
        p.rules.write_text("version: 1\npolicies: [oops\n")
        p.signal(signal.SIGHUP)
        p.wait_audit(lambda e: e["event"] == "rules_reload_failed")
        refused = call(p, url, mint(revoked, processor, origin_https.port))
        assert refused.status_code == 400, refused.text
        assert call(p, url, mint(kept, processor, origin_https.port)).status_code == 200
