"""The hand-over's wire and records (`sandbox.daemon.handover`, `sandbox.daemon.carried`): what is
not the protocol is refused in words, and a refused record leaves its descriptors to be closed
once, by the caller (tests/sandboxd/test_adopt.py runs the hand-over for real)."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
from pathlib import Path

import pytest

from sealgate.sandbox.daemon import carried, handover
from sealgate.sandbox.daemon.slot import SlotConfig

CONFIG = SlotConfig(state=Path("/nonexistent"), proxy_port=3128)



def open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


@pytest.mark.parametrize("packet", [b"not json", b"[1, 2]", b'"text"', b"\xff\xfe"])
def test_what_is_not_a_json_object_is_refused_and_its_descriptors_closed(
    seqpacket: tuple[socket.socket, socket.socket], packet: bytes
) -> None:
    a, b = seqpacket
    r, w = os.pipe()
    try:
        before = open_fds()
        socket.send_fds(a, [packet], [r, w])
        with pytest.raises(handover.HandoverError, match="not the hand-over protocol"):
            handover.receive(b)
        assert open_fds() == before  # what came with it was closed
    finally:
        os.close(r)
        os.close(w)


def test_an_oversized_message_is_refused(seqpacket: tuple[socket.socket, socket.socket]) -> None:
    a, b = seqpacket
    a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    with pytest.raises(handover.HandoverError, match="over"):
        handover.send(a, {"x": "y" * handover.MAX_MESSAGE})
    a.close()
    with pytest.raises(handover.HandoverError, match="closed"):
        handover.receive(b)


def test_a_hello_is_compared_setting_by_setting() -> None:
    ours = {"uid_base": 1, "state": "/s"}
    assert handover.differences(ours, dict(ours)) == []
    assert handover.differences(ours, {"uid_base": 2, "state": "/s"}) == \
        ["uid_base: 1 here, 2 there"]
    assert handover.differences(ours, None) == ["no settings given"]


def test_the_hand_over_socket_is_one_per_api_socket() -> None:
    one = handover.path_for(Path("/s"), Path("/run/a.sock"))
    assert one.parent == Path("/s/handover")
    assert one != handover.path_for(Path("/s"), Path("/run/b.sock"))


def record(pid: int) -> dict[str, object]:
    return {"index": 3, "uid": CONFIG.uid_base + 3, "pid": pid, "tier": "bwrap", "init": None,
            "groups": ["/sys/fs/cgroup/pids/sealgate/run-3-1"], "environment": {"A": "b"},
            "image": None, "pool": None}


def test_a_slot_whose_descriptors_are_not_what_they_must_be_is_refused() -> None:
    child = subprocess.Popen(["sleep", "30"])
    pidfd = os.pidfd_open(child.pid)
    r, w = os.pipe()
    channel, other = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stream, stream_peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        good = record(child.pid)
        cases = [
            ({**good}, [channel.fileno(), pidfd, w], "4 descriptors"),
            ({**good, "uid": 5}, [channel.fileno(), pidfd, w, stream.fileno()], "links and uids"),
            ({**good, "tier": "gvisor"}, [channel.fileno(), pidfd, w, stream.fileno()], "tier"),
            ({**good, "groups": ["/sys/fs/cgroup/pids/user.slice"]},
             [channel.fileno(), pidfd, w, stream.fileno()], "not its cgroups"),
            ({**good, "environment": {"A": 1}},
             [channel.fileno(), pidfd, w, stream.fileno()], "environment"),
            ({**good, "pid": child.pid + 1}, [channel.fileno(), pidfd, w, stream.fileno()],
             "not pid"),
            (good, [channel.fileno(), r, w, stream.fileno()], "not pid"),  # a pipe, no pidfd
            (good, [channel.fileno(), pidfd, pidfd, stream.fileno()], "not a pipe"),
            (good, [stream.fileno(), pidfd, w, stream.fileno()], "not what it must be"),
            (good, [channel.fileno(), pidfd, w, stream.fileno()], "not what it must be"),
        ]
        for data, fds, words in cases:
            before = open_fds()
            with pytest.raises(ValueError, match=words):
                carried.rebuild_slot(data, fds, CONFIG)
            assert open_fds() == before, words  # nothing closed, nothing opened: the caller's
    finally:
        child.kill()
        child.wait()
        for fd in (pidfd, r, w):
            os.close(fd)
        for sock in (channel, other, stream, stream_peer):
            sock.close()


def test_a_held_process_is_watched_and_killed_by_its_pidfd() -> None:
    child = subprocess.Popen(["sleep", "30"])
    held = carried.Held(child.pid, os.pidfd_open(child.pid))
    with pytest.raises(subprocess.TimeoutExpired):
        held.wait(0.05)
    held.kill()
    assert held.wait(5) == 0
    assert child.wait(5) == -9
    held.kill()  # over: nothing to signal, nothing raised
    assert held.wait(0) == 0


def test_json_nested_past_the_parsers_depth_is_refused_in_words(
    seqpacket: tuple[socket.socket, socket.socket]
) -> None:
    a, b = seqpacket
    r, w = os.pipe()
    try:
        before = open_fds()
        # Past any recursion limit: json.loads raises RecursionError, not ValueError.
        socket.send_fds(a, [b'{"slot": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"], [r])
        with pytest.raises(handover.HandoverError, match="not the hand-over protocol"):
            handover.receive(b)
        assert open_fds() == before
    finally:
        os.close(r)
        os.close(w)


def test_descriptors_arrive_close_on_exec(seqpacket: tuple[socket.socket, socket.socket]) -> None:
    a, b = seqpacket
    r, w = os.pipe()
    os.set_inheritable(r, True)  # as it may be on the other side
    try:
        socket.send_fds(a, [b"{}"], [r])
        _, fds = handover.receive(b)
        assert len(fds) == 1
        # Never inherited by a process we start: O_CLOEXEC set as it arrived.
        assert not os.get_inheritable(fds[0])
        handover.close(fds)
    finally:
        os.close(r)
        os.close(w)


def test_descriptors_past_the_limit_are_refused_and_those_that_came_closed(
    seqpacket: tuple[socket.socket, socket.socket]
) -> None:
    a, b = seqpacket
    pipes = [os.pipe() for _ in range(handover.MAX_FDS + 1)]
    try:
        before = open_fds()
        socket.send_fds(a, [b"{}"], [r for r, _ in pipes])  # one more than fits: MSG_CTRUNC
        with pytest.raises(handover.HandoverError, match="too many descriptors"):
            handover.receive(b)
        assert open_fds() == before
    finally:
        for pipe in pipes:
            handover.close(pipe)


def test_a_name_server_descriptor_that_is_no_socket_leaves_the_channel_open() -> None:
    """The channel wrapped first and dropped on the refusal used to close its number: the
    caller's close was then a second, of whatever had the number by then."""
    child = subprocess.Popen(["sleep", "30"])
    pidfd = os.pidfd_open(child.pid)
    r, w = os.pipe()
    channel, other = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        before = open_fds()
        with pytest.raises(ValueError, match="not a socket"):
            carried.rebuild_slot(record(child.pid), [channel.fileno(), pidfd, w, r], CONFIG)
        assert open_fds() == before
        os.fstat(channel.fileno())  # still open: the caller's, to close once
    finally:
        child.kill()
        child.wait()
        for fd in (pidfd, r, w):
            os.close(fd)
        channel.close()
        other.close()


@pytest.mark.parametrize("group", [
    "/sys/fs/cgroup/../../etc/sealgate/run-3-1",  # lexically under the root, named like a run's
    "/sys/fs/cgroup/pids/sealgate/run-3-1/../../../system.slice",
    "/sys/fs/cgroup/pids/sealgate/run-3-1\x00",
    "/sys/fs/cgroup/pids/sealgate/run-3-" + "1" * 300,
    "/sys/fs/cgroup/a/b/sealgate/run-3-1",
])
def test_a_slot_whose_cgroups_lead_elsewhere_is_refused(group: str) -> None:
    child = subprocess.Popen(["sleep", "30"])
    pidfd = os.pidfd_open(child.pid)
    r, w = os.pipe()
    channel, other = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        with pytest.raises(ValueError, match="not its cgroups"):
            carried.rebuild_slot({**record(child.pid), "groups": [group]},
                                 [channel.fileno(), pidfd, w, dns.fileno()], CONFIG)
    finally:
        child.kill()
        child.wait()
        for fd in (pidfd, r, w):
            os.close(fd)
        for sock in (channel, other, dns):
            sock.close()


def test_the_ended_ids_handed_over_are_checked() -> None:
    assert carried.ended(None) == {}
    assert carried.ended({"sb-0123456789abcdef": "deleted"}) == {"sb-0123456789abcdef": "deleted"}
    for bad in ([], {"../x": "deleted"}, {"sb-0123456789abcdef": 1},
                {f"sb-{n:016x}": "x" for n in range(carried.ENDED_KEPT + 1)}):
        with pytest.raises(ValueError, match="ended sandboxes"):
            carried.ended(bad)


def test_a_held_process_is_waited_for_by_a_descriptor_past_1024() -> None:
    """A daemon of many sandboxes holds more than select's 1024 descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"descriptors limited to {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    child = subprocess.Popen(["sleep", "30"])
    pidfd = os.pidfd_open(child.pid)
    high = os.dup2(pidfd, 1500, inheritable=False)
    os.close(pidfd)
    try:
        held = carried.Held(child.pid, high)
        with pytest.raises(subprocess.TimeoutExpired):
            held.wait(0.05)
        held.kill()
        assert held.wait(5) == 0
    finally:
        child.kill()
        child.wait()
        with contextlib.suppress(OSError):
            os.close(high)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
