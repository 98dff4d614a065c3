"""What every part's `register(commands)` gets from sealgate.cli: the subcommand table, and
options an environment variable may set.

argparse names the type of `add_subparsers()`'s result only privately (`_SubParsersAction`);
this names the one method the parts call, so no part imports argparse's private class or
another part's CLI module to spell it.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Protocol


class Subcommands(Protocol):
    """`parser.add_subparsers()`: each `add_parser` adds one subcommand."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def env_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *flags: str, env: str,
               default: str | None = None, **kwargs: Any) -> argparse.Action:
    """An option whose default the environment variable `env` sets (the flag still wins).
    The action keeps `env` and the code's own default for the reference in docs/operations.md
    (sealgate/clidoc.py), which must not depend on the environment it was made in."""
    action = parser.add_argument(*flags, default=os.environ.get(env, default), **kwargs)
    action.env = env  # type: ignore[attr-defined]
    action.code_default = default  # type: ignore[attr-defined]
    return action
