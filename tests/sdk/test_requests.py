"""requests, unchanged, through a real proxy to a fake HTTPS API.

requests reads HTTPS_PROXY (credentials included) and REQUESTS_CA_BUNDLE from the environment
`sealgate env` printed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sealgate.credentials.processors import BearerProcessor, HeaderProcessor
from tests.dnsstub import StubDNS
from tests.harness import OriginCA
from tests.sdk.kit import (
    PROXY_HEADERS,
    Arrived,
    Reply,
    World,
    echo,
    masked,
    policy,
    rule,
    rules_file,
    world,
)

pytest.importorskip("requests", reason="requests is not installed (pip install -e '.[test]')")

HOST = "api.requests.test"
BLOCKED = "blocked.requests.test"
SECRET = "requests-CANARY-secret-7a2b9c4d1e"
KEYS = {"plain-1": "plain-key-requests-1", "broker-1": "broker-key-requests-1",
        "tokens-1": "tokens-key-requests-1"}
PATHS = ["/v1/**"]


def rules(port: int) -> str:
    return rules_file(
        [
            policy("plain", rule(HOST, [port], paths=PATHS)),
            policy("broker", rule(HOST, [port], paths=PATHS, inject="bearer")),
            policy("tokens", rule(HOST, [port], paths=PATHS), tokens=True),
            policy("anon", rule(HOST, [port], paths=PATHS), tokens=True),
        ],
        {"plain-1": ("plain", KEYS["plain-1"]), "broker-1": ("broker", KEYS["broker-1"]),
         "tokens-1": ("tokens", KEYS["tokens-1"])},
        default="anon",
    )


def route(seen: Arrived) -> Reply:
    return Reply(body={**echo(seen), "body": seen.body.decode(errors="replace")})


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
      ) -> Iterator[World]:
    directory: Path = tmp_path_factory.mktemp("sdk-requests")
    with world(directory, test_ca, dns, [HOST, BLOCKED], route, rules, KEYS, SECRET) as made:
        yield made


@pytest.fixture(autouse=True)
def _fresh(w: World) -> None:
    w.fake.reset()


CALL = """
def main(urls, headers=None, method="GET", body=None, raise_status=False):
    import requests
    out = []
    with requests.Session() as session:
        for url in urls:
            r = session.request(method, url, headers=headers, data=body, timeout=15)
            if raise_status:
                r.raise_for_status()
            out.append({"status": r.status_code, "text": r.text,
                        "error_header": r.headers.get("x-sealgate-error")})
    return out
"""


def clean(seen: Arrived) -> None:
    for name in PROXY_HEADERS:
        assert not seen.values(name), (name, seen.fields)


def test_plain_requests_share_one_connection(w: World) -> None:
    got = w.run(CALL, w.env("plain-1"), urls=[w.url("/v1/a"), w.url("/v1/b?x=1")],
                     method="PUT", body="payload", headers={"X-Trace": "t-2"}).ok()
    assert [g["status"] for g in got] == [200, 200]
    assert [(r.method, r.path, r.body) for r in w.fake.requests] == [
        ("PUT", "/v1/a", b"payload"), ("PUT", "/v1/b?x=1", b"payload")]
    for seen in w.fake.requests:
        assert seen.headers["x-trace"] == "t-2"
        assert seen.headers["host"] == w.authority
        assert seen.headers["user-agent"].startswith("python-requests/")
        clean(seen)
    assert w.fake.connections == 1


def test_broker_injects_and_masks_the_echo(w: World) -> None:
    [got] = w.run(CALL, w.env("broker-1"), urls=[w.url("/v1/echo")]).ok()
    assert w.fake.last().headers["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in got["text"]
    assert f'"authorization": "Bearer {masked(SECRET)}"' in got["text"]


def test_token_per_request_header(w: World) -> None:
    token = w.mint(HeaderProcessor(header="X-Api-Key", format="key {secret}"))
    [got] = w.run(CALL, w.env("tokens-1"), urls=[w.url("/v1/token")],
                       headers={"Proxy-Tokenizer": token, "X-Api-Key": "dummy"}).ok()
    seen = w.fake.last()
    assert seen.values("x-api-key") == [f"key {SECRET}"]
    clean(seen)
    assert SECRET not in got["text"]
    assert token not in got["text"]


def test_refused_request(w: World) -> None:
    """raise_for_status's HTTPError names the status, its reason phrase and the URL, not the
    body: the proxy's reason phrase carries the code (the body and X-Sealgate-Error say more)."""
    [got] = w.run(CALL, w.env("plain-1"), urls=[w.url("/v2/nope")]).ok()
    assert (got["status"], got["error_header"]) == (403, "not_allowed")
    assert "sealgate refused the request (not_allowed)" in got["text"]
    out = w.run(CALL, w.env("plain-1"), urls=[w.url("/v2/nope")], raise_status=True)
    assert out.exception == "requests.exceptions.HTTPError", out.detail
    print(out.text)
    assert out.text.startswith("403 Client Error: Forbidden (sealgate: not_allowed) for url:")
    assert w.fake.untouched()


def test_refused_host_is_answered_inside_tls(w: World) -> None:
    [got] = w.run(CALL, w.env("plain-1"), urls=[w.url("/v1/x", host=BLOCKED)]).ok()
    assert (got["status"], got["error_header"]) == (403, "not_allowed")
    assert "sealgate refused the request (not_allowed)" in got["text"]
    assert w.fake.untouched()


def test_connection_scoped_token_in_the_proxy_credentials(w: World) -> None:
    token = w.mint(BearerProcessor())
    env = w.env("tokens-1", key=f"{KEYS['tokens-1']},{token}")
    got = w.run(CALL, env, urls=[w.url("/v1/c1"), w.url("/v1/c2")]).ok()
    assert [r.values("authorization") for r in w.fake.requests] == [[f"Bearer {SECRET}"]] * 2
    assert all(SECRET not in g["text"] for g in got)


def test_connection_scoped_token_that_fails_refuses(w: World) -> None:
    """An applicable token must pass every check: one whose path scope misses is refused, not
    skipped (and the request not sent without its credential)."""
    token = w.mint(BearerProcessor(), paths=("/v1/only",))
    env = w.env("tokens-1", key=f"{KEYS['tokens-1']},{token}")
    got = w.run(CALL, env, urls=[w.url("/v1/only"), w.url("/v1/other")]).ok()
    assert [g["status"] for g in got] == [200, 403]
    assert got[1]["error_header"] == "token_scope"
    assert [r.path for r in w.fake.requests] == ["/v1/only"]


def tokens_only(w: World, user: str, token: str) -> dict[str, str]:
    """What `sealgate env` printed for no sandbox, its proxy URL given `user`:`token` as
    credentials (sealgate env prints no such URL: its key file needs --sandbox)."""
    env = w.env(None)
    bare = env["HTTPS_PROXY"]
    assert bare == f"http://127.0.0.1:{w.proxy.port}"
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        env[name] = bare.replace("http://", f"http://{user}:{token}@", 1)
    return env


def test_connection_scoped_token_without_a_sandbox(w: World) -> None:
    """No identity, only tokens, as user `_` (requests sends no proxy credentials at all for
    an empty user, see below): the default policy decides; the token injects."""
    token = w.mint(BearerProcessor())
    [got] = w.run(CALL, tokens_only(w, "_", token), urls=[w.url("/v1/anon")]).ok()
    assert got["status"] == 200, got
    seen = w.fake.last()
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    clean(seen)
    line = w.proxy.wait_audit(lambda e: e.get("path") == "/v1/anon")
    assert (line["sandbox"], line["policy"]) == (None, "anon")


def test_requests_drops_proxy_credentials_with_an_empty_user(w: World) -> None:
    """`http://:<token>@proxy` is the documented form, but requests sends Proxy-Authorization
    only `if username:`, so the token never reaches the proxy and the request goes out
    without its credential (here the default policy allows it). Use `_` as the user."""
    token = w.mint(BearerProcessor())
    [got] = w.run(CALL, tokens_only(w, "", token), urls=[w.url("/v1/empty-user")]).ok()
    assert got["status"] == 200, got
    assert "authorization" not in w.fake.last().headers


def test_base_url_mode_needs_no_proxy_and_no_ca(w: World) -> None:
    [got] = w.run(CALL, {}, urls=[w.base_url("/v1/base")]).ok()
    assert got["status"] == 200
    seen = w.fake.last()
    assert (seen.path, seen.headers["host"]) == ("/v1/base", w.authority)
    clean(seen)
