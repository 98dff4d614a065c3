"""`sealgate mcp serve` and `sealgate mcp gateway`: the MCP server and the gateway to upstream MCP
servers, started from the main virtualenv's `sealgate` command.

The server needs the `mcp` SDK, which lives in a virtualenv of its own (`var/mcp-venv`, made
by `make deps`: the SDK's h11 and mitmproxy's cannot share one). This command parses the
options and execs that virtualenv's python on `sealgate.mcp.sdk.serve` (or `.gateway`) with
them, so the process that serves is that python's, with the same pid. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sealgate.clikit import Subcommands, env_option

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
