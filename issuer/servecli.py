"""`sealgate issuer serve`: the issuer service's command line (docs/issuer.md)."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
from pathlib import Path

from sealgate import oplog
from sealgate.audit import AuditLog
from sealgate.clikit import Subcommands
from sealgate.credentials.keys import KeyFileError
from sealgate.hostport import parse_hostport

from .callers import CallersFileError
from .clibase import CliError, run
from .service import Issuer

__all__ = ["add_issuer", "parse_listen"]


def parse_listen(text: str, flag: str = "--listen") -> tuple[str, int]:
    """`HOST:PORT` or `[IPv6]:PORT`; port 0 picks a free port."""
    problem = CliError(f"{flag} {text!r} is not HOST:PORT or [IPv6]:PORT")
    try:
        host, port = parse_hostport(text)
    except ValueError:
        raise problem from None
    if not host:
        raise problem
    return host, port


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
        from . import webapp

        host, port = parse_listen(args.listen)
        admin = parse_listen(args.admin, "--admin") if args.admin else None
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
        # The command line is checked: from here on every message is a log line.
        oplog.configure(args.log_format, args.log_level)
        try:
            audit = AuditLog(args.audit_log, stdout=args.audit_stdout or args.audit_log is None)
        except OSError as exc:
            return _cannot_start(f"cannot open the audit log {args.audit_log}: {exc.strerror}")
        try:
            issuer = Issuer(args.keys, args.callers, audit)
            options = webapp.ServeOptions(host, port, context, args.reload_interval, admin)
            asyncio.run(webapp.serve(issuer, options))
        except OSError as exc:
            return _cannot_start(f"cannot serve on {args.listen}: {exc.strerror or exc}")
        except (KeyFileError, CallersFileError) as exc:
            return _cannot_start(str(exc))
        finally:
            audit.close()
        return 0

    return run("issuer serve", body)


def _cannot_start(error: str) -> int:
    logging.getLogger("sealgate.issuer").error("the issuer cannot start", extra={"error": error})
    return 1


def add_issuer(sub: Subcommands) -> None:
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
    serve.add_argument("--keys", type=Path, metavar="DIR", required=True,
                       help="directory of <kid>.pub files")
    serve.add_argument("--callers", type=Path, metavar="FILE", required=True,
                       help="the callers file (YAML)")
    serve.add_argument("--listen", metavar="HOST:PORT", default="127.0.0.1:8090",
                       help="HOST:PORT (default %(default)s)")
    serve.add_argument("--tls-cert", type=Path, metavar="FILE",
                       help="server certificate chain (PEM)")
    serve.add_argument("--tls-key", type=Path, metavar="FILE", help="server private key (PEM)")
    serve.add_argument(
        "--client-ca", type=Path, metavar="FILE",
        help="CA (PEM) for client certificates; enables mTLS callers",
    )
    serve.add_argument("--admin", metavar="HOST:PORT",
                       help="serve GET /healthz and /readyz there (plain HTTP, no service)")
    serve.add_argument("--audit-log", type=Path, metavar="FILE",
                       help="append audit lines to this file")
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
    oplog.add_flags(serve)
    serve.set_defaults(func=_issuer_serve)
