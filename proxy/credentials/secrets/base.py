"""The secret-store interface: redacting values, and the store protocol. References and errors
are the credentials library's (`sealgate.credentials.secretref`, `.errors`).

Error messages name references, paths and causes, never values: they end up in logs
and in 503 bodies, and a credential must not leak through either.
"""

from __future__ import annotations

import hmac
from typing import Protocol

from sealgate.credentials.secretref import SecretRef


class Secret:
    """A secret value whose repr and str never show it; `reveal()` is the one way out."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret(<redacted, {len(self._value)} chars>)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    __hash__ = None  # type: ignore[assignment]  # values must not become dict keys

    def __reduce__(self) -> str:
        # Pickling would copy the value somewhere we cannot redact it.
        raise TypeError("Secret values cannot be pickled")


class SecretStore(Protocol):
    """One backend. `fetch` returns the value and how long the backend says it is good
    for (math.inf when the backend has no opinion: the cache TTL then decides)."""

    scheme: str

    async def fetch(self, ref: SecretRef) -> tuple[Secret, float]: ...

    async def close(self) -> None: ...
