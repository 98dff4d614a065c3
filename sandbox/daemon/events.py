"""The daemon's lifecycle events (created, ended, snapshot, hand-over...): one JSON line each on
stdout, the stream an operator's collector reads, with the operational log's shape and field
names (`sealgate.oplog`: `ts` as ISO 8601, `level`, `event`, then the event's own fields). The
operational log itself (start, self-test, failures) goes to stderr."""

from __future__ import annotations

import logging
from typing import Any

from sealgate.oplog import EVENTS

_EVENTS = logging.getLogger(EVENTS)


def log(event: str, **fields: Any) -> None:
    _EVENTS.info(event, extra=fields)
