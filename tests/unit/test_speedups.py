"""The lean master's replacements for mitmproxy's per-request conveniences (proxy/speedups.py)."""

from __future__ import annotations

import uuid

from sealgate.proxy.engine.speedups import RandomIds


def test_ids_are_random_version_4_uuids_across_refills() -> None:
    ids = RandomIds()
    drawn = [ids.uuid4() for _ in range(1000)]  # several refills of the 256-id buffer
    assert len(set(drawn)) == len(drawn)
    for text in drawn:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, text)


def test_ids_are_not_a_sequence() -> None:
    # A denial shows the sandbox its request id: consecutive ids must share no more than chance.
    ids = RandomIds()
    a, b = ids.uuid4(), ids.uuid4()
    assert sum(x == y for x, y in zip(a.replace("-", ""), b.replace("-", ""), strict=True)) < 12
