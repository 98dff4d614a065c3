"""docs/runbooks.md's rotations, done as the runbook says, step by step, with the real commands
and processes: a runbook nobody has tried is a guess. (sandboxd's API key is rotated by a
hand-over: tests/sandboxd/test_adopt.py, `test_a_successor_takes_a_new_key`.)"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.conftest import KEYS, client
from tests.harness import ROOT, SEALGATE, Origin, ProxyFactory, end, key_digest, quiet

CANARY = "sk_live_RUNBOOK_CANARY_e41f07"
CALLER_KEY = "runbook-caller-key-CANARY-2c8d"


def _rules(port: int) -> str:
    return f"""
version: 1
policies:
  agent:
    tokens: true
    allow:
      - host: api.test
        ports: [{port}]
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: agent, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
"""


def _keys(*argv: str) -> str:
    done = subprocess.run([*SEALGATE, "keys", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _kid(directory: Path) -> str:
    (key,) = directory.glob("*.key")
    return key.stem


class Issuer:
    """`sealgate issuer serve` with its public keys in `keys`."""

    def __init__(self, where: Path, keys: Path, port: int) -> None:
        callers = where / "callers.yaml"
        digest = hashlib.sha256(CALLER_KEY.encode()).hexdigest()
        callers.write_text(f"""
callers:
  ci:
    key_sha256: "{digest}"
    hosts: ["api.test:{port}"]
    processors: [bearer]
    max_ttl: 15m
    bindings: [none]
""")
        self.log = where / "issuer.stderr"
        self._log = self.log.open("w")
        self.process = subprocess.Popen(
            [*SEALGATE, "issuer", "serve", "--keys", str(keys), "--callers", str(callers),
             "--listen", "127.0.0.1:0", "--audit-log", str(where / "issuer-audit.log"),
             "--reload-interval", "0"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=self._log, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.url = ""
        deadline = time.monotonic() + 30
        while not self.url:
            assert time.monotonic() < deadline and self.process.poll() is None, self.text()
            for line in self.text().splitlines():
                said = json.loads(line)
                if said["event"] == "listening":
                    self.url = said["url"]
            time.sleep(0.05)

    def text(self) -> str:
        return self.log.read_text()

    def current(self) -> str:
        return str(requests.get(f"{self.url}/v1/keys", timeout=10).json()["current"])

    def mint(self, port: int) -> str:
        answer = requests.post(
            f"{self.url}/v1/tokens", timeout=10,
            headers={"Authorization": f"Bearer {CALLER_KEY}"},
            json={"secret": CANARY, "inject": {"type": "bearer"},
                  "hosts": [f"api.test:{port}"], "ttl": "10m"})
        assert answer.status_code == 200, answer.text
        return str(answer.json()["token"])

    def reload_to(self, kid: str) -> None:
        self.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while self.current() != kid:
            assert time.monotonic() < deadline, self.text()
            time.sleep(0.05)

    def stop(self) -> None:
        end(self.process)
        self._log.close()
        assert quiet(self.text()) and CANARY not in self.text()


@pytest.fixture
def issuer_for(tmp_path: Path) -> Iterator[list[Issuer]]:
    made: list[Issuer] = []
    yield made
    for issuer in made:
        issuer.stop()


def _through(port: int, token: str, session: requests.Session) -> int:
    answer = session.get(f"https://api.test:{port}/runbook", timeout=10,
                         headers={"Proxy-Tokenizer": token})
    return answer.status_code


def test_rotating_the_token_sealing_keys(
    tmp_path: Path, proxy_with: ProxyFactory, origin_https: Origin,
    issuer_for: list[Issuer],
) -> None:
    proxy_keys, issuer_keys, new = tmp_path / "proxy-keys", tmp_path / "issuer-keys", \
        tmp_path / "new"
    issuer_keys.mkdir()
    _keys("generate", "--out", str(proxy_keys))
    old_kid = _kid(proxy_keys)
    shutil.copy(proxy_keys / f"{old_kid}.pub", issuer_keys)
    port = origin_https.port
    with proxy_with(_rules(port), token_keys=proxy_keys, canaries=(CANARY,)) as proxy:
        issuer = Issuer(tmp_path, issuer_keys, port)
        issuer_for.append(issuer)
        session = client(proxy)
        before = issuer.mint(port)
        origin_https.reset()
        assert _through(port, before, session) == 200
        assert origin_https.requests[-1].headers["authorization"] == f"Bearer {CANARY}"

        # 1. A new pair, a new kid; `keys list` shows it.
        _keys("generate", "--out", str(new))
        new_kid = _kid(new)
        assert new_kid != old_kid and new_kid in _keys("list", "--dir", str(new))
        # Order matters: an issuer sealing to the new key before the proxies hold it makes
        # tokens no proxy opens (what the runbook's order prevents).
        early = tmp_path / "early-issuer-keys"
        early.mkdir()
        shutil.copy(new / f"{new_kid}.pub", early)
        (tmp_path / "early").mkdir()
        too_early = Issuer(tmp_path / "early", early, port)
        issuer_for.append(too_early)
        assert _through(port, too_early.mint(port), session) == 400
        # 2. The new private key to the proxy, SIGHUP: it opens tokens of both kids.
        shutil.copy(new / f"{new_kid}.key", proxy_keys)
        proxy.signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while _through(port, too_early.mint(port), session) != 200:
            assert time.monotonic() < deadline, "the proxy never took the new key"
            time.sleep(0.1)
        assert _through(port, before, session) == 200
        # 3. The new public key to the issuer, SIGHUP: it seals to the new kid.
        shutil.copy(new / f"{new_kid}.pub", issuer_keys)
        issuer.reload_to(new_kid)
        after = issuer.mint(port)
        assert _through(port, after, session) == 200
        # 4. The old private key off the proxy, SIGHUP: a token sealed to it is refused.
        for path in proxy_keys.glob(f"{old_kid}.*"):
            path.unlink()
        (issuer_keys / f"{old_kid}.pub").unlink()
        proxy.signal(signal.SIGHUP)
        deadline = time.monotonic() + 20
        while (status := _through(port, before, session)) != 400:
            assert status == 200 and time.monotonic() < deadline, status
            time.sleep(0.1)
        refused = proxy.wait_audit(lambda e: e.get("event") == "request"
                                   and e.get("reason") == "token_invalid")
        assert refused["decision"] == "deny"
        assert _through(port, after, session) == 200
        issuer.reload_to(new_kid)  # a reload without the old key keeps serving the new


def test_rotating_the_proxy_ca(tmp_path: Path, proxy_with: ProxyFactory,
                               origin_https: Origin) -> None:
    # `tokens: true` (in `_rules`) intercepts every tunnel: a sandbox sees the proxy's leaf.
    rules = _rules(origin_https.port)
    where = tmp_path / "proxy"
    where.mkdir()
    url = f"https://api.test:{origin_https.port}/ca"
    with proxy_with(rules, directory=where) as proxy:
        old_ca = proxy.ca.read_text()
        assert client(proxy).get(url, timeout=10).status_code == 200
        old_trust = (where / "trust.pem").read_text()
    # 1. Stopped; STATE/ca/ moved aside; started again: a new CA.
    aside = tmp_path / "old-ca"
    shutil.move(where / "state" / "ca", aside)
    (where / "trust.pem").unlink()
    with proxy_with(rules, directory=where) as proxy:
        assert proxy.ca.read_text() != old_ca
        # A client that kept the old CA (a sandbox made before the rotation) is refused the
        # intercepted handshake: nothing reaches the origin for it.
        stale = client(proxy)
        (where / "stale.pem").write_text(old_trust)
        stale.verify = str(where / "stale.pem")
        origin_https.reset()
        with pytest.raises(requests.exceptions.SSLError):
            stale.get(url, timeout=10)
        assert not origin_https.requests
        # 3. `sealgate ca --print` gives clients the new CA, which works.
        printed = subprocess.run([*SEALGATE, "ca", "--print", "--state", str(proxy.state)],
                                 cwd=ROOT, capture_output=True, text=True, timeout=60,
                                 check=False)
        assert printed.returncode == 0, printed.stderr
        assert printed.stdout.strip() == proxy.ca.read_text().strip()
        assert "PRIVATE KEY" not in printed.stdout
        ssl.create_default_context(cadata=printed.stdout)  # a CA a client can load
        assert client(proxy).get(url, timeout=10).status_code == 200
    # 4. The old key is the operator's to destroy: it was never read again.
    assert (aside / "mitmproxy-ca.pem").exists()
