"""The import graph of sealgate.*, read from the source (AST, nothing executed).

No cycles; nothing in the packages imports tests/ or bench/; no file anywhere imports the old
top-level names `proxy`, `issuer`, `sandbox` (installed, they would be someone else's); and
imports point downward only: the base modules in sealgate/ (files, hostname, audit, ...) import
no part, issuer imports neither proxy nor sandbox, proxy does not import sandbox, kube (the pod
watcher, a client of the proxy's face) imports neither sandbox nor issuer, and nothing imports
kube. sealgate.cli is
the top and may import everything. Lazy imports (inside functions) and TYPE_CHECKING ones count:
they are dependencies all the same.

The MCP server (sealgate.mcp, issue 29) sits above the proxy: it imports the proxy only through
its faces (sealgate.proxy, sealgate.proxy.calls), neither sandbox, issuer nor kube, and none of
those import it. Only sealgate.mcp.sdk imports the `mcp` SDK (and what comes with it), which
is installed in the MCP server's own virtualenv alone; nothing else imports sealgate.mcp.sdk.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path

from tests.layout import modules as layout_modules

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("proxy", "issuer", "sandbox", "kube")  # their folders' names, never imported as such
# Which part may not import which (sealgate.X -> forbidden prefixes); the base is every module
# directly in sealgate/ but the CLI.
FORBIDDEN = {
    "sealgate.proxy": ("sealgate.sandbox", "sealgate.kube", "sealgate.mcp"),
    "sealgate.issuer": ("sealgate.proxy", "sealgate.sandbox", "sealgate.kube", "sealgate.mcp"),
    "sealgate.sandbox": ("sealgate.kube",),
    "sealgate.kube": ("sealgate.sandbox", "sealgate.issuer", "sealgate.mcp"),
    "sealgate.mcp": ("sealgate.sandbox", "sealgate.issuer", "sealgate.kube"),
}
BASE_MAY_NOT = tuple(f"sealgate.{part}" for part in (*PARTS, "mcp"))
# What another part may import of these parts: their faces.
FACES = {
    "sealgate.proxy": ("sealgate.proxy", "sealgate.proxy.calls"),
    "sealgate.mcp": ("sealgate.mcp",),
}
SDK = "sealgate.mcp.sdk"
# The top-level packages only the MCP virtualenv has: the SDK and what it brings.
SDK_PACKAGES = ("mcp", "mcp_types", "starlette", "uvicorn", "httpx2", "pydantic", "anyio")
TOP = "sealgate.cli"

Graph = dict[str, set[str]]


def _imports(path: Path, module: str) -> Iterator[tuple[str, tuple[str, ...], int]]:
    """(imported module, names taken from it, line) for every import statement in `path`."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, (), node.lineno
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:  # relative: from the package, one level up per extra dot
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*anchor, target] if target else anchor)
            yield target, tuple(alias.name for alias in node.names), node.lineno


def graph(root: Path) -> tuple[Graph, dict[tuple[str, str], int]]:
    """sealgate.* module -> the sealgate.* modules it imports; and the line of each edge."""
    modules = layout_modules(root)
    edges: Graph = {name: set() for name in modules}
    lines: dict[tuple[str, str], int] = {}
    for name, path in modules.items():
        for target, names, line in _imports(path, name):
            # `from a import b` imports module a.b when there is one, else a name of a.
            hits = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            if len(hits) < len(names) or not names:
                hits.append(target)
            for hit in hits:
                if hit in modules and hit != name:
                    edges[name].add(hit)
                    lines.setdefault((name, hit), line)
    return edges, lines


def cycles(edges: Graph) -> list[list[str]]:
    """Every strongly connected set of more than one module, each as one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members: set[str] = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                members.add(top)
                if top == node:
                    break
            if len(members) > 1:
                found.append(_one_cycle(edges, members))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def _one_cycle(edges: Graph, members: set[str]) -> list[str]:
    """A path from the first member back to itself, inside `members` (breadth first)."""
    start = min(members)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(edges[node] & members):
            if nxt == start:
                return [*paths[node], start]
            if nxt not in paths:
                paths[nxt] = [*paths[node], nxt]
                queue.append(nxt)
    raise AssertionError(f"no cycle through {start}")  # a strongly connected set has one


def _describe(cycle: list[str], lines: dict[tuple[str, str], int]) -> str:
    steps = [f"{a} (line {lines[(a, b)]})" for a, b in itertools.pairwise(cycle)]
    return " -> ".join([*steps, cycle[-1]])


def wrong_way(edges: Graph, lines: dict[tuple[str, str], int]) -> list[str]:
    bad = []
    for module, targets in sorted(edges.items()):
        part = next((p for p in BASE_MAY_NOT if module == p or module.startswith(p + ".")), None)
        if part is not None:
            forbidden = FORBIDDEN.get(part, ())
        elif module != TOP:  # a base module in sealgate/, or sealgate/__init__
            forbidden = BASE_MAY_NOT
        else:
            forbidden = ()
        for target in sorted(targets):
            if target.startswith(tuple(f + "." for f in forbidden) + forbidden):
                bad.append(f"{module} imports {target} (line {lines[(module, target)]})")
    return bad


def _part(module: str) -> str | None:
    return next((p for p in BASE_MAY_NOT if module == p or module.startswith(p + ".")), None)


def past_faces(edges: Graph, lines: dict[tuple[str, str], int]) -> list[str]:
    """Imports from one part into another's insides, not its face."""
    bad = []
    for module, targets in sorted(edges.items()):
        for target in sorted(targets):
            part = _part(target)
            if part in FACES and _part(module) not in (part, None) and target not in FACES[part]:
                bad.append(f"{module} imports {target} (line {lines[(module, target)]})")
    return bad


def sdk_imports(root: Path) -> list[str]:
    """The SDK imported outside sealgate.mcp.sdk, sealgate.mcp.sdk imported by anything but
    itself, or mitmproxy imported anywhere in sealgate.mcp."""
    bad = []
    for name, path in sorted(layout_modules(root).items()):
        inside = name == SDK or name.startswith(SDK + ".")
        for target, _, line in _imports(path, name):
            top = target.split(".")[0]
            if (top in SDK_PACKAGES and not inside) or (
                    (target == SDK or target.startswith(SDK + ".")) and not inside) or (
                    top == "mitmproxy" and name.startswith("sealgate.mcp")):
                bad.append(f"{name} imports {target} (line {line})")
    return bad


def outside_imports(root: Path, package: str, refused: tuple[str, ...]) -> list[str]:
    """Imports in root/package whose top-level name is one of `refused`."""
    bad = []
    for name, path in sorted(layout_modules(root, package).items()):
        for target, _, line in _imports(path, name):
            if target.split(".")[0] in refused:
                bad.append(f"{path.relative_to(root)}:{line} imports {target}")
    return bad


# -- the tree as it is ------------------------------------------------------------------------


def test_no_import_cycles() -> None:
    edges, lines = graph(ROOT)
    found = [_describe(cycle, lines) for cycle in cycles(edges)]
    assert not found, "import cycles:\n  " + "\n  ".join(found)


def test_imports_point_downward() -> None:
    edges, lines = graph(ROOT)
    bad = wrong_way(edges, lines)
    assert not bad, "wrong-way imports:\n  " + "\n  ".join(bad)


def test_parts_import_each_other_through_their_faces() -> None:
    edges, lines = graph(ROOT)
    bad = past_faces(edges, lines)
    assert not bad, "imports past a part's face:\n  " + "\n  ".join(bad)


def test_only_the_mcp_servers_sdk_modules_import_the_sdk() -> None:
    bad = sdk_imports(ROOT)
    assert not bad, "\n".join(bad)


def test_packages_import_neither_tests_nor_bench() -> None:
    bad = outside_imports(ROOT, "sealgate", ("tests", "bench"))
    assert not bad, "\n".join(bad)


def test_no_file_imports_the_old_top_level_names() -> None:
    bad = [b for top in ("sealgate", "tests", "bench") for b in outside_imports(ROOT, top, PARTS)]
    assert not bad, "import sealgate.proxy, sealgate.issuer, sealgate.sandbox:\n" + "\n".join(bad)


def test_bench_does_not_import_tests() -> None:
    bad = outside_imports(ROOT, "bench", ("tests",))
    assert not bad, "\n".join(bad)


def test_every_module_is_seen() -> None:
    # The parts are found through pyproject's package-dir: they are in the graph, not only the base.
    edges, _ = graph(ROOT)
    for module in ("sealgate.cli", "sealgate.proxy.request.pipeline", "sealgate.issuer.service",
                   "sealgate.sandbox.runtime", "sealgate.proxy.net.resolver",
                   "sealgate.credentials.keys"):
        assert module in edges
    assert "sealgate.proxy.request.pipeline" in edges["sealgate.proxy.process.master"]


# -- the checks themselves, on planted trees --------------------------------------------------


def _plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_planted_cycle_is_found_and_listed(tmp_path: Path) -> None:
    root = _plant(tmp_path, {
        "sealgate/__init__.py": "",
        "sealgate/proxy/__init__.py": "",
        "sealgate/proxy/a.py": "from sealgate.proxy import b\n",
        "sealgate/proxy/b.py": "def f():\n    from . import c\n",  # lazy, relative
        "sealgate/proxy/c.py": "import sealgate.proxy.a\n",
        "sealgate/proxy/d.py": "from sealgate.proxy.a import x\n",  # into it, not part of it
    })
    edges, lines = graph(root)
    [cycle] = cycles(edges)
    assert cycle == ["sealgate.proxy.a", "sealgate.proxy.b", "sealgate.proxy.c",
                     "sealgate.proxy.a"]
    assert _describe(cycle, lines) == (
        "sealgate.proxy.a (line 1) -> sealgate.proxy.b (line 2) -> sealgate.proxy.c (line 1) "
        "-> sealgate.proxy.a"
    )


def test_planted_wrong_way_and_outside_imports_are_found(tmp_path: Path) -> None:
    root = _plant(tmp_path, {
        "sealgate/__init__.py": "",
        "sealgate/files.py": "from sealgate.proxy import x\n",
        "sealgate/cli.py": "from sealgate.sandbox import y\n",  # the top: allowed
        "sealgate/issuer/__init__.py": "from sealgate.issuer.keys import k\n",  # its own: fine
        "sealgate/issuer/keys.py": "import sealgate.proxy.x\nfrom tests.harness import free_port\n",
        "sealgate/proxy/__init__.py": "",
        "sealgate/proxy/x.py": "from sealgate.sandbox import y\nfrom proxy import old\n",
        "sealgate/sandbox/__init__.py": "",
        "sealgate/sandbox/y.py": "from sealgate.proxy import x\n",  # sandbox may use proxy
    })
    edges, lines = graph(root)
    assert wrong_way(edges, lines) == [
        "sealgate.files imports sealgate.proxy.x (line 1)",
        "sealgate.issuer.keys imports sealgate.proxy.x (line 1)",
        "sealgate.proxy.x imports sealgate.sandbox.y (line 1)",
    ]
    assert outside_imports(root, "sealgate", ("tests", "bench")) == [
        "sealgate/issuer/keys.py:2 imports tests.harness"
    ]
    assert outside_imports(root, "sealgate", PARTS) == ["sealgate/proxy/x.py:2 imports proxy"]


def test_planted_face_and_sdk_violations_are_found(tmp_path: Path) -> None:
    root = _plant(tmp_path, {
        "sealgate/__init__.py": "",
        "sealgate/proxy/__init__.py": "",
        "sealgate/proxy/calls.py": "",
        "sealgate/proxy/net/__init__.py": "",
        "sealgate/proxy/net/guard.py": "",
        "sealgate/mcp/__init__.py": "",
        "sealgate/mcp/calls.py": (
            "from sealgate.proxy.calls import decide\n"  # the face: fine
            "from sealgate.proxy.net.guard import Guard\nimport mcp.types\n"),
        "sealgate/mcp/gate.py": "from .sdk import server\nfrom mitmproxy import http\n",
        "sealgate/mcp/sdk/__init__.py": "",
        "sealgate/mcp/sdk/server.py": (
            "from mcp.server.lowlevel import Server\nfrom ..calls import x\n"),
        "sealgate/sandbox/__init__.py": "",
        "sealgate/sandbox/x.py": "from sealgate.mcp import y\nfrom sealgate.mcp.calls import z\n",
    })
    edges, lines = graph(root)
    assert past_faces(edges, lines) == [
        "sealgate.mcp.calls imports sealgate.proxy.net.guard (line 2)",
        "sealgate.sandbox.x imports sealgate.mcp.calls (line 2)",
    ]
    assert sdk_imports(root) == [
        "sealgate.mcp.calls imports mcp.types (line 3)",
        "sealgate.mcp.gate imports sealgate.mcp.sdk (line 1)",
        "sealgate.mcp.gate imports mitmproxy (line 2)",
    ]


# -- layers inside the proxy ------------------------------------------------------------------

PROXY = "sealgate.proxy"
# Inside the proxy, each folder (or base module) and the folders it may not import. From the
# bottom: errors.py (ProxyError, Denial); net/ (names and addresses); policy/ (the rules, and
# who asks); engine/ (mitmproxy's internals: what it installs reads no request-path record);
# credentials/ and request/ (the path); process/ (the processes around it) and the two entry
# points, the face (__init__.py, standard library only: tests/process/test_proxy_face.py) and
# addon.py (mitmdump's), on top. credentials/ is below request/: the path calls it, not back.
PROXY_LAYERS: dict[str, tuple[str, ...]] = {
    "errors": ("net", "policy", "engine", "credentials", "request", "process"),
    "net": ("policy", "engine", "credentials", "request", "process"),
    "policy": ("engine", "request", "process"),
    "engine": ("policy", "credentials", "request", "process"),
    "credentials": ("engine", "request", "process"),
    "request": ("process",),
}


def _proxy_layer(module: str) -> str | None:
    if not module.startswith(PROXY + "."):
        return None
    return module[len(PROXY) + 1 :].split(".", maxsplit=1)[0]


def wrong_way_in_proxy(edges: Graph, lines: dict[tuple[str, str], int]) -> list[str]:
    bad = []
    for module, targets in sorted(edges.items()):
        forbidden = PROXY_LAYERS.get(_proxy_layer(module) or "", ())
        for target in sorted(targets):
            if _proxy_layer(target) in forbidden:
                bad.append(f"{module} imports {target} (line {lines[(module, target)]})")
    return bad


def test_proxy_layers_point_downward() -> None:
    edges, lines = graph(ROOT)
    bad = wrong_way_in_proxy(edges, lines)
    assert not bad, "wrong-way imports inside the proxy:\n  " + "\n  ".join(bad)


def test_a_planted_wrong_way_import_inside_the_proxy_is_found(tmp_path: Path) -> None:
    root = _plant(tmp_path, {
        "sealgate/__init__.py": "",
        "sealgate/proxy/__init__.py": "from .process.client import call\n",  # the face: top
        "sealgate/proxy/errors.py": "",
        "sealgate/proxy/engine/__init__.py": "",
        "sealgate/proxy/engine/mitm.py": "from ..errors import Denial\n",  # down: fine
        "sealgate/proxy/engine/bodycap.py": "from ..request.flowstate import META\n",
        "sealgate/proxy/policy/__init__.py": "",
        "sealgate/proxy/policy/decide.py": "from ..net import guard\n",  # down: fine
        "sealgate/proxy/net/__init__.py": "",
        "sealgate/proxy/net/guard.py": "def f():\n    from ..policy.model import Policy\n",
        "sealgate/proxy/policy/model.py": "",
        "sealgate/proxy/request/__init__.py": "",
        "sealgate/proxy/request/flowstate.py": "from sealgate.proxy.process import master\n",
        "sealgate/proxy/process/__init__.py": "",
        "sealgate/proxy/process/master.py": "from ..request import flowstate\n",  # down: fine
        "sealgate/proxy/process/client.py": "",
    })
    edges, lines = graph(root)
    assert wrong_way_in_proxy(edges, lines) == [
        "sealgate.proxy.engine.bodycap imports sealgate.proxy.request.flowstate (line 1)",
        "sealgate.proxy.net.guard imports sealgate.proxy.policy.model (line 2)",
        "sealgate.proxy.request.flowstate imports sealgate.proxy.process.master (line 1)",
    ]


# -- layers inside the sandbox (#23) ---------------------------------------------------------

# sealgate.sandbox.X -> what X may not import. guest/ runs inside a sandbox, handed to the
# host's python3 with nothing of sealgate's: the standard library only (`_guest_imports`).
SANDBOX_LAYERS = {
    "host": ("daemon", "tiers", "clients"),
    "images": ("daemon", "tiers", "clients", "host"),  # the store: below whatever runs images
    "clients": ("daemon", "tiers", "host"),  # they talk to the daemon over its API
}


def sandbox_layering(root: Path) -> list[str]:
    """Imports inside sealgate.sandbox that cross its layers the wrong way."""
    edges, lines = graph(root)
    bad = []
    for module, targets in sorted(edges.items()):
        layer = module.removeprefix("sealgate.sandbox.").split(".")[0]
        if not module.startswith("sealgate.sandbox.") or layer not in SANDBOX_LAYERS:
            continue
        refused = tuple(f"sealgate.sandbox.{name}" for name in SANDBOX_LAYERS[layer])
        for target in sorted(targets):
            if target.startswith(tuple(r + "." for r in refused) + refused):
                bad.append(f"{module} imports {target} (line {lines[(module, target)]})")
    return bad + _guest_imports(root)


def _guest_imports(root: Path) -> list[str]:
    """guest/'s imports of anything but the standard library and guest/ itself."""
    import sys  # here, so that this test's additions stay at the end of the file

    bad = []
    for name, path in sorted(layout_modules(root).items()):
        if not name.startswith("sealgate.sandbox.guest"):
            continue
        for target, _, line in _imports(path, name):
            top = target.split(".")[0]
            inside = target == "sealgate.sandbox.guest" or target.startswith(
                "sealgate.sandbox.guest.")
            if not inside and (top == "sealgate" or top not in sys.stdlib_module_names):
                bad.append(f"{name} imports {target} (line {line})")
    return bad


def test_sandbox_layers() -> None:
    bad = sandbox_layering(ROOT)
    assert not bad, "imports across the sandbox's layers:\n  " + "\n  ".join(bad)


def test_planted_sandbox_layer_violations_are_found(tmp_path: Path) -> None:
    root = _plant(tmp_path, {
        "sealgate/__init__.py": "",
        "sealgate/reasons.py": "",
        "sealgate/sandbox/__init__.py": "",
        "sealgate/sandbox/errors.py": "",
        "sealgate/sandbox/guest/__init__.py": "",
        "sealgate/sandbox/guest/protocol.py": "import json\n",
        "sealgate/sandbox/guest/agent.py": (
            "import os\nfrom . import protocol\nfrom ..errors import x\nimport yaml\n"
            "from sealgate.reasons import Reason\n"),
        "sealgate/sandbox/host/__init__.py": "",
        "sealgate/sandbox/host/network.py": (
            "from ..errors import x\nfrom ..guest import protocol\n"),  # both allowed
        "sealgate/sandbox/host/cgroup.py": "from ..tiers import bwrap\n",
        "sealgate/sandbox/tiers/__init__.py": "",
        "sealgate/sandbox/tiers/bwrap.py": "from ..host import network\n",  # downward: fine
        "sealgate/sandbox/daemon/__init__.py": "",
        "sealgate/sandbox/daemon/slot.py": "from ..tiers import bwrap\n",
        "sealgate/sandbox/clients/__init__.py": "",
        "sealgate/sandbox/clients/client.py": "def f():\n    from ..daemon import slot\n",
    })
    assert sandbox_layering(root) == [
        "sealgate.sandbox.clients.client imports sealgate.sandbox.daemon.slot (line 2)",
        "sealgate.sandbox.host.cgroup imports sealgate.sandbox.tiers.bwrap (line 1)",
        "sealgate.sandbox.guest.agent imports sealgate.sandbox.errors (line 3)",
        "sealgate.sandbox.guest.agent imports yaml (line 4)",
        "sealgate.sandbox.guest.agent imports sealgate.reasons (line 5)",
    ]
