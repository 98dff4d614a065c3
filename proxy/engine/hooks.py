"""mitmproxy's hook dispatch without a walk of the addon chain per event, and without a task
for a hook whose handlers are all plain functions (mitm.py installs it).

For every hook a layer starts, mitmproxy makes a task (`ConnectionHandler.hook_task`): the
timeout watchdog disarmed, `AddonManager.handle_lifecycle` (`trigger_event`: every addon and
its sub-addons walked, the hook looked up by name on each, each handler called under
`safecall` and what it returns awaited; then the `update` walk for a flow, which the lean
master skips), a wait while the flow is intercepted, then `HookCompleted` sent back into the
layer. A py-spy profile of base-URL new connections put `hook_task` at 28 % of the worker
inclusive of the handlers, `create_task` at 7.6 % and the walks at 3.6 %; most hooks' handlers
never await anything.

The same steps, in the same order:

- each hook's handlers are looked up once, as the walk finds them, and kept per hook name until
  addons are added or removed or options change (`configure` may change them);
- a hook whose handlers are all plain functions is run by a callback of the loop, scheduled
  where the task's first step would have been (`call_soon`: the ready queue is first in, first
  out), which runs the handlers and sends `HookCompleted` as the task would have in that step.
  A handler that returns an awaitable all the same (none of sealgate's do), or a flow left
  intercepted, hands the rest to a task; the awaitable then starts a turn of the loop later
  than mitmproxy's task would have awaited it, the one difference.

Errors go where mitmproxy sends them: a handler's exception to the addon error log
(`safecall`'s message), AddonHalt ends the walk, OptionsError fails the hook uncompleted (the
loop reports it, as it reports a failed task).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import inspect
import logging
import types
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from mitmproxy import addonmanager, exceptions, flow, hooks
from mitmproxy.proxy import commands, events, mode_servers, server
from mitmproxy.utils import asyncio_utils

from . import splice

_Handler = Callable[..., Any]
_Groups = tuple[tuple[_Handler, ...], ...]  # per addon in the chain, its and its children's
_CACHE = "_sealgate_hooks"  # in an AddonManager's instance dict: hook name -> _Found
_SINGLE: dict[type[commands.StartHook], bool] = {}  # hook class -> has one argument


class _Found:
    __slots__ = ("groups", "plain")

    def __init__(self, groups: _Groups) -> None:
        self.groups = groups
        self.plain = not any(inspect.iscoroutinefunction(h) for g in groups for h in g)


def _not_callable(name: str, addon: object) -> _Handler:
    def raises(*args: Any) -> None:  # what _iter_hooks raises, where it raises it
        raise exceptions.AddonManagerError(f"Addon handler {name} ({addon}) not callable")

    return raises


def found(manager: addonmanager.AddonManager, name: str) -> _Found:
    """The handlers of hook `name`, as `_iter_hooks` finds them, grouped by addon in the chain
    (each group is one `safecall`); addons without one are left out."""
    cache: dict[str, _Found] | None = vars(manager).get(_CACHE)
    if cache is None:
        cache = vars(manager)[_CACHE] = {}
    elif (hit := cache.get(name)) is not None:
        return hit
    groups = []
    for top in manager.chain:
        handlers = []
        for addon in addonmanager.traverse([top]):
            handler = getattr(addon, name, None)
            if handler:
                if callable(handler):
                    handlers.append(handler)
                elif not isinstance(handler, types.ModuleType):
                    handlers.append(_not_callable(name, addon))
        if handlers:
            groups.append(tuple(handlers))
    cache[name] = hit = _Found(tuple(groups))
    return hit


def _forget(manager: addonmanager.AddonManager) -> None:
    vars(manager).pop(_CACHE, None)


def _addon_error(exc: Exception) -> None:
    """What `safecall` logs; the traceback starts at the handler, as safecall's is cut to."""
    tb = exc.__traceback__
    tb = tb.tb_next if tb is not None and tb.tb_next is not None else tb
    addonmanager.logger.error(f"Addon error: {exc}", exc_info=(type(exc), exc, tb))


async def _walk(groups: Sequence[tuple[_Handler, ...]], args: list[Any]) -> None:
    """`trigger_event`'s walk over handlers already found."""
    for group in groups:
        try:
            for handler in group:
                result = handler(*args)
                if result is not None and inspect.isawaitable(result):
                    await result
        except exceptions.AddonHalt:
            return
        except exceptions.OptionsError:
            raise
        except Exception as exc:
            _addon_error(exc)


@functools.wraps(addonmanager.AddonManager.trigger_event)
async def trigger_event(self: addonmanager.AddonManager, event: hooks.Hook) -> None:
    """AddonManager.trigger_event, from the handlers found once per hook name."""
    hit = found(self, event.name)
    if hit.groups:
        await _walk(hit.groups, event.args())
    if event.name == "configure":  # options changed: what an addon handles may have too
        _forget(self)


def _forgetting(method: Callable[..., Any]) -> Callable[..., Any]:
    """An AddonManager method that changes the chain, or `trigger`, which configures it (the
    options changed): found handlers are forgotten after it."""

    @functools.wraps(method)
    def changed(self: addonmanager.AddonManager, *args: Any) -> Any:
        try:
            return method(self, *args)
        finally:
            if method.__name__ != "trigger" or args[0].name == "configure":
                _forget(self)

    return changed


# -- hooks run without a task ----------------------------------------------------------------

_Stage = tuple[_Groups, list[Any]]
_Pending = tuple[int, int, int, Awaitable[Any]]  # stage, group, next handler, its awaitable


def _run(stages: list[_Stage]) -> _Pending | None:
    """Each stage's walk, as `_walk` does it, up to a handler that returns an awaitable."""
    for s, (groups, args) in enumerate(stages):
        for g, group in enumerate(groups):
            try:
                for h, handler in enumerate(group):
                    result = handler(*args)
                    if result is not None and inspect.isawaitable(result):
                        return s, g, h + 1, result
            except exceptions.AddonHalt:
                break
            except exceptions.OptionsError:
                raise
            except Exception as exc:
                _addon_error(exc)
    return None


async def _resume(stages: list[_Stage], pending: _Pending) -> None:
    """The rest of `_run`'s walks, from the awaitable it stopped at."""
    s, g, h, result = pending
    groups, args = stages[s]
    halted = False
    try:
        await result
        for handler in groups[g][h:]:
            result = handler(*args)
            if result is not None and inspect.isawaitable(result):
                await result
    except exceptions.AddonHalt:
        halted = True
    except exceptions.OptionsError:
        raise
    except Exception as exc:
        _addon_error(exc)
    if not halted:
        await _walk(groups[g + 1:], args)
    for groups, args in stages[s + 1:]:
        await _walk(groups, args)


async def _finish(handler: server.ConnectionHandler, hook: commands.StartHook,
                  stages: list[_Stage], pending: _Pending | None, disarmed: Any) -> None:
    """What is left of a hook's task once its handlers stopped at something to await."""
    try:
        if pending is not None:
            await _resume(stages, pending)
        (data,) = stages[0][1]
        if isinstance(data, flow.Flow):
            await data.wait_for_resume()
    finally:
        disarmed.__exit__(None, None, None)
    if hook.blocking:
        await handler.server_event(events.HookCompleted(hook))


def _task(handler: server.ConnectionHandler, hook: commands.StartHook, coro: Any) -> None:
    """Started as mitmproxy starts a hook's task (named, and kept in the handler's set)."""
    task = asyncio_utils.create_task(
        coro, name=f"handle_hook({hook.name})", client=handler.client.peername)
    handler.hook_tasks.add(task)
    task.add_done_callback(handler.hook_tasks.remove)


def _walks_update(manager: addonmanager.AddonManager) -> bool | None:
    """Whether handle_lifecycle walks `update` after a flow's hook; None if it is neither
    mitmproxy's nor the lean master's (trigger_event), and so not to be carried out here."""
    func = getattr(manager.handle_lifecycle, "__func__", None)
    if func is _HANDLE_LIFECYCLE:
        return True
    return False if func is trigger_event else None


def _plain(handler: server.ConnectionHandler, hook: commands.StartHook) -> bool:
    """Whether `hook` can run without a task: the handler is mitmproxy's proxy connection
    handler, as is its lifecycle dispatch, and every handler of the hook is a plain function."""
    if (single := _SINGLE.get(type(hook))) is None:  # handle_hook takes no other
        single = _SINGLE[type(hook)] = len(dataclasses.fields(hook)) == 1  # type: ignore[arg-type]
    if type(handler).handle_hook is not _HANDLE_HOOK or not single:
        return False
    manager = handler.master.addons  # type: ignore[attr-defined]
    update = _walks_update(manager)
    return (update is not None and found(manager, hook.name).plain
            and (not update or found(manager, "update").plain))


def _run_hook(handler: server.ConnectionHandler, hook: commands.StartHook) -> None:
    """hook_task(hook), for the handler's loop to call where the task's first step would come."""
    manager = handler.master.addons  # type: ignore[attr-defined]
    if (update := _walks_update(manager)) is None:  # changed since: mitmproxy's way
        _task(handler, hook, handler.hook_task(hook))
        return
    args = hook.args()
    stages: list[_Stage] = [(found(manager, hook.name).groups, args)]
    if update and isinstance(args[0], flow.Flow):
        stages.append((found(manager, "update").groups, [[args[0]]]))  # UpdateHook([flow])
    disarmed = handler.timeout_watchdog.disarm()
    disarmed.__enter__()
    handed_over = False
    try:
        pending = _run(stages)
        if pending is not None or (isinstance(args[0], flow.Flow) and args[0].intercepted):
            _task(handler, hook, _finish(handler, hook, stages, pending, disarmed))
            handed_over = True
            return
    finally:
        if not handed_over:
            disarmed.__exit__(None, None, None)
    if hook.blocking:
        if handler._server_event_lock.locked():  # never between two steps; if so, wait for it
            _task(handler, hook, handler.server_event(events.HookCompleted(hook)))
        else:
            _handle(handler, events.HookCompleted(hook))


_ORIGINAL_SERVER_EVENT = server.ConnectionHandler.server_event


@functools.wraps(_ORIGINAL_SERVER_EVENT)
async def server_event(self: server.ConnectionHandler, event: events.Event) -> None:
    async with self._server_event_lock:
        _handle(self, event)


def _handle(self: server.ConnectionHandler, event: events.Event) -> None:
    """The body of mitmproxy's ConnectionHandler.server_event (11.0, line for line, its lock
    held or no other step running), except that a hook whose handlers are all plain functions
    is run by a callback of the loop instead of a task (both are started in the same order)."""
    # No `await` beyond this point.

    splice.end(self)  # mitmproxy acts on the connection: its sockets are its own again first
    self.timeout_watchdog.register_activity()
    try:
        layer_commands = self.layer.handle_event(event)
        for command in layer_commands:
            if isinstance(command, commands.OpenConnection):
                assert command.connection not in self.transports
                handler = asyncio_utils.create_task(
                    self.open_connection(command),
                    name=f"server connection handler {command.connection.address}",
                    client=self.client.peername,
                )
                self.transports[command.connection] = server.ConnectionIO(handler=handler)
            elif isinstance(command, commands.RequestWakeup):
                task = asyncio_utils.create_task(
                    self.wakeup(command),
                    name=f"wakeup timer ({command.delay:.1f}s)",
                    client=self.client.peername,
                )
                assert task is not None
                self.wakeup_timer.add(task)
            elif (
                isinstance(command, commands.ConnectionCommand)
                and command.connection not in self.transports
            ):
                pass  # The connection has already been closed.
            elif isinstance(command, commands.SendData):
                writer = self.transports[command.connection].writer
                assert writer
                if not writer.is_closing():
                    writer.write(command.data)
            elif isinstance(command, commands.CloseTcpConnection):
                self.close_connection(command.connection, command.half_close)
            elif isinstance(command, commands.CloseConnection):
                self.close_connection(command.connection, False)
            elif isinstance(command, commands.StartHook):
                if _plain(self, command):
                    asyncio.get_running_loop().call_soon(_run_hook, self, command)
                else:
                    _task(self, command, self.hook_task(command))
            elif isinstance(command, commands.Log):
                self.log(command.message, command.level)
            else:
                raise RuntimeError(f"Unexpected command: {command}")
    except Exception:
        self.log("mitmproxy has crashed!", logging.ERROR, exc_info=True)


_HANDLE_HOOK = mode_servers.ProxyConnectionHandler.handle_hook
_HANDLE_LIFECYCLE = addonmanager.AddonManager.handle_lifecycle


def changed() -> list[str]:
    """mitmproxy's functions whose behaviour this module carries out itself, named when their
    source is not the tested version's (mitmcheck.py: the proxy does not start)."""
    conn, manager = server.ConnectionHandler, addonmanager.AddonManager
    tested: list[tuple[Callable[..., Any], str]] = [
        (conn.server_event, "11ba8b6ed84f0744"), (conn.hook_task, "9ac7970160526268"),
        (mode_servers.ProxyConnectionHandler.handle_hook, "9f8b52fd798203c9"),
        (manager.handle_lifecycle, "38c97e792d1db5b7"),
        (manager.trigger_event, "b763c59bc4992e33"), (manager.invoke_addon, "13180532440359de"),
        (manager._iter_hooks, "350b419ab7284091"), (addonmanager.safecall, "f2052c18340e99b0"),
        (addonmanager.traverse, "bad3d9f88bdf9269"),
    ]
    return [fn.__qualname__ for fn, digest in tested if hashlib.sha256(
        inspect.getsource(inspect.unwrap(fn)).encode()).hexdigest()[:16] != digest]


def install(patch: Callable[[object, str, Any], None] = setattr) -> None:
    """Patch mitmproxy's dispatch (mitm.install checks the sources first, then calls this;
    a test passes its monkeypatch's setattr)."""
    patch(server.ConnectionHandler, "server_event", server_event)
    manager = addonmanager.AddonManager
    patch(manager, "trigger_event", trigger_event)
    for name in ("add", "register", "remove", "clear", "trigger"):
        patch(manager, name, _forgetting(getattr(manager, name)))
