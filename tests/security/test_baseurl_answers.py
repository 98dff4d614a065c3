"""The answers to base-URL requests, framed byte for byte on the client's side: each framing an
origin may use arrives whole and leaves the client's connection in step, and an origin that
sends more (a second response, an informational one) or less (a body cut off) than it declared
never puts a wrong answer in front of a client, on the same connection or a new one.

Pins today's behaviour (mitmproxy's HTTP/1 layers) for a second engine in front of the same
listener (issue 26's fast path); debatable outcomes are marked `# today's behaviour:`. The
origin's scripts are by path (tests.framingorigin.SCRIPTS); requests' side:
tests/security/test_baseurl_framing.py.
"""

from __future__ import annotations

import pytest

from tests.framingorigin import Base, Conn, FramingOrigin


def fresh(base: Base) -> None:
    """A new client connection gets its own answer, nothing left over from another."""
    with Conn(base.proxy) as c:
        c.send(base.get("/fresh"))
        answer = c.answer()
        assert answer is not None and (answer.status, answer.body) == (200, b"GET /fresh 0")
        assert c.rest(0.1) == (b"", False)


@pytest.mark.parametrize(
    ("method", "path", "status", "body", "framing", "kept"),
    [
        ("GET", "/x", 200, b"GET /x 0", ("content-length", "8"), True),
        # today's behaviour: a chunked answer stays chunked on the client's leg
        ("GET", "/chunked", 200, b"chunked", ("transfer-encoding", "chunked"), True),
        # read until the origin's close; the client's connection is closed after it
        ("GET", "/eof", 200, b"read until close", ("content-length", None), False),
        ("HEAD", "/head", 200, b"", ("content-length", "11"), True),
        ("GET", "/204", 204, b"", ("content-length", None), True),
        ("GET", "/304", 304, b"", ("content-length", None), True),
    ],
    ids=["content-length", "chunked", "until-close", "head", "204", "304"],
)
def test_each_framing_arrives_whole_and_in_step(
    base: Base, framing_origin: FramingOrigin, method: str, path: str, status: int, body: bytes,
    framing: tuple[str, str | None], kept: bool,
) -> None:
    with Conn(base.proxy) as c:
        c.send(base.req(method, path))
        answer = c.answer(method)
        assert answer is not None and (answer.status, answer.body) == (status, body), answer
        assert answer.complete and answer.header(framing[0]) == framing[1], answer.fields
        if kept:
            c.send(base.get("/next"))
            after = c.answer()
            assert after is not None and after.body == b"GET /next 0", after
            assert c.rest(0.1) == (b"", False)
        else:
            assert c.rest(2.0) == (b"", True)
    targets = [g.target for g in framing_origin.settled(2 if kept else 1)]
    assert targets == ([path, "/next"] if kept else [path])


def test_a_second_response_from_the_origin_reaches_no_client(
    base: Base, framing_origin: FramingOrigin
) -> None:
    with Conn(base.proxy) as c:
        c.send(base.get("/twice"))
        answer = c.answer()
        assert answer is not None and answer.body == b"first"
        c.send(base.get("/next"))
        after = c.answer()
        assert after is not None and after.body == b"GET /next 0", after
        assert c.rest(0.2) == (b"", False)
    fresh(base)
    got = framing_origin.settled(3)
    assert [g.target for g in got] == ["/twice", "/next", "/fresh"]
    # The connection with the unread response was not kept for another request.
    assert got[0].conn not in {got[1].conn, got[2].conn}


@pytest.mark.parametrize(("path", "informational"), [("/hints", 103), ("/continue", 100)])
def test_an_informational_answer_before_the_real_one(
    base: Base, framing_origin: FramingOrigin, path: str, informational: int
) -> None:
    """The origin sends a 1xx and its 200 ("final") at once, to a GET without Expect. The
    informational answer is skipped (the proxy asked for none; a 103 is only a hint) and the
    real one passed on. (mitmproxy's layers took a 1xx for the final answer: a client got the
    1xx and waited for the rest, and the 200, unread, went with its upstream connection.)"""
    with Conn(base.proxy, timeout=1.5) as c:
        c.send(base.get(path))
        first = c.answer()
        assert first is not None and (first.status, first.body) == (200, b"final"), first
        assert informational not in {a.status for a in [first]}
        c.send(base.get("/next"))
        after = c.answer()
        assert after is not None and after.body == b"GET /next 0", after
        assert c.rest(0.2) == (b"", False)  # nothing more: no second answer, still open
    fresh(base)
    got = framing_origin.settled(3)
    assert [g.target for g in got] == [path, "/next", "/fresh"]


def test_expect_100_and_an_origin_that_sends_its_own_100(
    base: Base, framing_origin: FramingOrigin
) -> None:
    with Conn(base.proxy, timeout=1.5) as c:
        c.send(base.req("POST", "/continue", b"Content-Length: 3\r\nExpect: 100-continue\r\n",
                        b"abc"))
        statuses = []
        for _ in range(3):
            answer = c.answer("POST")
            if answer is None:
                break
            statuses.append(answer.status)
        # Handed to mitmproxy's layers (Expect is not the fast path's): the proxy's own 100,
        # then the origin's answer, its own 100 skipped (proxy/engine/framing.py; it was taken
        # for the answer, and the 200 was lost).
        assert statuses == [100, 200] and not c.eof
    fresh(base)
    got = framing_origin.settled(2)
    assert [(g.target, g.body, g.values("expect")) for g in got] == [
        ("/continue", b"abc", []), ("/fresh", b"", [])]


def test_a_body_cut_off_upstream_never_looks_complete(
    base: Base, framing_origin: FramingOrigin
) -> None:
    """The origin declares 100 bytes, sends 10 and closes."""
    with Conn(base.proxy) as c:
        c.send(base.get("/cut"))
        answer = c.answer()
        assert answer is not None
        assert not (answer.status == 200 and answer.complete), answer
        # today's behaviour: the body is read whole before the answer goes, so the client
        # gets a 502 of the proxy's, and its connection is closed.
        assert (answer.status, answer.header("x-sealgate-error")) == (502, "upstream_reset")
        assert b"only ten b" not in answer.body
        assert c.rest(2.0) == (b"", True)
    fresh(base)
    assert [g.target for g in framing_origin.settled(2)] == ["/cut", "/fresh"]
