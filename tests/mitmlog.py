"""`sealgate` as `python -m sealgate.cli` runs it, with mitmproxy's own error records on stderr.

The lean master prints sealgate's log records only; mitmproxy's go to its addons, none of which
prints them once the proxy is up. A crash in a connection's handling ("mitmproxy has crashed!",
with its traceback) is one of those records: a test whose proxy runs through this module
(`Proxy(..., mitmproxy_errors=True)`) can see that there was none. Each is one JSON line, as the
proxy's own log lines are (sealgate/oplog.py), so that stderr stays a stream of JSON lines.
"""

from __future__ import annotations

import json
import logging
import runpy
import sys


class _Json(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"ts": self.formatTime(record), "level": record.levelname.lower(),
                           "event": record.getMessage(), "logger": record.name})


def main() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.ERROR)
    handler.setFormatter(_Json())
    logging.getLogger("mitmproxy").addHandler(handler)
    runpy.run_module("sealgate.cli", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
