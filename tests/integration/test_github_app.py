"""github-app, the CodeRabbit case: a review bot's sandbox runs PyGithub with no token at all;
the proxy holds the app's id and private key, signs the app JWT, exchanges it for an
installation token (narrowed to the rule's repositories and permissions) at the fake GitHub,
which verifies the JWT with the app's public key, and injects `Authorization: token`. Or the
app's key comes sealed in a token the sandbox carries in its proxy credentials (PyGithub itself
unchanged), exchanged where the sandbox's policy lets it POST to the installation's endpoint."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sealgate.credentials.processors import GitHubAppProcessor
from tests.dnsstub import StubDNS
from tests.harness import OriginCA
from tests.oauthfake import GitHubFake, rsa_key
from tests.sdk.kit import World, masked, policy, rules_file, world
from tests.sdk.kit import rule as allowing

pytest.importorskip("github", reason="PyGithub is not installed (pip install -e '.[test]')")

HOST = "api.github.com"
APP_ID, INSTALLATION = "314159", "2718"
KEYS = {"bot-1": "github-app-key-bot-1", "bot-2": "github-app-key-bot-2",
        "bot-3": "github-app-key-bot-3"}
KEY, PEM = rsa_key()


def rules(port: int) -> str:
    def rule(path: str, secret: str, extra: str = "") -> str:
        return (f"      - host: {HOST}\n        ports: [{port}]\n"
                f"        paths: [\"{path}\"]\n        inject:\n"
                f"          - secret: file:{secret}\n"
                f"            as: {{type: github-app, installation_id: \"{INSTALLATION}\", "
                f"api: \"https://{HOST}:{port}\"{extra}}}\n")

    allow = (rule("/repos/acme/**", "gh_app", ", repositories: [widgets], "
                  'permissions: ["contents:read", "pull_requests:write"]')
             + rule("/repos/other/**", "gh_wrong"))
    sealed = policy("sealed", allowing(HOST, [port], paths=["/repos/acme/**"]),
                    allowing(HOST, [port], methods=["POST"],
                             paths=[f"/app/installations/{INSTALLATION}/access_tokens"]),
                    tokens=True)
    # bot-3's policy reads the repositories but may not POST for an installation token.
    narrow = policy("narrow", allowing(HOST, [port], paths=["/repos/acme/**"]), tokens=True)
    return rules_file([f"  bot:\n    allow:\n{allow}    allow_networks: [127.0.0.1/32]\n",
                       sealed, narrow],
                      {"bot-1": ("bot", KEYS["bot-1"]), "bot-2": ("sealed", KEYS["bot-2"]),
                       "bot-3": ("narrow", KEYS["bot-3"])},
                      default=None)


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
      ) -> Iterator[World]:
    directory: Path = tmp_path_factory.mktemp("github-app")
    fake = GitHubFake(APP_ID, KEY.public_key(), INSTALLATION)
    _, other = rsa_key()  # a key GitHub does not know for this app
    with world(directory, test_ca, dns, [HOST], fake, rules, KEYS, "unused") as made:
        (directory / "secrets.yaml").write_text(yaml.safe_dump({
            "gh_app": json.dumps({"app_id": APP_ID, "private_key": PEM}),
            "gh_wrong": json.dumps({"app_id": APP_ID, "private_key": other}),
        }))
        made.github = fake  # type: ignore[attr-defined]
        yield made
    logged = made.proxy.audit_text() + made.proxy.stderr()
    assert PEM.splitlines()[5] not in logged
    for token in fake.tokens:
        assert token not in logged


def _fake(w: World) -> GitHubFake:
    fake: GitHubFake = w.github  # type: ignore[attr-defined]
    return fake


@pytest.fixture(autouse=True)
def _fresh(w: World) -> None:
    _fake(w).skew = 0.0
    _fake(w).reset_counts()
    w.fake.reset()


REPO = """
def main(base, name):
    import github
    g = github.Github(base_url=base, retry=None)
    try:
        repo = g.get_repo(name)
        return [repo.full_name, repo.private, repo.description]
    except github.GithubException as exc:
        return [exc.status, exc.headers.get("x-sealgate-error"), str(exc.data)]
"""


def test_pygithub_reads_a_repository_with_a_token_it_never_holds(w: World) -> None:
    fake = _fake(w)
    fake.skew = -30.0  # GitHub's clock half a minute behind ours: iat is 60 s back
    env = w.env("bot-1")
    assert not [v for v in env.values() if "BEGIN" in v or "ghs_" in v]
    for _ in range(2):
        name, private, description = w.run(REPO, env, base=w.url(), name="acme/widgets").ok()
        assert (name, private) == ("acme/widgets", True)
    assert fake.calls == 1  # one installation token for both
    (asked,) = fake.asked[-1:]
    assert asked == {"repositories": ["widgets"],
                     "permissions": {"contents": "read", "pull_requests": "write"}}
    (repo_read, *_) = [r for r in w.fake.requests if r.path == "/repos/acme/widgets"]
    token = repo_read.headers["authorization"].removeprefix("token ")
    assert token.startswith("ghs_") and token in fake.tokens
    assert description == f"seen with token {masked(token)}"  # GitHub's echo, masked


def test_a_key_github_does_not_know_fails_closed(w: World) -> None:
    status, reason, data = w.run(REPO, w.env("bot-1"), base=w.url(), name="other/x").ok()
    assert (status, reason) == (503, "secret_unavailable")
    assert "github-app token endpoint answered 401" in data
    assert not [r for r in w.fake.requests if r.path.startswith("/repos/")]


def test_the_apps_key_sealed_in_a_token_pygithub_unchanged(w: World) -> None:
    fake = _fake(w)
    token = w.mint(GitHubAppProcessor(INSTALLATION, api=f"https://{HOST}:{w.fake.port}",
                                      repositories="widgets"),
                   host=HOST, secret=json.dumps({"app_id": APP_ID, "private_key": PEM}))
    env = w.env("bot-2", key=f"{KEYS['bot-2']},{token}")
    assert not [v for v in env.values() if "BEGIN" in v]
    name, private, _ = w.run(REPO, env, base=w.url(), name="acme/widgets").ok()
    assert (name, private) == ("acme/widgets", True)
    assert fake.calls == 1 and fake.asked[-1] == {"repositories": ["widgets"]}
    (repo_read,) = [r for r in w.fake.requests if r.path == "/repos/acme/widgets"]
    assert repo_read.headers["authorization"].removeprefix("token ") in fake.tokens


def test_a_sealed_app_key_is_not_exchanged_where_the_policy_does_not_allow_it(w: World) -> None:
    fake = _fake(w)
    token = w.mint(GitHubAppProcessor(INSTALLATION, api=f"https://{HOST}:{w.fake.port}"),
                   host=HOST, secret=json.dumps({"app_id": APP_ID, "private_key": PEM}))
    status, reason, data = w.run(REPO, w.env("bot-3", key=f"{KEYS['bot-3']},{token}"),
                                 base=w.url(), name="acme/widgets").ok()
    assert (status, reason) == (403, "not_allowed"), data
    assert "a token's github-app endpoint" in data
    assert fake.calls == 0 and not w.fake.requests
