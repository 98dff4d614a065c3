"""The addon's options, and what they configure: one immutable `AddonState`, swapped whole.

mitmproxy calls `configure` with the names of the options that changed; `configure` builds the
parts those options feed and returns a new `AddonState`, so a hook sees either the old
configuration or the new one, never half of each, and a change that fails (a broken rules file,
an unreadable key) leaves the one in force untouched. A reload (SIGHUP, or a rules file that
changed) goes the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mitmproxy import exceptions
from mitmproxy.addonmanager import Loader

from sealgate.audit import AuditLog
from sealgate.credentials.keys import KeyFileError, Keyring
from sealgate.watch import Snapshot

from ..credentials.awsroles import RoleSessions
from ..credentials.broker import Broker
from ..credentials.secrets import SecretBroker, SecretError, open_store
from ..credentials.tokenizer import Tokenizer
from ..engine import mitm
from ..errors import Denial
from ..net import guard as guardmod
from ..net.guard import Guard
from ..net.resolver import Resolver
from ..policy.model import RuleSet
from ..policy.rulesfile import RulesError, load_rules
from .identity import Identifier
from .registry import SourceRegistry

logger = logging.getLogger("sealgate")

_STORE_OPTIONS = {"sealgate_secret_stores", "sealgate_state", "sealgate_secret_ttl",
                  "sealgate_secret_grace"}
_RULES_OPTIONS = {"sealgate_rules", "sealgate_secret_stores", "sealgate_state"}
_AUDIT_OPTIONS = {"sealgate_state", "sealgate_audit_log", "sealgate_audit_stdout"}
_GUARD_OPTIONS = {"sealgate_resolver", "sealgate_sandbox_networks", "mode", "listen_host",
                  "listen_port"}


@dataclass(frozen=True)
class AddonState:
    """What the addon decides with, built from its options and rules files (not the process's
    ProxyConfig, from which those options are set)."""

    rules: RuleSet
    # The rules path and files as they were when loaded (a file added to a rules directory
    # changes the directory): a change means reload.
    rules_seen: Snapshot
    identifier: Identifier
    broker: Broker
    tokenizer: Tokenizer | None  # None: this proxy holds no token keys, tokens are refused
    audit: AuditLog
    guard: Guard
    ssl_insecure: bool  # mitmproxy's option: upstream certificates are not verified


def add_options(loader: Loader) -> None:
    loader.add_option("sealgate_rules", str, "rules", "Rules file or directory.")
    loader.add_option("sealgate_state", str, "var", "State directory: source registry, audit log.")
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
    loader.add_option("sealgate_secret_ttl", int, 300, "Seconds a fetched secret is reused.")
    loader.add_option(
        "sealgate_max_connections", int, 0,
        "Most client connections one worker holds; 0: what its descriptor limit allows.",
    )
    loader.add_option(
        "sealgate_max_connections_per_source", int, 512,
        "Most client connections one source address holds in one worker.",
    )
    loader.add_option(
        "sealgate_secret_grace",
        int,
        30,
        "Seconds a cached secret may still be used while its store is unreachable; "
        "past it requests fail closed with 503 secret_unavailable.",
    )


def configure(current: AddonState | None, updated: set[str], opts: Any) -> AddonState:
    """The settings `updated` options call for; raises OptionsError, leaving `current` as is.
    The audit log a change replaces is closed once the new settings are in place (`retire`)."""
    broker = _broker(opts) if current is None or _STORE_OPTIONS & updated else current.broker
    tokenizer = (
        _tokenizer(opts) if current is None or "sealgate_token_keys" in updated
        else current.tokenizer
    )
    if current is None or _RULES_OPTIONS & updated:
        try:
            rules, seen, identifier = load(opts, broker)
        except RulesError as exc:
            raise exceptions.OptionsError(f"sealgate: cannot load rules: {exc}") from exc
    else:
        rules, seen, identifier = current.rules, current.rules_seen, current.identifier
    guard = _guard(opts) if current is None or _GUARD_OPTIONS & updated else current.guard
    # Last: nothing after it can fail, so a new log (a file, maybe a thread) is never orphaned.
    audit = _audit(opts) if current is None or _AUDIT_OPTIONS & updated else current.audit
    return AddonState(rules, seen, identifier, broker, tokenizer, audit, guard,
                    bool(opts.ssl_insecure))


def retire(old: AddonState | None, new: AddonState) -> None:
    """Close what `old` held that `new` no longer uses."""
    if old is not None and old.audit is not new.audit:
        old.audit.close()


def reload(current: AddonState, opts: Any) -> tuple[AddonState, RulesError | None]:
    """Token keys and rules read again, each on its own: unreadable keys keep the previous ones
    (the reason on stderr), a broken rules file keeps the rules in force and is returned (once
    per change of the file), and neither holds the other back (a key removed to revoke it goes,
    whatever the rules say)."""
    tokenizer = current.tokenizer
    if opts.sealgate_token_keys:
        try:
            tokenizer = Tokenizer(Keyring.load(Path(opts.sealgate_token_keys)))
        except KeyFileError as exc:
            logger.error("token keys reload failed, keeping the previous",
                         extra={"path": opts.sealgate_token_keys, "error": str(exc)})
    keyed = replace(current, tokenizer=tokenizer)
    try:
        rules, seen, identifier = load(opts, current.broker)
    except RulesError as exc:
        # Seen as it is now, so the watcher tries again (and says so) once it changes, not on
        # every poll while it stays broken.
        paths = (Path(opts.sealgate_rules), *current.rules.sources)
        return replace(keyed, rules_seen=Snapshot.take(paths)), exc
    return replace(keyed, rules=rules, rules_seen=seen, identifier=identifier), None


def load(opts: Any, broker: Broker) -> tuple[RuleSet, Snapshot, Identifier]:
    path = Path(opts.sealgate_rules)
    rules = load_rules(path)
    try:
        broker.check(rules)
    except (SecretError, Denial) as exc:
        raise RulesError(path, None, "inject", f"secret reference: {exc}") from None
    registry = SourceRegistry(Path(opts.sealgate_state) / "registry.json")
    for warning in rules.warnings:
        logger.warning("rules warning", extra={"rules": str(path), "warning": warning})
    return rules, Snapshot.take((path, *rules.sources)), Identifier(rules, registry)


def _broker(opts: Any) -> Broker:
    default_store = f"file:{Path(opts.sealgate_state) / 'secrets.yaml'}"
    urls = opts.sealgate_secret_stores or [default_store]
    try:
        stores = [open_store(url) for url in urls]
    except SecretError as exc:
        raise exceptions.OptionsError(f"sealgate: secret stores: {exc}") from exc
    return Broker(
        SecretBroker(stores, ttl=opts.sealgate_secret_ttl, stale_grace=opts.sealgate_secret_grace),
        # STS, for aws-sigv4 roles, is verified against the upstream CA when one is given.
        RoleSessions(cafile=opts.ssl_verify_upstream_trusted_ca or None),
    )


def _tokenizer(opts: Any) -> Tokenizer | None:
    if not opts.sealgate_token_keys:
        return None
    try:
        return Tokenizer(Keyring.load(Path(opts.sealgate_token_keys)))
    except KeyFileError as exc:
        raise exceptions.OptionsError(f"sealgate: token keys: {exc}") from exc


def _audit(opts: Any) -> AuditLog:
    log_opt = opts.sealgate_audit_log
    path = None if log_opt == "off" else Path(log_opt or Path(opts.sealgate_state) / "audit.log")
    try:
        return AuditLog(path, stdout=opts.sealgate_audit_stdout, batch=True)
    except OSError as exc:
        # As an OptionsError, mitmproxy keeps the options in force with the settings in force.
        raise exceptions.OptionsError(f"sealgate: audit log {path}: {exc.strerror}") from exc


def _guard(opts: Any) -> Guard:
    try:
        resolver = Resolver.from_spec(opts.sealgate_resolver)
    except ValueError as exc:
        raise exceptions.OptionsError(f"sealgate: resolver: {exc}") from exc
    try:
        endpoints = mitm.listen_endpoints(opts.mode, opts.listen_host, opts.listen_port)
        return Guard(resolver, endpoints, opts.sealgate_sandbox_networks)
    except (ValueError, OSError) as exc:
        raise exceptions.OptionsError(f"sealgate: guard: {exc}") from exc
