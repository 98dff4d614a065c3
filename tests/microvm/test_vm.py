"""A microVM booted as the tier boots it (no network here: `test_tier` has that), driven over
its agent's channel: commands, exit statuses, input, timeouts, files, its own kernel, and the
warm pool."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sealgate.sandbox.tiers.microvm import pool
from sealgate.sandbox.tiers.microvm.channel import Channel, GuestResult
from tests.microvm.kit import ACCEL, ENV, NOBODY, needs_vm, run, spec

pytestmark = [pytest.mark.root, needs_vm]


def test_commands_and_their_exit_statuses(guest: Channel) -> None:
    expected = GuestResult(3, b"out\n", b"err\n")
    assert run(guest, "sh", "-c", "echo out; echo err >&2; exit 3") == expected
    assert run(guest, "sh", "-c", "kill -9 $$").code == 128 + 9
    missing = run(guest, "no-such-command")
    assert missing.code == 127 and b"no-such-command" in missing.stderr
    assert run(guest, "cat", stdin=b"to the guest\n").stdout == b"to the guest\n"


def test_the_command_is_unprivileged_with_only_its_environment(guest: Channel) -> None:
    probe = ("import os; status = open('/proc/self/status').read();"
             "print(os.getuid(), os.getgid(), os.getgroups(), sorted(os.environ),"
             " status.split('CapEff:')[1].split()[0])")
    done = run(guest, "python3", "-c", probe)
    assert done.code == 0, done
    assert done.stdout.decode() == \
        "65534 65534 [] ['HOME', 'LANG', 'PATH'] 0000000000000000\n"
    # The host's system is there read-only; the guest's own root is writable by root only.
    assert run(guest, "touch", "/usr/bin/x").code != 0
    assert run(guest, "touch", "/etc/x").code != 0
    assert run(guest, "touch", "/tmp/x").code == 0


def test_a_timeout_kills_the_command_and_what_it_started(guest: Channel) -> None:
    started = time.monotonic()
    done = guest.run(["sh", "-c", "sleep 60 & sleep 60"], ENV, uid=NOBODY, gid=NOBODY, timeout=1)
    assert done.code == 124
    assert time.monotonic() - started < 10
    # Nothing of it is left: the next command finds no sleep of the sandbox's user.
    assert b"sleep" not in run(guest, "ps", "-o", "user,comm", "-u", str(NOBODY)).stdout


def test_its_own_kernel_and_no_host_proc(guest: Channel) -> None:
    uname = run(guest, "uname", "-r").stdout.decode().strip()
    assert uname == guest.kernel and uname != os.uname().release
    assert b"Debian" in run(guest, "cat", "/proc/version").stdout
    # The host's boot line and processes are not the guest's: its /proc is its own kernel's,
    # and its boot line reads empty.
    assert run(guest, "cat", "/proc/cmdline").stdout == b""
    assert run(guest, "cat", "/proc/sys/kernel/hostname").stdout == b"sandbox\n"
    pids = run(guest, "sh", "-c", "ls /proc | grep -c '^[0-9]'").stdout
    assert int(pids) < 100
    assert run(guest, "test", "-e", f"/proc/{os.getpid()}/cwd").code != 0


def test_files_put_and_got(guest: Channel) -> None:
    guest.put("/run/sealgate/ca.pem", b"-----BEGIN CERTIFICATE-----\n", mode=0o644)
    assert guest.get("/run/sealgate/ca.pem") == b"-----BEGIN CERTIFICATE-----\n"
    assert run(guest, "cat", "/run/sealgate/ca.pem").stdout.startswith(b"-----BEGIN")


def test_the_workspace_is_shared_read_write(guest: Channel, workspace: Path) -> None:
    assert run(guest, "cat", "/workspace/from-host.txt").stdout == b"made on the host\n"
    assert run(guest, "sh", "-c", "echo from the guest > /workspace/out.txt").code == 0
    assert (workspace / "out.txt").read_text() == "from the guest\n"
    assert (workspace / "out.txt").stat().st_uid == NOBODY


def test_a_fork_bomb_stops_at_the_process_limit(guest: Channel) -> None:
    bomb = ("import os, time\nn = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n"
            "    except BlockingIOError:\n        break\n    if pid == 0:\n        time.sleep(30)\n"
            "        os._exit(0)\n    n += 1\nprint(n)\n")
    done = run(guest, "python3", "-c", bomb, pids=16)
    assert done.code == 0, done
    assert 0 < int(done.stdout) < 16


def test_the_warm_pool_hands_out_booted_vms_once() -> None:
    warm = pool.Pool(spec, size=1)
    try:
        first = warm.take()
        try:
            started = time.monotonic()
            assert first.channel.run(["true"], ENV, uid=NOBODY, gid=NOBODY).code == 0
            # No boot on this path, emulated or not: a command's round trip.
            assert time.monotonic() - started < (0.5 if ACCEL == "kvm" else 2.0)
        finally:
            first.close()
        second = warm.take()
        assert second.machine is not first.machine
        second.close()
    finally:
        warm.close()
