"""A small Vault-API-compatible server for tests: what hvac asks, answered as Vault does.

Runs aiohttp in a background thread on 127.0.0.1 (port chosen by the OS). Covers
sys/health, token lookup-self/renew-self, KV v1 and v2 reads, AppRole and Kubernetes
login, with Vault's status codes and `{"errors": [...]}` bodies: 403 "permission denied"
for a token without access (ACL is checked before existence, as Vault does), 404
`{"errors": []}` for a missing secret, 503 "Vault is sealed".

Knobs, settable from the test thread at any time: `sealed`, `delay` (seconds before
answering), `drop` (close the connection without an answer), `down` (stop listening and
cut open connections; setting it back to False listens on the same port again).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import re
import secrets
import ssl
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from aiohttp import web

KV1_LEASE = 2764800  # Vault's default 768h refresh interval for KV v1 reads
VAULT_VERSION = "1.15.6"


@dataclass(slots=True)
class LoggedRequest:
    """Logged on arrival; `status` is filled in when answered (None: dropped or unanswered)."""

    method: str
    path: str  # below /v1/, e.g. "kv/data/ci/github"
    namespace: str
    token: str | None
    status: int | None = None


@dataclass(slots=True)
class _Token:
    token: str
    paths: tuple[str, ...]
    ttl: float  # 0: never expires
    renewable: bool
    max_renewals: int | None
    namespace: str
    policies: list[str]
    accessor: str = field(default_factory=lambda: secrets.token_hex(12))
    created: float = field(default_factory=time.time)
    expires_at: float | None = None
    renewals: int = 0
    meta: dict[str, str] | None = None
    write_paths: tuple[str, ...] = ()  # what it may also write (KV v2 create/update)

    def __post_init__(self) -> None:
        self.expires_at = time.monotonic() + self.ttl if self.ttl > 0 else None

    def remaining(self) -> float:
        if self.expires_at is None:
            return 0
        return round(max(0.0, self.expires_at - time.monotonic()), 3)

    def expired(self) -> bool:
        return self.expires_at is not None and time.monotonic() >= self.expires_at


@dataclass(frozen=True, slots=True)
class _TokenTemplate:
    """What a login hands out."""

    paths: tuple[str, ...]
    ttl: float
    renewable: bool
    max_renewals: int | None
    namespace: str


@dataclass(slots=True)
class _Version:
    data: dict[str, Any]
    created: str


def _now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")


def _envelope(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "request_id": str(uuid.uuid4()),
        "lease_id": "",
        "renewable": False,
        "lease_duration": 0,
        "data": None,
        "wrap_info": None,
        "warnings": None,
        "auth": None,
    }
    body.update(overrides)
    return body


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    # Exactly Vault's header: hvac reads `errors` only when it is this, without charset.
    return web.Response(
        body=json.dumps(body).encode(),
        status=status,
        headers={"Content-Type": "application/json"},
    )


def _errors(status: int, *messages: str) -> web.Response:
    return _json({"errors": list(messages)}, status)


class VaultFake:
    def __init__(self, *, ssl_context: ssl.SSLContext | None = None) -> None:
        self.sealed = False
        self.delay = 0.0
        self.drop = False
        # Every token refused as expired, the ones logins hand out included (a Vault whose
        # clock or token store has gone wrong): a client must give up, not log in forever.
        self.refuse_tokens = False
        self._ssl = ssl_context
        self._lock = threading.RLock()  # _route holds it while issuing tokens
        self._log: list[LoggedRequest] = []
        self._tokens: dict[str, _Token] = {}
        self._mounts: dict[tuple[str, str], int] = {}  # (namespace, mount) -> KV version
        self._kv: dict[tuple[str, str, str], list[_Version]] = {}
        self._approles: dict[str, dict[str, tuple[str, _TokenTemplate]]] = {}
        self._k8s: dict[str, dict[str, tuple[frozenset[str], _TokenTemplate]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._port = 0
        self._down = False
        self.writes: list[tuple[str, dict[str, Any]]] = []  # KV v2 writes: (API path, data)

    # -- lifecycle -----------------------------------------------------------------

    def __enter__(self) -> VaultFake:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="vaultfake", daemon=True
        )
        self._thread.start()
        self._run(self._start())

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        self._run(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()
        self._loop = None

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        # Handlers still sleeping on `delay` outlive cleanup; end them before the loop.
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    @property
    def url(self) -> str:
        return f"{'https' if self._ssl else 'http'}://127.0.0.1:{self._port}"

    @property
    def down(self) -> bool:
        return self._down

    @down.setter
    def down(self, value: bool) -> None:
        if value != self._down:
            self._run(self._stop_listening() if value else self._listen())
            self._down = value

    def _run(self, coro: Any) -> Any:
        assert self._loop is not None, "VaultFake is not started"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        await self._listen()

    async def _listen(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(
            self._runner, "127.0.0.1", self._port, ssl_context=self._ssl, reuse_address=True
        )
        await self._site.start()
        self._port = self._site.port

    async def _stop_listening(self) -> None:
        assert self._site is not None and self._runner is not None
        await self._site.stop()
        # Closing the listener keeps established keep-alive connections; cut them too.
        server = self._runner.server
        assert server is not None
        for conn in server.connections:
            conn.force_close()

    # -- configuration (test thread) -------------------------------------------------

    def add_token(
        self,
        token: str | None = None,
        *,
        paths: Iterable[str] = (),
        ttl: float = 0,
        renewable: bool = True,
        max_renewals: int | None = None,
        namespace: str = "",
        write_paths: Iterable[str] = (),
    ) -> str:
        """Create a token allowed to read `paths` (API paths, `*` globs, `+` = segment) and to
        write those of them in `write_paths`."""
        template = _TokenTemplate(tuple(paths), ttl, renewable, max_renewals, namespace)
        record = self._issue(template, token)
        record.write_paths = tuple(write_paths)
        return record.token

    def revoke(self, token: str) -> None:
        with self._lock:
            self._tokens.pop(token, None)

    def expire(self, token: str) -> None:
        """End a token's life now, as its TTL would (the client was told a longer one)."""
        with self._lock:
            self._tokens[token].expires_at = time.monotonic()

    def add_kv_mount(self, mount: str, *, version: int = 2, namespace: str = "") -> None:
        with self._lock:
            self._mounts[(namespace, mount.strip("/"))] = version

    def put(self, path: str, data: Mapping[str, Any], *, namespace: str = "") -> int:
        """Write `data` at logical path `mount/secret` (no `data/`); returns the version."""
        mount, rest = self._split_mount(namespace, path.strip("/"))
        if mount is None or not rest:
            raise KeyError(f"no KV mount for {path!r} in namespace {namespace!r}")
        with self._lock:
            versions = self._kv.setdefault((namespace, mount, rest), [])
            if self._mounts[(namespace, mount)] == 1:
                versions.clear()
            versions.append(_Version(dict(data), _now_iso()))
            return len(versions)

    def add_approle(
        self,
        role_id: str,
        secret_id: str,
        *,
        paths: Iterable[str] = (),
        ttl: float = 0,
        renewable: bool = True,
        max_renewals: int | None = None,
        namespace: str = "",
        mount: str = "approle",
    ) -> None:
        template = _TokenTemplate(tuple(paths), ttl, renewable, max_renewals, namespace)
        with self._lock:
            self._approles.setdefault(mount, {})[role_id] = (secret_id, template)

    def add_kubernetes_role(
        self,
        role: str,
        jwts: Iterable[str],
        *,
        paths: Iterable[str] = (),
        ttl: float = 0,
        renewable: bool = True,
        max_renewals: int | None = None,
        namespace: str = "",
        mount: str = "kubernetes",
    ) -> None:
        template = _TokenTemplate(tuple(paths), ttl, renewable, max_renewals, namespace)
        with self._lock:
            self._k8s.setdefault(mount, {})[role] = (frozenset(jwts), template)

    # -- assertions ----------------------------------------------------------------------

    @property
    def requests(self) -> list[LoggedRequest]:
        with self._lock:
            return list(self._log)

    def count(self, path: str, method: str | None = None) -> int:
        return sum(
            1 for r in self.requests if r.path == path and (method is None or r.method == method)
        )

    def live_tokens(self) -> list[str]:
        with self._lock:
            return [t.token for t in self._tokens.values() if not t.expired()]

    # -- request handling ------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path.removeprefix("/v1/") if request.path.startswith("/v1/") else ""
        namespace = request.headers.get("X-Vault-Namespace", "").strip("/")
        token = request.headers.get("X-Vault-Token")
        entry = LoggedRequest(request.method, path, namespace, token)
        with self._lock:
            self._log.append(entry)
        if self.drop:
            assert request.transport is not None
            request.transport.abort()
            raise web.HTTPException()  # never sent: the transport is gone
        if self.delay:
            await asyncio.sleep(self.delay)
        body: dict[str, Any] = {}
        if request.can_read_body:
            try:
                body = await request.json()
            except ValueError:
                body = {}
        with self._lock:
            response = self._route(request.method, path, namespace, token, body)
            entry.status = response.status
        return response

    def _route(
        self, method: str, path: str, ns: str, token: str | None, body: dict[str, Any]
    ) -> web.Response:
        if path == "sys/health" and method in ("GET", "HEAD"):
            return self._health()
        if self.sealed:
            return _errors(503, "Vault is sealed")
        parts = path.split("/")
        if method in ("POST", "PUT") and len(parts) == 3 and parts[0] == "auth":
            if parts[2] == "login" and parts[1] in self._approles:
                return self._approle_login(parts[1], body)
            if parts[2] == "login" and parts[1] in self._k8s:
                return self._k8s_login(parts[1], body)
        record = self._tokens.get(token or "")
        if record is None or record.expired() or record.namespace != ns or self.refuse_tokens:
            return _errors(403, "permission denied")
        if path == "auth/token/lookup-self" and method == "GET":
            return self._lookup_self(record)
        if path == "auth/token/renew-self" and method in ("POST", "PUT"):
            return self._renew_self(record, body)
        if method == "GET":
            mount, rest = self._split_mount(ns, path)
            if mount is not None:
                return self._kv_read(record, ns, mount, rest, path)
        if method in ("POST", "PUT"):
            mount, rest = self._split_mount(ns, path)
            if mount is not None and self._mounts[(ns, mount)] == 2 and rest.startswith("data/"):
                return self._kv2_write(record, ns, mount, rest.removeprefix("data/"), path, body)
        return _errors(404, f'no handler for route "{path}". route entry not found.')

    def _health(self) -> web.Response:
        status = 503 if self.sealed else 200
        return _json(
            {
                "initialized": True,
                "sealed": self.sealed,
                "standby": False,
                "performance_standby": False,
                "replication_performance_mode": "disabled",
                "replication_dr_mode": "disabled",
                "server_time_utc": int(time.time()),
                "version": VAULT_VERSION,
                "cluster_name": "vault-cluster-fake",
                "cluster_id": "00000000-0000-0000-0000-000000000000",
            },
            status=status,
        )

    def _split_mount(self, ns: str, path: str) -> tuple[str | None, str]:
        segments = path.split("/")
        for cut in range(len(segments), 0, -1):
            mount = "/".join(segments[:cut])
            if (ns, mount) in self._mounts:
                return mount, "/".join(segments[cut:])
        return None, path

    def _kv_read(
        self, record: _Token, ns: str, mount: str, rest: str, api_path: str
    ) -> web.Response:
        if not _allowed(record.paths, api_path):
            return _errors(403, "permission denied")
        version = self._mounts[(ns, mount)]
        if version == 2:
            if not rest.startswith("data/"):
                return _errors(404, f'no handler for route "{api_path}". route entry not found.')
            rest = rest.removeprefix("data/")
        versions = self._kv.get((ns, mount, rest))
        if not versions:
            return _errors(404)
        latest = versions[-1]
        if version == 1:
            return _json(_envelope(lease_duration=KV1_LEASE, data=dict(latest.data)))
        metadata = {
            "created_time": latest.created,
            "custom_metadata": None,
            "deletion_time": "",
            "destroyed": False,
            "version": len(versions),
        }
        return _json(_envelope(data={"data": dict(latest.data), "metadata": metadata}))

    def _kv2_write(self, record: _Token, ns: str, mount: str, rest: str, api_path: str,
                   body: dict[str, Any]) -> web.Response:
        """KV v2's create-or-update, with check-and-set as Vault does it: `options.cas` must be
        the current version (0: the secret must not exist yet), else 400."""
        if not _allowed(record.paths, api_path) or not _allowed(record.write_paths, api_path):
            return _errors(403, "permission denied")
        data = body.get("data")
        if not isinstance(data, dict):
            return _errors(400, "no data provided")
        versions = self._kv.setdefault((ns, mount, rest), [])
        cas = (body.get("options") or {}).get("cas")
        if cas is not None and cas != len(versions):
            return _errors(400, "check-and-set parameter did not match the current version")
        versions.append(_Version(dict(data), _now_iso()))
        self.writes.append((api_path, dict(data)))
        return _json(_envelope(data={"created_time": versions[-1].created, "version":
                                     len(versions), "destroyed": False, "deletion_time": ""}))

    def _lookup_self(self, record: _Token) -> web.Response:
        created = int(record.created)
        expire = (
            dt.datetime.fromtimestamp(record.created + record.ttl, dt.UTC).isoformat()
            if record.ttl
            else None
        )
        data = {
            "accessor": record.accessor,
            "creation_time": created,
            "creation_ttl": record.ttl,
            "display_name": "token",
            "entity_id": "",
            "expire_time": expire,
            "explicit_max_ttl": 0,
            "id": record.token,
            "issue_time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(),
            "meta": record.meta,
            "num_uses": 0,
            "orphan": True,
            "path": "auth/token/create",
            "policies": record.policies,
            "renewable": record.renewable,
            "ttl": record.remaining(),
            "type": "service",
        }
        return _json(_envelope(data=data))

    def _renew_self(self, record: _Token, body: dict[str, Any]) -> web.Response:
        if not record.renewable:
            return _errors(400, "lease is not renewable")
        if record.max_renewals is not None and record.renewals >= record.max_renewals:
            # Past its max TTL the token is gone, and Vault says only this:
            del self._tokens[record.token]
            return _errors(403, "permission denied")
        record.renewals += 1
        increment = body.get("increment")
        ttl = float(increment) if isinstance(increment, int | float) else record.ttl
        record.expires_at = time.monotonic() + ttl if ttl > 0 else None
        return _json(_envelope(auth=self._auth_block(record)))

    def _approle_login(self, mount: str, body: dict[str, Any]) -> web.Response:
        entry = self._approles[mount].get(str(body.get("role_id")))
        if entry is None or entry[0] != body.get("secret_id"):
            return _errors(400, "invalid role or secret ID")
        record = self._issue(entry[1], meta={"role_name": "sealgate"})
        return _json(_envelope(auth=self._auth_block(record)))

    def _k8s_login(self, mount: str, body: dict[str, Any]) -> web.Response:
        role = str(body.get("role"))
        entry = self._k8s[mount].get(role)
        if entry is None:
            return _errors(400, f'invalid role name "{role}"')
        if body.get("jwt") not in entry[0]:
            return _errors(403, "permission denied")
        record = self._issue(entry[1], meta={"role": role})
        return _json(_envelope(auth=self._auth_block(record)))

    def _issue(
        self,
        template: _TokenTemplate,
        token: str | None = None,
        *,
        meta: dict[str, str] | None = None,
    ) -> _Token:
        record = _Token(
            token=token or f"hvs.{secrets.token_urlsafe(18)}",
            paths=template.paths,
            ttl=template.ttl,
            renewable=template.renewable,
            max_renewals=template.max_renewals,
            namespace=template.namespace,
            policies=["default", "sealgate-reader"],
            meta=meta,
        )
        with self._lock:
            self._tokens[record.token] = record
        return record

    @staticmethod
    def _auth_block(record: _Token) -> dict[str, Any]:
        return {
            "client_token": record.token,
            "accessor": record.accessor,
            "policies": record.policies,
            "token_policies": record.policies,
            "metadata": record.meta,
            "lease_duration": record.ttl,
            "renewable": record.renewable,
            "entity_id": "",
            "token_type": "service",
            "orphan": True,
            "mfa_requirement": None,
            "num_uses": 0,
        }


def _allowed(patterns: Iterable[str], path: str) -> bool:
    """Vault ACL path matching: a trailing `*` is a prefix glob, a `+` segment any one."""
    return any(_acl_regex(p).fullmatch(path) for p in patterns)


def _acl_regex(pattern: str) -> re.Pattern[str]:
    glob = pattern.endswith("*")
    body = pattern[:-1] if glob else pattern
    parts = ["[^/]+" if seg == "+" else re.escape(seg) for seg in body.split("/")]
    return re.compile("/".join(parts) + (".*" if glob else ""))


def self_signed_tls(directory: Path) -> tuple[ssl.SSLContext, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1: (server context, CA file)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vaultfake test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_file = directory / "vault-ca.pem"
    ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_file = directory / "vault-cert.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file = directory / "vault-key.pem"
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context, ca_file
