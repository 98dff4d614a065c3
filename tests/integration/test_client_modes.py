"""The ways a client that cannot be changed gets its credentials, through the real proxy.

Base-URL mode: plain HTTP in, `/_/<host>` naming the upstream, verified TLS out, and every
decision of the intercepting path applied to the request it stands for. Connection-scoped
tokens: in the proxy credentials (each goes with the requests to its hosts) and on a CONNECT
(with every request in the tunnel)."""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import requests

from sealgate.credentials import Claims, Destination, SandboxBinding, seal
from sealgate.credentials.keys import PublicKeyEntry
from sealgate.credentials.processors import BearerProcessor
from sealgate.reasons import Reason
from tests.conftest import KEYS
from tests.dnsstub import StubDNS
from tests.harness import Origin, OriginCA, Proxy, ProxyFactory, key_digest
from tests.security.rawclient import open_tunnel, proxy_auth, read_response, request_bytes, tls_wrap

CANARY = "sk_live_BASEURL_canary_51e0"
TOKEN_CANARY = "sk_live_BASEURL_token_canary_9c2a"
COMMA_KEY = "a,key,with,commas"


@pytest.fixture(scope="module")
def bproxy(
    proxy_with: ProxyFactory, token_keys: tuple[Path, PublicKeyEntry], origin_https: Origin,
    origin_http: Origin, dns: StubDNS,
) -> Iterator[Proxy]:
    dns.set("wrongcert.test", "A 127.0.0.1")  # the origin, whose certificate does not name it
    s, h = origin_https.port, origin_http.port
    rules = f"""
version: 1
policies:
  agent:
    tokens: true
    allow:
      - host: api.test
        ports: [{s}, {h}]
        paths: ["/broker/**"]
        inject:
          - secret: file:api_key
            as: bearer
      - host: api.test
        ports: [{s}, {h}]
        methods: [GET, POST]
      - host: wrongcert.test
        ports: [{s}]
    allow_networks: [127.0.0.1/32]
  anonymous:
    allow:
      - host: api.test
        ports: [{s}]
        methods: [GET]
        paths: ["/public/**"]
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: agent, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
  comma-1: {{policy: agent, key_sha256: "{key_digest(COMMA_KEY)}"}}
default_policy: anonymous
"""
    with proxy_with(rules, name="base-url", token_keys=token_keys[0],
                    secrets={"api_key": CANARY}, canaries=(CANARY, TOKEN_CANARY)) as p:
        yield p


@pytest.fixture()
def origin(origin_https: Origin, origin_http: Origin) -> Iterator[Origin]:
    origin_https.reset()
    origin_http.reset()
    yield origin_https


def base(proxy: Proxy, target: str) -> str:
    return f"http://127.0.0.1:{proxy.port}/_/{target}"


def get(url: str, *, sandbox: str | None = "bot-1", **kwargs: object) -> requests.Response:
    """A client that knows nothing of proxies or CAs: only the base URL."""
    session = requests.Session()
    session.trust_env = False
    headers = dict(kwargs.pop("headers", {}) or {})  # type: ignore[call-overload]
    if sandbox is not None:
        headers["Proxy-Authorization"] = proxy_auth(sandbox, KEYS[sandbox])
    method = str(kwargs.pop("method", "GET"))
    return session.request(method, url, headers=headers, timeout=10,  # type: ignore[arg-type]
                           allow_redirects=False, **kwargs)


def mint(public: PublicKeyEntry, port: int, *, host: str = "api.test", ttl: int = 300,
         secret: str = TOKEN_CANARY, bound: str | None = None) -> str:
    now = int(time.time())
    claims = Claims(kid=public.kid, secret=secret, processor=BearerProcessor(),
                    hosts=(Destination(host, port),), exp=now + ttl, iat=now + min(ttl, 0) - 60,
                    binding=SandboxBinding(bound) if bound else None)
    return seal(claims, public)


def through(proxy: Proxy, user: str, password: str, bundle: Path) -> requests.Session:
    """A client configured with nothing but a proxy URL (and the CA to trust)."""
    session = requests.Session()
    session.trust_env = False
    url = f"http://{quote(user, safe='')}:{quote(password, safe='')}@127.0.0.1:{proxy.port}"
    session.proxies = {"http": url, "https": url}
    session.verify = str(bundle)
    return session


@pytest.fixture()
def bundle(bproxy: Proxy, test_ca: OriginCA) -> Path:
    path = bproxy.workdir / "trust.pem"
    path.write_text(bproxy.ca.read_text() + test_ca.path.read_text())
    return path


def test_plain_http_in_verified_tls_out(bproxy: Proxy, origin: Origin) -> None:
    r = get(base(bproxy, f"api.test:{origin.port}/v1/models?limit=2&x=%2F"))
    assert r.status_code == 200, r.text
    assert r.content == b"hello from origin\n"
    (seen,) = origin.requests
    assert seen.path == "/v1/models?limit=2&x=%2F"
    assert seen.values("host") == [f"api.test:{origin.port}"]
    assert not seen.values("proxy-authorization")
    line = bproxy.wait_audit(lambda a: a.get("event") == "request" and a.get("base_url"))
    assert (line["scheme"], line["host"], line["path"], line["sandbox"]) == (
        "https", "api.test", "/v1/models", "bot-1"
    )


def test_the_upstream_certificate_is_verified(bproxy: Proxy, origin: Origin) -> None:
    r = get(base(bproxy, f"wrongcert.test:{origin.port}/v1"),
            headers={"Authorization": "Bearer dummy"})
    assert r.status_code == 502, r.text
    assert r.json()["error"]["type"] == "upstream_unavailable"
    assert not origin.requests  # the handshake failed: no request was sent


def test_the_default_port_is_443_and_the_path_may_be_empty(bproxy: Proxy, origin: Origin) -> None:
    r = get(base(bproxy, "api.test"))
    assert r.status_code == 403 and r.json()["reason"] == "not_allowed"  # port 443: no rule
    assert r.json()["host"] == "api.test"
    r = get(base(bproxy, f"api.test:{origin.port}"))
    assert r.status_code == 200
    r = get(base(bproxy, f"api.test:{origin.port}?q=1"))
    assert r.status_code == 200
    assert [s.path for s in origin.requests] == ["/", "/?q=1"]


def test_rules_identity_and_the_default_policy_apply(bproxy: Proxy, origin: Origin) -> None:
    # No Proxy-Authorization: the default policy, which allows only GET /public/**.
    assert get(base(bproxy, f"api.test:{origin.port}/public/a"), sandbox=None).status_code == 200
    r = get(base(bproxy, f"api.test:{origin.port}/private"), sandbox=None)
    assert r.status_code == 403 and r.json()["policy"] == "anonymous"
    r = get(base(bproxy, f"api.test:{origin.port}/public/a"), sandbox=None, method="POST")
    assert r.status_code == 403
    r = get(base(bproxy, f"api.test:{origin.port}/x"), sandbox=None,
            headers={"Proxy-Authorization": proxy_auth("bot-1", "wrong")})
    assert r.status_code == 407 and r.json()["error"]["type"] == "proxy_auth_required"
    assert [s.path for s in origin.requests] == ["/public/a"]


def test_brokered_secret_is_injected_and_its_echo_masked(
    bproxy: Proxy, origin: Origin
) -> None:
    origin.echo = True
    try:
        r = get(base(bproxy, f"api.test:{origin.port}/broker/me"),
                headers={"Authorization": "Bearer dummy"})
    finally:
        origin.echo = False
    assert r.status_code == 200
    (seen,) = origin.requests
    assert seen.values("authorization") == [f"Bearer {CANARY}"]
    assert CANARY not in r.text
    assert json.loads(r.text)["headers"]["Authorization"] != "Bearer dummy"


def test_tokens_in_the_base_url(
    bproxy: Proxy, origin: Origin, token_keys: tuple[Path, PublicKeyEntry]
) -> None:
    token = mint(token_keys[1], origin.port)
    r = get(base(bproxy, f"{token}@api.test:{origin.port}/v1/charges"))
    assert r.status_code == 200, r.text
    (seen,) = origin.requests
    assert seen.path == "/v1/charges"
    assert seen.values("authorization") == [f"Bearer {TOKEN_CANARY}"]
    # A token for another port is refused, not ignored: the URL named it for this request.
    other = mint(token_keys[1], origin.port + 1)
    r = get(base(bproxy, f"{token},{other}@api.test:{origin.port}/v1/charges"))
    assert r.status_code == 403 and r.json()["reason"] == "token_scope"
    r = get(base(bproxy, f"not-a-token@api.test:{origin.port}/v1"))
    assert r.status_code == 400 and r.json()["reason"] == "token_malformed"
    assert len(origin.requests) == 1
    assert token not in bproxy.audit_text()


@pytest.mark.parametrize("target", [
    "", "@api.test/v1", "api.test:0/", "api.test:99999/", "api.test:x/", "ap%69.test/",
    "user:pass@@api.test/", "[::1/", "api.test\\@evil.test/",
])
def test_a_prefix_that_names_no_upstream_is_refused(
    bproxy: Proxy, origin: Origin, target: str
) -> None:
    r = get(base(bproxy, target))
    assert 400 <= r.status_code < 500, (target, r.status_code, r.text)
    assert r.headers["X-Sealgate-Error"]
    assert origin.untouched()


def test_the_proxy_itself_and_internal_addresses_are_refused(
    bproxy: Proxy, origin: Origin
) -> None:
    assert get(base(bproxy, f"127.0.0.1:{bproxy.port}/")).status_code == 403
    r = get(base(bproxy, "169.254.169.254/latest/meta-data/"))
    assert r.status_code == 403
    r = get(base(bproxy, f"evil.test:{origin.port}/"))  # resolves to 10.0.0.1
    assert r.status_code == 403
    assert origin.untouched()


def test_absolute_form_and_tunnelled_paths_are_not_base_urls(
    bproxy: Proxy, origin_http: Origin, origin_https: Origin, test_ca: OriginCA
) -> None:
    origin_http.reset()
    origin_https.reset()
    session = requests.Session()
    session.trust_env = False
    url = f"http://bot-1:{KEYS['bot-1']}@127.0.0.1:{bproxy.port}"
    session.proxies = {"http": url}
    r = session.get(f"http://api.test:{origin_http.port}/_/evil.test/x", timeout=10)
    assert r.status_code == 200  # an ordinary path on api.test
    assert [s.path for s in origin_http.requests] == ["/_/evil.test/x"]
    authority = f"api.test:{origin_https.port}"
    sock, head = open_tunnel(bproxy.port, authority,
                             [("Proxy-Authorization", proxy_auth("bot-1", KEYS["bot-1"]))])
    with sock:
        assert head.status == 200
        bundle = bproxy.workdir / "trust.pem"
        bundle.write_text(bproxy.ca.read_text() + test_ca.path.read_text())
        with tls_wrap(sock, "api.test", bundle) as tls:
            tls.sendall(request_bytes("GET", "/_/evil.test/x",
                                      [("Host", authority), ("Connection", "close")]))
            assert read_response(tls).status == 200
    assert [s.path for s in origin_https.requests] == ["/_/evil.test/x"]


def test_redirects_are_pointed_back_through_the_proxy(bproxy: Proxy, origin: Origin) -> None:
    here = f"http://127.0.0.1:{bproxy.port}"  # as the client named the proxy: absolute
    prefix = f"{here}/_/api.test:{origin.port}"
    for location, expected in [
        ("/v1/next?a=1", f"{prefix}/v1/next?a=1"),
        (f"https://api.test:{origin.port}/v2", f"{prefix}/v2"),
        ("https://other.test/p", f"{here}/_/other.test/p"),
        ("https://other.test:8443", f"{here}/_/other.test:8443/"),
        ("relative/path", "relative/path"),
        ("http://plain.test/", "http://plain.test/"),
    ]:
        origin.response_headers["Location"] = location
        r = get(base(bproxy, f"api.test:{origin.port}/v1"))
        assert r.headers["Location"] == expected, location


def test_keep_alive_serves_several_upstreams_on_one_connection(
    bproxy: Proxy, origin_https: Origin, origin_http: Origin
) -> None:
    origin_https.reset()
    with socket.create_connection(("127.0.0.1", bproxy.port), timeout=10) as sock:
        auth = ("Proxy-Authorization", proxy_auth("bot-1", KEYS["bot-1"]))
        for path in ("/a", "/b"):
            sock.sendall(request_bytes(
                "GET", f"/_/api.test:{origin_https.port}{path}",
                [("Host", f"127.0.0.1:{bproxy.port}"), auth],
            ))
            assert read_response(sock).status == 200
    assert [s.path for s in origin_https.requests] == ["/a", "/b"]
    # The upstream TLS connection was kept for the second (and may be one an earlier test's
    # client connection left in the pool: then no new one at all).
    assert origin_https.connections <= 1


# -- connection-scoped tokens -------------------------------------------------------------------


def test_tokens_in_the_proxy_credentials_go_with_requests_to_their_hosts(
    bproxy: Proxy, origin: Origin, token_keys: tuple[Path, PublicKeyEntry], bundle: Path
) -> None:
    mine = mint(token_keys[1], origin.port, bound="bot-1")
    elsewhere = mint(token_keys[1], 443, host="other.test", secret="sk_other_never_sent")
    session = through(bproxy, "bot-1", f"{KEYS['bot-1']},{elsewhere},{mine}", bundle)
    for path in ("/v1/a", "/v1/b"):
        assert session.get(f"https://api.test:{origin.port}{path}", timeout=10).status_code == 200
    assert [s.values("authorization") for s in origin.requests] == [
        [f"Bearer {TOKEN_CANARY}"], [f"Bearer {TOKEN_CANARY}"]
    ]
    assert not any(s.values("proxy-tokenizer") for s in origin.requests)
    assert "sk_other_never_sent" not in repr(origin.requests)
    text = bproxy.audit_text()
    assert mine not in text and elsewhere not in text
    # A request to a host none of them is for goes out with none (and is decided as usual).
    origin.reset()
    r = session.get(f"https://api.test:{origin.port}/broker/x", timeout=10)
    assert r.status_code == 200
    assert [s.values("authorization") for s in origin.requests] == [[f"Bearer {CANARY}"]]


def test_a_token_in_the_credentials_is_checked_in_full_when_it_applies(
    bproxy: Proxy, origin: Origin, token_keys: tuple[Path, PublicKeyEntry], bundle: Path
) -> None:
    url = f"https://api.test:{origin.port}/v1"
    cases = {
        "token_expired": mint(token_keys[1], origin.port, ttl=-600),  # past any allowed clock skew
        # Bound to another sandbox: refused even for a host it is not for, so what is left out
        # tells a thief nothing about the token's hosts.
        "token_binding": mint(token_keys[1], 443, host="other.test", bound="bot-2"),
        "token_malformed": "sg1.0123456789abcdef.notsealed",
    }
    for reason, token in cases.items():
        session = through(bproxy, "bot-1", f"{KEYS['bot-1']},{token}", bundle)
        r = session.get(url, timeout=10)
        assert r.json()["reason"] == reason, (reason, r.status_code, r.headers, r.text)
    assert origin.untouched()


def test_no_identity_claimed_tokens_only(
    bproxy: Proxy, origin: Origin, token_keys: tuple[Path, PublicKeyEntry], bundle: Path
) -> None:
    # Unidentified: the default policy, which accepts no tokens, refuses a token for the host.
    session = through(bproxy, "_", mint(token_keys[1], origin.port), bundle)
    r = session.get(f"https://api.test:{origin.port}/public/x", timeout=10)
    assert r.status_code == 403 and r.json()["reason"] == "tokens_not_allowed"
    assert (r.json()["policy"], origin.untouched()) == ("anonymous", True)


def test_a_key_holding_commas_is_still_a_key(
    bproxy: Proxy, origin: Origin, bundle: Path
) -> None:
    session = through(bproxy, "comma-1", COMMA_KEY, bundle)
    assert session.get(f"https://api.test:{origin.port}/v1", timeout=10).status_code == 200
    r = through(bproxy, "comma-1", "a,key", bundle).get(f"https://api.test:{origin.port}/v1",
                                                        timeout=10)
    assert (r.status_code, r.json()["reason"]) == (407, "identity_invalid")
    assert len(origin.requests) == 1


def _tunnel(proxy: Proxy, port: int, token: str) -> tuple[socket.socket, int]:
    sock, head = open_tunnel(proxy.port, f"api.test:{port}", [
        ("Proxy-Authorization", proxy_auth("bot-1", KEYS["bot-1"])), ("Proxy-Tokenizer", token),
    ])
    return sock, head.status


def test_a_token_on_the_connect_goes_with_every_request_in_the_tunnel(
    bproxy: Proxy, origin: Origin, token_keys: tuple[Path, PublicKeyEntry], bundle: Path
) -> None:
    sock, status = _tunnel(bproxy, origin.port, mint(token_keys[1], origin.port))
    with sock:
        assert status == 200
        context = ssl.create_default_context(cafile=str(bundle))
        with context.wrap_socket(sock, server_hostname="api.test") as tls:
            for path in ("/v1/a", "/v1/b"):
                tls.sendall(request_bytes("GET", path, [("Host", f"api.test:{origin.port}")]))
                assert read_response(tls).status == 200
    assert [s.values("authorization") for s in origin.requests] == [
        [f"Bearer {TOKEN_CANARY}"], [f"Bearer {TOKEN_CANARY}"]
    ]


def test_a_token_on_the_connect_for_another_host_refuses_the_tunnel(
    bproxy: Proxy, origin: Origin, token_keys: tuple[Path, PublicKeyEntry], bundle: Path
) -> None:
    for token, reason in [(mint(token_keys[1], origin.port + 1), "token_scope"),
                          ("", "token_malformed")]:
        sock, status = _tunnel(bproxy, origin.port, token)
        with sock:
            assert status == 200  # accepted, to answer inside TLS where the client reads it
            context = ssl.create_default_context(cafile=str(bundle))
            with context.wrap_socket(sock, server_hostname="api.test") as tls:
                tls.sendall(request_bytes("GET", "/v1", [("Host", f"api.test:{origin.port}")]))
                answer = read_response(tls)
        assert (answer.status, answer.json()["reason"]) == (Reason.of(reason).status, reason)
        line = bproxy.wait_audit(
            lambda a, why=reason: a.get("method") == "CONNECT" and a.get("reason") == why
        )
        assert line["decision"] == "deny"
    assert origin.untouched()


# -- refusals inside TLS ------------------------------------------------------------------------


def test_a_refused_connect_stays_refused_inside_its_tunnel(
    bproxy: Proxy, origin: Origin, bundle: Path
) -> None:
    """Wrong credentials on the CONNECT: accepted so the client can read why, and every request
    inside is refused, even one that brings the right credentials itself; nothing is dialed."""
    authority = f"api.test:{origin.port}"
    sock, head = open_tunnel(bproxy.port, authority,
                             [("Proxy-Authorization", proxy_auth("bot-1", "wrong"))])
    with sock:
        assert head.status == 200
        context = ssl.create_default_context(cafile=str(bundle))
        with context.wrap_socket(sock, server_hostname="api.test") as tls:
            good = ("Proxy-Authorization", proxy_auth("bot-1", KEYS["bot-1"]))
            for _ in range(2):
                tls.sendall(request_bytes("GET", "/v1", [("Host", authority), good]))
                answer = read_response(tls)
                assert (answer.status, answer.json()["reason"]) == (407, "identity_invalid")
                assert answer.json()["host"] == "api.test"
    assert origin.untouched()


def test_no_credentials_get_the_407_challenge_itself(proxy: Proxy, origin: Origin) -> None:
    """A client that sent none may answer a challenge (Java's and .NET's do): it gets one, on
    the CONNECT, where it can answer it (the session proxy has no default policy)."""
    sock, head = open_tunnel(proxy.port, f"api.test:{origin.port}")
    sock.close()
    assert (head.status, head.reason) == (407, "identity_required")
    assert head.headers["proxy-authenticate"].startswith("Basic")
    assert origin.untouched()


# -- HTTP/2 on the client's leg -----------------------------------------------------------------


@pytest.mark.parametrize(("offered", "chosen"), [
    (["http/1.1", "h2"], "h2"),  # httpx's order: h2 although offered second
    (["h2", "http/1.1"], "h2"),
    (["http/1.1"], "http/1.1"),
])
def test_a_client_offering_h2_gets_it(
    bproxy: Proxy, origin: Origin, bundle: Path, offered: list[str], chosen: str
) -> None:
    sock, head = open_tunnel(bproxy.port, f"api.test:{origin.port}",
                             [("Proxy-Authorization", proxy_auth("bot-1", KEYS["bot-1"]))])
    with sock:
        assert head.status == 200
        with tls_wrap(sock, "api.test", bundle, alpn=offered) as tls:
            assert tls.selected_alpn_protocol() == chosen


def test_httpx_with_http2_speaks_it_to_the_proxy(
    bproxy: Proxy, origin: Origin, bundle: Path
) -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("h2")
    url = f"http://bot-1:{KEYS['bot-1']}@127.0.0.1:{bproxy.port}"
    with httpx.Client(http2=True, proxy=url, verify=str(bundle), trust_env=False) as client:
        r = client.get(f"https://api.test:{origin.port}/v1/h2", timeout=10)
    assert (r.status_code, r.http_version) == (200, "HTTP/2")
    assert [s.path for s in origin.requests] == ["/v1/h2"]  # an HTTP/1.1 origin, translated
