"""Putting a secret into a request as its processor says (`inject`): the one injection that
the token path and the proxy's broker both end in, over any `MutableRequest` (the proxy's wraps
mitmproxy's request; `InMemoryRequest` is the reference for tests and vectors; both, and the
query edits, in `issuer.httprequest`). aws-sigv4's re-signing is `issuer.awsresign`.

No error raised here quotes or chains the secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from typing import assert_never

from . import awskeys, awsresign
from .httprequest import (
    InMemoryRequest,
    MutableRequest,
    has_query_param,
    set_query_param,
)
from .processors import (
    AwsSigV4Processor,
    BasicProcessor,
    BearerProcessor,
    GcpServiceAccountProcessor,
    GitHubAppProcessor,
    HeaderProcessor,
    HmacProcessor,
    OAuth2Processor,
    PlaceholderProcessor,
    Processor,
    ProcessorInvalid,
    QueryProcessor,
    RequestInapplicable,
    check_secret,
)

__all__ = ["InMemoryRequest", "MutableRequest", "has_query_param", "inject", "set_query_param"]


def _signature(key: str, message: bytes, encoding: str) -> str:
    digest = hmac.new(key.encode("utf-8"), message, hashlib.sha256).digest()
    return digest.hex() if encoding == "hex" else base64.b64encode(digest).decode("ascii")


def inject(
    processor: Processor, secret: str, request: MutableRequest, *, now: float | None = None
) -> str | None:
    """Put `secret` into `request` as `processor` says (`now`: the clock aws-sigv4 checks a
    request's date against). Raises SecretInvalid (checked first, so the request is untouched),
    RequestInapplicable, or for aws-sigv4 the refusals of `issuer.awsresign`. Returns what else
    it wrote that an echo must not give away: aws-sigv4's signature (a presigned URL's is a
    capability for days); None for the others."""
    check_secret(processor, secret)
    match processor:
        case BearerProcessor():
            request.set_header_values("Authorization", [f"Bearer {secret}"])
        case HeaderProcessor(header=header, format=fmt):
            request.set_header_values(header, [fmt.replace("{secret}", secret)])
        case BasicProcessor(username=username):
            pair = f"{username}:{secret}".encode()
            request.set_header_values(
                "Authorization", [f"Basic {base64.b64encode(pair).decode('ascii')}"]
            )
        case QueryProcessor(param=param):
            request.set_path(set_query_param(request.get_path(), param, secret))
        case HmacProcessor(header=header, format=fmt, encoding=encoding, message=message):
            signed = request.get_body() if message is None else message.encode("utf-8")
            value = fmt.replace("{signature}", _signature(secret, signed, encoding))
            request.set_header_values(header, [value])
        case PlaceholderProcessor(header=header, placeholder=placeholder):
            values = request.get_header_values(header)
            if not any(placeholder in value for value in values):
                raise RequestInapplicable(
                    f"request has no {header} header containing the placeholder"
                )
            request.set_header_values(
                header, [value.replace(placeholder, secret) for value in values]
            )
        case AwsSigV4Processor():
            keys = awskeys.parse(secret)
            return awsresign.resign(processor, keys, request, time.time() if now is None else now)
        case OAuth2Processor() | GitHubAppProcessor() | GcpServiceAccountProcessor():
            # What goes in is a token the proxy obtains with the secret: the proxy exchanges
            # it first and injects the token as a header (`proxy.credentials.exchanges`).
            raise ProcessorInvalid(f"a {processor.kind} secret is exchanged by the proxy first")
        case _:
            assert_never(processor)
    return None
