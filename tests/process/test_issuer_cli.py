"""The installed `sealgate` command's key and token subcommands, each in a child process."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

from sealgate import credentials as tk
from sealgate.credentials import keys
from tests.unit.test_issuer_cli import (
    CANARY,
    PROXY_BEARER,
    ROOT,
    _assert_no_secret,
    _open,
    key_dir,  # noqa: F401 -- the unit tests' fixture, the same key directory
    run_here,
)

SEALGATE = ROOT / ".venv" / "bin" / "sealgate"


def run(
    *args: str | Path, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The installed `sealgate` command, in a child process."""
    argv = [str(SEALGATE), *map(str, args)]
    proc = subprocess.run(
        argv,
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    _assert_no_secret(argv, (proc.stdout, proc.stderr))
    return proc


def test_mint_reads_its_secret_from_stdin(key_dir: Path) -> None:  # noqa: F811
    proc = run("mint", "--key", key_dir, "--host", "api.example.com", "--inject", "bearer",
               "--secret-stdin", stdin=CANARY + "\n")
    assert proc.returncode == 0, proc.stderr
    claims = _open(proc.stdout.strip(), key_dir)
    assert (claims.secret, claims.processor.kind) == (CANARY, "bearer")


def test_keys_generate_and_list(tmp_path: Path) -> None:
    out = tmp_path / "k"
    proc = run("keys", "generate", "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    kid = info["kid"]
    assert re.fullmatch(r"[0-9a-f]{16}", kid)
    assert stat.S_IMODE(Path(info["private_key_file"]).stat().st_mode) == 0o600
    assert keys.load_public(Path(info["public_key_file"])).kid == kid

    listing = run_here("keys", "list", "--dir", out)
    assert listing.returncode == 0
    assert re.search(rf"^{kid}\s+private\+public\s+\S+Z\s+\d+s$", listing.stdout, re.M)
    as_json = json.loads(run_here("keys", "list", "--dir", out, "--json").stdout)["keys"]
    assert [(k["kid"], k["private"], k["public"]) for k in as_json] == [(kid, True, True)]
    assert 0 <= as_json[0]["age_seconds"] < 60

    os.chmod(out / f"{kid}.key", 0o644)
    refused = run_here("keys", "list", "--dir", out)
    assert refused.returncode == 1
    assert "group or others" in refused.stderr and "chmod 600" in refused.stderr


def test_mint_json_scope_ttl_and_digest(key_dir: Path) -> None:  # noqa: F811
    proc = run(
        "mint",
        "--key",
        next(key_dir.glob("*.pub")),
        "--inject",
        "bearer",
        "--host",
        "API.Example.com",
        "--host",
        "*.example.net:8443",
        "--method",
        "post",
        "--path",
        "/v1/charges",
        "--ttl",
        "10m",
        "--max-ttl",
        "1h",
        "--jti",
        "job-42",
        "--secret-env",
        "S",
        "--auth-digest-of-stdin",
        "--json",
        env={"S": CANARY},
        stdin=PROXY_BEARER + "\n",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    claims = _open(out["token"], key_dir)
    assert claims.secret == CANARY
    assert out["claims"] == tk.redacted_claims(claims)
    assert out["claims"]["secret"] == "[redacted]"
    assert claims.exp - claims.iat == 600
    assert [str(h) for h in claims.hosts] == ["api.example.com", "*.example.net:8443"]
    assert (claims.methods, claims.paths, claims.jti) == (("POST",), ("/v1/charges",), "job-42")
    assert claims.binding == tk.AuthDigestBinding.of_secret(PROXY_BEARER)
    tk.check_scope(claims, "a.example.net", 8443, "POST", "/v1/charges/ch_1")
    tk.check_binding(
        claims, sandbox_id=None, policy=None, proxy_authorization=[f"Bearer {PROXY_BEARER}"]
    )


def test_inspect(key_dir: Path) -> None:  # noqa: F811
    token = run_here(
        "mint",
        "--key",
        key_dir,
        "--inject",
        "bearer",
        "--host",
        "api.example.com",
        "--secret-stdin",
        stdin=CANARY,
    ).stdout.strip()
    kid = token.split(".")[1]

    visible = run_here("token", "inspect", token)
    assert visible.returncode == 0
    assert f"kid: {kid}" in visible.stdout and f"length: {len(token)}" in visible.stdout
    assert "claims" not in visible.stdout

    full = run("token", "inspect", "-", "--key-dir", key_dir, "--json", stdin=token + "\n")
    assert full.returncode == 0, full.stderr
    report = json.loads(full.stdout)
    assert report["kid"] == kid and report["status"] == "valid"
    assert report["claims"]["secret"] == "[redacted]"
    assert report["claims"]["hosts"] == ["api.example.com"]

    one_key = run_here("token", "inspect", token, "--private-key", key_dir / f"{kid}.key")
    assert one_key.returncode == 0 and '"secret": "[redacted]"' in one_key.stdout

    tampered = token[:-10] + ("A" if token[-10] != "A" else "B") + token[-9:]
    bad = run_here("token", "inspect", tampered, "--key-dir", key_dir)
    assert bad.returncode == 1 and "decrypt" in bad.stderr
    malformed = run_here("token", "inspect", "sg1.nothex.AAAA")
    assert malformed.returncode == 1 and "kid" in malformed.stderr
