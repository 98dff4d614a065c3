"""`sealgate mcp serve` and `sealgate mcp gateway`: the MCP server and the gateway to upstream MCP
servers, started from the main virtualenv's `sealgate` command; and `sealgate mcp token`, which
mints a bearer token bound to one sandbox for them (bearer.py).

The server needs the `mcp` SDK, which lives in a virtualenv of its own (`var/mcp-venv`, made
by `make deps`: the SDK's h11 and mitmproxy's cannot share one). This command parses the
options and execs that virtualenv's python on `sealgate.mcp.sdk.serve` (or `.gateway`) with
them, so the process that serves is that python's, with the same pid. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from sealgate.clikit import Subcommands, env_option

from .bearer import (
    DEFAULT_TTL,
    KEY_FILE,
    MAX_TTL,
    canonical_resource,
    check,
    create_key,
    mint,
)
from .options import add_gateway_options, add_serve_options, to_argv

# The checkout's own MCP virtualenv (`make deps`): mcp/ sits at the checkout's top.
DEFAULT_PYTHON = Path(__file__).resolve().parents[1] / "var" / "mcp-venv" / "bin" / "python"
SERVE_MODULE = "sealgate.mcp.sdk.serve"
GATEWAY_MODULE = "sealgate.mcp.sdk.gateway"


def register(sub: Subcommands) -> None:
    p = sub.add_parser("mcp", help="serve the tools rules declare over MCP (Streamable HTTP)")
    commands = p.add_subparsers(dest="mcp_command", metavar="COMMAND", required=True)
    serve = commands.add_parser(
        "serve", help="the MCP endpoint: a sandbox's policy's tools, each call decided, "
                      "injected, scrubbed and audited as the proxy would")
    add_serve_options(serve)
    gateway = commands.add_parser(
        "gateway", help="front the upstream MCP servers a policy declares (mcp_servers:): "
                        "listed tools only, arguments constrained, their credential injected, "
                        "answers scrubbed")
    add_gateway_options(gateway)
    for parser, module in ((serve, SERVE_MODULE), (gateway, GATEWAY_MODULE)):
        env_option(parser, "--python", metavar="PATH", env="SEALGATE_MCP_PYTHON",
                   help="the MCP virtualenv's python (default: the checkout's var/mcp-venv, "
                        "made by `make deps`)")
        parser.set_defaults(func=_serve, mcp_module=module)
    token = commands.add_parser(
        "token", help="mint a bearer token bound to one sandbox for the MCP endpoint, printed "
                      "on stdout (it is a credential: handle it as the sandbox's key)")
    token.add_argument("--sandbox", required=True, metavar="ID",
                       help="the sandbox of the rules the token identifies")
    token.add_argument("--audience", required=True, metavar="URL",
                       help="the endpoint's resource URI, as `sealgate mcp serve` prints it "
                            "(its --resource, else http://LISTEN/mcp)")
    token.add_argument("--ttl", type=int, default=DEFAULT_TTL, metavar="SECONDS",
                       help=f"how long the token lives (default {DEFAULT_TTL}, at most "
                            f"{MAX_TTL})")
    env_option(token, "--state", metavar="DIR", env="SEALGATE_STATE", default="var",
               help=f"the state directory the server reads: its {KEY_FILE} signs (made, "
                    "mode 0600, if absent)")
    token.set_defaults(func=_token)


def command(args: argparse.Namespace) -> list[str]:
    """The server process's command line: `-P` keeps the working directory off sys.path, where
    a checkout's mcp/ folder would shadow the SDK."""
    python = str(args.python or DEFAULT_PYTHON)
    module = getattr(args, "mcp_module", SERVE_MODULE)
    return [python, "-P", "-m", module, *to_argv(args)]


def _serve(args: argparse.Namespace) -> int:
    argv = command(args)
    if not os.access(argv[0], os.X_OK):
        print(f"sealgate mcp: no MCP virtualenv python at {argv[0]}: run `make deps`, or give "
              "--python (SEALGATE_MCP_PYTHON)", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    # The server's process from here on: the same pid, the MCP virtualenv's python.
    os.execv(argv[0], argv)  # noqa: S606 - our own command line, no shell


def _token(args: argparse.Namespace) -> int:
    """The token on stdout, and what it is for on stderr; never the key. Nothing secret comes
    from the command line: the key is read from (or made in) the state directory."""
    try:
        audience = canonical_resource(args.audience)
        check(args.sandbox, audience, args.ttl)
        key = create_key(Path(args.state) / KEY_FILE)
        now = int(time.time())
        token = mint(key, args.sandbox, audience, args.ttl, now)
    except (OSError, ValueError) as exc:
        print(f"sealgate mcp token: {exc}", file=sys.stderr)
        return 2
    print(token, flush=True)
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now + args.ttl))
    print(f"sealgate mcp token: {args.sandbox} at {audience} until {until} (key {key.kid})",
          file=sys.stderr)
    return 0
