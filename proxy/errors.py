"""The proxy's errors: one root, `ProxyError`, under sealgate's `SealgateError`, so that whoever
catches one answers, logs and counts it by its `Reason` without knowing the class. Beneath it,
where each is raised: `Denial` (here: a request refused, answered by engine/refusal.py),
`ResolveError` (net/dnswire.py), `PathError`, `PathPatternError`, `RulesError` and
`TargetError` (policy/), `RegistryError` (request/registry.py), `ControlError` (the control
API's client, process/controlclient.py) and `MitmproxyMismatch` (engine/mitm.py).

Standard library only: the proxy's face (__init__.py) raises from here.
"""

from __future__ import annotations

from sealgate.reasons import Reason, SealgateError


class ProxyError(SealgateError):
    """An error the proxy raises on purpose; its `reason` says which."""


class Denial(ProxyError):
    """A request the proxy refuses. `detail` is shown to the client; keep secrets out of it."""

    def __init__(self, reason: Reason, detail: str = "", *, retry_after: int | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason, reason=reason)
        self.detail = detail
        self.retry_after = retry_after

    @property
    def status(self) -> int:
        return self.reason.status
