"""httpx through the proxy: transports and clients, sync and async, explicit or in base-URL
mode, for httpx or for httpx2 (its successor under another name, which openai 3 and anthropic 2
are built on). Neither is imported until a helper is called.

The two libraries have the same API for everything used here, so one implementation serves
both: `library` picks the module. Statically the httpx flavour is typed; an httpx2 object is
typed Any (httpx2 need not be installed to check this package).
"""

from __future__ import annotations

import functools
import importlib
import os
import ssl
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Literal, overload

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
    import httpx

Library = Literal["httpx", "httpx2"]
_LIBRARIES: tuple[str, ...] = ("httpx", "httpx2")
# Options of httpx.Client that belong to its transport: given to a client built on ours they
# would be silently ignored, so httpx_client hands them to the transport instead.
_TRANSPORT_OPTIONS = ("http1", "http2", "limits", "retries", "local_address", "socket_options",
                      "cert")
# Options that would undo the routing.
_REFUSED_OPTIONS = ("transport", "mounts", "proxy", "proxies", "verify", "trust_env", "app",
                    "uds")


@overload
def httpx_transport(
    proxy: str | None = None,
    *,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
    ca_bundle: str | os.PathLike[str] | None = None,
    base_url: bool = False,
    library: Literal["httpx"] = "httpx",
    **options: Any,
) -> httpx.BaseTransport: ...


@overload
def httpx_transport(
    proxy: str | None = None,
    *,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
    ca_bundle: str | os.PathLike[str] | None = None,
    base_url: bool = False,
    library: Literal["httpx2"],
    **options: Any,
) -> Any: ...


def httpx_transport(
    proxy: str | None = None,
    *,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
    ca_bundle: str | os.PathLike[str] | None = None,
    base_url: bool = False,
    library: Library = "httpx",
    **options: Any,
) -> Any:
    """An httpx transport through the proxy, for `httpx.Client(transport=...)` or an SDK's
    own client. Modes and arguments as `requests_session`; `options` go to
    `httpx.HTTPTransport` (http2, limits, retries, ...). `library="httpx2"` makes one for
    httpx2 (openai 3, anthropic 2)."""
    _refuse(options)
    address, creds = resolve(proxy, sandbox, key, tokens)
    return _make(_module(library), address, creds, bundle=ca_bundle, base_url=base_url,
                 options=options, sync=True)


@overload
def httpx_async_transport(
    proxy: str | None = None,
    *,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
    ca_bundle: str | os.PathLike[str] | None = None,
    base_url: bool = False,
    library: Literal["httpx"] = "httpx",
    **options: Any,
) -> httpx.AsyncBaseTransport: ...


@overload
def httpx_async_transport(
    proxy: str | None = None,
    *,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
    ca_bundle: str | os.PathLike[str] | None = None,
    base_url: bool = False,
    library: Literal["httpx2"],
    **options: Any,
) -> Any: ...


def httpx_async_transport(
    proxy: str | None = None,
    *,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
    ca_bundle: str | os.PathLike[str] | None = None,
    base_url: bool = False,
    library: Library = "httpx",
    **options: Any,
) -> Any:
    """`httpx_transport` for `httpx.AsyncClient`."""
    _refuse(options)
    address, creds = resolve(proxy, sandbox, key, tokens)
    return _make(_module(library), address, creds, bundle=ca_bundle, base_url=base_url,
                 options=options, sync=False)


@overload
def httpx_client(
    proxy: str | None = None,
    *,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
    ca_bundle: str | os.PathLike[str] | None = None,
    base_url: bool = False,
    library: Literal["httpx"] = "httpx",
    **options: Any,
) -> httpx.Client: ...


@overload
def httpx_client(
    proxy: str | None = None,
    *,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
    ca_bundle: str | os.PathLike[str] | None = None,
    base_url: bool = False,
    library: Literal["httpx2"],
    **options: Any,
) -> Any: ...


def httpx_client(
    proxy: str | None = None,
    *,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
    ca_bundle: str | os.PathLike[str] | None = None,
    base_url: bool = False,
    library: Library = "httpx",
    **options: Any,
) -> Any:
    """An `httpx.Client` on `httpx_transport`, or an httpx2.Client with `library="httpx2"`
    (for `openai.OpenAI(http_client=...)` and the like). `options` go to the client (timeout,
    headers, follow_redirects, ...) or, for transport options (http2, limits, retries, ...), to
    the transport. httpx's own `base_url` is not an option here (the name is this mode's): set
    `client.base_url` afterwards."""
    _refuse(options)
    lib = _module(library)
    transport_options, client_options = _split(options)
    address, creds = resolve(proxy, sandbox, key, tokens)
    transport = _make(lib, address, creds, bundle=ca_bundle, base_url=base_url,
                      options=transport_options, sync=True)
    return lib.Client(transport=transport, trust_env=False, **client_options)


@overload
def httpx_async_client(
    proxy: str | None = None,
    *,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
    ca_bundle: str | os.PathLike[str] | None = None,
    base_url: bool = False,
    library: Literal["httpx"] = "httpx",
    **options: Any,
) -> httpx.AsyncClient: ...


@overload
def httpx_async_client(
    proxy: str | None = None,
    *,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
    ca_bundle: str | os.PathLike[str] | None = None,
    base_url: bool = False,
    library: Literal["httpx2"],
    **options: Any,
) -> Any: ...


def httpx_async_client(
    proxy: str | None = None,
    *,
    sandbox: str | None = None,
    key: str | None = None,
    tokens: str | Iterable[str] = (),
    ca_bundle: str | os.PathLike[str] | None = None,
    base_url: bool = False,
    library: Library = "httpx",
    **options: Any,
) -> Any:
    """`httpx_client` for asyncio: an `httpx.AsyncClient` (or httpx2's)."""
    _refuse(options)
    lib = _module(library)
    transport_options, client_options = _split(options)
    address, creds = resolve(proxy, sandbox, key, tokens)
    transport = _make(lib, address, creds, bundle=ca_bundle, base_url=base_url,
                      options=transport_options, sync=False)
    return lib.AsyncClient(transport=transport, trust_env=False, **client_options)


def _module(library: str) -> Any:
    if library not in _LIBRARIES:
        raise ValueError(f"library is 'httpx' or 'httpx2', not {library[:40]!r}")
    return importlib.import_module(library)


def _refuse(options: dict[str, Any]) -> None:
    refused = sorted(set(options) & set(_REFUSED_OPTIONS))
    if refused:
        raise TypeError(f"{', '.join(refused)}: set by the sealgate helper, not an option here")


def _split(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    transport = {k: v for k, v in options.items() if k in _TRANSPORT_OPTIONS}
    client = {k: v for k, v in options.items() if k not in _TRANSPORT_OPTIONS}
    return transport, client


def _ssl_context(given: str | os.PathLike[str] | None) -> ssl.SSLContext | bool:
    bundle = ca_bundle(given)
    if bundle is None:
        return True  # the library's default roots
    if os.path.isdir(bundle):
        return ssl.create_default_context(capath=bundle)
    return ssl.create_default_context(cafile=bundle)


def _make(
    lib: Any,
    address: ProxyAddress,
    creds: Credentials,
    *,
    bundle: str | os.PathLike[str] | None,
    base_url: bool,
    options: dict[str, Any],
    sync: bool,
) -> Any:
    inner_class = lib.HTTPTransport if sync else lib.AsyncHTTPTransport
    if base_url:
        # Plain HTTP to the proxy's listener: no TLS on this side, so no CA and no proxy.
        inner = inner_class(trust_env=False, **options)
        return _classes(lib.__name__)[0 if sync else 1](inner, address, base_url_headers(creds))
    authorization = creds.proxy_authorization
    headers = {"Proxy-Authorization": authorization} if authorization is not None else {}
    # The credentials go as a header, not in the URL: httpx would drop an empty user.
    proxy = lib.Proxy(address.origin, headers=headers)
    return inner_class(proxy=proxy, verify=_ssl_context(bundle), trust_env=False, **options)


@functools.cache
def _classes(library: str) -> tuple[
    Callable[[httpx.BaseTransport, ProxyAddress, dict[str, str]], httpx.BaseTransport],
    Callable[[httpx.AsyncBaseTransport, ProxyAddress, dict[str, str]], httpx.AsyncBaseTransport],
]:
    """The base-URL transports (sync, async) of `library`. They subclass its transports, so
    they are made on first use: importing this module must not import httpx. Typed as httpx's;
    httpx2's are the same classes under another name."""
    lib: Any = importlib.import_module(library)

    def routed(request: httpx.Request, address: ProxyAddress, headers: dict[str, str],
               ) -> tuple[httpx.Request, bool]:
        url = str(request.url)
        if at_proxy(address, url):
            target, rewritten = url, False
        else:
            if request.url.scheme != "https":
                raise lib.UnsupportedProtocol(
                    f"base-URL mode forwards https:// URLs only, not {request.url.scheme!r}: "
                    "the proxy speaks verified TLS to the upstream", request=request)
            try:
                target, rewritten = route(address, url), True
            except ClientConfigError as exc:
                raise lib.UnsupportedProtocol(str(exc), request=request) from exc
        fields = request.headers.copy()
        fields["Host"] = address.authority
        fields.update(headers)
        sent: httpx.Request = lib.Request(request.method, target, headers=fields,
                                          stream=request.stream, extensions=request.extensions)
        return sent, rewritten

    def restored(response: httpx.Response, address: ProxyAddress) -> httpx.Response:
        location = response.headers.get("Location")
        back = unroute(address, location) if location else None
        if back is not None:
            response.headers["Location"] = back
        return response

    class BaseUrl(lib.BaseTransport):  # type: ignore[misc]  # Any: httpx or httpx2
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

    class AsyncBaseUrl(lib.AsyncBaseTransport):  # type: ignore[misc]
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
