"""The proxy side of sealed tokens (proxy/credentials/tokenizer.py), in process."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mitmproxy import http

from sealgate.credentials import (
    CLOCK_SKEW_SECONDS,
    Claims,
    Destination,
    TokenError,
    TokenExpired,
    TokenMalformed,
    seal,
)
from sealgate.credentials.keys import Keyring, PublicKeyEntry, generate
from sealgate.credentials.processors import BearerProcessor
from sealgate.proxy.credentials import inject
from sealgate.proxy.credentials import tokenizer as tokenizer_module
from sealgate.proxy.credentials.inject import Injected, put, write
from sealgate.proxy.credentials.tokenizer import Tokenizer, TokenRequest
from sealgate.proxy.errors import Denial
from tests.vectors import generate as vectors


def test_token_request_repr_hides_proxy_authorization() -> None:
    request = TokenRequest("bot-1", "agent", "api.test", 443, "GET", "/", ["Bearer canary-7f3a"])
    assert "canary-7f3a" not in repr(request) and "canary-7f3a" not in str(request)
    assert request.proxy_authorization == ["Bearer canary-7f3a"]  # the value itself is intact


# -- the cache of opened tokens ----------------------------------------------------------------

NOW = 1_900_000_000


class Clock:
    def __init__(self) -> None:
        self.now = float(NOW)

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def keyring(tmp_path_factory: pytest.TempPathFactory) -> tuple[Keyring, PublicKeyEntry]:
    directory = tmp_path_factory.mktemp("keys")
    public = generate(directory)
    return Keyring.load(directory), public


REQUEST = TokenRequest(None, None, "api.test", 443, "GET", "/", [])


def _token(public: PublicKeyEntry, jti: str, *, exp: int = NOW + 600) -> str:
    return seal(Claims(
        kid=public.kid, secret="cache-canary-1", processor=BearerProcessor(),
        hosts=(Destination("api.test", 443),), exp=exp, iat=NOW, jti=jti,
    ), public)


def _use(tokenizer: Tokenizer, token: str) -> str:
    """The jti of what `token` grants a request inside its scope."""
    (granted,) = tokenizer.authorise([token], REQUEST)
    return granted.label.rpartition(":")[2]


def test_the_time_window_is_checked_on_every_use_of_a_cached_token(
    keyring: tuple[Keyring, PublicKeyEntry],
) -> None:
    clock = Clock()
    tokenizer = Tokenizer(keyring[0], clock=clock)
    token = _token(keyring[1], "w", exp=NOW + 60)
    assert _use(tokenizer, token) == "w"
    clock.now = NOW + 60 + CLOCK_SKEW_SECONDS - 0.001  # the last moment, skew included
    assert _use(tokenizer, token) == "w"
    clock.now += 0.001
    with pytest.raises(TokenExpired, match="expired"):
        _use(tokenizer, token)
    clock.now = NOW - CLOCK_SKEW_SECONDS - 1  # before iat, and then some
    with pytest.raises(TokenExpired, match="not valid yet"):
        _use(tokenizer, token)


def test_a_full_cache_drops_expired_tokens_then_the_oldest(
    keyring: tuple[Keyring, PublicKeyEntry], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    tokenizer = Tokenizer(keyring[0], cache_size=2, clock=clock)
    opened: list[str] = []
    real_unseal = tokenizer_module.unseal

    def counting_unseal(token: str, ring: Keyring) -> Claims:
        claims = real_unseal(token, ring)
        opened.append(claims.jti or "")
        return claims

    monkeypatch.setattr(tokenizer_module, "unseal", counting_unseal)
    short, a, b, c = (_token(keyring[1], j, exp=NOW + (10 if j == "short" else 600))
                      for j in ("short", "a", "b", "c"))
    for token in (a, short):
        _use(tokenizer, token)
    clock.now = NOW + 10 + CLOCK_SKEW_SECONDS  # `short` has expired
    _use(tokenizer, b)  # evicts `short`, not the older `a`
    _use(tokenizer, a)
    _use(tokenizer, c)  # evicts the oldest: `a`
    _use(tokenizer, b)
    _use(tokenizer, a)
    assert opened == ["a", "short", "b", "c", "a"]


# -- the Proxy-Tokenizer header: a list of tokens ----------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        [""],
        ["  "],
        [" , "],
        ["{t},"],
        [",{t}"],
        ["{t}, ,{u}"],
        ["{t}", ""],
        ["{t}\n"],  # only SP and HTAB surround an element
        ["{t}\xa0"],
        [", ".join(["{t}"] * 5), ", ".join(["{u}"] * 4)],  # 9 across two fields
    ],
    ids=["empty", "blank", "comma-only", "trailing-comma", "leading-comma", "empty-between",
         "empty-second-field", "newline", "nbsp", "nine-tokens"],
)
def test_a_header_element_that_is_not_a_token_is_token_malformed(
    keyring: tuple[Keyring, PublicKeyEntry], values: list[str]
) -> None:
    tokenizer = Tokenizer(keyring[0], clock=Clock())
    t, u = _token(keyring[1], "t"), _token(keyring[1], "u")
    with pytest.raises(TokenMalformed):
        tokenizer.authorise([v.format(t=t, u=u) for v in values], REQUEST)


@pytest.mark.parametrize(
    ("values", "jtis"),
    [
        ([" {t}\t,\t{u} "], "tu"),
        (["{u}", "{t}"], "ut"),
        ([", ".join(["{t}"] * 4), ", ".join(["{u}"] * 4)], "ttttuuuu"),
    ],
    ids=["whitespace-around", "two-fields", "eight-tokens"],
)
def test_every_token_of_every_field_is_granted_in_order(
    keyring: tuple[Keyring, PublicKeyEntry], values: list[str], jtis: str
) -> None:
    tokenizer = Tokenizer(keyring[0], clock=Clock())
    t, u = _token(keyring[1], "t"), _token(keyring[1], "u")
    granted = tokenizer.authorise([v.format(t=t, u=u) for v in values], REQUEST)
    assert [cred.label.rpartition(":")[2] for cred in granted] == list(jtis)


# -- the proxy against the test vectors --------------------------------------------------------

VECTORS: dict[str, Any] = json.loads(vectors.VECTORS_PATH.read_text(encoding="utf-8"))


def _through_the_proxy(vector: dict[str, Any]) -> dict[str, object]:
    """A vector's token as the one element of a Proxy-Tokenizer header, then injected into a
    mitmproxy request the way the pipeline does (`write`, then `put` for a body signature).
    The vector's path goes to the tokenizer as it is: the guard, which refuses some paths
    before any token is read, is not under test here."""
    req, ctx = vector["request"], vector["context"]
    tokenizer = Tokenizer(Keyring(vectors.KEYRING_ENTRIES), clock=lambda: vectors.NOW)
    flow = http.Request(
        req["host"], req["port"], req["method"].encode(), b"https", b"", req["path"].encode(),
        b"HTTP/1.1", http.Headers([(k.encode(), v.encode()) for k, v in req["headers"]]),
        req["body"].encode(), None, 0.0, None,
    )
    try:
        granted = tokenizer.authorise([vector["token"]], TokenRequest(
            ctx["sandbox_id"], ctx["policy"], req["host"], req["port"], req["method"],
            req["path"], ctx["proxy_authorization"],
        ))
        assert len(granted) == 1, f"one token in the header, {len(granted)} credentials"
        for cred in write(flow, granted, Injected()):
            put(flow, cred)
    except (TokenError, Denial) as exc:
        return {"error": {"reason": exc.reason, "status": exc.reason.status}}
    return {"expected": {
        "headers": vectors.normalise_headers(
            [(k.decode(), v.decode()) for k, v in flow.headers.fields]
        ),
        "path": flow.path,
        "body": flow.content.decode() if flow.content else "",
    }}


@pytest.mark.parametrize("vector", VECTORS["valid"], ids=lambda v: v["name"])
def test_the_proxy_injects_each_valid_vector_as_it_says(
    vector: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inject, "clock", lambda: vectors.NOW)  # aws-sigv4's dated request
    expected = vector["expected"]
    # Every injected request asks for an identity encoding, so its response can be scrubbed.
    headers = vectors.normalise_headers(
        [(k, v) for k, v in expected["headers"]] + [("accept-encoding", "identity")]
    )
    assert _through_the_proxy(vector) == {"expected": {**expected, "headers": headers}}


@pytest.mark.parametrize("vector", VECTORS["invalid"], ids=lambda v: v["name"])
def test_the_proxy_refuses_each_invalid_vector_as_it_says(
    vector: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inject, "clock", lambda: vectors.NOW)
    assert _through_the_proxy(vector) == {"error": vector["error"]}
