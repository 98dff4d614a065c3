"""Sealed credential tokens: the format, proxy keys, and the mint CLI and service.

The token API that the issuer and the proxy share is this package's namespace, whichever module
each name lives in: the format (`token`), what its scope is written in (`scope`), the checks of
an opened token against a request (`checks`) and why a token is refused (`errors`). Proxy keys
are `sealgate.issuer.keys`, the processors `sealgate.issuer.processors` and putting one into a
request `sealgate.issuer.injection`. The issuer's own callers, service and commands use this
namespace too; the modules it gathers never import it, so it sits above them.
"""

from .checks import (
    CLOCK_SKEW_SECONDS,
    check_binding,
    check_scope,
    check_time,
    validity,
)
from .errors import (
    TokenBinding,
    TokenError,
    TokenExpired,
    TokenInapplicable,
    TokenInvalid,
    TokenMalformed,
    TokenScope,
)
from .scope import DEFAULT_PORT, HostPattern
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
    "Envelope",
    "HostPattern",
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
