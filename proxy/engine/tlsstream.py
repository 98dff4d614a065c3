"""TLS started on an open asyncio stream, as `StreamWriter.start_tls` starts it, with the two
things the fast path needs and it cannot give:

- bytes already read go to the handshake first (`early`): the client's first flight, which
  fastconnect.py read to look at (its SNI, its ALPN offer) before choosing to terminate it.
  `start_tls` hands the handshake only what arrives after it began, so the ClientHello was lost;
- a session to resume (`session`) on a connection the fast path dials (fastdial.py): asyncio's
  TLS takes none, and a new upstream connection then paid a full handshake every time.

It is asyncio's own `loop.start_tls`, with the bytes put into the TLS object's input and the
session set on it before its handshake starts, while the socket's reading is paused: nothing can
come in between. Relies on asyncio's `SSLProtocol` keeping its TLS object and its input as
`_sslobj` and `_incoming` (checked by mitmcheck.py, as mitmproxy's internals are).
"""

from __future__ import annotations

import asyncio
import ssl
from asyncio import sslproto
from typing import Any


async def start(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                context: ssl.SSLContext, *, server_side: bool, seconds: float,
                server_hostname: str | None = None, session: ssl.SSLSession | None = None,
                early: bytes = b"") -> ssl.SSLObject:
    """TLS on `writer`'s connection; `reader` and `writer` then carry its plaintext. Raises
    OSError (ssl.SSLError among them) or TimeoutError when the handshake fails."""
    loop = asyncio.get_running_loop()
    transport: Any = writer.transport
    protocol = transport.get_protocol()
    transport.pause_reading()
    buffered = vars(reader)["_buffer"]  # read by the stream, not yet by its user: early too
    early += bytes(buffered)
    buffered.clear()
    waiter = loop.create_future()
    tls = sslproto.SSLProtocol(loop, protocol, context, waiter, server_side=server_side,
                               server_hostname=server_hostname, call_connection_made=False,
                               ssl_handshake_timeout=max(1, round(seconds)))
    state = vars(tls)
    if session is not None:
        state["_sslobj"].session = session
    if early:
        state["_incoming"].write(early)
    transport.set_protocol(tls)
    made = loop.call_soon(tls.connection_made, transport)
    resumed = loop.call_soon(transport.resume_reading)
    try:
        await waiter
    except BaseException:
        transport.close()
        made.cancel()
        resumed.cancel()
        raise
    vars(writer)["_transport"] = state["_app_transport"]
    protocol._replace_writer(writer)  # as StreamWriter.start_tls does
    ssl_object: ssl.SSLObject = state["_sslobj"]
    return ssl_object


def changed() -> list[str]:
    """What this module relies on in asyncio that is not there (mitmcheck.py)."""
    names = set(sslproto.SSLProtocol.__init__.__code__.co_names)
    missing = [f"SSLProtocol.{name}" for name in ("_sslobj", "_incoming", "_app_transport")
               if name not in names]
    if "_replace_writer" not in vars(asyncio.StreamReaderProtocol):
        missing.append("StreamReaderProtocol._replace_writer")
    return missing
