"""Unknown and missing fields of a JSON-like object, found and said the same way everywhere the
issuer reads one (token claims, processors, the callers file, mint requests): each caller
raises its own error class with the text."""

from __future__ import annotations

from collections.abc import Collection, Iterable

_SHOWN = 5  # names listed; an object with thousands of junk keys gets a short error
_NAME_CHARS = 40


def unknown(obj: Iterable[object], allowed: Collection[str]) -> str | None:
    names = sorted({str(key)[:_NAME_CHARS] for key in obj} - set(allowed))
    if not names:
        return None
    return "unknown field(s) " + ", ".join(repr(name) for name in names[:_SHOWN])


def missing(obj: Collection[object], required: Iterable[str]) -> str | None:
    names = [name for name in sorted(required) if name not in obj]
    return "missing field(s) " + ", ".join(names) if names else None
