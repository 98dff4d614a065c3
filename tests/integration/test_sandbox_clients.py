"""Clients that ignore the proxy variables or pin their own CA, inside a real sandbox: base-URL
mode with nothing but the environment the sandbox runtime gives (`SEALGATE_BASE_URL`).

Node 20's fetch ignores HTTPS_PROXY and stripe trusts only its own bundled CA file: through
base-URL mode both work unchanged, identified by the sandbox's address, the credential brokered
by the proxy and TLS verified upstream; Node's fetch of an https URL works through transparent
capture (it trusts NODE_EXTRA_CA_CERTS), and stripe's does not (the certificate error is why
base-URL mode exists).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dnsstub import StubDNS
from tests.harness import (
    ROOT,
    SEALGATE,
    Origin,
    OriginCA,
    Proxy,
    key_digest,
    sandbox_gateway,
    secret_store,
)
from tests.integration.tiers import ENV as TIER_ENV
from tests.integration.tiers import TIERS

pytestmark = pytest.mark.root

RANGE, GATEWAY = "10.217.0.0/16", "10.217.255.254"
PLAN = ["--range", RANGE, "--gateway", GATEWAY]
SECRET = "sk_live_sandbox_clients_canary_77b1"
CUSTOMER = b'{"id": "cus_1", "object": "customer", "email": "a@example.test"}'
# stripe and what it imports, copied from the test environment into the sandbox's workspace
# (pure Python, or built for this CPython minor, which the sandbox's python3 shares).
STRIPE_PACKAGES = ("stripe", "requests", "urllib3", "idna", "certifi", "charset_normalizer",
                   "typing_extensions.py")


@pytest.fixture(scope="module")
def gateway() -> Iterator[None]:
    with sandbox_gateway(PLAN, "/usr/bin/python3", "/usr/bin/node"):
        yield


@pytest.fixture(scope="module")
def api(test_ca: OriginCA) -> Iterator[Origin]:
    origin = Origin(tls=test_ca.issue("api.test"))
    yield origin
    origin.stop()


@pytest.fixture(scope="module")
def cproxy(
    gateway: None, tmp_path_factory: pytest.TempPathFactory, api: Origin, dns: StubDNS,
    test_ca: OriginCA,
) -> Iterator[Proxy]:
    directory = tmp_path_factory.mktemp("sandbox-clients")
    rules = f"""
version: 1
policies:
  box:
    allow:
      - host: api.test
        ports: [{api.port}]
        paths: ["/v1/**"]
        inject:
          - secret: file:stripe
            as: bearer
      - host: api.test
        ports: [{api.port}]
        methods: [GET]
    allow_networks: [127.0.0.1/32]
sandboxes:
  box-1: {{policy: box, key_sha256: "{key_digest('never-used-box-key')}"}}
"""
    p = Proxy(directory, rules, resolver=dns.address, upstream_ca=test_ca.path,
              listen_host=GATEWAY, transparent_host=GATEWAY,
              extra_args=secret_store(directory, stripe=SECRET))
    yield p
    p.stop()
    assert SECRET not in p.audit_text() + p.stderr()


@pytest.fixture(scope="module")
def workspace() -> Iterator[Path]:
    stripe = pytest.importorskip("stripe")
    site = Path(stripe.__file__).resolve().parent.parent
    # Not under pytest's 0700 temporary directory: the sandbox runs as nobody.
    root = Path(tempfile.mkdtemp(prefix="sealgate-clients-ws-"))
    try:
        root.chmod(0o755)
        lib = root / "lib"
        lib.mkdir()
        for name in STRIPE_PACKAGES:
            source = site / name
            if source.is_dir():
                shutil.copytree(source, lib / name, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, lib / name)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture()
def fresh(api: Origin) -> Origin:
    api.reset()
    api.response_body = CUSTOMER
    api.response_headers["Content-Type"] = "application/json"
    return api


def run(
    p: Proxy, workspace: Path | None, *command: str, tier: str = "bwrap"
) -> subprocess.CompletedProcess[str]:
    ws = ["--workspace", str(workspace)] if workspace is not None else []
    return subprocess.run(
        [*SEALGATE, "sandbox", "run", *PLAN, "--sandbox", "box-1", "--state", str(p.state),
         "--proxy-port", str(p.port), "--transparent-port", str(p.transparent_port), *ws,
         "--isolation", tier, "--", *command],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **TIER_ENV},
    )


@pytest.mark.parametrize("tier", TIERS)
def test_node_fetch_through_base_url_mode(cproxy: Proxy, fresh: Origin, tier: str) -> None:
    api = fresh
    script = (f"const r = await fetch(process.env.SEALGATE_BASE_URL + 'api.test:{api.port}"
              "/v1/customers/cus_1', {headers: {authorization: 'Bearer sk_placeholder'}});"
              "console.log(r.status, JSON.stringify(await r.json()))")
    done = run(cproxy, None, "node", "--input-type=module", "-e", script, tier=tier)
    assert done.returncode == 0, done.stderr
    status, _, body = done.stdout.strip().partition(" ")
    assert (status, json.loads(body)["id"]) == ("200", "cus_1")
    (seen,) = api.requests
    assert seen.path == "/v1/customers/cus_1"
    assert seen.values("authorization") == [f"Bearer {SECRET}"]
    line = cproxy.wait_audit(lambda e: e.get("event") == "request" and e.get("base_url"))
    assert (line["sandbox"], line["identified_by"], line["decision"]) == ("box-1", "source",
                                                                          "allow")


@pytest.mark.parametrize("tier", TIERS)
def test_node_fetch_of_an_https_url_goes_through_transparent_capture(
    cproxy: Proxy, fresh: Origin, tier: str
) -> None:
    api = fresh
    script = (f"const r = await fetch('https://api.test:{api.port}/plain');"
              "console.log(r.status)")
    done = run(cproxy, None, "node", "--input-type=module", "-e", script, tier=tier)
    assert (done.returncode, done.stdout.strip()) == (0, "200"), done.stderr
    assert [s.path for s in api.requests] == ["/plain"]


STRIPE_CALL = """
import os, stripe
stripe.api_key = "sk_test_placeholder"
{setup}
try:
    customer = stripe.Customer.retrieve("cus_1")
    print("ok", customer.id, customer.email)
except Exception as exc:
    print("error", type(exc).__name__, exc)
"""


@pytest.mark.parametrize("tier", TIERS)
def test_stripe_unchanged_through_base_url_mode(
    cproxy: Proxy, fresh: Origin, workspace: Path, tier: str
) -> None:
    api = fresh
    setup = f"stripe.api_base = os.environ['SEALGATE_BASE_URL'] + 'api.test:{api.port}'"
    done = run(cproxy, workspace, "env", "PYTHONPATH=/workspace/lib", "python3", "-c",
               STRIPE_CALL.format(setup=setup), tier=tier)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "cus_1", "a@example.test"], done.stdout
    (seen,) = api.requests
    assert seen.path == "/v1/customers/cus_1"
    assert seen.values("authorization") == [f"Bearer {SECRET}"]


def test_stripe_through_interception_fails_on_its_own_ca(
    cproxy: Proxy, fresh: Origin, workspace: Path
) -> None:
    """Why base-URL mode: stripe passes its bundled CA file to requests, so the proxy's CA,
    which every other client in the sandbox trusts, is not trusted by stripe."""
    api = fresh
    setup = f"stripe.api_base = 'https://api.test:{api.port}'"
    done = run(cproxy, workspace, "env", "PYTHONPATH=/workspace/lib", "python3", "-c",
               STRIPE_CALL.format(setup=setup))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("error APIConnectionError"), done.stdout
    assert "CERTIFICATE_VERIFY_FAILED" in done.stdout or "certificate" in done.stdout.lower()
    assert not api.requests
