"""Property tests of the token format: nothing but TokenError escapes `unseal`, nothing
malformed is accepted, and every valid claims object survives seal -> unseal -> check -> inject."""

from __future__ import annotations

import json
import string
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nacl.public import PrivateKey, SealedBox

from sealgate import credentials as tk
from sealgate.credentials import httprequest as ij
from sealgate.credentials import keys
from sealgate.credentials import processors as pr
from sealgate.hostname import canonical_name
from tests.vectors import generate as vectors

KEY_A = vectors.KEY_A
KEYRING = keys.Keyring([KEY_A, vectors.KEY_B])
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VISIBLE = "".join(chr(c) for c in range(0x21, 0x7F))
B64URL = string.ascii_letters + string.digits + "-_"


def _seal_bytes(plaintext: bytes) -> str:
    sealed = SealedBox(PrivateKey(KEY_A.private_key).public_key).encrypt(plaintext)
    return tk.format_token(KEY_A.kid, sealed)


# --- strategies -------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)

labels = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)
tlds = st.sampled_from(["com", "net", "io", "example"])


@st.composite
def host_patterns(draw: st.DrawFn) -> tk.Destination:
    name = ".".join([*draw(st.lists(labels, min_size=1, max_size=3)), draw(tlds)])
    port = draw(st.one_of(st.just(443), st.integers(min_value=1, max_value=65535)))
    return tk.Destination(name, port, draw(st.booleans()))


header_names = st.sampled_from(["Authorization", "X-Api-Key", "X-Signature", "api-key"])
processors = st.one_of(
    st.builds(pr.BearerProcessor),
    st.builds(
        pr.HeaderProcessor,
        header=header_names,
        format=st.sampled_from(["{secret}", "Token {secret}", "k={secret};"]),
    ),
    st.builds(pr.BasicProcessor, username=st.text(alphabet=string.ascii_letters, max_size=10)),
    st.builds(pr.QueryProcessor, param=st.from_regex(r"[a-z_]{1,10}", fullmatch=True)),
    st.builds(
        pr.HmacProcessor,
        header=header_names,
        format=st.sampled_from(["{signature}", "sha256={signature}"]),
        encoding=st.sampled_from(["hex", "base64"]),
        message=st.none() | st.text(alphabet=VISIBLE, min_size=1, max_size=20),
    ),
    st.builds(
        pr.PlaceholderProcessor,
        header=header_names,
        placeholder=st.text(alphabet=VISIBLE, min_size=8, max_size=20),
    ),
)
bindings = st.one_of(
    st.none(),
    st.builds(tk.SandboxBinding, st.text(alphabet=VISIBLE, min_size=1, max_size=20)),
    st.builds(tk.PolicyBinding, st.text(alphabet=VISIBLE, min_size=1, max_size=20)),
    st.builds(tk.AuthDigestBinding.of_secret, st.text(min_size=1, max_size=20)),
)


@st.composite
def valid_claims(draw: st.DrawFn) -> tk.Claims:
    iat = draw(st.integers(min_value=0, max_value=2**40))
    exp = iat + draw(st.integers(min_value=1, max_value=tk.MAX_LIFETIME_SECONDS))
    return tk.Claims(
        kid=KEY_A.kid,
        secret="S3CRET-" + draw(st.text(alphabet=VISIBLE, max_size=40)),
        processor=draw(processors),
        hosts=tuple(draw(st.lists(host_patterns(), min_size=1, max_size=3))),
        methods=draw(
            st.none()
            | st.lists(st.sampled_from(["GET", "POST", "PUT"]), min_size=1, max_size=5).map(tuple)
        ),
        paths=draw(
            st.none()
            | st.lists(st.sampled_from(["/", "/v1", "/v1/x/"]), min_size=1, max_size=5).map(tuple)
        ),
        exp=exp,
        nbf=draw(st.none() | st.integers(min_value=iat, max_value=exp - 1)),
        iat=iat,
        jti=draw(st.none() | st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True)),
        binding=draw(bindings),
    )


# --- properties -------------------------------------------------------------------------------


@SETTINGS
@given(st.text(max_size=300))
def test_arbitrary_text_only_raises_token_errors(text: str) -> None:
    try:
        tk.unseal(text, KEYRING)
    except tk.TokenError:
        return
    raise AssertionError("arbitrary text was accepted as a token")


@SETTINGS
@given(
    st.sampled_from([KEY_A.kid, vectors.KEY_B.kid, vectors.KEY_C.kid, "0" * 16]),
    st.text(alphabet=B64URL, max_size=400),
)
def test_token_shaped_noise_is_refused(kid: str, body: str) -> None:
    try:
        tk.unseal(f"sg1.{kid}.{body}", KEYRING)
    except (tk.TokenMalformed, tk.TokenInvalid):
        return
    raise AssertionError("random bytes decrypted")


@SETTINGS
@given(st.binary(max_size=200) | json_values.map(lambda value: json.dumps(value).encode()))
def test_arbitrary_plaintext_is_malformed(plaintext: bytes) -> None:
    try:
        tk.unseal(_seal_bytes(plaintext), KEYRING)
    except tk.TokenMalformed:
        return
    raise AssertionError("arbitrary plaintext was accepted")


_TYPES: dict[str, type | tuple[type, ...]] = {
    "version": int,
    "kid": str,
    "secret": str,
    "processor": dict,
    "hosts": list,
    "methods": list,
    "paths": list,
    "exp": int,
    "nbf": int,
    "iat": int,
    "jti": str,
    "binding": dict,
}


def _wrong_type(field: str, value: Any) -> bool:
    expected = _TYPES[field]
    if isinstance(value, bool) or value is None:
        return True
    return not isinstance(value, expected)


@SETTINGS
@given(valid_claims(), st.data())
def test_mutated_claims_are_malformed(claims: tk.Claims, data: st.DataObject) -> None:
    obj: dict[str, Any] = json.loads(tk.encode_claims(claims))
    mutation = data.draw(st.sampled_from(["drop", "add", "retype", "processor-field"]))
    if mutation == "drop":
        field = data.draw(
            st.sampled_from(["version", "kid", "secret", "processor", "hosts", "exp", "iat"])
        )
        del obj[field]
    elif mutation == "add":
        name = data.draw(st.text(max_size=12).filter(lambda n: n not in _TYPES))
        obj[name] = data.draw(json_values)
    elif mutation == "retype":
        field = data.draw(st.sampled_from(sorted(_TYPES)))
        obj[field] = data.draw(json_values.filter(lambda v: _wrong_type(field, v)))
    else:
        name = data.draw(
            st.text(max_size=12).filter(
                lambda n: (
                    n
                    not in {
                        "type",
                        "header",
                        "format",
                        "username",
                        "param",
                        "encoding",
                        "message",
                        "placeholder",
                    }
                )
            )
        )
        obj["processor"][name] = data.draw(st.text(max_size=5))
    try:
        tk.unseal(_seal_bytes(json.dumps(obj).encode()), KEYRING)
    except tk.TokenMalformed:
        return
    raise AssertionError(f"mutation {mutation} was accepted")


@SETTINGS
@given(valid_claims())
def test_valid_claims_round_trip(claims: tk.Claims) -> None:
    assert claims.secret not in repr(claims)
    opened = tk.unseal(tk.seal(claims, KEY_A.public()), KEYRING)
    assert opened == claims
    tk.check_time(opened, now=claims.exp - 1)
    pattern = claims.hosts[0]
    host = ("x." if pattern.wildcard else "") + pattern.host
    method = claims.methods[0] if claims.methods else "GET"
    path = claims.paths[0] if claims.paths else "/"
    tk.check_scope(opened, host, pattern.port, method, path)
    request = ij.InMemoryRequest(headers=[("Authorization", "none")])
    if isinstance(claims.processor, pr.PlaceholderProcessor):
        request.set_header_values(claims.processor.header, [claims.processor.placeholder])
    opened.processor.inject(opened.secret, request)


@SETTINGS
@given(st.text(max_size=60))
def test_host_pattern_parse_is_canonical(text: str) -> None:
    try:
        pattern = tk.Destination.parse(text)
    except tk.TokenMalformed:
        return
    assert tk.Destination.parse(str(pattern)) == pattern
    below = canonical_name(("a." if pattern.wildcard else "") + pattern.host)
    assert pattern.matches(below, pattern.port)
    assert not pattern.matches(canonical_name(pattern.host), pattern.port) or not pattern.wildcard


@SETTINGS
@given(st.text(alphabet="/.%2eEfFa\\?#", max_size=30))
def test_allowed_paths_stay_under_the_prefix(path: str) -> None:
    claims = tk.Claims(
        kid=KEY_A.kid,
        secret="S3CRET",
        processor=pr.BearerProcessor(),
        hosts=(tk.Destination("h.example"),),
        paths=("/a",),
        exp=2,
        iat=1,
    )
    try:
        tk.check_scope(claims, "h.example", 443, "GET", "/a" + path)
    except tk.TokenScope:
        return
    clean = ("/a" + path).partition("?")[0].partition("#")[0]
    assert clean == "/a" or clean.startswith("/a/")
    assert ".." not in clean.replace("%2e", ".").replace("%2E", ".").split("/")
