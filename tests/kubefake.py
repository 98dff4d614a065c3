"""A Kubernetes API double for the pods the proxy's pod watcher reads: what kubernetes-asyncio
asks, answered as the API server does (no cluster can run here).

Runs aiohttp in a background thread on 127.0.0.1. Serves `GET /api/v1/pods` and
`/api/v1/namespaces/{ns}/pods`: a list (paged with `limit`/`continue`, a `PodList` with the
list's `resourceVersion`), or with `watch=true` a stream of `{"type", "object"}` lines from
`resourceVersion` on (history, then live), `BOOKMARK`s when asked, and the server's own end at
`timeoutSeconds`. A version older than the last `compact()` is answered as the API server does:
the watch gets 200 and one `ERROR` event with a 410 `Status` ("too old resource version"); a
list's `continue` from before it, a 410 `Status` response. A request without the bearer token
gets 401 `Status`. The shapes (Pod, PodList, Status, events) are the API's own, trimmed to
fields that exist there.

Knobs from the test thread: `add`, `update`, `delete`, `compact`, `bookmark`, `down` (stop
listening and cut every open connection; False listens again on the same port); `requests`
logs each request's path and query.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

TOKEN = "kube-fake-service-account-token"  # a test credential: logs are checked for it


@dataclass
class _Watch:
    namespace: str | None
    queue: asyncio.Queue[dict[str, Any] | None]


class KubeFake:
    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._version = 100
        self._pods: dict[str, dict[str, Any]] = {}  # uid -> the pod as stored
        self._history: list[tuple[int, str, dict[str, Any]]] = []  # (version, type, pod)
        self._compacted = 0  # versions below this are gone
        self._watches: list[_Watch] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kubefake",
                                        daemon=True)
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.port = 0
        self._down = False

    def __enter__(self) -> KubeFake:
        self._thread.start()
        self._run(self._start())
        return self

    def __exit__(self, *_: object) -> None:
        self._run(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def kubeconfig(self) -> str:
        return json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "watcher", "user": {"token": TOKEN}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "watcher"}}]})

    # -- the test thread's knobs ------------------------------------------------------

    def add(self, name: str, ip: str | None, labels: dict[str, str] | None = None, *,
            namespace: str = "sandboxes", host_network: bool = False) -> str:
        pod = pod_object(name, ip, labels, namespace=namespace, host_network=host_network)
        self._run(self._change("ADDED", pod["metadata"]["uid"], pod))
        return str(pod["metadata"]["uid"])

    def update(self, uid: str, *, phase: str | None = None, terminating: bool = False,
               labels: dict[str, str] | None = None) -> None:
        pod = json.loads(json.dumps(self._pods[uid]))
        if phase is not None:
            pod["status"]["phase"] = phase
        if terminating:
            pod["metadata"]["deletionTimestamp"] = "2026-12-02T12:05:00Z"
        if labels is not None:
            pod["metadata"]["labels"] = labels
        self._run(self._change("MODIFIED", uid, pod))

    def delete(self, uid: str) -> None:
        self._run(self._change("DELETED", uid, self._pods[uid]))

    def compact(self) -> None:
        """Every version so far gone: watches from them, and open ones, get 410."""
        self._run(self._compact())

    def bookmark(self) -> None:
        self._run(self._send({"type": "BOOKMARK", "object": {
            "kind": "Pod", "apiVersion": "v1",
            "metadata": {"resourceVersion": str(self._version)}}}))

    @property
    def down(self) -> bool:
        return self._down

    @down.setter
    def down(self, value: bool) -> None:
        if value != self._down:
            self._run(self._unlisten() if value else self._listen())
            self._down = value

    def watches(self) -> list[dict[str, str]]:
        return [query for _, query in self.requests if _true(query.get("watch"))]

    def lists(self) -> list[dict[str, str]]:
        return [query for _, query in self.requests if not _true(query.get("watch"))]

    # -- the server -------------------------------------------------------------------

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/pods", self._pods_handler)
        app.router.add_get("/api/v1/namespaces/{namespace}/pods", self._pods_handler)
        self._routes(app)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        await self._listen()

    def _routes(self, app: web.Application) -> None:
        """More of the API, for a double that serves it (`tests/claimfake.py`)."""

    async def _listen(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await self._site.start()
        self.port = self._site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _unlisten(self) -> None:
        assert self._site is not None and self._runner is not None
        await self._site.stop()
        for watch in self._watches:
            watch.queue.put_nowait(None)
        server = self._runner.server
        assert server is not None
        for conn in server.connections:
            conn.force_close()

    async def _stop(self) -> None:
        for watch in self._watches:
            watch.queue.put_nowait(None)
        if self._runner is not None:
            await self._runner.cleanup()

    async def _change(self, kind: str, uid: str, pod: dict[str, Any]) -> None:
        self._version += 1
        pod = {**pod, "metadata": {**pod["metadata"], "resourceVersion": str(self._version)}}
        if kind == "DELETED":
            self._pods.pop(uid, None)
        else:
            self._pods[uid] = pod
        self._history.append((self._version, kind, pod))
        await self._send({"type": kind, "object": {"kind": "Pod", "apiVersion": "v1", **pod}},
                         pod["metadata"]["namespace"])

    async def _send(self, event: dict[str, Any], namespace: str | None = None) -> None:
        for watch in self._watches:
            if namespace is None or watch.namespace in (None, namespace):
                watch.queue.put_nowait(event)

    async def _compact(self) -> None:
        self._compacted = self._version  # a watch from now on still works
        self._history.clear()
        for watch in self._watches:
            watch.queue.put_nowait(_gone(self._version))

    async def _pods_handler(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        self.requests.append((request.path, query))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return _status(401, "Unauthorized", "Unauthorized")
        namespace = request.match_info.get("namespace")
        if _true(query.get("watch")):
            return await self._watch(request, query, namespace)
        return self._list(query, namespace)

    def _list(self, query: dict[str, str], namespace: str | None) -> web.Response:
        offset, at = 0, self._version
        if token := query.get("continue"):
            offset, at = (int(part) for part in token.split(":"))
            if at < self._compacted:
                return _status(410, "Expired", "The provided continue parameter is too old "
                               "to display a consistent list result.")
        wanted = _selector(query.get("labelSelector", ""))
        pods = sorted((p for p in self._pods.values()
                       if (namespace is None or p["metadata"]["namespace"] == namespace)
                       and wanted.items() <= p["metadata"].get("labels", {}).items()),
                      key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
        limit = int(query.get("limit", "0")) or len(pods) or 1
        page = pods[offset:offset + limit]
        meta: dict[str, Any] = {"resourceVersion": str(at)}
        if offset + limit < len(pods):
            meta["continue"] = f"{offset + limit}:{at}"
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": meta,
                                  "items": page})

    async def _watch(self, request: web.Request, query: dict[str, str],
                     namespace: str | None) -> web.StreamResponse:
        since = int(query.get("resourceVersion") or self._version)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if since < self._compacted:
            await response.write(json.dumps(_gone(since)).encode() + b"\n")
            return response
        watch = _Watch(namespace, asyncio.Queue())
        for version, kind, pod in self._history:
            if version > since and namespace in (None, pod["metadata"]["namespace"]):
                watch.queue.put_nowait({"type": kind, "object": {"kind": "Pod",
                                                                 "apiVersion": "v1", **pod}})
        self._watches.append(watch)
        bookmarks = _true(query.get("allowWatchBookmarks"))
        deadline = self._loop.time() + float(query.get("timeoutSeconds", "1800"))
        try:
            while (left := deadline - self._loop.time()) > 0:
                try:
                    event = await asyncio.wait_for(watch.queue.get(), left)
                except TimeoutError:
                    break
                if event is None:
                    break
                if event["type"] == "BOOKMARK" and not bookmarks:
                    continue
                await response.write(json.dumps(event).encode() + b"\n")
                if event["type"] == "ERROR":
                    break
        except (ConnectionError, RuntimeError):
            pass
        finally:
            self._watches.remove(watch)
        return response


def pod_object(name: str, ip: str | None, labels: dict[str, str] | None = None, *,
               namespace: str = "sandboxes", host_network: bool = False) -> dict[str, Any]:
    """A running pod as the API stores it (a new uid each)."""
    return {"metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
                         "creationTimestamp": "2026-12-02T12:00:00Z",
                         "labels": dict(labels or {})},
            "spec": {"containers": [{"name": "main", "image": "busybox"}],
                     "nodeName": "node-1", **({"hostNetwork": True} if host_network else {})},
            "status": {"phase": "Running", "hostIP": "192.0.2.10",
                       **({"podIP": ip, "podIPs": [{"ip": ip}]} if ip else {})}}


def _selector(text: str) -> dict[str, str]:
    """A label selector of equalities (`a=b,c=d`, what this API's callers send)."""
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


def _true(value: str | None) -> bool:
    """A boolean query parameter as the API server reads it (Go's strconv.ParseBool)."""
    return value in ("1", "t", "T", "true", "TRUE", "True")


def _gone(version: int) -> dict[str, Any]:
    return {"type": "ERROR", "object": {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": f"too old resource version: {version} ({version + 1})",
        "reason": "Expired", "code": 410}}


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Failure", "message": message, "reason": reason,
                              "code": code}, status=code)
