"""The options of `sealgate mcp serve`, declared once: the CLI (main virtualenv) parses them and
hands them on as arguments (`to_argv`) to the server's process (the MCP virtualenv), which
parses them again with the same parser. Standard library only."""

from __future__ import annotations

import argparse
from typing import Final

from sealgate.clikit import env_option

from .bearer import canonical_resource

# The HTTP server's bounds on connections (sdk/conngate.py; here, where a process without the
# SDK's packages can read them).
PER_PEER: Final = 32  # connections at once from one address
HEAD_SECONDS: Final = 10.0  # from a connection's start, or a response's end, to a whole head

__all__ = ["DEFAULT_GATEWAY_LISTEN", "DEFAULT_LISTEN", "MAX_BODY", "add_gateway_options",
           "add_serve_options", "to_argv"]

DEFAULT_LISTEN: Final = "127.0.0.1:8765"
DEFAULT_GATEWAY_LISTEN: Final = "127.0.0.1:8766"
MAX_BODY: Final = 1 << 20
# dest -> flag, for the options handed on; `python` stays with the CLI.
_FLAGS: Final = {
    "listen": "--listen", "rules": "--rules", "state": "--state", "resolver": "--resolver",
    "upstream_ca": "--upstream-ca", "audit_log": "--audit-log", "max_body": "--max-body",
    "sandbox": "--sandbox", "resource": "--resource",
}
_SWITCHES: Final = {"stdio": "--stdio"}
_LISTS: Final = {"secret_store": "--secret-store", "sandbox_network": "--sandbox-network",
                  "authorization_server": "--authorization-server"}


def add_serve_options(p: argparse.ArgumentParser) -> None:
    env_option(p, "--listen", metavar="HOST:PORT", env="SEALGATE_MCP_LISTEN",
               default=DEFAULT_LISTEN, help="where the MCP endpoint (POST /mcp) listens")
    _shared(p)
    p.add_argument("--stdio", action="store_true",
                   help="serve over stdin and stdout instead of HTTP, for one local client "
                        "that starts this process (its caller is --sandbox)")
    p.add_argument("--sandbox", metavar="ID",
                   help="with --stdio: the sandbox id of the rules whose policy's tools are "
                        "served (default: the rules' default policy)")


def add_gateway_options(p: argparse.ArgumentParser) -> None:
    env_option(p, "--listen", metavar="HOST:PORT", env="SEALGATE_MCP_GATEWAY_LISTEN",
               default=DEFAULT_GATEWAY_LISTEN,
               help="where the gateway's endpoints (POST /mcp/<server>) listen")
    _shared(p)


def _shared(p: argparse.ArgumentParser) -> None:
    env_option(p, "--rules", metavar="PATH", env="SEALGATE_RULES", default="rules",
               help="rules file or directory (the same as the proxy's)")
    env_option(p, "--state", metavar="DIR", env="SEALGATE_STATE", default="var",
               help="the proxy's state directory: its source registry (who a sandbox address "
                    "is), secrets.yaml, audit.log")
    env_option(p, "--resolver", metavar="HOST:PORT", env="SEALGATE_RESOLVER",
               help="DNS server HOST:PORT the guard uses (default: system nameservers)")
    p.add_argument("--sandbox-network", action="append", default=[], metavar="CIDR",
                   help="sandbox range never connected to; repeatable (default 10.200.0.0/16)")
    env_option(p, "--upstream-ca", metavar="FILE", env="SEALGATE_UPSTREAM_CA",
               help="CA bundle to verify the tools' APIs with (default: the system's)")
    p.add_argument("--secret-store", action="append", default=[], metavar="URL",
                   help="secret store for the credentials tools carry (file:PATH, env:PREFIX, "
                        "vault:URL); repeatable (default file:<state>/secrets.yaml)")
    env_option(p, "--audit-log", metavar="PATH", env="SEALGATE_MCP_AUDIT_LOG",
               help="audit log file (default <state>/audit.log, one line per tool call); "
                    "'off' for none")
    env_option(p, "--max-body", metavar="BYTES", type=int, env="SEALGATE_MCP_MAX_BODY",
               default=str(MAX_BODY), help="the largest JSON-RPC message accepted")
    env_option(p, "--resource", metavar="URL", type=_resource, env="SEALGATE_MCP_RESOURCE",
               help="the endpoint's resource URI as its clients reach it: the audience bearer "
                    "tokens must name (default http://LISTEN/mcp; give it behind a wildcard "
                    "--listen, a port forward or a TLS front)")
    p.add_argument("--authorization-server", action="append", default=[], metavar="URL",
                   type=_authorization_server,
                   help="an OAuth authorization server that issues this endpoint's tokens, "
                        "named in its resource metadata; repeatable (default: none, sealgate "
                        "mints them: sealgate mcp token)")


def _resource(text: str) -> str:
    try:
        return canonical_resource(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _authorization_server(text: str) -> str:
    """An issuer identifier as RFC 8414 has it: https, no query or fragment."""
    found = _resource(text)
    if not found.startswith("https://"):
        raise argparse.ArgumentTypeError(f"{text[:80]!r}: an authorization server is https")
    return found


def to_argv(args: argparse.Namespace) -> list[str]:
    """The serve options of `args` as arguments that parse back to the same values."""
    argv: list[str] = []
    for dest, flag in _FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            argv += [flag, str(value)]
    for dest, flag in _SWITCHES.items():
        if getattr(args, dest, False):
            argv.append(flag)
    for dest, flag in _LISTS.items():
        for value in getattr(args, dest, None) or ():
            argv += [flag, str(value)]
    return argv
