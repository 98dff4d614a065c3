"""`sealgate mint` refusing an exchange processor's scheme, as the installed command says it."""

from __future__ import annotations

import json
from pathlib import Path

from sealgate.credentials.keys import generate
from tests.process.test_issuer_cli import run
from tests.unit.test_grants import ACCOUNT
from tests.unit.test_issuer_cli import CANARY, run_here


def test_mint_refuses_a_scheme_it_cannot_inject(tmp_path: Path) -> None:
    """A scheme the processors do not take is a usage error (status 2, the choices named, no
    traceback, nothing of the secret); a processor without a scheme does not take one."""
    public = generate(tmp_path / "keys")
    key = tmp_path / "keys" / f"{public.kid}.pub"
    secret = {"SECRET": json.dumps({"refresh_token": CANARY})}
    bad = run("mint", "--key", key, "--host", "api.example.com", "--inject", "oauth2",
              "--token-url", "https://auth.example.com/token", "--scheme", "Basic",
              "--secret-env", "SECRET", env=secret)
    assert bad.returncode == 2 and bad.stdout == ""
    assert "--scheme" in bad.stderr and "'Bearer', 'token'" in bad.stderr
    assert "Traceback" not in bad.stderr
    stray = run_here("mint", "--key", key, "--host", "api.example.com", "--inject",
                     "gcp-service-account", "--scopes", "x", "--scheme", "Bearer",
                     "--secret-env", "SECRET", env={"SECRET": ACCOUNT})
    assert stray.returncode == 1 and "does not take --scheme" in stray.stderr
