"""The Kubernetes API double (`tests/kubefake.py`) with what sandboxd's Kubernetes backend asks
of it: Agent Sandbox claims, their controller, and `pods/exec` (no cluster can run here).

- `SandboxClaim`s (extensions.agents.x-k8s.io/v1beta1): create, get, list (by labels), watch
  (one claim by `metadata.name`, or all), merge-patch, delete.
  The controller double binds a claim on a known warm pool (`pool`) after `ready_after`
  seconds: a pod (labelled as the pool's template says, plus the sandbox's selector label),
  a `Sandbox` (agents.x-k8s.io/v1beta1) whose status names that selector, and the claim's
  status going through Ready False (`SandboxNotReady`) to Ready True with `sandbox.name` and
  `podIPs`, as the controller writes them. A claim on an unknown pool stays not ready
  (`WarmPoolNotFound`). Deleting a claim deletes its sandbox and pod (`shutdownPolicy:
  Delete`) and ends every exec into the pod.
- `pods/exec` over WebSocket, subprotocol `v4.channel.k8s.io`: a byte naming the channel
  before each message's bytes (0 stdin, 1 stdout, 2 stderr, 3 the end's `Status`), an empty
  message on 1 and 2 first, as the kubelet sends. The pod is a process tree of its own under
  bubblewrap: the pod's environment (`pool(env=...)`), its own /workspace (a directory per pod,
  shared by its execs), its own PID and network namespaces (a loopback of its own).

`claims` and `execs` record what was asked (claim bodies, exec commands), for tests to check.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from tests.kubefake import TOKEN, KubeFake, _status, pod_object

_CLAIMS = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{namespace}/sandboxclaims"
_SANDBOXES = "/apis/agents.x-k8s.io/v1beta1/namespaces/{namespace}/sandboxes"
_SELECTOR = "agents.x-k8s.io/sandbox-name-hash"


class ClaimFake(KubeFake):
    def __init__(self, ready_after: float = 0.05) -> None:
        super().__init__()
        self.ready_after = ready_after
        self.claims: dict[str, dict[str, Any]] = {}  # name -> the claim as stored
        self.sandboxes: dict[str, dict[str, Any]] = {}
        self.asked: list[dict[str, Any]] = []  # every claim body created, as sent
        self.execs: list[list[str]] = []  # every exec's command
        self._pools: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
        self._pod_of: dict[str, str] = {}  # claim -> its pod's uid
        self._processes: dict[str, list[asyncio.subprocess.Process]] = {}  # pod name -> execs
        self._addresses = itertools.count(2)
        self._home = tempfile.TemporaryDirectory(prefix="claimfake-")
        self.claim_gets = 0  # GETs of one claim (how often a client looked)
        self.claim_watches = 0  # watches of claims begun
        self.refuse_watches = False  # watches answered 403, as RBAC without `watch` would
        self._claim_history: list[tuple[int, str, dict[str, Any]]] = []
        self._claim_watchers: list[tuple[str | None, asyncio.Queue[Any]]] = []

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._home.cleanup()

    def pool(self, name: str, labels: dict[str, str],
             env: dict[str, str] | None = None) -> None:
        """A warm pool whose template labels its pods `labels` and gives them `env`."""
        self._pools[name] = (labels, env or {})

    def pods_named(self) -> list[str]:
        return [p["metadata"]["name"] for p in self._pods.values()]

    def kill_execs(self, pod: str) -> None:
        """The pod's processes die (its node went away, say)."""
        self._run(self._kill(pod))

    # -- the server -------------------------------------------------------------------

    def _routes(self, app: web.Application) -> None:
        app.router.add_post(_CLAIMS, self._create_claim)
        app.router.add_get(_CLAIMS, self._list_claims)
        app.router.add_get(_CLAIMS + "/{name}", self._get_claim)
        app.router.add_patch(_CLAIMS + "/{name}", self._patch_claim)
        app.router.add_delete(_CLAIMS + "/{name}", self._delete_claim)
        app.router.add_get(_SANDBOXES + "/{name}", self._get_sandbox)
        app.router.add_get("/api/v1/namespaces/{namespace}/pods/{name}/exec", self._exec)

    def _authorized(self, request: web.Request) -> bool:
        self.requests.append((request.path, dict(request.query)))
        return request.headers.get("Authorization") == f"Bearer {TOKEN}"

    async def _create_claim(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _status(401, "Unauthorized", "Unauthorized")
        body = await request.json()
        self.asked.append(body)
        name = body["metadata"]["name"]
        if name in self.claims:
            return _status(409, "AlreadyExists", f'sandboxclaims "{name}" already exists')
        self._version += 1
        claim = {**body, "metadata": {**body["metadata"], "uid": f"claim-{name}",
                                      "resourceVersion": str(self._version)}, "status": {}}
        self.claims[name] = claim
        pool = body["spec"]["warmPoolRef"]["name"]
        if pool in self._pools:
            asyncio.get_running_loop().call_later(
                self.ready_after, lambda: asyncio.ensure_future(self._bind(name, pool)))
        else:
            claim["status"] = {"conditions": [_condition(False, "WarmPoolNotFound")]}
        self._claim_changed("ADDED", claim)
        return web.json_response(claim, status=201)

    async def _bind(self, name: str, pool: str) -> None:
        claim = self.claims.get(name)
        if claim is None:
            return
        claim["status"] = {"conditions": [_condition(False, "SandboxNotReady")]}
        self._claim_changed("MODIFIED", claim)
        await asyncio.sleep(self.ready_after)
        if name not in self.claims:
            return
        labels, env = self._pools[pool]
        sandbox = f"{pool}-{hashlib.sha256(name.encode()).hexdigest()[:5]}"
        selector = hashlib.sha256(sandbox.encode()).hexdigest()[:8]
        ip = f"10.244.0.{next(self._addresses)}"
        pod = pod_object(sandbox, ip, {**labels, _SELECTOR: selector},
                         namespace=claim["metadata"]["namespace"])
        pod["spec"]["containers"][0]["env"] = [{"name": k, "value": v} for k, v in env.items()]
        (Path(self._home.name) / sandbox).mkdir()
        self._pod_of[name] = pod["metadata"]["uid"]
        await self._change("ADDED", pod["metadata"]["uid"], pod)
        self.sandboxes[sandbox] = {
            "apiVersion": "agents.x-k8s.io/v1beta1", "kind": "Sandbox",
            "metadata": {"name": sandbox, "namespace": claim["metadata"]["namespace"]},
            "status": {"selector": f"{_SELECTOR}={selector}", "podIPs": [ip],
                       "conditions": [_condition(True, "DependenciesReady")]}}
        claim["status"] = {"conditions": [_condition(True, "SandboxReady")],
                           "sandbox": {"name": sandbox, "podIPs": [ip]}}
        self._claim_changed("MODIFIED", claim)

    def _claim_changed(self, kind: str, claim: dict[str, Any]) -> None:
        """A new version of the claim, told to the watches of it."""
        self._version += 1
        claim["metadata"]["resourceVersion"] = str(self._version)
        seen = json.loads(json.dumps(claim))  # as it is now, whatever changes it later
        self._claim_history.append((self._version, kind, seen))
        for wanted, queue in self._claim_watchers:
            if wanted in (None, claim["metadata"]["name"]):
                queue.put_nowait({"type": kind, "object": seen})

    async def _watch_claims(self, request: web.Request) -> web.StreamResponse:
        """`watch=true`: the changes after `resourceVersion` (all kept: no 410 here), of the
        claim a `fieldSelector` of `metadata.name=` names or of all, until `timeoutSeconds`."""
        self.claim_watches += 1
        if self.refuse_watches:
            return _status(403, "Forbidden", 'cannot watch resource "sandboxclaims"')
        field, _, wanted = request.query.get("fieldSelector", "").partition("=")
        if field and field != "metadata.name":
            return _status(400, "BadRequest", f"field label not supported: {field}")
        since = int(request.query.get("resourceVersion") or self._version)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        for version, kind, seen in self._claim_history:
            if version > since and (not wanted or seen["metadata"]["name"] == wanted):
                queue.put_nowait({"type": kind, "object": seen})
        watcher = (wanted or None, queue)
        self._claim_watchers.append(watcher)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(request.query.get("timeoutSeconds", "1800"))
        try:
            while (left := deadline - loop.time()) > 0:
                try:
                    event = await asyncio.wait_for(queue.get(), left)
                except TimeoutError:
                    break
                if event is None:
                    break
                await response.write(json.dumps(event).encode() + b"\n")
        except (ConnectionError, RuntimeError):
            pass
        finally:
            self._claim_watchers.remove(watcher)
        return response

    async def _stop(self) -> None:
        for _, queue in self._claim_watchers:
            queue.put_nowait(None)
        await super()._stop()

    async def _list_claims(self, request: web.Request) -> web.StreamResponse:
        """A list, with `labelSelector` of `key=value` terms (all must hold) and `limit`; or a
        watch (`_watch_claims`)."""
        if not self._authorized(request):
            return _status(401, "Unauthorized", "Unauthorized")
        if request.query.get("watch") in ("1", "true", "True"):
            return await self._watch_claims(request)
        terms = [term.partition("=") for term in
                 request.query.get("labelSelector", "").split(",") if term]
        if any(not key or not sep or value.startswith("=") for key, sep, value in terms):
            return _status(400, "BadRequest", "unable to parse requirement")
        found = [claim for claim in self.claims.values()
                 if all((claim["metadata"].get("labels") or {}).get(key) == value
                        for key, _, value in terms)]
        limit = int(request.query.get("limit", "0")) or len(found)
        return web.json_response({
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaimList",
            "metadata": {"resourceVersion": str(self._version),
                         **({"continue": "more"} if len(found) > limit else {})},
            "items": found[:limit]})

    async def _get_claim(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _status(401, "Unauthorized", "Unauthorized")
        self.claim_gets += 1
        claim = self.claims.get(request.match_info["name"])
        if claim is None:
            return _status(404, "NotFound", "sandboxclaims not found")
        return web.json_response(claim)

    async def _patch_claim(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _status(401, "Unauthorized", "Unauthorized")
        if request.content_type != "application/merge-patch+json":
            return _status(415, "UnsupportedMediaType", request.content_type)
        claim = self.claims.get(request.match_info["name"])
        if claim is None:
            return _status(404, "NotFound", "sandboxclaims not found")
        patch = await request.json()
        claim["spec"]["lifecycle"].update(patch["spec"]["lifecycle"])
        self._claim_changed("MODIFIED", claim)
        return web.json_response(claim)

    async def _delete_claim(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _status(401, "Unauthorized", "Unauthorized")
        name = request.match_info["name"]
        claim = self.claims.pop(name, None)
        if claim is None:
            return _status(404, "NotFound", "sandboxclaims not found")
        self._claim_changed("DELETED", claim)
        if (uid := self._pod_of.pop(name, None)) is not None and uid in self._pods:
            pod = self._pods[uid]
            self.sandboxes.pop(pod["metadata"]["name"], None)
            await self._kill(pod["metadata"]["name"])
            await self._change("DELETED", uid, pod)
        return web.json_response({"kind": "Status", "status": "Success"})

    async def _get_sandbox(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return _status(401, "Unauthorized", "Unauthorized")
        found = self.sandboxes.get(request.match_info["name"])
        if found is None:
            return _status(404, "NotFound", "sandboxes not found")
        return web.json_response(found)

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        if not self._authorized(request):
            return _status(401, "Unauthorized", "Unauthorized")
        name = request.match_info["name"]
        pod = next((p for p in self._pods.values() if p["metadata"]["name"] == name), None)
        if pod is None:
            return _status(404, "NotFound", f'pods "{name}" not found')
        command = request.query.getall("command", [])
        self.execs.append(list(command))
        ws = web.WebSocketResponse(protocols=("v4.channel.k8s.io",))
        await ws.prepare(request)
        if ws.ws_protocol != "v4.channel.k8s.io":
            await ws.close()
            return ws
        env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0].get("env", [])}
        process = await asyncio.create_subprocess_exec(
            "bwrap", "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid",
            "--unshare-net",
            "--bind", str(Path(self._home.name) / name), "/workspace", "--chdir", "/workspace",
            "--die-with-parent", "--clearenv",
            *itertools.chain.from_iterable(("--setenv", k, v) for k, v in env.items()),
            "--", *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        self._processes.setdefault(name, []).append(process)
        await ws.send_bytes(b"\x01")
        await ws.send_bytes(b"\x02")
        assert process.stdout is not None and process.stderr is not None
        pumps = [asyncio.ensure_future(self._out(process.stdout, 1, ws)),
                 asyncio.ensure_future(self._out(process.stderr, 2, ws)),
                 asyncio.ensure_future(self._in(ws, process))]
        code = await process.wait()
        await asyncio.gather(*pumps[:2], return_exceptions=True)
        pumps[2].cancel()
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.send_bytes(b"\x03" + json.dumps(_ended(code)).encode())
        await ws.close()
        return ws

    @staticmethod
    async def _out(stream: asyncio.StreamReader, channel: int, ws: web.WebSocketResponse) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            while data := await stream.read(1 << 16):
                await ws.send_bytes(bytes([channel]) + data)

    @staticmethod
    async def _in(ws: web.WebSocketResponse, process: asyncio.subprocess.Process) -> None:
        assert process.stdin is not None
        with contextlib.suppress(ConnectionError, RuntimeError):
            async for message in ws:
                if message.type is not WSMsgType.BINARY:
                    break
                if message.data[:1] == b"\x00":
                    process.stdin.write(message.data[1:])
                    await process.stdin.drain()
        with contextlib.suppress(ProcessLookupError):  # the client went: so does the exec
            process.kill()

    async def _kill(self, pod: str) -> None:
        for process in self._processes.pop(pod, []):
            with contextlib.suppress(ProcessLookupError):
                process.kill()


def _condition(ready: bool, reason: str) -> dict[str, Any]:
    return {"type": "Ready", "status": "True" if ready else "False", "reason": reason,
            "message": "", "lastTransitionTime": "2026-12-04T12:00:00Z"}


def _ended(code: int) -> dict[str, Any]:
    """The exec's end on channel 3, as the API server writes it."""
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": f"command terminated with non-zero exit code: exit status {code}",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]}}

