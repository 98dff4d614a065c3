"""`sealgate keys`, `sealgate mint`, `sealgate token inspect` and `sealgate issuer serve`: the
issuer's commands, registered here. `mint` is `mintcli.py`, `issuer serve` `servecli.py`, what
they share `clibase.py`.

No output of these commands ever contains a secret.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from sealgate import credentials as tk
from sealgate.clikit import Subcommands
from sealgate.credentials import keys

from .clibase import emit_json, format_age, run
from .mintcli import add_mint
from .servecli import add_issuer

__all__ = ["register"]


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
            emit_json(info)
        else:
            sys.stdout.write(
                f"kid {entry.kid}\n"
                f"private key {info['private_key_file']} (proxy only, mode 0600)\n"
                f"public key  {info['public_key_file']} (give to the issuer)\n"
            )
        return 0

    return run("keys generate", body)


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
            emit_json({"directory": str(args.dir), "keys": rows})
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

    return run("keys list", body)


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
            emit_json(report)
            return 0
        for name in ("prefix", "kid", "length", "sealed_bytes", "status"):
            if name in report:
                sys.stdout.write(f"{name}: {report[name]}\n")
        if "claims" in report:
            sys.stdout.write("claims: " + json.dumps(report["claims"], indent=2) + "\n")
        return 0

    return run("token inspect", body)


def _inspect_keyring(args: argparse.Namespace) -> keys.Keyring | None:
    if args.key_dir is not None:
        return keys.Keyring.load(args.key_dir)
    if args.private_key is not None:
        return keys.Keyring([keys.load_private(args.private_key)])
    return None


# --- registration -----------------------------------------------------------------------------


def register(sub: Subcommands) -> None:
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

    add_mint(sub)
    add_issuer(sub)

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
