"""The cloud and OAuth credentials of issue #15, inside real sandboxes (`sealgate sandbox run`,
bubblewrap): boto3 with only the placeholder keys, PyGithub with no token, a plain OAuth2 client
with nothing, each in a sandbox whose only way out is the proxy. The proxy re-signs (aws-sigv4),
exchanges an app JWT (github-app) or a refresh token (oauth2) and injects; one fake on loopback
answers for AWS, GitHub and the OAuth2 provider and accepts only correctly signed or issued
credentials. The real ones are in the proxy's file store, never in the sandbox, its workspace,
its environment, the proxy's log or any answer."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.dnsstub import StubDNS
from tests.harness import ROOT, SEALGATE, OriginCA, Proxy, key_digest, sandbox_gateway
from tests.sdk.kit import Arrived, FakeAPI, Reply

pytest.importorskip("boto3", reason="boto3 is not installed (pip install -e '.[test]')")
pytest.importorskip("github", reason="PyGithub is not installed (pip install -e '.[test]')")

from botocore.credentials import Credentials

from sealgate.credentials.processors import AWS_PLACEHOLDER_KEY_ID, AWS_PLACEHOLDER_SECRET
from tests.awsfake import AwsFake
from tests.oauthfake import GitHubFake, OAuthFake, rsa_key

pytestmark = pytest.mark.root

RANGE, GATEWAY = "10.219.0.0/16", "10.219.255.254"
PLAN = ["--range", RANGE, "--gateway", GATEWAY]
S3, GITHUB, API, AUTH = ("s3.us-east-1.amazonaws.com", "api.github.com", "api.example.com",
                         "auth.example.com")
REAL = Credentials("AKIASANDBOXCANARY042", "CANARY/sandbox+aws/secret0123456789abcdEF", None)
APP_ID, INSTALLATION = "271828", "31415"
KEY, PEM = rsa_key()
CLIENT_ID, CLIENT_SECRET = "sandbox-ci", "CANARY-sandbox-client-secret-9876543210"
REFRESH = "CANARY-sandbox-refresh-token-0123456789"
CANARIES = (REAL.secret_key, REAL.access_key, CLIENT_SECRET, REFRESH, PEM.splitlines()[5])


class ByHost:
    """One fake origin for three services, told apart by the Host the proxy forwarded."""

    def __init__(self) -> None:
        self.aws = AwsFake(REAL)
        self.github = GitHubFake(APP_ID, KEY.public_key(), INSTALLATION)
        self.oauth = OAuthFake(client_id=CLIENT_ID, client_secret=CLIENT_SECRET,
                               refresh_token=REFRESH)

    def __call__(self, seen: Arrived) -> Reply:
        host = seen.headers.get("host", "").rpartition(":")[0]
        route = {S3: self.aws, GITHUB: self.github}.get(host, self.oauth)
        return route(seen)


@pytest.fixture(scope="module")
def gateway() -> Iterator[None]:
    with sandbox_gateway(PLAN, "/usr/bin/python3"):
        yield


@pytest.fixture(scope="module")
def world(gateway: None, tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA,
          dns: StubDNS) -> Iterator[tuple[Proxy, ByHost, FakeAPI]]:
    directory = tmp_path_factory.mktemp("sandbox-credentials")
    route = ByHost()
    fake = FakeAPI(test_ca, [S3, GITHUB, API, AUTH], route)
    for name in (S3, GITHUB, API, AUTH):
        dns.set(name, "A 127.0.0.1")
    port = fake.port
    secrets = directory / "secrets.yaml"
    secrets.write_text(yaml.safe_dump({
        "aws": json.dumps({"access_key_id": REAL.access_key,
                           "secret_access_key": REAL.secret_key}),
        "gh_app": json.dumps({"app_id": APP_ID, "private_key": PEM}),
        "oauth": json.dumps({"refresh_token": REFRESH, "client_id": CLIENT_ID,
                             "client_secret": CLIENT_SECRET}),
    }))
    secrets.chmod(0o600)
    rules = f"""
version: 1
policies:
  box:
    allow:
      - host: {S3}
        ports: [{port}]
        inject:
          - secret: file:aws
            as: {{type: aws-sigv4, services: [s3], regions: [us-east-1]}}
      - host: {GITHUB}
        ports: [{port}]
        paths: ["/repos/acme/**"]
        inject:
          - secret: file:gh_app
            as: {{type: github-app, installation_id: "{INSTALLATION}",
                  api: "https://{GITHUB}:{port}", repositories: [widgets]}}
            name: github
      - host: {API}
        ports: [{port}]
        paths: ["/v1/**"]
        inject:
          - secret: file:oauth
            as: {{type: oauth2, token_url: "https://{AUTH}:{port}/token"}}
            name: api
    allow_networks: [127.0.0.1/32]
    # The same credentials as tools (#29): the MCP server exchanges and injects them.
    tools:
      - name: widgets
        description: The widgets repository.
        method: GET
        url: https://{GITHUB}:{port}/repos/acme/widgets
        credential: github
      - name: me
        description: Who the API says we are.
        method: GET
        url: https://{API}:{port}/v1/me
        credential: api
sandboxes:
  box-1: {{policy: box, key_sha256: "{key_digest('never-used-credentials-key')}"}}
"""
    try:
        p = Proxy(directory, rules, resolver=dns.address, upstream_ca=test_ca.path,
                  listen_host=GATEWAY, transparent_host=GATEWAY,
                  extra_args=["--secret-store", f"file:{secrets}"])
    except BaseException:
        fake.stop()
        raise
    yield p, route, fake
    p.stop()
    fake.stop()
    logged = p.audit_text() + p.stderr()
    assert not [c for c in CANARIES if c in logged]


@pytest.fixture(scope="module")
def workspace() -> Iterator[Path]:
    """boto3, PyGithub and requests with what they import, copied from the test environment
    (the sandbox sees the host's /usr only, and its python3 is the same minor version)."""
    found = subprocess.run(
        [sys.executable, "-c", "import sys, boto3, github, requests, site\n"
         "roots = site.getsitepackages()\n"
         "for m in list(sys.modules.values()):\n"
         "    f = getattr(m, '__file__', None) or ''\n"
         "    for r in roots:\n"
         "        if f.startswith(r + '/'):\n"
         "            print(r, f[len(r) + 1:].split('/')[0])\n"],
        capture_output=True, text=True, check=True, timeout=60).stdout
    root = Path(tempfile.mkdtemp(prefix="sealgate-credentials-ws-"))
    try:
        root.chmod(0o755)
        lib = root / "lib"
        lib.mkdir()
        for line in sorted(set(found.split("\n")) - {""}):
            site, name = line.split(" ", 1)
            source = Path(site) / name
            if source.is_dir():
                shutil.copytree(source, lib / name, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__"))
            elif source.is_file():
                shutil.copy2(source, lib / name)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def in_sandbox(p: Proxy, workspace: Path, script: str, *env: str) -> dict[str, object]:
    (workspace / "main.py").write_text(script)
    done = subprocess.run(
        [*SEALGATE, "sandbox", "run", *PLAN, "--sandbox", "box-1", "--state", str(p.state),
         "--proxy-port", str(p.port), "--transparent-port", str(p.transparent_port),
         "--workspace", str(workspace), *(f"--env={e}" for e in env), "--",
         "env", "PYTHONPATH=/workspace/lib", "python3", "/workspace/main.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    for canary in CANARIES:
        assert canary not in done.stdout + done.stderr
    answer: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


ENV_DUMP = "import json, os\nenv = dict(os.environ)\n"


def test_boto3_with_the_placeholder_keys_only(
    world: tuple[Proxy, ByHost, FakeAPI], workspace: Path
) -> None:
    p, route, fake = world
    port = fake.port
    answer = in_sandbox(p, workspace, ENV_DUMP + f"""
import boto3, botocore.config
s3 = boto3.client("s3", endpoint_url="https://{S3}:{port}", region_name="us-east-1",
                  config=botocore.config.Config(s3={{"addressing_style": "path"}},
                                                retries={{"max_attempts": 1}}))
s3.put_object(Bucket="bkt", Key="from-the-sandbox.txt", Body=b"signed by the proxy")
got = s3.get_object(Bucket="bkt", Key="from-the-sandbox.txt")["Body"].read().decode()
print(json.dumps({{"got": got, "env": env}}))
""", f"AWS_ACCESS_KEY_ID={AWS_PLACEHOLDER_KEY_ID}",
        f"AWS_SECRET_ACCESS_KEY={AWS_PLACEHOLDER_SECRET}", "AWS_EC2_METADATA_DISABLED=true",
        "AWS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt")
    assert answer["got"] == "signed by the proxy"
    # The fake checked both signatures with the real keys; the sandbox held the placeholder.
    assert route.aws.verified[-2:] == ["s3 PUT /bkt/from-the-sandbox.txt",
                                       "s3 GET /bkt/from-the-sandbox.txt"]
    assert json.dumps(answer["env"]).count(AWS_PLACEHOLDER_KEY_ID) == 1


def test_pygithub_with_no_token(world: tuple[Proxy, ByHost, FakeAPI], workspace: Path) -> None:
    p, route, fake = world
    answer = in_sandbox(p, workspace, ENV_DUMP + f"""
import github
g = github.Github(base_url="https://{GITHUB}:{fake.port}", retry=None)
repo = g.get_repo("acme/widgets")
print(json.dumps({{"repo": repo.full_name, "private": repo.private, "env": env}}))
""")
    assert (answer["repo"], answer["private"]) == ("acme/widgets", True)
    assert route.github.asked[-1]["repositories"] == ["widgets"]
    assert not [v for v in answer["env"].values() if "ghs_" in v]  # type: ignore[union-attr]


def test_an_oauth2_client_with_nothing(
    world: tuple[Proxy, ByHost, FakeAPI], workspace: Path
) -> None:
    p, route, fake = world
    answer = in_sandbox(p, workspace, ENV_DUMP + f"""
import requests
r = requests.get("https://{API}:{fake.port}/v1/me", timeout=30)
print(json.dumps({{"status": r.status_code, "body": r.json(), "env": env}}))
""")
    assert answer["status"] == 200
    # The API echoed the Authorization it got: an access token the proxy obtained, masked
    # on its way back into the sandbox.
    sent = answer["body"]["you_sent"]  # type: ignore[index]
    assert sent.startswith("Bearer ") and "at-" not in sent
    assert [g["grant_type"] for g in route.oauth.grants] == ["refresh_token"]


@pytest.fixture(scope="module")
def mcp_port(world: tuple[Proxy, ByHost, FakeAPI], dns: StubDNS, test_ca: OriginCA
             ) -> Iterator[int]:
    """`sealgate mcp serve` on the gateway with the proxy's rules, state and secret store."""
    from tests.harness import end, free_port
    from tests.mcpkit import MCP_PYTHON

    if not MCP_PYTHON.exists():
        pytest.skip("no var/mcp-venv: run `make deps`")
    p, _, _ = world
    port = free_port()
    log = p.workdir / "mcp.stderr"
    with log.open("wb") as err:
        server = subprocess.Popen(
            [*SEALGATE, "mcp", "serve", "--listen", f"{GATEWAY}:{port}", "--rules",
             str(p.workdir / "rules.yaml"), "--state", str(p.state), "--resolver",
             f"{dns.address[0]}:{dns.address[1]}", "--upstream-ca", str(test_ca.path),
             "--secret-store", f"file:{p.workdir / 'secrets.yaml'}", "--audit-log",
             str(p.workdir / "mcp-audit.log")], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 30
        while "sealgate mcp ready" not in log.read_text(errors="replace"):
            assert server.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        yield port
    finally:
        end(server)
        logged = log.read_text(errors="replace") + (p.workdir / "mcp-audit.log").read_text()
        assert not [c for c in CANARIES if c in logged]


@pytest.fixture(scope="module")
def mcp_workspace() -> Iterator[Path]:
    """The official MCP client and the SDK files it loads, from the MCP virtualenv (the same
    minor version as the host's python3, which the sandbox runs): tests/mcpsandbox.py."""
    from tests.mcpsandbox import sdk_tree

    root = Path(tempfile.mkdtemp(prefix="sealgate-mcp-ws-"))
    try:
        root.chmod(0o755)
        sdk_tree(root)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_an_agent_with_the_mcp_sdk_calls_tools_holding_nothing(
    world: tuple[Proxy, ByHost, FakeAPI], mcp_port: int, mcp_workspace: Path
) -> None:
    """The official MCP client in a sandbox, told nothing but SEALGATE_MCP_URL (by the
    runtime), calls two tools whose credentials are exchanged by the MCP server (a GitHub
    App's installation token; an OAuth2 access token from a refresh token): the API got them,
    the sandbox never did, and the API's echo of one comes back masked."""
    p, route, _ = world
    (mcp_workspace / "main.py").write_text(
        "import json, os, sys\nimport anyio\nimport mcpclient\n"
        "plan = {'url': os.environ['SEALGATE_MCP_URL'], 'steps': [{'list': True}, "
        "{'call': 'widgets'}, {'call': 'me'}]}\n"
        "print(json.dumps({'answer': anyio.run(mcpclient.run, plan), 'env': dict(os.environ)}))\n")
    done = subprocess.run(
        [*SEALGATE, "sandbox", "run", *PLAN, "--sandbox", "box-1", "--state", str(p.state),
         "--proxy-port", str(p.port), "--mcp-port", str(mcp_port), "--workspace",
         str(mcp_workspace), "--", "env", "PYTHONPATH=/workspace", "python3",
         "/workspace/main.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    for canary in CANARIES:
        assert canary not in done.stdout + done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    listed, widgets, me = out["answer"]["steps"]
    assert sorted(t["name"] for t in listed["tools"]) == ["me", "widgets"], listed
    assert widgets["result"]["is_error"] is False, widgets
    assert '"full_name": "acme/widgets"' in widgets["result"]["text"].replace('":"', '": "')
    assert route.github.asked[-1]["repositories"] == ["widgets"]
    assert me["result"]["is_error"] is False, me
    sent = json.loads(me["result"]["text"])["you_sent"]
    assert sent.startswith("Bearer ") and "at-" not in sent, sent  # masked on its way back
    env = out["env"]
    assert env["SEALGATE_MCP_URL"] == f"http://{GATEWAY}:{mcp_port}/mcp"
    assert not [v for v in env.values() if "ghs_" in v or "at-" in v]
