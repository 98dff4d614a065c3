"""The issuer's callers: who may mint tokens, and within which limits.

A callers file (YAML, format in docs/issuer.md) names each caller, how it authenticates (the
SHA-256 of its API key and/or its client certificate subject) and what it may mint: which hosts,
which processors, how long, how often, with which bindings. A caller that is compromised can
mint only tokens its entry allows.

The file holds digests, never API keys, so it may be read by anyone who may read the issuer's
configuration.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, assert_never

from sealgate import credentials as tk
from sealgate.credentials import jsonfields
from sealgate.credentials import processors as pr
from sealgate.reasons import Reason, SealgateError
from sealgate.yamlfile import YamlFile, YamlFileError

__all__ = [
    "BINDING_KINDS",
    "BindingNotPermitted",
    "BindingRequired",
    "Caller",
    "CallerRegistry",
    "CallersFileError",
    "HostNotPermitted",
    "NotPermitted",
    "ProcessorNotPermitted",
    "RateLimiter",
    "TtlTooLong",
    "binding_kind",
    "host_covered",
    "load_callers",
    "parse_duration",
]

# What a caller entry's `bindings` may list; "none" permits unbound tokens.
BINDING_KINDS: Final = ("none", "sandbox", "policy", "auth-digest")
DEFAULT_PER_MINUTE: Final = 60
_MAX_PER_MINUTE: Final = 100_000
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_HEX_DIGEST: Final = re.compile(r"[0-9a-f]{64}")
_DURATION: Final = re.compile(r"(?:\d+[smhd])+|\d+")
_DURATION_PART: Final = re.compile(r"(\d+)([smhd])")
UNIT_SECONDS: Final[Mapping[str, int]] = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_ENTRY_FIELDS: Final = frozenset(
    {"key_sha256", "mtls_subject", "hosts", "processors", "max_ttl", "rate", "bindings"}
)
_REQUIRED_FIELDS: Final = frozenset({"hosts", "processors", "max_ttl"})


def parse_duration(text: str) -> int:
    """Seconds in "900", "15m", "1h30m", "2d" (units s, m, h, d). ValueError otherwise."""
    if len(text) > 32 or not _DURATION.fullmatch(text):
        raise ValueError(f"{text[:32]!r} is not a duration like 900, 15m, 1h30m or 1d")
    if text.isdigit():
        return int(text)
    return sum(int(n) * UNIT_SECONDS[unit] for n, unit in _DURATION_PART.findall(text))


# --- errors -----------------------------------------------------------------------------------


class CallersFileError(SealgateError):
    """A callers file we refuse to load. The message names the file and the caller/field."""

    reason = Reason.CALLERS_FILE_INVALID


class NotPermitted(SealgateError):
    """A mint request outside what the caller's entry allows: one of the subclasses, each with
    its reason (all answered 403)."""

    reason = Reason.NOT_PERMITTED


class HostNotPermitted(NotPermitted):
    reason = Reason.HOST_NOT_PERMITTED


class ProcessorNotPermitted(NotPermitted):
    reason = Reason.PROCESSOR_NOT_PERMITTED


class TtlTooLong(NotPermitted):
    reason = Reason.TTL_TOO_LONG


class BindingRequired(NotPermitted):
    reason = Reason.BINDING_REQUIRED


class BindingNotPermitted(NotPermitted):
    reason = Reason.BINDING_NOT_PERMITTED


# --- limits -----------------------------------------------------------------------------------


def host_covered(allowed: tk.Destination, requested: tk.Destination) -> bool:
    """True if every host:port `requested` matches is also matched by `allowed`."""
    if allowed.port != requested.port:
        return False
    if not allowed.wildcard:
        return not requested.wildcard and requested.host == allowed.host
    # *.example.com covers a.example.com, *.example.com and *.a.example.com, not example.com.
    # Both sides are canonical lowercase, so a suffix test is exact.
    if requested.wildcard and requested.host == allowed.host:
        return True
    return requested.host.endswith("." + allowed.host)


def binding_kind(binding: tk.Binding | None) -> str:
    """The `bindings` name of a binding: none, sandbox, policy or auth-digest."""
    match binding:
        case None:
            return "none"
        case tk.SandboxBinding():
            return "sandbox"
        case tk.PolicyBinding():
            return "policy"
        case tk.AuthDigestBinding():
            return "auth-digest"
        case _:
            assert_never(binding)


@dataclass(frozen=True)
class Caller:
    """One entry of the callers file."""

    name: str
    hosts: tuple[tk.Destination, ...]
    processors: frozenset[str]
    max_ttl: int
    per_minute: int = DEFAULT_PER_MINUTE
    bindings: frozenset[str] = frozenset(BINDING_KINDS)
    # SHA-256 of the UTF-8 API key; kept out of repr so that logs do not collect digests.
    key_sha256: bytes | None = field(default=None, repr=False)
    mtls_subject: str | None = None

    def check(self, claims: tk.Claims, ttl: int) -> None:
        """Raise a NotPermitted subclass unless `claims` (minted for `ttl` seconds) is within
        this caller's limits. Checked in this order: processor, hosts, ttl, binding."""
        if claims.processor.kind not in self.processors:
            raise ProcessorNotPermitted(
                f"caller {self.name} may not use the {claims.processor.kind} processor"
            )
        for requested in claims.hosts:
            if not any(host_covered(allowed, requested) for allowed in self.hosts):
                raise HostNotPermitted(f"caller {self.name} may not mint for {requested}")
        if ttl > self.max_ttl:
            raise TtlTooLong(f"ttl {ttl} s exceeds caller {self.name}'s max_ttl {self.max_ttl} s")
        kind = binding_kind(claims.binding)
        if kind not in self.bindings:
            if kind == "none":
                allowed = ", ".join(sorted(self.bindings))
                raise BindingRequired(f"caller {self.name} must bind its tokens ({allowed})")
            raise BindingNotPermitted(f"caller {self.name} may not use a {kind} binding")


class CallerRegistry:
    """The loaded callers, looked up by API key or by client certificate subject."""

    def __init__(self, callers: Iterable[Caller]) -> None:
        self._callers: dict[str, Caller] = {}
        subjects: set[str] = set()
        digests: set[bytes] = set()
        for caller in callers:
            if caller.name in self._callers:
                raise CallersFileError(f"caller {caller.name} appears twice")
            if caller.key_sha256 is None and caller.mtls_subject is None:
                raise CallersFileError(f"caller {caller.name} needs key_sha256 or mtls_subject")
            if caller.key_sha256 is not None:
                if caller.key_sha256 in digests:
                    raise CallersFileError(f"caller {caller.name} shares its key with another")
                digests.add(caller.key_sha256)
            if caller.mtls_subject is not None:
                if caller.mtls_subject in subjects:
                    raise CallersFileError(f"caller {caller.name} shares its subject with another")
                subjects.add(caller.mtls_subject)
            self._callers[caller.name] = caller

    def __len__(self) -> int:
        return len(self._callers)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._callers)

    def by_api_key(self, api_key: str) -> Caller | None:
        """The caller whose key digest matches. Every entry is compared, in constant time, so
        the time taken says nothing about which entry (if any) came close."""
        digest = hashlib.sha256(api_key.encode("utf-8")).digest()
        found: Caller | None = None
        for caller in self._callers.values():
            if caller.key_sha256 is not None and hmac.compare_digest(caller.key_sha256, digest):
                found = caller
        return found

    def by_subject(self, subject: str) -> Caller | None:
        """The caller whose `mtls_subject` is exactly `subject` (RFC 4514 form)."""
        for caller in self._callers.values():
            if caller.mtls_subject == subject:
                return caller
        return None


class RateLimiter:
    """A token bucket per caller: `per_minute` requests of burst, refilled evenly over a
    minute. Buckets are created on first use and follow the caller's current limit."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # name -> (tokens, at)

    def acquire(self, caller: Caller) -> float:
        """Take one request's worth; 0.0 if allowed, else the seconds until one is available."""
        now = self._clock()
        capacity = float(caller.per_minute)
        rate = caller.per_minute / 60.0
        tokens, at = self._buckets.get(caller.name, (capacity, now))
        tokens = min(capacity, tokens + (now - at) * rate)
        if tokens >= 1.0:
            self._buckets[caller.name] = (tokens - 1.0, now)
            return 0.0
        self._buckets[caller.name] = (tokens, now)
        return (1.0 - tokens) / rate

    def forget_except(self, names: Iterable[str]) -> None:
        """Drop buckets of callers no longer in the file, so memory follows the file."""
        keep = set(names)
        self._buckets = {name: b for name, b in self._buckets.items() if name in keep}


# --- the file ---------------------------------------------------------------------------------


def _strings(value: object, where: str, *, non_empty: bool = True) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise CallersFileError(f"{where} must be a list of strings")
    if non_empty and not value:
        raise CallersFileError(f"{where} must not be empty")
    return list(value)


def _duration(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise CallersFileError(f"{where} must be a duration like 15m or a number of seconds")
    try:
        seconds = value if isinstance(value, int) else parse_duration(value)
    except ValueError as exc:
        raise CallersFileError(f"{where}: {exc}") from None
    if not 0 < seconds <= tk.MAX_LIFETIME_SECONDS:
        raise CallersFileError(f"{where} must be more than 0 and at most 24h")
    return seconds


def _rate(value: object, where: str) -> int:
    if not isinstance(value, dict) or set(value) != {"per_minute"}:
        raise CallersFileError(f"{where} must be {{per_minute: N}}")
    per_minute = value["per_minute"]
    if isinstance(per_minute, bool) or not isinstance(per_minute, int):
        raise CallersFileError(f"{where}.per_minute must be an integer")
    if not 1 <= per_minute <= _MAX_PER_MINUTE:
        raise CallersFileError(f"{where}.per_minute must be 1-{_MAX_PER_MINUTE}")
    return per_minute


def _hosts(value: object, where: str) -> tuple[tk.Destination, ...]:
    patterns = []
    for text in _strings(value, where):
        try:
            patterns.append(tk.Destination.parse(text))
        except tk.TokenMalformed as exc:
            raise CallersFileError(f"{where}: {exc}") from None
    return tuple(patterns)


def _choices(value: object, where: str, allowed: Sequence[str]) -> frozenset[str]:
    items = _strings(value, where)
    unknown = sorted(set(items) - set(allowed))
    if unknown:
        raise CallersFileError(
            f"{where}: unknown {', '.join(repr(u[:40]) for u in unknown[:5])} "
            f"(allowed: {', '.join(allowed)})"
        )
    return frozenset(items)


def _caller(name: object, entry: object) -> Caller:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise CallersFileError(
            f"caller name {str(name)[:64]!r} must be 1-64 characters from A-Z a-z 0-9 . _ -"
        )
    where = f"callers.{name}"
    if not isinstance(entry, dict):
        raise CallersFileError(f"{where} must be a mapping")
    problem = jsonfields.unknown(entry, _ENTRY_FIELDS) or jsonfields.missing(
        entry, _REQUIRED_FIELDS
    )
    if problem:
        raise CallersFileError(f"{where}: {problem}")
    key_sha256: bytes | None = None
    if "key_sha256" in entry:
        digest = entry["key_sha256"]
        if not isinstance(digest, str) or not _HEX_DIGEST.fullmatch(digest):
            raise CallersFileError(
                f"{where}.key_sha256 must be 64 lowercase hex digits (quote it in YAML)"
            )
        key_sha256 = bytes.fromhex(digest)
    subject = entry.get("mtls_subject")
    if subject is not None and (not isinstance(subject, str) or not 0 < len(subject) <= 1024):
        raise CallersFileError(f"{where}.mtls_subject must be a non-empty string")
    return Caller(
        name=name,
        hosts=_hosts(entry["hosts"], f"{where}.hosts"),
        processors=_choices(entry["processors"], f"{where}.processors", list(pr.PROCESSOR_TYPES)),
        max_ttl=_duration(entry["max_ttl"], f"{where}.max_ttl"),
        per_minute=_rate(entry["rate"], f"{where}.rate") if "rate" in entry else DEFAULT_PER_MINUTE,
        bindings=(
            _choices(entry["bindings"], f"{where}.bindings", BINDING_KINDS)
            if "bindings" in entry
            else frozenset(BINDING_KINDS)
        ),
        key_sha256=key_sha256,
        mtls_subject=subject,
    )


def _parse(document: object) -> CallerRegistry:
    if not isinstance(document, dict) or set(document) != {"callers"}:
        raise CallersFileError("the top level must be a mapping with one key, callers")
    entries = document["callers"]
    if not isinstance(entries, dict) or not entries:
        raise CallersFileError("callers must be a non-empty mapping of name to entry")
    return CallerRegistry(_caller(name, entry) for name, entry in entries.items())


def load_callers(path: Path) -> CallerRegistry:
    """Read and check a callers file. Raises CallersFileError naming the file and the field.

    The YAML is read as strictly as rules files are (sealgate.yamlfile): anchors, aliases, tags
    and duplicate keys are errors, so what a reviewer reads under a caller is all it gets."""
    try:
        document = YamlFile(path).data()
    except YamlFileError as exc:
        raise CallersFileError(str(exc)) from None
    try:
        return _parse(document)
    except CallersFileError as exc:
        raise CallersFileError(f"{path}: {exc}") from None
