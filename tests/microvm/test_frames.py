"""The host's reading of the guest agent's frames, fed what a compromised guest could send:
the real framing, checks and readers (`GuestFrames`, `Channel`, hostserve's `relay`) over a
real socket pair, with this test as the guest. No VM: the guest's own agent cannot send these
(and a command in the guest cannot reach its port, which is root's)."""

from __future__ import annotations

import socket
import struct
import threading
from typing import Any

import pytest

from sealgate.sandbox.errors import SandboxError
from sealgate.sandbox.guest.protocol import VERSION, GuestFrames, encode
from sealgate.sandbox.tiers.microvm.channel import Channel
from sealgate.sandbox.tiers.microvm.guestlink import relay


def frame(head: bytes, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(head) + 1 + len(payload)) + head + b"\n" + payload


HOSTILE = {
    "nested array": frame(b"[" * 5000 + b"]" * 5000),
    "nested in a field": frame(b'{"op":"out","id":1,"fd":1,"x":' + b"[" * 40 + b"]" * 40 + b"}"),
    "header over its bound": frame(b'{"op":"error","id":1,"message":"' + b"x" * 20_000 + b'"}'),
    "bad UTF-8": frame(b'{"op":"\xff\xfe"}'),
    "an array": frame(b"[1]"),
    "a string": frame(b'"ready"'),
    "null": frame(b"null"),
    "no header line": struct.pack(">I", 5) + b"{}{}{",
    "an unknown op": frame(b'{"op":"exec","id":1}'),
    "an exit without a code": frame(b'{"op":"exit","id":1}'),
    "a code that is a string": frame(b'{"op":"exit","id":1,"code":"0"}'),
    "a code that is a bool": frame(b'{"op":"exit","id":1,"code":true}'),
    "a code that is NaN": frame(b'{"op":"exit","id":1,"code":NaN}'),
    "a code out of range": frame(b'{"op":"exit","id":1,"code":300}'),
    "a code of 5000 digits": frame(b'{"op":"exit","id":1,"code":' + b"9" * 5000 + b"}"),
    "an output to fd 3": frame(b'{"op":"out","id":1,"fd":3}'),
    "an id that is null": frame(b'{"op":"ok","id":null}'),
}


@pytest.mark.parametrize("data", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_frame_is_a_value_error(data: bytes) -> None:
    """Never RecursionError, KeyError, TypeError or a header taken as valid: the callers end
    the VM on ValueError and expect nothing else."""
    with pytest.raises(ValueError, match=r"frame|header|JSON|Expecting|decode|answer|digits"):
        GuestFrames().feed(data)


def test_a_frame_over_the_bound_is_refused_before_it_arrives() -> None:
    with pytest.raises(ValueError, match="a frame of"):
        GuestFrames().feed(struct.pack(">I", 1 << 31) + b"{")


def test_what_the_agent_sends_is_read() -> None:
    sent: list[dict[str, Any]] = [
        {"op": "ready", "kernel": "6.1.0-57-amd64", "version": VERSION}, {"op": "ok", "id": 1},
        {"op": "started", "id": 2, "pid": 97}, {"op": "out", "id": 2, "fd": 2},
        {"op": "exit", "id": 2, "code": 143, "signal": 15},
        {"op": "exit", "id": 3, "code": 124, "timed_out": True},
        {"op": "error", "id": 4, "message": "[Errno 2] {no such} \"file\""},
    ]
    data = b"".join(encode(header, b"[[[[" * i) for i, header in enumerate(sent))
    frames = GuestFrames()
    got = [f for i in range(0, len(data), 7) for f in frames.feed(data[i:i + 7])]
    assert got == [(header, b"[[[[" * i) for i, header in enumerate(sent)]


def test_a_bad_frame_ends_the_launchers_reader_cleanly() -> None:
    """hostserve's reader says why it stops, so its VM (and sandbox) ends, and hands over
    nothing from past the bad frame; it must not die of an exception and leave the VM running
    without a reader, every later request then lost."""
    host, guest = socket.socketpair()
    delivered: list[tuple[dict[str, Any], bytes]] = []
    with host, guest:
        guest.sendall(encode({"op": "out", "id": 1, "fd": 1}, b"hi") + HOSTILE["nested array"]
                      + encode({"op": "exit", "id": 1, "code": 0}))
        guest.shutdown(socket.SHUT_WR)
        why = relay(host, GuestFrames(), delivered.append)
    assert why.startswith("the guest sent a bad frame: ") and "nests deeper" in why, why
    assert [header["op"] for header, _ in delivered] in ([], ["out"])


@pytest.mark.parametrize("name", ["nested array", "an exit without a code", "bad UTF-8"])
def test_a_bad_frame_is_a_sandbox_error_for_the_one_shot_launcher(name: str) -> None:
    """hostrun (`sandbox run`) reports a SandboxError as one line and exits 125; anything else
    would be a traceback and exit 1."""
    host, guest = socket.socketpair()

    def answer() -> None:
        guest.recv(1 << 16)  # the exec and its end of input
        guest.sendall(encode({"op": "started", "id": 1, "pid": 5}) + HOSTILE[name])

    answering = threading.Thread(target=answer)
    answering.start()
    with host, guest:
        with pytest.raises(SandboxError, match="the microVM's agent sent a bad frame"):
            Channel(host).run(["true"], {}, uid=1000, gid=1000, timeout=5)
        answering.join()
