"""Each processor's behaviour lives on its type (`sealgate.credentials.processors`): nothing
outside the credentials library asks which processor it has.

Read from the source (AST, nothing executed), over every module of proxy/, issuer/, sandbox/
and sealgate/ but sealgate/credentials/: no `isinstance`/`issubclass` against a processor class,
no `type(x) is ...` with one, no `case BearerProcessor():`, and no processor's `kind` (or
`type`) compared with, or matched against, a processor's name written as a string. Adding a
processor is then its module (the registry finds it), not a hunt through the callers.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections.abc import Iterator
from pathlib import Path

from sealgate.credentials import processors
from sealgate.credentials.processors import base
from tests.layout import modules as layout_modules

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = "sealgate.credentials"


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _groups() -> Iterator[str]:
    """Names the processors package gives to tuples or sets of processor classes (as
    `EXCHANGED` was): `isinstance(x, EXCHANGED)` is a switch too."""
    for info in pkgutil.iter_modules(processors.__path__, processors.__name__ + "."):
        for name, value in vars(importlib.import_module(info.name)).items():
            if (isinstance(value, tuple | frozenset) and value
                    and all(isinstance(v, type) and issubclass(v, base.Processor)
                            for v in value)):
                yield name


# Every processor type, the abstract ones too, and the registry's names for them.
CLASSES = frozenset({
    "TokenExchange", *_groups(),
    *(c.__name__ for c in (base.Processor, *_subclasses(base.Processor))),
})
KINDS = frozenset(processors.PROCESSOR_TYPES)
KIND_ATTRIBUTES = frozenset({"kind", "type"})


def _names(node: ast.AST) -> set[str]:
    """The identifiers `node` mentions (`pr.BearerProcessor` -> BearerProcessor)."""
    found = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Name):
            found.add(inner.id)
        elif isinstance(inner, ast.Attribute):
            found.add(inner.attr)
    return found


def _strings(node: ast.AST) -> set[str]:
    """The string literals of `node`, alone or in a tuple, list or set."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}


def _is_kind(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in KIND_ATTRIBUTES


def _type_test(node: ast.Compare) -> bool:
    """`type(x) is BearerProcessor`, `type(x) in (...)`."""
    sides = [node.left, *node.comparators]
    typed = any(isinstance(s, ast.Call) and isinstance(s.func, ast.Name) and s.func.id == "type"
                for s in sides)
    return typed and any(_names(s) & CLASSES for s in sides)


def _kind_test(node: ast.Compare) -> bool:
    """`x.kind == "bearer"`, `x.type in ("oauth2", ...)`."""
    sides = [node.left, *node.comparators]
    return any(_is_kind(s) for s in sides) and any(_strings(s) & KINDS for s in sides)


def _switches(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2
                and _names(node.args[1]) & CLASSES):
            yield node.lineno, f"{node.func.id}(..., {ast.unparse(node.args[1])})"
        elif isinstance(node, ast.Compare) and (_type_test(node) or _kind_test(node)):
            yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.MatchClass) and _names(node.cls) & CLASSES:
            yield node.lineno, f"case {ast.unparse(node)}"
        elif isinstance(node, ast.Match) and _is_kind(node.subject):
            for case in node.cases:
                if _strings_in_pattern(case.pattern) & KINDS:
                    yield case.pattern.lineno, f"match {ast.unparse(node.subject)}: case " \
                        f"{ast.unparse(case.pattern)}"


def _strings_in_pattern(pattern: ast.pattern) -> set[str]:
    return {v.value.value for v in ast.walk(pattern)
            if isinstance(v, ast.MatchValue) and isinstance(v.value, ast.Constant)
            and isinstance(v.value.value, str)}


def type_switches(root: Path) -> list[str]:
    """`path:line: what` for every switch on a processor's type outside the library."""
    found = []
    for name, path in sorted(layout_modules(root).items()):
        if name == LIBRARY or name.startswith(LIBRARY + "."):
            continue
        tree = ast.parse(path.read_text(), str(path))
        found += [f"{path.relative_to(root)}:{line}: {what}"
                  for line, what in sorted(_switches(tree), key=lambda hit: hit[0])]
    return found


def test_no_switch_on_processor_types_outside_the_library() -> None:
    found = type_switches(ROOT)
    assert not found, ("ask the processor (a method of sealgate.credentials.processors.base."
                       "Processor) instead of switching on its type:\n  " + "\n  ".join(found))


def test_the_scan_sees_the_parts_and_every_processor() -> None:
    names = layout_modules(ROOT)
    assert "sealgate.proxy.credentials.inject" in names and "sealgate.issuer.mintcli" in names
    assert {"BearerProcessor", "AwsSigV4Processor", "OAuth2Processor", "ExchangeProcessor",
            "FixedHeaderProcessor", "Processor"} <= CLASSES
    assert len(KINDS) == len(processors.PROCESSOR_TYPES) >= 10


def test_a_planted_switch_is_found(tmp_path: Path) -> None:
    planted = {
        "sealgate/__init__.py": "",
        "sealgate/credentials/__init__.py": "isinstance(p, BearerProcessor)\n",  # the library
        "sealgate/proxy/__init__.py": "",
        "sealgate/proxy/a.py": (
            "if isinstance(p, (pr.BearerProcessor, HeaderProcessor)):\n"
            "    pass\n"
            "if type(p) is QueryProcessor or p.kind == 'bearer':\n"
            "    pass\n"
            "ok = isinstance(p, dict) and p.kind == 'not-a-processor' and p.name == 'bearer'\n"
            "match p:\n"
            "    case AwsSigV4Processor(services=s):\n"
            "        pass\n"
            "match p.type:\n"
            "    case 'oauth2' | 'other':\n"
            "        pass\n"
            "x = processor.kind in ('github-app', 'gcp-service-account')\n"
        ),
    }
    for name, text in planted.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert type_switches(tmp_path) == [
        "sealgate/proxy/a.py:1: isinstance(..., (pr.BearerProcessor, HeaderProcessor))",
        "sealgate/proxy/a.py:3: type(p) is QueryProcessor",
        "sealgate/proxy/a.py:3: p.kind == 'bearer'",
        "sealgate/proxy/a.py:7: case AwsSigV4Processor(services=s)",
        "sealgate/proxy/a.py:10: match p.type: case 'oauth2' | 'other'",
        "sealgate/proxy/a.py:12: processor.kind in ('github-app', 'gcp-service-account')",
    ]

