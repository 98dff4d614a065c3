"""sealgate's mitmproxy addon: every request's path, top to bottom, in one place.

    [base-URL form -> absolute form] -> identify -> guard (names) -> decide (policy.decide)
             -> budget -> guard (addresses, pinned) -> inject -> forward -> scrub (responses)
             -> log (auditlines)

`sealgate proxy` loads it into a lean master; `mitmdump -s proxy/addon.py` loads it into an
existing mitmproxy. The hooks only string the steps together: the decision is one pure function
(policy/decide.py), what each step does in detail is in steps.py, the configuration one immutable
object swapped on reload (settings.py, by the addon's life around this path: lifecycle.py), the
response side its own module (responses.py), and so are the records kept per connection and per
request (flowstate.py) and the audit lines made of them (auditlines.py).
"""

from __future__ import annotations

import logging
import time

from mitmproxy import connection, http, tls
from mitmproxy.proxy import layer, mode_specs, server_hooks

from sealgate.reasons import Reason

from ..credentials import presented
from ..credentials.inject import Credential, put, refused_body
from ..credentials.tokenizer import HEADER as TOKEN_HEADER
from ..credentials.tokenizer import TokenRequest
from ..engine import layers, limits, mitm, pool, splice
from ..errors import Denial
from ..net import guard as guardmod
from ..policy import reshaping
from ..policy.decide import Question
from ..policy.model import PathError, normalize_path
from . import baseurl, budget, responses, target
from .auditlines import connection_line, request_line, target_text
from .flowstate import (
    META,
    PENDING,
    Conn,
    RequestFacts,
    RequestRecord,
    stream_request,
    unsafe_fields,
)
from .steps import Steps, canonical, denial_of, inside_target, refusal, upstream_failure

logger = logging.getLogger("sealgate")


class Sealgate(Steps):
    # -- connections ----------------------------------------------------------------------

    def client_connected(self, client: connection.Client) -> None:
        source = str(client.peername[0])
        if (refused := self.gate.admit(source, client.peername)) is not None:
            # Closed by mitmproxy before any layer runs: the cheapest refusal there is.
            client.error = f"sealgate: {refused}"
            return
        self.conns[client.id] = Conn(source=source)

    def client_disconnected(self, client: connection.Client) -> None:
        conn = self.conns.pop(client.id, None)
        if conn is None:
            return
        if conn.source:  # counted when accepted (a Conn made later, by `_conn`, was not)
            self.gate.release(conn.source)
        self.reclaimer.closed()
        if conn.budget_key is not None:
            self.budgets.close_connection(conn.budget_key)
        self._emit("connection_closed", **connection_line(
            client.id, conn, spliced=conn.tunnel and splice.happened(client.id)))

    def next_layer(self, nextlayer: layer.NextLayer) -> None:
        replaced = layers.confine(nextlayer)
        if replaced is not None:
            client = nextlayer.context.client
            self._emit("protocol_confined", connection_id=client.id, replaced=replaced)

    # -- CONNECT and TLS: the tunnel's destination ----------------------------------------

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        conn = self._conn(flow.client_conn)
        record = RequestRecord(started=time.monotonic())
        flow.metadata[META] = record
        try:
            conn.proxy_auth = flow.request.headers.get_all("proxy-authorization")
            identity = self._identify(conn.proxy_auth, conn, flow.client_conn)
            host, port = guardmod.parse_target(flow.request.authority or "", 443)
            record.host, record.port = host.name, port
            self._admit(conn, record, identity)
            # Tokens on the CONNECT go with every request in the tunnel; those in the proxy
            # credentials with each request to their hosts (decided again per request).
            tunnel_tokens = flow.request.headers.get_all(TOKEN_HEADER)
            bound = TokenRequest(identity.sandbox, record.policy, host.name, port, "CONNECT",
                                 "", conn.proxy_auth)
            state = self._state()
            ambient = presented.in_credentials(
                state.tokenizer, state.identifier.tokens_in(conn.proxy_auth), host, bound)
            decision, policy = self._decide(record, Question(
                identity, host, port, tokens=bool(tunnel_tokens or ambient)
            ))
            if tunnel_tokens:
                presented.check_tunnel(state.tokenizer, tunnel_tokens, host, bound)
            record.pin = await self._state().guard.pin(host, port, policy)
            conn.target, conn.tunnel = (host, port), decision.tunnel
            conn.tunnel_tokens = tunnel_tokens
        except Exception as exc:
            denial = refusal(exc, "deciding a CONNECT")
            await budget.hold(denial)
            if (target := inside_target(flow.request, denial)) is not None:
                # Accepted, and refused inside: an SDK shows the first response's reason, but
                # only "connection error" for a refused CONNECT. Nothing is ever dialed.
                conn.denied += 1
                conn.blocked, conn.target, conn.tunnel = denial, target, False
                record.decision, record.reason = "deny", denial.reason
            else:
                self._deny(flow, record, denial, conn)
        else:
            if record.reason is None:  # a report-mode miss keeps its "report"
                record.decision = "allow"
        # A CONNECT gets no response hook: its decision line is written here.
        self._emit("request", **request_line(flow, record))

    async def tls_clienthello(self, data: tls.ClientHelloData) -> None:
        client = data.context.client
        conn = self._conn(client)
        sni = data.client_hello.sni
        if conn.blocked is not None:
            return  # refused on the CONNECT: intercepted, to answer the first request inside
        try:
            if conn.target is None:
                await self._transparent_tls_target(data, conn, sni)
            elif sni is not None and canonical(sni) != conn.target[0]:
                raise Denial(Reason.SNI_MISMATCH, "TLS SNI does not match the CONNECT target")
        except Exception as exc:
            denial = refusal(exc, "checking a ClientHello")
            conn.denied += 1
            conn.blocked, conn.handshake_refused = denial, True
            conn.tunnel = False
            self._emit(
                "tls_denied", connection_id=client.id,
                sandbox=conn.identity.sandbox if conn.identity else None,
                target=target_text(conn.target), sni=sni if sni is None else sni[:255],
                reason=denial.reason,
            )
            return
        # Without SNI only interception can see which name the client means (domain fronting).
        data.ignore_connection = conn.tunnel and sni is not None
        conn.alpn_offered = data.client_hello.alpn_protocols

    def tls_start_client(self, data: tls.TlsData) -> None:
        """A refused ClientHello gets no handshake: without a TLS context mitmproxy closes the
        connection (this runs after TlsConfig has prepared one). Others get HTTP/2 if they
        offer it."""
        conn = self.conns.get(data.context.client.id)
        if conn is not None and conn.handshake_refused:
            data.ssl_conn = None
        elif conn is not None:
            mitm.prefer_h2(data, conn.alpn_offered)

    def handshake_refused(self, client: connection.Client) -> bool:
        """Whether `client`'s ClientHello was refused here: the fast path, which makes no
        pyOpenSSL connection for `tls_start_client` to withhold, closes it before a handshake
        (proxy/engine/fastconnect.py)."""
        conn = self.conns.get(client.id)
        return conn is not None and conn.handshake_refused

    async def _transparent_tls_target(
        self, data: tls.ClientHelloData, conn: Conn, sni: str | None
    ) -> None:
        """A redirected TLS connection names its destination only in the SNI."""
        server = data.context.server
        if server.address is None:  # TLS straight to the explicit listener, with no CONNECT
            raise Denial(Reason.BAD_REQUEST, "TLS to the proxy needs a CONNECT first")
        host = canonical(sni) if sni else canonical(str(server.address[0]))
        port = server.address[1]
        identity = self._identify([], conn, data.context.client)
        record = RequestRecord(started=time.monotonic(), host=host.name, port=port)
        self._admit(conn, record, identity)
        decision, policy = self._decide(record, Question(identity, host, port))
        await self._state().guard.pin(host, port, policy)
        conn.target = (host, port)
        conn.tunnel = decision.tunnel
        # The upstream is the name that was checked, never the address the sandbox dialed: a
        # passed-through connection would otherwise carry an allowed SNI to any address.
        server.address = (host.name, port)

    # -- requests: the main path ----------------------------------------------------------

    async def requestheaders(self, flow: http.HTTPFlow) -> None:
        self.in_flight.add(flow.id)
        conn = self._conn(flow.client_conn)
        conn.requests += 1
        record = RequestRecord(started=time.monotonic())
        flow.metadata[META] = record
        request = flow.request
        try:
            if conn.blocked is not None:
                if conn.target is not None:
                    record.host, record.port = conn.target[0].name, conn.target[1]
                record.identity = conn.identity
                record.policy = conn.policy.name if conn.policy is not None else None
                raise conn.blocked
            # An HTTP/1 head was checked as it was read (proxy/engine/mitm.py); HTTP/2's are here.
            if not request.http_version.startswith("HTTP/1") and (
                    too_big := limits.parsed(request, limits.in_force())) is not None:
                raise too_big
            facts = RequestFacts.of(request)
            transparent = isinstance(flow.client_conn.proxy_mode, mode_specs.TransparentMode)
            if (conn.target is None and not transparent and baseurl.applies(request.path)
                    and mitm.origin_form(request)):
                # the request it stands for, decided like any other
                record.base_url = baseurl.rewrite(request)
                if record.base_url.tokens:
                    facts.tokens.append(record.base_url.tokens)
            # identify
            identity = self._identify(facts.proxy_auth, conn, flow.client_conn)
            self._admit(conn, record, identity)
            # guard: the names agree and are well-formed
            host, port = target.request_target(request, conn.target, transparent)
            record.host, record.port = host.name, port
            record.path = normalize_path(request.path)
            if facts.malformed:  # after the names, whose own reasons are more precise
                raise Denial(Reason.BAD_REQUEST, "CR, LF or NUL in the method, target or a "
                                                 f"field, or {reshaping.NOT_A_METHOD}")
            if facts.rerouted:
                raise Denial(Reason.BAD_REQUEST, reshaping.REROUTED)
            # the tokens that go with this request: its own, its tunnel's, its credentials'
            proxy_auth = facts.proxy_auth or conn.proxy_auth
            bound = TokenRequest(identity.sandbox, record.policy, host.name, port,
                                 request.method, record.path, proxy_auth)
            state = self._state()
            ambient = presented.in_credentials(
                state.tokenizer, state.identifier.tokens_in(proxy_auth), host, bound)
            if conn.tunnel_tokens or ambient:
                facts.tokens = [*facts.tokens, *conn.tunnel_tokens, *ambient]
            # decide
            decision, policy = self._decide(record, Question(
                identity, host, port, "https" if request.scheme == "https" else "http",
                request.method, record.path, bool(facts.tokens), self._state().ssl_insecure,
                overrides=facts.overrides,
            ))
            # budget
            budget_key = conn.budget_key or ""
            self.budgets.admit_request(budget_key, policy.budgets, facts.length)
            record.max_request_bytes = policy.budgets.max_request_bytes
            # guard: addresses, pinned; credentials over plain HTTP only to allow_networks
            record.pin = await self._state().guard.pin(host, port, policy)
            if (secured := decision.secure_for(record.pin.address)) is not decision:
                raise denial_of(secured)
            record.tenant = _tenant(flow.client_conn, conn)
            # forward exactly what was checked, and nothing the sandbox should not send
            request.data.host, request.data.port = host.name, port
            target.strip_upstream_headers(request.headers)
            # inject
            injected = await self._inject(flow, facts, bound, decision.rule, identity=identity,
                                          policy=policy)
            record.injected, record.overwrote = injected.labels, injected.overwrote
            if not flow.metadata.get(PENDING):
                stream_request(request, facts, self.budgets.meter(budget_key))
        except PathError as exc:
            self._deny(flow, record, Denial(exc.reason, str(exc)), conn)
        except Exception as exc:
            denial = refusal(exc, "deciding a request")
            await budget.hold(denial)
            self._deny(flow, record, denial, conn)
        else:
            if record.reason is None:  # a report-mode miss keeps its "report"
                record.decision = "allow"

    def request(self, flow: http.HTTPFlow) -> None:
        """Trailers checked like headers, and signatures over the body, once the whole body is
        here."""
        signed: list[Credential] | None = flow.metadata.pop(PENDING, None)
        if flow.response is not None:
            return
        try:
            if (refused := refused_body(flow.request)) is not None:
                raise refused
            if (trailers := flow.request.trailers) is not None:
                if unsafe_fields(trailers.fields):
                    raise Denial(Reason.BAD_REQUEST, "CR, LF or NUL in a trailer")
                target.strip_upstream_headers(trailers)
            for cred in signed or ():
                # Recorded (and the scrubber armed) in requestheaders.
                put(flow.request, cred)
        except Exception as exc:
            denial = refusal(exc, "finishing a request")
            self._deny(flow, flow.metadata[META], denial, self._conn(flow.client_conn))
            if flow.request.stream:
                # The body went out already, all or part of it: the connection is cut, so its
                # end (and trailers) never go, and the upstream waits for nothing more. A kill
                # alone is not looked at again by mitmproxy before the end is sent.
                mitm.cut_off(flow)

    def request_body_over_cap(self, flow: http.HTTPFlow) -> None:
        """A streamed body passed its request's max_request_bytes (proxy/engine/bodycap.py, which
        has aborted the upstream request, and sends the client this refusal when nothing of an
        answer has gone to it, or else ends its connection or stream). A body a processor
        refused on the way is refused for what it found, as it would have been at its end."""
        record: RequestRecord = flow.metadata[META]
        denial = refused_body(flow.request) or Denial(
            Reason.REQUEST_TOO_LARGE, f"request body over {record.max_request_bytes} bytes")
        conn = self._conn(flow.client_conn)
        if flow.response is None:
            self._deny(flow, record, denial, conn)
        else:  # the upstream's answer has begun: the line says why it was cut off
            conn.denied += 1
            record.decision, record.reason = "deny", denial.reason

    # -- upstream connections -------------------------------------------------------------

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
            host = canonical(name)
            if conn.target is not None and conn.target != (host, port):
                # Inside a tunnel every dial goes to its one checked destination.
                raise Denial(Reason.NAME_MISMATCH, "upstream differs from the tunnel's destination")
            pin = await self._state().guard.pin(host, port, conn.policy)
        except Exception as exc:
            denial = refusal(exc, "checking an upstream dial")
            server.error = f"sealgate: {denial.reason}"
            self._emit(
                "connect_denied", connection_id=data.client.id, host=name, port=port,
                reason=denial.reason,
            )
            return
        # The upstream handshake names what was checked, never a name the client chose.
        server.sni = pin.host.name
        server.address = (str(pin.address), port)
        self._pinned[server] = (name, port)
        if not conn.tunnel:
            # A kept connection to exactly this, for exactly this tenant, may be taken instead.
            alpn = tuple(p for p in data.client.alpn_offers if p in pool.ALPN)
            pool.claim(server, pool.Key(server.address, server.sni, server.tls, alpn,
                                        _tenant(data.client, conn)))

    def server_connected(self, data: server_hooks.ServerConnectionHookData) -> None:
        self.upstream_open += 1
        # mitmproxy matches reusable upstream connections by address; give the connection back
        # its name so keep-alive reuse keeps working although we dialed the pinned IP.
        original = self._pinned.pop(data.server, None)
        if original is not None:
            mitm.restore_address(data.server, original)

    def server_connect_error(self, data: server_hooks.ServerConnectionHookData) -> None:
        self._pinned.pop(data.server, None)

    def tls_start_server(self, data: tls.TlsData) -> None:
        """After TlsConfig made the upstream handshake's connection: a session to resume."""
        if (kept := pool.installed()) is not None and kept.reusing(data.conn):
            return  # a kept connection: its handshake is long done
        client = data.context.client
        self.sessions.start(data, _tenant(client, self.conns.get(client.id)))

    def tls_established_server(self, data: tls.TlsData) -> None:
        if (kept := pool.installed()) is None or not kept.reusing(data.conn):
            self.sessions.established(data)

    def server_disconnected(self, data: server_hooks.ServerConnectionHookData) -> None:
        self.upstream_open = max(0, self.upstream_open - 1)
        self.sessions.closed(data.server)

    # -- responses ------------------------------------------------------------------------

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        try:
            responses.on_headers(flow, self._emit)
        except Exception:
            # An unscrubbed response could carry a credential back: drop it instead.
            logger.exception("sealgate: internal error scrubbing a response; dropped")
            flow.kill()

    def response(self, flow: http.HTTPFlow) -> None:
        try:
            responses.on_response(flow, self._emit)
        except Exception:
            logger.exception("sealgate: internal error scrubbing a response; dropped")
            flow.kill()
        self.in_flight.discard(flow.id)
        self._log_flow(flow)

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        responses.on_websocket_message(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self.in_flight.discard(flow.id)
        record: RequestRecord | None = flow.metadata.get(META)
        if record is not None and record.reason is None:
            # Allowed, then failed upstream: the line says how, as the client's answer does.
            record.reason = upstream_failure(flow)
        self._log_flow(flow)


def _tenant(client: connection.Client, conn: Conn | None) -> str:
    """Whose upstream connections and TLS sessions these are: the sandbox, or for a client no
    sandbox is proven for (a default policy's), its address, so that two such clients'
    connections are neither shared nor made linkable through one ticket."""
    sandbox = conn.identity.sandbox if conn is not None and conn.identity else None
    return sandbox or f"@{client.peername[0] if client.peername else ''}"
