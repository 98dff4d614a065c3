"""The `sealgate` command: one entry point, each part registers its own subcommands.

Only the part that runs is imported: `sealgate --help` lists every command from the table
below without importing any part (the proxy's alone pulls in mitmproxy, hundreds of ms), and
`sealgate sandbox exec` imports the sandbox's CLI and nothing of the proxy's.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from sealgate import __version__

# command -> (the module whose `register(subparsers)` adds it, the one-line help). A module
# sets `func=handler` (handler(args) -> exit code) on the parsers it adds, so a part's
# commands live next to the code they drive; tests/process/test_cli.py keeps the help in step.
COMMANDS: dict[str, tuple[str, str]] = {
    "proxy": ("sealgate.proxy.process.cli", "run the egress proxy"),
    "ca": ("sealgate.proxy.process.cli", "show the interception CA"),
    "env": ("sealgate.proxy.process.cli",
            "print the environment a client needs: the proxy and its CA for every runtime"),
    "sources": ("sealgate.proxy.process.cli", "source address -> sandbox registry (control API)"),
    "rules": ("sealgate.proxy.policy.cli", "check, explain, test and diff rules files"),
    "keys": ("sealgate.issuer.cli", "manage proxy key pairs"),
    "token": ("sealgate.issuer.cli", "look at tokens"),
    "mint": ("sealgate.issuer.cli", "seal a secret into a token"),
    "issuer": ("sealgate.issuer.cli", "the token issuer service"),
    "sandbox": ("sealgate.sandbox.cli",
                "run commands whose only way out is the proxy (root), and drive sandboxd"),
    "sandboxd": ("sealgate.sandbox.daemon.daemoncli",
                 "the sandbox daemon: long-lived sandboxes over an API, from a warm pool (root)"),
    "image": ("sealgate.sandbox.images.imagecli",
              "the image store: pull, import, list, remove and collect OCI images"),
    "template": ("sealgate.sandbox.clients.templatecli",
                 "build a template: an image plus setup commands, kept as an image (sandboxd)"),
    "kube": ("sealgate.kube.cli",
             "sealgate on Kubernetes: identity by pod, transparent mode in a pod"),
    "mcp": ("sealgate.mcp.cli", "serve the tools rules declare over MCP (Streamable HTTP)"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `command`, only that command's part is imported and registered in
    full (the others are listed by name and help)."""
    return _parser([COMMANDS[command][0]] if command in COMMANDS else [])


def full_parser() -> argparse.ArgumentParser:
    """Every part registered (for tests and documentation)."""
    return _parser(list(dict.fromkeys(module for module, _ in COMMANDS.values())))


def _parser(modules: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sealgate", description="Egress credential proxy and sandbox runtime."
    )
    parser.add_argument("--version", action="version", version=f"sealgate {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in modules:
        importlib.import_module(module).register(sub)
    for name, (_, text) in COMMANDS.items():
        if name not in sub.choices:
            sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in args_list if not a.startswith("-")), None)
    parser = build_parser(command)
    args = parser.parse_args(args_list)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        code: int = func(args)
    except BrokenPipeError:
        # The reader went away (`sealgate rules suggest ... | head`): nothing more to say, and
        # no traceback for it. Standard output is pointed at /dev/null so that the interpreter's
        # flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
