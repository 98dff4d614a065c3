"""httpx through the proxy: transports and clients, sync and async, explicit or in base-URL
mode. httpx is imported when one is made, never at import."""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from sealgate.clients._routing import (
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
    import httpx

# Options of httpx.Client that belong to its transport: given to a client built on ours they
# would be silently ignored, so httpx_client hands them to the transport instead.
_TRANSPORT_OPTIONS = ("http1", "http2", "limits", "retries", "local_address", "socket_options",
                      "cert")
# Options that would undo the routing.
_REFUSED_OPTIONS = ("transport", "mounts", "proxy", "proxies", "verify", "trust_env", "app")


def httpx_transport(
    proxy: str | None = None,
    *,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
    ca_bundle: str | os.PathLike[str] | None = None,
    base_url: bool = False,
    **options: Any,
) -> httpx.BaseTransport:
    """An httpx transport through the proxy, for `httpx.Client(transport=...)` or an SDK's
    own client. Modes and arguments as `requests_session`; `options` go to
    `httpx.HTTPTransport` (http2, limits, retries, ...)."""
    address, creds = resolve(proxy, sandbox, key, tokens)
    return _make_sync(address, creds, ca_bundle, base_url, options)


def httpx_async_transport(
    proxy: str | None = None,
    *,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
    ca_bundle: str | os.PathLike[str] | None = None,
    base_url: bool = False,
    **options: Any,
) -> httpx.AsyncBaseTransport:
    """`httpx_transport` for `httpx.AsyncClient`."""
    address, creds = resolve(proxy, sandbox, key, tokens)
    return _make_async(address, creds, ca_bundle, base_url, options)


def httpx_client(
    proxy: str | None = None,
    *,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
    ca_bundle: str | os.PathLike[str] | None = None,
    base_url: bool = False,
    **options: Any,
) -> httpx.Client:
    """An `httpx.Client` on `httpx_transport`. `options` go to the client (timeout, headers,
    follow_redirects, ...) or, for transport options (http2, limits, retries, ...), to the
    transport. httpx's own `base_url` is not an option here (the name is this mode's): set
    `client.base_url` afterwards."""
    import httpx

    transport_options, client_options = _split(options)
    address, creds = resolve(proxy, sandbox, key, tokens)
    transport = _make_sync(address, creds, ca_bundle, base_url, transport_options)
    return httpx.Client(transport=transport, trust_env=False, **client_options)


def httpx_async_client(
    proxy: str | None = None,
    *,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
    ca_bundle: str | os.PathLike[str] | None = None,
    base_url: bool = False,
    **options: Any,
) -> httpx.AsyncClient:
    """`httpx_client` for asyncio: an `httpx.AsyncClient`."""
    import httpx

    transport_options, client_options = _split(options)
    address, creds = resolve(proxy, sandbox, key, tokens)
    transport = _make_async(address, creds, ca_bundle, base_url, transport_options)
    return httpx.AsyncClient(transport=transport, trust_env=False, **client_options)


def _split(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    refused = sorted(set(options) & set(_REFUSED_OPTIONS))
    if refused:
        raise TypeError(f"{', '.join(refused)}: set by the sealgate helper, not an option here")
    if "base_url" in options:  # pragma: no cover - a keyword-only parameter catches it first
        raise TypeError("base_url")
    transport = {k: v for k, v in options.items() if k in _TRANSPORT_OPTIONS}
    client = {k: v for k, v in options.items() if k not in _TRANSPORT_OPTIONS}
    return transport, client


def _ssl_context(given: str | os.PathLike[str] | None) -> ssl.SSLContext | bool:
    bundle = ca_bundle(given)
    if bundle is None:
        return True  # httpx's default roots
    if os.path.isdir(bundle):
        return ssl.create_default_context(capath=bundle)
    return ssl.create_default_context(cafile=bundle)


def _proxy(address: ProxyAddress, creds: Credentials) -> httpx.Proxy:
    import httpx

    authorization = creds.proxy_authorization
    headers = {"Proxy-Authorization": authorization} if authorization is not None else {}
    # The credentials go as a header, not in the URL: httpx would drop an empty user.
    return httpx.Proxy(address.origin, headers=headers)


def _check(options: dict[str, Any]) -> None:
    refused = sorted(set(options) & {"proxy", "verify", "trust_env", "uds"})
    if refused:
        raise TypeError(f"{', '.join(refused)}: set by the sealgate helper, not an option here")


def _make_sync(
    address: ProxyAddress, creds: Credentials, bundle: str | os.PathLike[str] | None,
    base_url: bool, options: dict[str, Any],
) -> httpx.BaseTransport:
    import httpx

    _check(options)
    if base_url:
        # Plain HTTP to the proxy's listener: no TLS on this side, so no CA and no proxy.
        inner = httpx.HTTPTransport(trust_env=False, **options)
        return _classes()[0](inner, address, base_url_headers(creds))
    return httpx.HTTPTransport(proxy=_proxy(address, creds), verify=_ssl_context(bundle),
                               trust_env=False, **options)


def _make_async(
    address: ProxyAddress, creds: Credentials, bundle: str | os.PathLike[str] | None,
    base_url: bool, options: dict[str, Any],
) -> httpx.AsyncBaseTransport:
    import httpx

    _check(options)
    if base_url:
        inner = httpx.AsyncHTTPTransport(trust_env=False, **options)
        return _classes()[1](inner, address, base_url_headers(creds))
    return httpx.AsyncHTTPTransport(proxy=_proxy(address, creds), verify=_ssl_context(bundle),
                                    trust_env=False, **options)


@functools.cache
def _classes() -> tuple[
    Callable[[httpx.BaseTransport, ProxyAddress, dict[str, str]], httpx.BaseTransport],
    Callable[[httpx.AsyncBaseTransport, ProxyAddress, dict[str, str]], httpx.AsyncBaseTransport],
]:
    """The base-URL transports (sync, async). They subclass httpx's, so they are made on first
    use: importing this module must not import httpx."""
    import httpx

    def routed(request: httpx.Request, address: ProxyAddress, headers: dict[str, str],
               ) -> tuple[httpx.Request, bool]:
        url = str(request.url)
        if at_proxy(address, url):
            target, rewritten = url, False
        else:
            if request.url.scheme != "https":
                raise httpx.UnsupportedProtocol(
                    f"base-URL mode forwards https:// URLs only, not {request.url.scheme!r}: "
                    "the proxy speaks verified TLS to the upstream", request=request)
            try:
                target, rewritten = route(address, url), True
            except ClientConfigError as exc:
                raise httpx.UnsupportedProtocol(str(exc), request=request) from exc
        fields = request.headers.copy()
        fields["Host"] = address.authority
        fields.update(headers)
        return httpx.Request(request.method, target, headers=fields, stream=request.stream,
                             extensions=request.extensions), rewritten

    def restored(response: httpx.Response, address: ProxyAddress) -> httpx.Response:
        location = response.headers.get("Location")
        back = unroute(address, location) if location else None
        if back is not None:
            response.headers["Location"] = back
        return response

    class BaseUrl(httpx.BaseTransport):
        """https URLs rewritten into base-URL form and sent to the proxy as plain HTTP; httpx
        sets `response.request` back to the caller's request, and a Location the proxy
        pointed back through itself is given back as https, so redirects stay in the https
        world."""

        def __init__(self, inner: httpx.BaseTransport, address: ProxyAddress,
                     headers: dict[str, str]) -> None:
            self._inner, self._address, self._headers = inner, address, headers

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            sent, rewritten = routed(request, self._address, self._headers)
            response = self._inner.handle_request(sent)
            return restored(response, self._address) if rewritten else response

        def close(self) -> None:
            self._inner.close()

    class AsyncBaseUrl(httpx.AsyncBaseTransport):
        """`BaseUrl` for asyncio."""

        def __init__(self, inner: httpx.AsyncBaseTransport, address: ProxyAddress,
                     headers: dict[str, str]) -> None:
            self._inner, self._address, self._headers = inner, address, headers

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            sent, rewritten = routed(request, self._address, self._headers)
            response = await self._inner.handle_async_request(sent)
            return restored(response, self._address) if rewritten else response

        async def aclose(self) -> None:
            await self._inner.aclose()

    return BaseUrl, AsyncBaseUrl
