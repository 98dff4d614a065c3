"""Which sandbox sent this request.

In order: the `Proxy-Authorization: Basic id:key` the client sent (what `HTTP_PROXY=http://id:key@…`
produces), else what this client connection proved earlier (a CONNECT's credentials cover the
tunnel's requests), else the source address the sandbox runtime registered, else the default
policy. A wrong key, or an id we do not know, is a 407: the two are indistinguishable on purpose,
so the proxy is no oracle for which sandbox ids exist.

The same credentials may carry sealed tokens, so that an SDK configured with nothing but a proxy
URL presents them (`http://bot-1:KEY,sg1.…,sg1.…@proxy`, or `http://_:sg1.…@proxy` to claim no
identity: `_` is no sandbox id, which start with a letter or digit, and clients send no
credentials for an empty user): the password is the key, then a comma before each token. A
password whose comma-separated tail holds no token is a key as a whole, so a key holding a comma
still works.
Which request a token then goes with is the pipeline's business (by the token's host scope).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

from sealgate.credentials import TOKEN_PREFIX
from sealgate.reasons import Reason

from ..errors import Denial
from ..policy.decide import Identity
from ..policy.model import RuleSet
from .registry import SourceRegistry

# Compared against when the id is unknown, so a miss costs the same as a wrong key.
_DUMMY_DIGEST = hashlib.sha256(b"sealgate-unknown-sandbox").digest()
_PROVEN_CAP = 4096
# An id, a key and eight tokens (docs/token-format.md: the most a request may carry) fit many
# times over; the cache holds at most _PROVEN_CAP values of this size.
_LONGEST = 16 * 1024
_MOST_TOKENS = 8
_TOKEN_START = TOKEN_PREFIX + "."
_NO_ONE = frozenset({"", "_"})  # users that claim no identity


@dataclass(frozen=True, slots=True)
class Proven:
    """What one Proxy-Authorization value proves (`identity`, None when it claims none) and the
    sealed tokens it carries."""

    identity: Identity | None
    tokens: tuple[str, ...] = ()


_NOTHING = Proven(None)


class Identifier:
    def __init__(self, rules: RuleSet, registry: SourceRegistry) -> None:
        self.rules = rules
        self.registry = registry
        # Clients repeat the same credential on every request: a proven one is remembered for
        # the life of these rules (a reload builds a new Identifier). Failures are not cached.
        self._proven: dict[str, Proven] = {}

    def from_proxy_authorization(self, value: str) -> Proven:
        """What a Proxy-Authorization value proves. Other schemes than Basic prove nothing (a
        token binding's `Bearer` belongs to the tokenizer, not to identity). Raises Denial."""
        proven = self._proven.get(value)
        if proven is not None:
            return proven
        if len(value) > _LONGEST:
            raise Denial(Reason.IDENTITY_INVALID, f"Proxy-Authorization over {_LONGEST} bytes")
        proven = self._prove(value)
        if len(self._proven) >= _PROVEN_CAP:
            self._proven.clear()
        self._proven[value] = proven
        return proven

    def tokens_in(self, values: Sequence[str]) -> list[str]:
        """The sealed tokens carried in Proxy-Authorization values (each proved as above)."""
        return [t for value in values for t in self.from_proxy_authorization(value).tokens]

    def _prove(self, value: str) -> Proven:
        scheme, _, param = value.strip().partition(" ")
        if scheme.lower() != "basic":
            return _NOTHING
        try:
            decoded = base64.b64decode(param.strip(), validate=True).decode("utf-8")
        except ValueError as exc:  # not base64 (binascii.Error), not ASCII, not UTF-8
            raise Denial(Reason.IDENTITY_INVALID, "Proxy-Authorization is not valid Basic") from exc
        sandbox_id, sep, password = decoded.partition(":")
        if not sep:
            raise Denial(Reason.IDENTITY_INVALID, "Proxy-Authorization needs id:key")
        if sandbox_id in _NO_ONE:
            # No identity claimed: the password is nothing but tokens (each checked when used).
            tokens = _at_most(tuple(password.split(",")) if password else ())
            return Proven(None, tokens) if tokens else _NOTHING
        key, tokens = _key_and_tokens(password)
        tokens = _at_most(tokens)
        entry = self.rules.sandboxes.get(sandbox_id)
        digest = hashlib.sha256(key.encode("utf-8")).digest()
        expected = entry.key_sha256 if entry is not None else _DUMMY_DIGEST
        if not hmac.compare_digest(digest, expected) or entry is None or not key:
            raise Denial(Reason.IDENTITY_INVALID, "unknown sandbox or wrong key")
        return Proven(Identity(sandbox_id, entry.policy, "proxy-auth"), tokens)

    def from_source(self, address: str) -> Identity | None:
        sandbox_id = self.registry.lookup(address)
        if sandbox_id is None:
            return None
        entry = self.rules.sandboxes.get(sandbox_id)
        if entry is None:
            # Registered but since removed from the rules: attribute it, allow it nothing.
            return Identity(sandbox_id, None, "source")
        return Identity(sandbox_id, entry.policy, "source")

    def current(self, identity: Identity) -> Identity:
        """The same sandbox under these rules (its policy may have changed, or gone)."""
        if identity.sandbox is None:
            return self.default()
        entry = self.rules.sandboxes.get(identity.sandbox)
        return Identity(identity.sandbox, entry.policy if entry else None, identity.via)

    def default(self) -> Identity:
        return Identity(None, self.rules.default_policy, "default")


def _key_and_tokens(password: str) -> tuple[str, tuple[str, ...]]:
    key, _, rest = password.partition(",")
    tokens = tuple(rest.split(",")) if rest else ()
    if any(t.startswith(_TOKEN_START) for t in tokens):
        return key, tokens
    return password, ()


def _at_most(tokens: tuple[str, ...]) -> tuple[str, ...]:
    if len(tokens) > _MOST_TOKENS:
        raise Denial(Reason.TOKEN_MALFORMED, f"at most {_MOST_TOKENS} tokens in the proxy "
                     "credentials")
    return tokens
