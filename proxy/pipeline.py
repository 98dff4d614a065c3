"""sealgate's mitmproxy addon: every request's path, top to bottom, in one place.

    identify -> guard (names) -> authorise (policy) -> budget -> guard (addresses, pinned)
             -> inject -> forward -> scrub -> log

`sealgate proxy` loads it into a lean master; `mitmdump -s proxy/addon.py` loads it into an
existing mitmproxy. The concerns live in their own modules
(identity, guard, policy, budget, audit); this class only strings them together on mitmproxy's
hooks, doing the per-request work in as few hooks as it can.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mitmproxy import connection, ctx, exceptions, http, tls
from mitmproxy.addonmanager import Loader
from mitmproxy.proxy import layer, mode_specs, server_hooks

from sealgate.audit import AuditLog
from sealgate.hostname import Host, HostError, canonical_host
from sealgate.issuer import TokenError
from sealgate.issuer.keys import KeyFileError, Keyring
from sealgate.proxy import layers
from sealgate.proxy.budget import BudgetLedger
from sealgate.proxy.credentials.broker import Broker
from sealgate.proxy.credentials.inject import (
    Credential,
    Injected,
    put,
    write,
)
from sealgate.proxy.credentials.scrub import Scrubber, Undecodable, decode_whole, decoder
from sealgate.proxy.credentials.secrets import SecretBroker, SecretError, open_store
from sealgate.proxy.credentials.tokenizer import HEADER as TOKEN_HEADER
from sealgate.proxy.credentials.tokenizer import Tokenizer, TokenRequest
from sealgate.proxy.errors import Denial, deny_response
from sealgate.proxy.identity import Identifier, Identity
from sealgate.proxy.net import guard as guardmod
from sealgate.proxy.net.guard import Guard, Pin
from sealgate.proxy.net.resolver import Resolver
from sealgate.proxy.policy.decide import Decision, Question, decide, policy_for
from sealgate.proxy.policy.model import PathError, Policy, Rule, RuleSet, normalize_path
from sealgate.proxy.policy.rulesfile import RulesError, load_rules
from sealgate.proxy.registry import SourceRegistry
from sealgate.reasons import Reason

logger = logging.getLogger("sealgate")

_META = "sealgate"
_SCRUB = "sealgate_scrub"
_PENDING = "sealgate_pending"
_STREAM_OVER = 1024 * 1024  # bodies larger than this (or of unknown length) are streamed
_NONE: frozenset[bytes] = frozenset()
_TOKEN_KEY = frozenset({TOKEN_HEADER.encode()})  # removed from requests that carry tokens
_RELOAD_POLL_SECONDS = 1.0


@dataclass(slots=True)
class Conn:
    """What a client connection has established so far."""

    opened: float = field(default_factory=time.monotonic)
    identity: Identity | None = None
    policy: Policy | None = None
    budget_key: str | None = None
    target: tuple[Host, int] | None = None  # the CONNECT authority, or a transparent SNI
    tunnel: bool = False  # forwarded without interception
    # A refusal decided during the TLS handshake. mitmproxy cannot drop a connection from
    # tls_clienthello, so the connection is intercepted and every request on it gets this.
    blocked: Denial | None = None
    proxy_auth: list[str] = field(default_factory=list)  # the CONNECT's, for token bindings
    requests: int = 0
    denied: int = 0


@dataclass(slots=True)
class Verdict:
    """One request's decision, carried on the flow until the audit line is written."""

    started: float
    identity: Identity | None = None
    policy: str | None = None
    host: str | None = None
    port: int | None = None
    path: str | None = None
    decision: str = "deny"
    reason: str | None = None
    rule: str | None = None
    pin: Pin | None = None
    injected: list[str] = field(default_factory=list)
    overwrote: list[str] = field(default_factory=list)


class Sealgate:
    def __init__(self) -> None:
        self.rules: RuleSet | None = None
        self.rules_stamp: tuple[float, ...] = ()
        self.identifier: Identifier | None = None
        self.guard: Guard | None = None
        self.audit: AuditLog | None = None
        self.budgets = BudgetLedger()
        self.broker: Broker | None = None
        self.tokenizer: Tokenizer | None = None
        self.conns: dict[str, Conn] = {}
        self._pinned: dict[str, tuple[str, int]] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._ssl_insecure = False  # mitmproxy's option, read per injected request

    # -- set-up ---------------------------------------------------------------------------

    def load(self, loader: Loader) -> None:
        loader.add_option("sealgate_rules", str, "rules", "Rules file or directory.")
        loader.add_option(
            "sealgate_state", str, "var", "State directory: source registry, audit log."
        )
        loader.add_option(
            "sealgate_resolver",
            str | None,  # type: ignore[arg-type]
            None,
            "DNS server (HOST:PORT) the guard resolves with; default: the system's nameservers.",
        )
        loader.add_option(
            "sealgate_sandbox_networks",
            Sequence[str],
            list(guardmod.DEFAULT_SANDBOX_NETWORKS),
            "Sandbox address ranges (CIDR), never reachable through the proxy whatever a "
            "policy's allow_networks say; default the sandbox runtime's.",
        )
        loader.add_option(
            "sealgate_audit_log",
            str | None,  # type: ignore[arg-type]
            None,
            "Audit log file; default <state>/audit.log. 'off' disables the file sink.",
        )
        loader.add_option("sealgate_audit_stdout", bool, False, "Also write audit lines to stdout.")
        loader.add_option(
            "sealgate_workers", int, 1, "Worker processes sharing the listen port (budget share)."
        )
        loader.add_option(
            "sealgate_token_keys",
            str | None,  # type: ignore[arg-type]
            None,
            "Directory of the proxy's private token keys (<kid>.key); unset: tokens refused.",
        )
        loader.add_option(
            "sealgate_secret_stores",
            Sequence[str],
            [],
            "Secret store URLs for brokered credentials (file:PATH, env:, vault:https://…); "
            "default file:<state>/secrets.yaml.",
        )
        loader.add_option(
            "sealgate_secret_ttl", int, 300, "Seconds a fetched secret is reused."
        )
        loader.add_option(
            "sealgate_secret_grace",
            int,
            30,
            "Seconds a cached secret may still be used while its store is unreachable; "
            "past it requests fail closed with 503 secret_unavailable.",
        )

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        if {"sealgate_secret_stores", "sealgate_state", "sealgate_secret_ttl",
                "sealgate_secret_grace"} & updated:
            default_store = f"file:{Path(opts.sealgate_state) / 'secrets.yaml'}"
            urls = opts.sealgate_secret_stores or [default_store]
            try:
                stores = [open_store(url) for url in urls]
                self.broker = Broker(
                    SecretBroker(
                        stores, ttl=opts.sealgate_secret_ttl,
                        stale_grace=opts.sealgate_secret_grace,
                    )
                )
            except SecretError as exc:
                raise exceptions.OptionsError(f"sealgate: secret stores: {exc}") from exc
        if "sealgate_token_keys" in updated:
            self.tokenizer = None
            if opts.sealgate_token_keys:
                try:
                    self.tokenizer = Tokenizer(Keyring.load(Path(opts.sealgate_token_keys)))
                except KeyFileError as exc:
                    raise exceptions.OptionsError(f"sealgate: token keys: {exc}") from exc
        if {"sealgate_rules", "sealgate_secret_stores", "sealgate_state"} & updated:
            try:
                self._load_rules(Path(opts.sealgate_rules))
            except RulesError as exc:
                raise exceptions.OptionsError(f"sealgate: cannot load rules: {exc}") from exc
        if {"sealgate_state", "sealgate_audit_log", "sealgate_audit_stdout"} & updated:
            state = Path(opts.sealgate_state)
            if self.audit is not None:
                self.audit.close()
            log_opt = opts.sealgate_audit_log
            log_path = None if log_opt == "off" else Path(log_opt or state / "audit.log")
            self.audit = AuditLog(log_path, stdout=opts.sealgate_audit_stdout, batch=True)
        if {"sealgate_resolver", "sealgate_sandbox_networks", "mode", "listen_host",
                "listen_port"} & updated:
            try:
                resolver = Resolver.from_spec(opts.sealgate_resolver)
            except ValueError as exc:
                raise exceptions.OptionsError(f"sealgate: resolver: {exc}") from exc
            try:
                self.guard = Guard(resolver, _listen_endpoints(), opts.sealgate_sandbox_networks)
            except (ValueError, OSError) as exc:
                raise exceptions.OptionsError(f"sealgate: guard: {exc}") from exc
        if "ssl_insecure" in updated:
            self._ssl_insecure = bool(opts.ssl_insecure)
        if "sealgate_workers" in updated:
            self.budgets = BudgetLedger(share=opts.sealgate_workers)

    def running(self) -> None:
        # The first line proves the sink works before any traffic is accepted.
        self._emit("proxy_started", pid=os.getpid(), rules=[str(p) for p in self._rules().sources])
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, self.reload)
        self._watcher = loop.create_task(self._watch_rules())

    async def done(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
        if self.broker is not None:
            await self.broker.close()
        if self.audit is not None:
            self.audit.close()

    def reload(self) -> None:
        """Re-read the rules and token keys; a broken file keeps what is in force and says why."""
        if ctx.options.sealgate_token_keys:
            try:
                self.tokenizer = Tokenizer(Keyring.load(Path(ctx.options.sealgate_token_keys)))
            except KeyFileError as exc:
                logger.error("sealgate: token keys reload failed, keeping the previous: %s", exc)
        try:
            self._load_rules(Path(ctx.options.sealgate_rules))
        except RulesError as exc:
            logger.error("sealgate: rules reload failed, keeping the previous rules: %s", exc)
            self._emit("rules_reload_failed", error=str(exc))
        else:
            self._emit("rules_reloaded", policies=sorted(self._rules().policies))

    def _load_rules(self, path: Path) -> None:
        rules = load_rules(path)
        try:
            self._broker().check(rules)
        except (SecretError, Denial) as exc:
            raise RulesError(path, None, "inject", f"secret reference: {exc}") from None
        self.rules = rules
        self.rules_stamp = _stamp((path, *rules.sources))
        registry = SourceRegistry(Path(ctx.options.sealgate_state) / "registry.json")
        self.identifier = Identifier(rules, registry)
        for warning in rules.warnings:
            logger.warning("sealgate: rules warning: %s", warning)

    async def _watch_rules(self) -> None:
        while True:
            await asyncio.sleep(_RELOAD_POLL_SECONDS)
            # The rules path itself too: a file added to a rules directory changes its mtime.
            path = Path(ctx.options.sealgate_rules)
            if self.rules is not None and _stamp((path, *self.rules.sources)) != self.rules_stamp:
                self.reload()

    # -- connections ----------------------------------------------------------------------

    def client_connected(self, client: connection.Client) -> None:
        self.conns[client.id] = Conn()

    def client_disconnected(self, client: connection.Client) -> None:
        conn = self.conns.pop(client.id, None)
        if conn is None:
            return
        if conn.budget_key is not None:
            self.budgets.close_connection(conn.budget_key)
        self._emit(
            "connection_closed",
            connection_id=client.id,
            sandbox=conn.identity.sandbox if conn.identity else None,
            policy=conn.policy.name if conn.policy else None,
            target=_fmt_target(conn.target),
            tunnel=conn.tunnel,
            requests=conn.requests,
            denied=conn.denied,
            duration_ms=_ms(time.monotonic() - conn.opened),
        )

    # -- CONNECT and TLS: the tunnel's destination ----------------------------------------

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        conn = self._conn(flow.client_conn)
        verdict = Verdict(started=time.monotonic())
        flow.metadata[_META] = verdict
        try:
            conn.proxy_auth = flow.request.headers.get_all("proxy-authorization")
            identity = self._identify(conn.proxy_auth, conn, flow.client_conn)
            host, port = guardmod.parse_target(flow.request.authority or "", 443)
            verdict.host, verdict.port = host.name, port
            self._admit(conn, verdict, identity)
            tokens = TOKEN_HEADER in flow.request.headers
            decision, policy = self._decide(verdict, Question(identity, host, port, tokens=tokens))
            verdict.pin = await self._guard().pin(host, port, policy)
            conn.target = (host, port)
            conn.tunnel = decision.tunnel
        except Exception as exc:
            self._deny(flow, verdict, _refusal(exc, "deciding a CONNECT"), conn)
        else:
            if verdict.reason is None:  # a report-mode miss keeps its "report"
                verdict.decision = "allow"
        # A CONNECT gets no response hook: its decision line is written here.
        self._log_flow(flow, verdict)

    async def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        client = data.context.client
        conn = self._conn(client)
        sni = data.client_hello.sni
        try:
            if conn.target is None:
                await self._transparent_tls_target(data, conn, sni)
            elif sni is not None and _canonical(sni) != conn.target[0]:
                raise Denial(Reason.SNI_MISMATCH, "TLS SNI does not match the CONNECT target")
        except Exception as exc:
            denial = _refusal(exc, "checking a ClientHello")
            conn.denied += 1
            conn.blocked = denial
            conn.tunnel = False
            self._emit(
                "tls_denied",
                connection_id=client.id,
                sandbox=conn.identity.sandbox if conn.identity else None,
                target=_fmt_target(conn.target),
                sni=sni if sni is None else sni[:255],
                reason=denial.reason,
            )
            return
        # Without SNI only interception can see which name the client means (domain fronting).
        data.ignore_connection = conn.tunnel and sni is not None

    def tls_start_client(self, data: tls.TlsData) -> None:
        """A refused ClientHello gets no handshake: without a TLS context mitmproxy closes the
        connection (this runs after TlsConfig has prepared one)."""
        conn = self.conns.get(data.context.client.id)
        if conn is not None and conn.blocked is not None:
            data.ssl_conn = None

    async def _transparent_tls_target(
        self, data: tls.ClientHelloData, conn: Conn, sni: str | None
    ) -> None:
        """A redirected TLS connection names its destination only in the SNI."""
        server = data.context.server
        assert server.address is not None
        host = _canonical(sni) if sni else _canonical(str(server.address[0]))
        port = server.address[1]
        identity = self._identify([], conn, data.context.client)
        verdict = Verdict(started=time.monotonic(), host=host.name, port=port)
        self._admit(conn, verdict, identity)
        decision, policy = self._decide(verdict, Question(identity, host, port))
        await self._guard().pin(host, port, policy)
        conn.target = (host, port)
        conn.tunnel = decision.tunnel
        # The upstream is the name that was checked, never the address the sandbox dialed: a
        # passed-through connection would otherwise carry an allowed SNI to any address.
        server.address = (host.name, port)

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        replaced = layers.confine(nextlayer)
        if replaced is not None:
            client = nextlayer.context.client
            self._emit("protocol_confined", connection_id=client.id, replaced=replaced)

    # -- requests: the main path ----------------------------------------------------------

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        conn = self._conn(flow.client_conn)
        conn.requests += 1
        verdict = Verdict(started=time.monotonic())
        flow.metadata[_META] = verdict
        request = flow.request
        try:
            if conn.blocked is not None:
                raise conn.blocked
            facts = _RequestFacts.of(request.headers)
            # identify
            identity = self._identify(facts.proxy_auth, conn, flow.client_conn)
            self._admit(conn, verdict, identity)
            # guard: the names agree and are well-formed
            transparent = isinstance(flow.client_conn.proxy_mode, mode_specs.TransparentMode)
            host, port = guardmod.request_target(request, conn.target, transparent)
            verdict.host, verdict.port = host.name, port
            verdict.path = normalize_path(request.path)
            # authorise
            decision, policy = self._decide(verdict, Question(
                identity, host, port, "https" if request.scheme == "https" else "http",
                request.method, verdict.path, bool(facts.tokens), self._ssl_insecure,
            ))
            # budget
            budget_key = conn.budget_key or ""
            self.budgets.admit_request(budget_key, policy.budgets, facts.length)
            # guard: addresses, pinned; credentials over plain HTTP only to allow_networks
            verdict.pin = await self._guard().pin(host, port, policy)
            if (secured := decision.secure_for(verdict.pin.address)) is not decision:
                raise _denial(secured)
            # forward exactly what was checked, and nothing the sandbox should not send
            request.data.host, request.data.port = host.name, port
            guardmod.strip_upstream_headers(request.headers)
            # inject
            injected = await self._inject(flow, facts, conn, policy, decision.rule)
            verdict.injected, verdict.overwrote = injected.labels, injected.overwrote
            if not flow.metadata.get(_PENDING):
                _stream_request(request, facts, self.budgets.meter(budget_key))
        except PathError as exc:
            self._deny(flow, verdict, Denial(Reason.of(exc.reason), str(exc)), conn)
        except Exception as exc:
            self._deny(flow, verdict, _refusal(exc, "deciding a request"), conn)
        else:
            if verdict.reason is None:  # a report-mode miss keeps its "report"
                verdict.decision = "allow"

    def request(self, flow: http.HTTPFlow) -> None:
        """Signatures over the body, once the whole body is here."""
        signed: list[Credential] | None = flow.metadata.pop(_PENDING, None)
        if not signed or flow.response is not None:
            return
        try:
            for cred in signed:
                # Recorded (and the scrubber armed) in requestheaders.
                put(flow.request, cred)
        except Exception as exc:
            denial = _refusal(exc, "signing a request")
            self._deny(flow, flow.metadata[_META], denial, self._conn(flow.client_conn))

    async def _inject(
        self, flow: http.HTTPFlow, facts: _RequestFacts, conn: Conn, policy: Policy,
        rule: Rule | None,
    ) -> Injected:
        """The sandbox's sealed tokens, then the rule's brokered secrets, into the request."""
        request, verdict = flow.request, flow.metadata[_META]
        credentials: list[Credential] = []
        if facts.tokens:
            identity = verdict.identity
            assert identity and verdict.host and verdict.port and verdict.path
            credentials += self._token_credentials(facts.tokens, TokenRequest(
                identity.sandbox, policy.name, verdict.host, verdict.port, request.method,
                verdict.path, facts.proxy_auth or conn.proxy_auth,
            ))
        injections, strip = (rule.inject, rule.strip_keys) if rule is not None else ((), _NONE)
        if injections:
            credentials += await self._broker().credentials(injections)
        if facts.tokens:
            strip = strip | _TOKEN_KEY
        injected = Injected()
        if not credentials and not strip:
            return injected
        if signed := write(request, credentials, injected, strip=strip):
            # The signature covers the exact body: buffer it (declared, so bounded by the
            # request budget) and sign in the `request` hook.
            if facts.chunked and facts.length is None:
                # Neither buffered without a bound nor signed before it has all come: refused.
                # No Content-Length and no Transfer-Encoding is an empty body (RFC 9112 6.3).
                raise Denial(Reason.LENGTH_REQUIRED, "a signed chunked body needs a Content-Length")
            request.stream = False
            flow.metadata[_PENDING] = signed
        if injected.needles:
            flow.metadata[_SCRUB] = injected.scrubber()
        return injected

    def _token_credentials(self, tokens: list[str], request: TokenRequest) -> list[Credential]:
        try:
            return self._tokenizer().authorise(tokens, request)
        except TokenError as exc:
            raise Denial(Reason.of(exc.reason), str(exc)) from None

    async def server_connect(self, data: server_hooks.ServerConnectionHookData) -> None:
        """Every upstream dial, keep-alive or pre-dial alike, goes to an address we checked."""
        server = data.server
        assert server.address is not None
        conn = self.conns.get(data.client.id)
        name, port = str(server.address[0]), int(server.address[1])
        try:
            if conn is None or conn.policy is None:
                raise Denial(Reason.NOT_ALLOWED, "no authorised request on this connection")
            if conn.blocked is not None:
                raise conn.blocked
            host = _canonical(name)
            if conn.target is not None and conn.target != (host, port):
                # Inside a tunnel every dial goes to its one checked destination.
                raise Denial(Reason.NAME_MISMATCH, "upstream differs from the tunnel's destination")
            pin = await self._guard().pin(host, port, conn.policy)
        except Exception as exc:
            denial = _refusal(exc, "checking an upstream dial")
            server.error = f"sealgate: {denial.reason}"
            self._emit(
                "connect_denied", connection_id=data.client.id, host=name, port=port,
                reason=denial.reason,
            )
            return
        # The upstream handshake names what was checked, never a name the client chose.
        server.sni = pin.host.name
        server.address = (str(pin.address), port)
        self._pinned[server.id] = (name, port)

    def server_connected(self, data: server_hooks.ServerConnectionHookData) -> None:
        # mitmproxy matches reusable upstream connections by address; give the connection back
        # its name so keep-alive reuse keeps working although we dialed the pinned IP.
        original = self._pinned.pop(data.server.id, None)
        if original is not None:
            object.__setattr__(data.server, "address", original)

    def server_connect_error(self, data: server_hooks.ServerConnectionHookData) -> None:
        self._pinned.pop(data.server.id, None)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        try:
            self._scrub_headers(flow)
        except Exception:
            # An unscrubbed response could carry a credential back: drop it instead.
            logger.exception("sealgate: internal error scrubbing a response; dropped")
            flow.kill()

    def _scrub_headers(self, flow: http.HTTPFlow) -> None:
        verdict = flow.metadata.get(_META)
        response = flow.response
        if response is None or verdict is None or verdict.decision == "deny":
            return
        if response.status_code == 101 and not _websocket_switch(flow.request, response):
            # What follows another protocol switch would be relayed raw, past every rule.
            upgrade = _field(response.headers, b"upgrade")
            self._refuse_response(flow, "protocol_not_allowed", upgrade=upgrade[:64])
            flow.kill()
            return
        guardmod.strip_downstream_headers(response.headers)
        scrubber: Scrubber | None = flow.metadata.get(_SCRUB)
        if scrubber:
            coding = _field(response.headers, b"transfer-encoding").lower().replace(" ", "")
            if coding not in ("", "chunked", "identity"):
                # A transfer coding (gzip, chunked): mitmproxy passes the body on coded, and a
                # credential inside could not be found. Injected requests send no TE asking for
                # one, so only a misbehaving upstream gets here.
                self._refuse_response(flow, "encoding_unscrubbable", encoding=coding)
                flow.kill()
                return
            fields = response.headers.fields
            if (scrubbed := scrubber.fields(fields)) is not fields:
                response.headers.fields = scrubbed
            if _stream_response(response):
                self._stream_scrubbed(flow, response, scrubber)
            # else: buffered, and scrubbed whole in `response`
        else:
            _stream_response(response)

    def _stream_scrubbed(
        self, flow: http.HTTPFlow, response: http.Response, scrubber: Scrubber
    ) -> None:
        """Stream a response through the scrubber; a compressed one is decoded on the way (its
        framing headers rewritten to match). A coding that cannot be decoded kills the flow: a
        credential inside it could not be found."""
        encoding = _content_coding(response)
        bodiless = flow.request.method == "HEAD" or response.status_code in (204, 304)
        if not encoding or bodiless:
            response.stream = scrubber.stream()
            return
        decode = decoder(encoding)
        if decode is None:
            self._refuse_response(flow, "encoding_unscrubbable", encoding=encoding[:64])
            flow.kill()
            return
        _decoded(response)
        if response.http_version == "HTTP/1.1" and "chunked" not in _field(
            response.headers, b"transfer-encoding"
        ).lower():
            response.headers["transfer-encoding"] = "chunked"
        # (HTTP/1.0 ends the body by closing; HTTP/2 and 3 frame it themselves.)
        scrub = scrubber.stream(decode)
        failed = False

        def stream(chunk: bytes) -> list[bytes]:
            nonlocal failed
            if failed:
                return []
            try:
                return scrub(chunk)
            except Undecodable as exc:
                # Corrupt, cut short or a bomb: what came so far was scrubbed, the rest must
                # not come, and the client must see that the response broke off.
                failed = True
                self._refuse_response(flow, exc.reason, encoding=encoding[:64])
                _cut_off(flow)
                return []

        response.stream = stream

    def response(self, flow: http.HTTPFlow) -> None:
        try:
            self._scrub_body(flow)
        except Exception:
            logger.exception("sealgate: internal error scrubbing a response; dropped")
            flow.kill()
        self._log_flow(flow, flow.metadata.get(_META))

    def _scrub_body(self, flow: http.HTTPFlow) -> None:
        scrubber: Scrubber | None = flow.metadata.get(_SCRUB)
        response = flow.response
        if not scrubber or response is None:
            return
        if response.trailers and (
            (fields := scrubber.fields(response.trailers.fields)) is not response.trailers.fields
        ):
            response.trailers.fields = fields
        if not response.raw_content or response.stream:
            return
        if encoding := _content_coding(response):
            # Asked for identity but compressed anyway: passed on decoded, as when streamed.
            try:
                body = decode_whole(encoding, response.raw_content)
            except Undecodable as exc:
                self._refuse_response(flow, exc.reason, encoding=encoding[:64])
                flow.kill()
                return
            _decoded(response)
            response.content = scrubber.data(body)
        elif (clean := scrubber.data(response.raw_content)) != response.raw_content:
            response.raw_content = clean

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        """A message from an upstream that was sent a credential is scrubbed like a body.
        mitmproxy hands over whole messages (fragments joined, permessage-deflate undone) and
        keeps the framing of one whose length did not change, which masking never changes."""
        scrubber: Scrubber | None = flow.metadata.get(_SCRUB)
        if not scrubber or flow.websocket is None:
            return
        message = flow.websocket.messages[-1]
        if message.from_client:
            return
        try:
            if (clean := scrubber.data(message.content)) != message.content:
                message.content = clean
        except Exception:
            logger.exception("sealgate: internal error scrubbing a WebSocket message; dropped")
            message.drop()
            flow.kill()

    def _refuse_response(self, flow: http.HTTPFlow, reason: str, **detail: str) -> None:
        """The audit line for a response that cannot be passed on; the caller stops it."""
        self._emit(
            "response_refused", request_id=flow.id, connection_id=flow.client_conn.id,
            reason=reason, **detail,
        )

    def error(self, flow: http.HTTPFlow) -> None:
        self._log_flow(flow, flow.metadata.get(_META))

    # -- steps ----------------------------------------------------------------------------

    def _identify(
        self, proxy_auth: list[str], conn: Conn, client: connection.Client
    ) -> Identity:
        identifier = self._identifier()
        for value in proxy_auth:
            identity = identifier.from_proxy_authorization(value)
            if identity is not None:
                return identity
        if conn.identity is not None:
            # Proven earlier on this connection; its policy is looked up in the rules in force
            # now, so a reload applies to tunnels that are already open.
            return identifier.current(conn.identity)
        by_source = identifier.from_source(str(client.peername[0]))
        return by_source if by_source is not None else identifier.default()

    def _admit(self, conn: Conn, verdict: Verdict, identity: Identity) -> None:
        """The identity's policy (step 1 of `decide`, asked first so that an unidentified
        client learns nothing but 407), and its connection counted against its budget."""
        verdict.identity = identity
        if not self._audit().healthy:
            raise Denial(Reason.AUDIT_UNAVAILABLE, "the audit log cannot be written")
        policy = policy_for(self._rules(), identity)
        if isinstance(policy, Decision):
            raise _denial(policy)
        verdict.policy = policy.name
        key = identity.sandbox or f"default:{policy.name}"
        if conn.budget_key != key:
            if conn.budget_key is not None:
                self.budgets.close_connection(conn.budget_key)
                conn.budget_key = None
            self.budgets.open_connection(key, policy.budgets)
            conn.budget_key = key
        conn.identity, conn.policy = identity, policy

    def _decide(self, verdict: Verdict, question: Question) -> tuple[Decision, Policy]:
        """`decide`, its answer written on the verdict; raises the Denial of a refusal."""
        decision = decide(self._rules(), question)
        if decision.rule is not None:
            verdict.rule = decision.rule.source
        if decision.verdict == "deny" or decision.policy is None:
            raise _denial(decision)
        if decision.verdict == "report":
            verdict.decision, verdict.reason = "report", decision.reason
        return decision, decision.policy

    def _deny(self, flow: http.HTTPFlow, verdict: Verdict, denial: Denial, conn: Conn) -> None:
        conn.denied += 1
        verdict.decision, verdict.reason = "deny", denial.reason
        flow.response = deny_response(
            denial, host=verdict.host, policy=verdict.policy, request_id=flow.id
        )

    # -- audit ----------------------------------------------------------------------------

    def _log_flow(self, flow: http.HTTPFlow, verdict: Verdict | None) -> None:
        if verdict is None:
            return
        request, response = flow.request, flow.response
        server = flow.server_conn
        connect_ms = None
        if server.timestamp_tcp_setup and server.timestamp_start:
            connect_ms = _ms(server.timestamp_tcp_setup - server.timestamp_start)
        self._emit(
            "request",
            request_id=flow.id,
            connection_id=flow.client_conn.id,
            sandbox=verdict.identity.sandbox if verdict.identity else None,
            identified_by=verdict.identity.via if verdict.identity else None,
            policy=verdict.policy,
            method=request.method,
            scheme=request.scheme,
            host=verdict.host,
            port=verdict.port,
            path=verdict.path,
            address=str(verdict.pin.address) if verdict.pin else None,
            decision=verdict.decision,
            reason=verdict.reason,
            rule=verdict.rule,
            injected=verdict.injected or None,
            overwrote=verdict.overwrote or None,
            scrubbed=scrubbed.hits if (scrubbed := flow.metadata.get(_SCRUB)) else None,
            status=response.status_code if response is not None else None,
            error=_error_text(flow),
            bytes_out=len(request.raw_content or b""),
            bytes_in=_body_size(response),
            dns_ms=_ms(verdict.pin.dns_seconds) if verdict.pin else None,
            connect_ms=connect_ms,
            total_ms=_ms(time.monotonic() - verdict.started),
        )

    def _emit(self, event: str, **fields: Any) -> None:
        if self.audit is not None:
            self.audit.emit(event, **fields)

    # -- accessors: configured state ------------------------------------------------------

    def _conn(self, client: connection.Client) -> Conn:
        conn = self.conns.get(client.id)
        if conn is None:
            conn = self.conns[client.id] = Conn()
        return conn

    def _rules(self) -> RuleSet:
        if self.rules is None:
            raise Denial(Reason.RULES_UNAVAILABLE, "no rules loaded")
        return self.rules

    def _identifier(self) -> Identifier:
        if self.identifier is None:
            raise Denial(Reason.RULES_UNAVAILABLE, "no rules loaded")
        return self.identifier

    def _broker(self) -> Broker:
        if self.broker is None:
            raise Denial(Reason.SECRET_UNAVAILABLE, "no secret stores are configured")
        return self.broker

    def _tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise Denial(Reason.TOKEN_INVALID, "this proxy holds no token keys")
        return self.tokenizer

    def _guard(self) -> Guard:
        if self.guard is None:
            raise Denial(Reason.RULES_UNAVAILABLE, "the guard is not configured")
        return self.guard

    def _audit(self) -> AuditLog:
        if self.audit is None:
            raise Denial(Reason.AUDIT_UNAVAILABLE, "the audit log is not configured")
        return self.audit


def _refusal(exc: Exception, doing: str) -> Denial:
    """What a decision hook answers when `exc` escaped it. mitmproxy logs an addon's exception
    and carries on with the flow, so anything but a Denial is a bug that must close the door:
    logged with its traceback (on the proxy's stderr, never to the client) and refused."""
    if isinstance(exc, Denial):
        return exc
    logger.error("sealgate: internal error %s; refused", doing, exc_info=exc)
    return Denial(Reason.INTERNAL_ERROR, "the proxy could not decide; refused")


def _denial(decision: Decision) -> Denial:
    return Denial(decision.reason or Reason.INTERNAL_ERROR, decision.detail)


def _canonical(name: str) -> Host:
    try:
        return canonical_host(f"[{name}]" if ":" in name else name)
    except HostError as exc:
        raise Denial(Reason.of(exc.reason), str(exc)) from exc


@dataclass(slots=True)
class _RequestFacts:
    """The few request headers the path needs, found in one pass over the raw fields: mitmproxy's
    Headers lookups re-scan and re-decode on every call."""

    proxy_auth: list[str]
    tokens: list[str]
    length: int | None  # a declared Content-Length
    chunked: bool

    @classmethod
    def of(cls, headers: http.Headers) -> _RequestFacts:
        facts = cls([], [], None, False)
        for raw_name, raw_value in headers.fields:
            name = raw_name.lower()
            if name == b"proxy-authorization":
                facts.proxy_auth.append(raw_value.decode("latin-1"))
            elif name == b"proxy-tokenizer":
                facts.tokens.append(raw_value.decode("latin-1"))
            elif name == b"content-length" and raw_value.isdigit():
                facts.length = int(raw_value)
            elif name == b"transfer-encoding":
                facts.chunked = True
        return facts


def _stream_request(
    request: http.Request, facts: _RequestFacts, meter: Callable[[bytes], bytes]
) -> None:
    """Large or unknown-length bodies stream instead of buffering (a sandbox must not fill the
    proxy's memory); unknown lengths count against the byte budget as they pass. Deciding here
    costs one comparison, where mitmproxy's stream_large_bodies re-derives each body's size."""
    if facts.length is None and facts.chunked:
        request.stream = meter
    elif facts.length is not None and facts.length > _STREAM_OVER:
        request.stream = True


def _field(headers: http.Headers, name: bytes) -> str:
    """Header `name` (lower case), repeated values joined as one list, as `Headers.get` does
    (`Content-Encoding: gzip` twice is "gzip, gzip", never just the first); "" if absent. A
    scan of the raw fields: `Headers.get` raises and catches a KeyError for an absent header,
    which on the per-request path cost more than the scan."""
    values = [value for key, value in headers.fields if key.lower() == name]
    return b", ".join(values).decode("latin-1")


def _websocket_switch(request: http.Request, response: http.Response) -> bool:
    """A 101 that mitmproxy turns into its WebSocket layer (the same test it applies)."""
    return (
        _field(response.headers, b"upgrade").strip().lower() == "websocket"
        and _field(request.headers, b"sec-websocket-version").strip() == "13"
    )


def _content_coding(response: http.Response) -> str:
    """The response's content coding as sent, or "" for none (`identity` is none)."""
    encoding = _field(response.headers, b"content-encoding")
    return "" if encoding.strip().lower() in ("", "identity") else encoding


def _body_size(response: http.Response | None) -> int:
    if response is None:
        return 0
    if response.raw_content is not None:
        return len(response.raw_content)
    length = _field(response.headers, b"content-length")
    return int(length) if length.isdigit() else 0


def _decoded(response: http.Response) -> None:
    """The headers of a response passed on decoded."""
    del response.headers["content-encoding"]
    response.headers.pop("content-length", None)


def _cut_off(flow: http.HTTPFlow) -> None:
    """Close the client's connection now, in the middle of a streamed response. mitmproxy has
    no hook for that; raising from a stream function would leave the client waiting for the
    rest until the idle timeout, and letting the stream end would tell it the body was whole.
    The writer is closed at once, so not even the end of the chunked body gets out."""
    flow.kill()
    server = ctx.master.addons.get("proxyserver")
    handler = server.connections.get(flow.client_conn.id) if server is not None else None
    if handler is None:
        return
    io = handler.transports.get(handler.client)
    if io is not None and io.writer is not None:
        io.writer.close()
    handler.close_connection(handler.client)


def _stream_response(response: http.Response) -> bool:
    """Stream a response of unknown or large size; True if it will stream."""
    length = _field(response.headers, b"content-length")
    if not length.isdigit() or int(length) > _STREAM_OVER:
        response.stream = True
        return True
    return False


def _listen_endpoints() -> list[tuple[str, int]]:
    endpoints = []
    for spec in ctx.options.mode:
        mode = mode_specs.ProxyMode.parse(spec)
        port = mode.listen_port(ctx.options.listen_port)
        if port is not None:
            endpoints.append((mode.listen_host(ctx.options.listen_host) or "0.0.0.0", port))  # noqa: S104
    return endpoints


def _stamp(paths: tuple[Path, ...]) -> tuple[float, ...]:
    stamps: list[float] = []
    for path in paths:
        try:
            stamps.append(os.stat(path).st_mtime)
        except OSError:
            stamps.append(-1.0)
    return tuple(stamps)


def _fmt_target(target: tuple[Host, int] | None) -> str | None:
    return None if target is None else f"{target[0].name}:{target[1]}"


def _error_text(flow: http.HTTPFlow) -> str | None:
    return None if flow.error is None else flow.error.msg[:200]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)

