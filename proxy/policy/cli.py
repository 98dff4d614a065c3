"""`sealgate rules`: check, explain, test, diff and suggest rules files, as CI and reviewers use
them.

Exit codes: 0 fine; 1 the answer is no (rules invalid, a case failed, a request denied, a change
widens access under --fail-on-widen); 2 the question was wrong (usage, an unknown sandbox).

Why one module of ~420 lines: it is the argparse face of eight subcommands and the printing of
their answers; the work of each is its own module's (`explain`, `cases`, `diff`, `bound`,
`suggest`, `schema`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from sealgate.clikit import Subcommands
from sealgate.hostport import format_hostport

from . import annotate, gitrules, schema, suggest
from .bound import bound
from .cases import load_cases, run_case
from .ceiling import load_ceiling
from .diff import diff
from .explain import ExplainError, Explanation, describe, explain, injects
from .explaintool import explain_tool
from .model import RuleSet, RuleWarning
from .rulesfile import RulesError, load_rules


def register(sub: Subcommands) -> None:
    p = sub.add_parser("rules", help="check, explain, test and diff rules files")
    rs = p.add_subparsers(dest="action", required=True, metavar="ACTION")

    check = rs.add_parser("check", help="load rules as the proxy would; list warnings")
    check.add_argument("paths", nargs="+", metavar="RULES", type=Path,
                       help="rules file or directory (each checked on its own)")
    check.add_argument("--strict", action="store_true", help="warnings fail the check too")
    _formats(check, "text", "json", "github")
    check.set_defaults(func=_check)

    ex = rs.add_parser("explain", help="what the rules decide for one request, and why")
    ex.add_argument("rules", type=Path, metavar="RULES")
    who = ex.add_mutually_exclusive_group()
    who.add_argument("--sandbox", help="as this sandbox (default: unidentified traffic)")
    who.add_argument("--policy", help="under this policy")
    ex.add_argument("method", metavar="METHOD")
    ex.add_argument("url", metavar="URL")
    ex.add_argument("--json", action="store_true")
    ex.set_defaults(func=_explain)

    et = rs.add_parser("explain-tool", help="what the rules decide for one MCP tool call "
                                            "(sealgate mcp serve), and why")
    et.add_argument("rules", type=Path, metavar="RULES")
    who = et.add_mutually_exclusive_group()
    who.add_argument("--sandbox", help="as this sandbox (default: unidentified traffic)")
    who.add_argument("--policy", help="under this policy")
    et.add_argument("tool", metavar="TOOL", help="the tool's name (http_request: the generic "
                                                "one; SERVER/TOOL: a gateway server's tool)")
    et.add_argument("--arguments", metavar="JSON", default="{}",
                    help="the call's arguments, a JSON object (default {})")
    et.add_argument("--json", action="store_true")
    et.set_defaults(func=_explain)

    test = rs.add_parser("test", help="run rules test cases (see docs/rules.md)")
    test.add_argument("rules", type=Path, metavar="RULES")
    test.add_argument("cases", nargs="+", type=Path, metavar="CASES",
                      help="case files, or directories of them (each *.yaml in it)")
    _formats(test, "text", "json", "github")
    test.set_defaults(func=_test)

    d = rs.add_parser("diff", help="what changes between two versions of the rules")
    d.add_argument("old", metavar="OLD", help="the rules before: a file or directory, or with "
                                            "PATH a git revision (origin/main)")
    d.add_argument("new", metavar="NEW", help="the rules after: likewise (HEAD)")
    d.add_argument("at", nargs="?", metavar="PATH",
                   help="after --: OLD and NEW are git revisions, and PATH the rules file or "
                        "directory read from each (from git's objects, not the work tree)")
    d.add_argument("--fail-on-widen", action="store_true",
                   help="exit 1 if any change gives some sandbox more access, or may (the "
                        "[review] changes)")
    _formats(d, "text", "json", "github", "markdown")
    d.set_defaults(func=_diff)

    sc = rs.add_parser("schema", help="the JSON Schema of rules files (rules/schema.json), "
                                      "for editors")
    sc.set_defaults(func=_schema)

    bd = rs.add_parser("bound", help="prove every policy stays inside a ceiling (what no "
                                     "policy may ever allow)")
    bd.add_argument("ceiling", type=Path, metavar="CEILING", help="the ceiling file")
    bd.add_argument("rules", type=Path, metavar="RULES", help="rules file or directory")
    _formats(bd, "text", "json", "github")
    bd.set_defaults(func=_bound)

    sg = rs.add_parser("suggest", help="the smallest rules that would have allowed what a "
                                       "report-mode run's audit log shows")
    sg.add_argument("rules", type=Path, metavar="RULES", help="the rules the run had")
    sg.add_argument("--from", dest="audit", type=Path, required=True, metavar="AUDIT_LOG",
                    help="the proxy's audit log (JSON lines; - for standard input)")
    sg.add_argument("--policy", help="only this policy's requests")
    sg.add_argument("--paths", type=int, default=5, metavar="N",
                    help="more than N distinct paths under one prefix become prefix/** "
                         "(default 5)")
    sg.add_argument("--include-denied", action="store_true",
                    help="learn from enforce-mode refusals (not_allowed) too, not only from "
                         "report-mode lines")
    sg.add_argument("--json", action="store_true")
    sg.set_defaults(func=_suggest)


def _formats(parser: argparse.ArgumentParser, *names: str) -> None:
    parser.add_argument("--format", choices=names, default="text",
                        help="text (default), json, github (workflow commands: annotations "
                             "on the pull request's lines)"
                             + (", markdown (a pull request comment)" if "markdown" in names
                                else ""))
    parser.add_argument("--json", dest="format", action="store_const", const="json",
                        help="the same as --format json")


def _case_files(given: Path) -> list[Path]:
    """A case file, or every *.yaml / *.yml directly in a directory, sorted."""
    if not given.is_dir():
        return [given]
    return sorted(p for p in given.iterdir()
                  if not p.name.startswith(".") and p.suffix in (".yaml", ".yml"))


def _unprefixed(where: str, prefixes: list[str]) -> str:
    for prefix in prefixes:
        if where.startswith(prefix):
            return where[len(prefix):]
    return where


def _lines(lines: list[str]) -> None:
    for line in lines:
        print(line)


def _load(path: Path) -> RuleSet | None:
    """The rules, or None after printing why not."""
    try:
        return load_rules(path)
    except RulesError as exc:
        print(f"sealgate: {exc}", file=sys.stderr)
        return None


# -- check ------------------------------------------------------------------------------------


def _check(args: argparse.Namespace) -> int:
    reports = [_check_one(path) for path in args.paths]
    failed = any(r["error"] or (args.strict and r["warnings"]) for r in reports)
    if args.format == "json":
        print(json.dumps({"ok": not failed, "results": reports}, indent=2))
        return 1 if failed else 0
    if args.format == "github":
        _lines(annotate.check(reports, args.strict))
        return 1 if failed else 0
    for report in reports:
        if report["error"]:
            print(f"invalid  {report['error']['text']}")
            continue
        counts = report["counts"]
        print(f"ok       {report['path']}: {counts['policies']} policies, {counts['rules']} "
              f"rules, {counts['sandboxes']} sandboxes, default_policy "
              f"{report['default_policy'] or 'none'}")
        for warning in report["warnings"]:
            print(f"warning  {warning['text']}  [{warning['code']}]")
    return 1 if failed else 0


def _check_one(path: Path) -> dict[str, Any]:
    try:
        rules = load_rules(path)
    except RulesError as exc:
        error = {"file": str(exc.path), "line": exc.line, "field": exc.field,
                 "message": exc.message, "text": str(exc)}
        return {"path": str(path), "error": error, "warnings": []}
    return {
        "path": str(path), "error": None,
        "warnings": [_warning(w) for w in rules.warnings],
        "default_policy": rules.default_policy,
        "counts": {"policies": len(rules.policies), "sandboxes": len(rules.sandboxes),
                   "rules": sum(len(p.rules) for p in rules.policies.values())},
    }


def _warning(w: RuleWarning) -> dict[str, Any]:
    return {"code": w.code, "file": str(w.path), "line": w.line, "field": w.field,
            "message": w.message, "text": str(w)}


# -- explain ----------------------------------------------------------------------------------


def _explain(args: argparse.Namespace) -> int:
    rules = _load(args.rules)
    if rules is None:
        return 2
    try:
        if "tool" in args:
            result = explain_tool(rules, args.tool, _arguments(args.arguments),
                                  sandbox=args.sandbox, policy=args.policy)
        else:
            result = explain(rules, args.method, args.url, sandbox=args.sandbox,
                             policy=args.policy)
    except ExplainError as exc:
        print(f"sealgate: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print("\n".join(_explanation_lines(result)))
    return 1 if result.decision == "deny" else 0


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ExplainError(f"--arguments is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ExplainError("--arguments must be a JSON object")
    return value


def _explanation_lines(r: Explanation) -> list[str]:
    who = f"sandbox {r.sandbox} -> " if r.sandbox else ""
    lines = [f"tool      {r.tool}"] if r.tool is not None else []
    if r.method:
        lines.append(f"request   {r.method} {r.url}")
    if r.policy:
        lines.append(f"policy    {who}{r.policy} ({r.mode})")
    if r.host is not None and r.port is not None:
        lines.append(f"target    {format_hostport(r.host, r.port)}{r.path or ''}")
    if r.rule is not None:
        lines.append(f"rule      {r.rule.source}: {describe(r.rule)}")
        lines += [f"inject    {i}" for i in injects(r.rule)]
    for miss in r.misses:
        lines.append(f"no match  {miss.rule.source}: {miss.why}")
    if r.tunnel is not None:
        lines.append("tls       " + ("passed through, not decrypted" if r.tunnel else
                                     "intercepted: requests inside are checked one by one"))
    lines += [f"note      {note}" for note in r.notes]
    verdict = r.decision.upper()
    lines.append(f"decision  {verdict}" + (f" {r.reason}: {r.detail}" if r.reason else ""))
    return lines


# -- test -------------------------------------------------------------------------------------


def _test(args: argparse.Namespace) -> int:
    rules = _load(args.rules)
    if rules is None:
        return 2
    outcomes = []
    for path in [f for given in args.cases for f in _case_files(given)]:
        try:
            cases = load_cases(path)
        except RulesError as exc:
            print(f"sealgate: {exc}", file=sys.stderr)
            return 2
        outcomes += [run_case(rules, case) for case in cases]
    failed = [o for o in outcomes if not o.passed]
    if args.format == "json":
        print(json.dumps({"passed": len(outcomes) - len(failed), "failed": len(failed),
                          "cases": [o.to_json() for o in outcomes]}, indent=2))
    elif args.format == "github":
        _lines([*annotate.test(outcomes),
                f"::notice::{len(outcomes) - len(failed)} passed, {len(failed)} failed"])
    else:
        for o in outcomes:
            print(f"{'PASS' if o.passed else 'FAIL'}  {o.case.name}  ({o.case.where})")
            for failure in o.failures:
                print(f"      {failure}")
        print(f"{len(outcomes) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


# -- diff -------------------------------------------------------------------------------------


def _diff(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="sealgate-rules-") as scratch:
        try:
            paths = [Path(args.old), Path(args.new)] if args.at is None else [
                gitrules.checkout(rev, args.at, Path(scratch) / side)
                for rev, side in ((args.old, "old"), (args.new, "new"))]
        except RulesError as exc:
            print(f"sealgate: {exc}", file=sys.stderr)
            return 2
        old, new = _load(paths[0]), _load(paths[1])
        if old is None or new is None:
            return 2
        changes = diff(old, new)
    if args.at is not None:  # places named as in the repository, not the scratch copy
        prefixes = [f"{Path(scratch) / side}/" for side in ("old", "new")]
        changes = [dataclasses.replace(c, where=_unprefixed(c.where, prefixes))
                   for c in changes]
    widening = [c for c in changes if c.widens is not False]
    if args.format == "json":
        print(json.dumps({"changes": [c.to_json() for c in changes],
                          "widens_or_review": len(widening)}, indent=2))
    elif args.format == "github":
        _lines(annotate.diff(changes, args.fail_on_widen))
    elif args.format == "markdown":
        print(annotate.markdown(changes, args.old, args.new))
    else:
        scope = None
        for c in changes:
            if c.scope != scope:
                scope = c.scope
                print(scope)
            tag = {True: "  [widens]", False: "", None: "  [review]"}[c.widens]
            where = f"  ({c.where})" if c.where else ""
            print(f"  {c.sign} {c.what}{where}{tag}")
        print(f"{len(changes)} changes, {len(widening)} widen or may widen access" if changes
              else "no changes in meaning")
    return 1 if args.fail_on_widen and widening else 0


def _schema(args: argparse.Namespace) -> int:
    print(json.dumps(schema.schema(), indent=2))
    return 0


# -- bound ------------------------------------------------------------------------------------


def _bound(args: argparse.Namespace) -> int:
    try:
        ceiling = load_ceiling(args.ceiling)
    except RulesError as exc:
        print(f"sealgate: {exc}", file=sys.stderr)
        return 2
    rules = _load(args.rules)
    if rules is None:
        return 2
    crossings = bound(ceiling, rules)
    bounded = sorted(n for n in rules.policies
                     if ceiling.policies is None or n in ceiling.policies)
    missing = sorted((ceiling.policies or frozenset()) - rules.policies.keys())
    if args.format == "json":
        print(json.dumps({"ok": not crossings, "policies": bounded, "not_in_rules": missing,
                          "crossings": [c.to_json() for c in crossings]}, indent=2))
    elif args.format == "github":
        _lines(annotate.bound(crossings))
    else:
        for c in crossings:
            where = f"{c.where}: " if c.where else ""
            request = f": {c.request}" if c.request else ""
            print(f"crosses  {where}policy {c.policy}: {c.what} [{c.bound}]{request}")
        crossed = {c.policy for c in crossings}
        for name in bounded:
            if name not in crossed:
                print(f"inside   policy {name}")
        for name in missing:
            print(f"note     the ceiling names policy {name}, which the rules do not define")
        print(f"{len(bounded)} policies bounded, {len(crossings)} crossings")
    return 1 if crossings else 0


# -- suggest ----------------------------------------------------------------------------------


def _suggest(args: argparse.Namespace) -> int:
    rules = _load(args.rules)
    if rules is None:
        return 2
    if args.policy is not None and args.policy not in rules.policies:
        print(f"sealgate: no policy {args.policy!r} in the rules", file=sys.stderr)
        return 2
    if args.paths < 1:
        print("sealgate: --paths must be 1 or more", file=sys.stderr)
        return 2
    try:
        if str(args.audit) == "-":
            found = suggest.read(sys.stdin, rules, policy=args.policy,
                                 include_denied=args.include_denied)
        else:
            with args.audit.open(encoding="utf-8", errors="replace") as stream:
                found = suggest.read(stream, rules, policy=args.policy,
                                     include_denied=args.include_denied)
    except OSError as exc:
        print(f"sealgate: {args.audit}: {exc.strerror}", file=sys.stderr)
        return 2
    made, still = suggest.learn(rules, found, most_paths=args.paths)
    changes = diff(rules, suggest.with_suggestions(rules, made))
    if args.json:
        print(json.dumps({
            "rules": [s.to_json() for s in made],
            "lines": found.lines, "skipped": dict(found.skipped),
            "requests": sum(sum(c.values()) for c in found.seen.values()),
            "still_refused": [{"policy": r.policy, **dataclasses.asdict(r.seen),
                               "reason": r.reason} for r in still],
            "diff": [c.to_json() for c in changes],
        }, indent=2))
        return 0
    requests = sum(sum(c.values()) for c in found.seen.values())
    print(f"# sealgate rules suggest: {len(made)} rules from {requests} would-deny requests "
          f"in {found.lines} lines of {args.audit}")
    for why, count in sorted(found.skipped.items()):
        print(f"# skipped {count} lines: {why}")
    for r in still:
        what = r.seen.method or "CONNECT"
        print(f"# no rule can allow {what} {format_hostport(r.seen.host, r.seen.port)}"
              f"{r.seen.path or ''} ({r.policy}): {r.reason}")
    if made:
        print("# append each policy's entries to its allow list; what changes (rules diff):")
        for c in changes:
            print(f"#   {c.scope}: {c.sign} {c.what}")
    _lines(suggest.patch(made))
    return 0
