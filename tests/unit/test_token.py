"""The sealed-token API (sealgate.credentials: the format, its scope and checks) and proxy keys
(issuer/keys.py)."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from nacl.public import PrivateKey, SealedBox

from sealgate import credentials as tk
from sealgate.credentials import httprequest as ij
from sealgate.credentials import keys
from sealgate.credentials import processors as pr
from tests.vectors import generate as vectors

NOW = 1_700_000_000
CANARY = "sk_live_CANARY_3f9a1c77e2"
KEY_A = vectors.KEY_A
KEY_B = vectors.KEY_B
KEYRING = keys.Keyring([KEY_A, KEY_B])


def make_claims(**overrides: Any) -> tk.Claims:
    fields: dict[str, Any] = {
        "kid": KEY_A.kid,
        "secret": CANARY,
        "processor": pr.BearerProcessor(),
        "hosts": (tk.Destination.parse("api.example.com"),),
        "exp": NOW + 900,
        "iat": NOW - 60,
    }
    fields.update(overrides)
    return tk.Claims(**fields)


def mint(claims: tk.Claims | None = None, key: keys.PrivateKeyEntry = KEY_A) -> str:
    return tk.seal(claims or make_claims(), key.public())


def seal_object(obj: object, key: keys.PrivateKeyEntry = KEY_A) -> str:
    """Seal arbitrary JSON, bypassing `Claims` validation, as a hostile sealer could."""
    plaintext = json.dumps(obj).encode()
    return tk.format_token(
        key.kid, SealedBox(PrivateKey(key.private_key).public_key).encrypt(plaintext)
    )


def claims_json(**overrides: Any) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(tk.encode_claims(make_claims()))
    for name, value in overrides.items():
        if value is ...:
            del obj[name]
        else:
            obj[name] = value
    return obj


def request(**headers: str) -> ij.InMemoryRequest:
    return ij.InMemoryRequest(headers=list(headers.items()))


# --- round trips through the processor --------------------------------------------------------


def _roundtrip(processor: pr.Processor, target: ij.InMemoryRequest, secret: str = CANARY) -> None:
    claims = make_claims(processor=processor, secret=secret)
    opened = tk.unseal(mint(claims), KEYRING)
    assert opened == claims
    opened.processor.inject(opened.secret, target)


def test_bearer_replaces_authorization() -> None:
    target = request(authorization="Bearer dummy", Accept="*/*")
    _roundtrip(pr.BearerProcessor(), target)
    assert target.get_header_values("Authorization") == [f"Bearer {CANARY}"]
    assert target.get_header_values("accept") == ["*/*"]


def test_header_processor_formats_value() -> None:
    target = request()
    _roundtrip(pr.HeaderProcessor(header="X-Api-Key", format="key={secret};"), target)
    assert target.headers == [("X-Api-Key", f"key={CANARY};")]


def test_basic_processor() -> None:
    target = request()
    _roundtrip(pr.BasicProcessor(username="api"), target)
    expected = base64.b64encode(f"api:{CANARY}".encode()).decode()
    assert target.get_header_values("authorization") == [f"Basic {expected}"]


def test_query_processor_replaces_every_occurrence() -> None:
    target = ij.InMemoryRequest(path="/v1?key=a&q=1&key=b")
    _roundtrip(pr.QueryProcessor(param="key"), target, secret="välue with space")
    assert target.path == "/v1?q=1&key=v%C3%A4lue%20with%20space"


def test_hmac_over_body_leaves_body_unchanged() -> None:
    body = b'{"amount": 100}\r\n'
    target = ij.InMemoryRequest(body=body)
    processor = pr.HmacProcessor(header="X-Sig", format="v1={signature}", encoding="hex")
    _roundtrip(processor, target)
    expected = hmac.new(CANARY.encode(), body, hashlib.sha256).hexdigest()
    assert target.get_header_values("x-sig") == [f"v1={expected}"]
    assert target.body == body


def test_hmac_over_message_base64() -> None:
    target = ij.InMemoryRequest(body=b"ignored")
    processor = pr.HmacProcessor(
        header="Authorization", format="HMAC {signature}", encoding="base64", message="GET /"
    )
    _roundtrip(processor, target)
    digest = hmac.new(CANARY.encode(), b"GET /", hashlib.sha256).digest()
    assert target.get_header_values("Authorization") == [
        f"HMAC {base64.b64encode(digest).decode()}"
    ]


def test_placeholder_replaced_in_every_value() -> None:
    target = request(Authorization="Bearer sg-placeholder")
    target.headers.append(("authorization", "x sg-placeholder sg-placeholder"))
    _roundtrip(
        pr.PlaceholderProcessor(header="Authorization", placeholder="sg-placeholder"), target
    )
    assert target.get_header_values("authorization") == [
        f"Bearer {CANARY}",
        f"x {CANARY} {CANARY}",
    ]


def test_placeholder_missing_is_inapplicable() -> None:
    # The proxy answers this token_inapplicable for a token (test_tokenizer, the vectors).
    processor = pr.PlaceholderProcessor(header="Authorization", placeholder="sg-placeholder")
    target = request(Authorization="Bearer something-else")
    with pytest.raises(pr.RequestInapplicable):
        processor.inject(CANARY, target)
    assert target.get_header_values("authorization") == ["Bearer something-else"]


def test_inject_refuses_a_secret_that_could_split_a_header() -> None:
    # The broker calls `inject` with secrets no Claims ever checked.
    target = request(Authorization="x")
    with pytest.raises(pr.SecretInvalid) as info:
        pr.BearerProcessor().inject(f"{CANARY}\r\nX-Evil: 1", target)
    assert CANARY not in str(info.value) and info.value.reason == "secret_invalid"
    assert target.get_header_values("authorization") == ["x"]


@pytest.mark.parametrize(
    "obj",
    [
        [],
        {"type": 1},
        {"type": "nope"},
        {"type": "query"},
        {"type": "query", "param": 5},
        {"type": "bearer", "extra": "x"},
        {"type": "header", "header": "Host", "format": "{secret}"},
    ],
)
def test_processor_from_object_refuses(obj: object) -> None:
    with pytest.raises(pr.ProcessorInvalid) as info:
        pr.processor_from_object(obj)
    assert info.value.reason == "processor_invalid" and not isinstance(info.value, tk.TokenError)


def test_processor_object_round_trips() -> None:
    processor = pr.HmacProcessor(header="X-Sig", format="{signature}", encoding="hex")
    obj = processor.to_object()
    assert obj == {
        "type": "hmac-sha256",
        "header": "X-Sig",
        "format": "{signature}",
        "encoding": "hex",
    }
    assert pr.processor_from_object(obj) == processor


def test_every_claim_round_trips() -> None:
    claims = make_claims(
        hosts=tuple(map(tk.Destination.parse, ["*.example.com", "[2001:db8::1]:8443", "10.0.0.1"])),
        methods=("GET", "POST"),
        paths=("/v1/", "/v2/x"),
        nbf=NOW - 10,
        jti="abc-123",
        binding=tk.AuthDigestBinding.of_secret("bearer"),
    )
    assert tk.unseal(mint(claims), KEYRING) == claims


def test_token_shape_and_key_rotation() -> None:
    token = mint(make_claims(kid=KEY_B.kid), key=KEY_B)
    prefix, kid, body = token.split(".")
    assert (prefix, kid) == ("sg1", KEY_B.kid)
    assert "=" not in body
    assert tk.unseal(token, KEYRING).kid == KEY_B.kid
    assert KEYRING.kids == (KEY_B.kid, KEY_A.kid)  # newest first


def test_seal_refuses_other_kid_and_oversize() -> None:
    with pytest.raises(tk.TokenInvalid):
        tk.seal(make_claims(kid=KEY_B.kid), KEY_A.public())
    hosts = tuple(
        tk.Destination.parse(f"{'a' * 60}.{'b' * 60}.{'c' * 60}{i}.com") for i in range(32)
    )
    with pytest.raises(tk.TokenMalformed, match="too large"):
        mint(make_claims(hosts=hosts, secret="x" * 4096))


# --- errors and their codes -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "reason", "status"),
    [
        (tk.TokenMalformed, "token_malformed", 400),
        (tk.TokenInvalid, "token_invalid", 400),
        (tk.TokenExpired, "token_expired", 401),
        (tk.TokenScope, "token_scope", 403),
        (tk.TokenBinding, "token_binding", 407),
        (tk.TokenInapplicable, "token_inapplicable", 400),
    ],
)
def test_error_codes(cls: type[tk.TokenError], reason: str, status: int) -> None:
    assert issubclass(cls, tk.TokenError)
    error = cls("x")
    assert (error.reason, error.reason.status) == (reason, status)


def test_every_sealed_byte_flip_is_invalid() -> None:
    envelope = tk.parse_envelope(mint())
    for index in range(len(envelope.sealed)):
        sealed = bytearray(envelope.sealed)
        sealed[index] ^= 0x01
        with pytest.raises(tk.TokenInvalid):
            tk.unseal(tk.format_token(envelope.kid, bytes(sealed)), KEYRING)


def test_every_character_change_is_refused() -> None:
    token = mint()
    for index in range(len(token)):
        replacement = "B" if token[index] == "A" else "A"
        changed = token[:index] + replacement + token[index + 1 :]
        with pytest.raises((tk.TokenInvalid, tk.TokenMalformed)):
            tk.unseal(changed, KEYRING)


def test_every_truncation_is_refused() -> None:
    token = mint()
    for length in range(len(token)):
        with pytest.raises((tk.TokenInvalid, tk.TokenMalformed)):
            tk.unseal(token[:length], KEYRING)


def test_unknown_kid_and_wrong_key() -> None:
    only_a = keys.Keyring([KEY_A])
    with pytest.raises(tk.TokenInvalid, match="unknown key id"):
        tk.unseal(mint(make_claims(kid=KEY_B.kid), key=KEY_B), only_a)
    sealed_to_b = tk.parse_envelope(mint(make_claims(kid=KEY_B.kid), key=KEY_B)).sealed
    with pytest.raises(tk.TokenInvalid, match="does not decrypt"):
        tk.unseal(tk.format_token(KEY_A.kid, sealed_to_b), KEYRING)


def test_inner_kid_must_match_visible_kid() -> None:
    plaintext = tk.encode_claims(make_claims(kid=KEY_B.kid))
    sealed = SealedBox(PrivateKey(KEY_A.private_key).public_key).encrypt(plaintext)
    with pytest.raises(tk.TokenInvalid, match="differs"):
        tk.unseal(tk.format_token(KEY_A.kid, sealed), KEYRING)


@pytest.mark.parametrize(
    "token",
    [
        "",
        "sg1",
        "sg1..",
        "SG1." + KEY_A.kid + ".AAAA",
        "sg1." + KEY_A.kid + ".=",
        "sg1." + KEY_A.kid + "." + "A" * 80 + "==",
        "sg1." + KEY_A.kid + "." + "A" * 81,  # length 4n+1
        "sg1." + KEY_A.kid + "." + "A" * 63 + "B",  # non-zero unused bits
        "sg1." + KEY_A.kid + "." + "A" * 64,  # 48 bytes: no room for a plaintext
        "sg1." + KEY_A.kid + "." + "A" * (tk.MAX_TOKEN_LENGTH),
        "sg1." + KEY_A.kid + ".AA AA",
        "sg1.ééééééééééééééé.AAAA",
    ],
)
def test_malformed_envelopes(token: str) -> None:
    with pytest.raises(tk.TokenMalformed):
        tk.unseal(token, KEYRING)


@pytest.mark.parametrize(
    "obj",
    [
        claims_json(extra=1),
        claims_json(exp=...),
        claims_json(exp=str(NOW + 900)),
        claims_json(version=True),
        claims_json(hosts="api.example.com"),
        claims_json(hosts=[1]),
        claims_json(nbf=None),
        claims_json(processor={"type": "bearer", "extra": "x"}),
        claims_json(processor={"type": "Bearer"}),
        claims_json(processor={"type": "header", "header": "X", "format": "no slot"}),
        claims_json(processor={"type": "header", "header": "Content-Length", "format": "{secret}"}),
        claims_json(processor={"type": "header", "header": "Bad Name", "format": "{secret}"}),
        claims_json(processor={"type": "basic", "username": "a:b"}),
        claims_json(processor={"type": "query", "param": "a=b"}),
        claims_json(
            processor={"type": "placeholder", "header": "Authorization", "placeholder": "short"}
        ),
        claims_json(
            processor={
                "type": "hmac-sha256",
                "header": "X",
                "format": "{secret}",
                "encoding": "hex",
            }
        ),
        claims_json(secret="has space"),
        claims_json(secret="x" * 4097),
        claims_json(binding={}),
        claims_json(binding={"sandbox": 5}),
        claims_json(binding={"auth_sha256": "AB" * 32}),
        claims_json(binding={"tenant": "x"}),
        claims_json(jti="has space"),
        claims_json(paths=["v1"]),
        claims_json(paths=["/v1/%2e%2e/admin"]),
        claims_json(hosts=["*.example.com:99999"]),
        claims_json(hosts=["exa mple.com"]),
        claims_json(hosts=["*.*.example.com"]),
        claims_json(hosts=["[fe80::1%eth0]"]),
        claims_json(hosts=["*.10.0.0.1"]),
        claims_json(hosts=["xn--bcher-kva.example", "bücher.example"]),
        claims_json(exp=2**60),
        claims_json(iat=-1),
    ],
)
def test_schema_violations_are_malformed(obj: dict[str, Any]) -> None:
    with pytest.raises(tk.TokenMalformed):
        tk.unseal(seal_object(obj), KEYRING)


@pytest.mark.parametrize(
    "plaintext",
    [
        b"",
        b"{",
        b"[1]",
        b"\xff\xfe",
        b'{"a":1,"a":1}',
        b'{"exp":1e9}',
        b'{"exp":NaN}',
        b"[" * 5000 + b"]" * 5000,
        b'{"exp":' + b"9" * 40 + b"}",
    ],
)
def test_bad_json_is_malformed(plaintext: bytes) -> None:
    sealed = SealedBox(PrivateKey(KEY_A.private_key).public_key).encrypt(plaintext)
    with pytest.raises(tk.TokenMalformed):
        tk.unseal(tk.format_token(KEY_A.kid, sealed), KEYRING)


def test_non_canonical_base64_is_malformed() -> None:
    with pytest.raises(tk.TokenMalformed, match="canonical"):
        tk.parse_envelope(f"sg1.{KEY_A.kid}.{'A' * 65}B")  # 4 unused bits set
    assert len(tk.parse_envelope(f"sg1.{KEY_A.kid}.{'A' * 65}Q").sealed) == 49


# --- time window ------------------------------------------------------------------------------

SKEW = tk.CLOCK_SKEW_SECONDS


@pytest.mark.parametrize(
    ("now", "nbf", "ok"),
    [
        (NOW + 900 + SKEW - 1, None, True),  # expired, but within skew
        (NOW + 900 + SKEW, None, False),
        (NOW - 60 - SKEW, None, True),  # iat in the future, within skew
        (NOW - 60 - SKEW - 1, None, False),
        (NOW + 100 - SKEW, NOW + 100, True),
        (NOW + 100 - SKEW - 1, NOW + 100, False),
    ],
)
def test_time_window(now: int, nbf: int | None, ok: bool) -> None:
    claims = tk.unseal(mint(make_claims(nbf=nbf)), KEYRING)
    if ok:
        tk.check_time(claims, now=now)
    else:
        with pytest.raises(tk.TokenExpired) as info:
            tk.check_time(claims, now=now)
        assert info.value.reason == "token_expired"


def test_lifetime_cap_is_enforced_at_use() -> None:
    obj = claims_json(iat=NOW, exp=NOW + tk.MAX_LIFETIME_SECONDS + 1)
    with pytest.raises(tk.TokenMalformed, match="lifetime"):
        tk.unseal(seal_object(obj), KEYRING)


# --- scope ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("patterns", "host", "port", "ok"),
    [
        (["api.example.com"], "api.example.com", 443, True),
        (["api.example.com"], "API.Example.Com", 443, True),
        (["API.EXAMPLE.COM"], "api.example.com", 443, True),
        (["api.example.com"], "api.example.com.", 443, True),
        (["api.example.com"], "api.example.com", 80, False),
        (["api.example.com"], "api.example.com", 8443, False),
        (["api.example.com:8443"], "api.example.com", 8443, True),
        (["api.example.com:8443"], "api.example.com", 443, False),
        (["api.example.com:443"], "api.example.com", 443, True),
        (["api.example.com"], "evilapi.example.com", 443, False),
        (["api.example.com"], "api.example.com.evil.net", 443, False),
        (["api.example.com"], "x.api.example.com", 443, False),
        (["*.example.com"], "a.example.com", 443, True),
        (["*.example.com"], "a.b.example.com", 443, True),
        (["*.example.com"], "example.com", 443, False),
        (["*.example.com"], "badexample.com", 443, False),
        (["*.example.com"], "a.example.com", 8443, False),
        (["*.example.com:8443"], "a.example.com", 8443, True),
        (["10.1.2.3"], "10.1.2.3", 443, True),
        (["10.1.2.3"], "10.1.2.4", 443, False),
        (["[2001:db8::1]:8443"], "2001:db8::1", 8443, True),
        (["[2001:db8::1]:8443"], "[2001:db8:0::1]", 8443, True),
        (["[2001:DB8::1]"], "2001:db8::1", 443, True),
        (["a.example.com", "b.example.com:444"], "b.example.com", 444, True),
        (["a.example.com", "b.example.com:444"], "b.example.com", 443, False),
    ],
)
def test_host_scope(patterns: list[str], host: str, port: int, ok: bool) -> None:
    claims = make_claims(hosts=tuple(map(tk.Destination.parse, patterns)))
    if ok:
        tk.check_scope(claims, host, port, "GET", "/")
    else:
        with pytest.raises(tk.TokenScope):
            tk.check_scope(claims, host, port, "GET", "/")


@pytest.mark.parametrize(
    ("prefixes", "path", "ok"),
    [
        (["/v1/charges"], "/v1/charges", True),
        (["/v1/charges"], "/v1/charges/ch_1", True),
        (["/v1/charges"], "/v1/charges?x=1", True),
        (["/v1/charges"], "/v1/chargesX", False),
        (["/v1/charges"], "/v1/charge", False),
        (["/v1/charges"], "/V1/charges", False),
        (["/v1/charges"], "/v1/charges/../admin", False),
        (["/v1/charges"], "/v1/charges/%2E%2E/admin", False),
        (["/v1/charges"], "/v1/charges/.%2e/admin", False),
        (["/v1/charges"], "/v1/charges/a%2fb", False),
        (["/v1/charges"], "/v1/charges/..;/admin", False),
        (["/v1/charges"], "/v1/charges/a;b", True),
        (["/v1/charges"], "/v1/charges\\..\\admin", False),
        (["/v1/charges"], "v1/charges", False),
        (["/v1/charges"], "*", False),
        (["/v1/"], "/v1/anything", True),
        (["/v1/"], "/v1", False),
        (["/"], "/anything/at/all", True),
        (["/a", "/b"], "/b/c", True),
    ],
)
def test_path_scope(prefixes: list[str], path: str, ok: bool) -> None:
    claims = make_claims(paths=tuple(prefixes))
    if ok:
        tk.check_scope(claims, "api.example.com", 443, "GET", path)
    else:
        with pytest.raises(tk.TokenScope):
            tk.check_scope(claims, "api.example.com", 443, "GET", path)


def test_method_scope() -> None:
    claims = make_claims(methods=("GET", "POST"))
    tk.check_scope(claims, "api.example.com", 443, "POST", "/")
    for method in ("DELETE", "post"):
        with pytest.raises(tk.TokenScope) as info:
            tk.check_scope(claims, "api.example.com", 443, method, "/")
        assert info.value.reason == "token_scope"
    tk.check_scope(make_claims(), "api.example.com", 443, "ANYTHING", "/whatever")


# --- bindings ---------------------------------------------------------------------------------

BEARER = "proxy-bearer-secret"


@pytest.mark.parametrize(
    ("binding", "sandbox", "policy", "auth", "ok"),
    [
        (None, None, None, [], True),
        (tk.SandboxBinding("sbx-1"), "sbx-1", None, [], True),
        (tk.SandboxBinding("sbx-1"), "sbx-2", None, [], False),
        (tk.SandboxBinding("sbx-1"), None, None, [], False),
        (tk.PolicyBinding("ci"), None, "ci", [], True),
        (tk.PolicyBinding("ci"), "sbx-1", "prod", [], False),
        (tk.PolicyBinding("ci"), "sbx-1", None, [], False),
        (tk.AuthDigestBinding.of_secret(BEARER), None, None, [f"Bearer {BEARER}"], True),
        (tk.AuthDigestBinding.of_secret(BEARER), None, None, [f"bearer  {BEARER} "], True),
        (
            tk.AuthDigestBinding.of_secret(BEARER),
            None,
            None,
            ["Basic eDp5", f"Bearer {BEARER}"],
            True,
        ),
        (tk.AuthDigestBinding.of_secret(BEARER), None, None, ["Bearer nope"], False),
        (tk.AuthDigestBinding.of_secret(BEARER), None, None, [f"Basic {BEARER}"], False),
        (tk.AuthDigestBinding.of_secret(BEARER), None, None, [BEARER], False),
        (tk.AuthDigestBinding.of_secret(BEARER), None, None, [], False),
    ],
)
def test_binding(
    binding: tk.Binding | None, sandbox: str | None, policy: str | None, auth: list[str], ok: bool
) -> None:
    claims = make_claims(binding=binding)
    if ok:
        tk.check_binding(claims, sandbox_id=sandbox, policy=policy, proxy_authorization=auth)
    else:
        with pytest.raises(tk.TokenBinding) as info:
            tk.check_binding(claims, sandbox_id=sandbox, policy=policy, proxy_authorization=auth)
        assert info.value.reason == "token_binding"
        assert BEARER not in str(info.value)


# --- secrets stay out of reprs and errors -----------------------------------------------------


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and len(seen) < 10:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def test_canary_absent_from_reprs() -> None:
    claims = make_claims(binding=tk.SandboxBinding("sbx"))
    assert CANARY not in repr(claims) and CANARY not in str(claims)
    assert tk.redacted_claims(claims)["secret"] == "[redacted]"
    assert CANARY not in json.dumps(tk.redacted_claims(claims))
    target = request(Authorization="x")
    claims.processor.inject(claims.secret, target)
    assert CANARY not in repr(target)
    assert KEY_A.private_key.hex() not in repr(KEY_A) and "private_key" not in repr(KEY_A)
    assert KEY_A.kid in repr(KEYRING)


@pytest.mark.parametrize(
    "obj",
    [
        claims_json(secret=f"{CANARY}\nX: y"),
        claims_json(secret=CANARY + " "),
        claims_json(extra=CANARY),
        claims_json(processor={"type": "header", "header": "X", "format": CANARY}),
        claims_json(exp=NOW - 3600),
        {"secret": CANARY},
    ],
)
def test_canary_absent_from_errors(obj: dict[str, Any]) -> None:
    with pytest.raises(tk.TokenError) as info:
        claims = tk.unseal(seal_object(obj), KEYRING)
        tk.check_time(claims, now=NOW)
        tk.check_scope(claims, "other.example.com", 443, "GET", "/")
    for error in _chain(info.value):
        assert CANARY not in str(error) and CANARY not in repr(error)
        assert CANARY not in str(getattr(error, "doc", ""))


def test_duplicate_secret_key_error_is_clean() -> None:
    plaintext = tk.encode_claims(make_claims())[:-1] + f',"secret":"{CANARY}x"}}'.encode()
    sealed = SealedBox(PrivateKey(KEY_A.private_key).public_key).encrypt(plaintext)
    with pytest.raises(tk.TokenMalformed, match="duplicate") as info:
        tk.unseal(tk.format_token(KEY_A.kid, sealed), KEYRING)
    assert info.value.__context__ is None and info.value.__cause__ is None
    assert CANARY not in str(info.value)


def test_json_error_does_not_chain_the_plaintext() -> None:
    plaintext = f'{{"secret":"{CANARY}",'.encode()
    sealed = SealedBox(PrivateKey(KEY_A.private_key).public_key).encrypt(plaintext)
    with pytest.raises(tk.TokenMalformed) as info:
        tk.unseal(tk.format_token(KEY_A.kid, sealed), KEYRING)
    assert info.value.__context__ is None


def test_claims_construction_validates() -> None:
    with pytest.raises(tk.TokenMalformed):
        make_claims(secret="")
    with pytest.raises(tk.TokenMalformed):
        make_claims(hosts=())
    with pytest.raises(tk.TokenMalformed):
        make_claims(methods=())
    with pytest.raises(tk.TokenMalformed):
        make_claims(exp=NOW - 60)
    with pytest.raises(tk.TokenMalformed):
        make_claims(kid="ABCDEF0123456789")
    with pytest.raises(tk.TokenMalformed):
        tk.Destination.parse("*.com")
    assert str(tk.Destination.parse("API.example.com:443")) == "api.example.com"
    assert str(tk.Destination.parse("[2001:0db8::1]:8443")) == "[2001:db8::1]:8443"
    with pytest.raises(dataclasses.FrozenInstanceError):
        make_claims().secret = "x"  # type: ignore[misc]


# --- vectors ----------------------------------------------------------------------------------

VECTORS: dict[str, Any] = json.loads(vectors.VECTORS_PATH.read_text(encoding="utf-8"))


def _vector_keyring() -> keys.Keyring:
    entries = []
    for key in VECTORS["keyring"]:
        created = datetime.strptime(key["created"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        entry = keys.PrivateKeyEntry.from_private_key(bytes.fromhex(key["private_key"]), created)
        assert entry.kid == key["kid"] == keys.kid_for(bytes.fromhex(key["public_key"]))
        entries.append(entry)
    return keys.Keyring(entries)


def test_vectors_file_is_current() -> None:
    assert vectors.render() == vectors.VECTORS_PATH.read_text(encoding="utf-8"), (
        "run .venv/bin/python tests/vectors/generate.py"
    )


@pytest.mark.parametrize("vector", VECTORS["valid"], ids=lambda v: v["name"])
def test_valid_vector(vector: dict[str, Any]) -> None:
    keyring = _vector_keyring()
    outcome = vectors.evaluate(vector["token"], vector["request"], vector["context"], keyring)
    assert outcome == {"expected": vector["expected"]}
    # The sealed plaintext is exactly what the vector says, and opens with plain libsodium.
    envelope = tk.parse_envelope(vector["token"])
    entry = keyring.get(envelope.kid)
    assert entry is not None
    plaintext = SealedBox(PrivateKey(entry.private_key)).decrypt(envelope.sealed)
    assert plaintext.decode() == vector["plaintext"]


@pytest.mark.parametrize("vector", VECTORS["invalid"], ids=lambda v: v["name"])
def test_invalid_vector(vector: dict[str, Any]) -> None:
    outcome = vectors.evaluate(
        vector["token"], vector["request"], vector["context"], _vector_keyring()
    )
    assert outcome == {"error": vector["error"]}


def test_vectors_cover_every_reason_and_processor() -> None:
    reasons = {v["error"]["reason"] for v in VECTORS["invalid"]}
    assert reasons == {
        "token_malformed",
        "token_invalid",
        "token_expired",
        "token_scope",
        "token_binding",
        "token_inapplicable",
    }
    kinds = {json.loads(v["plaintext"])["processor"]["type"] for v in VECTORS["valid"]}
    # The token-exchange processors have no vector: their sealing is tested in
    # tests/unit/test_grants.py, their use in tests/integration/test_oauth2.py and the like.
    assert kinds == {k for k, cls in pr.PROCESSOR_TYPES.items()
                     if not issubclass(cls, pr.ExchangeProcessor)}


# --- key files --------------------------------------------------------------------------------


def test_generate_and_load(tmp_path: Path) -> None:
    out = tmp_path / "keys"
    public = keys.generate(out)
    private_path = out / f"{public.kid}.key"
    public_path = out / f"{public.kid}.pub"
    assert stat.S_IMODE(private_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(public_path.stat().st_mode) == 0o644
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert (
        public.kid
        == keys.kid_for(public.public_key)
        == hashlib.sha256(public.public_key).digest()[:8].hex()
    )
    assert keys.load_public(public_path) == public
    keyring = keys.Keyring.load(out)
    entry = keyring.get(public.kid)
    assert entry is not None and entry.public() == public
    assert keys.newest_public(out) == public
    claims = make_claims(kid=public.kid)
    assert tk.unseal(tk.seal(claims, public), keyring) == claims
    assert set(json.loads(private_path.read_text())) == {"format", "kid", "created", "private_key"}


def test_newest_public_and_rotation(tmp_path: Path) -> None:
    old = keys.generate(tmp_path, now=datetime.now(UTC) - timedelta(days=30))
    new = keys.generate(tmp_path)
    assert keys.newest_public(tmp_path) == new
    keyring = keys.Keyring.load(tmp_path)
    assert keyring.kids == (new.kid, old.kid)
    for public in (old, new):
        claims = make_claims(kid=public.kid)
        assert tk.unseal(tk.seal(claims, public), keyring) == claims


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644])
def test_private_key_permissions_refused(tmp_path: Path, mode: int) -> None:
    public = keys.generate(tmp_path)
    path = tmp_path / f"{public.kid}.key"
    os.chmod(path, mode)
    with pytest.raises(keys.KeyPermissionError, match="chmod 600"):
        keys.Keyring.load(tmp_path)


def test_key_file_problems(tmp_path: Path) -> None:
    with pytest.raises(keys.NoKeysError):
        keys.Keyring.load(tmp_path)
    with pytest.raises(keys.NoKeysError):
        keys.newest_public(tmp_path)
    with pytest.raises(keys.KeyFileError, match="not a directory"):
        keys.Keyring.load(tmp_path / "missing")
    public = keys.generate(tmp_path)
    pub_path = tmp_path / f"{public.kid}.pub"
    key_path = tmp_path / f"{public.kid}.key"
    original = json.loads(pub_path.read_text())

    other = dict(original, public_key="00" * 32)
    pub_path.write_text(json.dumps(other))
    with pytest.raises(keys.KeyFileError, match="does not match"):
        keys.load_public(pub_path)
    pub_path.write_text(json.dumps(dict(original, extra=1)))
    with pytest.raises(keys.KeyFileError, match="exactly the fields"):
        keys.load_public(pub_path)
    renamed = tmp_path / "0000000000000000.pub"
    renamed.write_text(json.dumps(original))
    with pytest.raises(keys.KeyFileError, match="file name"):
        keys.load_public(renamed)

    private_text = key_path.read_text()
    secret_hex = json.loads(private_text)["private_key"]
    key_path.write_text(private_text[:-5])  # truncated JSON
    with pytest.raises(keys.KeyFileError) as info:
        keys.load_private(key_path)
    assert secret_hex not in str(info.value) and info.value.__context__ is None


def test_generate_never_overwrites(tmp_path: Path) -> None:
    keys.generate(tmp_path)
    keys.generate(tmp_path)
    assert len(list(tmp_path.glob("*.key"))) == 2
    assert len(keys.Keyring.load(tmp_path)) == 2
