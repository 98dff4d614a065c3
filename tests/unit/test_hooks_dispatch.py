"""Hook dispatch (proxy/engine/hooks.py) against mitmproxy's own: the same scenario run through
a real ProxyConnectionHandler and AddonManager both ways must leave the same record of what the
addons saw and what the layer was told, in the same order; and a hook whose handlers are all
plain functions runs without a task."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from mitmproxy import addonmanager, exceptions, flow, options
from mitmproxy.proxy import commands, events, mode_servers
from mitmproxy.test import tflow

from sealgate.proxy.engine import hooks


@dataclasses.dataclass
class SgAlphaHook(commands.StartHook):
    data: Any


@dataclasses.dataclass
class SgBetaHook(commands.StartHook):
    data: Any


@dataclasses.dataclass
class SgGammaHook(commands.StartHook):
    data: Any


@dataclasses.dataclass
class SgFlowHook(commands.StartHook):
    flow: flow.Flow


Script = Callable[[events.Event], list[commands.Command]]


class _Layer:
    """A layer answering each event from `script`, writing down every hook completed."""

    def __init__(self, record: list[str], script: Script) -> None:
        self.record, self.script = record, script

    def handle_event(self, event: events.Event) -> Iterator[commands.Command]:
        if isinstance(event, events.HookCompleted):
            self.record.append(f"completed {event.command.name}")
        yield from self.script(event)


class _Writer:
    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8080)}.get(
            name, default)


def _handler(addons: list[object], record: list[str], script: Script, *,
             update_walk: bool = False) -> mode_servers.ProxyConnectionHandler:
    opts = options.Options()
    master = types.SimpleNamespace(
        options=opts, commands=types.SimpleNamespace(collect_commands=lambda addon: None))
    manager = addonmanager.AddonManager(master)
    master.addons = manager  # type: ignore[attr-defined]
    manager.add(*addons)
    if not update_walk:  # what the lean master does once settled
        manager.handle_lifecycle = manager.trigger_event  # type: ignore[method-assign]
    handler = mode_servers.ProxyConnectionHandler(
        master, None, _Writer(), opts, mode_servers.mode_specs.ProxyMode.parse("regular"))
    handler.layer = _Layer(record, script)  # type: ignore[assignment]
    return handler


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def _both(monkeypatch: pytest.MonkeyPatch, run: Callable[[], list[str]]) -> list[str]:
    """`run` through mitmproxy's dispatch and then through hooks.py's; the same record."""
    theirs = run()
    with monkeypatch.context() as patched:
        hooks.install(patched.setattr)
        ours = run()
    assert ours == theirs
    return ours


def _scenario(addons: Callable[[list[str]], list[object]], script: Callable[[list[str]], Script],
              *, update_walk: bool = False) -> Callable[[], list[str]]:
    def run() -> list[str]:
        record: list[str] = []

        async def main() -> None:
            handler = _handler(addons(record), record, script(record), update_walk=update_walk)
            await handler.server_event(events.Start())
            await _settle()

        asyncio.run(main())
        return record

    return run


class _Plain:
    def __init__(self, record: list[str], tag: str) -> None:
        self.record, self.tag = record, tag
        self.name = tag  # the addon's name in the chain

    def sg_alpha(self, data: Any) -> None:
        self.record.append(f"{self.tag} alpha {data}")

    def sg_beta(self, data: Any) -> None:
        self.record.append(f"{self.tag} beta {data}")

    def sg_gamma(self, data: Any) -> None:
        self.record.append(f"{self.tag} gamma {data}")


def _hooks_then(after: dict[str, list[commands.Command]], first: list[commands.Command]
                ) -> Callable[[list[str]], Script]:
    def script(record: list[str]) -> Script:
        def answer(event: events.Event) -> list[commands.Command]:
            if isinstance(event, events.Start):
                return first
            if isinstance(event, events.HookCompleted):
                return after.get(event.command.name, [])
            return []

        return answer

    return script


def test_plain_hooks_run_in_task_order_and_complete_in_their_layer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two hooks in one batch, the first's completion starting a third: the third goes last,
    as its task would have."""
    record = _both(monkeypatch, _scenario(
        lambda r: [_Plain(r, "one"), _Plain(r, "two")],
        _hooks_then({"sg_alpha": [SgGammaHook(3)]}, [SgAlphaHook(1), SgBetaHook(2)])))
    assert record == ["one alpha 1", "two alpha 1", "completed sg_alpha",
                      "one beta 2", "two beta 2", "completed sg_beta",
                      "one gamma 3", "two gamma 3", "completed sg_gamma"]


def test_a_plain_hook_makes_no_task(monkeypatch: pytest.MonkeyPatch) -> None:
    hooks.install(monkeypatch.setattr)
    record: list[str] = []

    async def main() -> None:
        handler = _handler([_Plain(record, "one")], record, _hooks_then(
            {"sg_alpha": [SgBetaHook(2)]}, [SgAlphaHook(1)])(record))
        made = []
        monkeypatch.setattr(hooks.asyncio_utils, "create_task",
                            lambda *a, **k: made.append(a) or asyncio.ensure_future(a[0]))
        await handler.server_event(events.Start())
        assert record == []  # where the task's first step would come: a turn of the loop later
        await asyncio.sleep(0)
        assert record == ["one alpha 1", "completed sg_alpha"]
        await asyncio.sleep(0)
        assert record == ["one alpha 1", "completed sg_alpha", "one beta 2", "completed sg_beta"]
        assert made == [] and not handler.hook_tasks
        watchdog = handler.timeout_watchdog  # disarmed while the hook ran, armed again
        assert watchdog.blocker == 0 and watchdog.can_timeout.is_set()

    asyncio.run(main())


class _Awaits(_Plain):
    async def sg_alpha(self, data: Any) -> None:  # type: ignore[override]
        self.record.append(f"{self.tag} alpha begins")
        await asyncio.sleep(0)
        self.record.append(f"{self.tag} alpha ends")


def test_a_hook_behind_a_task_waits_for_its_first_step(monkeypatch: pytest.MonkeyPatch) -> None:
    _both(monkeypatch, _scenario(
        lambda r: [_Awaits(r, "one"), _Plain(r, "two")],
        _hooks_then({}, [SgAlphaHook(1), SgBetaHook(2)])))


class _Returns(_Plain):
    def sg_alpha(self, data: Any) -> Any:
        self.record.append(f"{self.tag} alpha returns a coroutine")

        async def later() -> None:
            await asyncio.sleep(0)
            self.record.append(f"{self.tag} alpha awaited")

        return later()


def test_an_awaitable_from_a_plain_function_is_awaited_in_its_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    record = _both(monkeypatch, _scenario(
        lambda r: [_Returns(r, "one"), _Plain(r, "two")],
        _hooks_then({}, [SgAlphaHook(1), SgBetaHook(2)])))
    assert record.index("one alpha awaited") < record.index("two alpha 1")


class _Fails(_Plain):
    def sg_alpha(self, data: Any) -> None:
        raise ValueError("broken addon")

    def sg_beta(self, data: Any) -> None:
        raise exceptions.AddonHalt()


class _Parent(_Plain):
    def __init__(self, record: list[str], tag: str) -> None:
        super().__init__(record, tag)
        self.addons = [_Fails(record, f"{tag}/child"), _Plain(record, f"{tag}/sibling")]


def test_errors_and_halts_go_where_mitmproxy_sends_them(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """An exception skips the rest of its addon's group and is logged; AddonHalt ends the
    walk; the hook is completed either way."""
    caplog.set_level(logging.ERROR, "mitmproxy.addonmanager")
    record = _both(monkeypatch, _scenario(
        lambda r: [_Parent(r, "p"), _Plain(r, "after")],
        _hooks_then({}, [SgAlphaHook(1), SgBetaHook(2)])))
    assert "after alpha 1" in record and "p/sibling alpha 1" not in record
    assert "after beta 2" not in record
    assert record.count("completed sg_alpha") == record.count("completed sg_beta") == 1
    errors = [r.getMessage() for r in caplog.records]
    assert errors == ["Addon error: broken addon"] * 2  # once per dispatch


class _Intercepts:
    def __init__(self, record: list[str]) -> None:
        self.record = record

    def sg_flow(self, f: flow.Flow) -> None:
        self.record.append("intercepted")
        f.intercept()
        asyncio.get_running_loop().call_soon(self.resume, f)

    def resume(self, f: flow.Flow) -> None:
        self.record.append("resumed")
        f.resume()

    def update(self, flows: list[flow.Flow]) -> None:
        self.record.append(f"update {len(flows)}")


@pytest.mark.parametrize("update_walk", [False, True])
def test_an_intercepted_flow_is_completed_once_resumed(
    monkeypatch: pytest.MonkeyPatch, update_walk: bool
) -> None:
    record = _both(monkeypatch, _scenario(
        lambda r: [_Intercepts(r)], _hooks_then({}, [SgFlowHook(tflow.tflow())]),
        update_walk=update_walk))
    expected = ["intercepted", *(["update 1"] if update_walk else []), "resumed",
                "completed sg_flow"]
    assert record == expected


class _Swaps(_Plain):
    def configure(self, updated: set[str]) -> None:
        if "sg_swap" in updated:
            self.sg_alpha = lambda data: self.record.append("swapped alpha")  # type: ignore[method-assign]


def test_handlers_found_are_forgotten_when_addons_or_options_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hooks.install(monkeypatch.setattr)
    record: list[str] = []

    async def main() -> None:
        swaps = _Swaps(record, "swaps")
        handler = _handler([swaps], record, _hooks_then({}, [SgAlphaHook(1)])(record))
        manager = handler.master.addons
        await manager.trigger_event(SgAlphaHook(1))
        manager.add(_Plain(record, "added"))
        await manager.trigger_event(SgAlphaHook(2))
        manager.remove(swaps)
        await manager.trigger_event(SgAlphaHook(3))
        manager.add(swaps)
        handler.master.options.add_option("sg_swap", bool, False, "")
        handler.master.options.update(sg_swap=True)
        await manager.trigger_event(SgAlphaHook(4))

    asyncio.run(main())
    assert record == ["swaps alpha 1", "swaps alpha 2", "added alpha 2", "added alpha 3",
                      "added alpha 4", "swapped alpha"]


class _NotCallable:
    sg_alpha = 3
    sg_beta = logging  # a module by the hook's name: passed over, as mitmproxy does


def test_a_handler_that_is_not_callable_is_reported_per_event(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, "mitmproxy.addonmanager")
    record = _both(monkeypatch, _scenario(
        lambda r: [_NotCallable(), _Plain(r, "after")],
        _hooks_then({}, [SgAlphaHook(1), SgBetaHook(2)])))
    assert "after alpha 1" in record and "after beta 2" in record
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "Addon error: Addon handler sg_alpha"] * 2


def test_mitmproxys_dispatch_is_as_tested() -> None:
    assert hooks.changed() == []


def test_a_hook_runs_after_what_the_loop_already_had_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by tests/integration/test_supervision.py: run at once, a connection's error hook
    completed (and its 502 went out) before its client's cancellation, already due, closed it."""

    def run() -> list[str]:
        record: list[str] = []

        async def main() -> None:
            handler = _handler([_Plain(record, "one")], record,
                               _hooks_then({}, [SgAlphaHook(1)])(record))
            loop = asyncio.get_running_loop()
            loop.call_soon(record.append, "due before")
            await handler.server_event(events.Start())
            loop.call_soon(record.append, "due after")
            await _settle()

        asyncio.run(main())
        return record

    assert _both(monkeypatch, run) == ["due before", "one alpha 1", "completed sg_alpha",
                                       "due after"]
