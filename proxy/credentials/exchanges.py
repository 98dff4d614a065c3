"""The token-exchange processors' credentials: a brokered secret exchanged for the token a
request carries (`oauth2`, `github-app`, `gcp-service-account`; what is sent and read is
`issuer.grants`), cached by `credentials.exchanged`, and injected as
`Authorization: <scheme> <token>`.

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

import base64
import dataclasses
import hashlib
import json
import logging
import ssl
from collections.abc import Callable
from typing import Final, NamedTuple
from urllib.parse import quote_plus, urlencode

from sealgate.credentials import grants
from sealgate.credentials.processors import (
    GcpServiceAccountProcessor,
    GitHubAppProcessor,
    HeaderProcessor,
    OAuth2Processor,
)

from ..net.guard import Guard
from ..policy.model import Policy
from . import dial
from .dial import Endpoint
from .exchanged import Exchanged, ExchangeError, Obtained
from .inject import Credential, credential
from .secrets import SecretBroker, SecretError, SecretRef

__all__ = ["ExchangeProcessor", "Exchanges"]

log = logging.getLogger(__name__)

ExchangeProcessor = OAuth2Processor | GitHubAppProcessor | GcpServiceAccountProcessor
# The processor, the secret's reference and the policy's networks, as one string: hashed once.
Key = str
MAX_HOT: Final = 4096
MAX_ROTATED: Final = 4096  # rotated secrets kept; a sandbox chooses how many sealed ones
_FORM: Final = "application/x-www-form-urlencoded"


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

    processor: ExchangeProcessor
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
        self._rotated: dict[tuple[ExchangeProcessor, str], tuple[frozenset[str], str]] = {}
        self._worked_out: dict[Key, Credential] = {}
        self._hot: dict[int, _Hot] = {}  # by the processor's identity: see _Hot

    async def credential(
        self, processor: ExchangeProcessor, stored: str, guard: Guard, policy: Policy, *,
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
        parsed = _parse(processor, text)
        if admit is not None:
            admit(_endpoint(processor, parsed))
        key: Key = f"{processor!r}\0{name}\0{policy.allow_networks!r}"
        source = _digest(text)
        token = self.cache.fresh(key, source)
        if token is None:
            token = await self.cache.get(
                key, source, lambda: self._obtain(processor, named, text, parsed, guard=guard,
                                                  policy=policy))
            # A rotation has replaced the refresh token the needles are to hold.
            text = self._current(processor, name, stored)
            parsed, source = _parse(processor, text), _digest(text)
        known = self._worked_out.get(key)
        if known is None or known.secret != token:
            if len(self._worked_out) >= MAX_HOT:
                self._worked_out.clear()  # a sandbox minting tokens chooses how many keys
            known = self._worked_out[key] = self._credential(processor, label, parsed, key,
                                                             token)
        if len(self._hot) >= MAX_HOT:
            self._hot.clear()  # entries of processors gone with reloaded rules or tokens
        self._hot[id(processor)] = _Hot(processor, stored, policy, key, source, known)
        return known

    def _credential(self, processor: ExchangeProcessor, label: str, parsed: object,
                    key: Key, token: str) -> Credential:
        cred = credential(HeaderProcessor("Authorization", f"{processor.scheme} {{secret}}"
                                          if not isinstance(processor, GcpServiceAccountProcessor)
                                          else "Bearer {secret}"),
                          token, label)
        cred = dataclasses.replace(cred, needles=(*cred.needles, *_needles(parsed)),
                                   rejected=_invalidator(self.cache, key, token))
        return cred

    def _current(self, processor: ExchangeProcessor, ref: str, stored: str) -> str:
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

    async def _obtain(self, processor: ExchangeProcessor, named: _Named, text: str,
                      parsed: object, *, guard: Guard, policy: Policy) -> Obtained:
        now = self.cache.clock()
        try:
            endpoint = _endpoint(processor, parsed)
            if isinstance(processor, OAuth2Processor):
                assert isinstance(parsed, grants.OAuthClient)
                headers, body = _oauth2(processor, parsed)
            elif isinstance(processor, GitHubAppProcessor):
                assert isinstance(parsed, grants.AppKey)
                headers = {"Authorization": f"Bearer {grants.app_jwt(parsed, now)}",
                           "Accept": "application/vnd.github+json",
                           "X-GitHub-Api-Version": "2022-11-28",
                           "Content-Type": "application/json"}
                body = json.dumps(processor.narrowed).encode()
            else:
                assert isinstance(parsed, grants.ServiceAccount)
                scopes = None if processor.scopes is None else processor.scopes.replace(",", " ")
                assertion = grants.service_account_assertion(
                    parsed, scopes=scopes, audience=processor.audience, now=now)
                headers = {"Content-Type": _FORM}
                body = urlencode({"grant_type": grants.JWT_BEARER,
                                  "assertion": assertion}).encode()
            status, answer = await self._post(endpoint, headers, body, guard, policy)
            found = grants.read_answer(status, answer, self.cache.clock(), kind=processor.kind)
        except (grants.GrantError, ExchangeError) as exc:
            # Named by reference and cause only, as the sandbox's refusal is.
            log.warning("sealgate: %s for %s: no token: %s", processor.kind, named.label, exc)
            raise ExchangeError(str(exc)) from None
        log.info("sealgate: %s for %s: a token for %.0f s", processor.kind, named.label,
                 found.expires - self.cache.clock())
        source = _digest(text)
        if isinstance(parsed, grants.OAuthClient) and found.refresh_token is not None and \
                found.refresh_token != parsed.refresh_token:
            source = await self._rotate(processor, named, text, parsed, found.refresh_token)
        return Obtained(found.token, found.expires, source)

    async def _rotate(self, processor: ExchangeProcessor, named: _Named, text: str,
                      parsed: grants.OAuthClient, refresh_token: str) -> str:
        """Keep the rotated refresh token (the old one may be dead already) and write it back
        where the store can be written. The digest of the secret as it is now."""
        new = dataclasses.replace(parsed, refresh_token=refresh_token).to_json()
        ref, name = named.ref, named.name
        superseded = self._rotated.get((processor, name), (frozenset(), ""))[0]
        if len(self._rotated) >= MAX_ROTATED:
            del self._rotated[next(iter(self._rotated))]
        self._rotated[(processor, name)] = (superseded | {_digest(text)}, new)
        if ref is None:
            log.warning("sealgate: %s for a sealed token: the rotated refresh token is kept in "
                        "memory only (the token still holds the old one)", processor.kind)
            return _digest(new)
        try:
            await self.secrets.write(ref, new)
        except SecretError as exc:
            log.warning("sealgate: %s: the rotated refresh token is kept in memory only: %s",
                        ref, exc)
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


def _endpoint(processor: ExchangeProcessor, parsed: object) -> Endpoint:
    """Where the token is asked for."""
    if isinstance(processor, OAuth2Processor):
        return dial.endpoint(processor.token_url)
    if isinstance(processor, GitHubAppProcessor):
        return dial.endpoint(f"{processor.api.rstrip('/')}/app/installations/"
                             f"{processor.installation_id}/access_tokens")
    assert isinstance(parsed, grants.ServiceAccount)
    return dial.endpoint(parsed.token_uri)


def _oauth2(processor: OAuth2Processor, client: grants.OAuthClient
            ) -> tuple[dict[str, str], bytes]:
    form = {"grant_type": processor.grant}
    if client.refresh_token is not None:
        form["refresh_token"] = client.refresh_token
    if processor.scopes is not None:
        form["scope"] = processor.scopes.replace(",", " ")
    if processor.audience is not None:
        form["audience"] = processor.audience
    headers = {"Content-Type": _FORM, "Accept": "application/json"}
    if client.client_id is not None:
        if processor.client_auth == "basic" and client.client_secret is not None:
            # RFC 6749 2.3.1: each form-encoded, then joined for Basic.
            pair = f"{quote_plus(client.client_id)}:{quote_plus(client.client_secret)}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        else:
            form["client_id"] = client.client_id
            if client.client_secret is not None:
                form["client_secret"] = client.client_secret
    return headers, urlencode(form).encode()


def _parse(processor: ExchangeProcessor, text: str) -> object:
    if isinstance(processor, OAuth2Processor):
        return grants.parse_oauth(text, processor.grant)
    if isinstance(processor, GitHubAppProcessor):
        return grants.parse_app(text)
    return grants.parse_service_account(text)


def _needles(parsed: object) -> tuple[str, ...]:
    """What of the secret an echo must not give away: refresh token, client secret, the
    private key as written and as JSON escapes it."""
    if isinstance(parsed, grants.OAuthClient):
        return tuple(v for v in (parsed.refresh_token, parsed.client_secret) if v is not None)
    if isinstance(parsed, grants.AppKey | grants.ServiceAccount):
        return parsed.pem, json.dumps(parsed.pem)[1:-1]
    return ()


def _invalidator(cache: Exchanged[Key], key: Key, token: str) -> Callable[[], None]:
    return lambda: cache.invalidate(key, token)
