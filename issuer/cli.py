"""`sealgate keys`, `sealgate mint`, `sealgate token inspect` and `sealgate issuer serve`.

Secrets are read from stdin, a file or an environment variable, never from argv (which any local
user can read in the process table), and no output of these commands ever contains one.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import ipaddress
import json
import logging
import os
import secrets
import sys
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from sealgate import issuer as tk
from sealgate.files import read_regular
from sealgate.issuer import callers, keys
from sealgate.issuer import processors as pr

_MAX_SECRET_BYTES: Final = pr.MAX_SECRET_LENGTH * 4
DEFAULT_TTL: Final = "15m"

# The processor options each --inject kind takes; any other processor option is an error.
_PROCESSOR_OPTIONS: Final[Mapping[str, frozenset[str]]] = {
    "bearer": frozenset(),
    "header": frozenset({"header_name", "format"}),
    "basic": frozenset({"username"}),
    "query": frozenset({"param"}),
    "hmac-sha256": frozenset({"header_name", "format", "hmac_message", "hmac_encoding"}),
    "placeholder": frozenset({"header_name", "placeholder"}),
}
_ALL_PROCESSOR_OPTIONS: Final = frozenset().union(*_PROCESSOR_OPTIONS.values())


class CliError(Exception):
    """A problem with what the user asked for; printed as one line, exit status 1."""


# --- small parsers ----------------------------------------------------------------------------


def parse_duration(text: str) -> int:
    """Seconds in "900", "15m", "1h30m", "2d" (units s, m, h, d)."""
    try:
        return callers.parse_duration(text)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def format_age(seconds: int) -> str:
    """The two largest units: '3d4h', '2h5m', '7m30s', '12s'."""
    remaining = max(0, seconds)
    parts: list[str] = []
    for unit in ("d", "h", "m", "s"):
        count, remaining = divmod(remaining, callers.UNIT_SECONDS[unit])
        if count or parts or unit == "s":
            parts.append(f"{count}{unit}")
    return "".join(parts[:2])


def _strip_newline(text: str) -> str:
    # Files and here-strings end in one newline that is not part of the secret.
    if text.endswith("\r\n"):
        return text[:-2]
    return text.removesuffix("\n")


def _read_stdin(what: str) -> str:
    if sys.stdin.isatty():
        return getpass.getpass(f"{what}: ")
    data = sys.stdin.buffer.read(_MAX_SECRET_BYTES + 3)
    return _decode(data, f"{what} on stdin")


def _decode(data: bytes, where: str) -> str:
    if len(data) > _MAX_SECRET_BYTES + 2:
        raise CliError(f"{where} is too long")
    try:
        return _strip_newline(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise CliError(f"{where} is not UTF-8") from None


def _read_file(path: Path, what: str) -> str:
    try:
        data, _ = read_regular(path, _MAX_SECRET_BYTES + 2)
    except OSError as exc:
        raise CliError(f"cannot read {what} file {path}: {exc.strerror}") from None
    return _decode(data, f"{what} file {path}")


def _read_env(name: str, what: str) -> str:
    value = os.environ.get(name)
    if value is None:
        raise CliError(f"environment variable {name} (for the {what}) is not set")
    return value


def _read_source(stdin: bool, file: Path | None, env: str | None, what: str) -> str | None:
    if stdin:
        value = _read_stdin(what)
    elif file is not None:
        value = _read_file(file, what)
    elif env is not None:
        value = _read_env(env, what)
    else:
        return None
    if not value:
        raise CliError(f"the {what} is empty")
    return value


def _emit_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def _run(command: str, body: Callable[[], int]) -> int:
    try:
        return body()
    except (
        CliError,
        tk.TokenError,
        pr.InjectionError,
        keys.KeyFileError,
        callers.CallersFileError,
    ) as exc:
        sys.stderr.write(f"sealgate {command}: error: {exc}\n")
        return 1


# --- keys -------------------------------------------------------------------------------------


def _keys_generate(args: argparse.Namespace) -> int:
    def body() -> int:
        entry = keys.generate(args.out)
        info = {
            "kid": entry.kid,
            "created": keys.format_time(entry.created),
            "private_key_file": str(args.out / f"{entry.kid}{keys.PRIVATE_SUFFIX}"),
            "public_key_file": str(args.out / f"{entry.kid}{keys.PUBLIC_SUFFIX}"),
        }
        if args.json:
            _emit_json(info)
        else:
            sys.stdout.write(
                f"kid {entry.kid}\n"
                f"private key {info['private_key_file']} (proxy only, mode 0600)\n"
                f"public key  {info['public_key_file']} (give to the issuer)\n"
            )
        return 0

    return _run("keys generate", body)


def _key_rows(directory: Path) -> list[dict[str, object]]:
    """One row per kid found as a .pub and/or .key file, newest first."""
    created: dict[str, datetime] = {}
    kinds: dict[str, list[str]] = {}
    for private in keys.private_entries(directory):
        created[private.kid] = private.created
        kinds.setdefault(private.kid, []).append("private")
    for public in keys.public_entries(directory):
        created.setdefault(public.kid, public.created)
        kinds.setdefault(public.kid, []).append("public")
    now = datetime.now(UTC)
    ordered = sorted(created, key=lambda kid: (created[kid], kid), reverse=True)
    return [
        {
            "kid": kid,
            "created": keys.format_time(created[kid]),
            "age_seconds": int((now - created[kid]).total_seconds()),
            "private": "private" in kinds[kid],
            "public": "public" in kinds[kid],
        }
        for kid in ordered
    ]


def _keys_list(args: argparse.Namespace) -> int:
    def body() -> int:
        rows = _key_rows(args.dir)
        if args.json:
            _emit_json({"directory": str(args.dir), "keys": rows})
            return 0
        if not rows:
            sys.stdout.write(f"no keys in {args.dir}\n")
            return 0
        sys.stdout.write(f"{'KID':<16}  {'FILES':<14}  {'CREATED':<20}  AGE\n")
        for row in rows:
            files = "+".join(kind for kind in ("private", "public") if row[kind])
            age = row["age_seconds"]
            assert isinstance(age, int)
            sys.stdout.write(f"{row['kid']}  {files:<14}  {row['created']}  {format_age(age)}\n")
        return 0

    return _run("keys list", body)


# --- mint -------------------------------------------------------------------------------------


def _processor(args: argparse.Namespace) -> pr.Processor:
    kind: str = args.inject
    given = {name for name in _ALL_PROCESSOR_OPTIONS if getattr(args, name) is not None}
    stray = sorted(given - _PROCESSOR_OPTIONS[kind])
    if stray:
        flags = ", ".join("--" + name.replace("_", "-") for name in stray)
        raise CliError(f"--inject {kind} does not take {flags}")

    def need(name: str) -> str:
        value: str | None = getattr(args, name)
        if value is None:
            raise CliError(f"--inject {kind} needs --{name.replace('_', '-')}")
        return value

    match kind:
        case "bearer":
            return pr.BearerProcessor()
        case "header":
            return pr.HeaderProcessor(header=need("header_name"), format=args.format or "{secret}")
        case "basic":
            return pr.BasicProcessor(username=need("username"))
        case "query":
            return pr.QueryProcessor(param=need("param"))
        case "hmac-sha256":
            return pr.HmacProcessor(
                header=need("header_name"),
                format=args.format or "{signature}",
                encoding=args.hmac_encoding or "hex",
                message=args.hmac_message,
            )
        case "placeholder":
            return pr.PlaceholderProcessor(
                header=args.header_name or "Authorization", placeholder=need("placeholder")
            )
    raise CliError(f"unknown processor {kind!r}")


def _binding(args: argparse.Namespace) -> tk.Binding | None:
    if args.bind_sandbox is not None:
        return tk.SandboxBinding(args.bind_sandbox)
    if args.bind_policy is not None:
        return tk.PolicyBinding(args.bind_policy)
    auth = _read_source(
        args.auth_digest_of_stdin,
        args.auth_digest_of_file,
        args.auth_digest_of_env,
        "proxy bearer secret",
    )
    return None if auth is None else tk.AuthDigestBinding.of_secret(auth)


def _load_sealing_key(path: Path) -> keys.PublicKeyEntry:
    return keys.newest_public(path) if path.is_dir() else keys.load_public(path)


def _mint(args: argparse.Namespace) -> int:
    def body() -> int:
        if args.secret_stdin and args.auth_digest_of_stdin:
            raise CliError("the secret and the proxy bearer secret cannot both come from stdin")
        max_ttl = parse_duration(args.max_ttl)
        if max_ttl > tk.MAX_LIFETIME_SECONDS:
            raise CliError("--max-ttl cannot exceed 24h")
        ttl = parse_duration(args.ttl)
        if not 0 < ttl <= max_ttl:
            raise CliError(f"--ttl must be more than 0 and at most the cap ({args.max_ttl})")
        hosts = tuple(tk.HostPattern.parse(host) for host in args.host)
        processor = _processor(args)
        public = _load_sealing_key(args.key)
        binding = _binding(args)
        secret = _read_source(args.secret_stdin, args.secret_file, args.secret_env, "secret")
        if secret is None:
            raise CliError("give the secret with --secret-stdin, --secret-file or --secret-env")
        now = int(time.time())
        claims = tk.Claims(
            kid=public.kid,
            secret=secret,
            processor=processor,
            hosts=hosts,
            methods=tuple(m.upper() for m in args.method) if args.method else None,
            paths=tuple(args.path) if args.path else None,
            exp=now + ttl,
            iat=now,
            jti=args.jti or secrets.token_urlsafe(12),
            binding=binding,
        )
        sealed = tk.seal(claims, public)
        if args.json:
            _emit_json({"token": sealed, "claims": tk.redacted_claims(claims)})
        else:
            sys.stdout.write(sealed + "\n")
        return 0

    return _run("mint", body)


# --- token inspect ----------------------------------------------------------------------------


def _inspect(args: argparse.Namespace) -> int:
    def body() -> int:
        text: str = args.token
        if text == "-":
            text = sys.stdin.read(tk.MAX_TOKEN_LENGTH + 2)
        text = text.strip()
        envelope = tk.parse_envelope(text)
        report: dict[str, object] = {
            "prefix": tk.TOKEN_PREFIX,
            "kid": envelope.kid,
            "length": len(text),
            "sealed_bytes": len(envelope.sealed),
        }
        keyring = _inspect_keyring(args)
        if keyring is not None:
            claims = tk.unseal(text, keyring)
            try:
                tk.check_time(claims)
                report["status"] = "valid"
            except tk.TokenExpired as exc:
                report["status"] = str(exc)
            report["claims"] = tk.redacted_claims(claims)
        if args.json:
            _emit_json(report)
            return 0
        for name in ("prefix", "kid", "length", "sealed_bytes", "status"):
            if name in report:
                sys.stdout.write(f"{name}: {report[name]}\n")
        if "claims" in report:
            sys.stdout.write("claims: " + json.dumps(report["claims"], indent=2) + "\n")
        return 0

    return _run("token inspect", body)


def _inspect_keyring(args: argparse.Namespace) -> keys.Keyring | None:
    if args.key_dir is not None:
        return keys.Keyring.load(args.key_dir)
    if args.private_key is not None:
        return keys.Keyring([keys.load_private(args.private_key)])
    return None


# --- issuer serve -----------------------------------------------------------------------------


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` or `[IPv6]:PORT`; port 0 picks a free port."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise CliError(f"--listen {text!r} is not HOST:PORT or [IPv6]:PORT")
    return host, int(port)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _issuer_serve(args: argparse.Namespace) -> int:
    def body() -> int:
        # Imported here: aiohttp is needed by this command only, not by every `sealgate` run.
        from sealgate.audit import AuditLog
        from sealgate.issuer import service, webapp

        host, port = parse_listen(args.listen)
        if (args.tls_cert is None) != (args.tls_key is None):
            raise CliError("--tls-cert and --tls-key go together")
        if args.client_ca is not None and args.tls_cert is None:
            raise CliError("--client-ca needs --tls-cert and --tls-key")
        if args.tls_cert is None and not _is_loopback(host) and not args.insecure_plaintext:
            raise CliError(
                f"{host} is not a loopback address: serve TLS (--tls-cert/--tls-key), or give "
                "--insecure-plaintext if a TLS proxy sits in front"
            )
        if args.reload_interval < 0:
            raise CliError("--reload-interval must be 0 (off) or more")
        context = None
        if args.tls_cert is not None:
            try:
                context = webapp.tls_context(args.tls_cert, args.tls_key, args.client_ca)
            except (OSError, ValueError) as exc:
                raise CliError(f"cannot load the TLS files: {exc}") from None
        logging.basicConfig(
            level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
        )
        try:
            audit = AuditLog(args.audit_log, stdout=args.audit_stdout or args.audit_log is None)
        except OSError as exc:
            raise CliError(f"cannot open the audit log {args.audit_log}: {exc.strerror}") from None
        try:
            issuer = service.Issuer(args.keys, args.callers, audit)
            options = webapp.ServeOptions(host, port, context, args.reload_interval)
            asyncio.run(webapp.serve(issuer, options))
        except OSError as exc:
            raise CliError(f"cannot serve on {args.listen}: {exc.strerror or exc}") from None
        finally:
            audit.close()
        return 0

    return _run("issuer serve", body)


def _add_issuer(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    issuer_parser = sub.add_parser("issuer", help="the token issuer service")
    issuer_sub = issuer_parser.add_subparsers(
        dest="issuer_command", metavar="ACTION", required=True
    )
    serve = issuer_sub.add_parser(
        "serve",
        help="serve POST /v1/tokens, GET /v1/keys and GET /healthz",
        description="Mint tokens over HTTP for the callers in --callers, sealing to the newest "
        "public key in --keys. SIGHUP reloads keys and callers. See docs/issuer.md.",
    )
    serve.add_argument("--keys", type=Path, required=True, help="directory of <kid>.pub files")
    serve.add_argument("--callers", type=Path, required=True, help="the callers file (YAML)")
    serve.add_argument("--listen", default="127.0.0.1:8090", help="HOST:PORT (default %(default)s)")
    serve.add_argument("--tls-cert", type=Path, help="server certificate chain (PEM)")
    serve.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    serve.add_argument(
        "--client-ca", type=Path, help="CA (PEM) for client certificates; enables mTLS callers"
    )
    serve.add_argument("--audit-log", type=Path, help="append audit lines to this file")
    serve.add_argument(
        "--audit-stdout",
        action="store_true",
        help="also write audit lines to stdout (the default when --audit-log is not given)",
    )
    serve.add_argument(
        "--reload-interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="poll keys and callers for changes this often; 0 turns polling off "
        "(default %(default)s)",
    )
    serve.add_argument(
        "--insecure-plaintext",
        action="store_true",
        help="allow plain HTTP on a non-loopback address (only behind a TLS proxy)",
    )
    serve.set_defaults(func=_issuer_serve)


# --- registration -----------------------------------------------------------------------------


def _add_mint(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    mint = sub.add_parser(
        "mint",
        help="seal a secret into a token",
        description="Seal a secret into a token. The secret is read from stdin, a file or an "
        "environment variable, never from the command line.",
    )
    mint.add_argument(
        "--key",
        type=Path,
        required=True,
        help="a .pub file, or a directory of them (the newest is used)",
    )
    mint.add_argument(
        "--inject",
        required=True,
        choices=sorted(_PROCESSOR_OPTIONS),
        help="how the proxy puts the secret into the request",
    )
    mint.add_argument(
        "--host",
        action="append",
        required=True,
        help="allowed host: name, *.domain, IP, [IPv6]; optional :port (default 443); repeatable",
    )
    mint.add_argument("--ttl", default=DEFAULT_TTL, help=f"lifetime (default {DEFAULT_TTL})")
    mint.add_argument("--max-ttl", default="24h", help="refuse a --ttl above this (max 24h)")
    mint.add_argument("--method", action="append", help="allowed HTTP method; repeatable")
    mint.add_argument("--path", action="append", help="allowed path prefix; repeatable")
    mint.add_argument("--jti", help="token id (default: random)")
    source = mint.add_mutually_exclusive_group()
    source.add_argument("--secret-stdin", action="store_true", help="read the secret from stdin")
    source.add_argument("--secret-file", type=Path, help="read the secret from a file")
    source.add_argument("--secret-env", metavar="NAME", help="read the secret from $NAME")
    proc = mint.add_argument_group("processor options")
    proc.add_argument(
        "--header-name", help="header (header, hmac-sha256, placeholder [default Authorization])"
    )
    proc.add_argument(
        "--format",
        help="header value template: {secret} for header (default "
        "'{secret}'), {signature} for hmac-sha256 (default '{signature}')",
    )
    proc.add_argument("--username", help="basic: the username")
    proc.add_argument("--param", help="query: the parameter name")
    proc.add_argument("--hmac-message", help="hmac-sha256: sign this instead of the body")
    proc.add_argument(
        "--hmac-encoding",
        choices=("hex", "base64"),
        help="hmac-sha256: signature encoding (default hex)",
    )
    proc.add_argument("--placeholder", help="placeholder: the text to replace")
    bind = mint.add_mutually_exclusive_group()
    bind.add_argument("--bind-sandbox", metavar="ID", help="only this sandbox may use it")
    bind.add_argument("--bind-policy", metavar="POLICY", help="only this policy may use it")
    bind.add_argument(
        "--auth-digest-of-stdin",
        action="store_true",
        help="read a proxy bearer secret from stdin and require it "
        "(Proxy-Authorization: Bearer) at use",
    )
    bind.add_argument(
        "--auth-digest-of-file",
        type=Path,
        metavar="PATH",
        help="as --auth-digest-of-stdin, reading the file",
    )
    bind.add_argument(
        "--auth-digest-of-env", metavar="NAME", help="as --auth-digest-of-stdin, reading $NAME"
    )
    mint.add_argument(
        "--json",
        action="store_true",
        help="print the token and its claims (secret redacted) as JSON",
    )
    mint.set_defaults(func=_mint)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys_parser = sub.add_parser("keys", help="manage proxy key pairs")
    keys_sub = keys_parser.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    generate = keys_sub.add_parser("generate", help="create an X25519 key pair")
    generate.add_argument("--out", type=Path, required=True, help="directory for the key files")
    generate.add_argument("--json", action="store_true")
    generate.set_defaults(func=_keys_generate)
    listing = keys_sub.add_parser("list", help="show key ids and ages in a directory")
    listing.add_argument("--dir", type=Path, required=True)
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(func=_keys_list)

    _add_mint(sub)
    _add_issuer(sub)

    token_parser = sub.add_parser("token", help="look at tokens")
    token_sub = token_parser.add_subparsers(dest="token_command", metavar="ACTION", required=True)
    inspect = token_sub.add_parser(
        "inspect", help="show a token's visible part, and its claims (secret redacted) given a key"
    )
    inspect.add_argument("token", metavar="TOKEN", help="the token, or - to read it from stdin")
    key_source = inspect.add_mutually_exclusive_group()
    key_source.add_argument("--key-dir", type=Path, help="directory of private keys")
    key_source.add_argument("--private-key", type=Path, help="one private key file")
    inspect.add_argument("--json", action="store_true")
    inspect.set_defaults(func=_inspect)
