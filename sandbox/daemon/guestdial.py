"""A port of a sandbox whose loopback the daemon's socket in the sandbox's network namespace
does not reach: a microVM's guest has a kernel, and a loopback, of its own. The connection is
made inside the sandbox by its agent's shim (`guest/portdial.py`, as the sandbox's uid) and its
bytes go through the agent's channel: the daemon holds one end of a socket pair, the shim's
input and output are the other, so the port routes relay it as they relay a socket made in
the namespace (`ports.connect`).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import AsyncIterator

from sealgate.reasons import Reason

from ..guest.protocol import Op
from . import replies
from .pipes import open_pipe
from .session import Session, SessionError, stalled


@contextlib.asynccontextmanager
async def dial(session: Session, ident: int, port: int) -> AsyncIterator[socket.socket]:
    """A connection to `port` inside `session`'s sandbox, as request `ident` (one the caller
    counted: `Session.serving`), for as long as the block lasts; then the shim is killed,
    whatever it was waiting for. Raises SessionError (port_unreachable) when nothing accepts
    the connection."""
    kept = contextlib.ExitStack()  # ours, closed here if the request is never sent
    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        kept.callback(ours.close)
        with contextlib.closing(theirs):
            status_r, status_w = os.pipe()
            kept.callback(os.close, status_r)
            try:
                # The shim's input and output are the one socket: the agent (or the
                # microVM's launcher) reads the one and writes the other.
                fds = [os.dup(theirs.fileno()), theirs.detach(), status_w]
            except OSError:
                os.close(status_w)
                raise
        session.send(Op.CONNECT, ident, fds, port=port)  # closes `fds`, sent or not
    except OSError as exc:  # out of descriptors
        kept.close()
        raise SessionError(f"port {port}: {exc.strerror}",
                           reason=Reason.PORT_UNREACHABLE) from None
    except BaseException:
        kept.close()
        raise
    kept.pop_all()
    try:
        async with open_pipe(status_r) as reader:
            try:
                line = await stalled(reader.readline(), "did not answer")
            except ValueError:  # over the line limit: no status of ours
                line = b""
        answer = replies.status(line)
        if answer.get("ok") is not True:
            raise SessionError(f"port {port}: {answer.get('error', 'no answer')}",
                               reason=Reason.PORT_UNREACHABLE)
        ours.setblocking(False)
        yield ours
    finally:
        session.control(Op.KILL, ident)
        ours.close()
