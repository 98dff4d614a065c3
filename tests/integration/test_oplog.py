"""The proxy's operational log, from a real process: one JSON line per message at every level
(debug included), the audit line's field names, a request's log line carrying the request id of
its audit line, and no secret, key, token or proxy password in any line."""

from __future__ import annotations

import time
from pathlib import Path

import requests

from sealgate.credentials import Claims, Destination, seal
from sealgate.credentials.keys import PublicKeyEntry
from sealgate.credentials.processors import BearerProcessor
from tests.conftest import KEYS, client
from tests.harness import Origin, ProxyFactory, key_digest, log_lines

SECRET = "sk_live_oplog_secret_canary_6d2e"
TOKEN_SECRET = "oplog-token-secret-canary-81fa"
WRONG_KEY = "oplog-wrong-key-canary-0c4b"


def test_log_lines_are_json_carry_request_ids_and_no_secret(
    proxy_with: ProxyFactory, origin_https: Origin, token_keys: tuple[Path, PublicKeyEntry],
    tmp_path: Path,
) -> None:
    port = origin_https.port
    rules = f"""
version: 1
policies:
  ci:
    tokens: true
    allow:
      - host: api.test
        ports: [{port}]
        paths: ["/ok/**"]
        inject:
          - secret: file:api_key
            as: bearer
      - host: api.test
        ports: [{port}]
        paths: ["/missing/**"]
        inject:
          - secret: file:nothere
            as: bearer
    allow_networks: [127.0.0.1/32]
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
default_policy: null
"""
    now = int(time.time())
    token = seal(Claims(kid=token_keys[1].kid, secret=TOKEN_SECRET, processor=BearerProcessor(),
                        hosts=(Destination("other.test", port),), exp=now + 300, iat=now),
                 token_keys[1])
    canaries = (SECRET, KEYS["bot-1"], WRONG_KEY, TOKEN_SECRET, token.rsplit(".", 1)[1])
    with proxy_with(rules, name="oplog", directory=tmp_path, secrets={"api_key": SECRET},
                    token_keys=token_keys[0], canaries=canaries) as p:
        session = client(p)
        assert session.get(f"https://api.test:{port}/ok/1", timeout=10).status_code == 200
        missing = session.get(f"https://api.test:{port}/missing/1", timeout=10)
        assert missing.status_code >= 500, missing.text
        refused = session.get(f"https://api.test:{port}/ok/2", timeout=10,
                              headers={"Proxy-Tokenizer": token})
        assert refused.status_code == 403, refused.text
        wrong = requests.Session()
        wrong.trust_env = False
        wrong.proxies = {"http": p.url("bot-1", WRONG_KEY)}
        assert wrong.get(f"http://api.test:{port}/ok/3", timeout=10).status_code == 407
        audit = p.wait_audit(lambda e: e.get("event") == "request"
                             and e.get("path") == "/missing/1")
        p.rules.write_text("version: 1\npolicies: [\n")  # a reload that fails: an error line
        p.wait_audit(lambda e: e["event"] == "rules_reload_failed")
    lines = log_lines(p.stderr())  # the factory checked the canaries and the shape already
    assert {line["level"] for line in lines} >= {"info", "warning", "error"}, lines
    (ready,) = [line for line in lines if line["event"] == "sealgate proxy ready"]
    assert ready["listening"] == [f"127.0.0.1:{p.port}"] and ready["policies"] == {
        "ci": {"mode": "enforce", "rules": 2}}
    about = [line for line in lines if line.get("request_id") == audit["request_id"]]
    assert about, f"no log line with the request id {audit['request_id']}: {lines}"
    assert all((line["sandbox"], line["policy"]) == ("bot-1", "ci") for line in about), about
    assert any(line["level"] == "warning" and line.get("ref") == "file:nothere"
               for line in about), about
    reload = [line for line in lines if line["level"] == "error"]
    assert any("rules reload failed" in line["event"] for line in reload), reload
