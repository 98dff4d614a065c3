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
    # The handler only says so: it runs in the main thread, which may be inside the terminal's
    # send (its lock held) when the signal comes, and a send from there would wait forever.
    resized = threading.Event()
    previous = signal.signal(signal.SIGWINCH, lambda *_: resized.set())
    try:
        if saved is not None:
            tty.setraw(keys)
        shown = threading.Thread(target=_show, args=(terminal,), daemon=True)
        shown.start()
        _type(keys, terminal, shown, resized)
        shown.join()
    finally:
        if saved is not None:
            termios.tcsetattr(keys, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, previous)
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


def _type(keys: int, terminal: Terminal, shown: threading.Thread,
          resized: threading.Event) -> None:
    """What is typed, and the window's new sizes, until the command has ended (or our input
    has)."""
    while shown.is_alive():
        if resized.is_set():
            resized.clear()
            with contextlib.suppress(OSError):
                terminal.resize(*_size())
        ready, _, _ = select.select([keys], [], [], 0.1)
        if ready:
            data = os.read(keys, 4096)
            if not data:
                return
            with contextlib.suppress(OSError):
                terminal.write(data)
