"""`sealgate sandbox shell ID [-- COMMAND ...]`: a terminal in a sandbox for a person (a login
shell unless a command is given), through the daemon's terminal WebSocket (`Sandbox.pty`).

Our terminal is put in raw mode (every key goes to the sandbox's terminal, ^C included) and
restored on every way out; its size is the sandbox terminal's, and a resize of the window
(SIGWINCH) follows. The exit status is the command's (125: the daemon refused, as for exec).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import sys
import termios
import threading
import tty
from typing import Any

from .client import Sandbox, Terminal
from .sessioncli import client_args, client_of, pairs, refusing

_REFUSED = 125


def register(ps: Any) -> None:
    sh = ps.add_parser("shell", help="a terminal in a sandbox: a login shell, or a command")
    client_args(sh)
    sh.add_argument("id", help="the sandbox (sb-...)")
    sh.add_argument("--cwd", help="where it runs (default: the sandbox's workspace)")
    sh.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="a variable for it (repeatable; TERM is ours unless given)")
    sh.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND")
    sh.set_defaults(func=refusing(_shell))


def _size() -> tuple[int, int]:
    """Our window's rows and columns (its own, not $LINES and $COLUMNS: they do not follow
    a resize); 24 x 80 where there is none."""
    try:
        columns, lines = os.get_terminal_size(sys.stdout.fileno())
    except (OSError, ValueError):
        return 24, 80
    return max(1, lines), max(1, columns)


def _shell(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    env = {"TERM": os.environ.get("TERM", "xterm-256color"), **pairs(args.env)}
    keys = sys.stdin.fileno()
    terminal = Sandbox(client_of(args), {"id": args.id}).pty(
        *_size(), command or None, env=env, cwd=args.cwd, call_timeout=args.call_timeout)
    saved = termios.tcgetattr(keys) if os.isatty(keys) else None
    # A resize is said by the interpreter's own C-level handler, as a byte on a pipe the typing
    # loop waits on; the Python handler does nothing. It runs in the main thread between any
    # two bytecodes, so anything it did that takes a lock could wait on that same thread for
    # good: a send from it waited on the terminal's lock (seen once in CI), an Event.set on
    # the Event's own lock when a second SIGWINCH came inside the first's set (found by
    # tests/sandboxd/test_terminals.py's resize storm).
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    previous = signal.signal(signal.SIGWINCH, lambda *_: None)
    before = signal.set_wakeup_fd(wake, warn_on_full_buffer=False)
    try:
        if saved is not None:
            tty.setraw(keys)
        shown = threading.Thread(target=_show, args=(terminal,), daemon=True)
        shown.start()
        _type(keys, terminal, shown, woken)
        shown.join()
    finally:
        if saved is not None:
            termios.tcsetattr(keys, termios.TCSADRAIN, saved)
        signal.set_wakeup_fd(before)
        signal.signal(signal.SIGWINCH, previous)
        os.close(woken)
        os.close(wake)
        terminal.close()
    result = terminal.result
    if result is None or result.exit_code is None:
        print("sealgate: the terminal ended without the command's status", file=sys.stderr)
        return _REFUSED
    return result.exit_code


def _show(terminal: Terminal) -> None:
    out = sys.stdout.buffer
    with contextlib.suppress(OSError, Exception):  # its end is said by a missing status
        while data := terminal.read():
            out.write(data)
            out.flush()


def _type(keys: int, terminal: Terminal, shown: threading.Thread, woken: int) -> None:
    """What is typed, and the window's new sizes (a byte on `woken` for each signal), until
    the command has ended (or our input has)."""
    while shown.is_alive():
        ready, _, _ = select.select([keys, woken], [], [], 0.1)
        if woken in ready:
            os.read(woken, 4096)  # every resize since: one new size is all they say
            with contextlib.suppress(OSError):
                terminal.resize(*_size())
        if keys in ready:
            data = os.read(keys, 4096)
            if not data:
                return
            with contextlib.suppress(OSError):
                terminal.write(data)
