"""The `sealgate` command: one entry point, each part registers its own subcommands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sealgate import __version__
from sealgate.issuer import cli as issuer_cli
from sealgate.proxy import cli as proxy_cli
from sealgate.proxy.policy import cli as rules_cli
from sealgate.sandbox import cli as sandbox_cli
from sealgate.sandbox import daemoncli

# Each module exposes `register(subparsers)` and sets `func=handler` (handler(args) -> exit code)
# on the parsers it adds, so a part's commands live next to the code they drive.
_COMMAND_MODULES = (proxy_cli, rules_cli, issuer_cli, sandbox_cli, daemoncli)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sealgate", description="Egress credential proxy and sandbox runtime."
    )
    parser.add_argument("--version", action="version", version=f"sealgate {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    code: int = func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
