"""What a token's scope is written in (docs/token-format.md §5): host patterns and path
prefixes, the rules for writing them, and which request hosts and paths they match.

Host patterns mean what the rules' host patterns mean (`hostname.HostPattern`, one grammar for
both); the token asks more of their spelling, since what is sealed is exactly what is matched.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from sealgate import hostname

from .errors import TokenMalformed
from .jsonfields import show

__all__ = ["DEFAULT_PORT", "Destination", "check_path_prefix", "path_allowed"]

DEFAULT_PORT: Final = 443
_MAX_PATTERN: Final = 300
_MAX_PREFIX: Final = 1024
_VISIBLE: Final = re.compile(r"[\x21-\x7e]+")


def _host_error(text: str, why: str) -> TokenMalformed:
    return TokenMalformed(f"host pattern {show(text, 80)}: {why}")


@dataclass(frozen=True)
class Destination:
    """One allowed destination: `hostname.HostPattern` (an exact host, or with `wildcard` any
    host strictly below it) on one port, 443 unless the pattern names another."""

    host: str
    port: int = DEFAULT_PORT
    wildcard: bool = False
    _pattern: hostname.HostPattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Checked here, not only in `parse`, so that a pattern built directly cannot be sealed
        # into a token the proxy would then refuse (or read differently).
        if not 1 <= self.port <= 65535:
            raise _host_error(str(self), "port must be 1-65535")
        try:
            pattern = hostname.parse_host_pattern(
                hostname.WILDCARD + self.host if self.wildcard else self.host
            )
        except hostname.HostError as exc:
            raise _host_error(str(self), str(exc)) from None
        if pattern.host.name != self.host:
            why = "not canonical (lowercase, no trailing dot, IDNs as xn--, IPv6 compressed)"
            raise _host_error(str(self), why)
        if pattern.host.ip is None:
            labels = self.host.split(".")
            if any(label.startswith("-") or label.endswith("-") for label in labels):
                raise _host_error(str(self), "a label may not start or end with '-'")
            if self.wildcard and len(labels) < 2:
                raise _host_error(str(self), "a wildcard needs at least two labels after '*.'")
        object.__setattr__(self, "_pattern", pattern)

    @classmethod
    def parse(cls, text: str) -> Destination:
        """Parse `name`, `*.name`, `a.b.c.d` or `[v6]`, each optionally with `:port`."""
        if len(text) > _MAX_PATTERN or not text.isascii():
            raise _host_error(text, f"must be at most {_MAX_PATTERN} ASCII characters")
        lowered = text.lower()
        wildcard = lowered.startswith(hostname.WILDCARD)
        authority = lowered[len(hostname.WILDCARD) :] if wildcard else lowered
        try:
            host, port = hostname.split_authority(authority, DEFAULT_PORT)
        except hostname.HostError as exc:
            raise _host_error(text, str(exc)) from None
        # The one spelling an ASCII name loses to canonicalisation besides case.
        if host.ip is None and authority.partition(":")[0] != host.name:
            raise _host_error(text, "a name may not end in '.'")
        return cls(host.name, port, wildcard)

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        text = hostname.WILDCARD + host if self.wildcard else host
        return text if self.port == DEFAULT_PORT else f"{text}:{self.port}"

    def matches(self, host: hostname.Host, port: int) -> bool:
        return port == self.port and self._pattern.matches(host)


def check_path_prefix(prefix: str) -> None:
    if (
        not prefix.startswith("/")
        or len(prefix) > _MAX_PREFIX
        or not _VISIBLE.fullmatch(prefix)
        or any(char in prefix for char in "?#\\")
        or _has_dot_segment(prefix)
    ):
        raise TokenMalformed(
            f"paths must be 1-{_MAX_PREFIX} visible ASCII characters starting with '/', "
            "without '?', '#', '\\' or dot segments"
        )


def _has_dot_segment(path: str) -> bool:
    """True if some server might read a segment as `.`/`..` or split it further: plain or
    percent-encoded dots, encoded slashes or backslashes, and `..;x` (Java path parameters)."""
    for segment in path.split("/"):
        decoded = urllib.parse.unquote(segment)
        if decoded.partition(";")[0] in (".", "..") or "/" in decoded or "\\" in decoded:
            return True
    return False


def path_allowed(prefixes: Sequence[str], target: str) -> bool:
    """Whether the request target's path is inside one of `prefixes`, by whole segments."""
    path = target.partition("?")[0].partition("#")[0]
    if not path.startswith("/") or "\\" in path or _has_dot_segment(path):
        # The upstream may normalise these into a path the prefix never allowed.
        return False
    return any(
        path == prefix or path.startswith(prefix if prefix.endswith("/") else prefix + "/")
        for prefix in prefixes
    )
