"""The fast path's dialer (proxy/engine/fastdial.py) never dials in plain text what was meant
for TLS: with the fast path turned off while a connection of its was open (its upstream trust
unloaded), a request that still comes on that connection fails instead."""

from __future__ import annotations

import asyncio
import socket
import ssl

import pytest

from sealgate.proxy.engine.fastdial import Dialer
from sealgate.proxy.engine.pool import Key


def test_no_trust_no_dial() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(0.5)
        port = listener.getsockname()[1]
        dialer = Dialer(connect_timeout=2, idle_seconds=2)
        dialer.configure(None)
        key = Key(("127.0.0.1", port), "api.test", True, (), "bot-1")
        with pytest.raises(ssl.SSLError):
            asyncio.run(dialer.line(key))
        with pytest.raises(TimeoutError):
            listener.accept()  # nothing was dialed at all
