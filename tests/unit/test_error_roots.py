"""Every error sealgate raises on purpose is a SealgateError, carrying its Reason, under one root
per part (CredentialError, ProxyError, SandboxError; the base's own directly): whoever catches
one can answer, log and count it without knowing its class.

Exempt: private helpers (`_Name`, never seen outside their module), sandbox/guest/, which
runs inside a sandbox on the standard library alone and so cannot import the base, and
sealgate.mcp.sdk, which runs in the MCP server's own virtualenv (its SDK is not here) and
declares no error.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from sealgate.credentials import CredentialError
from sealgate.proxy import ProxyError
from sealgate.reasons import SealgateError
from sealgate.sandbox.errors import SandboxError
from tests.layout import modules

ROOT = Path(__file__).resolve().parents[2]
ROOTS = {"sealgate.credentials": CredentialError, "sealgate.proxy": ProxyError,
         "sealgate.sandbox": SandboxError}


def _errors() -> list[tuple[str, type[BaseException]]]:
    found = []
    for name in sorted(modules(ROOT)):
        if name.startswith(("sealgate.sandbox.guest", "sealgate.mcp.sdk")) or name.endswith(
                "__main__"):
            continue
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, BaseException)
                    and value.__module__ == name and not value.__name__.startswith("_")):
                found.append((name, value))
    return found


def test_every_public_error_is_a_sealgate_error_under_its_parts_root() -> None:
    errors = _errors()
    assert len(errors) > 30  # the walk found them
    outside = [f"{m}.{e.__name__}" for m, e in errors if not issubclass(e, SealgateError)]
    assert not outside, outside
    wrong_root = [f"{m}.{e.__name__}" for m, e in errors for part, root in ROOTS.items()
                  if m.startswith(part + ".") and not issubclass(e, root)]
    assert not wrong_root, wrong_root
