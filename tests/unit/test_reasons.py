"""Reason codes: one member per code, each with its status; docs/rules.md's table made of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sealgate.proxy.errors import Denial
from sealgate.reasons import Reason, markdown

RULES_MD = Path(__file__).resolve().parents[2] / "docs" / "rules.md"
BEGIN, END = "<!-- reasons:begin -->\n", "<!-- reasons:end -->"


def test_the_table_in_rules_md_is_generated_from_the_enum() -> None:
    text = RULES_MD.read_text()
    table = text[text.index(BEGIN) + len(BEGIN) : text.index(END)]
    assert table == markdown(), "run: python -m sealgate.reasons, and paste it into docs/rules.md"


def test_codes_are_unique_snake_case_and_statuses_http() -> None:
    codes = [r.value for r in Reason]
    assert len(codes) == len(set(codes))
    for reason in Reason:
        assert re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)*", reason.value), reason
        assert 400 <= reason.status <= 599, reason
        assert reason.description and "|" not in reason.description


@pytest.mark.parametrize("reason", list(Reason))
def test_a_denial_answers_with_its_reasons_status(reason: Reason) -> None:
    denial = Denial(reason, "detail")
    assert (denial.status, denial.reason) == (reason.status, reason)


def test_an_unknown_code_is_an_error_not_a_403() -> None:
    with pytest.raises(ValueError, match="not a reason code"):
        Reason.of("not_alowed")
    assert Reason.of("token_binding").status == 407
