"""Reading a JSON object the issuer's way, everywhere it reads one (token claims, processors, key
files, the callers file, mint requests): parsed strictly, its unknown and missing fields found
and said the same way, values quoted shortened. Each caller raises its own error class with the
text."""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable

_SHOWN = 5  # names listed; an object with thousands of junk keys gets a short error
_NAME_CHARS = 40
_MAX_DIGITS = 16


def show(value: str, limit: int = _NAME_CHARS) -> str:
    """A short repr of a non-secret value for an error message."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def unknown(obj: Iterable[object], allowed: Collection[str]) -> str | None:
    names = sorted({str(key)[:_NAME_CHARS] for key in obj} - set(allowed))
    if not names:
        return None
    return "unknown field(s) " + ", ".join(repr(name) for name in names[:_SHOWN])


def missing(obj: Collection[object], required: Iterable[str]) -> str | None:
    names = [name for name in sorted(required) if name not in obj]
    return "missing field(s) " + ", ".join(names) if names else None


def _unique_pairs(pairs: list[tuple[str, object]]) -> dict[str, object]:
    obj: dict[str, object] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {show(key)}")
        obj[key] = value
    return obj


def _reject_float(_text: str) -> object:
    raise ValueError("numbers must be integers")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_DIGITS:
        raise ValueError("integer has too many digits")
    return int(text)


def load_json_object(text: str) -> dict[str, object]:
    """Parse a JSON object strictly: duplicate keys, floats, NaN/Infinity and huge integers are
    errors (ValueError). Error messages carry positions, never content."""
    try:
        value = json.loads(
            text,
            object_pairs_hook=_unique_pairs,
            parse_float=_reject_float,
            parse_int=_bounded_int,
            parse_constant=_reject_float,
        )
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(value, dict):
        raise ValueError("top level must be a JSON object")
    return value
