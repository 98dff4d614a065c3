"""A coroutine hook run at once, a task only when it waits (proxy/engine/eager.py)."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest

from sealgate.proxy.engine import eager
from tests.unit.test_hooks_dispatch import (
    SgAlphaHook,
    SgBetaHook,
    _both,
    _hooks_then,
    _Plain,
    _scenario,
)

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_eager", default="")


class Hooks:
    def __init__(self, wait: asyncio.Future[str] | None = None) -> None:
        self.wait = wait
        self.seen: list[str] = []

    @eager.hook
    async def requestheaders(self, name: str) -> None:
        token = _VAR.set(name)  # as oplog.bound does around a wait
        try:
            self.seen.append("started")
            if self.wait is not None:
                self.seen.append(await self.wait)
            self.seen.append(_VAR.get())
        except asyncio.CancelledError:
            self.seen.append("cancelled")
            raise
        finally:
            _VAR.reset(token)  # raises if the steps ran in different contexts


def test_a_hook_that_does_not_wait_is_done_when_it_returns() -> None:
    async def main() -> None:
        hooks = Hooks()
        assert hooks.requestheaders("a") is None
        assert hooks.seen == ["started", "a"]

    asyncio.run(main())


def test_a_hook_that_waits_is_finished_by_what_it_returns_in_one_context() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[str] = loop.create_future()
        hooks = Hooks(answer)
        rest = hooks.requestheaders("b")
        assert rest is not None and hooks.seen == ["started"]
        task = asyncio.ensure_future(rest)
        await asyncio.sleep(0.01)
        assert not task.done()
        loop.call_later(0.01, answer.set_result, "answered")
        await asyncio.wait_for(task, 5)
        assert hooks.seen == ["started", "answered", "b"]
        assert _VAR.get() == ""  # nothing of the hook's context leaked into the caller's

    asyncio.run(main())


def test_a_failure_after_the_wait_is_the_tasks() -> None:
    async def main() -> None:
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        rest = Hooks(answer).requestheaders("c")
        assert rest is not None
        task = asyncio.ensure_future(rest)
        answer.set_exception(LookupError("no answer"))
        with pytest.raises(LookupError):
            await asyncio.wait_for(task, 5)

    asyncio.run(main())


def test_cancelling_the_task_cancels_the_wait_inside_the_hook() -> None:
    async def main() -> None:
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        hooks = Hooks(answer)
        rest = hooks.requestheaders("d")
        assert rest is not None
        task = asyncio.ensure_future(rest)
        await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.wait([task], timeout=5)
        assert task.cancelled()
        assert answer.cancelled()
        assert hooks.seen == ["started", "cancelled"]

    asyncio.run(main())


class _Eager(_Plain):
    @eager.hook
    async def sg_alpha(self, data: Any) -> None:  # type: ignore[override]
        self.record.append(f"{self.tag} alpha begins {data}")
        if data == "waits":  # a few turns of the loop, within the dispatch test's settling
            for _ in range(3):
                await asyncio.sleep(0)
        self.record.append(f"{self.tag} alpha ends {data}")


@pytest.mark.parametrize("data", ["waits", "does not wait"])
def test_the_addons_after_an_eager_hook_run_once_it_finished_in_either_dispatch(
    monkeypatch: pytest.MonkeyPatch, data: str,
) -> None:
    record = _both(monkeypatch, _scenario(
        lambda r: [_Eager(r, "one"), _Plain(r, "two")],
        _hooks_then({}, [SgAlphaHook(data), SgBetaHook(2)])))
    assert record.index(f"one alpha ends {data}") < record.index(f"two alpha {data}")
    assert record.index(f"two alpha {data}") < record.index("completed sg_alpha")
