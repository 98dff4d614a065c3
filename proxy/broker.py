"""The broker: secrets looked up per rule and injected on the way out.

The sandbox sends its request with no credential, or with a placeholder an SDK insists on; the
rule that allowed the request names the secrets and how they go in. Lookups go through the
secret stores' cache (`proxy.secrets`): a store that is down serves from cache within its grace,
then fails closed, and a request whose credential cannot be had is refused with 503
`secret_unavailable`, never forwarded without it.
"""

from __future__ import annotations

from mitmproxy import http

from proxy.errors import Denial
from proxy.inject import Injected, put
from proxy.policy import Rule, RuleSet
from proxy.secrets import SecretBroker, SecretError


class Broker:
    def __init__(self, secrets: SecretBroker) -> None:
        self.secrets = secrets

    def check(self, rules: RuleSet) -> None:
        """Every secret a rule names must have a store; raises SecretConfigError."""
        for policy in rules.policies.values():
            for rule in policy.rules:
                for injection in rule.inject:
                    self.secrets.check(injection.secret)

    async def inject(self, rule: Rule, request: http.Request, into: Injected) -> None:
        for name in rule.strip:
            request.headers.pop(name, None)
        if not rule.inject:
            return
        for injection in rule.inject:
            # One at a time: nearly always a cache hit, which a gather would turn into a task
            # and a loop turn per secret.
            try:
                secret = await self.secrets.get(injection.secret)
            except SecretError as exc:
                # The reason names the failure class; the detail names no value.
                raise Denial(
                    "secret_unavailable",
                    f"a credential for this request is unavailable ({exc.reason})",
                ) from None
            put(request, injection.processor, secret.reveal(), f"broker:{injection.secret}", into)

    async def close(self) -> None:
        await self.secrets.close()
