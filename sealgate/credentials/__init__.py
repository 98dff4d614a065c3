"""The credentials library: what a credential is and how each kind is carried, shared by the
issuer (which seals secrets into tokens) and the proxy (which opens tokens and injects secrets).

- a sealed token: its format (`token`), what its scope is written in (`scope`), the checks of an
  opened token against a request (`checks`), and the keys it is sealed to (`keys`);
- the processors (`processors`): one type per way a secret goes into a request, each knowing
  its settings, the secrets it takes, what it writes and how, and how it is described
  (`processors/base.py` says what every one can be asked; the registry in
  `processors/__init__.py` maps a type name to its class);
- what they need, without I/O: the request they write into (`httprequest`), AWS SigV4 and its
  keys (`sigv4`, `awskeys`, `awsresign`, `awschunked`), the token exchanges' secrets, JWTs and
  answers (`grants`), strict JSON objects (`jsonfields`), and a secret's name in a store
  (`secretref`);
- why any of it is refused (`errors`): one root, `CredentialError`, each error with its reason.

`sealgate.proxy.credentials` is where the proxy gets secrets and when it applies them: the
secret stores, the broker, the tokenizer's flow, the token exchanges' calls, and scrubbing what
comes back. This package does no I/O but reading and writing key files.

The token API is this package's namespace, whichever module each name lives in; the modules it
gathers never import it, so it sits above them.
"""

from .checks import (
    CLOCK_SKEW_SECONDS,
    check_binding,
    check_scope,
    check_time,
    validity,
)
from .errors import (
    CredentialError,
    TokenBinding,
    TokenError,
    TokenExpired,
    TokenInapplicable,
    TokenInvalid,
    TokenMalformed,
    TokenScope,
)
from .scope import DEFAULT_PORT, Destination
from .token import (
    CLAIMS_VERSION,
    MAX_LIFETIME_SECONDS,
    MAX_TOKEN_LENGTH,
    TOKEN_PREFIX,
    AuthDigestBinding,
    Binding,
    Claims,
    Envelope,
    PolicyBinding,
    SandboxBinding,
    claims_from_object,
    encode_claims,
    format_token,
    parse_envelope,
    redacted_claims,
    seal,
    unseal,
)

__all__ = [
    "CLAIMS_VERSION",
    "CLOCK_SKEW_SECONDS",
    "DEFAULT_PORT",
    "MAX_LIFETIME_SECONDS",
    "MAX_TOKEN_LENGTH",
    "TOKEN_PREFIX",
    "AuthDigestBinding",
    "Binding",
    "Claims",
    "CredentialError",
    "Destination",
    "Envelope",
    "PolicyBinding",
    "SandboxBinding",
    "TokenBinding",
    "TokenError",
    "TokenExpired",
    "TokenInapplicable",
    "TokenInvalid",
    "TokenMalformed",
    "TokenScope",
    "check_binding",
    "check_scope",
    "check_time",
    "claims_from_object",
    "encode_claims",
    "format_token",
    "parse_envelope",
    "redacted_claims",
    "seal",
    "unseal",
    "validity",
]
