"""Compiled egress policies: what a sandbox may reach, decided in a few microseconds.

The model is built once when rules load (see `rulesfile.py`) and only read afterwards. All the
work that can be done ahead of time is: exact hosts sit in one dict, `*.suffix` wildcards in a
dict keyed by suffix (a lookup per parent suffix of the requested name), `*` apart, and each
rule's path globs in one compiled regex. Hosts come in as `Host` values from `hostname.py`, so
matching is plain string equality on canonical names.

Why one module of ~400 lines: `Rule`, `Policy` and `RuleSet` are one compiled structure that
every request reads, and their matching is its indexes'.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from ipaddress import IPv4Network, IPv6Network
from itertools import chain
from pathlib import Path
from typing import Final, Literal
from urllib.parse import unquote

from sealgate.credentials.processors import Processor
from sealgate.credentials.secretref import SecretRef
from sealgate.hostname import Host
from sealgate.reasons import Reason
from sealgate.yamlfile import YamlFileError, format_location

from ..errors import ProxyError
from ..net.addresses import AddressPolicy
from .gateways import McpServer
from .httptool import HttpRequestTool
from .tools import Tool

__all__ = [
    "ANY_HOST",
    "Budgets",
    "Mode",
    "PathError",
    "PathPatternError",
    "Policy",
    "Rule",
    "RuleSet",
    "RuleWarning",
    "RulesError",
    "SandboxEntry",
    "normalize_path",
    "path_glob_regex",
]

Mode = Literal["enforce", "report"]
ANY_HOST: Final = "*"
_WILDCARD_PREFIX: Final = "*."


class PathError(ProxyError, ValueError):
    """A request path we refuse to match against path rules (`reason` is always path_invalid)."""

    reason = Reason.PATH_INVALID


class PathPatternError(ProxyError, ValueError):
    """A path glob in a rule that is malformed or could never match a normalised path."""

    reason = Reason.PATH_PATTERN_INVALID


class RulesError(YamlFileError, ProxyError):
    """A rules file (or `rules test` case file) we refuse to load. `str()` is
    `file:line: field: message`. (The YAML reader's error names no reason of its own: each
    kind of file that reads it names one.)"""

    reason = Reason.RULES_INVALID


@dataclass(frozen=True, slots=True)
class RuleWarning:
    """Something legal but probably not meant. `code` is machine-readable (see docs/rules.md)."""

    code: str
    path: Path
    line: int | None
    field: str
    message: str

    def __str__(self) -> str:
        return format_location(self.path, self.line, self.field, self.message)


@dataclass(frozen=True, slots=True)
class Budgets:
    requests_per_second: float = 50.0
    burst: int = 100
    max_connections: int = 64
    max_request_bytes: int = 10 * 1024 * 1024
    max_total_bytes: int = 1024 * 1024 * 1024


# --- request paths ----------------------------------------------------------------------------

# Anything outside visible ASCII is refused: a request-target is ASCII (RFC 9112 3.2), and a
# space, DEL, control or non-ASCII byte only appears when a client or an attacker is playing with
# parsers. A raw backslash is refused because several servers (IIS, some Node and Java routers)
# read it as '/'.
_BAD_RAW: Final = re.compile(r"[^\x21-\x7e]|\\")
_BAD_PERCENT: Final = re.compile(r"%(?![0-9A-Fa-f]{2})")
_PERCENT: Final = re.compile(r"%[0-9A-Fa-f]{2}")
_BAD_DECODED: Final = re.compile(r"[/\\\x00-\x1f\x7f]")
# Upstreams that decode twice exist (and proxies in front of them decode once more); three
# rounds unwrap %25252e and anything deeper is refused outright.
_DECODE_ROUNDS: Final = 3


def normalize_path(raw: str) -> str:
    """The path that path globs match against: `raw` without query and fragment, or PathError.

    We match the path as the client sent it and forward it unchanged, but the upstream may
    normalise what we did not: resolve `..`, decode `%2e%2e` or `%2f`, treat `\\` as `/`, drop a
    `;param` (Tomcat reads `/..;/` as `/../`), merge `//`. Any of those could move a request that
    matched `/public/**` here to `/admin` there. So instead of guessing one normalisation we refuse
    every path on which two reasonable servers could disagree; what is left means the same thing
    to all of them, and matching it literally is sound.

    Refused: no leading '/'; dot segments ('.', '..', and any all-dot segment, which Windows
    servers trim to one of those; also percent-encoded, double-encoded, fullwidth, or followed by
    ';params'); an empty segment ('//'); an encoded '/', '\\' or control character; a raw
    backslash, space, control or non-ASCII character; malformed percent-encoding (including IIS
    `%u002e`); percent-encoding that is not UTF-8 (overlong `%c0%ae`).
    """
    path = raw.partition("#")[0].partition("?")[0]
    if not path.startswith("/"):
        raise PathError("path must start with '/'")
    if _BAD_RAW.search(path):
        raise PathError("path contains a backslash, space, control or non-ASCII character")
    if "//" in path:
        raise PathError("path contains an empty segment ('//')")
    # Every dot segment starts right after a '/', and every encoded trick needs a '%': the common
    # path has neither and skips the per-segment walk.
    if "/." in path or "%" in path:
        for segment in path.split("/"):
            _check_segment(segment)
    return path


def _check_segment(segment: str) -> None:
    if "%" in segment:
        if _BAD_PERCENT.search(segment):
            raise PathError("path contains malformed percent-encoding")
        segment = _decode(segment)
        if not segment.isascii():
            # Servers that apply NFKC see U+FF0E as '.' and U+FF0F as '/'.
            segment = unicodedata.normalize("NFKC", segment)
        if _BAD_DECODED.search(segment):
            raise PathError("path contains an encoded '/', '\\' or control character")
    base = segment.partition(";")[0]
    if base and not base.strip("."):
        raise PathError("path contains a dot segment ('.' or '..')")


def _decode(segment: str) -> str:
    for _ in range(_DECODE_ROUNDS):
        try:
            decoded = unquote(segment, errors="strict")
        except UnicodeDecodeError:
            raise PathError("path contains percent-encoding that is not UTF-8") from None
        if decoded == segment:
            return decoded
        segment = decoded
    if _PERCENT.search(segment):
        raise PathError("path is percent-encoded too many times")
    return segment


# --- path globs -------------------------------------------------------------------------------

_STAR_RUNS: Final = re.compile(r"(\*+)")


def path_glob_regex(pattern: str) -> str:
    """The regex (for fullmatch) of one path glob, or PathPatternError.

    `*` matches within one segment (no '/', possibly empty). `**` must be a whole segment and
    matches zero or more segments: `/a/**` matches `/a`, `/a/` and `/a/b/c`; `/a/**/b` matches
    `/a/b` and `/a/x/y/b`. Everything else is literal, compared with the raw (still
    percent-encoded) path.

    At most one `*` per segment and one `**` per pattern: with those limits every star has one
    place it can end, so matching is linear in the request path. Two unbounded stars in a row make
    a backtracking regex quadratic or worse, which a hostile path could use to stall the proxy.
    """
    if not pattern.startswith("/"):
        raise PathPatternError("path pattern must start with '/'")
    if "?" in pattern or "#" in pattern:
        raise PathPatternError("path patterns match the path only, never a query or fragment")
    try:
        normalize_path(pattern.replace("*", "x"))
    except PathError as exc:
        raise PathPatternError(
            f"path pattern can never match a valid request path: {exc}"
        ) from None
    parts: list[str] = []
    double_stars = 0
    for segment in pattern[1:].split("/"):
        if segment == "**":
            double_stars += 1
            parts.append("(?:/.*)?")
            continue
        runs = _STAR_RUNS.split(segment)
        stars = runs[1::2]
        if any(len(star) > 1 for star in stars):
            raise PathPatternError("'**' must be a whole path segment, as in /a/**/b or /a/**")
        if len(stars) > 1:
            raise PathPatternError("at most one '*' per path segment")
        parts.append(
            "/" + "".join("[^/]*" if i % 2 else re.escape(run) for i, run in enumerate(runs))
        )
    if double_stars > 1:
        raise PathPatternError("at most one '**' per path pattern")
    return "".join(parts)


def _compile_paths(paths: Iterable[str]) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{path_glob_regex(p)})" for p in paths))


# --- rules and policies -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Injection:
    """One credential the broker adds to requests a rule allows: where the secret lives and the
    processor (the same vocabulary sealed tokens use) that puts it into the request."""

    secret: SecretRef
    processor: Processor
    # What a tool names it by (`credential:`); entries of one policy that share a name are the
    # same credential (grammar.py checks it).
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    """One `allow` entry. `host` is `*`, `*.suffix` or a canonical name / IP literal.

    `methods` / `paths` are None for "any". An empty collection is legal and never matches.
    `inject` lists brokered credentials, `strip` more request headers to remove,
    `plain_http` lets credentials go over plain HTTP to an `allow_networks` address, and
    `response_timeout` (seconds) replaces the proxy's for an API that holds requests open.
    `tools_only` keeps the rule for sealgate's own calls (declared tools, `http_request`, the
    MCP gateway's upstreams): a request the proxy is asked for never matches it.
    """

    host: str
    ports: frozenset[int]
    methods: frozenset[str] | None
    paths: tuple[str, ...] | None
    source: str = field(compare=False)
    inject: tuple[Injection, ...] = ()
    strip: tuple[str, ...] = ()
    plain_http: bool = False
    response_timeout: float | None = None
    tools_only: bool = False
    _path_re: re.Pattern[str] | None = field(init=False, repr=False, compare=False)
    # `strip` as `inject.write` compares header names: lower case, encoded.
    strip_keys: frozenset[bytes] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "_path_re", None if self.paths is None else _compile_paths(self.paths)
        )
        object.__setattr__(self, "strip_keys", frozenset(n.lower().encode() for n in self.strip))

    @property
    def needs_request_inspection(self) -> bool:
        """Whether a request must be seen (TLS intercepted) to decide, not just its CONNECT."""
        return (
            self.methods is not None or self.paths is not None or bool(self.inject or self.strip)
            or self.response_timeout is not None
        )

    def allows_request(self, method: str, path: str) -> bool:
        """Method and path check; `path` must come from `normalize_path`. Methods are
        case-sensitive (RFC 9110 9.1), so `get` is not `GET`."""
        if self.methods is not None and method not in self.methods:
            return False
        return self._path_re is None or self._path_re.fullmatch(path) is not None


_Indexed = tuple[tuple[int, Rule], ...]


@dataclass(frozen=True)
class Policy:
    name: str
    mode: Mode
    tokens: bool
    rules: tuple[Rule, ...]
    allow_networks: tuple[IPv4Network | IPv6Network, ...]
    budgets: Budgets
    # Calls an agent makes over MCP (`sealgate mcp serve`), each decided by the rules above.
    tools: tuple[Tool, ...] = ()
    # The generic tool (`http_request:`), if the policy offers it.
    http_request: HttpRequestTool | None = None
    # The upstream MCP servers `sealgate mcp gateway` fronts for this policy (`mcp_servers:`).
    mcp_servers: tuple[McpServer, ...] = ()
    _exact: Mapping[str, _Indexed] = field(init=False, repr=False, compare=False)
    _suffix: Mapping[str, _Indexed] = field(init=False, repr=False, compare=False)
    _any: _Indexed = field(init=False, repr=False, compare=False)
    # The denied-range table with allow_networks opened, built once: the guard asks it for every
    # address of every request.
    addresses: AddressPolicy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        exact: dict[str, list[tuple[int, Rule]]] = {}
        suffix: dict[str, list[tuple[int, Rule]]] = {}
        any_host: list[tuple[int, Rule]] = []
        for index, rule in enumerate(self.rules):
            if rule.host == ANY_HOST:
                any_host.append((index, rule))
            elif rule.host.startswith(_WILDCARD_PREFIX):
                suffix.setdefault(rule.host[len(_WILDCARD_PREFIX) :], []).append((index, rule))
            else:
                exact.setdefault(rule.host, []).append((index, rule))
        object.__setattr__(self, "_exact", {k: tuple(v) for k, v in exact.items()})
        object.__setattr__(self, "_suffix", {k: tuple(v) for k, v in suffix.items()})
        object.__setattr__(self, "_any", tuple(any_host))
        object.__setattr__(self, "addresses", AddressPolicy(self.allow_networks))

    @property
    def offered_tools(self) -> tuple[Tool | HttpRequestTool, ...]:
        """The tools an agent is offered over MCP: the declared ones, then the generic one."""
        generic = () if self.http_request is None else (self.http_request,)
        return (*self.tools, *generic)

    def host_rules(self, host: Host) -> tuple[Rule, ...]:
        """Rules whose host pattern matches, in file order, whatever their ports."""
        return tuple(rule for _, rule in self._candidates(host))

    def _candidates(self, host: Host) -> _Indexed:
        """Rules whose host pattern matches, in file order."""
        exact = self._exact.get(host.name, ())
        if host.ip is not None:
            # An IP literal only ever matches a rule naming that exact address.
            return exact
        found = [exact] if exact else []
        if self._suffix:
            name = host.name
            dot = name.find(".")
            while dot >= 0:
                hit = self._suffix.get(name[dot + 1 :])
                if hit:
                    found.append(hit)
                dot = name.find(".", dot + 1)
        if self._any:
            found.append(self._any)
        if len(found) <= 1:
            return found[0] if found else ()
        return tuple(sorted(chain.from_iterable(found), key=_index))

    def match_host(self, host: Host, port: int, *, tool: bool = False) -> tuple[Rule, ...]:
        """Rules whose host and port match, in file order: could anything here be allowed?
        `tool`: asked for one of sealgate's own calls, which `tools_only` rules serve too."""
        return tuple(rule for rule in self.host_rules(host)
                     if port in rule.ports and (tool or not rule.tools_only))

    def match(self, host: Host, port: int, method: str, path: str, *,
              tool: bool = False) -> Rule | None:
        """The first rule (file order) matching host, port, method and path, else None.

        `path` must be the output of `normalize_path`; `tool` as in `match_host`.
        """
        for _, rule in self._candidates(host):
            if (port in rule.ports and (tool or not rule.tools_only)
                    and rule.allows_request(method, path)):
                return rule
        return None


def _index(item: tuple[int, Rule]) -> int:
    return item[0]


def tunnels(policy: Policy, rules: tuple[Rule, ...]) -> bool:
    """Whether a CONNECT matching `rules` (host and port) can be passed through undecrypted:
    some rule allows it and no rule (nor a token, which rides in a header) needs to see the
    requests inside."""
    return (
        bool(rules) and not policy.tokens and not any(r.needs_request_inspection for r in rules)
    )


@dataclass(frozen=True)
class SandboxEntry:
    id: str
    policy: str
    # A hash of a possibly weak password is brute-forceable: keep it out of reprs and logs.
    key_sha256: bytes = field(repr=False)


@dataclass(frozen=True)
class RuleSet:
    policies: Mapping[str, Policy]
    sandboxes: Mapping[str, SandboxEntry]
    default_policy: str | None
    warnings: tuple[RuleWarning, ...]
    sources: tuple[Path, ...]
