"""A coroutine hook run at once, and a task only if it waits on something.

mitmproxy runs a hook whose handler is a coroutine function in a task of its own (a task, its
first step a turn of the loop later, HookCompleted sent from it); hooks.py runs a hook whose
handlers are plain functions from a loop callback instead, which costs about a third as much.
The pipeline's per-request hooks are coroutines because they may wait (a DNS answer not cached,
a secret store, a refusal held), but on a kept-alive connection they almost never do. `hook`
makes such a method a plain one: it runs the coroutine's first step at once; finished, it
returns None (hooks.py completes the hook without a task); waiting, it returns an awaitable
that drives the rest, which hooks.py, or mitmproxy's own dispatch, hands to a task (both await
what a handler returns). Every step runs in one context, as a task's steps do (a context
variable set before the wait can be reset after it).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

_P = ParamSpec("_P")
_S = TypeVar("_S")


def hook(method: Callable[Concatenate[_S, _P], Coroutine[Any, Any, None]]
         ) -> Callable[Concatenate[_S, _P], Awaitable[None] | None]:
    """`method`, run at once: None when it finished without waiting, else what finishes it."""

    @functools.wraps(method)
    def run(self: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> Awaitable[None] | None:
        coro = method(self, *args, **kwargs)
        context = contextvars.copy_context()
        try:
            waiting = context.run(coro.send, None)
        except StopIteration:
            return None
        return _rest(coro, context, waiting)

    return run


async def _rest(coro: Coroutine[Any, Any, None], context: contextvars.Context,
                waiting: Any) -> None:
    """The coroutine's later steps, as a task would take them: each resumed once what it
    yielded (a future, or None for a bare turn of the loop) is done. A cancellation goes to
    what it waits for, which raises it inside the coroutine, or, that being done already, into
    the coroutine itself."""
    loop = asyncio.get_running_loop()
    while True:
        resume: Callable[..., Any] = coro.send
        arg: BaseException | None = None
        if waiting is None:
            await asyncio.sleep(0)
        elif asyncio.isfuture(waiting) and waiting._asyncio_future_blocking:
            waiting._asyncio_future_blocking = False  # taken, as Task.__step takes it
            done: asyncio.Future[None] = loop.create_future()
            waiting.add_done_callback(functools.partial(_wake, done))
            try:
                await done
            except asyncio.CancelledError as exc:
                if not waiting.cancel():
                    resume, arg = coro.throw, exc
        else:
            raise RuntimeError(f"a hook's coroutine yielded {waiting!r}, not a future")
        try:
            waiting = context.run(resume, arg)
        except StopIteration:
            return


def _wake(done: asyncio.Future[None], _: object) -> None:
    if not done.done():  # cancelled with the task that waits on it
        done.set_result(None)
