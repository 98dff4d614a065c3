"""The token-exchange processors' credentials: a brokered secret exchanged for the token a
request carries (`oauth2`, `github-app`, `gcp-service-account`; what is sent where is the
processor's `Exchange`, how the answer is read `sealgate.credentials.grants`), cached by
`credentials.exchanged`, and injected as `Authorization: <scheme> <token>`.

The token endpoint is dialed as sandbox traffic is (`credentials.dial`: through the guard under
the policy of the request that needs the token), so tokens are cached per policy's networks. A
rotated refresh token is written back to the store where the store can be written, and kept in
memory either way.

A sealed token may carry one of these processors too. Anyone with the proxy's public key can
mint one, naming any endpoint: so its endpoint is first put to the policy decision as a POST the
sandbox itself would make (`admit`), and dialed only where that is allowed; the proxy then sends
nothing the sandbox could not have sent there. Its rotated refresh token has no store to go
back to and is kept in memory only (on this replica, until it restarts).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import ssl
from collections import Counter
from collections.abc import Callable
from typing import Final, NamedTuple

from sealgate.credentials import grants
from sealgate.credentials.processors import Exchange, TokenExchange

from ..net.guard import Guard
from ..policy.model import Policy
from . import dial
from .dial import Endpoint
from .exchanged import Exchanged, ExchangeError, Obtained
from .inject import Credential, credential
from .secrets import SecretBroker, SecretError, SecretRef

__all__ = ["Exchanges"]

log = logging.getLogger(__name__)

# The processor, the secret's reference and the policy's networks, as one string: hashed once.
Key = str
MAX_HOT: Final = 4096
MAX_ROTATED: Final = 4096  # rotated secrets kept; a sandbox chooses how many sealed ones


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


class _Named(NamedTuple):
    """Which secret: `ref` in a store, or None for one sealed in a token; `name` keys it,
    `label` names it in logs and audit lines."""

    ref: SecretRef | None
    name: str
    label: str


@dataclasses.dataclass(frozen=True, slots=True)
class _Hot:
    """What one rule entry's last request found: the next finds it with a few identity
    checks, as long as the stored secret, the policy and the cached token are the same."""

    processor: TokenExchange
    stored: str
    policy: Policy
    key: Key
    source: str
    cred: Credential


class Exchanges:
    def __init__(self, secrets: SecretBroker, *, cafile: str | None = None,
                 cache: Exchanged[Key] | None = None) -> None:
        self.secrets = secrets
        self.cache: Exchanged[Key] = cache or Exchanged()
        self._ssl = ssl.create_default_context(cafile=cafile)
        # (processor, ref) -> (digests of the stored texts a rotation replaced, the text now)
        self._rotated: dict[tuple[TokenExchange, str], tuple[frozenset[str], str]] = {}
        self._worked_out: dict[Key, Credential] = {}
        self._hot: dict[int, _Hot] = {}  # by the processor's identity: see _Hot
        # Calls to token endpoints, by processor type and outcome (obtained, failed).
        self.outcomes: Counter[tuple[str, str]] = Counter()

    async def credential(
        self, processor: TokenExchange, stored: str, guard: Guard, policy: Policy, *,
        ref: SecretRef | None, label: str, admit: Callable[[Endpoint], None] | None = None,
    ) -> Credential:
        """The credential for `processor` with the secret `stored`, at `ref` in a store or
        (None) sealed in a token; `admit` raises unless its endpoint may be dialed.
        ExchangeError: no token to be had; GrantError: the secret is not the processor's."""
        hot = self._hot.get(id(processor))
        if (hot is not None and hot.processor is processor and hot.stored is stored
                and hot.policy is policy
                and self.cache.fresh(hot.key, hot.source) is hot.cred.secret):
            return hot.cred
        named = _Named(ref, str(ref) if ref is not None else f"sealed:{_digest(stored)}", label)
        name = named.name
        text = self._current(processor, name, stored)
        exchange = processor.exchange(text)
        if admit is not None:
            admit(dial.endpoint(exchange.endpoint))
        key: Key = f"{processor!r}\0{name}\0{policy.allow_networks!r}"
        source = _digest(text)
        token = self.cache.fresh(key, source)
        if token is None:
            token = await self.cache.get(
                key, source, lambda: self._obtain(processor, named, text, exchange, guard=guard,
                                                  policy=policy))
            # A rotation has replaced the refresh token the needles are to hold.
            text = self._current(processor, name, stored)
            exchange, source = processor.exchange(text), _digest(text)
        known = self._worked_out.get(key)
        if known is None or known.secret != token:
            if len(self._worked_out) >= MAX_HOT:
                self._worked_out.clear()  # a sandbox minting tokens chooses how many keys
            known = self._worked_out[key] = self._credential(processor, label, exchange, key,
                                                             token)
        if len(self._hot) >= MAX_HOT:
            self._hot.clear()  # entries of processors gone with reloaded rules or tokens
        self._hot[id(processor)] = _Hot(processor, stored, policy, key, source, known)
        return known

    def _credential(self, processor: TokenExchange, label: str, exchange: Exchange,
                    key: Key, token: str) -> Credential:
        cred = credential(processor.carrier, token, label)
        return dataclasses.replace(cred, needles=(*cred.needles, *exchange.needles()),
                                   rejected=_invalidator(self.cache, key, token))

    def _current(self, processor: TokenExchange, ref: str, stored: str) -> str:
        """The secret as it is now: the stored text, unless it is one a rotation replaced
        (the store could not be written, or its cache has not seen the write yet)."""
        rotated = self._rotated.get((processor, ref))
        if rotated is None:
            return stored
        if _digest(stored) in rotated[0]:
            return rotated[1]
        if stored != rotated[1]:
            del self._rotated[(processor, ref)]  # the operator wrote a new secret
        return stored

    async def _obtain(self, processor: TokenExchange, named: _Named, text: str,
                      exchange: Exchange, *, guard: Guard, policy: Policy) -> Obtained:
        try:
            headers, body = exchange.token_request(self.cache.clock())
            status, answer = await self._post(dial.endpoint(exchange.endpoint), headers, body,
                                              guard, policy)
            found = grants.read_answer(status, answer, self.cache.clock(), kind=processor.kind)
        except (grants.GrantError, ExchangeError) as exc:
            # Named by reference and cause only, as the sandbox's refusal is.
            log.warning("token exchange failed", extra={
                "kind": processor.kind, "credential": named.label, "error": str(exc)})
            self.outcomes[(processor.kind, "failed")] += 1
            raise ExchangeError(str(exc)) from None
        self.outcomes[(processor.kind, "obtained")] += 1
        log.info("token obtained", extra={
            "kind": processor.kind, "credential": named.label,
            "expires_in": round(found.expires - self.cache.clock())})
        source = _digest(text)
        if found.refresh_token is not None:
            rotated = exchange.rotated(found.refresh_token)
            if rotated is not None:
                source = await self._rotate(processor, named, text, rotated)
        return Obtained(found.token, found.expires, source)

    async def _rotate(self, processor: TokenExchange, named: _Named, text: str,
                      new: str) -> str:
        """Keep the rotated secret `new` (the old refresh token may be dead already) and write
        it back where the store can be written. The digest of the secret as it is now."""
        ref, name = named.ref, named.name
        superseded = self._rotated.get((processor, name), (frozenset(), ""))[0]
        if len(self._rotated) >= MAX_ROTATED:
            del self._rotated[next(iter(self._rotated))]
        self._rotated[(processor, name)] = (superseded | {_digest(text)}, new)
        if ref is None:
            log.warning("the rotated refresh token is kept in memory only (the sealed token "
                        "still holds the old one)",
                        extra={"kind": processor.kind, "credential": named.label})
            return _digest(new)
        try:
            await self.secrets.write(ref, new)
        except SecretError as exc:
            log.warning("the rotated refresh token is kept in memory only (the store "
                        "could not be written)",
                        extra={"kind": processor.kind, "ref": str(ref), "error": str(exc)})
        return _digest(new)

    async def _post(self, endpoint: Endpoint, headers: dict[str, str], body: bytes,
                    guard: Guard, policy: Policy) -> tuple[int, object]:
        status, raw = await dial.post(endpoint, headers, body, guard=guard, policy=policy,
                                      tls=self._ssl, what="the token endpoint")
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, None

    async def close(self) -> None:
        await self.cache.close()


def _invalidator(cache: Exchanged[Key], key: Key, token: str) -> Callable[[], None]:
    return lambda: cache.invalidate(key, token)
