"""The daemon's lifecycle events: one JSON line each, on stdout (what an operator's collector
reads)."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from typing import Any


def log(event: str, **fields: Any) -> None:
    line = json.dumps({"ts": round(time.time(), 3), "event": event, **fields})
    with contextlib.suppress(OSError):
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
