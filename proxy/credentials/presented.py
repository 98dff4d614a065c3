"""Which sealed tokens go with a request, from the three places a sandbox can present them.

- its own `Proxy-Tokenizer` header (or a base-URL path's `/_/<tokens>@<host>`): all must pass;
- its tunnel's: a CONNECT's `Proxy-Tokenizer` goes with every request inside, and each token must
  be for the CONNECT's host, so a tunnel that could never use one is refused at once;
- its proxy credentials (`http://id:key,sg1.…@proxy`): each goes with the requests to the hosts
  its scope names and is left out of the others, after its binding is checked.

Whatever is chosen is then opened and checked in full by `Tokenizer.authorise`. A token refusal
is a `Denial` with the token's own reason, and a proxy without token keys refuses every token.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from sealgate.credentials import TokenError
from sealgate.hostname import Host
from sealgate.reasons import Reason

from ..errors import Denial
from .inject import Credential
from .tokenizer import SealedExchange, Tokenizer, TokenRequest


def in_credentials(
    tokenizer: Tokenizer | None, tokens: Sequence[str], host: Host, request: TokenRequest
) -> list[str]:
    """Of the tokens in the proxy credentials, those for `host` and `request.port`."""
    if not tokens:  # no token: nothing to refuse, even for a proxy without token keys
        return []
    with _refused():
        return _keys(tokenizer).covering(tokens, host, request, strict=False)


def check_tunnel(
    tokenizer: Tokenizer | None, tokens: Sequence[str], host: Host, request: TokenRequest
) -> None:
    """Refuse a CONNECT whose tokens are not all for its host."""
    with _refused():
        _keys(tokenizer).covering(tokens, host, request, strict=True)


def opened(
    tokenizer: Tokenizer | None, tokens: Sequence[str], request: TokenRequest
) -> list[Credential | SealedExchange]:
    """What the tokens inject, each checked in full against `request`."""
    with _refused():
        return _keys(tokenizer).authorise(tokens, request)


def _keys(tokenizer: Tokenizer | None) -> Tokenizer:
    if tokenizer is None:
        raise Denial(Reason.TOKEN_INVALID, "this proxy holds no token keys")
    return tokenizer


@contextlib.contextmanager
def _refused() -> Iterator[None]:
    try:
        yield
    except TokenError as exc:
        raise Denial(exc.reason, str(exc)) from None
