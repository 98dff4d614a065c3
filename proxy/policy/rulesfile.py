"""Rules files: YAML in, a validated `RuleSet` out, or a `RulesError` naming file, line and field.

A rules path is one file or a directory of them; each file is read strictly (sealgate.yamlfile)
and walked by `grammar.RulesDocument`, and the files are merged here, where the checks that span
them happen: a policy or sandbox defined twice, a sandbox naming a policy no file defines. The
format is documented in docs/rules.md.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from sealgate.yamlfile import MAX_FILE_BYTES, Where

from .grammar import RulesDocument
from .model import (
    Policy,
    RulesError,
    RuleSet,
    RuleWarning,
    SandboxEntry,
)

__all__ = ["MAX_FILE_BYTES", "RulesError", "load_rules"]


def load_rules(path: Path) -> RuleSet:
    """Load a rules file, or every `*.yaml` / `*.yml` directly in a directory (sorted, merged)."""
    merged = _Merged()
    for file in _rule_files(path):
        merged.add(RulesDocument(file))
    return merged.finish()


def _rule_files(path: Path) -> list[Path]:
    """The files `load_rules(path)` reads, in order; RulesError when there are none."""
    if path.is_dir():
        # Dotfiles are editor locks and swap files (`.#ci.yaml`) or the hidden `..data` of a
        # Kubernetes ConfigMap mount, never rules.
        try:
            files = sorted(
                p
                for p in path.iterdir()
                if not p.name.startswith(".") and p.suffix in (".yaml", ".yml") and p.is_file()
            )
        except OSError as exc:
            raise RulesError(path, None, "", f"cannot list directory: {exc.strerror}") from None
        if not files:
            raise RulesError(path, None, "", "no *.yaml or *.yml files in this directory")
        return files
    if path.is_file():
        return [path]
    raise RulesError(path, None, "", "not a file or directory")


# --- merging ----------------------------------------------------------------------------------


class _Merged:
    def __init__(self) -> None:
        self.sources: list[Path] = []
        self.warnings: list[RuleWarning] = []
        self.policies: dict[str, tuple[Policy, Where]] = {}
        self.sandboxes: dict[str, tuple[SandboxEntry, Where, Where]] = {}
        self.default_policy: tuple[str, Where] | None = None

    def add(self, doc: RulesDocument) -> None:
        self.sources.append(doc.path)
        self.warnings.extend(doc.warnings)
        for name, (policy, where) in doc.policies.items():
            if name in self.policies:
                raise RulesError(
                    where.path,
                    where.line,
                    f"policies.{name}",
                    f"policy {name!r} is also defined at {self.policies[name][1]}",
                )
            self.policies[name] = (policy, where)
        for sid, (entry, where, policy_where) in doc.sandboxes.items():
            if sid in self.sandboxes:
                raise RulesError(
                    where.path,
                    where.line,
                    f"sandboxes.{sid}",
                    f"sandbox {sid!r} is also defined at {self.sandboxes[sid][1]}",
                )
            self.sandboxes[sid] = (entry, where, policy_where)
        if doc.default_policy is not None:
            if self.default_policy is not None:
                _, where = doc.default_policy
                raise RulesError(
                    where.path,
                    where.line,
                    "default_policy",
                    f"default_policy is also set at {self.default_policy[1]}",
                )
            self.default_policy = doc.default_policy

    def finish(self) -> RuleSet:
        for sid, (entry, _, where) in self.sandboxes.items():
            if entry.policy not in self.policies:
                raise RulesError(
                    where.path,
                    where.line,
                    f"sandboxes.{sid}.policy",
                    f"no policy named {entry.policy!r}",
                )
        if self.default_policy is not None:
            name, where = self.default_policy
            if name not in self.policies:
                raise RulesError(
                    where.path, where.line, "default_policy", f"no policy named {name!r}"
                )
        self._warn_shared_keys()
        return RuleSet(
            policies=MappingProxyType({n: p for n, (p, _) in self.policies.items()}),
            sandboxes=MappingProxyType({s: e for s, (e, _, _) in self.sandboxes.items()}),
            default_policy=self.default_policy[0] if self.default_policy else None,
            warnings=tuple(self.warnings),
            sources=tuple(self.sources),
        )

    def _warn_shared_keys(self) -> None:
        first: dict[bytes, str] = {}
        for sid, (entry, where, _) in self.sandboxes.items():
            other = first.setdefault(entry.key_sha256, sid)
            if other != sid:
                self.warnings.append(
                    RuleWarning(
                        "shared_key",
                        where.path,
                        where.line,
                        f"sandboxes.{sid}.key_sha256",
                        f"same key as sandbox {other!r}: each can authenticate as the other",
                    )
                )
