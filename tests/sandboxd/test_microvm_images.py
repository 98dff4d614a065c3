"""Sandboxes from images on the microVM tier (#24): the image as a read-only erofs disk, the
root made of it in the guest (`sandbox/guest/vmroot.py`). The images and their store are
test_images.py's (the hostile image among them); the daemon is real, on the microVM tier, under
emulation where KVM cannot run the guest. Guests boot in seconds there: one test, few VMs."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sealgate.reasons import Reason
from sealgate.sandbox.clients.aclient import AsyncSandbox
from sealgate.sandbox.clients.client import Sandbox
from sealgate.sandbox.clients.clientshared import DaemonError
from tests.harness import SEALGATE, Origin, Proxy
from tests.integration import tiers as tier_env

from .conftest import Daemon, start_daemon
from .test_images import _FETCH, _tree, make_store


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if (problem := tier_env.unavailable("microvm")) is not None:
        pytest.skip(f"isolation microvm: {problem}")
    return make_store(tmp_path_factory)


@pytest.fixture(scope="module")
def microvm_imaged(dproxy: Proxy, store: Path, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Daemon]:
    daemon = start_daemon(dproxy, tmp_path_factory.mktemp("sandboxd-microvm-images"), "--pool",
                          "0", "--pool", "debian=1", "--images", str(store), "--isolation",
                          "microvm", "--no-selftest", ready=240)
    yield daemon
    daemon.stop()


_TICKING = ("i=0; while :; do i=$((i+1)); echo $i > /0tick.n; mv /0tick.n /0tick; "
            "echo $i > /workspace/tick.n; mv /workspace/tick.n /workspace/tick; done")


def _vm(daemon: Daemon, image: str, **limits: int) -> Sandbox:
    """A sandbox on a VM of the image's warm pool (debian: one booted ahead, one refilled
    behind each create) or booted for it (hostile), under emulation here."""
    return Sandbox.create("ci-bot", image=image, daemon=str(daemon.socket), call_timeout=240,
                          limits=limits or None)


def test_an_image_on_the_microvm(microvm_imaged: Daemon, store: Path,
                                 origin_https: Origin) -> None:
    """The same images in microVMs: the image as an erofs disk, its root an overlay in the
    guest's memory that its commands (the guest's root) may change and that is gone with it,
    ours laid over the image's links, and the network boundary unchanged. Four VMs: two of
    debian's pool, its refill, and one booted for the hostile image."""
    layers_before = _tree(store / "layers")
    url = f"https://api.test:{origin_https.port}"
    origin_https.reset()
    assert microvm_imaged.client.health()["pool"] == 1  # debian's VM, booted with its disk
    with _vm(microvm_imaged, "debian") as sb:
        assert sb.info["isolation"] == "microvm"
        assert sb.run(["cat", "/etc/sealgate-test-image"]).stdout == b"debian-test\n"
        python = sb.run(["python3", "-c", "import os, sys; print(sys.executable, os.getuid(), "
                                          "os.uname().release)"])
        executable, uid, release = python.stdout.decode().split()
        assert (executable, uid) == ("/usr/bin/python3", "0"), python
        assert release != os.uname().release  # the guest's kernel, not the host's
        # Neither the host's programs nor the guest's own root (the agent's /usr) show.
        for host_only in ("/usr/bin/qemu-system-x86_64", "/usr/bin/bwrap", "/sealgate",
                          "/run/sealgate/host", "/dev/vda"):
            assert not sb.run(["test", "-e", host_only]).ok, host_only
        # Nothing of the host's is shared into an image's guest over 9p (which would stop QEMU
        # saving it): its agent runs on the standalone initramfs's Python, its workspace is a
        # tmpfs of its own.
        imaged = [argv for argv in _qemus() if "virtio-blk-device,drive=image" in argv]
        assert imaged and all("virtio-9p-device" not in " ".join(argv) for argv in imaged)
        assert sb.run(["stat", "-f", "-c", "%T", "/workspace"]).stdout == b"tmpfs\n"
        # The root is its own to change; the workspace is the slot's, through put and get.
        assert sb.run(["sh", "-c", "echo planted > /usr/bin/planted"]).ok
        sb.write("hello.py", b"print('hello from the workspace')\n")
        ran = sb.run(["sh", "-c", "python3 /workspace/hello.py > /workspace/out.txt"])
        assert ran.ok, ran.text
        assert sb.read("out.txt") == b"hello from the workspace\n"
        assert sb.run(["pwd"], cwd="/etc").stdout == b"/etc\n"
        lost = sb.run(["true"], cwd="/no/such/place")
        assert lost.exit_code == 127 and b"cannot enter '/no/such/place'" in lost.stderr, lost
        resolv = sb.run(["cat", "/etc/resolv.conf"]).stdout
        assert resolv.startswith(b"nameserver 10.216."), resolv
        got = sb.run(["python3", "-c", _FETCH, f"{url}/from-microvm-image"], timeout=120)
        assert (got.exit_code, got.stdout) == (0, b"hello from origin\n"), got.stderr
        refused = sb.run(["python3", "-c", _FETCH, f"https://other.test:{origin_https.port}/x"],
                         timeout=120)
        assert refused.exit_code != 0 and b"403" in refused.stderr, refused
        # A snapshot: the guest copies its root's writes (a deletion too) and the workspace,
        # its commands frozen meanwhile; a command running across it runs on after.
        assert sb.run(["rm", "/etc/sealgate-test-image"]).ok
        long = sb.start(["sh", "-c", "sleep 2; echo survived > /workspace/after"])
        # One instant: a counter written to the root (copied first) and then the workspace
        # (copied last, after 24 MiB of the root) differs there by at most the one step
        # the freeze may split; a copy of a running loop would see it far ahead.
        assert sb.run(["sh", "-c", "head -c 25165824 /dev/urandom > /usr/big"]).ok
        ticking = sb.start(["sh", "-c", _TICKING])
        assert sb.run(["sh", "-c", "until test -e /workspace/tick; do sleep 0.1; done"],
                      timeout=60).ok
        made = sb.snapshot("snap-microvm")
        assert made["owner"] == "ci-bot" and made["parent"] == "debian", made
        ticking.kill()
        assert long.wait(call_timeout=120).ok
        assert sb.read("after") == b"survived\n"
    assert [r.path for r in origin_https.requests] == ["/from-microvm-image"]
    with _vm(microvm_imaged, "snap-microvm") as copy:
        assert copy.run(["cat", "/usr/bin/planted"]).stdout == b"planted\n"
        assert copy.read("out.txt") == b"hello from the workspace\n"
        assert not copy.run(["test", "-e", "/etc/sealgate-test-image"]).ok
        assert copy.run(["test", "-e", "/etc/passwd"]).ok
        root_tick = int(copy.run(["cat", "/0tick"]).stdout)
        workspace_tick = int(copy.read("tick"))
        assert 0 <= root_tick - workspace_tick <= 1, (root_tick, workspace_tick)
    with _vm(microvm_imaged, "debian") as again:
        assert not again.run(["test", "-e", "/usr/bin/planted"]).ok
        assert again.run(["test", "-e", "/etc/sealgate-test-image"]).ok
    with _vm(microvm_imaged, "hostile", pids=12) as hostile:
        env = dict(line.split("=", 1) for line in hostile.run(["sh", "-c", "set"]).text
                   .splitlines() if "=" in line and not line.startswith(" "))
        assert "192.0.2.66" not in env.get("HTTPS_PROXY", ""), env
        assert env.get("SSL_CERT_FILE", "").strip("'") != "/etc/evil.pem", env
        resolv = hostile.run(["cat", "/etc/resolv.conf"]).stdout
        assert resolv.startswith(b"nameserver 10.216.") and b"192.0.2.53" not in resolv
        assert b"192.0.2.1" not in hostile.run(["cat", "/etc/hosts"]).stdout
        bundle = hostile.run(["cat", "/etc/ssl/certs/ca-certificates.crt"])
        assert bundle.ok and b"BEGIN CERTIFICATE" in bundle.stdout, bundle
        assert hostile.run(["readlink", "/tmp"]).stdout == b""  # a directory of its own now
        assert hostile.run(["readlink", "/etc/ssl/certs"]).stdout == b""
        assert hostile.run(["stat", "-c", "%a %u", "/bin/suid-sh"]).stdout == b"755 0\n"
        # The guest's root is not held to RLIMIT_NPROC: its command's cgroup holds it.
        spawn = "for i in $(busybox seq {}); do busybox sleep 1 & done; wait; echo done"
        few = hostile.run(["sh", "-c", spawn.format(6)], timeout=60)
        assert few.stdout == b"done\n", few
        many = hostile.run(["sh", "-c", spawn.format(20)], timeout=60)
        assert many.exit_code != 0 and b"can't fork" in many.stderr, many
    after = _tree(store / "layers")
    assert {path: after.get(path) for path in layers_before} == layers_before
    # One disk per image (debian, hostile, the snapshot), built once, kept in the store.
    assert len(list((store / "disks").glob("*.erofs"))) == 3


def test_the_images_user_on_the_microvm(microvm_imaged: Daemon) -> None:
    """On the microVM the image's User (a name in its passwd) is who its commands and its
    file operations are, with its group and home, as `docker run` has it: the image's files
    stay root's (its disk keeps no owner of the image's), its home and the workspace are the
    User's. (On the other tiers the whole root is the User's: test_images.) A User the image
    cannot name refuses the create, saying why."""
    with _vm(microvm_imaged, "tester") as sb:
        ids = sb.run(["sh", "-c", "id -u; id -g; id -un; echo $HOME"])
        assert ids.stdout == b"1234\n1235\ntester\n/home/tester\n", ids
        sb.write("put.txt", b"from the caller\n")
        owned = sb.run(["sh", "-c", "echo ok > /home/tester/f && echo ws > /workspace/w && "
                                    "stat -c '%u %g' /home/tester /home/tester/f /workspace "
                                    "/workspace/w /workspace/put.txt /bin/busybox"])
        assert owned.stdout == b"1234 1235\n" * 5 + b"0 0\n", owned
        assert not sb.run(["sh", "-c", "echo no > /bin/mine"]).ok  # the image's are root's
        assert sb.read("w") == b"ws\n"
    with pytest.raises(DaemonError) as refused:
        _vm(microvm_imaged, "ghost")
    assert refused.value.reason is Reason.IMAGE_REFUSED, refused.value
    assert "'ghost': no such user in its /etc/passwd" in str(refused.value)


def test_a_microvm_forks(microvm_imaged: Daemon, origin_https: Origin) -> None:
    """fork(n): copies resumed from one memory snapshot of a running sandbox from an image.
    Each has what the source had in memory (its root's and workspace's writes, a process it
    left running) and is its own: its own id and address, which the proxy knows as its
    policy's (its request reaches the origin), its own randomness (the guest's generator
    reseeded: what it reads from /dev/urandom at once differs), machine-id and name server.
    The source runs on; a copy's writes are its own."""
    url = f"https://api.test:{origin_https.port}"
    origin_https.reset()
    with _vm(microvm_imaged, "debian") as sb:
        assert sb.run(["sh", "-c", "echo kept > /etc/forked && echo ws > /workspace/w"]).ok
        sleeper = sb.start(["sh", "-c", "echo $$ > /tmp/sleeper; exec sleep 1000"])
        assert sb.run(["sh", "-c", "until test -s /tmp/sleeper; do sleep 0.1; done"],
                      timeout=60).ok
        copies = sb.fork(2, call_timeout=240)
        try:
            assert len(copies) == 2 and len({sb.id, *(c.id for c in copies)}) == 3
            # At once, before anything else reads it: a copy not reseeded reads the
            # source's generator's next bytes, the same in both.
            drawn = [c.run(["head", "-c", "16", "/dev/urandom"]).stdout for c in copies]
            assert drawn[0] != drawn[1] and all(len(d) == 16 for d in drawn), drawn
            ids = [c.run(["cat", "/etc/machine-id"]).stdout for c in (sb, *copies)]
            names = [c.run(["cat", "/etc/resolv.conf"]).stdout for c in (sb, *copies)]
            assert len(set(ids)) == 3 and len(set(names)) == 3, (ids, names)
            for n, copy in enumerate(copies):
                assert copy.run(["cat", "/etc/forked"]).stdout == b"kept\n"
                assert copy.read("w") == b"ws\n"
                alive = copy.run(["sh", "-c", "kill -0 $(cat /tmp/sleeper)"])
                assert alive.ok, alive  # the source's process, running on in the copy
                got = copy.run(["python3", "-c", _FETCH, f"{url}/from-copy-{n}"], timeout=120)
                assert (got.exit_code, got.stdout) == (0, b"hello from origin\n"), got.stderr
            assert copies[0].run(["sh", "-c", "echo mine > /workspace/w"]).ok
            assert copies[1].read("w") == b"ws\n" and sb.read("w") == b"ws\n"
        finally:
            for copy in copies:
                copy.delete()
        got = sb.run(["python3", "-c", _FETCH, f"{url}/from-source"], timeout=120)
        assert got.exit_code == 0, got.stderr
        assert asyncio.run(_fork_async(microvm_imaged, sb.id)) == b"kept\n"
        # And the CLI's: the copy's id on a line of its own.
        done = subprocess.run([*SEALGATE, "sandbox", "fork", sb.id, "-n", "1", "--daemon",
                               str(microvm_imaged.socket), "--call-timeout", "240"],
                              capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr
        with Sandbox.connect(done.stdout.strip(), daemon=str(microvm_imaged.socket)) as copy:
            assert copy.run(["cat", "/etc/forked"]).stdout == b"kept\n"
        sleeper.kill()
    assert sorted(r.path for r in origin_https.requests) == [
        "/from-copy-0", "/from-copy-1", "/from-source"]


# What a compromised guest runs as its copier: a layer stream of the members given (JSON),
# said to be whole ("done"), with its end-of-archive or without.
_HOSTILE_COPIER = """
import io, json, os, tarfile
def layer(_, fds):
    data, status = fds
    os.write(status, json.dumps({"ok": True}).encode() + b"\\n")
    members, whole = json.loads(%r)
    out = os.fdopen(data, "wb", closefd=False)
    tar = tarfile.open(fileobj=out, mode="w|")
    for fields in members:
        info = tarfile.TarInfo(fields.pop("name"))
        for key, value in fields.items():
            setattr(info, key, value.encode() if key == "type" else value)
        body = b"pwned" if info.isreg() else b""
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body) if body else None)
    if whole:
        tar.close()
    else:
        tar.fileobj.flush()
    out.flush()
    os.write(status, json.dumps({"done": True}).encode() + b"\\n")
"""
# Each as a stream of its own, and what the host says refusing it.
_HOSTILE_STREAMS = {
    "a '..' component": [{"name": "../../../../../../../../tmp/escape-{t}"}],
    "absolute": [{"name": "/tmp/absolute-{t}"}],
    "symlink": [{"name": "link", "type": "2", "linkname": "/tmp"},
                {"name": "link/through-{t}"}],
    "hard link": [{"name": "hard-{t}", "type": "1", "linkname": "/etc/passwd"}],
    "device": [{"name": "dev-{t}", "type": "3", "devmajor": 1, "devminor": 1}],
    "cut": [{"name": "cut-{t}"}],
}


def test_a_compromised_guests_snapshot_stream_is_refused(microvm_imaged: Daemon, store: Path,
                                                         tmp_path: Path) -> None:
    """The guest is the sandbox's: its commands are its root and can reach the agent's own
    root (/proc/1/root), so a compromised one can replace the copier the agent runs for a
    snapshot. Its stream is then an attacker's tar, and the host unpacks it as any untrusted
    layer: each hostile kind refused, nothing written outside the store's staging, no layer
    added, the sandbox running on."""
    token = secrets.token_hex(6)
    layers_before = _tree(store / "layers")
    said = {}
    with _vm(microvm_imaged, "debian") as sb:
        for kind, members in _HOSTILE_STREAMS.items():
            stream = json.dumps([[{k: v.replace("{t}", token) if isinstance(v, str) else v
                                   for k, v in m.items()} for m in members], kind != "cut"])
            swap = sb.run(["python3", "-c", _SWAP, _HOSTILE_COPIER % stream])
            assert swap.ok, swap.stderr.decode()  # the guest's own root is the sandbox's
            with pytest.raises(DaemonError) as refused:
                sb.snapshot(f"hostile-{token}")
            said[kind] = str(refused.value)
            assert refused.value.reason is Reason.SANDBOX_FAILED, said
        assert sb.run(["true"]).ok  # the sandbox (and the daemon) run on
    for kind, words in said.items():
        expected = {"absolute": "an absolute name", "hard link": "hard link: member",
                    "device": "a device node", "cut": "cut short",
                    "symlink": "through the symlink"}.get(kind, kind)
        assert expected in words.lower(), (kind, words)
    for where in (Path("/tmp"), Path("/"), Path("/etc"), store, tmp_path):
        assert not list(where.glob(f"*{token}*")), where
    assert _tree(store / "layers") == layers_before


# Run in the sandbox as the guest's root: the agent's root made writable again (it seals it
# read-only) and its copier replaced.
_SWAP = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
for flags in (32, 32 | 1 << 12):  # MS_REMOUNT: its filesystem, then its mount, writable
    libc.mount(b"none", b"/proc/1/root", None, flags, None)
open("/proc/1/root/sealgate/guest/tarout.py", "w").write(sys.argv[1])
"""


async def _fork_async(daemon: Daemon, ident: str) -> bytes:
    """The async client's fork: one copy, with a client of its own, deleted after."""
    source = await AsyncSandbox.connect(ident, daemon=str(daemon.socket))
    try:
        (copy,) = await source.fork(1, call_timeout=240)
    finally:
        await source.close()
    async with copy:
        return (await copy.run(["cat", "/etc/forked"])).stdout


def _qemus() -> list[list[str]]:
    """The command lines of the host's QEMU processes."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # gone meanwhile, or not a process
            continue
        if any(arg.endswith("qemu-system-x86_64") for arg in argv[:12]):
            found.append(argv)
    return found
