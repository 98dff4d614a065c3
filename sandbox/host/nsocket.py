"""A TCP socket of the daemon's made inside a sandbox's network namespace: how the harness
reaches a port the sandbox serves (`sandbox.daemon.ports`) without opening anything to anyone
else. The socket connects to the sandbox's own loopback, so no address, route or firewall rule
of the host's changes: nothing on the host, in another sandbox or on the network can reach that
port, and inbound opens no outbound path.

A thread enters the namespace (`setns` moves only the calling thread), makes the socket and
leaves; it is a thread of its own, never one of a pool, so a thread that could not come back
(which `setns` back to our own namespace should never fail to do) dies with its one socket and
serves nothing else.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
from pathlib import Path

from ..errors import SandboxError

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class NamespaceError(SandboxError):
    """The sandbox's network namespace could not be entered."""


def socket_in(netns: Path) -> socket.socket:
    """A new TCP/IPv4 socket in the network namespace at `netns` (/run/netns/NAME), non-
    blocking. Raises NamespaceError."""
    made: list[socket.socket] = []
    failed: list[str] = []

    def enter() -> None:
        # Whatever fails here is said as NamespaceError by the caller: an exception escaping
        # the thread would be a traceback on stderr (the daemon's log) and say nothing back.
        try:
            _made_in(netns, made, failed)
        except OSError as exc:  # out of descriptors (EMFILE, ENFILE), out of memory
            failed.append(f"{type(exc).__name__}: {exc.strerror or exc}")

    thread = threading.Thread(target=enter, name="sealgate-netns", daemon=True)
    try:
        thread.start()
    except RuntimeError as exc:  # no thread to be had (the daemon's own pids limit)
        raise NamespaceError(f"cannot reach into the sandbox's network: {exc}") from None
    thread.join()
    if failed or not made:
        for sock in made:
            sock.close()
        raise NamespaceError(f"cannot reach into the sandbox's network: "
                             f"{failed[0] if failed else 'no socket'}")
    return made[0]


def _made_in(netns: Path, made: list[socket.socket], failed: list[str]) -> None:
    """In a thread of its own (`socket_in`): a socket made in `netns`, to `made`, or what
    failed, to `failed`. Raises OSError for what fails otherwise (our own namespace's file,
    the socket itself), with the thread back in its own namespace (or saying it is not)."""
    ours = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        theirs = os.open(netns, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        os.close(ours)
        failed.append(f"{netns.name}: {exc.strerror}")
        return
    try:
        if _libc.setns(theirs, _CLONE_NEWNET) != 0:
            failed.append(f"setns: {os.strerror(ctypes.get_errno())}")
            return
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            made.append(sock)
            sock.setblocking(False)
        finally:
            if _libc.setns(ours, _CLONE_NEWNET) != 0:  # this thread ends here regardless
                failed.append("could not leave the namespace")
    finally:
        os.close(theirs)
        os.close(ours)
