"""Identity by pod: the Kubernetes API's pods, listed and watched, told to the proxy's source
registry as address -> sandbox (`claims` decides; the proxy's control API is told through the
proxy's face, as the sandbox runtime tells it on one host).

The client is kubernetes-asyncio: the official client's generated API on aiohttp, which the rest
of sealgate already runs on, with in-cluster and kubeconfig loading; lightkube (which needs
h11 0.16, against mitmproxy 11.0's pin) and kr8s (httpx) would each bring a second HTTP stack.
Its `Watch` retries a 410 by watching again from the same stale version, so 410 here ends the
watch and the pods are listed again (the API's own rule: clear the cache and re-list).

The loop, `Watcher.run`:
1. list (paged), the list is the truth (`Claims.relist`), the proxy's registry made to match
   it, including anything it held before this process started;
2. watch from the list's resourceVersion with bookmarks, for at most `WATCH_SECONDS` a request,
   then again from the last version seen; 410 Gone (on the watch, or as an ERROR event): back
   to 1;
3. an API that cannot be reached or answers in error: retried with a backoff doubling to 10 s.
   **Fail closed**: once no list or watch has succeeded for `stale_after` seconds, every
   registration is withdrawn (sandboxes' egress is refused) until a list succeeds again, since
   meanwhile a pod may have ended and its address gone to another.

Each address's new sandbox is told to the proxy at once; a proxy that cannot be reached makes
the next round compare the whole registry with the claims.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sealgate.proxy import (
    ControlError,
    SourceRefused,
    register_source,
    registered_sources,
    unregister_source,
)

from .claims import Change, Claims, Pod, PodError

_LOG = logging.getLogger("sealgate.kube")
WATCH_SECONDS = 60  # a watch request's own end (the API server closes it then)
_PAGE = 500
_BACKOFF_MAX = 10.0
# A watch event's types (anything else is counted as `other`, never as a label of its own).
_EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})


class _Gone(Exception):
    """410: the version watched from is older than the API server keeps."""


@dataclass
class Counts:
    """What the watcher has done, for its metrics (`kube.admin`): plain numbers."""

    lists: int = 0  # lists that succeeded (at start, after a 410, after an outage)
    gone: int = 0  # 410s: the watched version expired
    failures: int = 0  # lists or watches that failed (the API down, refusing, malformed)
    events: dict[str, int] = field(default_factory=dict)  # watch events by type
    told: dict[str, int] = field(default_factory=dict)  # registry changes by outcome
    withdrawals: int = 0  # times every registration was withdrawn (fail closed)

    def tell(self, outcome: str) -> None:
        self.told[outcome] = self.told.get(outcome, 0) + 1


@dataclass(frozen=True)
class Settings:
    control: Path  # the proxy's control socket
    label: str = "sealgate.dev/sandbox"  # the pod label whose value is the sandbox id
    namespace: str | None = None  # None: every namespace (a reused address crosses them)
    stale_after: float = 30.0


class Watcher:
    def __init__(self, api: Any, settings: Settings) -> None:
        self.api = api  # kubernetes_asyncio.client.CoreV1Api
        self.settings = settings
        self.claims = Claims()
        self.synced = time.monotonic()  # the last list or watch that succeeded
        self.withdrawn = False
        self.listed = False  # a list has succeeded since the start
        self.proxy_problem: str | None = None  # the last failure to tell the proxy
        self.counts = Counts()
        self._resync = True  # compare the proxy's whole registry at the next chance

    async def run(self, stop: asyncio.Event) -> None:
        backoff = 0.1
        while not stop.is_set():
            try:
                version = await self._list()
                backoff = 0.1
                while not stop.is_set():
                    version = await self._watch(version)
            except _Gone:
                self.counts.gone += 1
                _LOG.info("the watch's version expired (410): listing again")
                continue
            except Exception as exc:  # the API down or answering nonsense: said, retried
                self.counts.failures += 1
                _LOG.warning("the pods could not be read", extra={"error": _said(exc)})
            if time.monotonic() - self.synced > self.settings.stale_after:
                await self._withdraw()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff)
            backoff = min(backoff * 2, _BACKOFF_MAX)

    async def _list(self) -> str:
        pods: list[Pod] = []
        token: str | None = None
        version = ""
        while True:
            body = await self._call(self._lister(), limit=_PAGE,
                                    **({"_continue": token} if token else {}))
            for item in body.get("items") or []:
                pod = self._pod(item)
                if pod is not None:
                    pods.append(pod)
            meta = body.get("metadata") or {}
            version = str(meta.get("resourceVersion") or "")
            token = meta.get("continue") or None
            if not token:
                break
        if not version:
            raise ValueError("the pod list has no resourceVersion")
        self.synced = time.monotonic()
        self.withdrawn = False
        self.listed = True
        self.counts.lists += 1
        await self._tell(self.claims.relist(pods))
        self._resync = True
        await self._reconcile()
        return version

    async def _watch(self, version: str) -> str:
        from kubernetes_asyncio.client.exceptions import ApiException
        from kubernetes_asyncio.watch import Watch

        watch = Watch()
        try:
            async for event in watch.stream(
                    self._lister(), resource_version=version, allow_watch_bookmarks=True,
                    timeout_seconds=WATCH_SECONDS, _request_timeout=WATCH_SECONDS + 15):
                kind, raw = event.get("type"), event.get("raw_object")
                self.synced = time.monotonic()
                name = kind if kind in _EVENT_TYPES else "other"
                self.counts.events[name] = self.counts.events.get(name, 0) + 1
                if kind in ("ADDED", "MODIFIED") and (pod := self._pod(raw)) is not None:
                    await self._tell(self.claims.seen(pod))
                elif kind == "DELETED" and (pod := self._pod(raw)) is not None:
                    await self._tell(self.claims.gone(pod.uid))
                version = watch.resource_version or version
        except ApiException as exc:
            if exc.status == 410:
                raise _Gone from None
            raise
        finally:
            await watch.close()
        self.synced = time.monotonic()
        await self._reconcile()
        return version

    def _lister(self) -> Callable[..., Awaitable[Any]]:
        api, namespace = self.api, self.settings.namespace
        if namespace is None:
            return api.list_pod_for_all_namespaces  # type: ignore[no-any-return]

        async def namespaced(**kwargs: Any) -> Any:
            return await api.list_namespaced_pod(namespace, **kwargs)

        namespaced.__doc__ = api.list_namespaced_pod.__doc__  # Watch reads its return type
        return namespaced

    async def _call(self, lister: Callable[..., Awaitable[Any]], **kwargs: Any
                    ) -> dict[str, Any]:
        from kubernetes_asyncio.client.exceptions import ApiException

        response = await lister(_preload_content=False, _request_timeout=30, **kwargs)
        async with response:  # unread content (an error's) is released
            if response.status == 410:
                raise _Gone
            if response.status != 200:  # unread: an error's body is not ours to repeat
                raise ApiException(status=response.status, reason=response.reason)
            body = await response.json()
        if not isinstance(body, dict):
            raise ValueError("the pod list is not an object")
        return body

    def _pod(self, raw: Any) -> Pod | None:
        try:
            return Pod.of(raw, self.settings.label)
        except PodError as exc:
            _LOG.warning("a pod that cannot be read claims nothing", extra={"error": str(exc)})
            return None

    async def _tell(self, changes: list[Change]) -> None:
        for address, sandbox in changes:
            await self._set(address, sandbox)

    async def _set(self, address: str, sandbox: str | None) -> None:
        control = self.settings.control
        try:
            if sandbox is None:
                await asyncio.to_thread(unregister_source, control, address)
                self.counts.tell("withdrawn")
                _LOG.info("an address is no sandbox's", extra={"address": address})
                return
            try:
                await asyncio.to_thread(register_source, control, address, sandbox)
                self.counts.tell("registered")
                _LOG.info("an address is a sandbox's",
                          extra={"address": address, "sandbox": sandbox})
            except SourceRefused as exc:  # e.g. a label naming no sandbox of the rules
                self.counts.tell("refused")
                _LOG.warning("the proxy refused an address", extra={
                    "address": address, "sandbox": sandbox, "reason": exc.reason})
                await asyncio.to_thread(unregister_source, control, address)
        except ControlError as exc:
            self.counts.tell("unreachable")
            self.proxy_problem = str(exc)
            _LOG.warning("the proxy could not be told", extra={"error": str(exc)})
            self._resync = True

    async def _reconcile(self) -> None:
        """The proxy's registry made to match the claims exactly, if it may not."""
        if not self._resync:
            return
        try:
            held = await asyncio.to_thread(registered_sources, self.settings.control)
        except ControlError as exc:
            self.proxy_problem = str(exc)
            _LOG.warning("the proxy's registry could not be read", extra={"error": str(exc)})
            return
        self._resync = False
        self.proxy_problem = None
        wanted = self.claims.registered()
        for address in held.keys() - wanted.keys():
            await self._set(address, None)
        for address, sandbox in wanted.items():
            if held.get(address) != sandbox:
                await self._set(address, sandbox)

    async def _withdraw(self) -> None:
        if self.withdrawn:
            return
        # The sandboxes' egress is refused until the pods can be listed again.
        _LOG.error("no answer from the API: every registration withdrawn",
                   extra={"seconds": round(time.monotonic() - self.synced)})
        self.claims = Claims()
        self.withdrawn = True
        self.counts.withdrawals += 1
        self._resync = True
        await self._reconcile()


def _said(exc: BaseException) -> str:
    """An error in a line, never with what the API answered (a pod's spec can hold anything,
    an inline secret in an env included): its status for the API's errors, its type for the
    client's own malformed-answer errors (which quote the answer), else its words."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        return f"{type(exc).__name__}: HTTP {status} {str(getattr(exc, 'reason', ''))[:80]}"
    if type(exc) is Exception:
        return "the API's answer is malformed"
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
