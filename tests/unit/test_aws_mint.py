"""`sealgate mint --inject aws-sigv4` seals a processor the proxy re-signs with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sealgate.credentials import keys
from sealgate.credentials import token as tk
from sealgate.credentials.processors import AWS_PLACEHOLDER_KEY_ID, AwsSigV4Processor
from tests.unit.test_issuer_cli import run_here

KEYS = json.dumps({"access_key_id": "AKIAMINTCANARY000001", "secret_access_key": "mint/CANARY"})


def test_mint_aws_sigv4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    public = keys.generate(tmp_path / "keys")
    proc = run_here("mint", "--key", tmp_path / "keys" / f"{public.kid}.pub", "--host",
                    "s3.us-east-1.amazonaws.com", "--inject", "aws-sigv4", "--aws-services",
                    "s3,sts", "--aws-regions", "us-east-1", "--secret-env", "AWS_KEYS",
                    env={"AWS_KEYS": KEYS})
    assert proc.returncode == 0, proc.stderr
    claims = tk.unseal(proc.stdout.strip(), keys.Keyring.load(tmp_path / "keys"))
    assert claims.processor == AwsSigV4Processor(services="s3,sts", regions="us-east-1",
                                                 placeholder=AWS_PLACEHOLDER_KEY_ID)
    assert claims.secret == KEYS
    missing = run_here("mint", "--key", tmp_path / "keys" / f"{public.kid}.pub", "--host",
                       "s3.amazonaws.com", "--inject", "aws-sigv4", "--aws-services", "s3",
                       "--secret-env", "AWS_KEYS", env={"AWS_KEYS": KEYS})
    assert missing.returncode != 0 and "--aws-regions" in missing.stderr
    bad = run_here("mint", "--key", tmp_path / "keys" / f"{public.kid}.pub", "--host",
                   "s3.amazonaws.com", "--inject", "aws-sigv4", "--aws-services", "s3",
                   "--aws-regions", "us-east-1", "--secret-env", "AWS_KEYS",
                   env={"AWS_KEYS": "not keys"})
    assert bad.returncode != 0 and "JSON object" in bad.stderr
