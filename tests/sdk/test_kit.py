"""The promise the SDK tests rest on: a call sees exactly the environment it was given, in a
fresh interpreter or a forkserver's child alike, and nothing of the test process's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.sdk.kit import Forkserver, run_python

ENVIRON = """
def main():
    import os, sys
    return {"environ": dict(os.environ), "loaded": "email.mime.text" in sys.modules,
            "argv": sys.argv[1:]}
"""


@pytest.fixture()
def marker(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("SEALGATE_SDK_TEST_LEAK", "leaked")  # in the test process only
    return "leaked"


def test_a_fresh_interpreter_gets_exactly_the_environment(marker: str) -> None:
    got = run_python(ENVIRON, {"HTTPS_PROXY": "http://a:b@127.0.0.1:1"}).ok()
    # Python's own locale coercion (PEP 538) may add LC_CTYPE when no locale is set.
    got["environ"].pop("LC_CTYPE", None)
    assert got["environ"] == {"HTTPS_PROXY": "http://a:b@127.0.0.1:1"}
    assert not got["loaded"]


def test_a_forkserver_child_gets_exactly_the_environment(marker: str, tmp_path: Path) -> None:
    server = Forkserver(tmp_path, ["email.mime.text"])
    try:
        first = server.run(ENVIRON, {"A": "1", "B": "two"}).ok()
        second = server.run(ENVIRON, {}).ok()
    finally:
        server.stop()
    for got in (first, second):
        got["environ"].pop("LC_CTYPE", None)
    assert (first["environ"], second["environ"]) == ({"A": "1", "B": "two"}, {})
    assert first["loaded"] and second["loaded"]
    assert "SEALGATE_SDK_TEST_LEAK" in os.environ
