"""Replacements for per-request conveniences mitmproxy has for its own developers.

The lean master (mitm.py installs them) leaves out what profiling found among the largest
costs of a request; docs/performance.md, "Why the lean master", has the measurements. Nothing
here imports mitmproxy: these are the plain functions put in its place.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from typing import Any

_IDS_PER_FILL = 256
_ATOMIC = (bool, int, float, str, bytes, type(None))  # a deep copy of one is the same object
_X509 = "_sealgate_x509"  # in a certificate's instance dict: its pyOpenSSL copy
KEYS_KEPT = 64  # private keys whose pyOpenSSL copies are kept (the leaves share the CA's)


class RandomIds:
    """`uuid.uuid4()` as text, without a system call and a UUID object per id.

    The ids stay random (122 random bits from `os.urandom`, the same format): a denial shows the
    sandbox its request id, and a counter would tell it how much traffic other sandboxes send.
    """

    def __init__(self) -> None:
        self._hex = ""
        self._at = 0

    def uuid4(self) -> str:
        if self._at >= len(self._hex):
            self._hex, self._at = os.urandom(16 * _IDS_PER_FILL).hex(), 0
        h, self._at = self._hex[self._at : self._at + 32], self._at + 32
        # Version 4, RFC 4122 variant: the two fixed nibbles of uuid.uuid4().
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


def name_task(task: asyncio.Task[Any], *, name: str, client: tuple[Any, ...] | None = None) -> None:
    """mitmproxy's task tagging without the `os.environ` read it does for every hook task."""
    task.set_name(name)


def converted_once(to_pyopenssl: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """mitmproxy's `Cert.to_pyopenssl`, converted once per certificate object.

    mitmproxy converts the leaf it serves for every client handshake (DER written, then parsed
    again): with the key's conversion, about 5 % of a worker's CPU under new intercepted
    connections (py-spy). Its certificate store keeps one Cert per leaf, and the copy is only
    handed to OpenSSL, which takes a reference and never changes it."""

    @functools.wraps(to_pyopenssl)
    def to_pyopenssl_once(self: Any) -> Any:
        found = vars(self).get(_X509)
        if found is None:
            found = vars(self)[_X509] = to_pyopenssl(self)
        return found

    return to_pyopenssl_once


def keys_once(pkey: type[Any]) -> type[Any]:
    """pyOpenSSL's `PKey` whose `from_cryptography_key` converts once per key object (held, at
    most KEYS_KEPT of them: every leaf is served with the CA's one key)."""
    once = functools.lru_cache(maxsize=KEYS_KEPT)(pkey.from_cryptography_key)
    return type(pkey.__name__, (pkey,), {"from_cryptography_key": staticmethod(once)})


def header_lookups(to_bytes: Callable[[Any], Any]) -> dict[str, Callable[..., Any]]:
    """mitmproxy's `Headers.get_all`, `get` and `in`, each one pass over the fields.

    `headers.get(name)` and `name in headers` went through Mapping's try/except around
    `__getitem__`, then `_MultiDict.get_all`, which calls the `_kconv` static method once per
    field: about 6 µs for a miss among eight fields, two to three times one loop's cost; and
    mitmproxy's HTTP/1 code looks up each message's framing headers several times (py-spy,
    keep-alive intercepted requests: 7 % of a worker). The results and errors are the same:
    names compared lower-cased as bytes (`to_bytes` is mitmproxy's own conversion, which raises
    TypeError for what is neither str nor bytes), values decoded as mitmproxy decodes them,
    several joined by ", " (`_reduce_values`)."""

    def get_all(self: Any, name: str | bytes) -> list[str]:
        key = to_bytes(name).lower()
        return [v.decode("utf-8", "surrogateescape") for k, v in self.fields if k.lower() == key]

    def get(self: Any, name: str | bytes, default: Any = None) -> Any:
        values = get_all(self, name)
        return ", ".join(values) if values else default

    def contains(self: Any, name: str | bytes) -> bool:
        key = to_bytes(name).lower()
        for k, _ in self.fields:  # noqa: SIM110 (a generator for any() costs more than this)
            if k.lower() == key:
                return True
        return False

    return {"get_all": get_all, "get": get, "__contains__": contains}


def option_reads(current: Callable[[Any], Any], unset: object) -> Callable[[Any], Any]:
    """mitmproxy's `_Option.current` (every `ctx.options.<name>`), without deep copies of a value
    that holds nothing.

    A read deep-copies the option's value, twice when it was never set (the default's copy,
    then the copy's): each layer mitmproxy makes reads one (`proxy_debug`), each HTTP stream a
    few; about 2 % of a worker under new connections (py-spy). A deep copy of a bool, a number,
    a string or None is that very object, so those are returned as they are; a list or a dict is
    still copied, since a caller may change what it gets. `unset` is mitmproxy's marker of an
    option never set."""

    @functools.wraps(current)
    def current_value(self: Any) -> Any:
        value = self._default if self.value is unset else self.value
        return value if type(value) in _ATOMIC else current(self)

    return current_value


def forks_keeping_the_server(context: type[Any]) -> Callable[[Any], Any]:
    """mitmproxy's `Context.fork`, without the Server its `Context(...)` makes for the fork to
    replace at once.

    A fork is made for every HTTP stream (each request) and for each connection's HTTP/1 or
    HTTP/2 layers; each made a whole `Server` (an id, timestamps, some twenty fields, each set
    through Server's own `__setattr__`) and dropped it: about 2 % of a worker under new
    connections (py-spy). The fork is the same: the same client, options and server, a copy of
    the layer list; `context` is mitmproxy's class (a fork is always one, as before)."""

    def fork(self: Any) -> Any:
        forked = object.__new__(context)
        forked.client, forked.options = self.client, self.options
        forked.server, forked.layers = self.server, self.layers.copy()
        return forked

    return fork
