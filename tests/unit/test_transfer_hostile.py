"""A file get or put (`sandbox.daemon.transfer`) answered by a hostile agent: the real session
and transfer code, over a real channel and pipes, with a small agent at the other end that
speaks the protocol but forges the file's size (a get's size to send, a put's size written). A
size that is not a count within the limit (a get's) or of at most the bytes sent (a put's) is
refused as `sandbox_failed` (not a bug's `internal_error`), with the daemon's ends of the pipes
closed and the sandbox's request place given back; an honest answer over the same double is
served, so the refusals are the size's doing."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from sealgate.reasons import Reason
from sealgate.sandbox.daemon import transfer
from sealgate.sandbox.daemon.session import Options, Session, SessionError
from sealgate.sandbox.guest.protocol import Op, parse, receive, report
from tests.unit.test_handover_wire import open_fds

LIMIT = 1 << 20


class _Holder:
    """Where the sandbox would run, reduced to what a file get touches: its agent's channel."""

    uid: int | None = None
    image = None
    address = "192.0.2.1"
    upper: Path | None = None
    netns: Path | None = None

    def __init__(self, channel: socket.socket) -> None:
        self.channel = channel
        self.environment: dict[str, str] = {}

    def freeze(self, frozen: bool) -> None:
        raise AssertionError("a get freezes nothing")


def _agent(chan: socket.socket, answer: dict[str, Any], data: bytes) -> int:
    """One request taken as the agent takes it. A get: `answer` said as its status and `data`
    written; the agent's end of the data pipe, left open (returned) so the test can see the
    daemon's end closed. A put: the file read to its end (the daemon's end closed), checked to
    be `data`, then `answer` said as its status; -1."""
    got = receive(chan)
    assert got is not None
    request = parse(*got)
    assert request is not None
    if request[0] is Op.PUT:
        data_r, status_w = got[1]
        assert request[2]["size"] == len(data)
        with os.fdopen(data_r, "rb") as sent:
            assert sent.read() == data
        report(status_w, answer)
        os.close(status_w)
        return -1
    assert request[0] is Op.GET and request[2]["limit"] == LIMIT
    data_w, status_w = got[1]
    report(status_w, answer)
    os.close(status_w)
    if data:
        os.write(data_w, data)
    return data_w



async def _asked(ours: socket.socket, theirs: socket.socket, answer: dict[str, Any],
                 data: bytes = b"", op: Op = Op.GET
                 ) -> tuple[Session[Any], BaseException | bytes | int, int]:
    """A get (or a put of `data`) of one file answered with `answer`: the session, what it gave
    (the refusal, the file's bytes or the size written) and the agent's end of a get's data
    pipe."""
    session: Session[Any] = Session("sb-hostile", _Holder(ours), Options(sandbox="ci-bot"))

    async def body() -> AsyncIterator[bytes]:
        yield data

    async def daemon() -> BaseException | bytes | int:
        try:
            if op is Op.PUT:
                return await transfer.put(session, "f.txt", len(data), 0o644, body())
            _, download = await transfer.get(session, "f.txt", LIMIT)
        except SessionError as refused:
            return refused
        try:
            return b"".join([chunk async for chunk in download])
        finally:
            await download.aclose()

    agent = asyncio.create_task(asyncio.to_thread(_agent, theirs, answer, data))
    gave = await asyncio.wait_for(daemon(), 30)
    return session, gave, await agent


@pytest.mark.parametrize("size", [-1, LIMIT + 1, 1.5, "5", True, None, [5]])
def test_a_forged_size_is_refused_with_nothing_kept(
    seqpacket: tuple[socket.socket, socket.socket], size: object
) -> None:
    before = open_fds()
    session, refused, data_w = asyncio.run(_asked(*seqpacket, {"size": size}))
    try:
        assert isinstance(refused, SessionError), refused
        assert refused.reason is Reason.SANDBOX_FAILED and "not one" in str(refused)
        assert session.active == 0 and not session.ended.is_set()  # its place given back
        with pytest.raises(BrokenPipeError):  # the daemon's end of the file's pipe is closed
            os.write(data_w, b"x")
    finally:
        os.close(data_w)
    assert open_fds() == before


def test_an_honest_size_over_the_same_agent_is_served(
    seqpacket: tuple[socket.socket, socket.socket]
) -> None:
    before = open_fds()
    session, given, data_w = asyncio.run(_asked(*seqpacket, {"size": 5}, b"hello"))
    os.close(data_w)
    assert given == b"hello" and session.active == 0
    assert open_fds() == before


@pytest.mark.parametrize("answer", [{"size": -1}, {"size": 6}, {"size": LIMIT + 1},
                                    {"size": 4.5}, {"size": "5"}, {"size": True},
                                    {"size": None}, {"size": [5]}, {}])
def test_a_forged_size_written_is_refused_with_nothing_kept(
    seqpacket: tuple[socket.socket, socket.socket], answer: dict[str, Any]
) -> None:
    before = open_fds()
    session, refused, _ = asyncio.run(_asked(*seqpacket, answer, b"hello", Op.PUT))
    assert isinstance(refused, SessionError), refused
    assert refused.reason is Reason.SANDBOX_FAILED and "not one" in str(refused)
    assert session.active == 0 and not session.ended.is_set()  # its place given back
    assert open_fds() == before


def test_an_honest_size_written_over_the_same_agent_is_served(
    seqpacket: tuple[socket.socket, socket.socket]
) -> None:
    before = open_fds()
    session, written, _ = asyncio.run(_asked(*seqpacket, {"size": 5}, b"hello", Op.PUT))
    assert written == 5 and session.active == 0
    assert open_fds() == before
