"""oauth2: the proxy holds a refresh token (or a client id and secret), obtains access tokens
from the token endpoint (dialed through the guard), caches them, persists rotated refresh
tokens to the file store and injects `Authorization: Bearer`. The sandbox, plain `requests`,
holds nothing. Faults: the endpoint slow or down, a revoked grant, an upstream 401, token
endpoints at addresses the guard refuses. Sealed: a token carrying the refresh token, its
endpoint dialed only where the sandbox's own policy allows a POST to it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sealgate.credentials.processors import OAuth2Processor
from tests.dnsstub import StubDNS
from tests.harness import OriginCA
from tests.oauthfake import OAuthFake
from tests.sdk.kit import World, masked, policy, rules_file, world
from tests.sdk.kit import rule as allowing

API, AUTH, INTERNAL = "api.example.com", "auth.example.com", "internal-auth.example.com"
# app-1 brokered; app-2 and app-3 carry sealed tokens, app-3's policy not allowing AUTH.
KEYS = {"app-1": "oauth-key-app-1", "app-2": "oauth-key-app-2", "app-3": "oauth-key-app-3"}
CLIENT_ID, CLIENT_SECRET = "sealgate-ci", "CANARY-client-secret-0123456789"
REFRESH = "CANARY-refresh-token-abcdef0123456789"
SLOW_REFRESH = "CANARY-refresh-token-slow-0123456789"
SEALED_REFRESH = "CANARY-refresh-token-sealed-0123456789"


def _inject(path: str, secret: str, processor: str, port: int) -> str:
    return (f"      - host: {API}\n        ports: [{port}]\n"
            f"        paths: [\"/{path}/**\"]\n        inject:\n"
            f"          - secret: file:{secret}\n            as: {processor}\n")


def rules(port: int) -> str:
    url = f"https://{AUTH}:{port}/token"
    allow = "".join([
        _inject("rt", "oauth_rt", f'{{type: oauth2, token_url: "{url}"}}', port),
        _inject("body", "oauth_body", f'{{type: oauth2, token_url: "{url}", '
                                      "client_auth: body}", port),
        _inject("cc", "oauth_cc", f'{{type: oauth2, token_url: "{url}", '
                                  "grant: client_credentials, scopes: [read, write]}", port),
        _inject("exp", "oauth_exp", f'{{type: oauth2, token_url: "{url}", '
                                    "grant: client_credentials}", port),
        _inject("slow", "oauth_slow", f'{{type: oauth2, token_url: "{url}"}}', port),
        _inject("private", "oauth_rt", f'{{type: oauth2, token_url: '
                                       f'"https://{INTERNAL}:{port}/token"}}', port),
        _inject("metadata", "oauth_rt",
                '{type: oauth2, token_url: "https://169.254.169.254/token"}', port),
    ])
    brokered = f"  app:\n    allow:\n{allow}    allow_networks: [127.0.0.1/32]\n"
    api = allowing(API, [port], paths=["/sealed/**"])
    posts = [allowing(host, [port], methods=["POST"], paths=["/token"])
             for host in (AUTH, INTERNAL)]
    return rules_file([brokered, policy("sealed", api, *posts, tokens=True),
                       policy("narrow", api, tokens=True)], {
        "app-1": ("app", KEYS["app-1"]), "app-2": ("sealed", KEYS["app-2"]),
        "app-3": ("narrow", KEYS["app-3"]),
    }, default=None)


SECRETS = {
    "oauth_rt": {"refresh_token": REFRESH, "client_id": CLIENT_ID,
                 "client_secret": CLIENT_SECRET},
    "oauth_body": {"refresh_token": REFRESH + "-body", "client_id": CLIENT_ID,
                   "client_secret": CLIENT_SECRET},
    "oauth_cc": {"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET},
    "oauth_exp": {"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET},
    "oauth_slow": {"refresh_token": SLOW_REFRESH, "client_id": CLIENT_ID,
                   "client_secret": CLIENT_SECRET},
}

GET = """
def main(url, n=1, parallel=1):
    import requests
    from concurrent.futures import ThreadPoolExecutor
    def one(_):
        r = requests.get(url, timeout=25)
        return [r.status_code, r.headers.get("x-sealgate-error"), r.text]
    with ThreadPoolExecutor(parallel) as pool:
        return list(pool.map(one, range(n)))
"""


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
      ) -> Iterator[World]:
    directory: Path = tmp_path_factory.mktemp("oauth2")
    fake = OAuthFake(client_id=CLIENT_ID, client_secret=CLIENT_SECRET, refresh_token=REFRESH)
    fake.live_refresh |= {REFRESH + "-body", SLOW_REFRESH, SEALED_REFRESH}
    dns.set(INTERNAL, "A 10.9.9.9")
    with world(directory, test_ca, dns, [API, AUTH], fake, rules, KEYS, "unused") as made:
        secrets = directory / "secrets.yaml"
        secrets.write_text(yaml.safe_dump({k: json.dumps(v) for k, v in SECRETS.items()}))
        made.oauth = fake  # type: ignore[attr-defined]
        yield made
    logged = made.proxy.audit_text() + made.proxy.stderr()
    for canary in (REFRESH, SLOW_REFRESH, SEALED_REFRESH, CLIENT_SECRET, *fake.issued):
        assert canary not in logged


def _fake(w: World) -> OAuthFake:
    fake: OAuthFake = w.oauth  # type: ignore[attr-defined]
    return fake


@pytest.fixture(autouse=True)
def _fresh(w: World) -> None:
    fake = _fake(w)
    fake.delay, fake.down, fake.rotate, fake.expires_in = 0.0, False, True, 3600
    fake.reset_counts()
    fake.grants.clear()
    w.fake.reset()


def get(w: World, path: str, *, sandbox: str = "app-1", token: str | None = None,
        **args: int) -> list[list[object]]:
    env = w.env(sandbox)
    assert not [v for v in env.values() if REFRESH in v or CLIENT_SECRET in v]
    code = GET if token is None else GET.replace(
        "timeout=25)", f"timeout=25, headers={{'Proxy-Tokenizer': {token!r}}})")
    result: list[list[object]] = w.run(code, env, url=w.url(path, host=API), **args).ok()
    return result


def stored(w: World, name: str) -> dict[str, str]:
    secrets = yaml.safe_load((w.directory / "secrets.yaml").read_text())
    value: dict[str, str] = json.loads(secrets[name])
    return value


def test_refresh_token_exchanged_once_cached_rotated_and_persisted(w: World) -> None:
    fake = _fake(w)
    answers = get(w, "/rt/me", n=3)
    assert [a[0] for a in answers] == [200, 200, 200], answers[0][2]
    assert fake.calls == 1  # three requests, one exchange
    (grant,) = fake.grants
    assert grant == {"grant_type": "refresh_token", "refresh_token": REFRESH}  # Basic auth
    api = [r for r in w.fake.requests if r.path.startswith("/rt/")]
    tokens = {r.headers["authorization"] for r in api}
    assert len(tokens) == 1 and tokens.pop().startswith("Bearer at-")
    # The upstream echoed the access token: masked on the way back.
    sent = api[0].headers["authorization"].removeprefix("Bearer ")
    assert sent not in str(answers) and masked(sent) in str(answers[0][2])
    # The rotated refresh token went back to the file store; the old one is dead at the fake.
    now = stored(w, "oauth_rt")
    assert now["refresh_token"].startswith("rt-rotated-") and now["client_id"] == CLIENT_ID
    assert REFRESH not in fake.live_refresh


def test_upstream_401_invalidates_and_the_rotated_token_refreshes(w: World) -> None:
    fake = _fake(w)
    assert get(w, "/rt/a")[0][0] == 200
    fake.reset_counts()
    fake.revoke_access()
    w.fake.reset()
    (refused,) = get(w, "/rt/b")
    assert refused[0] == 401  # passed on as it came, not retried by the proxy
    assert len([r for r in w.fake.requests if r.path == "/rt/b"]) == 1
    assert fake.calls == 0
    assert get(w, "/rt/c")[0][0] == 200  # a new exchange, with the refresh token rotated last
    assert fake.calls == 1 and fake.grants[-1]["refresh_token"].startswith("rt-rotated-")


def test_client_credentials_with_scopes_and_body_authentication(w: World) -> None:
    fake = _fake(w)
    assert get(w, "/cc/x")[0][0] == 200
    assert fake.grants[-1] == {"grant_type": "client_credentials", "scope": "read write"}
    assert get(w, "/body/x")[0][0] == 200
    assert fake.grants[-1]["client_id"] == CLIENT_ID  # and client_secret, left out of the log
    assert w.fake.requests[-1].headers["authorization"].startswith("Bearer at-")


def test_slow_endpoint_one_call_for_concurrent_requests_and_bounded_wait(w: World) -> None:
    fake = _fake(w)
    # Past the proxy's 5 s wait by far, so that a loaded machine's slowness cannot be mistaken
    # for the proxy waiting out the call; and short of the call's own 10 s bound (dial.TIMEOUT)
    # by as much: at 10 s, a loaded machine's call timed out and the next request was refused.
    fake.delay = 8.0
    started = time.monotonic()
    answers = get(w, "/slow/x", n=6, parallel=6)
    elapsed = time.monotonic() - started
    assert {(a[0], a[1]) for a in answers} == {(503, "secret_unavailable")}, answers
    assert "within 5 s" in str(answers[0][2])
    assert elapsed < 9.0
    assert fake.calls == 1 and fake.most_at_once == 1
    assert not [r for r in w.fake.requests if r.path.startswith("/slow/")]
    for _ in range(300):  # until the call ended (bounded); its token is then held
        if not fake.in_flight:
            break
        time.sleep(0.05)
    fake.delay = 0.0
    assert get(w, "/slow/y")[0][0] == 200
    assert fake.calls == 1


def test_endpoint_down_fails_closed_without_a_pile_up(w: World) -> None:
    fake = _fake(w)
    assert get(w, "/cc/warm")[0][0] == 200
    fake.down = True
    fake.revoke_access()
    assert get(w, "/cc/revoked")[0][0] == 401  # which drops the held token
    fake.reset_counts()
    answers = get(w, "/cc/x", n=5)
    assert {(a[0], a[1]) for a in answers} == {(503, "secret_unavailable")}, answers
    assert "503 temporarily_unavailable" in str(answers[0][2])
    assert fake.calls == 1  # the failure is remembered for a few seconds, not retried per request


def test_revoked_refresh_token_is_secret_unavailable_naming_the_code(w: World) -> None:
    fake = _fake(w)
    fake.live_refresh.clear()
    fake.revoke_access()
    get(w, "/body/warm")
    time.sleep(0.2)
    (answer,) = get(w, "/body/x")
    assert (answer[0], answer[1]) == (503, "secret_unavailable")
    assert "400 invalid_grant" in str(answer[2])
    assert REFRESH not in str(answer[2]) and CLIENT_SECRET not in str(answer[2])


@pytest.mark.parametrize(("path", "why"), [("/private/x", "private"),
                                           ("/metadata/x", "metadata")])
def test_token_endpoint_is_dialed_through_the_guard(w: World, path: str, why: str) -> None:
    fake = _fake(w)
    (answer,) = get(w, path)
    assert (answer[0], answer[1]) == (503, "secret_unavailable"), answer
    assert f"is refused ({why})" in str(answer[2])
    assert fake.calls == 0 and not w.fake.requests


def test_refresh_token_and_client_secret_are_masked_in_responses(w: World) -> None:
    fake = _fake(w)
    fake.live_refresh.add(stored(w, "oauth_rt")["refresh_token"])  # earlier tests revoke
    *_, answer = get(w, "/rt/leak", n=2)  # the first may meet a token revoked since
    assert answer[0] == 200, answer
    current = stored(w, "oauth_rt")["refresh_token"]
    assert current in fake.live_refresh
    assert current not in str(answer[2]) and masked(current) in str(answer[2])
    assert CLIENT_SECRET not in str(answer[2]) and masked(CLIENT_SECRET) in str(answer[2])


TIMED = """
def main(url, due):
    import time, requests
    start, status, sent = None, [], []
    for path, at in due:
        if start is not None:
            time.sleep(max(0.0, start + at - time.monotonic()))
            sent.append(time.monotonic() - start)
        status.append(requests.get(url + path, timeout=25).status_code)
        start = start or time.monotonic()
    return {"status": status, "sent": sent}
"""


def test_an_expiring_token_is_refreshed_ahead_and_never_sent_late(w: World) -> None:
    """A token of 4 s is refreshed behind it after 2 s (the request then still carries it,
    the next one the new token) and is not sent in its last second: a request then waits for
    a new one. The fake counts the calls; the origin says which token each request carried
    (the fake's API also refuses an expired one: a stale token would show as a 401)."""
    fake = _fake(w)
    fake.expires_in = 4
    before = len(fake.issued)
    # Seconds after /a's answer (about when its token was obtained): /b in the refresh window
    # (2-3 s), /c once the refresh behind /b is done, /d 3.5 s into /b's new token's life.
    due = [("a", 0.0), ("b", 2.3), ("c", 2.6), ("d", 5.8)]
    ran: dict[str, list[float]] = w.run(TIMED, w.env("app-1"), url=w.url("/exp/", host=API),
                                        due=due).ok()
    assert ran["status"] == [200] * len(due)
    # Up to 0.4 s of delay on any request (a slow machine's scheduling) still lands each in
    # its window: /b before 3 s, /d between 3 and 4 s after /b (whose token it is).
    late = [(path, at, sent) for (path, at), sent in zip(due[1:], ran["sent"], strict=True)
            if sent > at + 0.4]
    assert not late, f"the client ran late, missing the windows: {late}"
    assert fake.calls == 3
    first, behind, waited_for = (f"Bearer {token}" for token in fake.issued[before:])
    carried = {r.path.removeprefix("/exp/"): r.headers["authorization"]
               for r in w.fake.requests if r.path.startswith("/exp/")}
    assert carried == {"a": first, "b": first, "c": behind, "d": waited_for}


# -- sealed in a token ----------------------------------------------------------------------------


def sealed_token(w: World, token_url: str, refresh: str = SEALED_REFRESH) -> str:
    secret = json.dumps({"refresh_token": refresh, "client_id": CLIENT_ID,
                         "client_secret": CLIENT_SECRET})
    return w.mint(OAuth2Processor(token_url), host=API, secret=secret)


def test_a_sealed_refresh_token_is_exchanged_where_the_policy_allows_its_endpoint(
    w: World,
) -> None:
    fake = _fake(w)
    fake.live_refresh.add(SEALED_REFRESH)  # earlier tests revoke
    token = sealed_token(w, f"https://{AUTH}:{w.fake.port}/token")
    answers = get(w, "/sealed/me", sandbox="app-2", token=token, n=3)
    assert [a[0] for a in answers] == [200, 200, 200], answers[0][2]
    assert fake.calls == 1  # three requests, one exchange, as brokered
    assert fake.grants == [{"grant_type": "refresh_token", "refresh_token": SEALED_REFRESH}]
    api = [r for r in w.fake.requests if r.path.startswith("/sealed/")]
    assert {r.headers["authorization"] for r in api} == {f"Bearer {fake.issued[-1]}"}
    assert not [r for r in api if "proxy-tokenizer" in r.headers]
    # Rotated at the fake: the token still holds the old one, the proxy the new one.
    assert SEALED_REFRESH not in fake.live_refresh
    fake.revoke_access()
    w.fake.reset()
    assert get(w, "/sealed/a", sandbox="app-2", token=token)[0][0] == 401  # drops the held one
    assert get(w, "/sealed/b", sandbox="app-2", token=token)[0][0] == 200
    assert fake.grants[-1]["refresh_token"].startswith("rt-rotated-")
    assert "kept in memory only" in w.proxy.stderr()


@pytest.mark.parametrize(("sandbox", "endpoint", "reason", "why"), [
    ("app-3", f"https://{AUTH}:{{port}}/token", "not_allowed", "is not allowed"),
    ("app-2", f"https://{AUTH}:{{port}}/other", "not_allowed", "is not allowed"),
    ("app-2", "https://169.254.169.254/token", "not_allowed", "is not allowed"),
    ("app-2", f"https://{INTERNAL}:{{port}}/token", "secret_unavailable", "refused (private)"),
])
def test_a_sealed_tokens_endpoint_is_dialed_only_as_the_sandbox_could_post_to_it(
    w: World, sandbox: str, endpoint: str, reason: str, why: str
) -> None:
    """Anyone with the proxy's public key can mint a token naming any endpoint: it is dialed
    only where the sandbox's own policy lets it POST (app-3's does not name AUTH; app-2's allows
    only /token), and then through the guard (INTERNAL resolves to a private address)."""
    fake = _fake(w)
    token = sealed_token(w, endpoint.format(port=w.fake.port))
    (answer,) = get(w, "/sealed/x", sandbox=sandbox, token=token)
    assert (answer[0], answer[1]) == (403 if reason == "not_allowed" else 503, reason), answer
    assert why in str(answer[2]), answer
    assert ("a token's oauth2 endpoint" in str(answer[2])) == (reason == "not_allowed")
    assert fake.calls == 0 and not w.fake.requests
