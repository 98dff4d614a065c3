"""The ops a shim serves: a child of the agent with no capability, under the seccomp filter,
as the sandbox's uid, that does one request on its descriptors, says its status and exits
(`agent` forks one per request). The microVM's launcher (`hostserve`) runs the same in its
guest as a process of its own (`main`).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import Any

from .files import get, put
from .fsops import ls, mkdir, remove, rename, stat_op
from .protocol import DESCRIPTORS, IN, Op

Handler = Callable[[dict[str, Any], list[int]], None]


def _later(module: str, name: str) -> Handler:
    """A handler whose module is imported by the shim that runs it: tarfile and ctypes would
    cost every agent's start, for ops few sandboxes use."""
    def run(req: dict[str, Any], fds: list[int]) -> None:
        handler: Handler = getattr(importlib.import_module(f".{module}", __package__), name)
        handler(req, fds)
    return run


# An op -> its handler, given the request and its descriptors in the order `DESCRIPTORS` says.
SHIMS: dict[str, Handler] = {
    Op.PUT: put, Op.GET: get, Op.LIST: ls, Op.STAT: stat_op, Op.MKDIR: mkdir,
    Op.REMOVE: remove, Op.RENAME: rename, Op.TAR: _later("tarout", "tar"),
    Op.UNTAR: _later("tarball", "untar"), Op.WATCH: _later("watch", "watch"),
    Op.CONNECT: _later("portdial", "connect"),
}


def main(argv: list[str]) -> None:
    """`argv`: the op and its request (JSON). Its descriptors are this process's standard
    streams: what the handler reads is 0, what it writes 1, its status 2."""
    op, req = argv[0], json.loads(argv[1])
    *data, _ = DESCRIPTORS[op]
    SHIMS[op](req, [0 if way == IN else 1 for _, way in data] + [2])

