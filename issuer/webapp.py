"""`sealgate issuer serve`: the token issuer as an HTTP service (aiohttp).

    POST /v1/tokens   mint a token (callers authenticate; limits per docs/issuer.md)
    GET  /v1/keys     the public keys tokens are sealed to, newest first
    GET  /healthz     200 when keys, callers and the audit log are all in order, else 503

and on the admin listener (`--admin HOST:PORT`, off the service port, as every component has
one: docs/operations.md): `GET /healthz` 200 `{"ok": true}` while the process answers, and
`GET /readyz` 200 `{"ready": true}` or 503 `{"ready": false, "unready": [...]}` (a key
directory or callers file whose last reload failed, an audit log that cannot be written, or
stopping), and `GET /metrics`: tokens minted by caller and processor, refusals by reason, in
Prometheus' text format.

What a mint does is `service.Issuer`'s; this module is the routes, TLS and serving. Every mint
attempt is one audit line, without the secret, the API key or the token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from aiohttp import web
from cryptography import x509
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    disable_created_metrics,
    generate_latest,
)

from sealgate import credentials as tk
from sealgate import oplog
from sealgate.credentials import keys
from sealgate.hostport import format_hostport
from sealgate.reasons import Reason

from . import callers as cl
from .mintrequest import BodyTooLarge, MintRefused, Unavailable, scrub, secret_of
from .service import Issuer

__all__ = ["MAX_BODY_BYTES", "ServeOptions", "make_app", "serve", "tls_context"]

MAX_BODY_BYTES: Final = 64 * 1024
_AUDIT_FIELDS: Final = ("request_id", "caller", "remote", "kid", "hosts", "processor", "ttl",
                        "binding", "jti")
_ISSUER_KEY: Final = web.AppKey("issuer", Issuer)

logger = logging.getLogger("sealgate.issuer")


def _error(
    reason: Reason, detail: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.json_response(
        {"error": reason, "detail": detail},
        status=reason.status,
        headers={"Cache-Control": "no-store", **(headers or {})},
    )


def _peer_subject(request: web.Request) -> str | None:
    """The verified client certificate's subject (RFC 4514), if the client presented one."""
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    if not isinstance(ssl_object, ssl.SSLObject | ssl.SSLSocket):
        return None
    der = ssl_object.getpeercert(binary_form=True)
    if not der:
        return None
    return x509.load_der_x509_certificate(der).subject.rfc4514_string()


async def _read_body(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BodyTooLarge(f"body is larger than {MAX_BODY_BYTES} bytes") from None


# A `_created` gauge beside every counter says when the process started, which the scrape's
# own process metrics would say once; the issuer serves only its own families.
disable_created_metrics()  # type: ignore[no-untyped-call]


class Mints:
    """The mint counters: callers and processors are the issuer's own configuration (a callers
    file, the processor kinds), reasons the enum's: no label takes a request's text."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.issued = Counter("sealgate_issuer_tokens_minted", "Tokens minted, by caller and "
                              "processor.", ["caller", "processor"], registry=self.registry)
        self.refused = Counter("sealgate_issuer_refusals", "Mints refused or failed, by reason.",
                               ["reason"], registry=self.registry)

    def count(self, record: Mapping[str, object], reason: str | None) -> None:
        if reason is None:
            self.issued.labels(str(record["caller"]), str(record["processor"])).inc()
        else:
            self.refused.labels(reason).inc()


_METRICS_KEY: Final = web.AppKey("metrics", Mints)


async def _mint_handler(request: web.Request) -> web.Response:
    # Every line has the same fields; those not known when a request is refused stay null. The
    # request id is on its audit line and on every log line about it, as the proxy's are.
    record: dict[str, object] = dict.fromkeys(_AUDIT_FIELDS)
    record["request_id"] = str(uuid.uuid4())
    record["remote"] = request.remote
    with oplog.bound(request_id=record["request_id"]):
        return await _mint(request, record)


async def _mint(request: web.Request, record: dict[str, object]) -> web.Response:
    issuer = request.app[_ISSUER_KEY]
    mints = request.app[_METRICS_KEY]
    body = b""
    try:
        caller = issuer.authenticate(
            request.headers.getall("Authorization", []), _peer_subject(request)
        )
        record["caller"] = caller.name
        body = await _read_body(request)
        token, claims = issuer.mint(caller, body, record)
    except (MintRefused, cl.NotPermitted) as exc:
        detail = scrub(str(exc), secret_of(body))
        headers = exc.headers() if isinstance(exc, MintRefused) else None
        issuer.audit.emit("mint", **record, outcome="refused", reason=exc.reason)
        logger.info("mint refused", extra={"caller": record["caller"], "reason": exc.reason})
        mints.count(record, exc.reason)
        return _error(exc.reason, detail, headers)
    except Exception as exc:
        # The type only: an unexpected exception's text might hold request content.
        logger.error("mint failed", extra={"caller": record["caller"],
                                           "error_type": type(exc).__name__})
        issuer.audit.emit("mint", **record, outcome="error", reason=Reason.INTERNAL_ERROR)
        mints.count(record, Reason.INTERNAL_ERROR)
        return _error(Reason.INTERNAL_ERROR, "the issuer failed; see its log")
    issuer.audit.emit("mint", **record, outcome="issued", reason=None)
    if not issuer.audit.healthy:
        # The line did not reach the file: withhold the token rather than issue it unrecorded.
        mints.count(record, Unavailable.reason)
        return _error(Unavailable.reason, "the audit log cannot be written; not minting")
    mints.count(record, None)
    return web.json_response(
        {
            "token": token,
            "kid": claims.kid,
            "exp": claims.exp,
            "claims": tk.redacted_claims(claims),
        },
        headers={"Cache-Control": "no-store"},
    )


async def _keys_handler(request: web.Request) -> web.Response:
    issuer = request.app[_ISSUER_KEY]
    return web.json_response(
        {
            "current": issuer.current_key.kid,
            "keys": [
                {
                    "format": keys.PUBLIC_FORMAT,
                    "kid": entry.kid,
                    "created": keys.format_time(entry.created),
                    "public_key": entry.public_key.hex(),
                }
                for entry in issuer.public_keys
            ],
        }
    )


def _problems(issuer: Issuer) -> dict[str, str]:
    problems = dict(issuer.problems)
    if not issuer.audit.healthy:
        problems["audit"] = "the audit log cannot be written"
    return problems


async def _health_handler(request: web.Request) -> web.Response:
    issuer = request.app[_ISSUER_KEY]
    problems = _problems(issuer)
    return web.json_response(
        {
            "ok": not problems,
            "kid": issuer.current_key.kid,
            "keys": len(issuer.public_keys),
            "callers": len(issuer.callers),
            "problems": problems,
        },
        status=200 if not problems else 503,
    )


def make_app(issuer: Issuer, *, reload_interval: float = 2.0,
             mints: Mints | None = None) -> web.Application:
    """The aiohttp application. With `reload_interval` > 0 it polls the key directory and the
    callers file that often and reloads on change."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[_ISSUER_KEY] = issuer
    app[_METRICS_KEY] = mints or Mints()
    app.router.add_post("/v1/tokens", _mint_handler)
    app.router.add_get("/v1/keys", _keys_handler)
    app.router.add_get("/healthz", _health_handler)
    if reload_interval > 0:

        async def watcher(_: web.Application) -> AsyncIterator[None]:
            task = asyncio.create_task(issuer.watch(reload_interval))
            yield
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        app.cleanup_ctx.append(watcher)
    return app


def make_admin_app(issuer: Issuer, stopping: asyncio.Event, mints: Mints) -> web.Application:
    """The admin listener's app: liveness, readiness and metrics, nothing of the service."""
    app = web.Application(client_max_size=1024)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(mints.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(_: web.Request) -> web.Response:
        unready = ["stopping"] if stopping.is_set() else [
            f"{part}: {problem}" for part, problem in sorted(_problems(issuer).items())]
        if unready:
            return web.json_response({"ready": False, "unready": unready}, status=503)
        return web.json_response({"ready": True})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    return app


def tls_context(cert: Path, key: Path, client_ca: Path | None) -> ssl.SSLContext:
    """Server TLS; with `client_ca`, client certificates are requested and, when presented,
    must chain to it (callers without one can still use an API key)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


@dataclass(frozen=True)
class ServeOptions:
    host: str
    port: int
    ssl_context: ssl.SSLContext | None = None
    reload_interval: float = 2.0
    admin: tuple[str, int] | None = None  # /healthz and /readyz over plain HTTP


async def serve(issuer: Issuer, options: ServeOptions) -> None:
    """Serve until SIGINT or SIGTERM; SIGHUP reloads keys and callers."""
    mints = Mints()
    runner = web.AppRunner(
        make_app(issuer, reload_interval=options.reload_interval, mints=mints), access_log=None
    )
    await runner.setup()
    site = web.TCPSite(runner, options.host, options.port, ssl_context=options.ssl_context)
    await site.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    admin: web.AppRunner | None = None
    if options.admin is not None:
        admin = web.AppRunner(make_admin_app(issuer, stop, mints), access_log=None)
        await admin.setup()
        try:
            await web.TCPSite(admin, *options.admin).start()
        except OSError:
            await admin.cleanup()
            await runner.cleanup()
            raise
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, issuer.reload, "SIGHUP")
    scheme = "https" if options.ssl_context is not None else "http"
    for address in runner.addresses:
        logger.info("listening", extra={"url": f"{scheme}://{format_hostport(*address[:2])}"})
    for address in admin.addresses if admin is not None else ():
        logger.info("admin listening",
                    extra={"url": f"http://{format_hostport(*address[:2])}"})
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        # The service first (its requests in flight finish), readiness saying "stopping" on
        # the admin listener meanwhile; then the admin listener.
        await runner.cleanup()
        if admin is not None:
            await admin.cleanup()
