"""What the daemon has done, counted where it happens and read at each scrape (`admin`):
sandboxes created (from a warm slot, cold, or as a fork's copy) and ended (by why), slots
prepared for the pools and how long each took, and the leftovers of a dead run or daemon
cleaned up at start. Plain numbers on the daemon: nothing of prometheus-client on the
daemon's paths, which run whether or not an admin listener is served.
"""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Literal

# A slot's preparation: a namespace, a link and its table, cgroups, the agent's start; tens of
# milliseconds for bubblewrap, seconds for an emulated microVM's boot.
PREPARE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 90.0)
# Why a sandbox ends, as `Daemon.delete` is told: the label's values, bounded; anything else
# (a word added later and not here) is counted as `other`, never as a label of its own.
ENDINGS = ("deleted", "ttl", "idle", "agent ended", "agent not answering", "its creator left",
           "daemon stopped")


# How a sandbox was made: a pool's slot, one prepared for its create, a copy resumed from
# another's memory (`fork`).
HOWS = ("warm", "cold", "fork")


class Tally:
    def __init__(self) -> None:
        self.created: Counter[str] = Counter()  # HOWS
        self.ended: Counter[str] = Counter()
        self.cleaned = 0  # leases of dead runs or daemons cleaned up at start
        self.prepare_failures = 0
        # Cumulative counts per bucket (the last is +Inf), and the sum of seconds.
        self.prepare_buckets = [0] * (len(PREPARE_BUCKETS) + 1)
        self.prepare_seconds = 0.0
        # Limit hits (`Group.limit_hits`): of ended sandboxes, summed; of live ones, as last
        # read (at a scrape), by sandbox id. A sandbox's last reading moves into the sum as it
        # ends, in one step, so the total a scrape sees never goes down (`limit_hits`).
        self._ended_hits: Counter[str] = Counter()
        self._live_hits: dict[str, dict[str, int]] = {}

    def create(self, how: Literal["warm", "cold", "fork"]) -> None:
        self.created[how] += 1

    def end(self, why: str) -> None:
        self.ended[why if why in ENDINGS else "other"] += 1

    def prepared(self, seconds: float) -> None:
        self.prepare_buckets[bisect.bisect_left(PREPARE_BUCKETS, seconds)] += 1
        self.prepare_seconds += seconds

    def hits_seen(self, ident: str, hits: dict[str, int]) -> None:
        """A live sandbox's cgroup counts as read now (they only grow)."""
        self._live_hits[ident] = hits

    def hits_final(self, ident: str, hits: dict[str, int]) -> None:
        """A sandbox's counts as it ends: into the sum, its live reading dropped."""
        self._live_hits.pop(ident, None)
        self._ended_hits.update(hits)

    def limit_hits(self, limit: str) -> int:
        return self._ended_hits[limit] + sum(h.get(limit, 0) for h in self._live_hits.values())
