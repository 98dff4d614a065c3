"""Per-request work mitmproxy does for its developers, which the lean master leaves out.

Profiling the proxy under keep-alive HTTPS load (py-spy, guard-only traffic) put three of
mitmproxy's own conveniences among the largest single costs of a request:

- every `Request` and `Response` built type-checks each of its fields against its annotation
  (`MessageData.__post_init__`, on only `if __debug__`, i.e. unless Python runs with -O). The
  values come from mitmproxy's own parser; running the whole proxy with -O would also drop the
  asserts mitmproxy and sealgate rely on, so only this check goes.
- every hook task is tagged for debugging, which reads `os.environ` each time.
- every flow, and every HTTP stream's server placeholder, gets `str(uuid.uuid4())`: a system
  call and a UUID object per id. The ids here are as random and as unique (122 random bits from
  `os.urandom`, same format), drawn from a buffer refilled every 256 ids. They must stay random:
  a denial shows the sandbox its request id, and a counter would tell it how much traffic other
  sandboxes send.
"""

from __future__ import annotations

import asyncio
import os
import types
from typing import Any

from mitmproxy import connection, flow, http
from mitmproxy.utils import asyncio_utils

_IDS_PER_FILL = 256


class _RandomIds:
    def __init__(self) -> None:
        self._hex = ""
        self._at = 0

    def uuid4(self) -> str:
        if self._at >= len(self._hex):
            self._hex, self._at = os.urandom(16 * _IDS_PER_FILL).hex(), 0
        h, self._at = self._hex[self._at : self._at + 32], self._at + 32
        # Version 4, RFC 4122 variant: the two fixed nibbles of uuid.uuid4().
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


def _name_task(
    task: asyncio.Task[Any], *, name: str, client: tuple[Any, ...] | None = None
) -> None:
    task.set_name(name)


def install() -> None:
    http.MessageData.__post_init__ = lambda self: None  # type: ignore[method-assign]
    asyncio_utils.set_task_debug_info = _name_task
    # What flow.py and connection.py call `uuid`; uuid4() is all they use of it.
    ids = types.SimpleNamespace(uuid4=_RandomIds().uuid4)
    for module in (flow, connection):
        vars(module)["uuid"] = ids
