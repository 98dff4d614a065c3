"""A rule's `inject` list: which secret, from which store, goes where in the request.

    inject:
      - secret: vault:kv/data/ci/github#token      # any store's reference, or Vault's split form
        as: bearer                                 # or the processor's JSON form, as a mapping
      - secret: {mount: kv, path: ci/stripe, field: key, kv_version: 2}
        as: {type: placeholder, header: X-Api-Key, placeholder: sg-placeholder-stripe}
        name: stripe                               # optional: what a tool's `credential` names

The processor vocabulary is the one sealed tokens carry (docs/token-format.md), so a brokered
credential and a sealed one are put into requests by the same code.
"""

from __future__ import annotations

import re
from typing import Final

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from sealgate.credentials.errors import SecretConfigError
from sealgate.credentials.processors import (
    PROCESSOR_TYPES,
    InjectionError,
    processor_from_object,
)
from sealgate.credentials.secretref import SecretRef, parse_ref
from sealgate.yamlfile import YamlFile, join, show

from .model import Injection

__all__ = ["injections"]

_INJECT_KEYS: Final = ("secret", "as")  # required; `name` besides, for a tool to name it
_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_VAULT_KEYS: Final = ("mount", "path", "field", "kv_version")
# Processor fields that hold a comma-separated list, which rules may also write as a list.
_LIST_FIELDS: Final = frozenset[str]().union(*(c.list_fields for c in PROCESSOR_TYPES.values()))


def injections(doc: YamlFile, node: Node, field: str) -> tuple[Injection, ...]:
    """The `inject` list at `node`; at most one credential writes each header or parameter."""
    inject = tuple(
        _injection(doc, item, f"{field}[{i}]") for i, item in enumerate(doc.sequence(node, field))
    )
    # Two credentials for one header (or parameter): one would undo the other on every
    # request, or make the proxy refuse it (injection_conflict).
    first: dict[str, int] = {}
    for i, injection in enumerate(inject):
        written = injection.processor.target
        if written in first:
            raise doc.error(node, field, f"[{first[written]}] and [{i}] both write {written}")
        first[written] = i
    return inject


def _injection(doc: YamlFile, node: Node, field: str) -> Injection:
    entries = doc.mapping(node, field)
    doc.expect_keys(entries, node, field, (*_INJECT_KEYS, "name"), required=_INJECT_KEYS)
    name = None
    if "name" in entries:
        name_node = entries["name"][1]
        name = doc.string(name_node, f"{field}.name")
        if not _NAME.fullmatch(name):
            raise doc.error(name_node, f"{field}.name", f"{show(name)} must be 1-64 of A-Z a-z "
                                                        "0-9 . _ - (not starting with . _ -)")
    secret_node = entries["secret"][1]
    try:
        ref = _secret_ref(doc, secret_node, f"{field}.secret")
    except SecretConfigError as exc:
        raise doc.error(secret_node, f"{field}.secret", str(exc)) from None
    as_node = entries["as"][1]
    as_field = f"{field}.as"
    # `as: bearer` is short for `as: {type: bearer}`.
    if isinstance(as_node, ScalarNode):
        spec: dict[str, str] = {"type": doc.string(as_node, as_field)}
    else:
        spec = {
            key: _value(doc, value, f"{as_field}.{key}", listed=key in _LIST_FIELDS)
            for key, (_, value) in doc.mapping(as_node, as_field).items()
        }
    try:
        processor = processor_from_object(spec)
    except InjectionError as exc:
        raise doc.error(as_node, as_field, str(exc)) from None
    return Injection(ref, processor, name)


def _value(doc: YamlFile, node: Node, field: str, *, listed: bool) -> str:
    """A processor field: a string, or for a list field `[s3, sts]`, meaning `"s3,sts"`."""
    if listed and isinstance(node, SequenceNode):
        items = doc.sequence(node, field)
        return ",".join(doc.string(item, f"{field}[{i}]") for i, item in enumerate(items))
    return doc.string(node, field)


def _secret_ref(doc: YamlFile, node: Node, field: str) -> SecretRef:
    """`vault:kv/data/ci/github#token` (any store), or Vault's split form
    `{mount: kv, path: ci/github, field: token, kv_version: 2}`."""
    if not isinstance(node, MappingNode):
        return parse_ref(doc.string(node, field))
    entries = doc.mapping(node, field)
    doc.expect_keys(entries, node, field, _VAULT_KEYS, required=_VAULT_KEYS[:3])
    mount, path, key = (doc.string(entries[k][1], join(field, k)) for k in _VAULT_KEYS[:3])
    version = entries.get("kv_version")
    kv = 2 if version is None else doc.integer(version[1], f"{field}.kv_version", 1, 2)
    return SecretRef.vault(mount, path, key, kv_version=kv)
