"""sealgate.clients: the URL rewriting and credential building (pure functions, hostile input
included), the JS module on the same cases, the requests and httpx helpers against a loopback
stand-in for the proxy's listener, and every rules snippet of docs/clients.md."""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sealgate.clients import (
    ClientConfigError,
    base_url,
    check_tokens,
    proxy_authorization,
    proxy_url,
    refusal,
    requests_session,
    tokenizer_header,
)
from sealgate.clients._routing import ProxyAddress, ca_bundle, parse_proxy, resolve, unroute

ROOT = Path(__file__).resolve().parents[2]
MJS = ROOT / "sealgate" / "clients" / "sealgate.mjs"
T1 = "sg1.0123456789abcdef." + "A" * 70
T2 = "sg1.fedcba9876543210." + "b_-9" * 20
P = "http://127.0.0.1:8080"

# (proxy, url, tokens, expected base URL): Python and JS must both give exactly this.
BASE_CASES: list[tuple[str, str, list[str], str]] = [
    (P, "https://api.stripe.com", [], f"{P}/_/api.stripe.com"),
    (P, "https://api.stripe.com/", [], f"{P}/_/api.stripe.com/"),
    (P, "https://API.Stripe.COM/v1/Charges?a=B&c", [], f"{P}/_/api.stripe.com/v1/Charges?a=B&c"),
    (P, "https://api.openai.com/v1", [T1], f"{P}/_/{T1}@api.openai.com/v1"),
    (P, "https://h.test/x", [T1, T2, T1], f"{P}/_/{T1},{T2}@h.test/x"),
    (P, "https://h.test:443/x", [], f"{P}/_/h.test/x"),
    (P, "https://h.test:8443/x#frag", [], f"{P}/_/h.test:8443/x"),
    (P, "https://h.test?q=1", [], f"{P}/_/h.test/?q=1"),
    (P, "https://h.test/p%20q/%2F?x=%41", [], f"{P}/_/h.test/p%20q/%2F?x=%41"),
    (P, "https://[2001:DB8:0::1]:8443/x", [], f"{P}/_/[2001:db8::1]:8443/x"),
    (P, "https://[::1]/", [], f"{P}/_/[::1]/"),
    (P, "https://192.0.2.1/", [], f"{P}/_/192.0.2.1/"),
    (P, "https://xn--bcher-kva.example/", [], f"{P}/_/xn--bcher-kva.example/"),
    (P, "https://h.test./", [], f"{P}/_/h.test/"),
    ("127.0.0.1:8080", "https://h.test/", [], f"{P}/_/h.test/"),
    ("http://bot-1:secret@127.0.0.1:8080/", "https://h.test/", [], f"{P}/_/h.test/"),
    ("http://[::1]:3128", "https://h.test/a", [], "http://[::1]:3128/_/h.test/a"),
    ("HTTP://Proxy.Local:3128", "https://h.test/a", [], "http://proxy.local:3128/_/h.test/a"),
]

# URLs base-URL mode must refuse, whatever the proxy.
BAD_URLS = [
    "https://evil.test@api.stripe.com/",  # userinfo: '@' in the authority
    "https://user:pw@api.stripe.com/",
    "https://a b.test/",  # space
    "https://a\tb.test/",
    "https://h.test/a b",
    "https://h.test/\r\nX-Injected: 1",  # CR/LF
    "https://h.test/\n",
    "https://h.test/caf\u00e9",  # not percent-encoded
    "https://b\u00fccher.example/",
    "http://h.test/",  # plain http: the proxy forwards https only
    "ftp://h.test/",
    "h.test/x",
    "https:///x",  # no host
    "https://h.test:0443/",  # leading zero
    "https://h.test:99999/",
    "https://h.test:-1/",
    "https://h.test:/",
    "https://[fe80::1%25eth0]/",  # zone id
    "https://[2001:db8::1/",  # no closing bracket
    "https://2001:db8::1/",  # IPv6 unbracketed
    "https://[h.test]/",
    "https://h%2etest/",  # percent in the host
    "https://h\\x.test/",
    "https://a..b/",
    "https://0x7f.1/",  # inet_aton numerics
    "https://127.1/",
    "https://h!.test/",
]

BAD_PROXIES = [
    "https://127.0.0.1:8080",  # the listener speaks plain http
    "socks5://127.0.0.1:1080",
    "http://127.0.0.1",  # no port
    "http://127.0.0.1:0",
    "http://127.0.0.1:8080/path",
    "http://127.0.0.1:8080?x",
    "http://127.0.0.1:8080 ",
    "http://127.0.0.1:8080\r\n",
    "http://a b:8080",
    "http://bot-1@127.0.0.1:8080",  # a sandbox without its key
    "http://bot-1:k,not-a-token@127.0.0.1:8080",
    "http://:not-a-token@127.0.0.1:8080",
]


# -- tokens -----------------------------------------------------------------------------------


def test_tokens_are_checked_deduplicated_and_limited() -> None:
    assert check_tokens(T1) == (T1,)  # a str is one token
    assert check_tokens([T1, T2, T1]) == (T1, T2)
    assert check_tokens(()) == ()
    assert tokenizer_header([T1, T2]) == f"{T1},{T2}"
    many = [f"sg1.{i:016x}.{'A' * 70}" for i in range(9)]
    assert len(check_tokens(many[:8])) == 8
    with pytest.raises(ClientConfigError, match="at most 8"):
        check_tokens(many)
    with pytest.raises(ClientConfigError, match="no tokens"):
        tokenizer_header([])


@pytest.mark.parametrize(("token", "problem"), [
    (f"{T1},{T2}", "has a ','"),
    (T1 + "\r\n", "CR or LF"),
    (T1 + "\nX: y", "CR or LF"),
    (" " + T1, "whitespace"),
    (T1 + "\u00a0", "whitespace"),
    ("", "empty"),
    ("sg1." + "A" * 9000, "characters long"),
    ("sg2.0123456789abcdef.AAAA", "not a sealed token"),
    ("sg1.0123456789ABCDEF.AAAA", "not a sealed token"),  # upper-case kid
    ("sg1.0123456789abcdef.AA=A", "not a sealed token"),
    ("sg1.0123456789abcdef.AA@h.test", "not a sealed token"),
    ("sg1.0123456789abcdef", "not a sealed token"),
])
def test_hostile_tokens_are_refused(token: str, problem: str) -> None:
    with pytest.raises(ClientConfigError, match=re.escape(problem)):
        check_tokens([T1, token])
    for build in (lambda: proxy_url(P, tokens=[token]), lambda: base_url(P, "https://h.test/",
                                                                        tokens=[token])):
        with pytest.raises(ClientConfigError):
            build()


def test_a_non_string_token_is_refused() -> None:
    with pytest.raises(ClientConfigError, match="not a str"):
        check_tokens([b"sg1"])  # type: ignore[list-item]


# -- credentials ------------------------------------------------------------------------------


def _basic(value: str | None) -> str:
    assert value is not None and value.startswith("Basic ")
    return base64.b64decode(value[6:], validate=True).decode()


def test_proxy_credentials_forms() -> None:
    assert _basic(proxy_authorization(sandbox="bot-1", key="k")) == "bot-1:k"
    assert _basic(proxy_authorization(sandbox="bot-1", key="k:ey", tokens=[T1, T2])) == (
        f"bot-1:k:ey,{T1},{T2}"
    )
    assert _basic(proxy_authorization(tokens=[T1])) == f"_:{T1}"  # identity from source/default
    assert proxy_authorization() is None
    assert proxy_url(P) == P
    assert proxy_url(P, sandbox="bot-1", key="k/ey%:@") == "http://bot-1:k%2Fey%25%3A%40@127.0.0.1:8080"
    assert proxy_url(P, sandbox="bot-1", key="k", tokens=T1) == f"http://bot-1:k,{T1}@127.0.0.1:8080"
    assert proxy_url(P, tokens=[T1, T2]) == f"http://_:{T1},{T2}@127.0.0.1:8080"
    assert proxy_url("http://[::1]:3128", tokens=[T1]) == f"http://_:{T1}@[::1]:3128"


def test_a_proxy_url_round_trips() -> None:
    for url in (proxy_url(P, sandbox="bot-1", key="k/ey%:@!", tokens=[T1]),
                proxy_url(P, tokens=[T1, T2])):
        address, creds = parse_proxy(url)
        assert address == ProxyAddress("127.0.0.1", 8080)
        assert proxy_url(url) == url
        assert creds.proxy_authorization is not None


def test_the_url_and_the_arguments_add_up() -> None:
    _, creds = resolve(f"http://bot-1:k,{T1}@127.0.0.1:8080", tokens=[T2])
    assert (creds.sandbox, creds.key, creds.tokens) == ("bot-1", "k", (T1, T2))
    with pytest.raises(ClientConfigError, match="already names a sandbox"):
        resolve("http://bot-1:k@127.0.0.1:8080", sandbox="bot-2", key="x")
    _, creds = resolve(None, environ={"https_proxy": f"http://:{T1}@127.0.0.1:8080"})
    assert creds.tokens == (T1,) and creds.sandbox is None
    _, creds = resolve(None, environ={"HTTPS_PROXY": "http://a-1:k@127.0.0.1:1",
                                      "https_proxy": "http://b-1:k@127.0.0.1:1"})
    assert creds.sandbox == "a-1"
    with pytest.raises(ClientConfigError, match="HTTPS_PROXY"):
        resolve(None, environ={})


@pytest.mark.parametrize(("sandbox", "key", "problem"), [
    ("bot-1", None, "go together"),
    (None, "k", "go together"),
    ("bot 1", "k", "sandbox id"),
    ("bot:1", "k", "sandbox id"),
    ("-bot", "k", "sandbox id"),
    ("b" * 65, "k", "sandbox id"),
    ("bot-1", "", "key must be"),
    ("bot-1", "a,b", "key must be"),  # the proxy splits the password on ','
    ("bot-1", "line\r\nX: 1", "key must be"),
    ("bot-1", "caf\u00e9", "key must be"),
    ("bot-1", "with space", "key must be"),
])
def test_bad_credentials_are_refused_without_echoing_the_key(
    sandbox: str | None, key: str | None, problem: str
) -> None:
    with pytest.raises(ClientConfigError, match=problem) as caught:
        proxy_authorization(sandbox=sandbox, key=key)
    if key and len(key) > 3:
        assert key not in str(caught.value)


def test_the_key_is_never_in_a_repr() -> None:
    _, creds = resolve(P, sandbox="bot-1", key="super-secret-key")
    assert "super-secret-key" not in repr(creds)


@pytest.mark.parametrize("proxy", BAD_PROXIES)
def test_bad_proxy_urls_are_refused(proxy: str) -> None:
    with pytest.raises(ClientConfigError):
        parse_proxy(proxy)


# -- base-URL rewriting -----------------------------------------------------------------------


@pytest.mark.parametrize(("proxy", "url", "tokens", "expected"), BASE_CASES)
def test_base_url(proxy: str, url: str, tokens: list[str], expected: str) -> None:
    assert base_url(proxy, url, tokens=tokens) == expected


@pytest.mark.parametrize("url", BAD_URLS)
def test_hostile_urls_are_refused(url: str) -> None:
    with pytest.raises(ClientConfigError):
        base_url(P, url)


def test_a_refused_userinfo_is_not_echoed() -> None:
    with pytest.raises(ClientConfigError) as caught:
        base_url(P, "https://user:hunter2@h.test/")
    assert "hunter2" not in str(caught.value)


def test_a_location_in_base_url_form_is_given_back_as_https() -> None:
    address = ProxyAddress("127.0.0.1", 8080)
    assert unroute(address, "/_/h.test/next?x=1") == "https://h.test/next?x=1"
    assert unroute(address, f"/_/{T1}@h.test:8443/n") == "https://h.test:8443/n"
    assert unroute(address, "http://127.0.0.1:8080/_/[::1]/") == "https://[::1]/"
    assert unroute(address, "/_/other.test") == "https://other.test"
    for untouched in ("/next", "https://h.test/", "http://127.0.0.1:9999/_/h.test/",
                      "/_/a b/", "/_/x@", "//_/h.test/"):
        assert unroute(address, untouched) is None


def test_ca_bundle_is_the_argument_or_what_sealgate_env_set() -> None:
    assert ca_bundle("/a.pem", {"SSL_CERT_FILE": "/b.pem"}) == "/a.pem"
    assert ca_bundle(None, {"SSL_CERT_FILE": "/b.pem", "CURL_CA_BUNDLE": "/c.pem"}) == "/b.pem"
    assert ca_bundle(None, {"REQUESTS_CA_BUNDLE": "/r.pem", "SSL_CERT_FILE": "/b.pem"}) == "/r.pem"
    assert ca_bundle(None, {}) is None


# -- importing imports neither library ---------------------------------------------------------


# -- the helpers against a stand-in for the proxy's listener ----------------------------------


class Recorder:
    """A plain-HTTP listener on loopback that records request lines and headers, and answers
    as the proxy would: a redirect pointed back through itself for /redirect, else 200."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)
                recorder.seen.append((self.command, self.path,
                                      {k.lower(): v for k, v in self.headers.items()}))
                if self.path.endswith("/redirect"):
                    self.send_response(302)
                    self.send_header("Location", "/_/api.test/landed")
                else:
                    self.send_response(200)
                    self.send_header("Set-Cookie", "c=1; Path=/")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            do_GET = do_POST = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture()
def recorder() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.server.shutdown()
    r.server.server_close()


def test_requests_base_url_mode(recorder: Recorder) -> None:
    session = requests_session(recorder.url, sandbox="bot-1", key="k", tokens=[T1],
                               base_url=True)
    response = session.get("https://api.test/v1/x?y=1", timeout=10)
    assert response.status_code == 200 and response.text == "ok"
    assert response.url == "https://api.test/v1/x?y=1"  # the https world, for the caller
    method, target, headers = recorder.seen[-1]
    assert (method, target) == ("GET", "/_/api.test/v1/x?y=1")
    assert headers["host"] == f"127.0.0.1:{recorder.port}"
    assert _basic(headers["proxy-authorization"]) == "bot-1:k"  # the key only
    assert headers["proxy-tokenizer"] == T1
    assert session.cookies.get("c", domain="api.test") == "1"

    # A redirect the proxy pointed back through itself is followed there, as https.
    response = session.get("https://api.test/redirect", timeout=10)
    assert response.status_code == 200
    assert [t for _, t, _ in recorder.seen[-2:]] == ["/_/api.test/redirect", "/_/api.test/landed"]
    assert response.url == "https://api.test/landed"

    # A URL already addressed to the proxy (an SDK's base URL) goes as it is.
    session.post(f"{recorder.url}/_/api.test/v2", data=b"x", timeout=10)
    assert recorder.seen[-1][:2] == ("POST", "/_/api.test/v2")
    assert recorder.seen[-1][2]["proxy-tokenizer"] == T1

    import requests

    with pytest.raises(requests.exceptions.InvalidURL, match="https:// URLs only"):
        session.get("http://elsewhere.test/", timeout=10)
    count = len(recorder.seen)
    with pytest.raises(requests.exceptions.InvalidURL):
        session.get("https://evil.test@api.test/", timeout=10)
    assert len(recorder.seen) == count  # nothing was sent


def test_requests_explicit_mode_settings(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle.pem"
    bundle.write_text("")
    session = requests_session(P, tokens=[T1], ca_bundle=bundle)
    assert session.trust_env is False
    assert session.proxies == {"http": P, "https": P}  # no credentials in the URL object
    assert session.verify == str(bundle)
    adapter = session.get_adapter("https://api.test/")
    assert _basic(adapter.proxy_headers(P)["Proxy-Authorization"]) == f"_:{T1}"
    assert requests_session(P).get_adapter("https://x.test/").proxy_headers(P) == {}


def test_httpx_base_url_mode_sync_and_async(recorder: Recorder) -> None:
    httpx = pytest.importorskip("httpx")
    from sealgate.clients import httpx_async_client, httpx_client

    with httpx_client(recorder.url, tokens=[T1, T2], base_url=True, timeout=10,
                      follow_redirects=True) as client:
        response = client.get("https://API.test:8443/v1/x?y=%20")
        assert response.status_code == 200
        assert str(response.request.url) == "https://api.test:8443/v1/x?y=%20"
        method, target, headers = recorder.seen[-1]
        assert target == "/_/api.test:8443/v1/x?y=%20"
        assert headers["host"] == f"127.0.0.1:{recorder.port}"
        assert headers["proxy-tokenizer"] == f"{T1},{T2}"
        assert "proxy-authorization" not in headers
        response = client.get("https://api.test/redirect")
        assert str(response.url) == "https://api.test/landed"
        assert recorder.seen[-1][1] == "/_/api.test/landed"
        with pytest.raises(httpx.UnsupportedProtocol):
            client.get("http://elsewhere.test/")

    async def run() -> None:
        async with httpx_async_client(recorder.url, sandbox="bot-1", key="k",
                                      base_url=True, timeout=10) as client:
            response = await client.post("https://api.test/a", content=b"body")
            assert response.status_code == 200

    asyncio.run(run())
    method, target, headers = recorder.seen[-1]
    assert (method, target) == ("POST", "/_/api.test/a")
    assert _basic(headers["proxy-authorization"]) == "bot-1:k"


def test_httpx_refuses_options_that_would_undo_the_routing() -> None:
    pytest.importorskip("httpx")
    from sealgate.clients import httpx_client, httpx_transport

    for option in ("transport", "proxy", "verify", "trust_env", "mounts"):
        with pytest.raises(TypeError, match=option):
            httpx_client(P, **{option: None})
    with pytest.raises(ValueError, match="httpx2"):
        httpx_transport(P, library="urllib")  # type: ignore[call-overload]


# -- refusals ---------------------------------------------------------------------------------


class FakeResponse:
    def __init__(self, status: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code, self.headers, self.content = status, headers, content


def test_refusal_reads_the_proxy_json() -> None:
    body = {"type": "error",
            "error": {"type": "egress_denied", "code": "not_allowed",
                      "message": "sealgate refused the request (not_allowed): GET x",
                      "request_id": "r-1"},
            "reason": "not_allowed", "detail": "GET x", "host": "x.test", "policy": "ci",
            "request_id": "r-1"}
    found = refusal(FakeResponse(403, {"X-Sealgate-Error": "not_allowed"},
                                 json.dumps(body).encode()))
    assert found is not None
    assert (found.status, found.reason, found.type, found.host, found.policy,
            found.request_id) == (403, "not_allowed", "egress_denied", "x.test", "ci", "r-1")
    assert str(found).startswith("sealgate refused")
    assert refusal(FakeResponse(200, {}, b"{}")) is None
    bare = refusal(FakeResponse(502, {"X-Sealgate-Error": "dns_nxdomain"}, b"not json"))
    assert bare is not None and bare.reason == "dns_nxdomain" and bare.type == ""


# -- the JS module, on the same cases ---------------------------------------------------------

JS_DRIVER = r"""
import * as sg from "%s";
const input = JSON.parse(await new Promise((ok) => {
  let text = "";
  process.stdin.on("data", (d) => (text += d));
  process.stdin.on("end", () => ok(text));
}));
const run = (f) => {
  try { return {ok: f()}; } catch (e) { return {error: e.name + ": " + e.message}; }
};
const out = {
  base: input.base.map(([p, u, t]) => run(() => sg.baseUrl(p, u, {tokens: t}))),
  badUrls: input.badUrls.map((u) => run(() => sg.baseUrl("http://127.0.0.1:8080", u))),
  badProxies: input.badProxies.map((p) => run(() => sg.parseProxy(p))),
  badTokens: input.badTokens.map((t) => run(() => sg.checkTokens([t]))),
  proxyUrls: input.proxyUrls.map(([p, o]) => run(() => sg.proxyUrl(p, o))),
  auth: input.auth.map((o) => run(() => sg.proxyAuthorization(o))),
};
console.log(JSON.stringify(out));
"""


# -- the rules snippets of docs/clients.md ----------------------------------------------------

SNIPPET = re.compile(r"<!-- rules-snippet -->\s*```yaml\n(.*?)```", re.S)
