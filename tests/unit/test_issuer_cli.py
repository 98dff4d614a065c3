"""`sealgate keys`, `sealgate mint` and `sealgate token inspect`, run as the installed command.

Every run asserts that the canary secret is not in the argv we pass nor in anything printed.
The argument-error table runs in-process through `issuer.cli.register` (same parser, same
handlers) only to keep the suite fast.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import io
import os
import subprocess
import sys
from pathlib import Path
from unittest.mock import patch

import pytest

from sealgate import credentials as tk
from sealgate.credentials import httprequest as ij
from sealgate.credentials import keys
from sealgate.issuer import cli, clibase, servecli

ROOT = Path(__file__).resolve().parents[2]
CANARY = "sk_live_CLI_CANARY_81d2c0"
PROXY_BEARER = "proxy-bearer-CANARY-55e1"


def _assert_no_secret(argv: list[str], outputs: tuple[str, str]) -> None:
    assert not any(CANARY in arg or PROXY_BEARER in arg for arg in argv)
    for text in outputs:
        assert CANARY not in text and PROXY_BEARER not in text


def run_here(
    *args: str | Path, stdin: str = "", env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The `sealgate` command's parser and handlers in this process (the installed command's
    start-up costs most of a second: tests/process/test_issuer_cli.py runs it)."""
    argv = [str(arg) for arg in args]
    parser = argparse.ArgumentParser(prog="sealgate")
    cli.register(parser.add_subparsers(dest="command"))
    out, err = io.StringIO(), io.StringIO()
    fake_stdin = io.TextIOWrapper(io.BytesIO(stdin.encode()), encoding="utf-8")
    with (
        patch.dict(os.environ, env or {}),
        patch.object(sys, "stdin", fake_stdin),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        parsed = parser.parse_args(argv)
        code = parsed.func(parsed)
    _assert_no_secret(argv, (out.getvalue(), err.getvalue()))
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def key_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("cli") / "proxy-keys"
    proc = run_here("keys", "generate", "--out", directory, "--json")
    assert proc.returncode == 0, proc.stderr
    return directory


def _open(token: str, key_dir: Path) -> tk.Claims:
    claims = tk.unseal(token, keys.Keyring.load(key_dir))
    tk.check_time(claims)
    return claims


@pytest.mark.parametrize(
    ("inject_args", "check"),
    [
        (
            ["--inject", "bearer"],
            lambda r: r.get_header_values("authorization") == [f"Bearer {CANARY}"],
        ),
        (
            ["--inject", "header", "--header-name", "X-Api-Key", "--format", "Key {secret}"],
            lambda r: r.get_header_values("x-api-key") == [f"Key {CANARY}"],
        ),
        (
            ["--inject", "basic", "--username", "api"],
            lambda r: (
                r.get_header_values("authorization")
                == ["Basic " + base64.b64encode(f"api:{CANARY}".encode()).decode()]
            ),
        ),
        (["--inject", "query", "--param", "key"], lambda r: r.path == f"/?key={CANARY}"),
        (
            [
                "--inject",
                "hmac-sha256",
                "--header-name",
                "X-Sig",
                "--hmac-encoding",
                "base64",
                "--hmac-message",
                "hello",
            ],
            lambda r: len(r.get_header_values("x-sig")[0]) == 44,
        ),
        (
            ["--inject", "placeholder", "--placeholder", "sg-placeholder"],
            lambda r: r.get_header_values("authorization") == [f"Bearer {CANARY}"],
        ),
    ],
    ids=["bearer", "header", "basic", "query", "hmac", "placeholder"],
)
def test_mint_each_processor(
    key_dir: Path, inject_args: list[str], check: object, tmp_path: Path
) -> None:
    # Rotate through the three secret sources.
    kind = inject_args[1]
    if kind in ("bearer", "basic"):
        source, stdin, env = ["--secret-stdin"], CANARY + "\n", None
    elif kind in ("header", "hmac-sha256"):
        secret_file = tmp_path / "secret"
        secret_file.write_text(CANARY + "\r\n")
        source, stdin, env = ["--secret-file", str(secret_file)], "", None
    else:
        source, stdin, env = ["--secret-env", "MY_SECRET"], "", {"MY_SECRET": CANARY}
    proc = run_here(
        "mint",
        "--key",
        key_dir,
        "--host",
        "api.example.com",
        *inject_args,
        *source,
        stdin=stdin,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    token = proc.stdout.strip()
    claims = _open(token, key_dir)
    assert claims.secret == CANARY
    assert claims.processor.kind == kind
    request = ij.InMemoryRequest(headers=[("Authorization", "Bearer sg-placeholder")])
    claims.processor.inject(claims.secret, request)
    assert callable(check) and check(request)


@pytest.mark.parametrize(
    ("bind_args", "env", "stdin", "expected"),
    [
        (["--bind-sandbox", "sbx-7"], {}, "", tk.SandboxBinding("sbx-7")),
        (["--bind-policy", "ci"], {}, "", tk.PolicyBinding("ci")),
        (
            ["--auth-digest-of-stdin"],
            {},
            PROXY_BEARER + "\n",
            tk.AuthDigestBinding(hashlib.sha256(PROXY_BEARER.encode()).hexdigest()),
        ),
        (
            ["--auth-digest-of-env", "PB"],
            {"PB": PROXY_BEARER},
            "",
            tk.AuthDigestBinding(hashlib.sha256(PROXY_BEARER.encode()).hexdigest()),
        ),
    ],
    ids=["sandbox", "policy", "digest-stdin", "digest-env"],
)
def test_mint_bindings(
    key_dir: Path, bind_args: list[str], env: dict[str, str], stdin: str, expected: tk.Binding
) -> None:
    proc = run_here(
        "mint",
        "--key",
        key_dir,
        "--inject",
        "bearer",
        "--host",
        "api.example.com",
        "--secret-env",
        "S",
        *bind_args,
        env={"S": CANARY, **env},
        stdin=stdin,
    )
    assert proc.returncode == 0, proc.stderr
    claims = _open(proc.stdout.strip(), key_dir)
    assert claims.binding == expected
    if isinstance(expected, tk.AuthDigestBinding):
        tk.check_binding(
            claims, sandbox_id=None, policy=None, proxy_authorization=[f"Bearer {PROXY_BEARER}"]
        )


# --- errors ---------------------------------------------------------------------------------

ENV = {"S": CANARY, "EMPTY": "", "NEWLINE": CANARY + "\nX-Injected: 1"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--ttl", "25h"], "at most the cap (24h)"),
        (["--ttl", "2h", "--max-ttl", "1h"], "at most the cap (1h)"),
        (["--max-ttl", "48h"], "cannot exceed 24h"),
        (["--ttl", "0"], "more than 0"),
        (["--ttl", "soon"], "not a duration"),
        (["--param", "key"], "does not take --param"),
        (["--host", "*.com"], "at least two labels"),
        (["--path", "/a/../b"], "dot segments"),
        (["--jti", "has space"], "jti"),
        (["--secret-stdin", "--auth-digest-of-stdin"], "cannot both come from stdin"),
        (["--secret-env", "UNSET_VARIABLE_X"], "is not set"),
        (["--secret-env", "EMPTY"], "secret is empty"),
        (["--secret-env", "NEWLINE"], "visible ASCII"),
        (["--secret-file", "/nonexistent/secret"], "cannot read secret file"),
        ([], "give the secret with"),
    ],
)
def test_mint_errors(key_dir: Path, argv: list[str], message: str) -> None:
    if not any(arg.startswith("--secret") for arg in argv) and argv:
        argv = [*argv, "--secret-env", "S"]
    proc = run_here(
        "mint", "--key", key_dir, "--inject", "bearer", "--host", "a.example.com", *argv, env=ENV
    )
    assert proc.returncode == 1
    assert message in proc.stderr and proc.stdout == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--inject", "query"], "needs --param"),
        (["--inject", "placeholder"], "needs --placeholder"),
        (["--inject", "header", "--header-name", "Host"], "may not set"),
        (["--inject", "header", "--header-name", "X-K", "--format", "{secret}{secret}"], "once"),
        (["--inject", "hmac-sha256", "--header-name", "X-S", "--format", "{secret}"], "once"),
        (["--inject", "basic", "--username", "a:b"], "must not contain ':'"),
    ],
)
def test_processor_option_errors(key_dir: Path, argv: list[str], message: str) -> None:
    proc = run_here(
        "mint", "--key", key_dir, "--host", "a.example.com", "--secret-env", "S", *argv, env=ENV
    )
    assert proc.returncode == 1
    assert message in proc.stderr


def test_mint_refuses_missing_key(tmp_path: Path) -> None:
    proc = run_here(
        "mint",
        "--key",
        tmp_path,
        "--inject",
        "bearer",
        "--host",
        "a.example.com",
        "--secret-env",
        "S",
        env=ENV,
    )
    assert proc.returncode == 1 and "no public keys" in proc.stderr


def test_secret_is_not_an_argument() -> None:
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        run_here("mint", "--key", "k", "--inject", "bearer", "--host", "h.com", "--secret", "x")


@pytest.mark.parametrize(
    ("text", "seconds"), [("900", 900), ("15m", 900), ("1h30m", 5400), ("1d", 86400)]
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert clibase.parse_duration(text) == seconds


def test_format_age() -> None:
    assert [clibase.format_age(s) for s in (0, 59, 61, 3700, 90000)] == [
        "0s",
        "59s",
        "1m1s",
        "1h1m",
        "1d1h",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("127.0.0.1:8090", ("127.0.0.1", 8090)), ("[::1]:0", ("::1", 0)),
     ("localhost:443", ("localhost", 443))],
)
def test_parse_listen(text: str, expected: tuple[str, int]) -> None:
    assert servecli.parse_listen(text) == expected


@pytest.mark.parametrize("text", [":8090", "127.0.0.1", "127.0.0.1:65536", "h:²", "h:-1", ""])
def test_parse_listen_refuses(text: str) -> None:
    with pytest.raises(clibase.CliError, match="is not HOST:PORT"):
        servecli.parse_listen(text)
