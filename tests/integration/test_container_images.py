"""The proxy's and the issuer's container images (docker/Dockerfile, built by `make images` with
podman) started as containers, as an operator would, and used for real: a request through the
containerised proxy arrives at an origin with the brokered secret the client never sees, and
the containerised issuer mints a token the proxy's key opens. Both run as uid 10001 with no
capability. Skipped, saying why, where `make images` could not build them (no podman)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from sealgate import credentials as tk
from sealgate.credentials import keys
from sealgate.credentials.keys import generate
from tests.conftest import KEYS
from tests.dnsstub import StubDNS
from tests.harness import ROOT, Origin, OriginCA, free_port, key_digest, log_lines, quiet

CONTEXT = ROOT / "var" / "image-context"
PROXY, ISSUER = "localhost/sealgate-proxy:dev", "localhost/sealgate-issuer:dev"
CANARY = "sk_live_CONTAINER_CANARY_51a0c2"
CALLER_KEY = "container-caller-key-CANARY-77d1"
UID = 10001  # the images' user (docker/Dockerfile)
PODMAN = ["podman", "--runtime", "runc"]
RUN = [*PODMAN, "run", "--rm", "-d", "--network", "host", "--ulimit", "nofile=1024:1024",
       "--ulimit", "nproc=1024:1024", "--cap-drop", "ALL", "--security-opt",
       "no-new-privileges", "--read-only"]


def _built() -> None:
    why = CONTEXT / "why"
    if shutil.which("podman") is None:
        pytest.skip("no podman (Debian: podman, runc): `make images` builds nothing")
    if why.exists():
        pytest.skip(f"no container images: {why.read_text().strip()[:300]}")
    for image in (PROXY, ISSUER):
        if subprocess.run(["podman", "image", "exists", image], check=False).returncode != 0:
            pytest.skip(f"no {image}: run `make images`")


class Container:
    def __init__(self, *argv: str) -> None:
        done = subprocess.run([*RUN, *argv], capture_output=True, text=True, timeout=120,
                              check=False)
        assert done.returncode == 0, done.stderr
        self.id = done.stdout.strip()

    def logs(self) -> str:
        done = subprocess.run(["podman", "logs", self.id], capture_output=True, text=True,
                              timeout=60, check=False)
        return done.stdout + done.stderr

    def inspect(self, template: str) -> str:
        return subprocess.run(["podman", "inspect", "--format", template, self.id],
                              capture_output=True, text=True, timeout=60,
                              check=True).stdout.strip()

    def stop(self) -> str:
        text = self.logs()
        subprocess.run(["podman", "stop", "-t", "10", self.id], capture_output=True,
                       timeout=60, check=False)
        return text


@pytest.fixture
def containers() -> Iterator[list[Container]]:
    _built()
    made: list[Container] = []
    yield made
    for container in made:
        container.stop()


def _until_ready(url: str, container: Container, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if requests.get(url, timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        assert time.monotonic() < deadline, container.logs()[-3000:]
        time.sleep(0.2)


def _owned(path: Path, mode: int) -> Path:
    os.chown(path, UID, UID)
    path.chmod(mode)
    return path


def test_the_proxy_image_brokers_a_secret(
    tmp_path: Path, containers: list[Container], dns: StubDNS, test_ca: OriginCA,
    origin_https: Origin,
) -> None:
    port, admin = free_port(), free_port()
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "rules.yaml").write_text(f"""
version: 1
policies:
  ci:
    allow:
      - host: api.test
        ports: [{origin_https.port}]
        inject:
          - secret: file:api_key
            as: bearer
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
""")
    _owned(etc / "rules.yaml", 0o644)
    (etc / "secrets.yaml").write_text(f"api_key: {CANARY}\n")
    _owned(etc / "secrets.yaml", 0o600)
    shutil.copy(test_ca.path, etc / "origin-ca.pem")
    state = tmp_path / "state"
    state.mkdir()
    _owned(state, 0o700)
    host, resolver = dns.address
    proxy = Container(
        "-v", f"{etc}:/etc/sealgate:ro", "-v", f"{state}:/var/lib/sealgate",
        "-e", f"SEALGATE_HEALTHZ=http://127.0.0.1:{admin}/healthz", PROXY,
        "proxy", "--listen", f"127.0.0.1:{port}", "--admin", f"127.0.0.1:{admin}",
        "--rules", "/etc/sealgate/rules.yaml", "--secret-store", "file:/etc/sealgate/secrets.yaml",
        "--resolver", f"{host}:{resolver}", "--upstream-ca", "/etc/sealgate/origin-ca.pem")
    containers.append(proxy)
    _until_ready(f"http://127.0.0.1:{admin}/readyz", proxy)
    assert proxy.inspect("{{.Config.User}}") == f"{UID}:{UID}"
    assert "SEALGATE_HEALTHZ" in proxy.inspect("{{.Config.Healthcheck.Test}}")
    # The CA the proxy made in its state volume: the client trusts it, as a sandbox would.
    trust = tmp_path / "trust.pem"
    trust.write_text((state / "ca" / "mitmproxy-ca-cert.pem").read_text())
    session = requests.Session()
    session.trust_env = False
    url = f"http://bot-1:{KEYS['bot-1']}@127.0.0.1:{port}"
    session.proxies = {"http": url, "https": url}
    session.verify = str(trust)
    origin_https.reset()
    answer = session.get(f"https://api.test:{origin_https.port}/through-the-image", timeout=20)
    assert answer.status_code == 200, answer.text
    (seen,) = [r for r in origin_https.requests if r.path == "/through-the-image"]
    assert seen.headers["authorization"] == f"Bearer {CANARY}"
    assert CANARY not in answer.text
    # Unlisted hosts stay shut from inside the image too.
    refused = session.get("http://meta.test/latest/meta-data", timeout=20)
    assert refused.status_code == 403
    health = subprocess.run([*PODMAN, "healthcheck", "run", proxy.id], capture_output=True,
                            text=True, timeout=60, check=False)
    assert health.returncode == 0, health.stdout + health.stderr
    text = proxy.stop()
    assert CANARY not in text and quiet(text)
    log_lines("\n".join(line for line in text.splitlines() if line.startswith("{")))


def test_the_issuer_image_mints_a_token(tmp_path: Path, containers: list[Container]) -> None:
    port, admin = free_port(), free_port()
    etc = tmp_path / "etc"
    public = etc / "keys"
    public.mkdir(parents=True)
    private = tmp_path / "private"
    entry = generate(private)
    shutil.copy(private / f"{entry.kid}.pub", public)
    digest = hashlib.sha256(CALLER_KEY.encode()).hexdigest()
    (etc / "callers.yaml").write_text(f"""
callers:
  ci:
    key_sha256: "{digest}"
    hosts: ["api.test:443"]
    processors: [bearer]
    max_ttl: 15m
    bindings: [none]
""")
    for path in (etc, public, *public.iterdir(), etc / "callers.yaml"):
        _owned(path, 0o755 if path.is_dir() else 0o644)
    issuer = Container(
        "-v", f"{etc}:/etc/sealgate:ro", "-e", f"SEALGATE_HEALTHZ=http://127.0.0.1:{admin}/healthz",
        ISSUER, "issuer", "serve", "--keys", "/etc/sealgate/keys", "--callers",
        "/etc/sealgate/callers.yaml", "--listen", f"127.0.0.1:{port}", "--admin",
        f"127.0.0.1:{admin}", "--audit-stdout")
    containers.append(issuer)
    _until_ready(f"http://127.0.0.1:{admin}/readyz", issuer)
    answer = requests.post(f"http://127.0.0.1:{port}/v1/tokens", timeout=20,
                           headers={"Authorization": f"Bearer {CALLER_KEY}"},
                           json={"secret": CANARY, "inject": {"type": "bearer"},
                                 "hosts": ["api.test:443"], "ttl": "10m"})
    assert answer.status_code == 200, answer.text
    token = answer.json()["token"]
    assert tk.unseal(token, keys.Keyring.load(private)).secret == CANARY
    text = issuer.stop()
    assert CANARY not in text and quiet(text)
    minted = [json.loads(line) for line in text.splitlines()
              if line.startswith("{") and '"outcome"' in line]
    assert minted and minted[-1]["outcome"] == "issued"
