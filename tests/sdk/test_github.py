"""PyGithub, unchanged, through a real proxy to a fake api.github.com.

PyGithub rides on requests, which reads HTTPS_PROXY and REQUESTS_CA_BUNDLE from the environment
`sealgate env` printed. It has no way to add a header to every request, so a sealed token
reaches the proxy either in the proxy credentials (connection-scoped) or in the base URL.
"""

from __future__ import annotations

import json
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
    masked,
    policy,
    refusal_visible,
    rule,
    rules_file,
    world,
)

pytest.importorskip("github", reason="PyGithub is not installed (pip install -e '.[test]')")

HOST = "api.github.com"
BLOCKED = "uploads.github.com"
SECRET = "ghp_CANARYgithub0123456789abcdefABCD"
PLACEHOLDER = "sg-placeholder-github"
KEYS = {"plain-1": "plain-key-github-1", "broker-1": "broker-key-github-1",
        "tokens-1": "tokens-key-github-1"}
PATHS = ["/users/*", "/repos/sealgate/*", "/repositories/*"]


def rules(port: int) -> str:
    placeholder = f"{{type: placeholder, header: Authorization, placeholder: {PLACEHOLDER}}}"
    return rules_file(
        [
            policy("plain", rule(HOST, [port], paths=PATHS, methods=["GET"])),
            policy("broker", rule(HOST, [port], paths=PATHS, inject=placeholder)),
            policy("tokens", rule(HOST, [port], paths=PATHS), tokens=True),
            policy("anon", rule(HOST, [port], paths=PATHS), tokens=True),
        ],
        {"plain-1": ("plain", KEYS["plain-1"]), "broker-1": ("broker", KEYS["broker-1"]),
         "tokens-1": ("tokens", KEYS["tokens-1"])},
        default="anon",
    )


def route(seen: Arrived) -> Reply:
    auth = seen.headers.get("authorization")
    path = seen.path.partition("?")[0]
    if seen.method == "GET" and path.startswith("/users/"):
        login = path.rsplit("/", 1)[1]
        return Reply(body={"login": login, "id": 1, "type": "User", "name": "The Octocat",
                           "bio": f"you sent {auth}", "public_repos": 8})
    if seen.method == "GET" and path == "/repos/sealgate/renamed":
        # What GitHub answers for a renamed repository: 301 to its id, absolute.
        location = f"https://{seen.headers['host']}/repositories/42"
        return Reply(301, {"message": "Moved Permanently", "url": location},
                     headers={"Location": location})
    if seen.method == "GET" and path == "/repositories/42":
        return Reply(body={"id": 42, "name": "proxy", "full_name": "sealgate/proxy",
                           "description": f"you sent {auth}", "private": False,
                           "owner": {"login": "sealgate", "id": 1, "type": "Organization"}})
    if seen.method == "GET" and path.startswith("/repos/"):
        owner, name = path.split("/")[2:4]
        return Reply(body={"id": 2, "name": name, "full_name": f"{owner}/{name}",
                           "description": f"you sent {auth}", "private": False,
                           "owner": {"login": owner, "id": 1, "type": "Organization"}})
    return Reply(404, {"message": "Not Found"})


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
      ) -> Iterator[World]:
    directory: Path = tmp_path_factory.mktemp("sdk-github")
    with world(directory, test_ca, dns, [HOST, BLOCKED], route, rules, KEYS, SECRET) as made:
        yield made


@pytest.fixture(autouse=True)
def _fresh(w: World) -> None:
    w.fake.reset()


USER = """
def main(base_url, token=None):
    import github
    auth = github.Auth.Token(token) if token else None
    gh = github.Github(auth=auth, base_url=base_url, retry=None, timeout=15)
    user = gh.get_user("octocat")
    return {"login": user.login, "bio": user.bio, "repos": user.public_repos}
"""

REPO = """
def main(base_url, full_name, token=None):
    import github
    auth = github.Auth.Token(token) if token else None
    gh = github.Github(auth=auth, base_url=base_url, retry=None, timeout=15)
    repo = gh.get_repo(full_name)
    return {"full_name": repo.full_name, "description": repo.description}
"""


def clean(seen: Arrived) -> None:
    for name in PROXY_HEADERS:
        assert not seen.values(name), (name, seen.fields)


def test_plain_request_arrives_as_sent(w: World) -> None:
    got = w.run(USER, w.env("plain-1"), base_url=w.url(), token="ghp_dummy_plain").ok()
    assert got == {"login": "octocat", "bio": "you sent token ghp_dummy_plain", "repos": 8}
    seen = w.fake.last()
    assert (seen.method, seen.path) == ("GET", "/users/octocat")
    assert seen.headers["authorization"] == "token ghp_dummy_plain"
    assert seen.headers["user-agent"] == "PyGithub/Python"
    assert seen.headers["host"] == w.authority
    clean(seen)
    assert (len(w.fake.requests), w.fake.connections) == (1, 1)


def test_broker_replaces_the_placeholder_and_masks_the_echo(w: World) -> None:
    got = w.run(REPO, w.env("broker-1"), base_url=w.url(), full_name="sealgate/proxy",
                     token=PLACEHOLDER).ok()
    seen = w.fake.last()
    assert seen.path == "/repos/sealgate/proxy"
    assert seen.headers["authorization"] == f"token {SECRET}"
    clean(seen)
    assert got == {"full_name": "sealgate/proxy",
                   "description": f"you sent token {masked(SECRET)}"}


def test_refused_request_shows_the_reason_in_the_sdk_exception(w: World) -> None:
    out = w.run(REPO, w.env("plain-1"), base_url=w.url(), full_name="someone/else")
    assert out.exception == "github.GithubException.GithubException", out.detail
    print(out.text)
    assert out.text.startswith("403 ")
    refusal_visible(out.text, "not_allowed")
    assert w.fake.untouched()


def test_refused_host_shows_the_reason_in_the_sdk_exception(w: World) -> None:
    out = w.run(USER, w.env("plain-1"), base_url=w.url(host=BLOCKED))
    assert out.exception == "github.GithubException.GithubException", out.detail
    print(out.text)
    refusal_visible(out.raised(), "not_allowed")
    assert BLOCKED in out.text
    assert w.fake.untouched()


def test_renamed_repository_redirect_is_followed(w: World) -> None:
    """PyGithub follows a 301 itself, only to the same scheme, host and port."""
    got = w.run(REPO, w.env("broker-1"), base_url=w.url(), full_name="sealgate/renamed",
                token=PLACEHOLDER).ok()
    assert got == {"full_name": "sealgate/proxy",
                   "description": f"you sent token {masked(SECRET)}"}
    assert [r.path for r in w.fake.requests] == ["/repos/sealgate/renamed", "/repositories/42"]
    assert [r.headers["authorization"] for r in w.fake.requests] == [f"token {SECRET}"] * 2


def test_renamed_repository_redirect_is_followed_in_base_url_mode(w: World) -> None:
    """The proxy points the upstream's Location back through itself. PyGithub compares the
    Location's scheme, host and port with its base URL's, so that Location must be absolute
    on the proxy (`http://<proxy>/_/...`); a relative `/_/...` makes PyGithub raise
    "redirected from http protocol to , please correct your Github server URL"."""
    token = w.mint(BearerProcessor())
    got = w.run(REPO, {}, base_url=w.base_url(tokens=[token]),
                full_name="sealgate/renamed").ok()
    assert got["description"] == f"you sent Bearer {masked(SECRET)}"
    assert [r.path for r in w.fake.requests] == ["/repos/sealgate/renamed", "/repositories/42"]
    assert [r.headers["authorization"] for r in w.fake.requests] == [f"Bearer {SECRET}"] * 2


def test_base_url_mode_needs_no_proxy_and_no_ca(w: World) -> None:
    got = w.run(USER, {}, base_url=w.base_url(), token="ghp_dummy_base").ok()
    assert got["bio"] == "you sent token ghp_dummy_base"
    seen = w.fake.last()
    assert (seen.path, seen.headers["host"]) == ("/users/octocat", w.authority)
    clean(seen)


def test_token_in_the_base_url(w: World) -> None:
    token = w.mint(BearerProcessor())
    got = w.run(REPO, {}, base_url=w.base_url(tokens=[token]), full_name="sealgate/x").ok()
    assert w.fake.last().headers["authorization"] == f"Bearer {SECRET}"
    assert got["description"] == f"you sent Bearer {masked(SECRET)}"


def test_connection_scoped_token_in_the_proxy_credentials(w: World) -> None:
    token = w.mint(BearerProcessor())
    env = w.env("tokens-1", key=f"{KEYS['tokens-1']},{token}")
    got = w.run(USER, env, base_url=w.url()).ok()  # no auth at all in the SDK
    seen = w.fake.last()
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    clean(seen)
    assert SECRET not in json.dumps(got)
    assert got["bio"] == f"you sent Bearer {masked(SECRET)}"
