"""Base-URL requests (`GET /_/<host>/...` in plain HTTP/1.1 to the explicit listener), framed
byte for byte: what the client gets back, whether its connection is kept, and exactly which
requests the origin reads (tests.framingorigin reads them strictly, per connection).

This pins today's behaviour (mitmproxy's HTTP/1 layers) for a second engine in front of the
same listener (issue 26's fast path): whatever takes a request, the two must frame it the same
way. Where today's outcome is debatable it is still pinned, marked `# today's behaviour:`.
The answers' side is tests/security/test_baseurl_answers.py.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest

from tests.framingorigin import Answer, Base, Conn, FramingOrigin, Got

SMUGGLED = "/smuggled"  # the path of every request hidden inside another


def answers(conn: Conn, method: str = "GET") -> list[Answer]:
    """The answers up to the first final one (1xx included)."""
    found: list[Answer] = []
    for _ in range(5):
        answer = conn.answer(method)
        if answer is None:
            break
        found.append(answer)
        if answer.status >= 200:
            break
    return found


def seen(got: list[Got]) -> list[tuple[str, str, bytes]]:
    assert not [g for g in got if g.bad], [g.bad for g in got]
    assert not [g for g in got if SMUGGLED in g.target], got
    return [(g.method, g.target, g.body) for g in got]


def test_keep_alive_three_gets_on_one_connection(base: Base, framing_origin: FramingOrigin) -> None:
    paths = ["/v1/a", "/v1/b?x=1&y=%2F", "/"]
    with Conn(base.proxy) as c:
        for path in paths:
            c.send(base.get(path))
            answer = c.answer()
            assert answer is not None and answer.status == 200, answer
            assert answer.body == f"GET {path} 0".encode() and answer.complete
        assert c.rest(0.1) == (b"", False)  # kept open, nothing extra
    got = framing_origin.settled(3)
    assert seen(got) == [("GET", p, b"") for p in paths]
    for g in got:
        assert g.values("host") == [f"frame.test:{framing_origin.port}"]
        assert not g.values("proxy-authorization")
    assert len({g.conn for g in got}) == 1  # one upstream connection, kept


@pytest.mark.parametrize("body", [b"", b"abc", b"a\r\n\r\nb\x00\xff" * 50], ids=["0", "3", "450"])
def test_a_content_length_body_arrives_byte_exact(
    base: Base, framing_origin: FramingOrigin, body: bytes
) -> None:
    with Conn(base.proxy) as c:
        c.send(base.req("POST", "/up", b"Content-Length: %d\r\n" % len(body), body))
        c.send(base.get("/after"))  # pipelined right behind the body
        first, second = c.answer(), c.answer()
    assert first is not None and first.body == b"POST /up %d" % len(body)
    assert second is not None and second.body == b"GET /after 0"
    got = framing_origin.settled(2)
    assert seen(got) == [("POST", "/up", body), ("GET", "/after", b"")]
    assert got[0].values("content-length") == [str(len(body))]


class Case(NamedTuple):
    """A request's head after `<method> <prefix><path> <version>` and the standard lines (Host,
    Proxy-Authorization), its body, and today's outcome: the answers' statuses, whether the
    connection stays open, and the request the origin reads ((method, target, body) or None)."""

    extra: bytes
    body: bytes
    statuses: tuple[int, ...]
    kept: bool
    sees: tuple[str, str, bytes] | None
    method: str = "POST"
    version: bytes = b"HTTP/1.1"


INNER = b"@INNER@"  # replaced by a complete request for SMUGGLED
CHUNKED_INNER = b"@CHUNK@"  # replaced by that request as one chunk, and the last chunk
TAIL = b"0\r\n\r\n" + INNER
CASES = {
    # -- smuggling ------------------------------------------------------------------------
    "cl-and-te": Case(b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", TAIL,
                      (400,), False, None),
    "two-content-lengths": Case(b"Content-Length: 3\r\nContent-Length: 5\r\n", b"abcde",
                                (400,), False, None),
    # today's behaviour: even two equal Content-Lengths (RFC 9112 allows merging them)
    "two-equal-content-lengths": Case(b"Content-Length: 5\r\nContent-Length: 5\r\n", b"abcde",
                                      (400,), False, None),
    "content-length-list": Case(b"Content-Length: 5, 5\r\n", b"abcde", (400,), False, None),
    "content-length-signed": Case(b"Content-Length: +5\r\n", b"abcde", (400,), False, None),
    "content-length-negative": Case(b"Content-Length: -1\r\n", b"", (400,), False, None),
    "chunk-holds-a-request": Case(b"Transfer-Encoding: chunked\r\n", CHUNKED_INNER, (200,),
                                  True, ("POST", "/p", INNER)),
    "te-space-before-colon": Case(b"Transfer-Encoding : chunked\r\n", TAIL, (400,), False, None),
    "te-xchunked": Case(b"Transfer-encoding: xchunked\r\n", TAIL, (400,), False, None),
    "te-obs-fold": Case(b"Transfer-Encoding:\r\n chunked\r\n", TAIL, (400,), False, None),
    "te-identity": Case(b"Transfer-Encoding: identity\r\n", TAIL, (400,), False, None),
    "te-twice": Case(b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                     b"0\r\n\r\n", (400,), False, None),
    # today's behaviour: a Transfer-Encoding list ending in chunked is forwarded as it is
    "te-gzip-chunked": Case(b"Transfer-Encoding: gzip, chunked\r\n", b"3\r\nabc\r\n0\r\n\r\n",
                            (200,), True, ("POST", "/p", b"abc")),
    "te-odd-case": Case(b"transfer-ENCODING: Chunked\r\n", b"3\r\nabc\r\n0\r\n\r\n", (200,),
                        True, ("POST", "/p", b"abc")),
    # today's behaviour: bare LF line ends are read as CRLF (mitmproxy's reader)
    "bare-lf-header": Case(b"X-A: 1\nX-B: 2\r\n", b"", (200,), True, ("GET", "/p", b""),
                           method="GET"),
    # today's behaviour: refused after the whole request was read, the connection kept
    "obs-fold": Case(b"X-A: 1\r\n folded\r\n", b"", (400,), True, None, method="GET"),
    "nul-in-value": Case(b"X-A: a\x00b\r\n", b"", (400,), True, None, method="GET"),
    "cr-in-value": Case(b"X-A: a\rb\r\n", b"", (400,), True, None, method="GET"),
    "space-in-name": Case(b"X-A : 1\r\n", b"", (400,), False, None, method="GET"),
    "body-holds-a-request": Case(b"Content-Length: @LEN@\r\n", INNER, (200,), True,
                                 ("POST", "/p", INNER)),
    # -- other shapes, today's outcome ------------------------------------------------------
    "chunked-body": Case(b"Transfer-Encoding: chunked\r\n", b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
                         (200,), True, ("POST", "/p", b"abcde")),
    # today's behaviour: the proxy answers the 100 itself; the origin sees no Expect
    "expect-100": Case(b"Content-Length: 5\r\nExpect: 100-continue\r\n", b"abcde", (100, 200),
                       True, ("POST", "/p", b"abcde")),
    "http-1.0": Case(b"", b"", (200,), False, ("GET", "/p", b""), method="GET",
                     version=b"HTTP/1.0"),
    # today's behaviour: forwarded with its Upgrade headers, answered as any GET
    "upgrade-websocket": Case(b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key:"
                              b" dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n", b"",
                              (200,), True, ("GET", "/p", b""), method="GET"),
}


def inner(base: Base) -> bytes:
    return base.get(SMUGGLED)


def payload(base: Base, case: Case) -> bytes:
    smuggled = inner(base)
    body = case.body.replace(CHUNKED_INNER, b"%x\r\n%s\r\n0\r\n\r\n" % (len(smuggled), smuggled))
    body = body.replace(INNER, smuggled)
    extra = case.extra.replace(b"@LEN@", b"%d" % len(body))
    return base.req(case.method, "/p", extra, body, case.version)


@pytest.mark.parametrize("second", [False, True], ids=["first", "after-a-get"])
@pytest.mark.parametrize("name", CASES)
def test_a_request_is_framed_once_and_alone(
    base: Base, framing_origin: FramingOrigin, name: str, second: bool
) -> None:
    case = CASES[name]
    with Conn(base.proxy) as c:
        if second:
            c.send(base.get("/good"))
            assert (a := c.answer()) is not None and a.body == b"GET /good 0"
        c.send(payload(base, case))
        got = answers(c, case.method)
        assert tuple(a.status for a in got) == case.statuses, [(a.status, a.body) for a in got]
        final = got[-1]
        if final.status == 400:
            assert final.header("x-sealgate-error") == "bad_request", final.body
        else:
            assert final.body == b"%s /p %d" % (case.method.encode(), len(
                case.sees[2].replace(INNER, inner(base)) if case.sees else b""))
        if case.kept:  # still open, and in step: the next request gets its own answer
            c.send(base.get("/next"))
            assert (a := c.answer()) is not None and a.body == b"GET /next 0", a
            after = [("GET", "/next", b"")]
        else:
            assert c.rest(2.0) == (b"", True)
            after = []
    expected = [("GET", "/good", b"")] if second else []
    if case.sees is not None:
        method, target, body = case.sees
        expected.append((method, target, body.replace(INNER, inner(base))))
    assert seen(framing_origin.settled(len(expected + after))) == expected + after


def test_no_host_header_is_refused(base: Base, framing_origin: FramingOrigin) -> None:
    with Conn(base.proxy) as c:
        c.send(base.get("/nohost").replace(b"Host: 127.0.0.1:%d\r\n" % base.proxy, b""))
        answer = c.answer()
        assert answer is not None and answer.status == 400
        assert answer.header("x-sealgate-error") == "bad_request"
        assert c.rest(2.0) == (b"", True)
    assert seen(framing_origin.settled(1, timeout=0.3)) == []


def test_bare_lf_throughout_is_read_as_crlf(base: Base, framing_origin: FramingOrigin) -> None:
    # today's behaviour: a request with only LF line ends is accepted and forwarded
    with Conn(base.proxy) as c:
        c.send(base.get("/lf").replace(b"\r\n", b"\n"))
        answer = c.answer()
        assert answer is not None and (answer.status, answer.body) == (200, b"GET /lf 0")
    assert seen(framing_origin.settled(1)) == [("GET", "/lf", b"")]


@pytest.mark.parametrize(("scheme", "status"), [("https", 200), ("http", 502)])
def test_absolute_form_is_not_a_base_url(
    base: Base, framing_origin: FramingOrigin, scheme: str, status: int
) -> None:
    """`GET https://frame.test:<port>/abs` to the proxy: an ordinary proxy request. Over http
    the proxy dials the TLS origin in plain text (no credential goes, so no rule forbids it):
    the origin reads nothing, the client gets a 502."""
    authority = b"frame.test:%d" % framing_origin.port
    with Conn(base.proxy) as c:
        c.send(b"GET %s://%s/abs HTTP/1.1\r\nHost: %s\r\n%s\r\n" % (
            scheme.encode(), authority, authority, base.std.partition(b"\r\n")[2]))
        answer = c.answer()
        assert answer is not None and answer.status == status, answer
        if status == 200:
            assert answer.body == b"GET /abs 0"
        else:
            assert answer.header("x-sealgate-error") == "upstream_reset"
            assert c.rest(2.0) == (b"", True)
    assert seen(framing_origin.settled(1 if status == 200 else 0)) == (
        [("GET", "/abs", b"")] if status == 200 else [])


def test_simple_then_chunked_then_simple(base: Base, framing_origin: FramingOrigin) -> None:
    requests = [base.get("/one"),
                base.req("POST", "/two", b"Transfer-Encoding: chunked\r\n",
                         b"4\r\nGET \r\n5\r\n/_/x \r\n0\r\n\r\n"),
                base.req("POST", "/three", b"Content-Length: 3\r\n", b"xyz")]
    with Conn(base.proxy) as c:
        for request, body in zip(requests, [b"GET /one 0", b"POST /two 9", b"POST /three 3"],
                                 strict=True):
            c.send(request)
            assert (a := c.answer()) is not None and a.body == body, a
        assert c.rest(0.1) == (b"", False)
    assert seen(framing_origin.settled(3)) == [
        ("GET", "/one", b""), ("POST", "/two", b"GET /_/x "), ("POST", "/three", b"xyz")]


@pytest.mark.parametrize("mixed", [False, True], ids=["two-gets", "get-chunked-get"])
def test_pipelined_requests_are_answered_in_order(
    base: Base, framing_origin: FramingOrigin, mixed: bool
) -> None:
    requests = [base.get("/p1")]
    if mixed:
        requests.append(base.req("POST", "/p2", b"Transfer-Encoding: chunked\r\n",
                                 b"2\r\nhi\r\n0\r\n\r\n"))
    requests.append(base.get("/p3"))
    with Conn(base.proxy) as c:
        c.send(b"".join(requests))  # one write, before reading anything
        bodies = [a.body if (a := c.answer()) else None for _ in requests]
        assert c.rest(0.1) == (b"", False)
    expected = [("GET", "/p1", b""), *([("POST", "/p2", b"hi")] if mixed else []),
                ("GET", "/p3", b"")]
    assert bodies == [b"%s %s %d" % (m.encode(), t.encode(), len(b)) for m, t, b in expected]
    assert seen(framing_origin.settled(len(expected))) == expected
