"""httpx, unchanged (HTTP/1.1 and http2=True), through a real proxy to a fake HTTPS API.

httpx reads HTTPS_PROXY (credentials included) and SSL_CERT_FILE from the environment
`sealgate env` printed. With http2=True it speaks HTTP/2 to the proxy inside the intercepted
tunnel (httpcore offers http/1.1 first; the proxy still picks h2), and the proxy speaks
HTTP/1.1 to the fake.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sealgate.credentials.processors import BearerProcessor
from tests.dnsstub import StubDNS
from tests.harness import OriginCA
from tests.sdk.kit import (
    PROXY_HEADERS,
    Arrived,
    Reply,
    World,
    basic,
    echo,
    masked,
    policy,
    rule,
    rules_file,
    sse,
    world,
)

pytest.importorskip("httpx", reason="httpx is not installed (pip install -e '.[test]')")

HOST = "api.httpx.test"
BLOCKED = "blocked.httpx.test"
OTHER = "other.httpx.test"  # allowed to tokens-1 too, but no token is for it
SECRET = "httpx-CANARY-secret-3f9a1c7e5b"
KEYS = {"plain-1": "plain-key-httpx-1", "broker-1": "broker-key-httpx-1",
        "tokens-1": "tokens-key-httpx-1"}
PATHS = ["/v1/**"]


def rules(port: int) -> str:
    return rules_file(
        [
            policy("plain", rule(HOST, [port], paths=PATHS)),
            policy("broker", rule(HOST, [port], paths=PATHS, inject="bearer")),
            policy("tokens", rule(HOST, [port], paths=PATHS), rule(OTHER, [port], paths=PATHS),
                   tokens=True),
            policy("anon", rule(HOST, [port], paths=PATHS), tokens=True),
        ],
        {"plain-1": ("plain", KEYS["plain-1"]), "broker-1": ("broker", KEYS["broker-1"]),
         "tokens-1": ("tokens", KEYS["tokens-1"])},
        default="anon",
    )


def route(seen: Arrived) -> Reply:
    if seen.path.startswith("/v1/events"):
        auth = seen.headers.get("authorization", "")
        return Reply(headers={"Content-Type": "text/event-stream"},
                     chunks=sse([("tick", {"n": 1}), ("echo", {"auth": auth}),
                                 ("tick", {"n": 2})]))
    return Reply(body={**echo(seen), "body": seen.body.decode(errors="replace")})


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
      ) -> Iterator[World]:
    directory: Path = tmp_path_factory.mktemp("sdk-httpx")
    with world(directory, test_ca, dns, [HOST, BLOCKED, OTHER], route, rules, KEYS,
               SECRET) as made:
        yield made


@pytest.fixture(autouse=True)
def _fresh(w: World) -> None:
    w.fake.reset()


CALL = """
def main(url, http2=False, headers=None, method="GET", body=None, raise_status=False):
    import httpx
    with httpx.Client(http2=http2, headers=headers, timeout=15) as client:
        r = client.request(method, url, content=body.encode() if body else None)
        if raise_status:
            r.raise_for_status()
        return {"status": r.status_code, "version": r.http_version, "text": r.text,
                "error_header": r.headers.get("x-sealgate-error")}
"""

STREAM = """
def main(url, http2=False):
    import httpx
    with httpx.Client(http2=http2, timeout=15) as client:
        with client.stream("GET", url) as r:
            return {"version": r.http_version, "lines": [l for l in r.iter_lines() if l]}
"""


def clean(seen: Arrived) -> None:
    for name in PROXY_HEADERS:
        assert not seen.values(name), (name, seen.fields)


@pytest.mark.parametrize("http2", [False, True], ids=["h1", "h2"])
def test_plain_request_arrives_as_sent(w: World, http2: bool) -> None:
    got = w.run(CALL, w.env("plain-1"), url=w.url("/v1/things?a=1"), http2=http2,
                     method="POST", body='{"x": 1}', headers={"X-Trace": "t-1"}).ok()
    assert (got["status"], got["version"]) == (200, "HTTP/2" if http2 else "HTTP/1.1")
    seen = w.fake.last()
    assert (seen.method, seen.path, seen.body) == ("POST", "/v1/things?a=1", b'{"x": 1}')
    assert seen.headers["x-trace"] == "t-1"
    assert seen.headers["host"] == w.authority
    assert seen.headers["user-agent"].startswith("python-httpx/")
    clean(seen)
    assert (len(w.fake.requests), w.fake.connections) == (1, 1)


@pytest.mark.parametrize("http2", [False, True], ids=["h1", "h2"])
def test_broker_injects_and_masks_the_echo(w: World, http2: bool) -> None:
    got = w.run(CALL, w.env("broker-1"), url=w.url("/v1/echo"), http2=http2,
                     headers={"Authorization": "Bearer sandbox-guess"}).ok()
    assert got["version"] == ("HTTP/2" if http2 else "HTTP/1.1")
    assert w.fake.last().headers["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in got["text"]
    assert f'"authorization": "Bearer {masked(SECRET)}"' in got["text"]


@pytest.mark.parametrize("http2", [False, True], ids=["h1", "h2"])
def test_token_per_request_header(w: World, http2: bool) -> None:
    token = w.mint(BearerProcessor())
    got = w.run(CALL, w.env("tokens-1"), url=w.url("/v1/token"), http2=http2,
                     headers={"Proxy-Tokenizer": token}).ok()
    seen = w.fake.last()
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    clean(seen)
    assert SECRET not in got["text"]
    assert token not in got["text"]


@pytest.mark.parametrize("http2", [False, True], ids=["h1", "h2"])
def test_stream_is_masked(w: World, http2: bool) -> None:
    got = w.run(STREAM, w.env("broker-1"), url=w.url("/v1/events"), http2=http2).ok()
    assert got["version"] == ("HTTP/2" if http2 else "HTTP/1.1")
    assert got["lines"] == [
        "event: tick", 'data: {"n": 1}',
        "event: echo", f'data: {{"auth": "Bearer {masked(SECRET)}"}}',
        "event: tick", 'data: {"n": 2}',
    ]


def test_refused_request(w: World) -> None:
    """httpx raises only when asked (raise_for_status), and its HTTPStatusError names the status,
    the reason phrase (which carries the code over HTTP/1) and the URL, not the body."""
    got = w.run(CALL, w.env("plain-1"), url=w.url("/v2/nope")).ok()
    assert (got["status"], got["error_header"]) == (403, "not_allowed")
    assert "sealgate refused the request (not_allowed)" in got["text"]
    out = w.run(CALL, w.env("plain-1"), url=w.url("/v2/nope"), raise_status=True)
    assert out.exception == "httpx.HTTPStatusError", out.detail
    print(out.text)
    assert "403 Forbidden (sealgate: not_allowed)" in out.text
    assert w.fake.untouched()


@pytest.mark.parametrize("http2", [False, True], ids=["h1", "h2"])
def test_refused_host_is_answered_inside_tls(w: World, http2: bool) -> None:
    got = w.run(CALL, w.env("plain-1"), url=w.url("/v1/x", host=BLOCKED),
                     http2=http2).ok()
    assert (got["status"], got["error_header"]) == (403, "not_allowed")
    # (The refusal inside TLS is answered over HTTP/1.1 even when the client offers h2 too.)
    assert "sealgate refused the request (not_allowed)" in got["text"]
    assert BLOCKED in got["text"]
    assert w.fake.untouched()


def test_connection_scoped_token_in_the_proxy_credentials(w: World) -> None:
    token = w.mint(BearerProcessor())
    env = w.env("tokens-1", key=f"{KEYS['tokens-1']},{token}")
    got = w.run(CALL, env, url=w.url("/v1/conn"), http2=True).ok()
    assert w.fake.last().headers["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in got["text"]


def test_connection_scoped_token_goes_only_where_its_scope_says(w: World) -> None:
    """The same proxy credentials for a host the token does not cover: the token is ignored
    there, and its secret never reaches that host."""
    token = w.mint(BearerProcessor())
    env = w.env("tokens-1", key=f"{KEYS['tokens-1']},{token}")
    code = """
def main(urls):
    import httpx
    with httpx.Client(timeout=15) as client:
        return [client.get(url).status_code for url in urls]
"""
    got = w.run(code, env, urls=[w.url("/v1/other", host=OTHER), w.url("/v1/mine")]).ok()
    assert got == [200, 200]
    other, mine = w.fake.requests
    assert (other.headers["host"], mine.headers["host"]) == (f"{OTHER}:{w.fake.port}",
                                                             w.authority)
    assert other.values("authorization") == []
    assert SECRET not in str(other.fields) + other.path
    assert mine.values("authorization") == [f"Bearer {SECRET}"]


def test_connection_scoped_token_without_a_sandbox(w: World) -> None:
    """An empty user and the token as password (httpx sends it; requests would not): the
    default policy decides, the token injects."""
    token = w.mint(BearerProcessor())
    env = w.env(None)  # no sandbox; the token put into the proxy URL it printed
    assert env["HTTPS_PROXY"] == f"http://127.0.0.1:{w.proxy.port}"
    env["HTTPS_PROXY"] = env["https_proxy"] = f"http://:{token}@127.0.0.1:{w.proxy.port}"
    got = w.run(CALL, env, url=w.url("/v1/anon")).ok()
    assert got["status"] == 200, got
    assert w.fake.last().headers["authorization"] == f"Bearer {SECRET}"
    line = w.proxy.wait_audit(lambda e: e.get("path") == "/v1/anon")
    assert (line["sandbox"], line["policy"]) == (None, "anon")


def test_connection_scoped_token_applies_to_every_request_on_the_connection(w: World) -> None:
    token = w.mint(BearerProcessor())
    env = w.env("tokens-1", key=f"{KEYS['tokens-1']},{token}")
    code = """
def main(url):
    import httpx
    with httpx.Client(http2=True, timeout=15) as client:
        return [client.get(url + str(i)).status_code for i in range(3)]
"""
    assert w.run(code, env, url=w.url("/v1/many/")).ok() == [200, 200, 200]
    assert [r.values("authorization") for r in w.fake.requests] == [[f"Bearer {SECRET}"]] * 3


TUNNEL = """
def main(urls, token, http2=False):
    import os, httpx
    # httpx's own way to give the CONNECT a header: the token is for the whole tunnel.
    proxy = httpx.Proxy(os.environ["HTTPS_PROXY"], headers={"Proxy-Tokenizer": token})
    with httpx.Client(proxy=proxy, http2=http2, timeout=15) as client:
        out = []
        for url in urls:
            r = client.get(url)
            out.append({"status": r.status_code, "text": r.text,
                        "error_header": r.headers.get("x-sealgate-error")})
        return out
"""


def test_token_on_the_connect_applies_to_the_whole_tunnel(w: World) -> None:
    token = w.mint(BearerProcessor())
    got = w.run(TUNNEL, w.env("tokens-1"), urls=[w.url("/v1/t1"), w.url("/v1/t2")],
                token=token, http2=True).ok()
    assert [g["status"] for g in got] == [200, 200], got
    assert [r.values("authorization") for r in w.fake.requests] == [[f"Bearer {SECRET}"]] * 2
    for seen in w.fake.requests:
        clean(seen)
    assert all(SECRET not in g["text"] for g in got)


def test_token_on_the_connect_is_strict(w: World) -> None:
    """A tunnel's token that does not cover its host refuses what goes through the tunnel."""
    token = w.mint(BearerProcessor(), host="api.elsewhere.test")
    got = w.run(TUNNEL, w.env("tokens-1"), urls=[w.url("/v1/t3")], token=token).ok()
    assert (got[0]["status"], got[0]["error_header"]) == (403, "token_scope"), got
    assert "sealgate refused the request (token_scope)" in got[0]["text"]
    assert w.fake.untouched()


def test_base_url_mode_keeps_hosts_apart_on_one_client_connection(w: World) -> None:
    """Base-URL requests for two hosts at one address, over one connection to the proxy: each
    goes upstream over a TLS connection made for its own name (the SNI the fake saw), and a
    token in one request's base URL goes into that request only."""
    token = w.mint(BearerProcessor())
    code = """
def main(urls, auth):
    import httpx
    with httpx.Client(headers={"Proxy-Authorization": auth}, timeout=15) as client:
        return [client.get(url).status_code for url in urls]
"""
    urls = [w.base_url("/v1/one", host=OTHER), w.base_url("/v1/two", tokens=[token]),
            w.base_url("/v1/three", host=OTHER), w.base_url("/v1/four")]
    got = w.run(code, {}, urls=urls, auth=basic("tokens-1", KEYS["tokens-1"])).ok()
    assert got == [200, 200, 200, 200]
    assert [(r.path, r.sni, r.headers["host"].partition(":")[0], r.values("authorization"))
            for r in w.fake.requests] == [
        ("/v1/one", OTHER, OTHER, []),
        ("/v1/two", HOST, HOST, [f"Bearer {SECRET}"]),
        ("/v1/three", OTHER, OTHER, []),
        ("/v1/four", HOST, HOST, []),
    ]
    lines = [w.proxy.wait_audit(lambda e, p=p: e.get("path") == p and e.get("base_url"))
             for p in ("/v1/one", "/v1/two", "/v1/three", "/v1/four")]
    assert len({line["connection_id"] for line in lines}) == 1
    assert {line["sandbox"] for line in lines} == {"tokens-1"}


def test_base_url_mode_needs_no_proxy_and_no_ca(w: World) -> None:
    got = w.run(CALL, {}, url=w.base_url("/v1/base?q=2")).ok()
    assert (got["status"], got["version"]) == (200, "HTTP/1.1")
    seen = w.fake.last()
    assert (seen.path, seen.headers["host"]) == ("/v1/base?q=2", w.authority)
    clean(seen)
