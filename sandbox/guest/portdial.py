"""A connection to a port on the sandbox's own loopback, made inside the sandbox by a shim and
relayed on its descriptors: what the daemon's port routes use where its socket in the
sandbox's network namespace cannot reach that loopback (a microVM's guest has a kernel, and a
loopback, of its own). The shim is the sandbox's uid, like every other op's.

The status says `ok` once connected, or why not; then the bytes go both ways as they are. The
caller's end of its input shuts the connection's sending side (the server may still answer);
the server's end of its output ends the shim, whatever the caller still sends: the connection
is over once the server is done with it.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

from .protocol import report

CONNECT_SECONDS = 10.0
_CHUNK = 1 << 16


def connect(req: dict[str, Any], fds: list[int]) -> None:
    source, sink, status = fds
    port = req.get("port")
    if type(port) is not int or not 0 < port < 65536:
        report(status, {"error": "not a port from 1 to 65535"})
        return
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_SECONDS)
    except OSError as exc:
        said = exc.strerror or "no answer in time"
        report(status, {"error": f"nothing accepts connections on port {port} ({said})"})
        return
    sock.settimeout(None)
    report(status, {"ok": True})
    # Two directions, a thread each: one blocked writing to a server that is not reading must
    # not keep the other from reading what that server writes meanwhile.
    threading.Thread(target=_send, args=(source, sock), daemon=True).start()
    try:
        while data := sock.recv(_CHUNK):
            _write_all(sink, data)
    except OSError:
        pass  # reset by the server, or the caller gone: the connection is over either way


def _send(source: int, sock: socket.socket) -> None:
    try:
        while data := os.read(source, _CHUNK):
            sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the server gone: its end of the output ends the shim


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
