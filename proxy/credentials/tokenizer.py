"""The proxy side of sealed tokens: open what the sandbox carries, check it, say what to inject.

Stateless by design: everything a token grants is inside it, sealed to the proxy's key, so any
number of proxies can open it with nothing to share but the private keys. Opening costs an X25519
operation, so opened tokens are cached, keyed by the token text, until their `exp`, together with
the credential worked out from them (the cache holds that secret anyway, so keeping the token,
which opens nothing without this proxy, adds no exposure; hashing it first cost more than the
rest of a cached use). The time window is checked on every use; binding and scope, pure
functions of the token and the request, again whenever the request differs from the one the
token last passed for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from sealgate.credentials import (
    Claims,
    TokenInapplicable,
    TokenMalformed,
    TokenScope,
    check_binding,
    check_scope,
    check_time,
    unseal,
    validity,
)
from sealgate.credentials.keys import Keyring
from sealgate.credentials.processors import Processor
from sealgate.hostname import Host

from .inject import Credential, credential

HEADER = "proxy-tokenizer"
_MAX_TOKENS = 8  # per request, all Proxy-Tokenizer fields together
_OWS = " \t"  # RFC 9110 optional whitespace: nothing else is trimmed off a token
_SWEEP_SECONDS = 1.0


class TokenRequest(NamedTuple):
    """What a token is checked against: the request as the guard already decided it. A tuple,
    so that building one and comparing it with the last one a token passed for stay cheap."""

    sandbox: str | None
    policy: str | None
    host: str
    port: int
    method: str
    path: str
    proxy_authorization: Sequence[str]

    def __repr__(self) -> str:
        # Proxy-Authorization carries the sandbox's key or a binding's bearer secret.
        shown = self._replace(proxy_authorization=[f"<{len(self.proxy_authorization)} hidden>"])
        return f"TokenRequest{tuple.__repr__(shown)}"


@dataclass(frozen=True, slots=True)
class SealedExchange:
    """A token whose processor obtains what goes in (`oauth2`, `github-app`,
    `gcp-service-account`, `aws-sigv4` keys that name a role): its secret is exchanged first
    (`Broker.sealed`)."""

    processor: Processor
    secret: str = field(repr=False)
    label: str


@dataclass(slots=True)
class _Opened:
    claims: Claims
    credential: Credential | SealedExchange
    start: int  # validity(claims): usable while start <= now < end
    end: int
    passed: TokenRequest | None = None  # the last request binding and scope let through


class Tokenizer:
    def __init__(
        self, keyring: Keyring, *, cache_size: int = 4096, clock: Callable[[], float] = time.time
    ) -> None:
        self.keyring = keyring
        self.cache_size = cache_size
        self.clock = clock
        # Oldest first: evicted after the expired ones. A token used again is not moved, which
        # costs a busy one at most one more unsealing when the cache is full.
        self._opened: dict[str, _Opened] = {}
        self._next_sweep = 0.0

    def _unsealed(self, token: str) -> _Opened:
        """Decrypt (or recall) a token, whatever its time window. Raises TokenError."""
        opened = self._opened.get(token)
        if opened is None:
            claims = unseal(token, self.keyring)
            label = f"token:{claims.kid}:{claims.jti or '-'}"
            # Claims refuse a secret their processor cannot carry, so this does not raise.
            cred = _sealed(claims, label) or credential(
                claims.processor, claims.secret, label, inapplicable=TokenInapplicable.reason)
            opened = self._opened[token] = _Opened(claims, cred, *validity(claims))
            if len(self._opened) > self.cache_size:
                self._evict()
        return opened

    def _open(self, token: str) -> _Opened:
        """Decrypt (or recall) a token and check its time window. Raises TokenError."""
        opened = self._unsealed(token)
        now = self.clock()
        if not opened.start <= now < opened.end:
            self._opened.pop(token, None)
            check_time(opened.claims, now=now)  # raises, saying which end of the window
        return opened

    def _evict(self) -> None:
        # The sweep for expired tokens walks the whole cache: at most once a second, or a
        # sandbox minting tokens of its own (anyone with the public key can) would make every
        # one of its requests cost that walk.
        now = self.clock()
        if now >= self._next_sweep:
            self._next_sweep = now + _SWEEP_SECONDS
            for key in [k for k, o in self._opened.items() if o.end <= now]:
                del self._opened[key]
        while len(self._opened) > self.cache_size:
            del self._opened[next(iter(self._opened))]

    def covering(
        self, values: Sequence[str], host: Host, request: TokenRequest, *, strict: bool
    ) -> list[str]:
        """The tokens of `values` (read as `authorise` reads them) whose host scope covers
        `host` and `request.port`; with `strict`, one that does not is refused instead of left
        out (a token on a CONNECT goes with every request in its tunnel, one in the proxy
        credentials only with requests to its hosts). The binding is checked first, so a
        caller who is not the bound sandbox cannot learn a token's hosts from what is left out.
        What is kept is checked in full by `authorise`."""
        kept = []
        for token in _elements(values):
            claims = self._open(token).claims
            check_binding(
                claims, sandbox_id=request.sandbox, policy=request.policy,
                proxy_authorization=request.proxy_authorization,
            )
            if any(pattern.matches(host, request.port) for pattern in claims.hosts):
                kept.append(token)
            elif strict:
                raise TokenScope(f"a token is not for {host.name} port {request.port}")
        return kept

    def authorise(
        self, header_values: Sequence[str], request: TokenRequest
    ) -> list[Credential | SealedExchange]:
        """Every token in every `Proxy-Tokenizer` value, in order; all must pass. Returns what
        each one injects.

        The one reading of the header's list (docs/token-format.md §10): the values of every
        field, each split on `,`, each element stripped of SP and HTAB and then opened as a
        token. An empty element is not skipped: it is the empty token, `token_malformed` as
        the `empty` vector says, so a header that lost its token is refused rather than the
        request forwarded without a credential."""
        granted = []
        for token in _elements(header_values):
            opened = self._open(token)
            if opened.passed != request:
                claims = opened.claims
                # Binding before scope: a caller who is not the bound sandbox learns nothing
                # about what the token would open.
                check_binding(
                    claims,
                    sandbox_id=request.sandbox,
                    policy=request.policy,
                    proxy_authorization=request.proxy_authorization,
                )
                check_scope(claims, request.host, request.port, request.method, request.path)
                opened.passed = request
            granted.append(opened.credential)
        return granted


def _sealed(claims: Claims, label: str) -> SealedExchange | None:
    """What a token whose processor must obtain what goes in opens to: None for the others."""
    processor = claims.processor
    if processor.token_exchange is None and processor.role(claims.secret) is None:
        return None
    return SealedExchange(processor, claims.secret, label)


def _elements(values: Sequence[str]) -> list[str]:
    tokens = [t.strip(_OWS) for value in values for t in value.split(",")]
    if len(tokens) > _MAX_TOKENS:
        raise TokenMalformed(f"at most {_MAX_TOKENS} tokens per request")
    return tokens
