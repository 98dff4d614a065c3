"""What a client needs in its environment to go through the proxy and trust its CA: one list,
used by `sealgate env` and by the sandbox runtime, so the two never drift apart.

Every runtime reads its own variables: the proxy from `HTTPS_PROXY` or `https_proxy` (curl
reads only the lower-case `http_proxy`; grpc only lower case), the CA from one of a dozen
names. All of them point at one bundle of the system's roots plus the proxy's CA, because
`SSL_CERT_FILE` and its kin *replace* the roots rather than add to them.

Base-URL mode needs no CA and no proxy support: `SEALGATE_BASE_URL` is the prefix an SDK's base
URL is written after (`$SEALGATE_BASE_URL` + `api.stripe.com`), and the proxy's own address is in
`NO_PROXY`, so that a client which also reads `HTTP_PROXY` sends those requests to the proxy as
to a server, not through it as a proxy.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from .hostport import format_hostport

PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")
NO_PROXY = "localhost,127.0.0.1"
TRUST_VARIABLES = (
    "SSL_CERT_FILE",  # OpenSSL and everything on it (Python's ssl, Ruby, git's curl, ...)
    "REQUESTS_CA_BUNDLE",  # requests (ignores SSL_CERT_FILE)
    "CURL_CA_BUNDLE",
    "AWS_CA_BUNDLE",  # botocore
    "NODE_EXTRA_CA_CERTS",  # Node: added to its own roots
    "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",  # grpc's C core
    "PIP_CERT",
    "GIT_SSL_CAINFO",
    "CARGO_HTTP_CAINFO",
    "DENO_CERT",
    # npm: NODE_EXTRA_CA_CERTS is dropped once npm has a `cafile` or `ca` of its own (Debian's
    # images often configure one), since npm then hands Node that list in place of its roots.
    # Its config from the environment overrides every npmrc's; npm reads npm_config_* in any
    # case and exports this lower-case form to scripts itself.
    "npm_config_cafile",
)


def variables(proxy_url: str, bundle: str, mcp_url: str | None = None) -> dict[str, str]:
    """The environment for a client: the proxy at `proxy_url`, `bundle` trusted, and the MCP
    endpoint of its tools (`sealgate mcp serve`) at `mcp_url`, reached directly, not through
    the proxy (it is no origin on the internet, and it knows the caller by its address)."""
    env = dict.fromkeys(PROXY_VARIABLES, proxy_url)
    parts = urlsplit(proxy_url)
    host = parts.hostname or ""
    direct = [*NO_PROXY.split(","), host, *([urlsplit(mcp_url).hostname or ""] if mcp_url else [])]
    env["NO_PROXY"] = env["no_proxy"] = ",".join(dict.fromkeys(h for h in direct if h))
    env["SEALGATE_BASE_URL"] = f"http://{format_hostport(host, parts.port or 80)}/_/"
    env["NODE_USE_ENV_PROXY"] = "1"  # Node 24+: fetch and http honour the proxy variables
    env.update(dict.fromkeys(TRUST_VARIABLES, bundle))
    if mcp_url:
        env["SEALGATE_MCP_URL"] = mcp_url
    return env


def render(env: Mapping[str, str], form: str) -> str:
    """`sh` (export lines, single-quoted), `dotenv` or `json`."""
    if form == "json":
        import json

        return json.dumps(dict(env), indent=2) + "\n"
    if form == "dotenv":
        return "".join(f"{k}={v}\n" for k, v in env.items())
    quoted = {k: "'" + v.replace("'", "'\\''") + "'" for k, v in env.items()}
    return "".join(f"export {k}={v}\n" for k, v in quoted.items())
