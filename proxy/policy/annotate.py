"""What `sealgate rules check|test|diff` print for a reviewer's tools: GitHub Actions' workflow
commands (`--format github`: `::error file=F,line=L,title=T::message`, shown on the pull
request's lines) and a diff as Markdown for a pull request's comment (`diff --format
markdown`). The text and JSON forms are cli.py's.

Workflow commands are parsed by the runner from the log: a message or property that carried a
newline or `::` could write a command of its own (a rules file is the pull request's author's
text), so both are escaped as the runner's toolkit does (`%`, CR, LF; and `:` `,` in
properties)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .bound import Crossing
from .cases import Outcome
from .diff import Change

_SIGNS = {"+": "added", "-": "removed", "~": "changed"}


def _data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _property(text: str) -> str:
    return _data(text).replace(":", "%3A").replace(",", "%2C")


def workflow(kind: str, message: str, *, file: str | None = None, line: int | None = None,
             title: str | None = None) -> str:
    """One workflow command (`error`, `warning`, `notice`)."""
    props = [f"{name}={_property(str(value))}" for name, value in
             (("file", file), ("line", line), ("title", title)) if value is not None]
    return f"::{kind}{' ' + ','.join(props) if props else ''}::{_data(message)}"


def located(where: str) -> tuple[str | None, int | None]:
    """`file:line` (as the rules' `where` and `source` say it) as its parts."""
    file, _, line = where.rpartition(":")
    if file and line.isdigit():
        return file, int(line)
    return (where or None), None


def check(reports: Iterable[Mapping[str, Any]], strict: bool) -> list[str]:
    out = []
    for report in reports:
        if error := report["error"]:
            out.append(workflow("error", error["message"], file=error["file"],
                                line=error["line"], title=f"rules: {error['field'] or 'file'}"))
            continue
        for w in report["warnings"]:
            out.append(workflow("error" if strict else "warning", w["message"], file=w["file"],
                                line=w["line"], title=f"rules: {w['code']}"))
    return out


def test(outcomes: Iterable[Outcome]) -> list[str]:
    out = []
    for outcome in outcomes:
        if outcome.passed:
            continue
        file, line = located(outcome.case.where)
        out.append(workflow("error", "; ".join(outcome.failures), file=file, line=line,
                            title=f"rules test: {outcome.case.name}"))
    return out


def diff(changes: Iterable[Change], fail_on_widen: bool) -> list[str]:
    out = []
    for c in changes:
        if c.widens is False:
            continue
        file, line = located(c.where)
        kind = "error" if fail_on_widen else "warning"
        verdict = "widens access" if c.widens else "may widen access: review it"
        out.append(workflow(kind, f"{c.scope}: {_SIGNS[c.sign]}: {c.what} ({verdict})",
                            file=file, line=line, title="rules diff"))
    return out


def bound(crossings: Iterable[Crossing]) -> list[str]:
    out = []
    for c in crossings:
        file, line = located(c.where)
        request = f": {c.request}" if c.request else ""
        out.append(workflow("error", f"policy {c.policy}: {c.what}{request}", file=file,
                            line=line, title=f"rules bound: {c.bound}"))
    return out


def markdown(changes: list[Change], old: str, new: str) -> str:
    """The changes, per policy or sandbox, as a pull request's comment: what widens first,
    each with its place as a link (relative to the repository's root)."""
    if not changes:
        return f"**sealgate rules diff** `{old}` → `{new}`: no changes in meaning.\n"
    widening = sum(1 for c in changes if c.widens is not False)
    lines = [f"**sealgate rules diff** `{old}` → `{new}`: {len(changes)} changes, "
             f"{widening} widen or may widen access.", ""]
    scopes: dict[str, list[Change]] = {}
    for c in changes:
        scopes.setdefault(c.scope, []).append(c)
    order = sorted(scopes, key=lambda s: (not any(c.widens for c in scopes[s]), s))
    for scope in order:
        lines += [f"#### {_cell(scope)}", "", "| | change | where | |", "|---|---|---|---|"]
        for c in sorted(scopes[scope], key=lambda c: c.widens is not True):
            file, line = located(c.where)
            where = "" if file is None else \
                f"[{_cell(c.where)}]({file}{'' if line is None else f'#L{line}'})"
            tag = {True: "**widens**", False: "narrows", None: "review"}[c.widens]
            lines.append(f"| {c.sign} | {_cell(c.what)} | {where} | {tag} |")
        lines.append("")
    return "\n".join(lines)


def _cell(text: str) -> str:
    """Text safe in a Markdown table cell: no pipe, no newline, no HTML."""
    return (text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
            .replace("<", "&lt;").replace(">", "&gt;"))
