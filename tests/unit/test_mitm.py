"""mitmproxy's internals that proxy/mitm.py patches: as tested, scoped to mitmproxy, guarded."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from mitmproxy.proxy import server
from mitmproxy.proxy.layers.http import _http1, _http2

from sealgate.proxy.engine import mitm, mitmcheck, pool


def test_every_patched_symbol_is_as_tested() -> None:
    problems = mitmcheck.mismatches()
    assert not problems, (
        f"mitmproxy changed where sealgate patches it (tested: {mitm.TESTED}.x):\n  "
        + "\n  ".join(problems)
    )


def test_a_changed_signature_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def make_error_response(code: int) -> bytes:
        return b""

    monkeypatch.setattr(_http1, "make_error_response", make_error_response)
    [problem] = mitmcheck.mismatches()
    assert problem == (
        "mitmproxy.proxy.layers.http._http1.make_error_response: expected parameters "
        "(status_code, message=), found (code)"
    )


def test_a_gone_method_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(_http2.Http2Connection, "is_open_for_us")
    [problem] = mitmcheck.mismatches()
    assert problem.startswith("mitmproxy.proxy.layers.http._http2.Http2Server._handle_event: ")
    assert "is_open_for_us" in problem


def test_a_call_no_longer_made_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # mitmproxy dialing some other way than asyncio.open_connection: the bound would be lost.
    async def open_connection(self: Any, command: Any) -> None:
        pass

    monkeypatch.setattr(server.ConnectionHandler, "open_connection", open_connection)
    [problem] = mitmcheck.mismatches()
    assert problem.startswith("mitmproxy.proxy.server.asyncio.open_connection: no longer uses ")


def test_require_tested_refuses_and_lists_every_symbol(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(_http2.Http2Connection, "is_open_for_us")
    monkeypatch.setattr(_http1, "make_error_response", lambda: b"")
    with pytest.raises(mitm.MitmproxyMismatch) as raised:
        mitm.require_tested()
    assert "_http1.make_error_response" in str(raised.value)
    assert "_http2.Http2Server._handle_event" in str(raised.value)


def test_bounded_dial_says_it_timed_out() -> None:
    async def black_hole(*args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(10)

    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^connect timed out after 0.05 s$"):
        asyncio.run(pool.Pool(0.05).bounded(black_hole("192.0.2.1", 443)))
    assert time.monotonic() - started < 2


def test_listen_endpoints_fill_in_the_defaults() -> None:
    modes = ["regular@127.0.0.1:8080", "transparent@10.200.0.1:8081", "regular"]
    assert mitm.listen_endpoints(modes, "", 3128) == [
        ("127.0.0.1", 8080), ("10.200.0.1", 8081), ("0.0.0.0", 3128)
    ]
    assert mitm.listen_endpoints(["regular"], "10.0.0.1", None) == [("10.0.0.1", 8080)]
