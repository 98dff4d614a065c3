"""A disk that fills under the audit log: how many requests go out before the proxy notices,
and that no line is lost.

The audit file is written once per event-loop turn. A request is admitted only while the last
write succeeded, so the requests forwarded after the disk fills are those already in flight, or
admitted in the turn whose write fails first: for one client sending one request at a time, at
most one. Their lines stay in the proxy's buffer and are written when the disk has room again;
meanwhile every new request is refused with 503 `audit_unavailable`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import client, rules_allowing
from tests.fulldisk import fill, small_tmpfs
from tests.harness import Origin, ProxyFactory


@pytest.fixture()
def small_disk() -> Iterator[Path]:
    with small_tmpfs() as mount:
        yield mount


def test_a_full_disk_lets_at_most_one_request_out_unlogged_and_loses_no_line(
    tmp_path: Path, small_disk: Path, origin_http: Origin, proxy_with: ProxyFactory
) -> None:
    log = small_disk / "audit.log"
    origin_http.reset()
    with proxy_with(rules_allowing("api.test", origin_http.port), directory=tmp_path,
                    options=["--set", f"sealgate_audit_log={log}"]) as p:
        session = client(p)
        url = f"http://api.test:{origin_http.port}"
        assert session.get(f"{url}/before", timeout=5).status_code == 200
        filler = fill(small_disk)
        # The log's last page may still hold a few lines: send until the first refusal.
        statuses = []
        for i in range(40):
            statuses.append(session.get(f"{url}/during-{i}", timeout=5).status_code)
            if statuses[-1] == 503:
                break
        assert statuses[-1] == 503, statuses
        # Only whole lines: a short write leaves the rest of one to be appended later.
        whole = log.read_text().rpartition("\n")[0].splitlines()
        on_disk = {json.loads(line).get("path") for line in whole}
        unlogged = [r.path for r in origin_http.requests if r.path not in on_disk]
        assert len(unlogged) <= 1, unlogged  # forwarded while its line waits: at most one
        more = [session.get(f"{url}/still-{i}", timeout=5).status_code for i in range(5)]
        assert more == [503] * 5
        assert not [r for r in origin_http.requests if r.path.startswith("/still")]
        filler.unlink()
        assert session.get(f"{url}/after", timeout=5).status_code == 200
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    requests = [e for e in lines if e.get("event") == "request"]
    # Every request that reached the origin has its line, and so has every refused one.
    for path in [r.path for r in origin_http.requests]:
        assert path in [e["path"] for e in requests], (path, requests)
    refused = [e for e in requests if e["reason"] == "audit_unavailable"]
    assert len(refused) == statuses.count(503) + more.count(503)
