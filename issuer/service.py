"""`sealgate issuer serve`: the token issuer as an HTTP service (aiohttp).

    POST /v1/tokens   mint a token (callers authenticate; limits per docs/issuer.md)
    GET  /v1/keys     the public keys tokens are sealed to, newest first
    GET  /healthz     200 when keys, callers and the audit log are all in order, else 503

The service holds public keys only: it can seal tokens but never open one. Every mint attempt
is one audit line, without the secret, the API key or the token. Claims are validated by the
token module itself (`claims_from_object`), so the service cannot mint a token the proxy would
read differently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import re
import secrets
import signal
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Final, TypeVar

from aiohttp import web
from cryptography import x509

from sealgate import issuer as tk
from sealgate.audit import AuditLog
from sealgate.issuer import callers as cl
from sealgate.issuer import jsonfields, keys

__all__ = [
    "MAX_BODY_BYTES",
    "BadJson",
    "BodyTooLarge",
    "InvalidRequest",
    "Issuer",
    "MintRefused",
    "MissingField",
    "RateLimited",
    "ServeOptions",
    "Unauthenticated",
    "Unavailable",
    "UnknownField",
    "make_app",
    "serve",
    "tls_context",
]

MAX_BODY_BYTES: Final = 64 * 1024
_MAX_API_KEY: Final = 512
_REALM: Final = 'Bearer realm="sealgate-issuer"'
_BODY_FIELDS: Final = frozenset({"secret", "inject", "hosts", "methods", "paths", "ttl", "binding"})
_REQUIRED_FIELDS: Final = ("secret", "inject", "hosts", "ttl")
_OPTIONAL_CLAIMS: Final = ("methods", "paths", "binding")
_AUDIT_FIELDS: Final = ("caller", "remote", "kid", "hosts", "processor", "ttl", "binding", "jti")

_T = TypeVar("_T")
logger = logging.getLogger("sealgate.issuer")


# --- errors -----------------------------------------------------------------------------------


class MintRefused(Exception):
    """Why a mint request was refused. `reason` is the machine code, `status` the HTTP status.
    Messages never contain the secret or the API key."""

    reason: ClassVar[str] = "mint_refused"
    status: ClassVar[int] = 400

    def headers(self) -> Mapping[str, str]:
        return {}


class Unauthenticated(MintRefused):
    reason = "unauthenticated"
    status = 401

    def headers(self) -> Mapping[str, str]:
        return {"WWW-Authenticate": _REALM}


class RateLimited(MintRefused):
    reason = "rate_limited"
    status = 429

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"rate limit reached; retry in {retry_after} s")
        self.retry_after = retry_after

    def headers(self) -> Mapping[str, str]:
        return {"Retry-After": str(self.retry_after)}


class BodyTooLarge(MintRefused):
    reason = "body_too_large"
    status = 413


class BadJson(MintRefused):
    """Not UTF-8, not JSON, or not a JSON object (strict: no duplicate keys, no floats)."""

    reason = "bad_json"


class UnknownField(MintRefused):
    reason = "unknown_field"


class MissingField(MintRefused):
    reason = "missing_field"


class InvalidRequest(MintRefused):
    """A field's value breaks the token format's rules (the token module's own message)."""

    reason = "invalid_request"


class Unavailable(MintRefused):
    """The audit log cannot be written: no token is issued that nobody could account for."""

    reason = "audit_unavailable"
    status = 503


# --- state ------------------------------------------------------------------------------------


def _stamp(path: Path, suffix: str | None) -> object:
    """What changes when `path` (a file, or the `suffix` files in a directory) changes."""
    try:
        if suffix is None:
            info = path.stat()
            return (info.st_ino, info.st_mtime_ns, info.st_size)
        with os.scandir(path) as listing:
            return sorted(
                (entry.name, entry.stat().st_mtime_ns, entry.stat().st_size)
                for entry in listing
                if entry.name.endswith(suffix)
            )
    except OSError:
        return None


class Issuer:
    """Keys, callers, rate limits and the audit log: everything a mint needs but HTTP."""

    def __init__(
        self,
        keys_dir: Path,
        callers_path: Path,
        audit: AuditLog,
        *,
        clock: Callable[[], float] = time.time,
        rate_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keys_dir = keys_dir
        self.callers_path = callers_path
        self.audit = audit
        self._clock = clock
        self.limiter = cl.RateLimiter(rate_clock)
        # Problems of the last reload, by what failed; the previous state stays in force.
        self.problems: dict[str, str] = {}
        self._keys_stamp = _stamp(keys_dir, keys.PUBLIC_SUFFIX)
        self._callers_stamp = _stamp(callers_path, None)
        self.public_keys = self._load_keys()
        self.callers = cl.load_callers(callers_path)

    @property
    def current_key(self) -> keys.PublicKeyEntry:
        return self.public_keys[0]

    def _load_keys(self) -> tuple[keys.PublicKeyEntry, ...]:
        entries = keys.public_entries(self.keys_dir)
        if not entries:
            raise keys.NoKeysError(f"no public keys (*{keys.PUBLIC_SUFFIX}) in {self.keys_dir}")
        return tuple(keys.newest_first(entries))

    def reload(self, why: str) -> None:
        """Re-read the key directory and the callers file. What fails to load keeps its previous
        state, is logged, and makes /healthz answer 503 until a reload succeeds."""
        self._keys_stamp = _stamp(self.keys_dir, keys.PUBLIC_SUFFIX)
        self._callers_stamp = _stamp(self.callers_path, None)
        loaded = self._attempt("keys", why, self._load_keys, keys.KeyFileError)
        if loaded is not None:
            if loaded != self.public_keys:
                logger.info(
                    "issuer: keys reloaded (%s): sealing to %s, %d key(s)",
                    why,
                    loaded[0].kid,
                    len(loaded),
                )
            self.public_keys = loaded
        registry = self._attempt(
            "callers", why, lambda: cl.load_callers(self.callers_path), cl.CallersFileError
        )
        if registry is not None:
            self.callers = registry
            self.limiter.forget_except(registry.names)
            logger.info("issuer: callers reloaded (%s): %d caller(s)", why, len(registry))

    def _attempt(
        self, part: str, why: str, load: Callable[[], _T], expected: type[Exception]
    ) -> _T | None:
        """`load()`, or None with the previous state kept, the failure logged and /healthz
        answering 503 until a reload of `part` succeeds. An `expected` error says what is
        wrong; anything else is named by type only (its text could quote the file)."""
        try:
            loaded = load()
        except Exception as exc:
            problem = str(exc) if isinstance(exc, expected) else f"{type(exc).__name__} loading it"
            self.problems[part] = problem
            logger.error("issuer: keeping the previous %s (%s): %s", part, why, problem)
            return None
        self.problems.pop(part, None)
        return loaded

    def changed(self) -> bool:
        return (
            _stamp(self.keys_dir, keys.PUBLIC_SUFFIX) != self._keys_stamp
            or _stamp(self.callers_path, None) != self._callers_stamp
        )

    async def watch(self, interval: float) -> None:
        """Reload whenever the key directory or the callers file changes (polled), until
        cancelled."""
        while True:
            await asyncio.sleep(interval)
            try:
                if self.changed():
                    self.reload("files changed")
            except Exception as exc:
                # Keep watching: one odd failure must not silently end reloads for good.
                logger.error("issuer: reload failed with %s", type(exc).__name__)

    def authenticate(self, authorization: Sequence[str], subject: str | None) -> cl.Caller:
        """The caller named by `Authorization: Bearer <api key>` and/or the verified client
        certificate subject. Each credential presented must name a caller, and the same one."""
        found: list[cl.Caller | None] = []
        if len(authorization) > 1:
            raise Unauthenticated("send one Authorization header")
        if authorization:
            scheme, _, credential = authorization[0].strip().partition(" ")
            credential = credential.strip()
            if (
                scheme.lower() != "bearer"
                or not 0 < len(credential) <= _MAX_API_KEY
                or not (credential.isascii() and credential.isprintable())
            ):
                raise Unauthenticated("Authorization must be: Bearer <api key>")
            found.append(self.callers.by_api_key(credential))
        if subject is not None:
            found.append(self.callers.by_subject(subject))
        if not found:
            raise Unauthenticated("no credentials: send Authorization: Bearer <api key>")
        first = found[0]
        if first is None or any(caller is not first for caller in found):
            raise Unauthenticated("unknown credentials")
        return first

    def mint(
        self, caller: cl.Caller, body: bytes, record: dict[str, object]
    ) -> tuple[str, tk.Claims]:
        """Rate-limit, parse, validate and check `body` against `caller`'s limits, then seal.
        Fills the audit `record` with what it learns. Raises MintRefused or NotPermitted."""
        wait = self.limiter.acquire(caller)
        if wait > 0:
            raise RateLimited(max(1, math.ceil(wait)))
        request = _parse_body(body)
        key = self.current_key
        now = int(self._clock())
        claims = _claims(request, key.kid, now)
        record.update(
            kid=claims.kid,
            hosts=[_scrub(str(pattern), claims.secret) for pattern in claims.hosts],
            processor=claims.processor.kind,
            ttl=claims.exp - claims.iat,
            binding=cl.binding_kind(claims.binding),
            jti=claims.jti,
        )
        caller.check(claims, claims.exp - claims.iat)
        if not self.audit.healthy:
            raise Unavailable("the audit log cannot be written; not minting")
        try:
            token = tk.seal(claims, key)
        except tk.TokenError as exc:
            raise InvalidRequest(str(exc)) from None
        return token, claims


_ISSUER_KEY: Final = web.AppKey("issuer", Issuer)


# --- request body -----------------------------------------------------------------------------


def _parse_body(data: bytes) -> dict[str, object]:
    # Errors are raised outside the except blocks: a JSON decode error holds the whole document
    # (and so the secret) and must not ride along as __context__.
    problem = ""
    try:
        obj = jsonfields.load_json_object(data.decode("utf-8"))
    except UnicodeDecodeError:
        problem = "body is not UTF-8"
    except ValueError as exc:
        problem = f"body is not a valid JSON object: {exc}"
    if problem:
        raise BadJson(problem)
    if unknown := jsonfields.unknown(obj, _BODY_FIELDS):
        raise UnknownField(f"{unknown}; allowed: {', '.join(sorted(_BODY_FIELDS))}")
    if missing := jsonfields.missing(obj, _REQUIRED_FIELDS):
        raise MissingField(missing)
    return obj


def _ttl(value: object) -> int:
    if isinstance(value, str):
        try:
            return cl.parse_duration(value)
        except ValueError as exc:
            raise InvalidRequest(f"ttl: {exc}") from None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise InvalidRequest('ttl must be a duration like "15m" or a number of seconds')


def _claims(request: Mapping[str, object], kid: str, now: int) -> tk.Claims:
    ttl = _ttl(request["ttl"])
    if ttl <= 0:
        raise InvalidRequest("ttl must be more than 0")
    obj: dict[str, object] = {
        "version": tk.CLAIMS_VERSION,
        "kid": kid,
        "secret": request["secret"],
        "processor": request["inject"],
        "hosts": request["hosts"],
        "exp": now + ttl,
        "iat": now,
        "jti": secrets.token_urlsafe(12),
    }
    obj.update((name, request[name]) for name in _OPTIONAL_CLAIMS if name in request)
    try:
        return tk.claims_from_object(obj)
    except tk.TokenMalformed as exc:
        raise InvalidRequest(str(exc)) from None


def _scrub(text: str, secret: object) -> str:
    """Defence in depth: a secret pasted into another field would otherwise come back in the
    message or audit line about that field (lowercased, if it went in as a host name)."""
    if isinstance(secret, str) and len(secret) >= 4:
        return re.sub(re.escape(secret), "[redacted]", text, flags=re.IGNORECASE)
    return text


def _secret_of(body: bytes) -> object:
    try:
        return jsonfields.load_json_object(body.decode("utf-8")).get("secret")
    except ValueError:
        return None


# --- HTTP -------------------------------------------------------------------------------------


def _error(
    status: int, reason: str, detail: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.json_response(
        {"error": reason, "detail": detail},
        status=status,
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


async def _mint_handler(request: web.Request) -> web.Response:
    issuer = request.app[_ISSUER_KEY]
    # Every line has the same fields; those not known when a request is refused stay null.
    record: dict[str, object] = dict.fromkeys(_AUDIT_FIELDS)
    record["remote"] = request.remote
    body = b""
    try:
        caller = issuer.authenticate(
            request.headers.getall("Authorization", []), _peer_subject(request)
        )
        record["caller"] = caller.name
        body = await _read_body(request)
        token, claims = issuer.mint(caller, body, record)
    except (MintRefused, cl.NotPermitted) as exc:
        detail = _scrub(str(exc), _secret_of(body))
        headers = exc.headers() if isinstance(exc, MintRefused) else None
        issuer.audit.emit("mint", **record, outcome="refused", reason=exc.reason)
        return _error(exc.status, exc.reason, detail, headers)
    except Exception as exc:
        # The type only: an unexpected exception's text might hold request content.
        logger.error("issuer: mint failed with %s", type(exc).__name__)
        issuer.audit.emit("mint", **record, outcome="error", reason="internal_error")
        return _error(500, "internal_error", "the issuer failed; see its log")
    issuer.audit.emit("mint", **record, outcome="issued", reason=None)
    if not issuer.audit.healthy:
        # The line did not reach the file: withhold the token rather than issue it unrecorded.
        return _error(503, Unavailable.reason, "the audit log cannot be written; not minting")
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


async def _health_handler(request: web.Request) -> web.Response:
    issuer = request.app[_ISSUER_KEY]
    problems = dict(issuer.problems)
    if not issuer.audit.healthy:
        problems["audit"] = "the audit log cannot be written"
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


def make_app(issuer: Issuer, *, reload_interval: float = 2.0) -> web.Application:
    """The aiohttp application. With `reload_interval` > 0 it polls the key directory and the
    callers file that often and reloads on change."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[_ISSUER_KEY] = issuer
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


# --- serving ----------------------------------------------------------------------------------


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


async def serve(issuer: Issuer, options: ServeOptions) -> None:
    """Serve until SIGINT or SIGTERM; SIGHUP reloads keys and callers."""
    runner = web.AppRunner(
        make_app(issuer, reload_interval=options.reload_interval), access_log=None
    )
    await runner.setup()
    site = web.TCPSite(runner, options.host, options.port, ssl_context=options.ssl_context)
    await site.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, issuer.reload, "SIGHUP")
    scheme = "https" if options.ssl_context is not None else "http"
    for address in runner.addresses:
        host, port = address[:2]
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        logger.info("issuer: listening on %s://%s", scheme, shown)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
