"""The broker's memo of worked-out credentials, across rules reloads."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sealgate.proxy.credentials.broker import Broker
from sealgate.proxy.credentials.secrets import SecretBroker
from sealgate.proxy.credentials.secrets.filestore import FileStore
from sealgate.proxy.policy.rulesfile import load_rules

RULES = (
    "version: 1\npolicies:\n  p:\n    allow:\n      - host: a.test\n        inject:\n"
    "          - {secret: 'file:k', as: bearer}\n"
)


def test_no_credential_is_kept_for_an_entry_the_rules_no_longer_name(tmp_path: Path) -> None:
    """A request that was waiting for its secret across a reload gets its credential, but the
    broker keeps none for the rule entry that is gone."""
    secrets_file = tmp_path / "secrets.yaml"
    secrets_file.write_text("k: reload-canary-1\n")
    secrets_file.chmod(0o600)
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(RULES)
    broker = Broker(SecretBroker([FileStore(secrets_file)]))
    old = load_rules(rules_file)
    broker.check(old)
    injection = old.policies["p"].rules[0].inject[0]
    current = load_rules(rules_file)
    broker.check(current)  # reloaded: new rule entries
    creds = asyncio.run(broker.credentials([injection]))
    assert creds[0].header == (b"Authorization", b"Bearer reload-canary-1")
    assert broker._worked_out == {}
    fresh = current.policies["p"].rules[0].inject[0]
    again = asyncio.run(broker.credentials([fresh]))
    assert asyncio.run(broker.credentials([fresh]))[0] is again[0]  # kept for the live one
