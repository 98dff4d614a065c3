"""sealgate.clients in fresh processes: what importing it pulls in, the JS module's answers to
the same inputs, the docs' rules snippets through `sealgate rules check`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sealgate.clients import (
    proxy_authorization,
    proxy_url,
)
from tests.unit.test_clients_helpers import (
    BAD_PROXIES,
    BAD_URLS,
    BASE_CASES,
    JS_DRIVER,
    MJS,
    ROOT,
    SNIPPET,
    T1,
    T2,
    P,
)


def test_importing_the_package_imports_neither_requests_nor_httpx() -> None:
    code = ("import sys, sealgate.clients as c; c.base_url('127.0.0.1:1', 'https://h.test/'); "
            "print(sorted(m for m in ('requests', 'httpx', 'httpx2', 'urllib3') "
            "if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[]"


def test_the_js_module_agrees(tmp_path: Path) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30,
                             check=True).stdout.strip()
    if int(version.lstrip("v").split(".")[0]) < 20:
        pytest.skip(f"sealgate.mjs needs Node 20+, this is {version}")
    script = tmp_path / "driver.mjs"
    script.write_text(JS_DRIVER % MJS.as_uri())
    bad_tokens = [f"{T1},{T2}", T1 + "\r\n", " " + T1, "", "sg1.0123456789ABCDEF.AAAA"]
    proxy_urls: list[tuple[str, dict[str, Any]]] = [
        (P, {}), (P, {"sandbox": "bot-1", "key": "k/ey%:@!'()*"}),
        (P, {"sandbox": "bot-1", "key": "k", "tokens": [T1]}), (P, {"tokens": [T1, T2]}),
        (f"http://bot-1:k,{T1}@127.0.0.1:8080", {"tokens": [T2]}),
    ]
    auth: list[dict[str, Any]] = [{"sandbox": "bot-1", "key": "k"}, {"tokens": [T1]}, {},
                                  {"sandbox": "bot-1", "key": "a,b"}]
    stdin = json.dumps({
        "base": [[p, u, t] for p, u, t, _ in BASE_CASES], "badUrls": BAD_URLS,
        "badProxies": BAD_PROXIES, "badTokens": bad_tokens, "proxyUrls": proxy_urls,
        "auth": auth,
    })
    done = subprocess.run([node, str(script)], input=stdin, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert [r.get("ok") for r in out["base"]] == [e for *_, e in BASE_CASES], out["base"]
    for name in ("badUrls", "badProxies", "badTokens"):
        accepted = [r for r in out[name] if "error" not in r]
        assert not accepted, (name, accepted)
        assert all(r["error"].startswith("SealgateConfigError") for r in out[name])
    assert [r.get("ok") for r in out["proxyUrls"]] == [
        proxy_url(p, **o) for p, o in proxy_urls
    ]
    expected_auth: list[str | None] = [proxy_authorization(**o) for o in auth[:3]]
    assert [r.get("ok") for r in out["auth"][:3]] == expected_auth
    assert "error" in out["auth"][3]


def test_every_rules_snippet_in_the_docs_loads(tmp_path: Path) -> None:
    """Each snippet is the `allow:` entries one SDK needs; wrapped in a policy that accepts
    tokens, it must pass `sealgate rules check` as the proxy would load it."""
    text = (ROOT / "docs" / "clients.md").read_text()
    snippets = SNIPPET.findall(text)
    assert len(snippets) >= 8, "docs/clients.md lost its rules snippets"
    paths = []
    for number, snippet in enumerate(snippets):
        body = "".join("      " + line if line.strip() else line
                       for line in snippet.splitlines(keepends=True))
        path = tmp_path / f"snippet-{number}.yaml"
        path.write_text(f"version: 1\npolicies:\n  agent:\n    tokens: true\n    allow:\n{body}"
                        "default_policy: agent\n")
        paths.append(str(path))
    done = subprocess.run([sys.executable, "-m", "sealgate.cli", "rules", "check",
                           *paths], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("ok ") == len(paths), done.stdout
