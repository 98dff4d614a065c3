"""The steps the pipeline's hooks call (request/pipeline.py reads top to bottom; what each step
does in detail is here): who sent a request and its policy and budget (`_identify`, `_admit`),
the decision written down (`_decide`), the refusal answered (`_deny`), the credentials put in
(`_inject`), and what a hook answers when something escaped it (`refusal`).
"""

from __future__ import annotations

import logging

from mitmproxy import connection, http
from mitmproxy.flow import Error

from sealgate import oplog
from sealgate.hostname import Host, HostError, canonical_host
from sealgate.reasons import Reason

from ..credentials import presented
from ..credentials.inject import Credential, Injected, write
from ..credentials.tokenizer import HEADER as TOKEN_HEADER
from ..credentials.tokenizer import TokenRequest
from ..engine import upstream
from ..engine.refusal import deny_response
from ..errors import Denial
from ..net import guard as guardmod
from ..policy import reshaping
from ..policy.decide import Decision, Identity, Question, decide, policy_for
from ..policy.model import Policy, Rule
from .auditlines import request_line
from .flowstate import META, PENDING, REJECTED, SCRUB, Conn, RequestFacts, RequestRecord
from .lifecycle import Lifecycle

logger = logging.getLogger("sealgate")

_NONE: frozenset[bytes] = frozenset()
_TOKEN_KEY = frozenset({TOKEN_HEADER.encode()})  # removed from requests that carry tokens


class Steps(Lifecycle):
    """The pipeline's steps, on the addon (they read its state and budgets)."""

    def _identify(
        self, proxy_auth: list[str], conn: Conn, client: connection.Client
    ) -> Identity:
        identifier = self._state().identifier
        proven = None
        for value in proxy_auth:  # every one is checked: a bad one is never outvoted by a good
            identity = identifier.from_proxy_authorization(value).identity
            if identity is not None:
                if proven is not None:
                    raise Denial(Reason.IDENTITY_INVALID, "more than one identity in "
                                 "Proxy-Authorization")
                proven = identity
        if proven is not None:
            return proven
        registry = identifier.registry
        if conn.identity is not None and (conn.identity.via not in ("source", "default")
                                          or registry.version_now() == conn.source_version):
            # Proven earlier on this connection (or its address's entry unchanged since): its
            # policy is looked up in the rules in force now, so a reload applies to tunnels
            # that are already open.
            return identifier.current(conn.identity)
        # By its address, again whenever the registry changed: a sandbox given another
        # identity while it runs (sandboxd's PATCH) is that one at its next request, on
        # connections already open too.
        by_source = identifier.from_source(str(client.peername[0]))
        conn.source_version = registry.version
        return by_source if by_source is not None else identifier.default()

    def _admit(self, conn: Conn, record: RequestRecord, identity: Identity) -> None:
        """The identity's policy (step 1 of `decide`, asked first so that an unidentified
        client learns nothing but 407), and its connection counted against its budget."""
        record.identity = identity
        state = self._state()
        if not state.audit.healthy:
            state.audit.retry()  # room again? then this request need not wait for a turn
            if not state.audit.healthy:
                raise Denial(Reason.AUDIT_UNAVAILABLE, "the audit log cannot be written")
        policy = policy_for(state.rules, identity)
        if isinstance(policy, Decision):
            raise denial_of(policy)
        record.policy = policy.name
        key = identity.sandbox or f"default:{policy.name}"
        if conn.budget_key != key:
            if conn.budget_key is not None:
                self.budgets.close_connection(conn.budget_key)
                conn.budget_key = None
            self.budgets.open_connection(key, policy.budgets)
            conn.budget_key = key
        conn.identity, conn.policy = identity, policy

    def _decide(self, record: RequestRecord, question: Question) -> tuple[Decision, Policy]:
        """`decide`, its answer written on the record; raises the Denial of a refusal."""
        decision = decide(self._state().rules, question)
        if decision.rule is not None:
            record.rule = decision.rule.source
            record.response_timeout = decision.rule.response_timeout
        if decision.verdict == "deny" or decision.policy is None:
            raise denial_of(decision)
        if decision.verdict == "report":
            record.decision, record.reason = "report", decision.reason
        return decision, decision.policy

    async def _inject(
        self, flow: http.HTTPFlow, facts: RequestFacts, bound: TokenRequest, rule: Rule | None,
        *, identity: Identity, policy: Policy,
    ) -> Injected:
        """The sandbox's sealed tokens (checked against `bound`; an exchange processor's token
        obtained), then the rule's brokered secrets, into the request. What it logs (a secret
        store's failure, a token exchange's) carries the request's id, sandbox and policy, as
        its audit line does; so does an internal error, logged here while they are known."""
        with oplog.bound(request_id=flow.id, sandbox=identity.sandbox, policy=policy.name):
            try:
                return await self._injected(flow, facts, bound, rule, identity=identity,
                                            policy=policy)
            except Denial:
                raise
            except Exception as exc:
                raise refusal(exc, "injecting credentials") from None

    async def _injected(
        self, flow: http.HTTPFlow, facts: RequestFacts, bound: TokenRequest, rule: Rule | None,
        *, identity: Identity, policy: Policy,
    ) -> Injected:
        request = flow.request
        state = self._state()
        credentials: list[Credential] = []
        sealed = presented.opened(state.tokenizer, facts.tokens, bound) if facts.tokens else []
        for opened in sealed:
            credentials.append(opened if isinstance(opened, Credential) else await
                               state.broker.sealed(opened, guard=state.guard, rules=state.rules,
                                                   identity=identity, policy=policy))
        injections, strip = (rule.inject, rule.strip_keys) if rule is not None else ((), _NONE)
        if injections:
            credentials += await state.broker.credentials(
                injections, guard=state.guard, policy=policy)
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
            flow.metadata[PENDING] = signed
        if injected.needles:
            flow.metadata[SCRUB] = injected.scrubber()
            # A scrubbed answer comes whole (policy/reshaping.py): no resumed download with an
            # injected credential; it starts again from its first byte.
            for name in [name for name in request.headers if reshaping.is_slice(name)]:
                del request.headers[name]
        if injected.rejected:
            flow.metadata[REJECTED] = injected.rejected
        return injected

    def _deny(self, flow: http.HTTPFlow, record: RequestRecord, denial: Denial, conn: Conn) -> None:
        conn.denied += 1
        # Refused: the client is not invited to send the body (mitmproxy would answer 100).
        flow.request.headers.pop("expect", None)
        record.decision, record.reason = "deny", denial.reason
        # gRPC's status travels in trailers, which only HTTP/2 carries here (grpc-web and an
        # HTTP/1 client get the plain refusal, whose status says it is one).
        grpc = flow.request.is_http2 and flow.request.headers.get(
            "content-type", "").startswith("application/grpc")
        flow.response = deny_response(
            denial, host=record.host, policy=record.policy, request_id=flow.id, grpc=grpc
        )

    def _log_flow(self, flow: http.HTTPFlow) -> None:
        record: RequestRecord | None = flow.metadata.get(META)
        if record is not None:
            self.reclaimer.finished()
            self._emit("request", **request_line(flow, record))

    def _conn(self, client: connection.Client) -> Conn:
        conn = self.conns.get(client.id)
        if conn is None:
            conn = self.conns[client.id] = Conn()
        return conn


def refusal(exc: Exception, doing: str) -> Denial:
    """What a decision hook answers when `exc` escaped it. mitmproxy logs an addon's exception
    and carries on with the flow, so anything but a Denial is a bug that must close the door:
    logged with its traceback (on the proxy's stderr, never to the client) and refused."""
    if isinstance(exc, Denial):
        return exc
    logger.error("internal error; refused", extra={"doing": doing}, exc_info=exc)
    return Denial(Reason.INTERNAL_ERROR, "the proxy could not decide; refused")


def inside_target(connect: http.Request, denial: Denial) -> tuple[Host, int] | None:
    """Where a refused CONNECT is accepted and answered inside the tunnel: the target it named,
    or None where it is refused as it stands. Those are a client that sent no credentials (the
    407 challenge is what it may answer), a spent budget or an unwritable audit log (refused
    cheaply, before any TLS), and a target that does not parse."""
    if denial.reason is Reason.IDENTITY_REQUIRED or denial.status in (429, 503):
        return None
    try:
        return guardmod.parse_target(connect.authority or "", 443)
    except Denial:
        return None


def upstream_failure(flow: http.HTTPFlow) -> Reason | None:
    said = flow.error.msg if flow.error is not None else ""
    if flow.response is not None or not said or said == Error.KILLED_MESSAGE or (
        said.startswith("Client")  # mitmproxy's word for the client's side going away
    ):
        return None
    return upstream.failure(said)


def denial_of(decision: Decision) -> Denial:
    return Denial(decision.reason or Reason.INTERNAL_ERROR, decision.detail)


def canonical(name: str) -> Host:
    try:
        return canonical_host(f"[{name}]" if ":" in name else name)
    except HostError as exc:
        raise Denial(exc.reason, str(exc)) from exc
