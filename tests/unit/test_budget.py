"""Per-sandbox budgets (proxy/budget.py), in process with a fake clock."""

from __future__ import annotations

import pytest

from sealgate.proxy.errors import Denial
from sealgate.proxy.policy.model import Budgets
from sealgate.proxy.request.budget import BudgetLedger


def test_total_bytes_refusal_has_no_retry_after() -> None:
    ledger = BudgetLedger(clock=lambda: 0.0)
    limits = Budgets(max_total_bytes=100)
    ledger.admit_request("bot-1", limits, 100)
    with pytest.raises(Denial) as info:
        ledger.admit_request("bot-1", limits, 1)
    assert info.value.reason == "budget_exceeded"
    assert info.value.retry_after is None  # counted for the process's life: waiting won't help
    ledger.admit_request("bot-2", limits, 1)  # per sandbox


def test_a_worker_share_never_rounds_a_budget_down_to_nothing() -> None:
    ledger = BudgetLedger(share=4, clock=lambda: 0.0)
    ledger.admit_request("bot-1", Budgets(max_total_bytes=3), 0)  # 3 // 4 == 0 would refuse all
