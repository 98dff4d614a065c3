"""Sandboxes whose root is an image (#24): the image's own files, a root the sandbox may change
and that is gone with it, layers shared between sandboxes, snapshots, pause and resume.

The images are built here from Debian's packages (`scripts/test-images`, cached under var/) and
imported into a store of the test's own by the real `sealgate image import`; the daemon is real,
on the bubblewrap tier."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import io
import json
import os
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sealgate.reasons import Reason
from sealgate.sandbox import tiers
from sealgate.sandbox.clients.aclient import AsyncSandbox
from sealgate.sandbox.clients.client import DaemonError, Sandbox
from tests import images, ocikit
from tests.harness import Origin, Proxy, quiet

from .conftest import PLAN, UID_BASE, Daemon, sealgate, start_daemon


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_store(tmp_path_factory)


def make_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of the test images: busybox, debian and `_hostile`'s."""
    where = tmp_path_factory.mktemp("image-store") / "images"
    for name, layout in (("busybox", images.busybox_layout()), ("debian", images.debian_layout())):
        done = sealgate("image", "import", str(layout), "--name", name, "--store", str(where),
                        timeout=600)
        assert done.returncode == 0, done.stderr
    hostile = _hostile(tmp_path_factory.mktemp("hostile-image"))
    done = sealgate("image", "import", str(hostile), "--name", "hostile", "--store", str(where))
    assert done.returncode == 0, done.stderr
    for name, user in (("tester", "tester"), ("ghost", "ghost")):
        layout = _with_user(tmp_path_factory.mktemp(f"{name}-image"), user)
        done = sealgate("image", "import", str(layout), "--name", name, "--store", str(where))
        assert done.returncode == 0, done.stderr
    return where


def _with_user(where: Path, user: str) -> Path:
    """busybox with a passwd naming `tester` (1234, group 1235 `testers`) and the User given."""
    members = [ocikit.file("bin/busybox", images.busybox_program(), 0o755),
               *(ocikit.symlink(f"bin/{name}", "busybox") for name in (*_APPLETS, "sleep")),
               ocikit.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"
                                         b"tester:x:1234:1235::/home/tester:/bin/sh\n"),
               ocikit.file("etc/group", b"root:x:0:\ntesters:x:1235:\n"),
               ocikit.directory("home"), ocikit.directory("home/tester", uid=1234, gid=1235)]
    ocikit.write(where, [ocikit.layer(members)], env=["PATH=/bin"], user=user)
    return where


_APPLETS = ("sh", "cat", "stat", "test", "ls", "wc", "readlink", "id")


def _hostile(where: Path) -> Path:
    """An image that tries what an image can to reach past its sandbox: its own name server,
    trust store and /tmp (links out), a setuid shell, the proxy variables and an LD_PRELOAD in
    its Env. Each is a layer member our unpacker takes (the ones it refuses are
    tests/unit/test_image_unpack.py's)."""
    busybox = images.busybox_program()
    members = [ocikit.file("bin/busybox", busybox, 0o755),
               *(ocikit.symlink(f"bin/{name}", "busybox") for name in _APPLETS),
               ocikit.file("bin/suid-sh", busybox, 0o4755, uid=0, gid=0),
               ocikit.file("etc/resolv.conf", b"nameserver 192.0.2.53\n"),
               ocikit.directory("etc/ssl"),
               ocikit.symlink("etc/ssl/certs", "/proc/self"),
               ocikit.symlink("tmp", "/etc"),
               ocikit.file("etc/hosts", b"192.0.2.1 api.test\n")]
    ocikit.write(where, [ocikit.layer(members)],
                 env=["PATH=/bin", "LD_PRELOAD=/nonexistent/evil.so",
                      "HTTPS_PROXY=http://192.0.2.66:3128", "SSL_CERT_FILE=/etc/evil.pem"])
    return where


@pytest.fixture(scope="module")
def imaged(dproxy: Proxy, store: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Daemon]:
    daemon = start_daemon(dproxy, tmp_path_factory.mktemp("sandboxd-images"), "--pool", "0",
                          "--pool", "busybox=2", "--images", str(store), "--no-selftest",
                          ready=60)
    yield daemon
    daemon.stop()


def _create(daemon: Daemon, image: str, sandbox: str = "ci-bot") -> Sandbox:
    return Sandbox.create(sandbox, image=image, daemon=str(daemon.socket), call_timeout=60)


def test_a_sandbox_runs_its_images_files_not_the_hosts(imaged: Daemon) -> None:
    with _create(imaged, "debian") as sb:
        marker = sb.run(["cat", "/etc/sealgate-test-image"])
        assert marker.ok and marker.stdout == b"debian-test\n", marker
        # The host's own programs are not there: its /usr is not the sandbox's.
        for host_only in ("/usr/bin/bwrap", "/usr/bin/runsc", "/usr/bin/qemu-system-x86_64"):
            assert os.path.exists(host_only) or host_only.endswith("qemu-system-x86_64")
            assert not sb.run(["test", "-e", host_only]).ok, host_only
        python = sb.run(["python3", "-c", "import sys, os; print(sys.executable, os.getuid())"])
        assert python.ok and python.stdout == b"/usr/bin/python3 0\n", python
        # The agent runs the host's Python from a place each command sees empty.
        assert sb.run(["sh", "-c", "ls -A /run/sealgate/host | wc -l"]).stdout == b"0\n"
        # The trust store and name server are ours over the image's.
        resolv = sb.run(["cat", "/etc/resolv.conf"]).stdout
        assert resolv.startswith(b"nameserver 10.216."), resolv
        assert sb.info["image"] == "debian"


def _wheel() -> bytes:
    """A wheel of one module, built here: pip installs it with no index and no build step."""
    files = {"sgdemo.py": b"ANSWER = 42\n",
             "sgdemo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: sgdemo\n"
                                              b"Version: 1.0\n",
             "sgdemo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
                                           b"Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},sha256={_digest(data)},{len(data)}\n" for name, data in files.items())
    files["sgdemo-1.0.dist-info/RECORD"] = (record + "sgdemo-1.0.dist-info/RECORD,,\n").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
    return out.getvalue()


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_installs_into_the_root_work_and_are_gone_after_delete(imaged: Daemon,
                                                                store: Path) -> None:
    layers_before = _tree(store / "layers")
    with _create(imaged, "debian") as sb:
        sb.write("sgdemo-1.0-py3-none-any.whl", _wheel())
        pip = sb.run(["python3", "-m", "pip", "install", "--no-index", "--no-cache-dir",
                      "/workspace/sgdemo-1.0-py3-none-any.whl"], timeout=120)
        assert pip.ok, pip.text
        used = sb.run(["python3", "-c", "import sgdemo, sys; print(sgdemo.ANSWER, "
                       "sgdemo.__file__.startswith('/usr/local/'))"])
        assert used.stdout == b"42 True\n", used
        assert sb.run(["sh", "-c", "echo planted > /usr/bin/planted"]).ok
    with _create(imaged, "debian") as again:
        assert not again.run(["python3", "-c", "import sgdemo"]).ok
        assert not again.run(["test", "-e", "/usr/bin/planted"]).ok
    # The layers on the host never changed: what a sandbox writes is its own.
    assert _tree(store / "layers") == layers_before


def _tree(root: Path) -> dict[str, tuple[int, int, int]]:
    return {str(p.relative_to(root)): (p.lstat().st_mode, p.lstat().st_size, p.lstat().st_uid)
            for p in root.rglob("*")}


def test_sandboxes_of_an_image_share_its_layers_not_their_writes(imaged: Daemon,
                                                                 store: Path) -> None:
    on_disk = {p.lstat().st_ino for p in (store / "layers").rglob("busybox") if p.is_file()}
    assert on_disk
    with _create(imaged, "busybox") as one, _create(imaged, "busybox") as two:
        seen = [int(sb.run(["stat", "-c", "%i", "/bin/busybox"]).stdout) for sb in (one, two)]
        # The same file: one copy on disk and in the page cache for both.
        assert seen[0] == seen[1] and seen[0] in on_disk, (seen, on_disk)
        assert one.run(["sh", "-c", "echo one > /etc/mine"]).ok
        assert not two.run(["test", "-e", "/etc/mine"]).ok
        assert one.info["uid"] != two.info["uid"]


def test_a_warm_image_pool_serves_creates(imaged: Daemon) -> None:
    deadline = time.monotonic() + 30  # refilled behind the tests before
    while imaged.client.health()["pool"] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert imaged.client.health()["pool"] >= 2
    started = time.monotonic()
    with _create(imaged, "busybox") as sb:
        took = time.monotonic() - started
        assert sb.run(["true"]).ok
    assert took < 5, took  # a warm slot; the figure itself is bench/'s


def test_a_hostile_image_gains_nothing(imaged: Daemon) -> None:
    with _create(imaged, "hostile") as sb:  # its agent started: the LD_PRELOAD is not its
        env = dict(line.split("=", 1) for line in sb.run(["sh", "-c", "set"]).text.splitlines()
                   if "=" in line and not line.startswith(" "))
        assert "192.0.2.66" not in env.get("HTTPS_PROXY", ""), env
        assert env.get("SSL_CERT_FILE", "").strip("'") != "/etc/evil.pem", env
        resolv = sb.run(["cat", "/etc/resolv.conf"]).stdout
        assert resolv.startswith(b"nameserver 10.216.") and b"192.0.2.53" not in resolv
        assert b"192.0.2.1" not in sb.run(["cat", "/etc/hosts"]).stdout
        bundle = sb.run(["cat", "/etc/ssl/certs/ca-certificates.crt"])
        assert bundle.ok and b"BEGIN CERTIFICATE" in bundle.stdout, bundle
        assert sb.run(["readlink", "/tmp"]).stdout == b""  # a directory of its own now
        # Its User (1000) owns its whole root, the setuid bit dropped.
        assert sb.run(["stat", "-c", "%a %u", "/bin/suid-sh"]).stdout == b"755 1000\n"


_FETCH = """
import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode(), end="")
"""


_DIRECT = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5) as c:
        c.sendall(b"GET /direct HTTP/1.1\\r\\nHost: api.test\\r\\nConnection: close\\r\\n\\r\\n")
        print(c.recv(65536).decode(errors="replace"))
except OSError as exc:
    print("refused:", exc)
"""


def test_the_network_boundary_is_the_same_under_an_image(imaged: Daemon,
                                                         origin_https: Origin) -> None:
    """The image's own Python, with its own trust store laid over by ours, reaches what the
    policy allows through the proxy, and nothing else."""
    url = f"https://api.test:{origin_https.port}"
    origin_https.reset()
    with _create(imaged, "debian") as sb:
        got = sb.run(["python3", "-c", _FETCH, f"{url}/from-image"])
        assert (got.exit_code, got.stdout) == (0, b"hello from origin\n"), got.stderr
        refused = sb.run(["python3", "-c", _FETCH, f"https://other.test:{origin_https.port}/x"])
        assert refused.exit_code != 0 and b"403" in refused.stderr, refused
        # Around the proxy, straight at an address: the link's table sends it to the proxy's
        # transparent listener all the same, which answers (and decides) for itself.
        direct = sb.run(["python3", "-c", _DIRECT, "192.0.2.10", str(origin_https.port)])
        assert direct.stdout.startswith(b"HTTP/1.1 ") and b"(sealgate: " in direct.stdout, direct
    assert [r.path for r in origin_https.requests] == ["/from-image"]


@pytest.mark.parametrize("isolation", ["bubblewrap", "gvisor"])
def test_the_images_user_is_the_sandboxs_name_for_itself(request: pytest.FixtureRequest,
                                                         isolation: str) -> None:
    """The image's User (a name in its passwd) is who its commands are, with its group and
    home, and the whole root is theirs (one unprivileged identity, whatever the image's
    owners were); on the host the sandbox is still its slot's uid alone. A User the image
    cannot name refuses the create, saying why."""
    daemon = request.getfixturevalue("imaged" if isolation == "bubblewrap" else "gvisor_imaged")
    with _create(daemon, "tester") as sb:
        ids = sb.run(["sh", "-c", "id -u; id -g; id -un; echo $HOME"])
        assert ids.stdout == b"1234\n1235\ntester\n/home/tester\n", ids
        owned = sb.run(["sh", "-c", "echo mine > /bin/mine && echo ok > /home/tester/f && "
                                    "stat -c '%u %g' /bin/busybox /bin/mine /workspace"])
        assert owned.stdout == b"1234 1235\n" * 3, owned
        if isolation == "bubblewrap":  # its processes are the host's: their uid there
            sleeping = sb.start(["sleep", "4321"])
            try:
                uids = _host_uids(b"sleep\x004321\x00")
                assert uids and not uids & {0, 1234}, uids
            finally:
                sleeping.kill()
    with pytest.raises(DaemonError) as refused:
        _create(daemon, "ghost")
    assert refused.value.reason is Reason.IMAGE_REFUSED, refused.value
    assert "'ghost': no such user in its /etc/passwd" in str(refused.value)


def _host_uids(cmdline: bytes) -> set[int]:
    """The real uids of the host's processes with that command line (waited for: 10 s)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = set()
        for proc in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if proc.name.isdigit() and (proc / "cmdline").read_bytes() == cmdline:
                    status = (proc / "status").read_text()
                    found.add(int(status.split("\nUid:")[1].split()[0]))
        if found:
            return found
        time.sleep(0.05)
    return set()


def test_an_unknown_image_is_refused(imaged: Daemon) -> None:
    with pytest.raises(DaemonError) as refused:
        _create(imaged, "no-such-image")
    assert refused.value.reason is Reason.NO_SUCH_IMAGE and refused.value.status == 404


def test_snapshot_then_create_from_it(imaged: Daemon) -> None:
    with _create(imaged, "busybox") as sb:
        assert sb.run(["sh", "-c", "echo kept > /workspace/data; echo changed > /etc/motd; "
                                   "rm /etc/group"]).ok
        made = sb.snapshot("snap-test")
        assert made["name"] == "snap-test" and made["owner"] == "ci-bot"
        assert sb.run(["cat", "/workspace/data"]).stdout == b"kept\n"  # it runs on after
    with _create(imaged, "snap-test") as copy:
        assert copy.run(["cat", "/workspace/data"]).stdout == b"kept\n"
        assert copy.run(["cat", "/etc/motd"]).stdout == b"changed\n"
        assert not copy.run(["test", "-e", "/etc/group"]).ok  # a deletion is kept too
        assert copy.run(["test", "-e", "/etc/passwd"]).ok
    # A snapshot is its policy's: another sandbox id may not start from it.
    with pytest.raises(DaemonError) as refused:
        _create(imaged, "snap-test", sandbox="other-bot")
    assert refused.value.reason is Reason.IMAGE_REFUSED and refused.value.status == 403


def test_the_async_client_snapshots_pauses_and_resumes(imaged: Daemon) -> None:
    async def drive() -> None:
        async with AsyncSandbox.create("ci-bot", image="busybox", daemon=str(imaged.socket),
                                       call_timeout=60) as sb:
            assert (await sb.run(["sh", "-c", "echo async > /etc/async"])).ok
            await sb.pause()
            assert sb.info["paused"] is True
            await sb.resume()
            made = await sb.snapshot("snap-async")
            assert made["parent"] == "busybox" and made["owner"] == "ci-bot"
        async with AsyncSandbox.create("ci-bot", image="snap-async",
                                       daemon=str(imaged.socket), call_timeout=60) as copy:
            assert (await copy.run(["cat", "/etc/async"])).stdout == b"async\n"

    asyncio.run(drive())


def test_a_host_root_sandbox_has_nothing_to_snapshot(imaged: Daemon) -> None:
    with Sandbox.create("ci-bot", daemon=str(imaged.socket), call_timeout=60) as sb, \
            pytest.raises(DaemonError) as refused:
        sb.snapshot()
    assert refused.value.reason is Reason.BAD_REQUEST


def _cpu_ticks(uid: int) -> int:
    """utime + stime of every process of `uid` on the host."""
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.stat().st_uid != uid:
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total


def _quietly(sb: Sandbox, argv: list[str]) -> None:
    with contextlib.suppress(DaemonError, OSError):  # ended by the sandbox's delete
        sb.run(argv, timeout=20)


def test_a_paused_sandbox_uses_no_cpu_and_resumes(imaged: Daemon) -> None:
    with _create(imaged, "busybox") as sb:
        spin = threading.Thread(target=_quietly, args=(sb, ["sh", "-c", "while :; do :; done"]),
                                daemon=True)
        spin.start()
        uid = sb.info["uid"]
        deadline = time.monotonic() + 10
        while _cpu_ticks(uid) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        sb.pause()
        assert sb.info["paused"] is True
        frozen = _cpu_ticks(uid)
        time.sleep(0.5)
        assert _cpu_ticks(uid) == frozen  # not a tick in half a second
        with pytest.raises(DaemonError) as refused:
            sb.run(["true"])
        assert refused.value.reason is Reason.SANDBOX_PAUSED and refused.value.status == 409
        sb.resume()
        deadline = time.monotonic() + 10  # it spins again as soon as it is scheduled
        while _cpu_ticks(uid) <= frozen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _cpu_ticks(uid) > frozen
        assert sb.run(["true"]).ok


@pytest.fixture(scope="module")
def gvisor_imaged(dproxy: Proxy, store: Path, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[Daemon]:
    if (problem := tiers.available("gvisor")) is not None:
        pytest.skip(f"isolation gvisor: {problem}")
    daemon = start_daemon(dproxy, tmp_path_factory.mktemp("sandboxd-gvisor-images"), "--pool",
                          "0", "--images", str(store), "--isolation", "gvisor", "--no-selftest",
                          ready=120)
    yield daemon
    daemon.stop()


def test_an_image_on_gvisor(gvisor_imaged: Daemon, store: Path) -> None:
    """The same image on gVisor: its own files, a root its commands may change (they are
    gVisor's root there, its agent another uid), gone with it, and a snapshot of it."""
    layers_before = _tree(store / "layers")
    with _create(gvisor_imaged, "debian") as sb:
        assert sb.info["isolation"] == "gvisor"
        assert sb.run(["cat", "/etc/sealgate-test-image"]).stdout == b"debian-test\n"
        assert not sb.run(["test", "-e", "/usr/bin/runsc"]).ok
        python = sb.run(["python3", "-c", "import os; print(os.getuid())"])
        assert python.stdout == b"0\n", python
        sb.write("sgdemo-1.0-py3-none-any.whl", _wheel())
        pip = sb.run(["python3", "-m", "pip", "install", "--no-index", "--no-cache-dir",
                      "/workspace/sgdemo-1.0-py3-none-any.whl"], timeout=180)
        assert pip.ok, pip.text
        assert sb.run(["python3", "-c", "import sgdemo"]).ok
        resolv = sb.run(["cat", "/etc/resolv.conf"]).stdout
        assert resolv.startswith(b"nameserver 10.216."), resolv
        # Its commands cannot reach the agent, a uid of its own there.
        assert not sb.run(["sh", "-c", "kill -STOP 1"]).ok
        made = sb.snapshot("snap-gvisor")
        with pytest.raises(DaemonError) as refused:
            sb.fork(2)
        assert refused.value.reason is Reason.UNSUPPORTED and "hostinet" in str(refused.value)
    with _create(gvisor_imaged, "snap-gvisor") as copy:
        assert copy.run(["python3", "-c", "import sgdemo; print(sgdemo.ANSWER)"]).stdout \
            == b"42\n"
    assert made["owner"] == "ci-bot"
    after = _tree(store / "layers")  # the image's own layers never changed
    assert {path: after.get(path) for path in layers_before} == layers_before


def test_template_build_then_create_from_it(imaged: Daemon, store: Path) -> None:
    where = ["--daemon", str(imaged.socket)]
    built = sealgate("template", "build", "tmpl-test", "--image", "busybox", "--sandbox",
                     "ci-bot", "--run", "echo built > /etc/built", "--run",
                     "mkdir -p /opt/tool && echo v1 > /opt/tool/version", *where, timeout=120)
    assert built.returncode == 0 and built.stdout == "tmpl-test\n", built.stderr
    assert "$ echo built > /etc/built" in built.stderr  # progress: each command as it runs
    with _create(imaged, "tmpl-test") as sb:
        assert sb.run(["cat", "/etc/built", "/opt/tool/version"]).stdout == b"built\nv1\n"
    failed = sealgate("template", "build", "tmpl-broken", "--image", "busybox", "--sandbox",
                      "ci-bot", "--run", "echo half > /etc/half", "--run", "exit 3", *where,
                      timeout=120)
    assert failed.returncode == 1 and "exit 3" in failed.stderr, failed.stderr
    listed = sealgate("image", "ls", "--json", "--store", str(store))
    names = {i["name"] for i in json.loads(listed.stdout)}
    assert "tmpl-test" in names and "tmpl-broken" not in names, names


def test_gc_keeps_the_layers_a_live_sandbox_uses(imaged: Daemon, store: Path) -> None:
    """A layer under a live sandbox's overlay stays through `image rm` and `image gc`, and
    goes at the first gc after the sandbox. (It removes the hostile image: the tests using it
    come before.)"""
    def layer_names() -> set[str]:
        return {p.name for p in (store / "layers" / "sha256").iterdir()}

    where = ["--store", str(store)]
    with _create(imaged, "hostile") as sb:
        hostile = next(i for i in json.loads(sealgate("image", "ls", "--json", *where).stdout)
                       if i["name"] == "hostile")
        only = {d.removeprefix("sha256:") for d in hostile["layers"]}
        assert sealgate("image", "rm", "hostile", *where).returncode == 0
        gone = sealgate("image", "gc", "--json", *where)
        assert gone.returncode == 0, gone.stderr
        assert only <= layer_names(), gone.stdout  # still there: the sandbox has it mounted
        assert sb.run(["cat", "/etc/resolv.conf"]).ok
    deadline = time.monotonic() + 20  # the overlay goes with the sandbox's teardown
    while only <= layer_names() and time.monotonic() < deadline:
        sealgate("image", "gc", *where)
        time.sleep(0.2)
    assert not only & layer_names()


def test_fork_says_why_it_cannot(imaged: Daemon) -> None:
    with _create(imaged, "busybox") as sb, pytest.raises(DaemonError) as refused:
        sb.fork(2)
    assert refused.value.reason is Reason.UNSUPPORTED and refused.value.status == 501
    assert "bwrap" in str(refused.value)


def test_bad_image_options_are_refused(imaged: Daemon, dproxy: Proxy, store: Path,
                                       tmp_path: Path) -> None:
    with pytest.raises(DaemonError) as refused:
        imaged.client.call("POST", "/v1/sandboxes", {"sandbox": "ci-bot", "image": 5})
    assert refused.value.reason is Reason.BAD_REQUEST
    base = ["sandboxd", *PLAN, "--state", str(dproxy.state), "--socket",
            str(tmp_path / "d.sock"), "--proxy-port", str(dproxy.port), "--uid-base",
            str(UID_BASE + 500), "--images", str(store), "--no-selftest"]
    bad = sealgate(*base, "--pool", "busybox=many")
    assert bad.returncode == 2 and "--pool 'busybox=many'" in bad.stderr, bad.stderr
    missing = sealgate(*base, "--pool", "no-such-image=1")
    assert missing.returncode == 2 and "no image" in missing.stderr, missing.stderr
    assert quiet(bad.stderr + missing.stderr)
