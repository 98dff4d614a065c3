"""The client leg's TLS on the fast path (fastconnect.py): the leaf certificate mitmproxy's
TlsConfig would present for a connection, in a server-side `ssl.SSLContext` made once per leaf
and kept (so a client's TLS session tickets, issued under that context's keys, resume on its
next connection to the same name and never on another's).

The leaf is mitmproxy's own (`TlsConfig.get_cert`: the SNI, else the address the client
connected to, and the CONNECT's host), signed by the proxy's CA. Python's `ssl` loads a
certificate only from a file: the leaf, its chain and its key are written to an anonymous
memory file (memfd) that is read through /proc and closed at once, so no key is ever put on
a disk or left in a directory.

The context is mitmproxy's client leg under its default options (TLS 1.2 at least, its cipher
list, no client certificate); with any of the options in `OPTIONS` set otherwise the fast path
leaves CONNECTs to mitmproxy, which honours them.
"""

from __future__ import annotations

import os
import ssl
from collections import OrderedDict
from typing import Any, Final

from cryptography.hazmat.primitives import serialization
from mitmproxy import certs, ctx
from mitmproxy.addons import tlsconfig
from mitmproxy.net import tls as net_tls
from mitmproxy.proxy import context as mcontext

# mitmproxy's client-leg options, and the values under which the fast path terminates TLS
OPTIONS: Final[dict[str, Any]] = {
    "tls_version_client_min": "TLS1_2", "tls_version_client_max": "UNBOUNDED",
    "ciphers_client": None, "tls_ecdh_curve_client": None, "request_client_cert": False,
    "add_upstream_certs_to_client_chain": False, "certs": [],
}
_KEPT: Final = 256  # leaves' contexts, as many as mitmproxy's context cache holds


def default(options: Any) -> bool:
    """Whether the client-leg options are those the fast path's TLS honours."""
    return all(getattr(options, name, value) == value for name, value in OPTIONS.items())


class Leaves:
    """Server-side contexts, one per leaf, the most recently used `_KEPT` kept."""

    def __init__(self) -> None:
        self._contexts: OrderedDict[tuple[str | None, str | None, str], ssl.SSLContext] = \
            OrderedDict()

    def context(self, conn: mcontext.Context) -> ssl.SSLContext:
        """The context presenting the leaf mitmproxy's TlsConfig makes for `conn` (its client's
        SNI and address, its server's address)."""
        client, server = conn.client, conn.server
        key = (client.sni, str(server.address[0]) if server.address else None,
               str(client.sockname[0]))
        found = self._contexts.get(key)
        if found is not None:
            self._contexts.move_to_end(key)
            return found
        addon = ctx.master.addons.get("tlsconfig")
        if not isinstance(addon, tlsconfig.TlsConfig):
            raise ssl.SSLError("no certificate authority loaded")
        made = _context(addon.get_cert(conn))
        self._contexts[key] = made
        if len(self._contexts) > _KEPT:
            self._contexts.popitem(last=False)
        return made

    def clear(self) -> None:
        """Forget every context (the CA or the options changed)."""
        self._contexts.clear()


def _context(entry: certs.CertStoreEntry) -> ssl.SSLContext:
    made = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    made.minimum_version = ssl.TLSVersion.TLSv1_2
    made.set_ciphers(":".join(vars(tlsconfig)["_default_ciphers"](net_tls.Version.TLS1_2)))
    made.set_alpn_protocols(["http/1.1"])
    # One TLS 1.3 ticket per connection, not OpenSSL's two: a resumed connection gets its own
    # next one, and each ticket is work for the handshake and bytes on the wire.
    made.num_tickets = 1
    pem = b"".join([entry.cert.to_pem(), *(c.to_pem() for c in entry.chain_certs),
                    entry.privatekey.private_bytes(serialization.Encoding.PEM,
                                                   serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption())])
    fd = os.memfd_create("sealgate-leaf", os.MFD_CLOEXEC)
    try:
        os.write(fd, pem)
        made.load_cert_chain(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    return made
