"""What the MCP server decides with, built from its options: the rules (read again when their
files change), who a caller is, the guard, the broker, the budgets and the audit log. The same
parts the proxy builds (proxy/request/settings.py), from the proxy's own code.

Who a caller is, in this order, as the proxy finds it:
1. `Authorization: Basic id:key`: the sandbox's proxy credentials (the id and the key whose
   SHA-256 the rules hold, `HTTP_PROXY=http://id:key@...`), checked by the proxy's Identifier;
   a wrong key or an unknown id is refused, the two alike;
2. else the source address, through the source registry the sandbox runtime fills
   (`<state>/registry.json`, `sealgate sources add`), as for the proxy's transparent mode;
3. else the rules' default policy, if they name one.

Or `Authorization: Bearer <token>`, a token `sealgate mcp token` minted for one sandbox and this
endpoint (bearer.py): its signature, its lifetime, its audience (the endpoint's resource URI,
`--resource`) and its sandbox (still in the rules) checked; a bearer that fails is refused,
never taken for anyone else, and never passed on.
"""

from __future__ import annotations

import logging
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path

from sealgate.audit import AuditLog
from sealgate.hostport import parse_hostport
from sealgate.proxy.calls import (
    DEFAULT_SANDBOX_NETWORKS,
    Broker,
    BudgetLedger,
    Decision,
    Denial,
    Guard,
    Identifier,
    Identity,
    Policy,
    Resolver,
    RoleSessions,
    RulesError,
    RuleSet,
    SecretBroker,
    SecretError,
    SourceRegistry,
    load_rules,
    open_store,
    policy_for,
)
from sealgate.reasons import Reason
from sealgate.watch import Snapshot

from .bearer import KEY_FILE, InvalidToken, KeyFile, canonical_resource, verify
from .pool import Pool

__all__ = ["Service", "Settings"]

log = logging.getLogger("sealgate.mcp")
_RELOAD_EVERY = 1.0  # seconds between looks at the rules files


@dataclass(frozen=True)
class Settings:
    listen: tuple[str, int]
    rules: Path
    state: Path
    resource: str  # the endpoint's canonical resource URI: its tokens' audience
    resolver: str | None = None
    upstream_ca: Path | None = None
    secret_stores: tuple[str, ...] = ()
    sandbox_networks: tuple[str, ...] = ()
    audit_log: str | None = None
    max_body: int = 1 << 20
    authorization_servers: tuple[str, ...] = ()  # named in the resource metadata, if any


@dataclass
class _Rules:
    rules: RuleSet
    seen: Snapshot
    identifier: Identifier


@dataclass
class Service:
    """Built by `Service.start(settings)`; raises ValueError naming what is wrong."""

    settings: Settings
    broker: Broker
    guard: Guard
    audit: AuditLog
    tls: ssl.SSLContext
    keys: KeyFile
    budgets: BudgetLedger = field(default_factory=BudgetLedger)
    pool: Pool = field(default_factory=Pool)
    _current: _Rules | None = None
    _looked: float = 0.0

    @classmethod
    def start(cls, settings: Settings) -> Service:
        urls = settings.secret_stores or (f"file:{settings.state / 'secrets.yaml'}",)
        cafile = str(settings.upstream_ca) if settings.upstream_ca else None
        try:
            broker = Broker(SecretBroker([open_store(url) for url in urls]),
                            RoleSessions(cafile=cafile))
        except SecretError as exc:
            raise ValueError(f"secret stores: {exc}") from None
        try:
            guard = Guard(Resolver.from_spec(settings.resolver), [settings.listen],
                          settings.sandbox_networks or DEFAULT_SANDBOX_NETWORKS)
        except (ValueError, OSError) as exc:
            raise ValueError(f"guard: {exc}") from None
        audit_path = (None if settings.audit_log == "off"
                      else Path(settings.audit_log or settings.state / "audit.log"))
        service = cls(settings, broker, guard, AuditLog(audit_path),
                      ssl.create_default_context(cafile=cafile),
                      KeyFile(settings.state / KEY_FILE))
        service._current = service._load()  # RulesError: the server does not start
        return service

    def _load(self) -> _Rules:
        rules = load_rules(self.settings.rules)
        try:
            self.broker.check(rules)
        except (SecretError, Denial) as exc:
            raise RulesError(self.settings.rules, None, "inject",
                             f"secret reference: {exc}") from None
        for warning in rules.warnings:
            log.warning("sealgate mcp: rules warning: %s", warning)
        registry = SourceRegistry(self.settings.state / "registry.json")
        seen = Snapshot.take((self.settings.rules, *rules.sources))
        return _Rules(rules, seen, Identifier(rules, registry))

    @property
    def rules(self) -> RuleSet:
        return self._state().rules

    def _state(self) -> _Rules:
        """The rules in force: read again when their files changed (at most once a second); a
        broken file keeps the rules in force, said on stderr once per change."""
        current = self._current
        assert current is not None, "Service.start loads the rules"
        now = time.monotonic()
        if now - self._looked >= _RELOAD_EVERY:
            self._looked = now
            if current.seen.changed():
                try:
                    current = self._current = self._load()
                except RulesError as exc:
                    log.error("sealgate mcp: rules reload failed, keeping the rules in force: "
                              "%s", exc)
                    current.seen = Snapshot.take(current.seen.paths)
        return current

    def identify(self, authorization: str | None, peer: str | None) -> Identity:
        """Who asks (see the module's docstring); Denial for credentials that prove nothing."""
        identifier = self._state().identifier
        if authorization is not None:
            if authorization.strip().partition(" ")[0].lower() != "basic":
                raise Denial(Reason.IDENTITY_INVALID, "use Authorization: Basic <sandbox id:key> "
                                                      "or Bearer <token>")
            proven = identifier.from_proxy_authorization(authorization)
            if proven.identity is not None:
                return proven.identity
        if peer is not None:
            by_source = identifier.from_source(peer)
            if by_source is not None:
                return by_source
        return identifier.default()

    def bearer(self, token: str) -> Identity:
        """The sandbox a bearer token was minted for (bearer.py); InvalidToken when it proves
        nothing: a bad signature, expired, another endpoint's, or its sandbox gone from the
        rules."""
        claims = verify(self.keys.current(), token, self.settings.resource, time.time())
        entry = self.rules.sandboxes.get(claims.sandbox)
        if entry is None:
            raise InvalidToken("the token's sandbox is not in the rules")
        return Identity(claims.sandbox, entry.policy, "bearer")

    def named(self, sandbox: str | None) -> Identity:
        """The caller of a stdio server: the sandbox its command line names (`--sandbox`), under
        the rules in force now (a reload may change its policy), else the default policy.
        Whoever starts the process chooses: stdio is for a local client the operator starts."""
        identifier = self._state().identifier
        if sandbox is None:
            return identifier.default()
        return identifier.current(Identity(sandbox, None, "stdio"))

    def policy(self, identity: Identity) -> Policy | Decision:
        """The policy an identity names, or the refusal (`decide`'s own first step)."""
        return policy_for(self.rules, identity)

    async def close(self) -> None:
        await self.pool.close()
        await self.broker.close()
        self.audit.close()


def listen_resource(listen: tuple[str, int]) -> str:
    """The resource URI when no --resource is given: the endpoint's URL as --listen makes it
    (the one the ready banner prints), canonical."""
    host, port = listen
    return canonical_resource(f"http://{f'[{host}]' if ':' in host else host}:{port}/mcp")


def listen_address(text: str) -> tuple[str, int]:
    """`HOST:PORT` as the guard's own-address check takes it; ValueError when malformed."""
    return parse_hostport(text)
