"""`sealgate mint`: seal a secret into a token (docs/token-format.md §9)."""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from pathlib import Path
from typing import Final

from sealgate import credentials as tk
from sealgate.clikit import Subcommands
from sealgate.credentials import keys
from sealgate.credentials import processors as pr

from .clibase import CliError, emit_json, parse_duration, read_source, run

__all__ = ["DEFAULT_TTL", "add_mint"]

DEFAULT_TTL: Final = "15m"

# Every processor option; each --inject kind takes its processor's (`cli_options`), no other.
_ALL_PROCESSOR_OPTIONS: Final = frozenset[str]().union(
    *(cls.cli_options.values() for cls in pr.PROCESSOR_TYPES.values()))


def _processor(args: argparse.Namespace) -> pr.Processor:
    kind: str = args.inject
    cls = pr.PROCESSOR_TYPES[kind]  # argparse's choices
    given = {name for name in _ALL_PROCESSOR_OPTIONS if getattr(args, name) is not None}
    stray = sorted(given - set(cls.cli_options.values()))
    if stray:
        flags = ", ".join("--" + name.replace("_", "-") for name in stray)
        raise CliError(f"--inject {kind} does not take {flags}")
    # Only what was given, or what the command line defaults: the processor's own defaults
    # stay the one source of the rest.
    fields: dict[str, str] = {"type": kind}
    required = cls.required_fields()
    for name, option in cls.cli_options.items():
        value: str | None = getattr(args, option)
        if not value:
            value = cls.cli_defaults.get(name, value)
        if value is None:
            if name in required:
                raise CliError(f"--inject {kind} needs --{option.replace('_', '-')}")
            continue
        fields[name] = value
    return cls.from_fields(fields)


def _binding(args: argparse.Namespace) -> tk.Binding | None:
    if args.bind_sandbox is not None:
        return tk.SandboxBinding(args.bind_sandbox)
    if args.bind_policy is not None:
        return tk.PolicyBinding(args.bind_policy)
    auth = read_source(
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
        hosts = tuple(tk.Destination.parse(host) for host in args.host)
        processor = _processor(args)
        public = _load_sealing_key(args.key)
        binding = _binding(args)
        secret = read_source(args.secret_stdin, args.secret_file, args.secret_env, "secret")
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
            emit_json({"token": sealed, "claims": tk.redacted_claims(claims)})
        else:
            sys.stdout.write(sealed + "\n")
        return 0

    return run("mint", body)


def add_mint(sub: Subcommands) -> None:
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
        choices=sorted(pr.PROCESSOR_TYPES),
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
    proc.add_argument(
        "--placeholder",
        help="placeholder: the text to replace; aws-sigv4: the key id the sandbox signs with "
        f"(default {pr.AWS_PLACEHOLDER_KEY_ID})",
    )
    proc.add_argument("--aws-services", metavar="S3,STS",
                      help="aws-sigv4: the services it re-signs for, comma-separated")
    proc.add_argument("--aws-regions", metavar="REGIONS",
                      help="aws-sigv4: the regions it re-signs for, comma-separated")
    proc.add_argument("--token-url", help="oauth2: the token endpoint (the sandbox's policy "
                      "must allow a POST to it)")
    proc.add_argument("--grant", choices=("refresh_token", "client_credentials"),
                      help="oauth2: the grant (default refresh_token)")
    proc.add_argument("--scopes", help="oauth2, gcp-service-account: scopes, comma-separated")
    proc.add_argument("--audience", help="oauth2: the audience; gcp-service-account: an ID "
                      "token's audience")
    proc.add_argument("--client-auth", choices=("basic", "body"),
                      help="oauth2: client id and secret in HTTP Basic (default) or the body")
    proc.add_argument("--installation-id", help="github-app: the installation")
    proc.add_argument("--github-api", help="github-app: the API (default https://api.github.com)")
    proc.add_argument("--repositories", help="github-app: narrow to these repositories, "
                      "comma-separated")
    proc.add_argument("--permissions", help="github-app: narrow to these, name:level, "
                      "comma-separated")
    proc.add_argument("--scheme", choices=pr.SCHEMES,
                      help="oauth2, github-app: Authorization's scheme for the token (default "
                      "Bearer for oauth2, token for github-app)")
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
