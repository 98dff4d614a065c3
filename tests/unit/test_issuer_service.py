"""The issuer service (issuer/service.py, webapp.py, mintrequest.py, callers.py): the real
aiohttp app on 127.0.0.1, real key files, a real callers file and a real audit log; one
end-to-end `sealgate issuer serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import shutil
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
import requests
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from sealgate import credentials as tk
from sealgate.audit import AuditLog
from sealgate.credentials import keys
from sealgate.issuer import callers as cl
from sealgate.issuer import service, webapp
from tests.harness import OriginCA

ROOT = Path(__file__).resolve().parents[2]
SEALGATE = ROOT / ".venv" / "bin" / "sealgate"
CANARY = "sk_live_ISSUER_CANARY_6b1e94"
API_KEYS = {
    "ci": "ci-api-key-CANARY-0a7c",
    "bound": "bound-api-key-CANARY-51d9",
    "slow": "slow-api-key-CANARY-93e2",
}
Client = TestClient[web.Request, web.Application]
T = TypeVar("T")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


CALLERS_YAML = f"""
callers:
  ci:
    key_sha256: "{_digest(API_KEYS["ci"])}"
    hosts: ["api.github.com", "*.stripe.com", "api.example.com:8443"]
    processors: [bearer, header]
    max_ttl: 15m
    bindings: [none, sandbox]
  bound:
    key_sha256: "{_digest(API_KEYS["bound"])}"
    hosts: [api.example.com]
    processors: [bearer]
    max_ttl: 1h
    bindings: [sandbox, auth-digest]
  slow:
    key_sha256: "{_digest(API_KEYS["slow"])}"
    hosts: [api.example.com]
    processors: [bearer]
    max_ttl: 300
    rate: {{per_minute: 2}}
  mtls:
    mtls_subject: "CN=ci-mtls"
    hosts: [api.example.com]
    processors: [bearer]
    max_ttl: 5m
"""


@dataclass
class Env:
    private_dir: Path
    public_dir: Path
    callers_path: Path
    audit_path: Path
    issuer: service.Issuer
    responses: list[str] = field(default_factory=list)

    @property
    def keyring(self) -> keys.Keyring:
        return keys.Keyring.load(self.private_dir)

    def audit_lines(self) -> list[dict[str, Any]]:
        text = self.audit_path.read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines()]

    def add_key(self) -> keys.PublicKeyEntry:
        return _add_key(self.private_dir, self.public_dir)


def _add_key(
    private_dir: Path, public_dir: Path, now: datetime | None = None
) -> keys.PublicKeyEntry:
    """A new proxy key pair; the issuer's directory gets the public half only."""
    entry = keys.generate(private_dir, now=now)
    shutil.copy(private_dir / f"{entry.kid}.pub", public_dir)
    return entry


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    private_dir, public_dir = tmp_path / "proxy-keys", tmp_path / "issuer-keys"
    public_dir.mkdir()
    callers_path = tmp_path / "callers.yaml"
    callers_path.write_text(CALLERS_YAML, encoding="utf-8")
    audit_path = tmp_path / "audit" / "issuer.log"
    audit = AuditLog(audit_path)
    _add_key(private_dir, public_dir, now=datetime.now(UTC) - timedelta(days=1))
    issuer = service.Issuer(public_dir, callers_path, audit)
    yield Env(private_dir, public_dir, callers_path, audit_path, issuer)
    audit.close()


def run(factory: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(factory(), timeout=20)

    return asyncio.run(bounded())


@contextlib.asynccontextmanager
async def serving(env: Env, *, reload_interval: float = 0) -> AsyncIterator[Client]:
    app = webapp.make_app(env.issuer, reload_interval=reload_interval)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield client


def body(**overrides: Any) -> dict[str, Any]:
    request: dict[str, Any] = {
        "secret": CANARY,
        "inject": {"type": "bearer"},
        "hosts": ["api.github.com"],
        "ttl": "10m",
    }
    for name, value in overrides.items():
        if value is ...:
            del request[name]
        else:
            request[name] = value
    return request


async def post(
    env: Env, client: Client, payload: object, caller: str | None = "ci", **kwargs: Any
) -> tuple[int, dict[str, Any], Any]:
    headers = {} if caller is None else {"Authorization": f"Bearer {API_KEYS[caller]}"}
    headers.update(kwargs.pop("headers", {}))
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    async with client.post("/v1/tokens", data=data, headers=headers, **kwargs) as response:
        text = await response.text()
        env.responses.append(text)
        env.responses.append(str(dict(response.headers)))
        return response.status, json.loads(text), response.headers


def assert_nothing_leaked(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    places = [*env.responses, env.audit_path.read_text(encoding="utf-8"), caplog.text]
    for text in map(str.lower, places):
        assert CANARY.lower() not in text
        assert not any(key.lower() in text for key in API_KEYS.values())


# --- minting ----------------------------------------------------------------------------------


def test_mint_opens_with_the_proxy_key_and_has_the_requested_claims(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    request = body(
        hosts=["api.github.com", "x.stripe.com", "*.stripe.com"],
        methods=["GET", "POST"],
        paths=["/repos/"],
        binding={"sandbox": "sbx-7"},
        inject={"type": "header", "header": "X-Api-Key", "format": "token {secret}"},
        ttl=600,
    )

    async def scenario() -> tuple[int, dict[str, Any], Any]:
        async with serving(env) as client:
            return await post(env, client, request)

    before = int(time.time())
    status, reply, headers = run(scenario)
    assert status == 200, reply
    assert headers["Cache-Control"] == "no-store"
    claims = tk.unseal(reply["token"], env.keyring)
    tk.check_time(claims)
    assert claims.secret == CANARY
    assert claims.kid == reply["kid"] == env.issuer.current_key.kid
    assert [str(h) for h in claims.hosts] == ["api.github.com", "x.stripe.com", "*.stripe.com"]
    assert claims.methods == ("GET", "POST") and claims.paths == ("/repos/",)
    assert claims.binding == tk.SandboxBinding("sbx-7")
    assert claims.processor.kind == "header"
    assert claims.exp - claims.iat == 600 and before <= claims.iat <= int(time.time())
    assert reply["exp"] == claims.exp and claims.jti
    assert reply["claims"] == tk.redacted_claims(claims)
    (line,) = env.audit_lines()
    assert line["event"] == "mint" and line["outcome"] == "issued" and line["reason"] is None
    assert (line["caller"], line["kid"], line["jti"]) == ("ci", claims.kid, claims.jti)
    assert line["hosts"] == ["api.github.com", "x.stripe.com", "*.stripe.com"]
    assert (line["processor"], line["ttl"], line["binding"]) == ("header", 600, "sandbox")
    assert reply["token"] not in env.audit_path.read_text()
    assert_nothing_leaked(env, caplog)


def test_authentication(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    bad_headers = [
        {},
        {"Authorization": "Bearer not-a-known-key"},
        {"Authorization": f"Basic {API_KEYS['ci']}"},
        {"Authorization": "Bearer "},
    ]

    async def scenario() -> list[tuple[int, dict[str, Any], Any]]:
        async with serving(env) as client:
            results = [await post(env, client, body(), None, headers=h) for h in bad_headers]
            twice = [("Authorization", f"Bearer {API_KEYS['ci']}")] * 2
            async with client.post("/v1/tokens", json=body(), headers=twice) as response:
                results.append((response.status, await response.json(), response.headers))
            results.append(await post(env, client, body()))
            return results

    results = run(scenario)
    for status, reply, headers in results[:-1]:
        assert status == 401 and reply["error"] == "unauthenticated"
        assert headers["WWW-Authenticate"] == 'Bearer realm="sealgate-issuer"'
    assert results[-1][0] == 200
    lines = env.audit_lines()
    assert [line["outcome"] for line in lines] == ["refused"] * 5 + ["issued"]
    assert all(line["caller"] is None for line in lines[:5])
    assert_nothing_leaked(env, caplog)


@pytest.mark.parametrize(
    ("caller", "overrides", "reason"),
    [
        ("ci", {"hosts": ["api.evil.com"]}, "host_not_permitted"),
        ("ci", {"hosts": ["api.github.com", "stripe.com"]}, "host_not_permitted"),
        ("ci", {"hosts": ["*.github.com"]}, "host_not_permitted"),
        ("ci", {"hosts": ["api.github.com:8443"]}, "host_not_permitted"),
        ("ci", {"hosts": ["api.github.com", CANARY]}, "host_not_permitted"),
        ("ci", {"hosts": ["api.example.com"]}, "host_not_permitted"),
        ("ci", {"inject": {"type": "basic", "username": "u"}}, "processor_not_permitted"),
        ("ci", {"ttl": "16m"}, "ttl_too_long"),
        ("ci", {"binding": {"policy": "ci"}}, "binding_not_permitted"),
        ("bound", {"hosts": ["api.example.com"]}, "binding_required"),
    ],
)
def test_caller_limits(
    env: Env, caplog: pytest.LogCaptureFixture, caller: str, overrides: dict[str, Any], reason: str
) -> None:
    async def scenario() -> tuple[int, dict[str, Any], Any]:
        async with serving(env) as client:
            return await post(env, client, body(**overrides), caller)

    status, reply, _ = run(scenario)
    assert (status, reply["error"]) == (403, reason), reply
    (line,) = env.audit_lines()
    assert (line["caller"], line["outcome"], line["reason"]) == (caller, "refused", reason)
    assert_nothing_leaked(env, caplog)


@pytest.mark.parametrize(
    ("caller", "overrides"),
    [
        ("ci", {"hosts": ["API.GitHub.com", "a.b.stripe.com", "*.x.stripe.com"]}),
        ("ci", {"hosts": ["api.example.com:8443"], "ttl": "15m"}),
        ("bound", {"hosts": ["api.example.com"], "binding": {"auth_sha256": "ab" * 32}}),
    ],
)
def test_within_limits(env: Env, caller: str, overrides: dict[str, Any]) -> None:
    async def scenario() -> tuple[int, dict[str, Any], Any]:
        async with serving(env) as client:
            return await post(env, client, body(**overrides), caller)

    status, reply, _ = run(scenario)
    assert status == 200, reply


def test_rate_limit_per_caller(env: Env) -> None:
    async def scenario() -> list[tuple[int, dict[str, Any], Any]]:
        async with serving(env) as client:
            request = body(hosts=["api.example.com"], ttl="5m")
            results = [await post(env, client, request, "slow") for _ in range(3)]
            results.append(await post(env, client, body(), "ci"))
            return results

    (first, second, third, other) = run(scenario)
    assert (first[0], second[0], other[0]) == (200, 200, 200)
    status, reply, headers = third
    assert status == 429 and reply["error"] == "rate_limited"
    assert 1 <= int(headers["Retry-After"]) <= 30
    assert [line["reason"] for line in env.audit_lines()].count("rate_limited") == 1


def test_rate_limiter_refills() -> None:
    now = [0.0]
    limiter = cl.RateLimiter(lambda: now[0])
    caller = cl.Caller("c", (tk.Destination("h.example"),), frozenset({"bearer"}), 60, 6)
    assert [limiter.acquire(caller) for _ in range(6)] == [0.0] * 6
    assert limiter.acquire(caller) == pytest.approx(10.0)
    now[0] = 10.0
    assert limiter.acquire(caller) == 0.0


# --- bodies -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "reason", "words"),
    [
        (b"{", "bad_json", "line 1"),
        (b"[]", "bad_json", "object"),
        (f'{{"secret": "{CANARY}",'.encode(), "bad_json", "JSON"),
        (f'{{"secret": "{CANARY}", "secret": "x"}}'.encode(), "bad_json", "duplicate key"),
        (json.dumps(body(ttl=1.5)).encode(), "bad_json", "integers"),
        (b'{"secret": "\xff"}', "bad_json", "UTF-8"),
        (json.dumps(body(extra=CANARY)).encode(), "unknown_field", "'extra'"),
        (json.dumps(body(ttl=...)).encode(), "missing_field", "ttl"),
        (json.dumps(body(secret=CANARY + "\r\nX: y")).encode(), "invalid_request", "visible"),
        (json.dumps(body(hosts=["exa mple.com"])).encode(), "invalid_request", "host pattern"),
        (json.dumps(body(hosts=[CANARY + " x"])).encode(), "invalid_request", "host pattern"),
        (json.dumps(body(inject={"type": "nope"})).encode(), "invalid_request", "processor"),
        (json.dumps(body(inject={"type": "header"})).encode(), "invalid_request", "missing"),
        (json.dumps(body(ttl="soon")).encode(), "invalid_request", "duration"),
        (json.dumps(body(ttl=0)).encode(), "invalid_request", "more than 0"),
        (json.dumps(body(ttl="25h")).encode(), "invalid_request", "lifetime"),
        (json.dumps(body(methods=["get"])).encode(), "invalid_request", "upper-case"),
        (json.dumps(body(binding={"tenant": CANARY})).encode(), "invalid_request", "binding"),
    ],
)
def test_bad_requests_are_400_and_name_the_problem(
    env: Env, caplog: pytest.LogCaptureFixture, payload: bytes, reason: str, words: str
) -> None:
    async def scenario() -> tuple[int, dict[str, Any], Any]:
        async with serving(env) as client:
            return await post(env, client, payload)

    status, reply, _ = run(scenario)
    assert (status, reply["error"]) == (400, reason), reply
    assert words in reply["detail"]
    (line,) = env.audit_lines()
    assert (line["outcome"], line["reason"]) == ("refused", reason)
    assert_nothing_leaked(env, caplog)


def test_body_cap(env: Env, caplog: pytest.LogCaptureFixture) -> None:
    oversize = json.dumps(body(paths=["/" + "a" * webapp.MAX_BODY_BYTES])).encode()

    async def scenario() -> tuple[int, dict[str, Any], Any]:
        async with serving(env) as client:
            return await post(env, client, oversize)

    status, reply, _ = run(scenario)
    assert (status, reply["error"]) == (413, "body_too_large")
    assert_nothing_leaked(env, caplog)


# --- keys, health, reload ---------------------------------------------------------------------


def test_keys_lists_public_keys_only(env: Env) -> None:
    newer = env.add_key()
    env.issuer.reload("test")

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with serving(env) as client:
            async with client.get("/v1/keys") as response:
                listing = await response.json()
            async with client.get("/healthz") as response:
                assert response.status == 200
                return listing, await response.json()

    listing, health = run(scenario)
    assert listing["current"] == newer.kid
    assert [entry["kid"] for entry in listing["keys"]] == list(env.keyring.kids)
    text = json.dumps(listing)
    for kid in env.keyring.kids:
        private = env.keyring.get(kid)
        assert private is not None and private.private_key.hex() not in text
        assert {"format", "kid", "created", "public_key"} == set(listing["keys"][0])
    assert listing["keys"][0]["public_key"] == newer.public_key.hex()
    assert health == {"ok": True, "kid": newer.kid, "keys": 2, "callers": 4, "problems": {}}
    assert not list(env.public_dir.glob("*.key"))


def test_directory_change_is_picked_up_and_bad_reloads_keep_the_old_state(env: Env) -> None:
    old = env.issuer.current_key

    async def scenario() -> tuple[str, dict[str, Any], int, int]:
        async with serving(env, reload_interval=0.05) as client:
            newer = env.add_key()
            for _ in range(100):
                if env.issuer.current_key.kid == newer.kid:
                    break
                await asyncio.sleep(0.05)
            env.callers_path.write_text("callers: [", encoding="utf-8")
            for _ in range(100):
                if "callers" in env.issuer.problems:
                    break
                await asyncio.sleep(0.05)
            async with client.get("/healthz") as response:
                health, health_status = await response.json(), response.status
            mint_status, _, _ = await post(env, client, body())
            return newer.kid, health, health_status, mint_status

    newer_kid, health, health_status, mint_status = run(scenario)
    assert newer_kid != old.kid and env.issuer.current_key.kid == newer_kid
    assert health_status == 503 and "YAML syntax error" in health["problems"]["callers"]
    assert mint_status == 200  # the previous callers stay in force


# --- mTLS -------------------------------------------------------------------------------------


def test_mtls_client_certificate_authenticates(env: Env, tmp_path: Path) -> None:
    ca = OriginCA(tmp_path)
    server_cert, server_key = ca.issue("127.0.0.1")
    client_cert, client_key = ca.issue("ci-mtls")
    stranger_cert, stranger_key = ca.issue("someone-else")
    server_context = webapp.tls_context(server_cert, server_key, ca.path)

    def client_context(cert: Path | None, key: Path | None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(ca.path))
        if cert is not None and key is not None:
            context.load_cert_chain(cert, key)
        return context

    async def scenario() -> list[tuple[int, dict[str, Any]]]:
        server = TestServer(webapp.make_app(env.issuer, reload_interval=0), host="127.0.0.1")
        await server.start_server(ssl=server_context)
        results = []
        try:
            async with aiohttp.ClientSession() as session:
                for cert, key, headers in [
                    (client_cert, client_key, {}),
                    (stranger_cert, stranger_key, {}),
                    (None, None, {}),
                    (None, None, {"Authorization": f"Bearer {API_KEYS['ci']}"}),
                    (client_cert, client_key, {"Authorization": f"Bearer {API_KEYS['ci']}"}),
                ]:
                    async with session.post(
                        server.make_url("/v1/tokens"),
                        json=body(hosts=["api.example.com"], ttl="5m"),
                        headers=headers,
                        ssl=client_context(cert, key),
                    ) as response:
                        results.append((response.status, await response.json()))
        finally:
            await server.close()
        return results

    mtls, stranger, anonymous, api_key, both = run(scenario)
    assert mtls[0] == 200
    assert tk.unseal(mtls[1]["token"], env.keyring).secret == CANARY
    assert stranger[0] == anonymous[0] == 401
    assert api_key[0] == 403 and api_key[1]["error"] == "host_not_permitted"  # ci, not mtls
    assert both[0] == 401  # two credentials naming different callers
    assert [line["caller"] for line in env.audit_lines()] == ["mtls", None, None, "ci", None]


# --- callers file -----------------------------------------------------------------------------


def _entry(**overrides: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "key_sha256": "ab" * 32,
        "hosts": ["api.example.com"],
        "processors": ["bearer"],
        "max_ttl": "15m",
    }
    for name, value in overrides.items():
        if value is ...:
            del entry[name]
        else:
            entry[name] = value
    return entry


@pytest.mark.parametrize(
    ("document", "words"),
    [
        ("callers:\n  a: {}\n  a: {}\n", "callers.a: duplicate key (first at line 2)"),
        ({"callers": {}}, "non-empty"),
        ({"callers": {"a": _entry()}, "extra": 1}, "top level"),
        ({"callers": {"a b": _entry()}}, "caller name"),
        ({"callers": {"a": _entry(extra=1)}}, "unknown field(s) 'extra'"),
        ({"callers": {"a": _entry(hosts=...)}}, "missing field(s) hosts"),
        ({"callers": {"a": _entry(key_sha256="AB" * 32)}}, "key_sha256"),
        ({"callers": {"a": _entry(key_sha256=...)}}, "key_sha256 or mtls_subject"),
        ({"callers": {"a": _entry(processors=["bearer", "magic"])}}, "'magic'"),
        ({"callers": {"a": _entry(processors=[])}}, "must not be empty"),
        ({"callers": {"a": _entry(hosts=["*.com"])}}, "callers.a.hosts"),
        ({"callers": {"a": _entry(max_ttl="25h")}}, "at most 24h"),
        ({"callers": {"a": _entry(max_ttl="soon")}}, "duration"),
        ({"callers": {"a": _entry(rate={"per_minute": 0})}}, "per_minute"),
        ({"callers": {"a": _entry(rate={"per_hour": 5})}}, "per_minute"),
        ({"callers": {"a": _entry(bindings=["sandbox", "tenant"])}}, "'tenant'"),
        ({"callers": {"a": _entry(), "b": _entry()}}, "shares its key"),
        ("callers:\n  ? [a, b]\n  : {}\n", "keys must be plain strings"),
        ("callers: " + "[" * 5000, "nested deeper than 32 levels"),
    ],
)
def test_callers_file_errors(tmp_path: Path, document: object, words: str) -> None:
    path = tmp_path / "callers.yaml"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    with pytest.raises(cl.CallersFileError) as info:
        cl.load_callers(path)
    assert words in str(info.value) and str(path) in str(info.value)


def test_callers_file_defaults(tmp_path: Path) -> None:
    path = tmp_path / "callers.yaml"
    key = "callers-defaults-key"
    digest = hashlib.sha256(key.encode()).hexdigest()
    path.write_text(json.dumps({"callers": {"a": _entry(max_ttl=900, key_sha256=digest)}}))
    caller = cl.load_callers(path).by_api_key(key)
    assert caller is not None
    assert (caller.max_ttl, caller.per_minute) == (900, cl.DEFAULT_PER_MINUTE)
    assert caller.bindings == frozenset(cl.BINDING_KINDS)
    assert digest not in repr(caller)


@pytest.mark.parametrize(
    ("allowed", "requested", "covered"),
    [
        ("api.example.com", "api.example.com", True),
        ("api.example.com", "API.example.com:443", True),
        ("api.example.com", "api.example.com:8443", False),
        ("api.example.com", "*.api.example.com", False),
        ("*.example.com", "a.example.com", True),
        ("*.example.com", "a.b.example.com", True),
        ("*.example.com", "*.example.com", True),
        ("*.example.com", "*.a.example.com", True),
        ("*.example.com", "example.com", False),
        ("*.example.com", "badexample.com", False),
        ("*.example.com", "*.co.example", False),
        ("10.0.0.1", "10.0.0.1", True),
        ("[2001:db8::1]:8443", "[2001:0db8::1]:8443", True),
    ],
)
def test_host_covered(allowed: str, requested: str, covered: bool) -> None:
    assert (
        cl.host_covered(tk.Destination.parse(allowed), tk.Destination.parse(requested)) == covered
    )


# --- the command ------------------------------------------------------------------------------


def _http(method: str, url: str, **kwargs: Any) -> requests.Response:
    return requests.request(method, url, timeout=5, **kwargs)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--listen", "10.1.2.3:8090"], "not a loopback address"),
        (["--listen", "nonsense"], "HOST:PORT"),
        (["--client-ca", "ca.pem"], "--client-ca needs"),
        (["--tls-cert", "c.pem"], "go together"),
    ],
)
def test_serve_refuses_unsafe_options(
    env: Env, capsys: pytest.CaptureFixture[str], argv: list[str], words: str
) -> None:
    import argparse

    from sealgate.issuer import cli

    parser = argparse.ArgumentParser(prog="sealgate")
    cli.register(parser.add_subparsers(dest="command"))
    fixed = ["issuer", "serve", "--keys", str(env.public_dir), "--callers", str(env.callers_path)]
    args = parser.parse_args([*fixed, *argv])
    assert args.func(args) == 1
    assert words in capsys.readouterr().err
