"""A command on a terminal (an exec with `tty`): the pseudo-terminal opened inside the sandbox,
from its own devpts (under bubblewrap a new instance per command, `confine`; gVisor's Sentry has
its own, the microVM's guest its kernel's), never a host terminal handed in; and the relay
between its master and the exec's descriptors, run by the command's supervisor inside (its init:
no capability, the seccomp filter, the sandbox's uid), which opens the terminal as the command's
own uid. The agent never holds the terminal nor handles the workload's bytes: a resize reaches
the supervisor as 4 bytes (rows, cols) on a pipe of its own (`SIZE`). Standard library only.

The filter refuses TIOCSTI and TIOCLINUX to the command on its terminal as on any other: the
terminal is the sandbox's, but a command must not type into the reader of another.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import signal
import struct
import termios

_CHUNK = 1 << 16
SIZE = struct.Struct("HH")  # a resize on the supervisor's pipe: under PIPE_BUF, never split


def open_pty(rows: int, cols: int) -> tuple[int, int]:
    """A new terminal of `rows` x `cols`: its master and slave (close-on-exec both)."""
    master, slave = os.openpty()
    resize(master, rows, cols)
    return master, slave


def resize(master: int, rows: int, cols: int) -> None:
    """The terminal's size; the kernel sends SIGWINCH to its foreground process group."""
    fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def take(slave: int) -> None:
    """In a command's child after `setsid` (the microVM's agent starts it by Popen, its
    streams the terminal): the terminal as its controlling terminal."""
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)


def controlling(slave: int) -> list[tuple[int, ...] | tuple[int, int, str, int, int]]:
    """posix_spawn's file actions that give a command started with `setsid` the terminal as
    its standard streams and its controlling terminal: a session leader with none gets the
    terminal it opens (by its name: a copied descriptor would not make it controlling)."""
    return [(os.POSIX_SPAWN_OPEN, 0, os.ttyname(slave), os.O_RDWR, 0),
            (os.POSIX_SPAWN_DUP2, 0, 1), (os.POSIX_SPAWN_DUP2, 0, 2)]


def relay(command: int, stdin: int, stdout: int, master: int, sizes: int) -> int:
    """Until `command` (a child) ends: what comes on `stdin` typed into the terminal, what the
    terminal shows written to `stdout`, the sizes that come on `sizes` given to it; then what
    is left of its output, and its wait status (what `os.waitpid` says). A reader gone from
    `stdout` leaves the command running: the daemon kills it when its caller leaves."""
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a reader gone is an EPIPE, said below
    os.write(wake_w, b"\0")  # a look at once: the command may have ended before the handler
    os.set_blocking(master, False)
    pending = b""  # typed, not yet taken by the terminal
    reading, showing = True, True
    while True:
        wanted = [wake_r, *([sizes] if sizes >= 0 else []), *([master] if showing else []),
                  *([stdin] if reading and not pending else [])]
        ready, writable, _ = select.select(wanted, [master] if pending else [], [])
        if master in ready:
            showing = _show(master, stdout) is not False
        if sizes in ready:
            sizes = _resize(master, sizes)
        if stdin in ready:
            pending = os.read(stdin, _CHUNK)
            reading = bool(pending)
        if pending and master in writable:
            try:
                pending = pending[os.write(master, pending):]
            except BlockingIOError:
                pass
            except OSError:  # no one left on the terminal's side to type to (EIO)
                pending, reading = b"", False
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 512)
            while (ended := os.waitpid(-1, os.WNOHANG))[0]:  # an init reaps what comes too
                if ended[0] == command:
                    while showing and _show(master, stdout):  # what it wrote before it ended
                        pass
                    return ended[1]


def _resize(master: int, sizes: int) -> int:
    """The last size said on `sizes` given to the terminal; -1 once the agent closed it."""
    said = os.read(sizes, SIZE.size * 64)
    if len(said) < SIZE.size:
        os.close(sizes)
        return -1
    with contextlib.suppress(OSError):
        resize(master, *SIZE.unpack_from(said, len(said) - len(said) % SIZE.size - SIZE.size))
    return sizes


def _show(master: int, stdout: int) -> bool | None:
    """One read of the terminal's output passed on: True, or None for nothing now (EAGAIN),
    False for nothing ever (its last writer gone: EIO)."""
    try:
        data = os.read(master, _CHUNK)
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno == errno.EIO:
            return False
        raise
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(stdout, view):]
        except OSError:  # the reader is gone: its output goes nowhere
            break
    return bool(data) or None
