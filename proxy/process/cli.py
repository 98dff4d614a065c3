"""`sealgate proxy`, `sealgate ca` and `sealgate sources`: running and steering the proxy.

mitmproxy is imported inside the handlers: every `sealgate` command builds this parser, and
only `proxy` needs the second it takes to import.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sealgate import oplog
from sealgate.clikit import Subcommands, env_option
from sealgate.hostport import format_hostport, parse_hostport

from . import statedir
from .controlclient import ControlError, call

_log = logging.getLogger("sealgate.proxy")

if TYPE_CHECKING:
    from ..engine.limits import HttpLimits
    from .master import ProxyConfig


def register(sub: Subcommands) -> None:
    p = sub.add_parser("proxy", help="run the egress proxy")
    env_option(p, "--listen", metavar="HOST:PORT", env="SEALGATE_LISTEN", default="127.0.0.1:8080",
               help="explicit proxy listen address HOST:PORT")
    env_option(p, "--transparent", metavar="HOST:PORT", env="SEALGATE_TRANSPARENT",
               help="also listen for redirected (iptables/nftables) traffic on HOST:PORT")
    env_option(p, "--rules", metavar="PATH", env="SEALGATE_RULES", default="rules",
               help="rules file or directory")
    env_option(p, "--state", metavar="DIR", env="SEALGATE_STATE", default="var",
               help="state directory: CA, registry, audit log, control socket")
    env_option(p, "--resolver", metavar="HOST:PORT", env="SEALGATE_RESOLVER",
               help="DNS server HOST:PORT the guard uses (default: system nameservers)")
    p.add_argument("--sandbox-network", action="append", default=[], metavar="CIDR",
                   help="sandbox range never connected to, whatever allow_networks say; "
                        "repeatable (default 10.200.0.0/16, the sandbox runtime's)")
    env_option(p, "--workers", metavar="N", type=int, env="SEALGATE_WORKERS", default="1",
               help="worker processes sharing the port (SO_REUSEPORT)")
    env_option(p, "--upstream-ca", metavar="FILE", env="SEALGATE_UPSTREAM_CA",
               help="CA bundle to verify upstream servers with (default: certifi)")
    env_option(p, "--admin", "--metrics-listen", metavar="HOST:PORT", dest="admin",
               env="SEALGATE_ADMIN",
               help="serve GET /healthz, /readyz and /metrics (Prometheus text: requests "
                    "by decision and reason, refusals, connections, memory) on HOST:PORT; "
                    "--metrics-listen is its older name. The metrics are on the control "
                    "socket at /v1/metrics too")
    p.add_argument("--audit-stdout", action="store_true", help="also print audit lines")
    env_option(p, "--connect-timeout", metavar="SECONDS", type=float,
               env="SEALGATE_CONNECT_TIMEOUT", default="10",
               help="seconds an upstream dial may take, and then the proxy's TLS handshake "
                    "with it, before 504 connect_timeout")
    env_option(p, "--drain-timeout", metavar="SECONDS", type=float, env="SEALGATE_DRAIN_TIMEOUT",
               default="30",
               help="on SIGTERM, seconds requests in flight may take to finish before the "
                    "proxy closes them (it stops accepting at once)")
    env_option(p, "--idle-timeout", metavar="SECONDS", type=float, env="SEALGATE_IDLE_TIMEOUT",
               default="60",
               help="seconds a connection may pass with nothing sent either way")
    env_option(p, "--response-timeout", metavar="SECONDS", type=float,
               env="SEALGATE_RESPONSE_TIMEOUT", default="60",
               help="seconds an upstream may take from a request sent in full to its "
                    "response head (504 upstream_timeout after; a rule's response_timeout "
                    "replaces it)")
    env_option(p, "--handshake-timeout", metavar="SECONDS", type=float,
               env="SEALGATE_HANDSHAKE_TIMEOUT", default="10",
               help="seconds a connection that starts with TLS (after its CONNECT, or "
                    "redirected) has to finish the handshake; closed after")
    env_option(p, "--header-timeout", metavar="SECONDS", type=float, env="SEALGATE_HEADER_TIMEOUT",
               default="10",
               help="seconds a request head may take from its first byte (408 after)")
    env_option(p, "--linger-timeout", metavar="SECONDS", type=float, env="SEALGATE_LINGER_TIMEOUT",
               default="5",
               help="seconds after refusing a request at its head that its body is still "
                    "read and dropped, so that a client still sending it reads the refusal")
    p.add_argument("--linger-bytes", metavar="N", type=int, default=64 * 1024 * 1024,
                   help="most bytes of refused bodies read and dropped per connection")
    p.add_argument("--max-header-bytes", metavar="N", type=int, default=64 * 1024,
                   help="most bytes of a request head, line and fields (431 over)")
    p.add_argument("--max-header-fields", metavar="N", type=int, default=100,
                   help="most header fields of a request (431 over)")
    p.add_argument("--max-connections", metavar="N", type=int, default=0,
                   help="most client connections a worker holds (0: what the descriptor limit "
                        "allows); more are closed as they are accepted")
    p.add_argument("--max-connections-per-source", metavar="N", type=int, default=512,
                   help="most client connections one source address holds in a worker")
    p.add_argument("--max-uri-bytes", metavar="N", type=int, default=8 * 1024,
                   help="most bytes of a request target (414 over)")
    env_option(p, "--token-keys", metavar="DIR", env="SEALGATE_TOKEN_KEYS",
               help="directory of private token keys (<kid>.key); unset: tokens refused")
    p.add_argument("--secret-store", action="append", default=[], metavar="URL",
                   help="secret store for brokered credentials, repeatable: file:PATH, env:, "
                        "vault:https://HOST:8200?auth=… (default file:<state>/secrets.yaml)")
    p.add_argument("--set", action="append", default=[], metavar="OPTION=VALUE",
                   help="set a mitmproxy option (repeatable)")
    oplog.add_flags(p)
    p.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=_run_proxy)

    c = sub.add_parser("ca", help="show the interception CA")
    env_option(c, "--state", env="SEALGATE_STATE", default="var",
               help="the proxy's state directory (default $SEALGATE_STATE or var)")
    c.add_argument("--print", action="store_true", dest="print_pem",
                   help="print the CA certificate (PEM) for a trust store")
    c.add_argument("--create", action="store_true",
                   help="create the CA if there is none (before the proxy first runs, to bake "
                        "into images); without it a missing CA is an error")
    c.set_defaults(func=_run_ca)

    e = sub.add_parser("env", help="print the environment a client needs: the proxy and its CA "
                                   "for every runtime")
    env_option(e, "--state", env="SEALGATE_STATE", default="var",
               help="the proxy's state directory, for its CA")
    env_option(e, "--proxy", env="SEALGATE_LISTEN", default="127.0.0.1:8080",
               metavar="HOST:PORT", help="where clients reach the proxy")
    e.add_argument("--sandbox", help="the sandbox id, put in the proxy URL with --key-file")
    e.add_argument("--key-file", type=Path, help="the sandbox's proxy key (a file, never an "
                                                 "argument); printed inside the proxy URL")
    e.add_argument("--bundle", type=Path, help="where to write the bundle of system roots plus "
                                               "the proxy's CA (default <state>/ca/bundle.pem)")
    env_option(e, "--mcp", env="SEALGATE_MCP_LISTEN", metavar="HOST:PORT",
               help="where clients reach `sealgate mcp serve`: printed as SEALGATE_MCP_URL "
                    "(http://HOST:PORT/mcp), reached directly (in NO_PROXY)")
    e.add_argument("--format", choices=("sh", "dotenv", "json"), default="sh")
    e.set_defaults(func=_run_env)

    s = sub.add_parser("sources", help="source address -> sandbox registry (control API)")
    env_option(s, "--state", env="SEALGATE_STATE", default="var")
    s.add_argument("--json", action="store_true")
    ss = s.add_subparsers(dest="action", required=True)
    ss.add_parser("list")
    add = ss.add_parser("add")
    add.add_argument("address")
    add.add_argument("sandbox")
    rm = ss.add_parser("rm")
    rm.add_argument("address")
    s.set_defaults(func=_run_sources)


def config_from_args(args: argparse.Namespace) -> ProxyConfig:
    from .master import ProxyConfig

    for item in args.set:
        if "=" not in item:
            raise SystemExit(f"sealgate: --set needs OPTION=VALUE, got {item!r}")
    return ProxyConfig(
        listen=_listen_address(args.listen),
        transparent=_listen_address(args.transparent) if args.transparent else None,
        admin=_listen_address(args.admin) if args.admin else None,
        rules=Path(args.rules),
        state=Path(args.state),
        resolver=args.resolver,
        workers=max(1, args.workers),
        upstream_ca=Path(args.upstream_ca) if args.upstream_ca else None,
        audit_stdout=args.audit_stdout,
        connect_timeout=args.connect_timeout,
        drain_timeout=max(0.0, args.drain_timeout),
        limits=_limits(args),
        token_keys=Path(args.token_keys) if args.token_keys else None,
        secret_stores=tuple(args.secret_store),
        # An option of the addon only: mitmproxy collects repeated values of a list option.
        extra=(*(f"sealgate_sandbox_networks={n}" for n in args.sandbox_network),
               f"sealgate_max_connections={max(0, args.max_connections)}",
               f"sealgate_max_connections_per_source={max(1, args.max_connections_per_source)}",
               f"sealgate_handshake_timeout={args.handshake_timeout}",
               *args.set),
    )


def _limits(args: argparse.Namespace) -> HttpLimits:
    from ..engine.limits import HttpLimits

    try:
        return HttpLimits(args.max_header_bytes, args.max_header_fields, args.max_uri_bytes,
                      args.header_timeout, args.idle_timeout, args.response_timeout,
                      linger_bytes=args.linger_bytes, linger_seconds=args.linger_timeout)
    except ValueError as exc:
        raise SystemExit(f"sealgate: {exc}") from None


def _run_proxy(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    # First: from here on every message of the proxy is a log line (the workers run this too).
    oplog.configure(args.log_format, args.log_level)
    try:
        return _serve(args, config)
    finally:
        _master_gone()


def _master_gone() -> None:
    """The master's log handler stays on the root logger after its event loop closed, and
    would raise for every record logged after (mitmproxy's LegacyLogEvents): taken off."""
    from mitmproxy.log import MitmLogHandler

    for handler in logging.getLogger().handlers:
        if isinstance(handler, MitmLogHandler):
            handler.uninstall()


def _serve(args: argparse.Namespace, config: ProxyConfig) -> int:
    from mitmproxy import exceptions

    from ..engine import mitm

    try:
        # Before anything starts: a mitmproxy the patches were not made for is refused here,
        # not found out by each worker.
        mitm.require_tested()
    except mitm.MitmproxyMismatch as exc:
        _log.error("the proxy cannot start", extra={"error": str(exc)})
        return 2
    from . import supervisor
    from .master import prepare

    if args.worker_index is None:
        prepare(config)
    try:
        if config.workers > 1 and args.worker_index is None:
            return asyncio.run(supervisor.supervise(config))
        return asyncio.run(supervisor.serve_one(config, args.worker_index))
    except exceptions.OptionsError as exc:
        # mitmproxy rolls a failed option update back, re-running configure on the defaults;
        # an error there would mask the one that matters, which is the first in the chain.
        first: BaseException = exc
        seen: BaseException | None = exc
        while seen is not None:
            if isinstance(seen, exceptions.OptionsError):
                first = seen
            seen = seen.__context__
        _master_gone()
        _log.error("the proxy cannot start", extra={"error": str(first)})
        return 2


def _run_ca(args: argparse.Namespace) -> int:
    from .ca import ensure_ca

    state = Path(args.state).resolve()
    confdir = statedir.confdir(state)
    # Never a new CA by accident: one made here, where the proxy does not look, would be
    # trusted by whoever asked while the proxy signs with another.
    if not args.create and not statedir.ca_bundle_path(state).is_file():
        print(f"sealgate: no proxy CA in {confdir}: the proxy makes it in its state directory "
              "when it first starts; give that directory as --state (or $SEALGATE_STATE), or "
              "--create to make one there now", file=sys.stderr)
        return 1
    cert = ensure_ca(confdir)
    if args.print_pem:
        sys.stdout.write(cert.read_text())
    else:
        print(cert)
    return 0


def _run_env(args: argparse.Namespace) -> int:
    from urllib.parse import quote

    from sealgate import clientenv

    cert = statedir.ca_bundle_path(Path(args.state).resolve())
    if not cert.is_file():
        print(f"sealgate: no proxy CA at {cert}: give the proxy's state directory as --state",
              file=sys.stderr)
        return 1
    try:
        host, port = parse_hostport(args.proxy)
    except ValueError as exc:
        print(f"sealgate: --proxy: {exc}", file=sys.stderr)
        return 2
    mcp = None
    if args.mcp:
        try:
            mcp = f"http://{format_hostport(*parse_hostport(args.mcp))}/mcp"
        except ValueError as exc:
            print(f"sealgate: --mcp: {exc}", file=sys.stderr)
            return 2
    credentials = ""
    if args.key_file is not None:
        if not args.sandbox:
            print("sealgate: --key-file needs --sandbox", file=sys.stderr)
            return 2
        try:
            key = args.key_file.read_text().strip()
        except OSError as exc:
            print(f"sealgate: --key-file: {exc.strerror}", file=sys.stderr)
            return 2
        credentials = f"{quote(args.sandbox, safe='')}:{quote(key, safe='')}@"
    bundle = (args.bundle or cert.with_name("bundle.pem")).resolve()
    roots = Path("/etc/ssl/certs/ca-certificates.crt")
    system = roots.read_bytes().rstrip(b"\n") + b"\n" if roots.is_file() else b""
    try:
        bundle.write_bytes(system + cert.read_bytes())
        bundle.chmod(0o644)
    except OSError as exc:
        print(f"sealgate: cannot write the bundle {bundle}: {exc.strerror}", file=sys.stderr)
        return 1
    url = f"http://{credentials}{format_hostport(host, port)}"
    if closed := _closed_to_others(bundle):
        # The default place is beside the CA's key, in a directory only its owner may enter.
        print(f"sealgate: note: only {closed[0]}'s owner can reach the bundle {bundle}; a "
              "client running as another user needs --bundle in a place it can read",
              file=sys.stderr)
    sys.stdout.write(clientenv.render(clientenv.variables(url, str(bundle), mcp), args.format))
    return 0


def _closed_to_others(path: Path) -> list[Path]:
    """The directories above `path` that a user other than their owner cannot enter."""
    return [d for d in path.parents if not d.stat().st_mode & 0o001]


def _run_sources(args: argparse.Namespace) -> int:
    base = "/v1/sources"
    sock = statedir.control_socket(Path(args.state))
    try:
        if args.action == "list":
            status, body = call(sock, "GET", base)
        elif args.action == "add":
            status, body = call(sock, "PUT", f"{base}/{args.address}", {"sandbox": args.sandbox})
        else:
            status, body = call(sock, "DELETE", f"{base}/{args.address}")
    except ControlError as exc:
        print(f"sealgate: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(body))
    elif status >= 400:
        print(f"sealgate: {body.get('error')}: {body.get('detail')}", file=sys.stderr)
    elif args.action == "list":
        for address, sandbox in body["sources"].items():
            print(f"{address:<40} {sandbox}")
    else:
        print("ok")
    return 0 if status < 400 else 1


def _listen_address(text: str) -> tuple[str, int]:
    """`--listen` / `--transparent`: a port is required, the host defaults to loopback."""
    try:
        host, port = parse_hostport(text)
        if port == 0:
            raise ValueError("a listener needs a port")
    except ValueError:
        raise SystemExit(f"sealgate: expected HOST:PORT, got {text!r}") from None
    return host or "127.0.0.1", port
