"""The bearer tokens of sealgate's MCP endpoint (mcp/bearer.py): what mints, what verifies and
in what order, the resource URI's canonical form, the key file (made once, 0600, never shown),
the challenges, and `sealgate mcp token` printing the token alone on stdout."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from sealgate.mcp.bearer import (
    KEY_FILE,
    MAX_TOKEN,
    MAX_TTL,
    SKEW,
    InvalidToken,
    KeyFile,
    TokenKey,
    canonical_resource,
    challenges,
    create_key,
    load_key,
    metadata_paths,
    metadata_url,
    mint,
    verify,
)
from tests.harness import ROOT, SEALGATE

KEY = TokenKey(bytes(range(32)))
AUD = "http://127.0.0.1:8765/mcp"
NOW = 1_800_000_000


def _token(sandbox: str = "bot-1", audience: str = AUD, ttl: int = 600, now: int = NOW,
           key: TokenKey = KEY) -> str:
    return mint(key, sandbox, audience, ttl, now)


def _signed(body: str, key: TokenKey = KEY) -> str:
    """A token of these claims' text, correctly signed: what only a key holder could make."""
    encoded = base64.urlsafe_b64encode(body.encode()).rstrip(b"=").decode()
    signed = f"sgm1.{key.kid}.{encoded}"
    mac = hmac.new(key.secret, signed.encode(), hashlib.sha256).digest()
    return f"{signed}.{base64.urlsafe_b64encode(mac).rstrip(b'=').decode()}"


def _resigned(claims: object) -> str:
    return _signed(json.dumps(claims))


def test_a_minted_token_verifies_to_its_claims() -> None:
    token = _token()
    assert token.startswith(f"sgm1.{KEY.kid}.") and len(token) < 400
    claims = verify(KEY, token, AUD, NOW + 10)
    assert (claims.sandbox, claims.audience, claims.issued, claims.expires) == (
        "bot-1", AUD, NOW, NOW + 600)


@pytest.mark.parametrize(("token", "key", "audience", "now", "said"), [
    (_token(), KEY, AUD, NOW + 600 + SKEW, "expired"),
    (_token(), KEY, AUD, NOW - SKEW - 1, "issued in the future"),
    (_token(), KEY, "http://127.0.0.1:8766/mcp", NOW, "another resource"),
    (_token(audience="http://127.0.0.1:8765/mcp/docs"), KEY, AUD, NOW, "another resource"),
    (_token(), TokenKey(b"k" * 32), AUD, NOW, "another key"),
    (_token(), None, AUD, NOW, "no token key"),
    (_token()[:-2] + ("AA" if not _token().endswith("AA") else "BB"), KEY, AUD, NOW,
     "signature"),
    (_token().replace(".", ". ", 1), KEY, AUD, NOW, "not a sealgate MCP token"),
    (_token() + "\n", KEY, AUD, NOW, "not a sealgate MCP token"),
    (_token() + "\x00", KEY, AUD, NOW, "not a sealgate MCP token"),
    (_token().replace("sgm1", "sgm2"), KEY, AUD, NOW, "not a sealgate MCP token"),
    (_token().upper(), KEY, AUD, NOW, "not a sealgate MCP token"),
    ("sgm1.x.y.z", KEY, AUD, NOW, "not a sealgate MCP token"),
    ("", KEY, AUD, NOW, "not a sealgate MCP token"),
    ("a" * (MAX_TOKEN + 1), KEY, AUD, NOW, f"over {MAX_TOKEN}"),
    # Signed by the key, and still refused: a lifetime past the cap, claims of other types.
    (_resigned({"sub": "bot-1", "aud": AUD, "iat": NOW, "exp": NOW + MAX_TTL + 1}), KEY, AUD,
     NOW, "lifetime"),
    (_resigned({"sub": "bot-1", "aud": AUD, "iat": NOW, "exp": NOW + 1.5}), KEY, AUD, NOW,
     "do not parse"),
    (_resigned({"sub": "bot-1", "aud": AUD, "iat": True, "exp": NOW + 5}), KEY, AUD, NOW,
     "types"),
    (_resigned({"sub": "a:b", "aud": AUD, "iat": NOW, "exp": NOW + 5}), KEY, AUD, NOW, "types"),
    (_resigned({"aud": AUD, "sub": "bot-1", "iat": NOW, "exp": NOW + 5}), KEY, AUD, NOW,
     "sub, aud, iat, exp"),
    (_resigned({"sub": "bot-1", "aud": AUD, "iat": NOW, "exp": NOW + 5, "scope": "x"}), KEY,
     AUD, NOW, "sub, aud, iat, exp"),
    (_resigned([1]), KEY, AUD, NOW, "sub, aud, iat, exp"),
])
def test_what_is_refused_and_why(token: str, key: TokenKey | None, audience: str, now: int,
                                 said: str) -> None:
    with pytest.raises(InvalidToken, match=said) as refused:
        verify(key, token, audience, now)
    assert token[:40] not in str(refused.value) or not token  # never the token in the reason


def test_a_duplicated_claim_is_refused_though_signed() -> None:
    body = f'{{"sub":"bot-1","aud":"{AUD}","iat":{NOW},"exp":{NOW + 5},"exp":{NOW + MAX_TTL}}}'
    with pytest.raises(InvalidToken, match="do not parse"):
        verify(KEY, _signed(body), AUD, NOW)


@pytest.mark.parametrize(("sandbox", "audience", "ttl", "said"), [
    ("a:b", AUD, 60, "sandbox id"),
    ("", AUD, 60, "sandbox id"),
    ("bot-1", AUD, 0, "1 to"),
    ("bot-1", AUD, MAX_TTL + 1, "1 to"),
    ("bot-1", "HTTP://127.0.0.1:8765/mcp", 60, "canonical"),
])
def test_minting_refuses_what_could_not_verify(sandbox: str, audience: str, ttl: int,
                                               said: str) -> None:
    with pytest.raises(ValueError, match=said):
        mint(KEY, sandbox, audience, ttl, NOW)


@pytest.mark.parametrize(("given", "canonical"), [
    ("HTTP://127.0.0.1:8765/mcp", "http://127.0.0.1:8765/mcp"),
    ("https://MCP.Example.com:443/mcp", "https://mcp.example.com/mcp"),
    ("http://mcp.example.com:80", "http://mcp.example.com"),
    ("https://mcp.example.com/", "https://mcp.example.com"),
    ("https://mcp.example.com:8443/a/mcp/", "https://mcp.example.com:8443/a/mcp/"),
    ("http://[::1]:9000/mcp", "http://[::1]:9000/mcp"),
])
def test_resource_uris_in_canonical_form(given: str, canonical: str) -> None:
    assert canonical_resource(given) == canonical
    assert canonical_resource(canonical) == canonical


@pytest.mark.parametrize("given", [
    "mcp.example.com", "ftp://mcp.example.com", "https://mcp.example.com/mcp#x",
    "https://mcp.example.com/mcp?x=1", "https://u:p@mcp.example.com/mcp", "https:///mcp",
    "https://mcp.example.com:99999/mcp", "https://mcp.example.com/a b", "https://é.example",
    "https://mcp.example.com/" + "a" * 1100,
])
def test_resource_uris_refused(given: str) -> None:
    with pytest.raises(ValueError):
        canonical_resource(given)


def test_metadata_urls_and_challenges() -> None:
    assert metadata_paths(AUD) == ("/.well-known/oauth-protected-resource/mcp",
                                   "/.well-known/oauth-protected-resource")
    assert metadata_paths("https://mcp.example.com") == ("/.well-known/oauth-protected-resource",)
    assert metadata_url(AUD) == "http://127.0.0.1:8765/.well-known/oauth-protected-resource/mcp"
    offered = (b'Bearer resource_metadata="http://127.0.0.1:8765/.well-known/'
               b'oauth-protected-resource/mcp"')
    # No bearer sent: Basic first, as it was alone; a failed bearer's challenge first.
    assert challenges(AUD) == ((b"www-authenticate", b'Basic realm="sealgate-mcp"'),
                               (b"www-authenticate", offered))
    [(_, bearer), (_, realm)] = challenges(AUD, "invalid_token", 'say "no" \\ \x07 please')
    assert bearer == offered + b', error="invalid_token", error_description="say no   please"'
    assert realm == b'Basic realm="sealgate-mcp"'


def test_the_key_is_made_once_private_and_never_shown(tmp_path: Path) -> None:
    path = tmp_path / "state" / KEY_FILE
    key = create_key(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert create_key(path) == key == load_key(path)
    assert key.secret.hex() not in repr(key) and key.kid in repr(key)
    assert [p.name for p in path.parent.iterdir()] == [KEY_FILE]  # no temporary file left
    path.chmod(0o640)
    with pytest.raises(ValueError, match="chmod 600") as refused:
        load_key(path)
    assert key.secret.hex() not in str(refused.value)
    path.chmod(0o600)
    path.write_text("not a key\n")
    with pytest.raises(ValueError, match="not a token key"):
        load_key(path)


def test_the_servers_key_follows_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    clock = [1000.0]
    monkeypatch.setattr("sealgate.mcp.bearer.time.monotonic", lambda: clock[0])
    path = tmp_path / KEY_FILE
    held = KeyFile(path)
    assert held.current() is None  # none yet: every bearer refused
    made = create_key(path)
    assert held.current() is None  # looked at most once a second
    clock[0] += 1.5
    assert held.current() == made
    path.unlink()  # revoking every token
    clock[0] += 1.5
    assert held.current() is None


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SEALGATE, "mcp", "token", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=False)


def test_the_cli_prints_the_token_alone_and_never_the_key(tmp_path: Path) -> None:
    done = _cli("--sandbox", "bot-1", "--audience", "HTTP://127.0.0.1:8765/mcp", "--ttl", "120",
                "--state", str(tmp_path))
    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    assert done.stdout == token + "\n"
    key = load_key(tmp_path / KEY_FILE)
    claims = verify(key, token, AUD, time.time())
    assert (claims.sandbox, claims.expires - claims.issued) == ("bot-1", 120)
    assert key.kid in done.stderr and key.secret.hex() not in done.stdout + done.stderr
    assert token not in done.stderr
    again = _cli("--sandbox", "rep-1", "--audience", AUD, "--state", str(tmp_path))
    assert verify(key, again.stdout.strip(), AUD, time.time()).sandbox == "rep-1"


@pytest.mark.parametrize(("args", "said"), [
    (["--sandbox", "bot-1", "--audience", "mcp.example.com"], "resource URI"),
    (["--sandbox", "a:b", "--audience", AUD], "sandbox id"),
    (["--sandbox", "bot-1", "--audience", AUD, "--ttl", str(MAX_TTL + 1)], "1 to"),
])
def test_the_cli_refuses_and_makes_no_key(tmp_path: Path, args: list[str], said: str) -> None:
    done = _cli(*args, "--state", str(tmp_path))
    assert done.returncode == 2 and said in done.stderr and done.stdout == ""
    assert not (tmp_path / KEY_FILE).exists()


def test_the_cli_refuses_a_key_others_can_read(tmp_path: Path) -> None:
    create_key(tmp_path / KEY_FILE)
    os.chmod(tmp_path / KEY_FILE, 0o644)
    done = _cli("--sandbox", "bot-1", "--audience", AUD, "--state", str(tmp_path))
    assert done.returncode == 2 and "chmod 600" in done.stderr and done.stdout == ""


def test_the_resource_options_are_handed_on_canonical() -> None:
    """`--resource` and `--authorization-server` survive the exec into the MCP virtualenv
    (options.to_argv), in canonical form; an authorization server is https."""
    import argparse

    from sealgate.mcp.options import add_gateway_options, add_serve_options, to_argv

    for add in (add_serve_options, add_gateway_options):
        parser = argparse.ArgumentParser()
        add(parser)
        first = parser.parse_args(["--resource", "HTTPS://MCP.example.com:443/x/mcp",
                                   "--authorization-server", "https://Auth.example.com/",
                                   "--authorization-server", "https://b.example.com/t"])
        assert first.resource == "https://mcp.example.com/x/mcp"
        assert first.authorization_server == ["https://auth.example.com",
                                              "https://b.example.com/t"]
        assert vars(parser.parse_args(to_argv(first))) == vars(first)
        for wrong in (["--resource", "mcp.example.com"],
                      ["--authorization-server", "http://auth.example.com"]):
            with pytest.raises(SystemExit):
                parser.parse_args(wrong)
