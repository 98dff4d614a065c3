"""An upgrade without losing work (`sealgate sandboxd --adopt`, `sandbox.daemon.handover`): a
successor takes over the live sandboxes of the daemon serving its socket, or refuses and the old
one serves on; a sandbox never outlives both.

Real daemons, a real proxy beside them, real sandboxes: each test checks what happened (the
file still there, the proxy's registry and audit, the processes of a sandbox's cgroups, the
leases on the host), not what a daemon says."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sealgate.sandbox.clients.client import DaemonError, Sandbox
from sealgate.sandbox.daemon import handover
from tests.harness import Origin, Proxy, free_port, quiet
from tests.integration.tiers import unavailable
from tests.sandboxd.conftest import Daemon
from tests.sandboxd.test_lifecycle import host, registered, until

pytestmark = pytest.mark.root

_FLAGS = ("--pool", "1", "--no-selftest")


def create(daemon: Daemon, sandbox: str = "ci-bot", **options: Any) -> Sandbox:
    return Sandbox.create(sandbox, daemon=str(daemon.socket), **options)


def refused(daemon: Daemon, seconds: float = 60) -> str:
    """A successor that must refuse: its exit status 2 and its words."""
    assert daemon.process.wait(seconds) == 2, daemon.log.read_text()
    return daemon.log.read_text()


def group_members(index: int) -> list[int]:
    """The processes in every cgroup of link `index`'s sandbox, whoever made them."""
    found = []
    root = Path("/sys/fs/cgroup")  # cgroup v2's one tree, or v1's hierarchy per controller
    for group in [*root.glob(f"sealgate/run-{index}-*"), *root.glob(f"*/sealgate/run-{index}-*")]:
        with contextlib.suppress(OSError):
            found += [int(p) for p in (group / "cgroup.procs").read_text().split()]
    return sorted(set(found))


def inheritable(pid: int) -> list[str]:
    """Descriptors of process `pid` past stdio without O_CLOEXEC, and what they are."""
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
            flags = int(info.split("flags:")[1].split()[0], 8)
            if int(fd) > 2 and not flags & os.O_CLOEXEC:
                found.append(f"{fd} -> {os.readlink(f'/proc/{pid}/fd/{fd}')}")
    return found


def index_of(sb: Sandbox) -> int:
    return int(sb.info["uid"]) - 3_100_000


def test_a_successor_takes_a_new_api_key(
    daemons: Callable[..., Daemon], tmp_path: Path
) -> None:
    """docs/runbooks.md, "Rotate sandboxd's API key", as written: a successor started with
    `--adopt --key-file NEW` takes the sandboxes and the TCP listener; from then on only the
    new key opens it, and the sandbox made under the old key runs on."""
    port = free_port()
    old_key, new_key = tmp_path / "old.key", tmp_path / "new.key"
    for path, key in ((old_key, "old-sandboxd-key-0123456789abcdef"),
                      (new_key, "new-sandboxd-key-fedcba9876543210")):
        path.write_text(key + "\n")
        path.chmod(0o600)
    url = f"http://127.0.0.1:{port}"
    old = daemons(*_FLAGS, "--listen", f"127.0.0.1:{port}", "--key-file", str(old_key))
    kept = Sandbox.create("ci-bot", daemon=url, key="old-sandboxd-key-0123456789abcdef")
    new = daemons(*_FLAGS, "--adopt", "--listen", f"127.0.0.1:{port}", "--key-file",
                  str(new_key), sock=old.socket)
    assert old.process.wait(30) == 0, old.log.read_text()
    with pytest.raises(DaemonError) as refused:
        Sandbox.connect(kept.id, daemon=url, key="old-sandboxd-key-0123456789abcdef")
    assert refused.value.reason == "unauthorized", refused.value
    again = Sandbox.connect(kept.id, daemon=url, key="new-sandboxd-key-fedcba9876543210")
    assert again.run(["echo", "still here"]).stdout == b"still here\n"
    again.delete()
    assert quiet(new.log.read_text())


def test_a_successor_takes_every_sandbox_over(
    daemons: Callable[..., Daemon], dproxy: Proxy, origin_https: Origin
) -> None:
    old = daemons(*_FLAGS)
    gone = create(old)
    gone.delete()
    kept = create(old, metadata={"team": "a"}, ttl=300)
    other = create(old, "other-bot", ttl=200, idle_timeout=100)
    kept.write("kept.txt", b"work in progress")
    assert kept.run(["sh", "-c", "echo 1 > /workspace/n"]).ok
    before = {s["id"]: s for s in old.client.list()}
    sources = registered(dproxy)
    assert sources[kept.info["address"]] == "ci-bot"

    new = daemons(*_FLAGS, "--adopt", sock=old.socket)
    assert old.process.wait(30) == 0, old.log.read_text()  # it exits, deleting nothing
    assert "handed every sandbox over" in old.log.read_text()
    after = {s["id"]: s for s in new.client.list()}
    assert set(after) == set(before) == {kept.id, other.id}
    # What ended on the old daemon is known to have ended (and its id never given again).
    with pytest.raises(DaemonError) as ended:
        gone.refresh()  # the same socket: the successor answers
    assert ended.value.reason == "sandbox_ended", ended.value
    # Every descriptor it holds, the handed ones included, closes at an exec: none reaches
    # a process it starts.
    leaked = inheritable(new.process.pid)
    assert not leaked, leaked
    for ident, was in before.items():
        now = after[ident]
        for key in ("sandbox", "address", "uid", "created", "metadata", "idle_timeout",
                    "commands", "limits", "image", "isolation"):
            assert now[key] == was[key], (key, now, was)
        # The same deadline: only the time since `before` has gone.
        assert was["expires_in"] - 30 <= now["expires_in"] <= was["expires_in"], (now, was)
    # The work is there, and the sandboxes serve.
    assert kept.read("kept.txt") == b"work in progress"
    assert kept.run(["sh", "-c", "cat /workspace/n"]).text == "1\n"
    assert other.run(["true"]).ok
    # Registered as before: the proxy attributes each one's egress to the same sandbox.
    assert registered(dproxy) == sources
    url = f"https://api.test:{origin_https.port}/after-adoption"
    got = kept.run(["curl", "-sS", "-m", "10", url])
    assert (got.exit_code, got.text) == (0, "hello from origin\n"), got.stderr
    line = dproxy.wait_audit(lambda e: e.get("event") == "request"
                             and e.get("path") == "/after-adoption")
    assert (line["sandbox"], line["decision"]) == ("ci-bot", "allow")
    # The leases are the successor's: a check of stale ones by anyone spares them.
    held = host()
    assert held.of(old.process.pid)["leases"] == 0
    assert held.of(new.process.pid)["leases"] == 3  # two sandboxes and the pool's slot
    assert held.orphans() == [], held.orphans()
    # And it ends them as its own at its stop.
    pid = new.process.pid
    assert new.stop() == 0
    assert host().of(pid) == host().of(-1)
    assert not {kept.info["address"], other.info["address"]} & set(registered(dproxy))


def test_a_refused_hand_over_leaves_the_old_daemon_serving(
    daemons: Callable[..., Daemon]
) -> None:
    old = daemons(*_FLAGS)
    sb = create(old)
    sb.write("f", b"x")
    # Another uid base: a sandbox's uid depends on it.
    words = refused(daemons(*_FLAGS, "--uid-base", "3200000", "--adopt", sock=old.socket,
                            wait=False))
    assert "uid_base: 3100000 here, 3200000 there" in words, words
    assert "serves on" in words and quiet(words), words
    # A background process running: named, and refused.
    started = sb.start(["sh", "-c", "sleep 60"])
    words = refused(daemons(*_FLAGS, "--adopt", sock=old.socket, wait=False))
    assert f"background processes are running in {sb.id} (pids {started.pid})" in words, words
    assert old.process.poll() is None
    assert old.client.health()["ready"]
    assert sb.read("f") == b"x" and sb.run(["true"]).ok
    started.kill()
    started.wait()
    # A start that cannot be (a pool of an image there is not) is refused before anything is
    # taken over: the sandboxes are still the old daemon's, never ended by the refusal.
    words = refused(daemons(*_FLAGS, "--pool", "no-such-image=1", "--adopt", sock=old.socket,
                            wait=False))
    assert "no-such-image" in words and quiet(words), words
    assert old.process.poll() is None
    assert sb.read("f") == b"x" and sb.run(["true"]).ok
    # No predecessor at all: --adopt says so; the default starts afresh.
    lonely = daemons(*_FLAGS, "--adopt", wait=False)
    assert "--adopt: no daemon serves" in refused(lonely)
    # --no-adopt will not take the socket from under a live daemon.
    words = refused(daemons(*_FLAGS, "--no-adopt", sock=old.socket, wait=False))
    assert f"daemon {old.process.pid} serves" in words, words
    assert sb.run(["true"]).ok
    # Once idle, the default adopts; and a third daemon from the second (the cgroups still
    # named for the first, their leases saying so), this one with its self-test on.
    new = daemons(*_FLAGS, sock=old.socket)
    assert old.process.wait(30) == 0
    assert sb.read("f") == b"x"
    assert [s["id"] for s in new.client.list()] == [sb.id]
    third = daemons("--pool", "1", sock=old.socket)
    assert new.process.wait(30) == 0, new.log.read_text()
    assert sb.read("f") == b"x" and sb.run(["true"]).ok
    until(lambda: third.client.health().get("ready"), 60, "the third daemon's self-test")
    state = host()
    held = state.of(third.process.pid)  # the adopted groups counted as the third's
    assert held["leases"] >= 2 and held["cgroups"] >= 3 * held["leases"], held
    assert state.orphans() == [], state.orphans()


def test_requests_under_way_end_before_the_hand_over(daemons: Callable[..., Daemon]) -> None:
    old = daemons(*_FLAGS)
    sb = create(old)
    # Under way until the test says (a line into a FIFO, from the host: the API is held),
    # so still under way when the hand-over begins, whatever the machine's speed.
    stream = sb.stream(["sh", "-c", "mkfifo /workspace/go; echo up; "
                                    "timeout 120 sh -c 'read x < /workspace/go'; echo done"])
    assert next(stream) == ("stdout", b"up\n")
    new = daemons(*_FLAGS, "--adopt", sock=old.socket, wait=False)

    # Meanwhile the old daemon takes no new request, and says why.
    def held() -> str | None:
        try:
            sb.refresh()
        except DaemonError as exc:
            return str(exc) if exc.status == 503 else None
        return None
    assert "handing its sandboxes over" in until(held, 10, "new requests refused")
    fifo = next(f for p in group_members(index_of(sb))
                if (f := Path(f"/proc/{p}/root/workspace/go")).exists())
    with open(fifo, "w") as go:  # the command's read ends: it runs to its end
        go.write("go\n")
    # The command under way ran to its end on the old daemon.
    rest = list(stream)
    assert rest[0] == ("stdout", b"done\n") and rest[1][0] == "exit", rest
    assert rest[1][1].exit_code == 0, rest  # type: ignore[union-attr]
    assert old.process.wait(30) == 0, old.log.read_text()
    until(lambda: bool(new.said("serving")), 30, "the successor serving")
    assert sb.run(["true"]).ok


def test_a_sandbox_never_outlives_both_daemons(
    daemons: Callable[..., Daemon], dproxy: Proxy
) -> None:
    old = daemons(*_FLAGS)
    sb = create(old)
    index = index_of(sb)
    assert sb.run(["sh", "-c", "sleep 600 & echo started"]).ok
    assert group_members(index)
    new = daemons(*_FLAGS, "--adopt", sock=old.socket)
    assert old.process.wait(30) == 0
    assert group_members(index), "the sandbox died with the daemon that started it"
    assert sb.run(["true"]).ok
    # The successor killed outright: its channel and watchdog pipe close with it, and the
    # sandbox goes (none of it is the old daemon's any more, nor anyone's).
    pid = new.process.pid
    new.process.kill()
    new.process.wait(10)
    until(lambda: not group_members(index), 5, "the sandbox's processes dead")
    # The next start cleans up what was left, as after any killed daemon.
    daemons(*_FLAGS)
    left = host()
    assert left.of(pid) == host().of(-1), left.of(pid)
    assert sb.info["address"] not in registered(dproxy)


def test_the_hand_over_socket_is_roots_and_speaks_only_its_protocol(
    daemons: Callable[..., Daemon], dproxy: Proxy
) -> None:
    old = daemons(*_FLAGS)
    sb = create(old)
    path = handover.path_for(dproxy.state, old.socket)
    mode = path.stat()
    assert stat.S_ISSOCK(mode.st_mode) and stat.S_IMODE(mode.st_mode) == 0o600
    assert mode.st_uid == 0 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700

    def answer(*packets: bytes, fds: list[int] | None = None) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
            conn.settimeout(10)
            conn.connect(str(path))
            for packet in packets:
                socket.send_fds(conn, [packet], fds or [])
            got: dict[str, Any] = json.loads(conn.recv(1 << 16))
            return got

    for packets in ([b"GET / HTTP/1.1\r\n\r\n"], [b"\xff" * 100], [b"[1, 2]"],
                    [b"[" * 50_000 + b"]" * 50_000],  # deeper than the parser's stack
                    [json.dumps({"sealgate": handover.MAGIC, "version": 99}).encode()],
                    [json.dumps({"sealgate": handover.MAGIC, "version": 1,
                                 "want": {"state": "/elsewhere"}}).encode()]):
        got = answer(*packets)
        assert set(got) == {"refused"}, got
    r, w = os.pipe()
    try:
        hello = json.dumps({"sealgate": handover.MAGIC, "version": 1}).encode()
        assert "not a hand-over hello" in answer(hello, fds=[r])["refused"]
    finally:
        os.close(r)
        os.close(w)
    # A silent peer is dropped after the hello's time; the daemon serves on meanwhile.
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
        conn.settimeout(handover.HELLO_SECONDS + 5)
        conn.connect(str(path))
        assert sb.run(["true"]).ok
        assert "no answer in time" in json.loads(conn.recv(1 << 16))["refused"]
    # Not root: kept out by the socket's mode, and (with CAP_DAC_OVERRIDE past the mode, as
    # nobody) refused by its credentials, before a word.
    script = ("import socket, sys; s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); "
              "s.settimeout(10); s.connect(sys.argv[1]); print(s.recv(4096).decode())")
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    done = subprocess.run([*nobody, "python3", "-c", script, str(path)], capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode != 0 and "Permission denied" in done.stderr, done
    past = ["--inh-caps=+dac_override", "--ambient-caps=+dac_override"]
    done = subprocess.run([*nobody, *past, "python3", "-c", script, str(path)],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done
    assert "is not root" in json.loads(done.stdout)["refused"], done
    assert old.process.poll() is None and sb.run(["true"]).ok
    assert old.said("handover_refused")
    # And it stops as ever: every sandbox deleted, nothing left, no traceback.
    pid = old.process.pid
    assert old.stop() == 0, old.log.read_text()
    assert quiet(old.log.read_text())
    assert host().of(pid) == host().of(-1)


@pytest.mark.parametrize("tier", ["gvisor", "microvm"])
def test_a_tier_that_cannot_change_daemons_is_refused(
    daemons: Callable[..., Daemon], tier: str
) -> None:
    if (problem := unavailable(tier)) is not None:
        pytest.skip(problem)
    old = daemons("--pool", "0", "--no-selftest", "--isolation", tier)
    words = refused(daemons("--pool", "0", "--no-selftest", "--isolation", tier, "--adopt",
                            sock=old.socket, wait=False))
    assert f"the {tier} tier's sandboxes cannot change daemons" in words, words
    assert old.process.poll() is None and old.client.health()["ready"]


def test_handing_over_fifty_idle_sandboxes(
    daemons: Callable[..., Daemon], capsys: pytest.CaptureFixture[str]
) -> None:
    count = 50
    old = daemons("--pool", "4", "--no-selftest")
    boxes = [create(old, metadata={"n": str(n)}) for n in range(count)]
    started = time.monotonic()
    new = daemons("--pool", "4", "--no-selftest", "--adopt", sock=old.socket, wait=False)
    assert old.process.wait(30) == 0
    until(lambda: bool(new.said("serving")), 30, "the successor serving")
    ready = time.monotonic() - started
    (serving,) = new.said("serving")
    assert serving["took_over_slots"] >= count, serving
    handed = old.said("handed_over")
    assert len(handed) == 1
    assert {s["id"] for s in new.client.list()} == {sb.id for sb in boxes}
    assert all(sb.run(["true"]).ok for sb in boxes[:: count // 5])
    with capsys.disabled():
        print(f"\nhand-over of {count} idle sandboxes (+ pool): successor's exchange "
              f"{serving['ms']} ms, old daemon held {handed[0]['ms']} ms, successor ready after "
              f"{ready * 1000:.0f} ms (its Python's start included)")
    with contextlib.suppress(DaemonError):
        for sb in boxes:
            sb.delete()
