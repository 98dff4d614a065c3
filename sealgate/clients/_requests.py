"""requests through the proxy: a Session, explicit or in base-URL mode. requests is imported
when a session is made, never at import."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ._routing import (
    ClientConfigError,
    Credentials,
    ProxyAddress,
    at_proxy,
    base_url_headers,
    ca_bundle,
    resolve,
    route,
    unroute,
)

if TYPE_CHECKING:
    import requests
    from requests.adapters import HTTPAdapter


def requests_session(
    proxy: str | None = None,
    *,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
    ca_bundle: str | os.PathLike[str] | None = None,
    base_url: bool = False,
) -> requests.Session:
    """A `requests.Session` whose every request goes through the proxy.

    Explicit (default): the proxy is the session's proxy for http and https, the sandbox's key
    and `tokens` ride in its credentials (connection-scoped: each token applies to the requests
    its scope covers), and TLS is verified against `ca_bundle` (default: REQUESTS_CA_BUNDLE,
    SSL_CERT_FILE, CURL_CA_BUNDLE, as `sealgate env` sets them). `base_url=True`: each
    `https://host/path` is sent as plain HTTP to `http://<proxy>/_/host/path`, with the key as
    `Proxy-Authorization` and the tokens in `Proxy-Tokenizer`; no CA is needed.

    The environment's proxy and CA variables are not read per request (`trust_env` is off, so
    they cannot override these settings); `proxy=None` reads HTTPS_PROXY once, here."""
    import requests

    address, creds = resolve(proxy, sandbox, key, tokens)
    explicit, base = _adapters()
    session = requests.Session()
    session.trust_env = False
    adapter: HTTPAdapter
    if base_url:
        adapter = base(address, creds)
        session.proxies = {}
    else:
        adapter = explicit(creds.proxy_authorization)
        session.proxies = {"http": address.origin, "https": address.origin}
        bundle = ca_bundle_of(ca_bundle)
        if bundle is not None:
            session.verify = bundle
    session.mount("https://", adapter)
    session.mount("http://", adapter)
    return session


ca_bundle_of = ca_bundle  # the parameter shadows the function's name inside requests_session


@functools.cache
def _adapters() -> tuple[
    Callable[[str | None], HTTPAdapter], Callable[[ProxyAddress, Credentials], HTTPAdapter]
]:
    """The two adapter classes. They subclass requests' HTTPAdapter, so they are made on first
    use: importing this module must not import requests."""
    from requests.adapters import HTTPAdapter
    from requests.cookies import RequestsCookieJar, extract_cookies_to_jar
    from requests.exceptions import InvalidURL
    from requests.models import PreparedRequest, Response

    class Explicit(HTTPAdapter):
        """The proxy's credentials on every CONNECT and every plain-http request, including
        an empty user (`:<token>,...`), which requests itself would not send."""

        def __init__(self, authorization: str | None) -> None:
            self._authorization = authorization
            super().__init__()

        def proxy_headers(self, proxy: str) -> dict[str, str]:
            if self._authorization is None:
                return {}
            return {"Proxy-Authorization": self._authorization}

    class BaseUrl(HTTPAdapter):
        """Rewrites each https URL into base-URL form, sends it to the proxy as plain HTTP and
        hands back a response that reads as the https one (its url, its cookies, a Location
        the proxy pointed back through itself): requests' redirect and cookie handling see
        only the https world. A URL already addressed to the proxy is sent as it is."""

        def __init__(self, address: ProxyAddress, creds: Credentials) -> None:
            self._address = address
            self._headers = base_url_headers(creds)
            super().__init__()

        def send(self, request: PreparedRequest, *args: Any, **kwargs: Any) -> Response:
            url = request.url if isinstance(request.url, str) else ""
            routed = request.copy()
            rewritten = not at_proxy(self._address, url)
            if rewritten:
                try:
                    routed.url = route(self._address, url)
                except ClientConfigError as exc:
                    raise InvalidURL(str(exc), request=request) from exc
            routed.headers.update(self._headers)
            kwargs["proxies"] = {}  # straight to the proxy's listener, never another proxy
            response = super().send(routed, *args[:4], **kwargs)
            response.request = request
            if rewritten:
                response.url = url
                location = response.headers.get("Location")
                back = unroute(self._address, location) if location else None
                if back is not None:
                    response.headers["Location"] = back
                response.cookies = RequestsCookieJar()
                # (the stubs leave it untyped; requests itself types it)
                extract_cookies_to_jar(  # type: ignore[no-untyped-call, unused-ignore]
                    response.cookies, request, response.raw)
            return response

    return Explicit, BaseUrl
