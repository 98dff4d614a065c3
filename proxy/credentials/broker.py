"""The broker: secrets looked up per rule and injected on the way out.

The sandbox sends its request with no credential, or with a placeholder an SDK insists on; the
rule that allowed the request names the secrets and how they go in. Lookups go through the
secret stores' cache (`credentials.secrets`): a store that is down serves from cache within
its grace, then fails closed, and a request whose credential cannot be had is refused with 503
`secret_unavailable`, never forwarded without it.

The credential worked out from a secret is kept per rule entry for as long as the cache hands
out the same secret object: a rotated secret is a new object, so it is worked out again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sealgate.credentials.errors import InjectionError
from sealgate.credentials.grants import GrantError
from sealgate.credentials.processors import TokenExchange
from sealgate.reasons import Reason

from ..errors import Denial
from ..net.guard import Guard
from ..policy.decide import Identity, Question, decide
from ..policy.model import Injection, PathError, Policy, RuleSet, normalize_path
from . import dial
from .awsroles import RoleSessions
from .dial import Endpoint
from .exchanged import ExchangeError
from .exchanges import Exchanges
from .inject import Credential, credential
from .secrets import Secret, SecretBroker, SecretError, SecretRef
from .tokenizer import SealedExchange

_MAX_SEALED = 4096


class Broker:
    def __init__(self, secrets: SecretBroker, roles: RoleSessions | None = None,
                 exchanges: Exchanges | None = None) -> None:
        self.secrets = secrets
        self.roles = roles or RoleSessions()  # aws-sigv4 secrets that name a role to assume
        # Tokens obtained with a secret (oauth2, github-app, ...), verified as STS is.
        self.exchanges = exchanges or Exchanges(secrets, cafile=self.roles.cafile)
        # By the identity of the rule entry (it is kept in the value, so the id stays its own):
        # hashing a frozen dataclass per request costs more than the lookup it serves. With the
        # text worked out: a role's keys change while the stored secret does not.
        self._worked_out: dict[int, tuple[Injection, Secret, str, Credential]] = {}
        # The rule entries of the rules in force: a request that was waiting for its secret
        # across a reload must not bring back the credential of an entry that is gone.
        self._named: dict[int, Injection] = {}
        # Sealed role keys worked out, by the identity of the opened token's (kept) value, with
        # the policy its STS endpoint was admitted under.
        self._sealed_roles: dict[int, tuple[SealedExchange, Policy, str, Credential]] = {}

    def check(self, rules: RuleSet) -> None:
        """Every secret a rule names must have a store; raises SecretConfigError. Credentials
        of injections the new rules no longer name are forgotten."""
        named = {}
        for policy in rules.policies.values():
            for rule in policy.rules:
                for injection in rule.inject:
                    self.secrets.check(injection.secret)
                    named[id(injection)] = injection
        self._named = named
        for gone in self._worked_out.keys() - named.keys():
            del self._worked_out[gone]

    async def credentials(self, injections: Sequence[Injection], *, guard: Guard | None = None,
                          policy: Policy | None = None) -> list[Credential]:
        """What a rule's `inject` entries put in, their secrets fetched (nearly always from
        the cache); a token endpoint dialed through `guard` under `policy`."""
        found = []
        for injection in injections:
            # One at a time: nearly always a cache hit, which a gather would turn into a task
            # and a loop turn per secret.
            secret = self.secrets.fresh(injection.secret)
            if secret is None:
                try:
                    secret = await self.secrets.get(injection.secret)
                except SecretError as exc:
                    # The reason names the failure class; the detail names no value.
                    raise Denial(Reason.SECRET_UNAVAILABLE,
                        f"a credential for this request is unavailable ({exc.reason})",
                    ) from None
            text = secret.reveal()
            exchange = injection.processor.token_exchange
            if exchange is not None:
                found.append(await self._exchanged(injection, exchange, text, guard, policy))
                continue
            if injection.processor.role(text) is not None:
                text = await self._role_keys(text, guard, policy)
            known = self._worked_out.get(id(injection))
            if (known is not None and known[0] is injection and known[1] is secret
                    and known[2] == text):
                found.append(known[3])
                continue
            try:
                cred = credential(injection.processor, text, f"broker:{injection.secret}")
            except InjectionError as exc:
                raise Denial(exc.reason, str(exc)) from None
            if self._named.get(id(injection)) is injection:
                self._worked_out[id(injection)] = (injection, secret, text, cred)
            found.append(cred)
        return found

    async def _role_keys(self, text: str, guard: Guard | None, policy: Policy | None) -> str:
        """The keys of the role an aws-sigv4 secret names (STS dialed through `guard` under
        `policy`)."""
        try:
            return await self.roles.resolve(text, guard, policy)
        except ExchangeError as exc:
            raise Denial(Reason.SECRET_UNAVAILABLE,
                         f"a credential for this request is unavailable ({exc})") from None

    async def _exchanged(self, injection: Injection, processor: TokenExchange, text: str,
                         guard: Guard | None, policy: Policy | None) -> Credential:
        """The token a token-exchange processor obtains with the secret."""
        if guard is None or policy is None:
            raise Denial(Reason.INTERNAL_ERROR, f"{processor.kind} needs the guard to dial")
        return await self._exchange(processor, text, guard, policy, ref=injection.secret,
                                    label=f"broker:{injection.secret}")

    async def sealed(self, sealed: SealedExchange, *, guard: Guard, rules: RuleSet,
                     identity: Identity, policy: Policy) -> Credential:
        """What a sealed token's exchange processor obtains (a token, a role's keys), from an
        endpoint the sandbox's policy lets it POST to (its minter, whoever that was, chose
        the endpoint)."""
        processor = sealed.processor

        def admit(endpoint: Endpoint) -> None:
            try:
                path = normalize_path(endpoint.path)
            except PathError as exc:
                raise Denial(exc.reason, f"a token's {processor.kind} endpoint: {exc}") from None
            decision = decide(rules, Question(identity, endpoint.host, endpoint.port, "https",
                                              "POST", path))
            if not decision.allowed:
                raise Denial(decision.reason or Reason.NOT_ALLOWED,
                             f"a token's {processor.kind} endpoint: {decision.detail}")

        exchange = processor.token_exchange
        if exchange is not None:
            return await self._exchange(exchange, sealed.secret, guard, policy, ref=None,
                                        label=sealed.label, admit=admit)
        known = self._sealed_roles.get(id(sealed))
        if known is None or known[0] is not sealed or known[1] is not policy:
            known = None  # not yet admitted under this policy
            role = processor.role(sealed.secret)
            assert role is not None  # as the tokenizer found
            try:
                admit(dial.endpoint(role.sts_endpoint))
            except ExchangeError as exc:
                raise Denial(Reason.SECRET_INVALID, str(exc)) from None
        text = await self._role_keys(sealed.secret, guard, policy)
        if known is not None and known[2] == text:
            return known[3]
        try:
            cred = credential(processor, text, sealed.label,
                              inapplicable=Reason.TOKEN_INAPPLICABLE)
        except InjectionError as exc:
            raise Denial(exc.reason, str(exc)) from None
        if len(self._sealed_roles) >= _MAX_SEALED:
            self._sealed_roles.clear()  # a sandbox minting tokens chooses how many
        self._sealed_roles[id(sealed)] = (sealed, policy, text, cred)
        return cred

    async def _exchange(self, processor: TokenExchange, text: str, guard: Guard,
                        policy: Policy, *, ref: SecretRef | None, label: str,
                        admit: Callable[[Endpoint], None] | None = None) -> Credential:
        try:
            return await self.exchanges.credential(processor, text, guard, policy, ref=ref,
                                                   label=label, admit=admit)
        except GrantError as exc:
            raise Denial(Reason.SECRET_INVALID, str(exc)) from None
        except ExchangeError as exc:
            raise Denial(Reason.SECRET_UNAVAILABLE,
                         f"a credential for this request is unavailable ({exc})") from None

    async def close(self) -> None:
        await self.exchanges.close()
        await self.roles.close()
        await self.secrets.close()
