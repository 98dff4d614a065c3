"""The sandbox runtime's one error: what every part of it (the runtime, its tiers, the daemon)
raises when a sandbox cannot be had, once everything made for it has been removed."""

from __future__ import annotations

from sealgate.reasons import Reason, SealgateError


class SandboxError(SealgateError, RuntimeError):
    """The sandbox could not be started; everything created for it has been removed."""

    reason = Reason.SANDBOX_FAILED
