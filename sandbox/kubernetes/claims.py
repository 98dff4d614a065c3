"""Sandboxes as Agent Sandbox claims: a `SandboxClaim` on a warm pool made, waited for until
the controller says it is ready, its pod found; and deleted. The sandbox backend's only use of
the Agent Sandbox API (`backend`).

A claim names a warm pool (`warmPoolRef`, v1beta1), never a template, and carries no env and
no volumes: either would make the controller start a new pod instead of handing over a warm
one. So the policy a sandbox gets is its warm pool's: the pool's template labels its pods with
the sandbox id the rules name (`sealgate.dev/sandbox`, which the proxy's pod watcher reads), and
the backend picks the pool by the sandbox id asked for (`--warm-pool ID=POOL`).

The pod is found from the claim's status (`sandbox.name`, `sandbox.podIPs`), the `Sandbox`'s
status (`selector`, a label selector of its pods) and the pods that selector names: exactly one
running, with the address the claim reports, or the claim fails (closed: a pod the backend
cannot tell apart is never driven).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import re
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from ..errors import SandboxError

EXTENSIONS = ("extensions.agents.x-k8s.io", "v1beta1")
AGENTS = ("agents.x-k8s.io", "v1beta1")
_WATCH_SECONDS = 30  # a claim watch's own end, then a get and a watch again
_PAUSE, _PAUSE_MAX = 0.05, 2.0  # after a failed watch, seconds before the next get
LABEL = "sealgate.dev/sandbox"  # a pod's sandbox id, as the proxy's pod watcher reads it
OWNER = "sealgate.dev/sandboxd"  # a claim's daemon (its --instance)
_SWEEP_MAX = 10_000  # claims deleted at one start, at most (a list is one page of this many)
_LOG = logging.getLogger("sealgate.sandbox.daemon")
_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class ClaimError(SandboxError):
    """A claim that could not be made, did not become ready, or whose pod is not one."""


@dataclass(frozen=True)
class Bound:
    """A ready claim and the pod it was given."""

    namespace: str
    claim: str
    sandbox: str  # the Sandbox object's name
    pod: str
    address: str


class Claims:
    def __init__(self, api: Any, namespace: str, ready_seconds: float = 180.0) -> None:
        from kubernetes_asyncio import client

        # Any: the generated methods' signatures leave out the keywords they take (`_content_type`).
        self._objects: Any = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self.namespace = namespace
        self.ready_seconds = ready_seconds

    async def claim(self, name: str, pool: str, labels: dict[str, str],
                    shutdown: datetime.datetime, sandbox: str) -> Bound:
        """Claim a sandbox of warm pool `pool` as `name`, ended by the controller at `shutdown`
        whatever becomes of us, and wait for it (bounded): its pod must be labelled `sandbox`
        (`LABEL`: who it is to the proxy), or the pool is not that sandbox's. Raises ClaimError;
        a claim made (or perhaps made: an answer lost) and then failed is deleted."""
        if not _NAME.fullmatch(name):
            raise ClaimError(f"{name[:64]!r} is not a Kubernetes object name")
        body = {"apiVersion": "/".join(EXTENSIONS), "kind": "SandboxClaim",
                "metadata": {"name": name, "namespace": self.namespace, "labels": labels},
                "spec": {"warmPoolRef": {"name": pool},
                         "lifecycle": {"shutdownPolicy": "Delete",
                                       "shutdownTime": _rfc3339(shutdown)}}}
        try:
            await self._objects.create_namespaced_custom_object(
                *EXTENSIONS, self.namespace, "sandboxclaims", body, _request_timeout=30)
        except Exception as exc:  # the generated client's ApiException, or no API at all
            await self.release(name)  # the name is ours alone, and the answer may be all lost
            raise ClaimError(f"cannot claim from warm pool {pool!r}: {_said(exc)}") from None
        try:
            return await asyncio.wait_for(self._ready(name, sandbox), self.ready_seconds)
        except TimeoutError:
            await self.release(name)
            raise ClaimError(f"claim {name} on warm pool {pool!r} was not ready within "
                             f"{self.ready_seconds:g} s") from None
        except BaseException:
            await self.release(name)
            raise

    async def shutdown_at(self, name: str, when: datetime.datetime) -> None:
        """Move the claim's own end (a ttl changed). Raises ClaimError."""
        patch = {"spec": {"lifecycle": {"shutdownTime": _rfc3339(when)}}}
        try:
            await self._objects.patch_namespaced_custom_object(
                *EXTENSIONS, self.namespace, "sandboxclaims", name, patch,
                _content_type="application/merge-patch+json", _request_timeout=30)
        except Exception as exc:
            raise ClaimError(f"claim {name}: {_said(exc)}") from None

    async def release(self, name: str) -> None:
        """Delete the claim (its shutdown policy deletes its sandbox and pod). Never raises:
        a claim left behind ends by its own lifecycle (its shutdownTime), said in the log."""
        try:
            await self._objects.delete_namespaced_custom_object(
                *EXTENSIONS, self.namespace, "sandboxclaims", name, _request_timeout=30)
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                _LOG.warning("claim not deleted", extra={"claim": name, "error": _said(exc)})

    async def sweep(self, labels: dict[str, str]) -> int:
        """Delete every claim labelled with all of `labels`: how many. Never raises: a claim
        left behind still ends at its own shutdownTime, and the failure is said in the log."""
        selector = ",".join(f"{key}={value}" for key, value in sorted(labels.items()))
        try:
            found = await self._objects.list_namespaced_custom_object(
                *EXTENSIONS, self.namespace, "sandboxclaims", label_selector=selector,
                limit=_SWEEP_MAX, _request_timeout=30)
        except Exception as exc:
            _LOG.warning("claims of an earlier run not looked for: they end at their "
                         "shutdownTime", extra={"selector": selector, "error": _said(exc)})
            return 0
        names = [item["metadata"]["name"] for item in found.get("items") or []
                 if isinstance(item.get("metadata", {}).get("name"), str)]
        gate = asyncio.Semaphore(16)  # the API server's load, not a burst of 10,000

        async def release(name: str) -> None:
            async with gate:
                await self.release(name)

        await asyncio.gather(*(release(name) for name in names))
        if names:
            _LOG.info("claims of an earlier run deleted", extra={
                "selector": selector, "claims": len(names),
                "more": bool((found.get("metadata") or {}).get("continue"))})
        return len(names)

    async def _ready(self, name: str, sandbox: str) -> Bound:
        """The claim once the controller says it is ready: a get, then a watch of this one
        claim from the version the get saw (told at once, one request; not a get every tenth
        of a second, which at a fleet's rate of creates was the API server's load), and a get
        again whenever a watch ends (its own timeout, a 410, a break: after a pause that grows
        while they fail). Bounded by the caller (`ready_seconds`)."""
        pause = _PAUSE
        while True:
            try:
                claim = await self._objects.get_namespaced_custom_object(
                    *EXTENSIONS, self.namespace, "sandboxclaims", name, _request_timeout=30)
            except Exception as exc:
                raise ClaimError(f"claim {name}: {_said(exc)}") from None
            if (bound := await self._bound(name, claim, sandbox)) is not None:
                return bound
            version = str((claim.get("metadata") or {}).get("resourceVersion") or "")
            try:
                async with contextlib.aclosing(self._changes(name, version)) as changes:
                    async for changed in changes:
                        if (bound := await self._bound(name, changed, sandbox)) is not None:
                            return bound
                pause = _PAUSE
            except ClaimError:
                raise
            except Exception as exc:  # the watch refused or broken: get and watch again
                _LOG.debug("claim watch failed", extra={"claim": name, "error": _said(exc)})
                await asyncio.sleep(pause)
                pause = min(pause * 2, _PAUSE_MAX)

    async def _changes(self, name: str, version: str) -> AsyncGenerator[dict[str, Any], None]:
        """The claim as each change leaves it, from `version`, until the watch ends (its
        timeout, or an ERROR event such as 410: the caller gets it again). Deleted: ClaimError."""
        from kubernetes_asyncio.watch import Watch

        watch = Watch()
        try:
            async for event in watch.stream(
                    self._objects.list_namespaced_custom_object, *EXTENSIONS, self.namespace,
                    "sandboxclaims", field_selector=f"metadata.name={name}",
                    resource_version=version or None, timeout_seconds=_WATCH_SECONDS,
                    _request_timeout=_WATCH_SECONDS + 10):
                kind, claim = event.get("type"), event.get("object")
                if kind == "DELETED":
                    raise ClaimError(f"claim {name} was deleted before it was ready")
                if kind == "ERROR" or not isinstance(claim, dict):
                    return
                if kind in ("ADDED", "MODIFIED"):
                    yield claim
        finally:
            await watch.close()

    async def _bound(self, name: str, claim: dict[str, Any], sandbox: str) -> Bound | None:
        """The claim's pod if the claim is ready (ClaimError if that pod is wrong), else None."""
        status = claim.get("status") or {}
        if not _condition(status, "Ready"):
            return None
        given = status.get("sandbox") or {}
        if not isinstance(given.get("name"), str) or not given.get("podIPs"):
            return None
        return await self._pod(name, given["name"], list(given["podIPs"]), sandbox)

    async def _pod(self, claim: str, sandbox: str, addresses: list[Any], who: str) -> Bound:
        try:
            found = await self._objects.get_namespaced_custom_object(
                *AGENTS, self.namespace, "sandboxes", sandbox, _request_timeout=30)
            selector = (found.get("status") or {}).get("selector")
            if not isinstance(selector, str) or not selector:
                raise ClaimError(f"sandbox {sandbox} has no pod selector in its status")
            pods = await self._core.list_namespaced_pod(self.namespace, label_selector=selector,
                                                        _request_timeout=30)
        except ClaimError:
            raise
        except Exception as exc:
            raise ClaimError(f"sandbox {sandbox}: {_said(exc)}") from None
        running = [p for p in pods.items if p.status is not None and p.status.phase == "Running"
                   and p.metadata.deletion_timestamp is None and p.status.pod_ip in addresses]
        if len(running) != 1:
            raise ClaimError(f"sandbox {sandbox}: {len(running)} running pods with its address")
        pod = running[0]
        if (pod.metadata.labels or {}).get(LABEL) != who:
            raise ClaimError(f"sandbox {sandbox}'s pod is not labelled {LABEL}={who}: its warm "
                             "pool is another sandbox's (sandboxd --warm-pool)")
        return Bound(self.namespace, claim, sandbox, pod.metadata.name, pod.status.pod_ip)


def _rfc3339(when: datetime.datetime) -> str:
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(status: dict[str, Any], kind: str) -> bool:
    conditions = status.get("conditions")
    return isinstance(conditions, list) and any(
        isinstance(c, dict) and c.get("type") == kind and c.get("status") == "True"
        for c in conditions)


def _said(exc: BaseException) -> str:
    """An API error as one short line: its status and reason, never a body (which can echo
    what was sent)."""
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if status is not None:
        return f"{status} {str(reason)[:100]}"
    return type(exc).__name__
