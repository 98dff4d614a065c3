"""Per-sandbox budgets: request rate, concurrent connections, bytes per request and in total.

The DoS and cost threat: one sandbox must not starve the others or run up a bill. Each sandbox
(or, for unidentified traffic, each default policy) has its own ledger, so exhausting one never
touches another. With N worker processes each worker holds 1/N of every budget: the kernel
spreads connections across workers, so the sum stays close to the policy's figure without any
state shared between processes.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from sealgate.reasons import Reason

from ..errors import Denial
from ..policy.model import Budgets

# A spent budget's refusal is answered this many seconds late. Answered at once, a client that
# ignores Retry-After turns the proxy's cheapest answer into its busiest work: a flooder at c=32
# was refused 22,000 times in a few seconds, and its neighbour's p50 rose twelvefold. Held, it
# gets at most one refusal per connection per second, for a sleeping coroutine's cost.
REFUSAL_HOLD = 1.0


async def hold(denial: Denial) -> None:
    """Wait before answering `denial`, if it is for a spent budget."""
    if denial.reason is Reason.BUDGET_EXCEEDED:
        await asyncio.sleep(REFUSAL_HOLD)


@dataclass(slots=True)
class _Ledger:
    tokens: float
    stamp: float
    limits: Budgets
    connections: int = 0
    bytes_total: int = 0


class BudgetLedger:
    def __init__(self, share: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        self.share = max(1, share)
        self.clock = clock
        self._ledgers: dict[str, _Ledger] = {}

    def _ledger(self, key: str, limits: Budgets) -> _Ledger:
        ledger = self._ledgers.get(key)
        if ledger is None:
            ledger = _Ledger(tokens=self._burst(limits), stamp=self.clock(), limits=limits)
            self._ledgers[key] = ledger
        elif ledger.limits != limits:  # the rules were reloaded
            ledger.limits = limits
            ledger.tokens = min(ledger.tokens, self._burst(limits))
        return ledger

    def _burst(self, limits: Budgets) -> float:
        return max(1.0, limits.burst / self.share)

    def admit_request(self, key: str, limits: Budgets, declared_bytes: int | None) -> None:
        """Take one request from the rate budget, or refuse with how long to wait.

        A declared body over the per-request cap is refused here, and one within it counts
        against the total at once. A body of unknown length (chunked) streams through `meter`,
        counting what goes upstream as it goes; proxy/engine/bodycap.py holds it to the per-request
        cap (the piece that passes it is neither forwarded nor counted).
        """
        ledger = self._ledger(key, limits)
        if declared_bytes is not None and declared_bytes > limits.max_request_bytes:
            raise Denial(Reason.REQUEST_TOO_LARGE,
                f"request body of {declared_bytes} bytes exceeds {limits.max_request_bytes}",
            )
        if ledger.bytes_total >= max(1, limits.max_total_bytes // self.share):
            # No Retry-After: the total is counted for the life of the proxy process, so
            # waiting does not help.
            raise Denial(
                Reason.BUDGET_EXCEEDED, "total upload budget used up for this proxy's lifetime"
            )
        rate = limits.requests_per_second / self.share
        now = self.clock()
        ledger.tokens = min(self._burst(limits), ledger.tokens + (now - ledger.stamp) * rate)
        ledger.stamp = now
        if ledger.tokens < 1.0:
            wait = (1.0 - ledger.tokens) / rate if rate > 0 else 3600.0
            raise Denial(
                Reason.BUDGET_EXCEEDED, "request rate over budget", retry_after=math.ceil(wait)
            )
        ledger.tokens -= 1.0
        if declared_bytes:
            ledger.bytes_total += declared_bytes

    def meter(self, key: str) -> Callable[[bytes], bytes]:
        def count(chunk: bytes) -> bytes:
            self.add_bytes(key, len(chunk))
            return chunk

        return count

    def open_connection(self, key: str, limits: Budgets) -> None:
        ledger = self._ledger(key, limits)
        if ledger.connections >= max(1, limits.max_connections // self.share):
            raise Denial(Reason.BUDGET_EXCEEDED, "too many concurrent connections", retry_after=1)
        ledger.connections += 1

    def close_connection(self, key: str) -> None:
        ledger = self._ledgers.get(key)
        if ledger is not None and ledger.connections > 0:
            ledger.connections -= 1

    def add_bytes(self, key: str, count: int) -> None:
        ledger = self._ledgers.get(key)
        if ledger is not None:
            ledger.bytes_total += count
