"""Client helpers: one line to send a program's HTTP through the proxy, with its sandbox key and
sealed tokens (docs/clients.md).

    from sealgate.clients import requests_session, httpx_client, base_url

    session = requests_session("http://10.0.0.5:8080", sandbox="bot-1", key=KEY,
                               tokens=[STRIPE_TOKEN], ca_bundle="bundle.pem")
    client = httpx_client("http://10.0.0.5:8080", base_url=True, tokens=[OPENAI_TOKEN])
    stripe.api_base = base_url("http://10.0.0.5:8080", "https://api.stripe.com")

Two ways through the proxy:
- explicit: the proxy is the client's HTTP proxy (CONNECT for https); the key and the tokens
  ride in the proxy credentials and apply to each request whose host a token's scope covers;
  the client trusts the proxy's CA;
- base URL (`base_url=True`): `https://<host>/<path>` is sent as plain HTTP to
  `http://<proxy>/_/<host>/<path>`, the key as `Proxy-Authorization`, the tokens in
  `Proxy-Tokenizer`; no CA, no proxy support needed (Node's fetch, SDKs that pin their CAs).

Neither requests nor httpx is imported here: each is imported when its helper is called.
`sealgate/clients/sealgate.mjs` is the same for JavaScript (`baseUrl`, `sealgateFetch`).
"""

from __future__ import annotations

from ._httpx import (
    httpx_async_client,
    httpx_async_transport,
    httpx_client,
    httpx_transport,
)
from ._refusal import ERROR_HEADER, Refusal, refusal
from ._requests import requests_session
from ._routing import (
    MAX_TOKENS,
    TOKENIZER_HEADER,
    ClientConfigError,
    base_url,
    check_tokens,
    proxy_authorization,
    proxy_url,
    tokenizer_header,
)

__all__ = [
    "ERROR_HEADER",
    "MAX_TOKENS",
    "TOKENIZER_HEADER",
    "ClientConfigError",
    "Refusal",
    "base_url",
    "check_tokens",
    "httpx_async_client",
    "httpx_async_transport",
    "httpx_client",
    "httpx_transport",
    "proxy_authorization",
    "proxy_url",
    "refusal",
    "requests_session",
    "tokenizer_header",
]
