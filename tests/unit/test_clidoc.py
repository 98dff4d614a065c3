"""docs/operations.md's flag tables are the parsers' own: regenerated, nothing changes, and
the environment the tables are made in does not show in them."""

from __future__ import annotations

import pytest

from sealgate import clidoc


def test_the_flag_tables_are_up_to_date() -> None:
    text = clidoc.DOC.read_text()
    assert {"proxy", "issuer serve", "sandboxd"} <= set(clidoc._BLOCK.findall(text)[i][1]
                                                        for i in range(3))
    assert clidoc.render(text) == text, "run: python -m sealgate.clidoc"


def test_the_environment_does_not_leak_into_the_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    text = clidoc.DOC.read_text()
    monkeypatch.setenv("SEALGATE_LISTEN", "10.9.9.9:1")
    monkeypatch.setenv("SEALGATE_ADMIN", "10.9.9.9:2")
    made = clidoc.render(text)
    assert made == text and "10.9.9.9" not in made
