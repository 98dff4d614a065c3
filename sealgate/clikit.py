"""What every part's `register(commands)` gets from sealgate.cli: the subcommand table.

argparse names the type of `add_subparsers()`'s result only privately (`_SubParsersAction`);
this names the one method the parts call, so no part imports argparse's private class or
another part's CLI module to spell it.
"""

from __future__ import annotations

import argparse
from typing import Any, Protocol


class Subcommands(Protocol):
    """`parser.add_subparsers()`: each `add_parser` adds one subcommand."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...
