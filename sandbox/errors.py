"""The sandbox's one error family: every error a part of it raises on purpose (the host's
parts, the tiers, the runtime, the daemon, the clients) is a `SandboxError`, a `SealgateError`
whose `Reason` says why. The base's own reason is `sandbox_failed`: a sandbox could not be had,
once everything made for it has been removed (the host's parts' errors keep it); the daemon's
refusals and the clients' errors each carry theirs (`SessionError`, `DaemonError`, ...), which
are what the API and the clients say on the wire. Code that runs inside a sandbox
(`sandbox.guest`) raises none of these: it imports nothing of sealgate's."""

from __future__ import annotations

from sealgate.reasons import Reason, SealgateError


class SandboxError(SealgateError, RuntimeError):
    """Something of a sandbox failed or was refused; `reason` says which."""

    reason = Reason.SANDBOX_FAILED
