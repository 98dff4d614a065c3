"""Host canonicalisation: one spelling per destination before anything is matched or resolved.

Everything the guard decides about a name (policy globs, the denied-name list, logging) is done
on the `Host` this module returns, so two spellings that a resolver or HTTP client would treat as
the same destination must come out identical here, and spellings whose meaning differs between
parsers (inet_aton numerics, zone ids, userinfo, C-string truncation at NUL) are refused outright.
Pure functions; no I/O, no resolution.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv6Address
from typing import Final, NoReturn

import idna

from .reasons import Reason, SealgateError

__all__ = [
    "WILDCARD",
    "Host",
    "HostError",
    "HostPattern",
    "canonical_host",
    "canonical_name",
    "denied_name",
    "parse_host_pattern",
    "split_authority",
]

# Longer raw input is refused before any parsing: a valid host is at most 253 octets, and UTS-46
# "ignored" code points (soft hyphens, zero-width spaces) must not let a megabyte of padding
# collapse into a short name at our expense.
_MAX_RAW: Final = 1024
_MAX_NAME: Final = 253
_MAX_LABEL: Final = 63

# After mapping: ASCII must be LDH, "_" or "."; non-ASCII is left for IDNA to judge.
_BAD_CHAR: Final = re.compile(r"[^a-z0-9_.\-\x80-\U0010ffff]")
# Before mapping: ASCII punctuation, C1 controls and any Unicode whitespace (\s as str.isspace).
_BAD_RAW: Final = re.compile(r"[^A-Za-z0-9_.\-\x80-\U0010ffff]|[\x80-\x9f]|\s")
_BAD_IN_BRACKETS: Final = re.compile(r"[^0-9A-Fa-f:.]")
# The forms inet_aton() accepts for one part: decimal, 0-octal, 0x-hex (hex may be empty on some
# libcs). A last label like this means some resolver would read the whole name as a number.
_NUMERIC_LABEL: Final = re.compile(r"[0-9]+|0x[0-9a-f]*")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"  # 0-255, no leading zeros
_DOTTED_QUAD: Final = re.compile(rf"(?:{_OCTET}\.){{3}}{_OCTET}")
_PORT: Final = re.compile(r"[1-9][0-9]{0,4}")
# What an IPv6 address written without brackets may look like; anything else is left to the
# authority grammar (which then names the ':' it finds).
_BARE_IPV6: Final = re.compile(r"[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*")
WILDCARD: Final = "*."
# The only code points UTS-46 maps to "@" (U+FE6B small, U+FF20 fullwidth): checked before
# anything echoes the input, because text with an at-sign may carry credentials.
_AT_SIGNS: Final = ("@", "\ufe6b", "\uff20")
_SHOW_MAX: Final = 100


class HostError(SealgateError, ValueError):
    """A host or authority we refuse to interpret; `reason` says why (a `host_*` code or
    `port_invalid`, all answered 400).

    The message names what is wrong. It echoes the input only where that cannot leak a secret:
    never for userinfo, and for a bad character only the text before it (so a path or query
    pasted into the host is not repeated).
    """

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message, reason=reason)


@dataclass(frozen=True, slots=True)
class Host:
    """A canonical host.

    `name` is a lowercase A-label name without trailing dot, or for IP literals the address in
    compressed form (IPv6 without brackets). `ip` is set iff the host is an IP literal.
    """

    name: str
    ip: IPv4Address | IPv6Address | None = None


def canonical_host(raw: str) -> Host:
    """Canonicalise a host as written in an authority (no port; IPv6 literals bracketed)."""
    if not raw:
        raise HostError(Reason.HOST_EMPTY, "host is empty")
    if any(sign in raw for sign in _AT_SIGNS):
        raise _userinfo()
    if len(raw) > _MAX_RAW:
        raise HostError(Reason.HOST_TOO_LONG, f"host is {len(raw)} characters long")
    if raw[0] == "[":
        return _bracketed(raw)
    if raw.isascii():
        # For ASCII, UTS-46 mapping is exactly lowercasing, so the IDNA tables are skipped.
        text = raw.lower()
        _check_chars(text)
    else:
        text = _to_ascii(raw)
    if text.endswith("."):
        text = text[:-1]
    if not text:
        raise HostError(Reason.HOST_EMPTY, "host is empty")
    labels = text.split(".")
    if "" in labels:
        raise HostError(Reason.HOST_EMPTY_LABEL, f"host {_show(raw)} has an empty label")
    if len(text) > _MAX_NAME or any(len(label) > _MAX_LABEL for label in labels):
        raise HostError(
            Reason.HOST_TOO_LONG,
            f"host {_show(raw)} exceeds {_MAX_NAME} octets or has a label over {_MAX_LABEL}",
        )
    # Only "xn--" labels are held to IDNA. Other ASCII labels get no hyphen-position rules: real
    # names such as "rr3---sn-abc.googlevideo.com" break them, and DNS only needs LDH (plus "_",
    # as in SRV-style names), which the character check has enforced.
    if raw.isascii() and "xn--" in text and not all(map(_is_a_label, labels)):
        raise HostError(Reason.HOST_IDNA, f"host {_show(raw)} has an invalid IDNA A-label")
    if _NUMERIC_LABEL.fullmatch(labels[-1]):
        if _DOTTED_QUAD.fullmatch(text):
            return Host(text, IPv4Address(bytes(map(int, labels))))
        raise HostError(
            Reason.HOST_NUMERIC,
            f"host {_show(raw)} is a numeric address that is not a canonical dotted quad",
        )
    return Host(text)


@functools.lru_cache(maxsize=8192)  # every request parses one; clients repeat a few
def split_authority(authority: str, default_port: int | None = None) -> tuple[Host, int]:
    """Split "host", "host:port" or "[v6]:port" into a canonical host and a port.

    Ports are 1-65535 in plain decimal. Leading zeros are refused rather than read as decimal:
    a port has one spelling, so port allowlists, logs and the Host header we compare against all
    see the same text, and no parser gets a chance to read "0443" as octal.
    """
    if any(sign in authority for sign in _AT_SIGNS):
        raise _userinfo()
    port_text: str | None
    if authority.startswith("["):
        close = authority.find("]")
        if close < 0:
            raise HostError(Reason.HOST_INVALID_CHAR, "IPv6 literal has no closing ']'")
        host_text, rest = authority[: close + 1], authority[close + 1 :]
        if not rest:
            port_text = None
        elif rest[0] == ":":
            port_text = rest[1:]
        else:
            raise HostError(Reason.HOST_INVALID_CHAR, "unexpected text after ']' in the authority")
    else:
        colons = authority.count(":")
        if colons > 1:
            raise HostError(
                Reason.HOST_IPV6_UNBRACKETED,
                "authority has several ':'; IPv6 literals need brackets",
            )
        host_text, sep, port_text_found = authority.partition(":")
        port_text = port_text_found if sep else None
    host = canonical_host(host_text)
    if port_text is None:
        if default_port is None:
            raise HostError(Reason.PORT_INVALID, f"no port for {host.name!r} and no default")
        port = default_port
    elif _PORT.fullmatch(port_text):
        port = int(port_text)
    else:
        # Not echoed: whatever follows the host may be a path or query carrying a token.
        raise HostError(
            Reason.PORT_INVALID,
            f"port for {host.name!r} must be decimal digits without sign or leading zeros",
        )
    if not 0 < port <= 65535:
        raise HostError(Reason.PORT_INVALID, f"port {port} for {host.name!r} is outside 1-65535")
    return host, port


def canonical_name(raw: str) -> Host:
    """`canonical_host` for a host written on its own rather than in an authority (a rule's or a
    token's host pattern, a `Host.name` passed on): with no port to tell it from, an IPv6
    address may go without brackets."""
    return canonical_host(f"[{raw}]" if _BARE_IPV6.fullmatch(raw) else raw)


@dataclass(frozen=True, slots=True)
class HostPattern:
    """A destination pattern, the one meaning that rules and sealed tokens share: `host` alone,
    or with `wildcard` every name strictly below it at any depth (`*.example.com` matches
    `a.example.com` and `a.b.example.com`, never `example.com` or `badexample.com`). An IP
    literal matches only itself."""

    host: Host
    wildcard: bool = False

    def matches(self, host: Host) -> bool:
        # No address's text ends in "." + a suffix: a suffix never ends in a numeric label.
        if self.wildcard:
            return host.name.endswith("." + self.host.name)
        return host.name == self.host.name

    def __str__(self) -> str:
        return WILDCARD + self.host.name if self.wildcard else self.host.name


def parse_host_pattern(raw: str) -> HostPattern:
    """`name` or `*.name`, canonicalised as `canonical_name` reads a host, or an IP literal."""
    wildcard = raw.startswith(WILDCARD)
    body = raw[len(WILDCARD) :] if wildcard else raw
    if "*" in body:
        raise HostError(Reason.HOST_INVALID_CHAR, "'*' is only allowed as a leading '*.'")
    host = canonical_name(body)
    if wildcard and host.ip is not None:
        raise HostError(Reason.HOST_INVALID_CHAR, "a wildcard cannot cover an IP address")
    return HostPattern(host, wildcard)


# Names that never identify an external service. The apex of each suffix is denied too.
_METADATA_NAMES: Final = frozenset(
    {
        "metadata",  # GCP short name, via the search path
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",  # AWS
        "metadata.tencentyun.com",
    }
)
_METADATA_SUFFIXES: Final = (".metadata.google.internal",)
_LOCALHOST_NAMES: Final = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})
_LOCALHOST_SUFFIXES: Final = (".localhost",)  # RFC 6761 6.3: always loopback
_INTERNAL_ZONES: Final = (
    "internal",
    "local",
    "localdomain",
    "home.arpa",
    "in-addr.arpa",
    "ip6.arpa",
)
_INTERNAL_SUFFIXES: Final = tuple("." + zone for zone in _INTERNAL_ZONES)


def denied_name(host: Host) -> Reason | None:
    """The reason if `host` is a name that is never allowed, else None.

    - `metadata_name`: cloud metadata services (AWS, GCP, Tencent); these stay denied even where
      a policy is otherwise permissive.
    - `localhost_name`: localhost and `*.localhost` (RFC 6761), Debian's ip6-localhost/-loopback.
    - `internal_name`:
      `.internal` is reserved by ICANN for private use and hosts GCP's internal DNS;
      `.local` is multicast DNS (RFC 6762), answered by machines on the local link;
      `.localdomain` is the /etc/hosts convention for the machine itself;
      `.home.arpa` is the residential-network zone (RFC 8375);
      `.in-addr.arpa` / `.ip6.arpa` are reverse-DNS zones: their names spell IP addresses and
      some resolvers synthesise local answers for them, so they are never a web destination.
    - `single_label`: a name without a dot only resolves through a search path or local
      configuration (`kubernetes`, `db`), i.e. to something internal.

    IP literals return None: addresses.py classifies them.
    """
    if host.ip is not None:
        return None
    name = host.name
    if name in _METADATA_NAMES or name.endswith(_METADATA_SUFFIXES):
        return Reason.METADATA_NAME
    if name in _LOCALHOST_NAMES or name.endswith(_LOCALHOST_SUFFIXES):
        return Reason.LOCALHOST_NAME
    if name in _INTERNAL_ZONES or name.endswith(_INTERNAL_SUFFIXES):
        return Reason.INTERNAL_NAME
    if "." not in name:
        return Reason.SINGLE_LABEL
    return None


def _bracketed(raw: str) -> Host:
    if not raw.endswith("]"):
        raise HostError(Reason.HOST_INVALID_CHAR, "IPv6 literal has no closing ']'")
    inner = raw[1:-1]
    bad = _BAD_IN_BRACKETS.search(inner)
    if bad:
        _reject_char(raw, bad.start() + 1)
    try:
        ip = IPv6Address(inner)
    except ValueError:
        # `[1.2.3.4]` and `[example.com]` land here: brackets hold IPv6 and nothing else.
        raise HostError(
            Reason.HOST_INVALID_CHAR, f"{_show(raw)} is not a valid bracketed IPv6 literal"
        ) from None
    return Host(ip.compressed, ip)


# IDNA work costs 5-20 µs a name, where the ASCII path costs 2: remember recent answers. Both
# functions are pure; failures are not cached (they raise, or are cheap to recompute).
@functools.lru_cache(maxsize=1024)
def _to_ascii(raw: str) -> str:
    """UTS-46 map non-ASCII `raw` and encode its labels; empty labels are left to the caller."""
    # Controls and whitespace are refused before mapping, so the reason is the character rather
    # than whatever IDNA makes of it (UTS-46 keeps NUL, and maps U+3000 to a plain space).
    bad = _BAD_RAW.search(raw)
    if bad:
        _reject_char(raw, bad.start())
    try:
        text = idna.uts46_remap(raw, std3_rules=False, transitional=False)
        # Fullwidth forms map onto ASCII punctuation (U+FF0F to "/", U+FF1A to ":"): checked
        # before encoding so that the reason names the character.
        _check_chars(text)
        labels = text.split(".")
        if not all(map(_is_a_label, labels)):
            raise HostError(Reason.HOST_IDNA, f"host {_show(raw)} has an invalid IDNA A-label")
        return ".".join([_encode(label) for label in labels])
    except UnicodeError as err:  # IDNAError and Punycode codec errors alike
        raise HostError(Reason.HOST_IDNA, f"host {_show(raw)} is not a valid IDNA name") from err


def _encode(label: str) -> str:
    if label.isascii():
        return label
    idna.check_label(label)
    return "xn--" + label.encode("punycode").decode("ascii")


@functools.lru_cache(maxsize=1024)
def _is_a_label(label: str) -> bool:
    """False for an "xn--" label that is malformed or not the canonical Punycode of its U-label."""
    if not label.startswith("xn--"):
        return True  # including U-labels, which _encode() checks
    try:
        idna.ulabel(label)
    except UnicodeError:
        return False
    return True


def _check_chars(text: str) -> None:
    bad = _BAD_CHAR.search(text)
    if bad:
        _reject_char(text, bad.start())


def _reject_char(text: str, index: int) -> NoReturn:
    char = text[index]
    after = f"after {_show(text[:index])}" if index else "at the start"
    if char == ":":
        raise HostError(
            Reason.HOST_IPV6_UNBRACKETED, f"host has ':' {after}; IPv6 literals must be bracketed"
        )
    what = "a zone id marker '%'" if char == "%" else repr(char)
    raise HostError(Reason.HOST_INVALID_CHAR, f"host has {what} {after}")


def _userinfo() -> HostError:
    return HostError(Reason.HOST_USERINFO, "userinfo ('@') is not allowed in a host or authority")


def _show(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= _SHOW_MAX else shown[: _SHOW_MAX - 3] + "..."
