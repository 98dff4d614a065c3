"""Build tests/vectors/vectors.json, the sealed-token test vectors.

    .venv/bin/python tests/vectors/generate.py          # rewrite vectors.json
    .venv/bin/python tests/vectors/generate.py --check  # exit 1 if it is out of date

Deterministic: the key pairs, every sealed box's ephemeral key and the clock are derived from
fixed strings, so the same code always writes the same bytes. Production sealing (`seal`) uses a
fresh random ephemeral key; this file builds the identical libsodium crypto_box_seal construction
by hand only so that the vectors are reproducible. The keys here are public test keys: never use
them for anything else.

Evaluation of a vector (what `evaluate` does, and what another implementation must reproduce):
open the token at `now` with the vector keys, then check the binding against `context`, then the
scope against the request's host/port/method/path, then apply the processor to the request. A
valid vector lists the request as it must look afterwards; an invalid one the error's reason and
HTTP status. Header lists compare with names lower-cased, sorted stably by name; the path (the
raw request target, query included) compares as exact text.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import nacl.encoding
import nacl.hash
from nacl.public import Box, PrivateKey, PublicKey

from sealgate import credentials as tk
from sealgate.credentials import httprequest as ij
from sealgate.credentials import processors as pr
from sealgate.credentials.keys import Keyring, PrivateKeyEntry

VECTORS_PATH: Final = Path(__file__).with_name("vectors.json")
NOW: Final = 1_700_000_000
CREATED: Final = datetime(2023, 11, 1, tzinfo=UTC)


def _derived(label: str) -> bytes:
    return hashlib.sha256(f"sealgate test vectors: {label}".encode()).digest()


KEY_A: Final = PrivateKeyEntry.from_private_key(_derived("key A"), CREATED)
KEY_B: Final = PrivateKeyEntry.from_private_key(
    _derived("key B"), datetime(2023, 11, 8, tzinfo=UTC)
)
# Sealed to but absent from the vector keyring: its kid is unknown to the proxy.
KEY_C: Final = PrivateKeyEntry.from_private_key(_derived("key C"), CREATED)
KEYRING_ENTRIES: Final = (KEY_A, KEY_B)


def seal_deterministic(plaintext: bytes, recipient: bytes, ephemeral_seed: bytes) -> bytes:
    """crypto_box_seal with a chosen ephemeral key: epk || crypto_box(m, nonce, pk, esk) where
    nonce = BLAKE2b-192(epk || pk)."""
    ephemeral = PrivateKey(ephemeral_seed)
    epk = bytes(ephemeral.public_key)
    nonce = nacl.hash.blake2b(epk + recipient, digest_size=24, encoder=nacl.encoding.RawEncoder)
    box = Box(ephemeral, PublicKey(recipient))
    return epk + box.encrypt(plaintext, nonce).ciphertext


@dataclass
class Request:
    method: str = "GET"
    host: str = "api.example.com"
    port: int = 443
    path: str = "/v1/items"  # the raw request target: path and query, as on the request line
    headers: list[tuple[str, str]] = field(default_factory=lambda: [("Accept", "*/*")])
    body: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "method": self.method,
            "host": self.host,
            "port": self.port,
            "path": self.path,
            "headers": [list(pair) for pair in self.headers],
            "body": self.body,
        }


@dataclass
class Context:
    sandbox_id: str | None = "sbx-1"
    policy: str | None = "default"
    proxy_authorization: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "sandbox_id": self.sandbox_id,
            "policy": self.policy,
            "proxy_authorization": self.proxy_authorization,
        }


def _claims(**overrides: object) -> dict[str, object]:
    """A valid claims object (as JSON data) for key A, with `overrides` applied; a value of
    `...` (Ellipsis) removes the field."""
    claims: dict[str, object] = {
        "version": 1,
        "kid": KEY_A.kid,
        "secret": "sk_test_VECTOR_SECRET_0001",
        "processor": {"type": "bearer"},
        "hosts": ["api.example.com"],
        "exp": NOW + 900,
        "iat": NOW - 60,
    }
    for name, value in overrides.items():
        if value is ...:
            claims.pop(name, None)
        else:
            claims[name] = value
    return claims


def _token(name: str, plaintext: bytes, key: PrivateKeyEntry, visible_kid: str | None) -> str:
    sealed = seal_deterministic(plaintext, key.public_key, _derived(f"ephemeral {name}"))
    return tk.format_token(visible_kid or key.kid, sealed)


@dataclass
class Case:
    name: str
    description: str
    claims: Mapping[str, object] | None = None
    plaintext: bytes | None = None  # raw plaintext, for JSON that `json.dumps` cannot produce
    token: str | None = None  # a literal token, for envelope errors
    key: PrivateKeyEntry = KEY_A
    visible_kid: str | None = None
    request: Request = field(default_factory=Request)
    context: Context = field(default_factory=Context)

    def build(self) -> tuple[str, bytes | None]:
        """(token, the sealed plaintext, if any)."""
        if self.token is not None:
            return self.token, None
        plaintext = self.plaintext
        if plaintext is None:
            plaintext = json.dumps(self.claims, separators=(",", ":")).encode()
        return _token(self.name, plaintext, self.key, self.visible_kid), plaintext


def evaluate(
    token: str, request: Mapping[str, object], context: Mapping[str, object], keyring: Keyring
) -> dict[str, object]:
    """Run one vector: the request after injection, or the error. Shapes as in vectors.json."""
    try:
        claims = tk.unseal(token, keyring)
        tk.check_time(claims, now=NOW)
        auth = context["proxy_authorization"]
        assert isinstance(auth, list)
        sandbox_id, policy = context["sandbox_id"], context["policy"]
        assert sandbox_id is None or isinstance(sandbox_id, str)
        assert policy is None or isinstance(policy, str)
        tk.check_binding(claims, sandbox_id=sandbox_id, policy=policy, proxy_authorization=auth)
        host, port, method, path = (request[k] for k in ("host", "port", "method", "path"))
        assert isinstance(host, str) and isinstance(port, int)
        assert isinstance(method, str) and isinstance(path, str)
        tk.check_scope(claims, host, port, method, path)
        body = request["body"]
        assert isinstance(body, str)
        target = ij.InMemoryRequest(
            headers=_pairs(request["headers"]), path=path, body=body.encode(), method=method
        )
        try:
            claims.processor.inject(claims.secret, target, now=NOW)
        except pr.RequestInapplicable as exc:
            # §4: a request a token's processor cannot apply to is the token's failure.
            raise tk.TokenInapplicable(str(exc)) from None
    except tk.TokenError as exc:
        return {"error": {"reason": exc.reason, "status": exc.reason.status}}
    return {
        "expected": {
            "headers": normalise_headers(target.headers),
            "path": target.path,
            "body": target.body.decode(),
        }
    }


def _pairs(value: object) -> list[tuple[str, str]]:
    assert isinstance(value, list)
    return [(str(k), str(v)) for k, v in value]


def normalise_headers(headers: list[tuple[str, str]]) -> list[list[str]]:
    lowered = [[name.lower(), value] for name, value in headers]
    return sorted(lowered, key=lambda pair: pair[0])


_SECRET: Final = "sk_test_VECTOR_SECRET_0001"
_BEARER_PROXY_SECRET: Final = "proxy-bearer-VECTOR-0001"
_AWS_PROCESSOR: Final = {"type": "aws-sigv4", "services": "s3", "regions": "us-east-1"}
_AWS_SECRET: Final = json.dumps({
    "access_key_id": "AKIAVECTOREXAMPLE001",
    "secret_access_key": "vector/SECRET+access/key/EXAMPLE0000001",
    "session_token": "vector-session/token+EXAMPLE==",
})
# Signed by the sandbox with the placeholder keys at NOW (2023-11-14T22:13:20Z); the proxy
# replaces the signature, never checks it.
_AWS_REQUEST: Final = Request(
    method="PUT",
    path="/bucket/a%20key.txt",
    headers=[
        ("Host", "api.example.com"),
        ("X-Amz-Date", "20231114T221320Z"),
        ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
        ("Authorization", "AWS4-HMAC-SHA256 Credential=SEALGATEPLACEHOLDER/20231114/us-east-1/"
         "s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, "
         f"Signature={'0' * 64}"),
    ],
    body="object data",
)


def valid_cases() -> list[Case]:
    placeholder_request = Request(
        headers=[("Authorization", "Bearer sg-placeholder"), ("Accept", "*/*")]
    )
    query_api_key = {"type": "query", "param": "api_key"}
    return [
        Case(
            "bearer",
            "bearer replaces the client's Authorization header",
            _claims(),
            request=Request(headers=[("authorization", "Bearer dummy"), ("Accept", "*/*")]),
        ),
        Case(
            "bearer-rotated-key",
            "a token sealed to the second (newer) key of the keyring",
            _claims(kid=KEY_B.kid),
            key=KEY_B,
        ),
        Case(
            "header",
            "header processor with a bare {secret} format",
            _claims(processor={"type": "header", "header": "X-Api-Key", "format": "{secret}"}),
        ),
        Case(
            "header-format",
            "header processor with text around {secret}",
            _claims(
                processor={"type": "header", "header": "Authorization", "format": "Token {secret}"}
            ),
        ),
        Case(
            "basic",
            "basic: Authorization: Basic base64(username:secret)",
            _claims(processor={"type": "basic", "username": "api"}),
        ),
        Case(
            "basic-unicode",
            "basic with a non-ASCII secret: base64 of its UTF-8 bytes",
            _claims(processor={"type": "basic", "username": "user"}, secret="pässwörd ✓"),
        ),
        Case(
            "query",
            "query removes every api_key parameter, keeps the others byte for byte (API_KEY is "
            "another name, %20 stays %20) and appends api_key last",
            _claims(processor=query_api_key),
            request=Request(path="/v1/items?api_key=dummy&q=1&api_key=x&API_KEY=keep&z=a%20b"),
        ),
        Case(
            "query-encoded-secret",
            "the secret is percent-encoded as UTF-8, a space as %20; / & = + are data",
            _claims(processor=query_api_key, secret="s k/&=+ü✓"),
            request=Request(path="/v1/items?a=b+c"),
        ),
        Case(
            "query-encoded-name",
            "names compare percent-decoded: api%5Fkey and a bare api_key are api_key; empty "
            "elements and names that merely contain api_key stay",
            _claims(processor=query_api_key),
            request=Request(path="/v1/items?api%5Fkey=smuggled&&api_key&xapi_key=1&api_key2=2&"),
        ),
        Case(
            "query-none",
            "a target without a query gets one",
            _claims(processor=query_api_key),
        ),
        Case(
            "query-empty",
            "a target with '?' and nothing after it",
            _claims(processor=query_api_key),
            request=Request(path="/v1/items?"),
        ),
        Case(
            "hmac-body-hex",
            "hmac-sha256 over the exact body, hex; the body is unchanged",
            _claims(
                processor={
                    "type": "hmac-sha256",
                    "header": "X-Signature",
                    "format": "sha256={signature}",
                    "encoding": "hex",
                }
            ),
            request=Request(method="POST", body='{"amount": 100, "currency": "eur"}\n'),
        ),
        Case(
            "hmac-message-base64",
            "hmac-sha256 over a sealed message, base64",
            _claims(
                processor={
                    "type": "hmac-sha256",
                    "header": "Authorization",
                    "format": "HMAC {signature}",
                    "encoding": "base64",
                    "message": "GET /v1/items",
                }
            ),
        ),
        Case(
            "placeholder",
            "placeholder substitution inside the client's header value",
            _claims(
                processor={
                    "type": "placeholder",
                    "header": "Authorization",
                    "placeholder": "sg-placeholder",
                }
            ),
            request=placeholder_request,
        ),
        Case(
            "aws-sigv4",
            "aws-sigv4 re-signs the placeholder's SigV4 request with the sealed keys: the key "
            "id and signature replaced, the session token added and signed",
            _claims(processor=_AWS_PROCESSOR, secret=_AWS_SECRET),
            request=_AWS_REQUEST,
        ),
        Case(
            "wildcard-and-port",
            "*.example.com matches a deeper subdomain on 443; a second pattern names port 8443",
            _claims(hosts=["*.example.com", "api.example.net:8443"]),
            request=Request(host="eu.api.example.com"),
        ),
        Case(
            "explicit-port",
            "a pattern with a port matches only that port",
            _claims(hosts=["*.example.com", "api.example.net:8443"]),
            request=Request(host="api.example.net", port=8443),
        ),
        Case(
            "ip-literals",
            "IPv4 and bracketed IPv6 patterns; the request names the IPv6 host unbracketed",
            _claims(hosts=["192.0.2.10", "[2001:db8::1]:8443"]),
            request=Request(host="2001:db8::1", port=8443),
        ),
        Case(
            "case-insensitive-host",
            "host patterns are compared lower-case",
            _claims(hosts=["API.Example.COM"]),
        ),
        Case(
            "all-claims",
            "methods, path prefixes, nbf, jti and a sandbox binding, all satisfied",
            _claims(
                methods=["GET", "POST"],
                paths=["/v1/charges", "/v2/"],
                nbf=NOW - 30,
                jti="tok-0001",
                binding={"sandbox": "sbx-1"},
            ),
            request=Request(method="POST", path="/v1/charges/ch_123?expand=x"),
        ),
        Case(
            "policy-binding",
            "bound to the policy the sandbox runs under",
            _claims(binding={"policy": "default"}),
        ),
        Case(
            "auth-digest-binding",
            "bound to a proxy bearer secret; one matching Proxy-Authorization value suffices",
            _claims(
                binding={"auth_sha256": hashlib.sha256(_BEARER_PROXY_SECRET.encode()).hexdigest()}
            ),
            context=Context(
                proxy_authorization=[
                    "Basic c2J4LTE6a2V5",
                    f"Bearer {_BEARER_PROXY_SECRET}",
                ]
            ),
        ),
        Case(
            "within-clock-skew",
            f"exp passed {tk.CLOCK_SKEW_SECONDS - 1} s ago: still inside the clock skew",
            _claims(exp=NOW - tk.CLOCK_SKEW_SECONDS + 1, iat=NOW - 600),
        ),
    ]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _replace_char(text: str, index: int) -> str:
    return text[:index] + ("B" if text[index] == "A" else "A") + text[index + 1 :]


def _envelope_cases() -> list[Case]:
    good = Case("base", "", _claims()).build()[0]
    body = good.split(".")[2]
    prefix = f"sg1.{KEY_A.kid}."
    return [
        Case("empty", "empty string", token=""),
        Case("wrong-prefix", "prefix other than sg1", token="sg2" + good[3:]),
        Case("two-parts", "no kid part", token=f"sg1.{body}"),
        Case("four-parts", "an extra dot-separated part", token=good + ".x"),
        Case(
            "kid-uppercase", "kid must be lower-case hex", token=f"sg1.{KEY_A.kid.upper()}.{body}"
        ),
        Case("kid-short", "kid must be 16 hex digits", token=f"sg1.{KEY_A.kid[:15]}.{body}"),
        Case("base64-padding", "padding is not allowed", token=good + "="),
        Case("base64-standard-alphabet", "'+' is not base64url", token=prefix + "+" + body[1:]),
        Case(
            "base64-bad-length",
            "a base64url length of 4n+1 is impossible",
            token=prefix + body + "A" * ((1 - len(body)) % 4 or 4),
        ),
        Case(
            "too-short",
            "no more bytes than a sealed box's overhead",
            token=prefix + _b64(bytes(48)),
        ),
        Case(
            "too-long",
            f"longer than {tk.MAX_TOKEN_LENGTH} characters",
            token=prefix + "A" * (tk.MAX_TOKEN_LENGTH - len(prefix) + 1),
        ),
        Case("whitespace", "whitespace is not part of the format", token=good + "\n"),
        Case(
            "tampered-middle",
            "one base64url character in the middle changed",
            token=prefix + _replace_char(body, len(body) // 2),
        ),
        Case(
            "tampered-last",
            "the last base64url character changed (unused bits: non-canonical, else tampered)",
            token=prefix + _replace_char(body, len(body) - 1),
        ),
    ]


def invalid_cases() -> list[Case]:
    processor_hmac = {
        "type": "hmac-sha256",
        "header": "X-Signature",
        "format": "{signature}",
        "encoding": "hex",
    }
    cases = _envelope_cases()
    cases += [
        Case(
            "unknown-kid",
            "sealed to a key the keyring does not hold",
            _claims(kid=KEY_C.kid),
            key=KEY_C,
        ),
        Case(
            "wrong-key",
            "visible kid A, sealed to key B",
            _claims(),
            key=KEY_B,
            visible_kid=KEY_A.kid,
        ),
        Case(
            "kid-mismatch",
            "sealed to key A with kid B inside",
            _claims(kid=KEY_B.kid),
            visible_kid=KEY_A.kid,
        ),
        Case("not-json", "plaintext is not JSON", plaintext=b"not json"),
        Case("not-utf8", "plaintext is not UTF-8", plaintext=b'{"version":1,"x":"\xff"}'),
        Case("json-array", "top level is not an object", plaintext=b"[]"),
        Case(
            "duplicate-key",
            "a key appears twice",
            plaintext=json.dumps(_claims(), separators=(",", ":"))[:-1].encode()
            + b',"secret":"other"}',
        ),
        Case("unknown-field", "an unknown claim", _claims(scope="admin")),
        Case("missing-exp", "exp is required", _claims(exp=...)),
        Case("missing-iat", "iat is required", _claims(iat=...)),
        Case(
            "float-exp",
            "exp must be an integer",
            plaintext=json.dumps(_claims(), separators=(",", ":"))
            .replace(f'"exp":{NOW + 900}', f'"exp":{NOW + 900}.0')
            .encode(),
        ),
        Case("bool-version", "true is not the integer 1", _claims(version=True)),
        Case("version-2", "unsupported version", _claims(version=2)),
        Case("null-optional", "optional fields are omitted, not null", _claims(nbf=None)),
        Case(
            "unknown-processor", "an unknown processor type", _claims(processor={"type": "sigv4"})
        ),
        Case(
            "processor-unknown-field",
            "a field the processor does not have",
            _claims(processor={"type": "bearer", "header": "X-Api-Key"}),
        ),
        Case(
            "processor-missing-field",
            "header processor without format",
            _claims(processor={"type": "header", "header": "X-Api-Key"}),
        ),
        Case(
            "format-two-slots",
            "{secret} twice",
            _claims(
                processor={"type": "header", "header": "X-Api-Key", "format": "{secret}{secret}"}
            ),
        ),
        Case(
            "forbidden-header",
            "a token may not set Host",
            _claims(processor={"type": "header", "header": "Host", "format": "{secret}"}),
        ),
        Case(
            "proxy-header",
            "a token may not set Proxy-* headers",
            _claims(processor={**processor_hmac, "header": "Proxy-Authorization"}),
        ),
        Case(
            "hmac-bad-encoding",
            "encoding must be hex or base64",
            _claims(processor={**processor_hmac, "encoding": "HEX"}),
        ),
        Case(
            "secret-newline",
            "a header secret with a line break",
            _claims(secret="sk_test\r\nX-Evil: 1"),
        ),
        Case("secret-empty", "an empty secret", _claims(secret="")),
        Case("wildcard-tld", "*.com is too broad", _claims(hosts=["*.com"])),
        Case("host-numeric", "an inet_aton shorthand is not a host", _claims(hosts=["127.1"])),
        Case("host-ipv6-unbracketed", "IPv6 needs brackets", _claims(hosts=["2001:db8::1"])),
        Case("host-port-zero", "port 0", _claims(hosts=["api.example.com:0"])),
        Case("hosts-empty", "at least one host", _claims(hosts=[])),
        Case("methods-lowercase", "methods are upper-case", _claims(methods=["get"])),
        Case("methods-empty", "an empty list is not 'any method'", _claims(methods=[])),
        Case(
            "path-dot-segment",
            "path prefixes may not contain dot segments",
            _claims(paths=["/v1/../admin"]),
        ),
        Case(
            "lifetime-over-cap",
            "exp - iat above 24 h",
            _claims(iat=NOW - 60, exp=NOW - 60 + tk.MAX_LIFETIME_SECONDS + 1),
        ),
        Case("exp-before-iat", "exp must be after iat", _claims(exp=NOW - 120, iat=NOW - 60)),
        Case(
            "binding-two-kinds",
            "a binding names exactly one kind",
            _claims(binding={"sandbox": "sbx-1", "policy": "default"}),
        ),
        Case(
            "expired",
            "exp passed beyond the clock skew",
            _claims(exp=NOW - tk.CLOCK_SKEW_SECONDS, iat=NOW - 600),
        ),
        Case(
            "not-yet-valid",
            "nbf in the future beyond the clock skew",
            _claims(nbf=NOW + tk.CLOCK_SKEW_SECONDS + 1),
        ),
        Case(
            "issued-in-future",
            "iat in the future beyond the clock skew",
            _claims(iat=NOW + 120, exp=NOW + 900),
        ),
        Case("binding-sandbox", "bound to another sandbox", _claims(binding={"sandbox": "sbx-2"})),
        Case(
            "binding-sandbox-unknown",
            "bound to a sandbox; the request's sandbox is unknown",
            _claims(binding={"sandbox": "sbx-1"}),
            context=Context(sandbox_id=None),
        ),
        Case("binding-policy", "bound to another policy", _claims(binding={"policy": "ci"})),
        Case(
            "binding-auth-digest",
            "the Proxy-Authorization bearer secret does not match",
            _claims(binding={"auth_sha256": hashlib.sha256(b"right").hexdigest()}),
            context=Context(proxy_authorization=["Bearer wrong"]),
        ),
        Case("scope-host", "another host", _claims(), request=Request(host="api.example.org")),
        Case(
            "scope-suffix",
            "a host that merely ends with the allowed name",
            _claims(),
            request=Request(host="evilapi.example.com"),
        ),
        Case(
            "scope-wildcard-apex",
            "*.example.com does not match example.com",
            _claims(hosts=["*.example.com"]),
            request=Request(host="example.com"),
        ),
        Case("scope-port", "the default port is 443 only", _claims(), request=Request(port=8443)),
        Case(
            "scope-method",
            "method not listed",
            _claims(methods=["GET"]),
            request=Request(method="DELETE"),
        ),
        Case(
            "scope-path-segment",
            "/v1/charges does not allow /v1/chargesX",
            _claims(paths=["/v1/charges"]),
            request=Request(path="/v1/chargesX"),
        ),
        Case(
            "scope-path-dot",
            "dot segments never match a prefix",
            _claims(paths=["/v1/charges"]),
            request=Request(path="/v1/charges/../../admin"),
        ),
        Case(
            "scope-path-encoded-dot",
            "encoded dot segments never match a prefix",
            _claims(paths=["/v1/charges"]),
            request=Request(path="/v1/charges/%2e%2e/admin"),
        ),
        Case(
            "query-fragment",
            "a '#' in the request target: where the query ends is ambiguous",
            _claims(processor={"type": "query", "param": "api_key"}),
            request=Request(path="/v1/items?a=1#api_key=x"),
        ),
        Case(
            "aws-sigv4-unsigned",
            "aws-sigv4 on a request the sandbox did not sign with SigV4",
            _claims(processor=_AWS_PROCESSOR, secret=_AWS_SECRET),
        ),
        Case(
            "placeholder-missing",
            "the request does not carry the placeholder",
            _claims(
                processor={
                    "type": "placeholder",
                    "header": "Authorization",
                    "placeholder": "sg-placeholder",
                }
            ),
        ),
    ]
    return cases


def _key_json(entry: PrivateKeyEntry) -> dict[str, object]:
    return {
        "kid": entry.kid,
        "created": entry.created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "private_key": entry.private_key.hex(),
        "public_key": entry.public_key.hex(),
    }


def _plaintext_json(plaintext: bytes) -> dict[str, object]:
    try:
        return {"plaintext": plaintext.decode("utf-8")}
    except UnicodeDecodeError:
        return {"plaintext_hex": plaintext.hex()}


def build() -> dict[str, object]:
    keyring = Keyring(KEYRING_ENTRIES)
    sections: dict[str, list[dict[str, object]]] = {"valid": [], "invalid": []}
    for section, cases in (("valid", valid_cases()), ("invalid", invalid_cases())):
        for case in cases:
            token, plaintext = case.build()
            request, context = case.request.to_json(), case.context.to_json()
            outcome = evaluate(token, request, context, keyring)
            if ("expected" in outcome) != (section == "valid"):
                raise SystemExit(f"vector {case.name} did not come out {section}: {outcome}")
            entry: dict[str, object] = {
                "name": case.name,
                "description": case.description,
                "token": token,
            }
            if plaintext is not None:
                entry |= _plaintext_json(plaintext)
            entry |= {"request": request, "context": context, **outcome}
            sections[section].append(entry)
    return {
        "format": "sealgate sealed-token test vectors",
        "spec": "docs/token-format.md",
        "generator": "tests/vectors/generate.py",
        "now": NOW,
        "keyring": [_key_json(entry) for entry in KEYRING_ENTRIES],
        "unknown_key": _key_json(KEY_C),
        **sections,
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if vectors.json is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        current = VECTORS_PATH.read_text(encoding="utf-8") if VECTORS_PATH.exists() else ""
        if current != text:
            sys.stderr.write(f"{VECTORS_PATH} is out of date; run {sys.argv[0]}\n")
            return 1
        return 0
    VECTORS_PATH.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
