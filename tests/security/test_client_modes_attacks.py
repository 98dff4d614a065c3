"""Attacks on today's client modes, from a compromised sandbox: base-URL mode (`/_/<host>`),
connection-scoped tokens (in the proxy credentials, on a CONNECT), refusals answered inside TLS,
and HTTP/2 and gRPC-shaped refusals on the client's leg.

Each test asserts the safe outcome and proves it where it happens: the origins and traps count
every connection and byte, and the canaries (a brokered secret, a token's secret, a sandbox key)
are looked for in the answers, the audit log and the proxy's stderr."""

from __future__ import annotations

import base64
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sealgate.credentials import Claims, Destination, SandboxBinding, seal
from sealgate.credentials.keys import PublicKeyEntry
from sealgate.credentials.processors import BearerProcessor
from tests.dnsstub import StubDNS
from tests.harness import Origin, OriginCA, Proxy, ProxyFactory, key_digest
from tests.security.rawclient import (
    LoopbackTrap,
    NoResponse,
    RawResponse,
    exchange,
    h2_exchange,
    open_tunnel,
    proxy_auth,
    read_response,
    request_bytes,
    tls_wrap,
)

BROKERED = "sk_live_ATTACK_Brokered_77Qx"  # mixed case, and a valid host label
TOKEN_SECRET = "sk_live_ATTACK_token_secret_3f1d"
KEY1 = "attack-bot-1-key-canary-a91c"
KEY2 = "attack-bot-2-key-canary-5be0"
CANARIES = (BROKERED, TOKEN_SECRET, KEY1, KEY2)


@pytest.fixture(scope="module")
def api(test_ca: OriginCA) -> Iterator[Origin]:
    """The allowed upstream (api.test, tok.test, loop.test): TLS, records everything."""
    origin = Origin(tls=test_ca.issue("api.test", "tok.test", "loop.test", "127.0.0.1"))
    yield origin
    origin.stop()


@pytest.fixture(scope="module")
def victim(test_ca: OriginCA) -> Iterator[Origin]:
    """An upstream no rule allows (victim.test): it must never see a connection."""
    origin = Origin(tls=test_ca.issue("victim.test", "127.0.0.1"))
    yield origin
    origin.stop()


@pytest.fixture(scope="module")
def trap(api: Origin, victim: Origin) -> Iterator[LoopbackTrap]:
    """Other loopback spellings on the origins' ports: 127.0.0.2 and ::1."""
    t = LoopbackTrap([api.port, victim.port])
    yield t
    t.stop()


def _rules(api_port: int, proxy_port: int) -> str:
    return f"""
version: 1
policies:
  agent:
    tokens: true
    allow:
      - host: api.test
        ports: [{api_port}]
        inject:
          - secret: file:api_key
            as: bearer
      - host: tok.test
        ports: [{api_port}]
      - host: loop.test
        ports: [{proxy_port}]
      - host: 127.0.0.1
        ports: [{proxy_port}]
      - host: zero.test
        ports: [{api_port}]
      - host: six.test
        ports: [{api_port}]
      - host: inner.test
        ports: [{api_port}]
      - host: meta.attack.test
        ports: [{api_port}, 80, 443]
    allow_networks: [127.0.0.1/32]
  anonymous:
    allow:
      - host: api.test
        ports: [{api_port}]
        methods: [GET]
        paths: ["/public/**"]
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: agent, key_sha256: "{key_digest(KEY1)}"}}
  bot-2: {{policy: agent, key_sha256: "{key_digest(KEY2)}"}}
default_policy: anonymous
"""


@pytest.fixture(scope="module")
def aproxy(
    tmp_path_factory: pytest.TempPathFactory, proxy_with: ProxyFactory,
    token_keys: tuple[Path, PublicKeyEntry], api: Origin, victim: Origin, dns: StubDNS,
) -> Iterator[Proxy]:
    directory = tmp_path_factory.mktemp("client-mode-attacks")
    for name, record in [
        ("tok.test", "A 127.0.0.1"), ("loop.test", "A 127.0.0.1"),
        ("victim.test", "A 127.0.0.1"), ("zero.test", "A 0.0.0.0"), ("six.test", "AAAA ::1"),
        ("inner.test", "A 127.0.0.2"), ("meta.attack.test", "A 169.254.169.254"),
    ]:
        dns.set(name, record)
    rules = directory / "rules.yaml"
    rules.write_text(_rules(api.port, 1))
    with proxy_with(rules, directory=directory, token_keys=token_keys[0],
                    secrets={"api_key": BROKERED}, canaries=CANARIES, clean_stderr=True) as p:
        # The proxy's own port is known only now: the rules that name it, reloaded.
        rules.write_text(_rules(api.port, p.port))
        p.signal(1)  # SIGHUP
        p.wait_audit(lambda a: a.get("event") == "rules_reloaded")
        yield p


@pytest.fixture()
def fresh(api: Origin, victim: Origin, trap: LoopbackTrap) -> Iterator[None]:
    api.reset()
    victim.reset()
    trap.reset()
    yield


@pytest.fixture()
def bundle(aproxy: Proxy, test_ca: OriginCA) -> Path:
    path = aproxy.workdir / "trust.pem"
    path.write_text(aproxy.ca.read_text() + test_ca.path.read_text())
    return path


def mint(public: PublicKeyEntry, host: str, port: int, *, secret: str = TOKEN_SECRET,
         bound: str | None = None, ttl: int = 300) -> str:
    now = int(time.time())
    claims = Claims(kid=public.kid, secret=secret, processor=BearerProcessor(),
                    hosts=(Destination(host, port),), exp=now + ttl, iat=now + min(ttl, 0) - 60,
                    binding=SandboxBinding(bound) if bound else None)
    return seal(claims, public)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


BOT1 = ("Proxy-Authorization", proxy_auth("bot-1", KEY1))


def base_get(proxy: Proxy, target: str | bytes, headers: list[tuple[str | bytes, str | bytes]]
             | None = None, *, method: str = "GET") -> RawResponse:
    """One base-URL request, byte for byte: `GET /_/<target>` to the explicit listener."""
    target_b = target if isinstance(target, bytes) else target.encode()
    head = [("Host", f"127.0.0.1:{proxy.port}"), *(headers or []), ("Connection", "close")]
    return exchange(proxy.port, request_bytes(method, b"/_/" + target_b, head))


def nothing_reached(*origins: Origin, trap: LoopbackTrap | None = None) -> bool:
    time.sleep(0.1)  # a dial the proxy started would have landed by now
    return all(o.untouched() and o.bytes_received == 0 for o in origins) and (
        trap is None or trap.connections == 0
    )



def refused(r: RawResponse) -> bool:
    """A refusal the proxy wrote (a 4xx with its reason), not an upstream's answer."""
    return 400 <= r.status < 500 and bool(r.headers.get("x-sealgate-error"))


# -- base-URL mode: what the prefix may name ---------------------------------------------------


@pytest.mark.parametrize("target", [
    "api.test%2F@victim.test:{V}/",           # an encoded '/' to end the segment early
    "api.test%40victim.test:{V}/",            # an encoded '@'
    "victim.test:{V}%2F@api.test:{A}/",
    "api.test\\victim.test:{V}/",             # backslash (WHATWG reads it as '/')
    "api.test\\@victim.test:{V}/",
    "victim.test:{V}#@api.test:{A}/",         # fragment: the tokens are "victim.test:{V}#"
    "user:password@api.test:{A}/",            # userinfo reads as a token list: refused
    "api.test:{A}@victim.test:{V}/",          # and so does a host before '@'
    "api.test\uff20victim.test:{V}/",         # fullwidth '@' (UTS-46 maps it to '@')
    "api.test:{A}\uff0fvictim.test/",         # fullwidth '/'
    "victim.test\u3002:{V}/",                 # ideographic full stop: victim.test, no rule
    "VICTIM.TEST.:{V}/",                       # case and a trailing dot: still victim.test
    "[fe80::1%25lo]:{A}/",                    # IPv6 zone ids
    "[::1%lo]:{A}/",
    "0x7f.1:{A}/",                            # numeric IPv4 forms inet_aton would read
    "2130706433:{A}/",
    "0177.0.0.1:{A}/",
    "127.1:{A}/",
    "127.0.0.01:{A}/",
    "/api.test:{A}/",                         # '//' after the prefix
    "_/api.test:{A}/",                        # a second '/_/'
    "api.test:{A}:{A}/",
    "api.test:0{A}/",                         # a port with a leading zero
    "api.test:{A}0000/",                      # a port out of range
    "api.test\x00:{A}/",
    "api.test\x09:{A}/",
])
def test_a_prefix_spelled_to_confuse_reaches_nothing(
    aproxy: Proxy, api: Origin, victim: Origin, trap: LoopbackTrap, fresh: None, target: str
) -> None:
    text = target.format(A=api.port, V=victim.port)
    try:
        r = base_get(aproxy, text.encode("utf-8"), [BOT1])
    except NoResponse:
        pass  # closed without an answer: refused too
    else:
        assert refused(r), (text, r.status, r.body[:300])
        assert BROKERED not in r.body.decode("latin-1")
    assert nothing_reached(api, victim, trap=trap), text


@pytest.mark.parametrize("target", [
    "127.0.0.2:{A}", "[::1]:{A}", "0.0.0.0:{A}", "[::]:{A}", "[::ffff:127.0.0.2]:{A}",
    "[::ffff:7f00:2]:{A}", "[::127.0.0.2]:{A}", "[64:ff9b::7f00:2]:{A}", "[::ffff:0.0.0.0]:{A}",
    "zero.test:{A}", "six.test:{A}", "inner.test:{A}",  # names resolving to 0.0.0.0, ::1, 127.0.0.2
    "169.254.169.254", "169.254.169.254:{A}", "[::ffff:169.254.169.254]", "meta.attack.test",
    "meta.attack.test:{A}", "metadata.google.internal", "localhost:{A}", "api.localhost:{A}",
    "api.test.internal:{A}", "kubernetes:{A}",
])
def test_a_prefix_naming_an_internal_address_reaches_nothing(
    aproxy: Proxy, api: Origin, victim: Origin, trap: LoopbackTrap, fresh: None, target: str
) -> None:
    """bot-1's policy opens 127.0.0.1/32 and nothing else: 0.0.0.0 and [::] would reach the
    origins on 127.0.0.1, the other loopback spellings the trap."""
    text = target.format(A=api.port)
    r = base_get(aproxy, f"{text}/latest/meta-data/", [BOT1])
    assert r.status in (400, 403), (text, r.status, r.body[:300])
    assert refused(r)
    assert nothing_reached(api, victim, trap=trap), text


@pytest.mark.parametrize("target", ["loop.test:{P}", "127.0.0.1:{P}", "[::ffff:127.0.0.1]:{P}",
                                    "[::ffff:7f00:1]:{P}", "zero.test:{P}"])
def test_a_prefix_naming_the_proxy_itself_is_refused(
    aproxy: Proxy, api: Origin, fresh: None, target: str
) -> None:
    """loop.test and 127.0.0.1 on the proxy's port are allowed by bot-1's rules: only the
    guard's own-port check stands between them and a loop."""
    text = target.format(P=aproxy.port)
    r = base_get(aproxy, f"{text}/_/api.test:{api.port}/public/through-a-loop", [BOT1])
    assert refused(r) and r.status == 403, (text, r.status, r.body[:300])
    assert nothing_reached(api)


@pytest.mark.parametrize("authority", ["loop.test:{P}", "127.0.0.1:{P}"])
def test_absolute_form_to_the_proxy_with_a_base_url_path_is_a_loop_refused(
    aproxy: Proxy, api: Origin, fresh: None, authority: str
) -> None:
    """`GET http://<proxy>/_/api.test/...`: plain HTTP to the proxy's own port, which it would
    receive as a base-URL request (unidentified, its Proxy-Authorization stripped: the default
    policy, which allows GET /public/**). Refused as a loop; the origin sees nothing."""
    hostport = authority.format(P=aproxy.port)
    r = exchange(aproxy.port, request_bytes(
        "GET", f"http://{hostport}/_/api.test:{api.port}/public/absolute-loop",
        [("Host", hostport), BOT1, ("Connection", "close")],
    ))
    assert (r.status, r.reason) == (403, "proxy_loop"), r.body[:300]
    assert nothing_reached(api)


def test_a_tunnel_to_the_proxy_itself_is_refused_inside(
    aproxy: Proxy, api: Origin, fresh: None, bundle: Path
) -> None:
    sock, head = open_tunnel(aproxy.port, f"loop.test:{aproxy.port}", [BOT1])
    with sock:
        assert head.status == 200  # accepted, refused inside
        with tls_wrap(sock, "loop.test", bundle) as tls:
            tls.sendall(request_bytes("GET", f"/_/api.test:{api.port}/x", [
                ("Host", f"loop.test:{aproxy.port}"), BOT1, ("Connection", "close")]))
            r = read_response(tls)
    assert (r.status, r.reason) == (403, "proxy_loop")
    assert nothing_reached(api)


# -- base-URL mode: the names around the prefix ------------------------------------------------


def test_the_host_header_and_forwarding_claims_do_not_steer_a_base_url(
    aproxy: Proxy, api: Origin, victim: Origin, fresh: None
) -> None:
    r = exchange(aproxy.port, request_bytes("GET", f"/_/api.test:{api.port}/v1", [
        ("Host", f"victim.test:{victim.port}"), BOT1,
        ("X-Forwarded-Host", f"victim.test:{victim.port}"),
        ("Forwarded", f"host=victim.test:{victim.port}"), ("X-Real-IP", "169.254.169.254"),
        ("Connection", "close"),
    ]))
    assert r.status == 200, r.body[:300]
    (seen,) = api.requests
    assert seen.values("host") == [f"api.test:{api.port}"]
    names = {name.lower() for name, _ in seen.fields}
    assert not names & {"x-forwarded-host", "forwarded", "x-real-ip", "proxy-authorization"}
    assert victim.untouched()


@pytest.mark.parametrize("head", [
    [("Host", "127.0.0.1"), ("Host", "victim.test")],  # two Host fields
    [],                                                 # none
    [("Host", "")],
])
def test_a_base_url_with_a_doubtful_host_header_reaches_nothing(
    aproxy: Proxy, api: Origin, victim: Origin, fresh: None, head: list[tuple[str, str]]
) -> None:
    data = request_bytes("GET", f"/_/api.test:{api.port}/v1",
                         [*head, BOT1, ("Connection", "close")])
    try:
        r = exchange(aproxy.port, data)
    except NoResponse:
        pass
    else:
        assert 400 <= r.status < 500, r.body[:300]
    assert nothing_reached(api, victim)


def test_connect_in_origin_form_and_http2_prior_knowledge_reach_nothing(
    aproxy: Proxy, api: Origin, fresh: None
) -> None:
    r = exchange(aproxy.port, request_bytes("CONNECT", f"/_/api.test:{api.port}/", [
        ("Host", f"127.0.0.1:{aproxy.port}"), BOT1]))
    assert 400 <= r.status < 500
    # h2c with prior knowledge straight to the listener, a HEADERS frame naming /_/api.test.
    import h2.config
    import h2.connection

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "GET"), (":scheme", "http"),
                          (":authority", f"127.0.0.1:{aproxy.port}"),
                          (":path", f"/_/api.test:{api.port}/h2c"),
                          ("proxy-authorization", BOT1[1])], end_stream=True)
    with socket.create_connection(("127.0.0.1", aproxy.port), timeout=5) as sock:
        sock.sendall(conn.data_to_send())
        answer = b""
        deadline = time.monotonic() + 3
        with pytest.raises(OSError):  # read until the proxy closes (or the deadline)
            while time.monotonic() < deadline and len(answer) < 65536:
                sock.settimeout(max(0.05, deadline - time.monotonic()))
                chunk = sock.recv(4096)
                if not chunk:
                    raise OSError("closed")
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert nothing_reached(api)


# -- base-URL mode: redirects ------------------------------------------------------------------


def _location(proxy: Proxy, api: Origin, location: str, prefix: str = "") -> tuple[str, str]:
    """The Location the client gets for an upstream's `location`, and the URL it resolves to."""
    from urllib.parse import urljoin

    api.response_headers["Location"] = location
    target = f"{prefix}api.test:{api.port}/v1/start"
    r = base_get(proxy, target, [BOT1])
    assert r.status == 200, r.body[:300]
    back = r.headers.get("location", "")
    try:
        return back, urljoin(f"http://127.0.0.1:{proxy.port}/_/{target}", back)
    except ValueError:  # a masked host ("[REDACTED]...") is no URL a client could follow
        return back, ""


def test_a_secret_echoed_in_a_redirect_path_is_masked(
    aproxy: Proxy, api: Origin, fresh: None
) -> None:
    back, _ = _location(aproxy, api, f"https://api.test:{api.port}/cb?k={BROKERED}")
    assert BROKERED.lower() not in back.lower() and "REDACTED" in back, back


@pytest.mark.parametrize("template", [
    "https://{s}.x.test/p", "https://{s}.x.test:8443/p", "https://{s}/", "HTTPS://{s}.X.TEST",
])
def test_a_secret_echoed_in_a_redirect_host_is_masked(
    aproxy: Proxy, api: Origin, fresh: None, template: str
) -> None:
    back, _ = _location(aproxy, api, template.format(s=BROKERED))
    assert BROKERED.lower() not in back.lower(), back


def test_a_redirect_elsewhere_drops_the_tokens_of_the_prefix(
    aproxy: Proxy, api: Origin, fresh: None, token_keys: tuple[Path, PublicKeyEntry]
) -> None:
    token = mint(token_keys[1], "api.test", api.port)
    for location in [f"https://tok.test:{api.port}/x", f"https://api.test:{api.port + 1}/x",
                     "https://victim.test/x", f"https://API.test.:{api.port}@victim.test/"]:
        back, url = _location(aproxy, api, location, prefix=f"{token}@")
        assert token not in back and "sg1." not in url, (location, back)
    # Kept for the same upstream, however it is spelled: the tokens go back only to it.
    back, url = _location(aproxy, api, f"https://API.TEST.:{api.port}/next", prefix=f"{token}@")
    assert url == f"http://127.0.0.1:{aproxy.port}/_/{token}@api.test:{api.port}/next"


def test_a_scheme_relative_redirect_is_pointed_back_through_the_proxy(
    aproxy: Proxy, api: Origin, fresh: None
) -> None:
    from urllib.parse import urlsplit

    _, url = _location(aproxy, api, f"//tok.test:{api.port}/x")
    assert urlsplit(url).netloc == f"127.0.0.1:{aproxy.port}", url


# -- tokens in the prefix and in the proxy credentials ----------------------------------------


def test_a_token_never_reaches_the_origin_or_the_log(
    aproxy: Proxy, api: Origin, fresh: None, token_keys: tuple[Path, PublicKeyEntry]
) -> None:
    in_path = mint(token_keys[1], "tok.test", api.port, secret="sk_tok_path_7d1e")
    in_creds = mint(token_keys[1], "tok.test", api.port, secret="sk_tok_creds_7d1e", bound="bot-1")
    r = base_get(aproxy, f"{in_path}@tok.test:{api.port}/v1?q=1", [
        ("Proxy-Authorization", basic("bot-1", f"{KEY1},{in_creds}")),
    ])
    assert r.status == 200, r.body[:300]
    (seen,) = api.requests
    everything = seen.path + repr(seen.fields)
    assert in_path not in everything and in_creds not in everything and "sg1." not in everything
    assert seen.path == "/v1?q=1"
    assert seen.values("authorization")  # the tokens did inject (the last one written wins)
    log = aproxy.audit_text() + aproxy.stderr()
    assert in_path not in log and in_creds not in log and "sk_tok_" not in log


def test_a_brokered_secret_stays_with_its_host_on_a_kept_alive_connection(
    aproxy: Proxy, api: Origin, fresh: None, token_keys: tuple[Path, PublicKeyEntry]
) -> None:
    """api.test gets the brokered secret; tok.test, on the same client connection and the same
    origin server, must get no credential, even with a token for api.test in the credentials."""
    api_token = mint(token_keys[1], "api.test", api.port)
    auth = ("Proxy-Authorization", basic("bot-1", f"{KEY1},{api_token}"))
    with socket.create_connection(("127.0.0.1", aproxy.port), timeout=10) as sock:
        for host in ("api.test", "tok.test", "api.test", "tok.test"):
            sock.sendall(request_bytes("GET", f"/_/{host}:{api.port}/who",
                                       [("Host", f"127.0.0.1:{aproxy.port}"), auth]))
            assert read_response(sock).status == 200
    by_host = [(s.values("host")[0].split(":")[0], s.values("authorization")) for s in api.requests]
    assert [h for h, _ in by_host] == ["api.test", "tok.test", "api.test", "tok.test"]
    for host, authorization in by_host:
        if host == "tok.test":
            assert authorization == [], authorization
        else:
            assert len(authorization) == 1


@pytest.mark.parametrize("case", [
    "bound-to-bot-1-as-_", "bound-to-bot-1-as-empty-user", "bound-to-bot-1-as-bot-2",
    "user-case", "empty-key", "token-as-key", "key-as-token", "second-auth-wrong-key",
    "first-auth-wrong-key", "nine-tokens", "nine-across-prefix-and-credentials",
    "for-another-host-in-prefix", "expired-in-prefix",
])
def test_tokens_presented_to_cheat_reach_nothing(
    aproxy: Proxy, api: Origin, victim: Origin, fresh: None,
    token_keys: tuple[Path, PublicKeyEntry], case: str,
) -> None:
    pub, port = token_keys[1], api.port
    bound = mint(pub, "api.test", port, bound="bot-1")
    plain = mint(pub, "api.test", port)
    prefix = ""
    auth: list[str] = []
    match case:
        case "bound-to-bot-1-as-_":
            auth = [basic("_", bound)]
        case "bound-to-bot-1-as-empty-user":
            auth = [basic("", bound)]
        case "bound-to-bot-1-as-bot-2":
            auth = [basic("bot-2", f"{KEY2},{bound}")]
        case "user-case":
            auth = [basic("Bot-1", f"{KEY1},{plain}")]
        case "empty-key":
            auth = [basic("bot-1", f",{plain}")]
        case "token-as-key":
            auth = [basic("bot-1", plain)]
        case "key-as-token":
            auth = [basic("_", KEY1)]
        case "second-auth-wrong-key":
            auth = [basic("bot-1", KEY1), basic("bot-2", f"wrong,{plain}")]
        case "first-auth-wrong-key":
            auth = [basic("_", bound), basic("bot-1", "wrong")]
        case "nine-tokens":
            auth = [basic("bot-1", ",".join([KEY1, *[plain] * 9]))]
        case "nine-across-prefix-and-credentials":
            prefix = ",".join([plain] * 4) + "@"
            auth = [basic("bot-1", ",".join([KEY1, *[plain] * 5]))]
        case "for-another-host-in-prefix":
            prefix = mint(pub, "victim.test", victim.port) + "@"
            auth = [basic("bot-1", KEY1)]
        case "expired-in-prefix":
            prefix = mint(pub, "api.test", port, ttl=-900) + "@"
            auth = [basic("bot-1", KEY1)]
    r = base_get(aproxy, f"{prefix}api.test:{port}/v1",
                 [("Proxy-Authorization", value) for value in auth])
    assert refused(r), (case, r.status, r.body[:300])
    assert nothing_reached(api, victim), case
    for canary in CANARIES:
        assert canary not in r.body.decode("latin-1")


# -- refused CONNECTs, answered inside TLS -----------------------------------------------------


def _h2(tls: ssl.SSLSocket, authority: str, path: str = "/",
        extra: tuple[tuple[str, str], ...] = ()) -> RawResponse:
    return h2_exchange(tls, [(":method", "POST" if extra else "GET"), (":scheme", "https"),
                             (":authority", authority), (":path", path), *extra])


@pytest.mark.parametrize("inside", [
    "plain-http", "plain-absolute-form", "plain-second-connect", "plain-base-url",
    "plain-h2c-preface", "tls-sni-allowed", "tls-no-sni", "tls-h2", "tls-h2-grpc",
    "tls-keep-alive", "tls-own-token",
])
@pytest.mark.parametrize("why", ["no-rule", "token-binding"])
def test_a_refused_connect_lets_nothing_out_of_its_tunnel(
    aproxy: Proxy, api: Origin, victim: Origin, trap: LoopbackTrap, fresh: None, bundle: Path,
    token_keys: tuple[Path, PublicKeyEntry], inside: str, why: str,
) -> None:
    """A refused CONNECT is accepted and every request in its tunnel refused, however it names
    the allowed api.test. `no-rule`: CONNECT victim.test, which no rule allows. `token-binding`:
    CONNECT api.test itself, refused only for its Proxy-Tokenizer (bound to bot-2): the requests
    inside carry none, so nothing but the connection's refusal stops them."""
    allowed = f"api.test:{api.port}"
    if why == "no-rule":
        sock, head = open_tunnel(aproxy.port, f"victim.test:{victim.port}", [BOT1])
    else:
        sock, head = open_tunnel(aproxy.port, allowed, [
            BOT1, ("Proxy-Tokenizer", mint(token_keys[1], "api.test", api.port, bound="bot-2"))])
    answers: list[RawResponse] = []
    with sock:
        assert head.status == 200
        if inside.startswith("plain-"):
            data = {
                "plain-http": request_bytes("GET", "/", [("Host", allowed), BOT1]),
                "plain-absolute-form": request_bytes(
                    "GET", f"https://{allowed}/", [("Host", allowed), BOT1]),
                "plain-second-connect": request_bytes(
                    "CONNECT", allowed, [("Host", allowed), BOT1]),
                "plain-base-url": request_bytes(
                    "GET", f"/_/{allowed}/", [("Host", f"127.0.0.1:{aproxy.port}"), BOT1]),
                "plain-h2c-preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            }[inside]
            sock.sendall(data)
            try:
                answers.append(read_response(sock))
            except NoResponse:
                assert inside == "plain-h2c-preface"  # closed unanswered: refused too
        else:
            sni = None if inside == "tls-no-sni" else "api.test"
            alpn = ["h2"] if inside.startswith("tls-h2") else ["http/1.1"]
            with tls_wrap(sock, sni, bundle, alpn=alpn) as tls:
                if inside == "tls-h2":
                    answers.append(_h2(tls, allowed))
                elif inside == "tls-h2-grpc":
                    answers.append(_h2(tls, allowed, "/pkg.Svc/Call", (
                        ("content-type", "application/grpc"), ("te", "trailers"))))
                else:
                    extra = [("Proxy-Tokenizer", mint(token_keys[1], "api.test", api.port))] if (
                        inside == "tls-own-token") else []
                    for _ in range(3 if inside == "tls-keep-alive" else 1):
                        tls.sendall(request_bytes("GET", "/", [("Host", allowed), BOT1, *extra]))
                        answers.append(read_response(tls))
    for r in answers:
        if inside == "tls-h2-grpc":
            assert r.status == 200 and r.trailers.get("grpc-status") in ("7", "16"), r
        else:
            assert 400 <= r.status < 500, (inside, r.status, r.body[:300])
    assert nothing_reached(api, victim, trap=trap), inside


@pytest.mark.parametrize("authority", [
    "169.254.169.254:80", "127.0.0.2:{A}", "0.0.0.0:{A}", "[::1]:{A}", "[::]:{A}",
    "zero.test:{A}", "inner.test:{A}", "meta.attack.test:{A}",
])
def test_a_refused_connect_to_an_internal_address_dials_nothing(
    aproxy: Proxy, api: Origin, trap: LoopbackTrap, fresh: None, authority: str
) -> None:
    text = authority.format(A=api.port)
    sock, head = open_tunnel(aproxy.port, text, [BOT1])
    with sock:
        assert head.status == 200
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        with context.wrap_socket(sock, server_hostname="api.test") as tls:
            tls.sendall(request_bytes("GET", "/", [("Host", text), BOT1, ("Connection", "close")]))
            r = read_response(tls)
    assert r.status == 403 and refused(r), (text, r.status, r.body[:300])
    assert nothing_reached(api, trap=trap), text


def test_a_tunnel_token_does_not_follow_a_request_naming_another_host(
    aproxy: Proxy, api: Origin, fresh: None, bundle: Path, token_keys: tuple[Path, PublicKeyEntry]
) -> None:
    """A CONNECT api.test with its token, then HTTP/2 requests inside naming tok.test (which the
    same origin serves): refused as a mismatch, nothing dialed, the token's secret nowhere."""
    allowed = f"api.test:{api.port}"
    sock, head = open_tunnel(aproxy.port, allowed, [
        BOT1, ("Proxy-Tokenizer", mint(token_keys[1], "api.test", api.port))])
    with sock:
        assert head.status == 200
        with tls_wrap(sock, "api.test", bundle, alpn=["h2"]) as tls:
            assert tls.selected_alpn_protocol() == "h2"
            r = h2_exchange(tls, [(":method", "GET"), (":scheme", "https"),
                                  (":authority", f"tok.test:{api.port}"), (":path", "/")])
    assert (r.status, r.reason) == (403, "name_mismatch")
    sock, head = open_tunnel(aproxy.port, allowed, [
        BOT1, ("Proxy-Tokenizer", mint(token_keys[1], "api.test", api.port))])
    with sock, tls_wrap(sock, "api.test", bundle, alpn=["h2"]) as tls:
        try:
            r = h2_exchange(tls, [(":method", "GET"), (":scheme", "https"),
                                  (":authority", allowed), (":path", "/"),
                                  ("host", f"tok.test:{api.port}")])
        except NoResponse:
            pass  # h2 itself refuses a Host that disagrees with :authority: the connection ends
        else:
            assert (r.status, r.reason) == (403, "name_mismatch")
    assert nothing_reached(api)


# -- gRPC-shaped refusals ----------------------------------------------------------------------


def test_a_grpc_refusal_echoing_a_hostile_path_stays_one_clean_trailer(
    aproxy: Proxy, api: Origin, fresh: None, bundle: Path
) -> None:
    """The anonymous policy allows only GET /public/**: a POST elsewhere is refused with the
    path in its message. Whatever the path holds, grpc-message is printable ASCII that decodes
    back to the message, and no other field appears."""
    from urllib.parse import unquote

    allowed = f"api.test:{api.port}"
    hostile = "/pkg.Svc/M\u00e9thod\"%25%0d%0agrpc-status:%200"
    sock, head = open_tunnel(aproxy.port, allowed, [])
    with sock:
        assert head.status == 200
        with tls_wrap(sock, "api.test", bundle, alpn=["h2"]) as tls:
            r = _h2(tls, allowed, hostile, (("content-type", "application/grpc"),
                                            ("te", "trailers")))
    assert r.status == 200 and r.headers["content-type"] == "application/grpc"
    assert set(r.trailers) == {"grpc-status", "grpc-message"}, r.trailers
    assert r.trailers["grpc-status"] in ("3", "7")
    message = r.trailers["grpc-message"]
    assert message.isascii() and message.isprintable(), message
    assert unquote(message).startswith("sealgate refused the request (")
    assert nothing_reached(api)


@pytest.mark.parametrize("content_type", ["application/grpc", "application/grpc-web+proto"])
def test_a_grpc_refusal_over_http1_still_reads_as_a_refusal(
    aproxy: Proxy, victim: Origin, fresh: None, content_type: str
) -> None:
    r = base_get(aproxy, f"victim.test:{victim.port}/pkg.Svc/Call",
                 [BOT1, ("Content-Type", content_type)], method="POST")
    assert r.headers.get("x-sealgate-error") == "not_allowed"
    assert r.status != 200 or "grpc-status" in r.headers, (r.status, r.headers)
    assert victim.untouched()


# -- robustness: a proxy of its own for each ---------------------------------------------------


_LONE_RULES = """
version: 1
policies:
  nothing:
    allow: []
sandboxes:
  bot-1: {policy: nothing, key_sha256: "%s"}
default_policy: nothing
"""


@pytest.fixture()
def lone(tmp_path: Path) -> Iterator[Proxy]:
    p = Proxy(tmp_path, _LONE_RULES % key_digest(KEY1))
    yield p
    p.stop()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_huge_proxy_credentials_are_not_kept(lone: Proxy) -> None:
    pid = lone.process.pid
    padding = "," * (1 << 20)

    def send(user: str, password: str) -> None:
        r = base_get(lone, "api.test/", [("Proxy-Authorization", basic(user, password))])
        assert 400 <= r.status < 500

    # The same work without the cache (a wrong key is not remembered): the allocator's high
    # water mark, which the second round must not rise far above.
    for i in range(24):
        send("bot-1", f"wrong{i}{padding}")
    time.sleep(0.3)
    before = _rss(pid)
    for i in range(24):
        send("_", f"{i}{padding}")
    time.sleep(0.3)
    grown = _rss(pid) - before
    assert grown < 100 << 20, f"{grown >> 20} MiB kept after 24 requests"


def test_tls_straight_to_the_explicit_listener_is_refused_quietly(lone: Proxy) -> None:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", lone.port), timeout=5) as sock, pytest.raises(
        (ssl.SSLError, OSError)
    ), context.wrap_socket(sock, server_hostname="api.test") as tls:
        tls.sendall(request_bytes("GET", "/_/api.test/", [("Host", "api.test")]))
        read_response(tls)
    time.sleep(0.3)
    assert lone.process.poll() is None
    assert "Traceback" not in lone.stderr() and "internal error" not in lone.stderr()
