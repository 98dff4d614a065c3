"""Sandbox sessions as a harness uses them: a real daemon, real sandboxes, real commands.

Every test checks an effect (a file, a process, a request at the origin, the proxy's audit), not
what the daemon says about itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sealgate.sandbox.clients.client import Client, DaemonError, Result, Sandbox
from tests.harness import ROOT, SEALGATE, Origin, Proxy
from tests.sandboxd.conftest import PLAN, UID_BASE, Daemon

Make = Callable[..., Sandbox]
NAMESPACES = ("mnt", "pid", "net", "ipc", "uts", "user", "cgroup")
# What every command starts from (sandbox.host.launch.environment), and nothing of the host's.
BASE_ENV = {
    "PATH", "HOME", "LANG", "TERM", "SEALGATE_SANDBOX", "NODE_EXTRA_CA_CERTS",
    "PIP_BREAK_SYSTEM_PACKAGES", "NPM_CONFIG_PREFIX", "http_proxy", "https_proxy",
    "HTTP_PROXY", "HTTPS_PROXY", "no_proxy", "NO_PROXY", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE", "PIP_CERT", "GIT_SSL_CAINFO", "AWS_CA_BUNDLE",
    "DENO_CERT", "CARGO_HTTP_CAINFO", "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH", "NODE_USE_ENV_PROXY",
    "SEALGATE_BASE_URL", "npm_config_cafile",
}
CANARY = "SEALGATE_TEST_HOST_CANARY"
ENV_PROBE = "import os, json; print(json.dumps(dict(os.environ)))"


@pytest.fixture
def make(sandboxd: Daemon) -> Iterator[Make]:
    """Sandboxes of the package's daemon, deleted after the test whatever happened."""
    made: list[Sandbox] = []

    def create(sandbox: str = "ci-bot", daemon: Daemon = sandboxd, **options: object) -> Sandbox:
        sb = Sandbox.create(sandbox, daemon=str(daemon.socket), **options)  # type: ignore[arg-type]
        made.append(sb)
        return sb

    yield create
    for sb in made:
        sb.delete()


def run(sb: Sandbox, script: str, **kwargs: object) -> Result:
    return sb.run(["sh", "-c", script], **kwargs)  # type: ignore[arg-type]


def host_processes(uid: int) -> dict[int, str]:
    """pid -> command line of the host's processes running as `uid`."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue  # ended while we looked
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields["State"].split()[0] == "Z":
            continue  # ended, not yet collected: holds nothing, and is in no group
        if str(uid) in fields["Uid"].split():
            found[int(entry.name)] = cmdline
    return found


def sandbox_group_procs(uid: int) -> set[int]:
    """Every process of the cgroups the sandbox's processes are in, read on the host."""
    procs: set[int] = set()
    for pid in host_processes(uid):
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            continue
        groups = [line.split(":", 2)[1:] for line in lines if "/sealgate/run-" in line]
        assert groups, lines  # it is in the sandbox's groups (v2, or v1's controllers)
        for controllers, relative in groups:
            base = Path("/sys/fs/cgroup") / controllers.removeprefix("name=")
            procs |= {int(p) for p in
                      (base / relative.lstrip("/") / "cgroup.procs").read_text().split()}
    return procs


def eventually(check: Callable[[], bool], seconds: float = 2.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


# -- 1. a harness's session ---------------------------------------------------------------


def test_a_session_of_dependent_commands(make: Make) -> None:
    sb = make(env={"FROM_CREATE": "create", "BOTH": "create"})
    # Each command sees what the last one left: exec -> exec, put -> exec, exec -> get.
    assert run(sb, "echo first > a.txt && mkdir -p sub/dir").ok
    assert run(sb, "cat a.txt; test -d sub/dir").text == "first\n"
    assert sb.write("sub/dir/script.py", b"import sys; print(sys.stdin.read().upper())") == 43
    done = sb.run(["python3", "sub/dir/script.py"], stdin=b"from stdin")
    assert (done.exit_code, done.text) == (0, "FROM STDIN\n")
    assert run(sb, "printf '\\000\\377binary' > out.bin").ok
    assert sb.read("out.bin") == b"\0\xffbinary"

    # The working directory: the workspace by default, or the one asked for.
    assert run(sb, "pwd").text == "/workspace\n"
    assert run(sb, "pwd; cat ../a.txt", cwd="/workspace/sub").text == "/workspace/sub\nfirst\n"

    # The environment: the sandbox's, then create's, then the exec's, each over the last.
    env = json.loads(sb.run(["python3", "-c", ENV_PROBE],
                            env={"BOTH": "exec", "FROM_EXEC": "exec"}).stdout)
    assert (env["FROM_CREATE"], env["BOTH"], env["FROM_EXEC"]) == ("create", "exec", "exec")
    assert set(env) == BASE_ENV | {"FROM_CREATE", "BOTH", "FROM_EXEC"}
    # An exec's environment is its own: the next command does not inherit it.
    env = json.loads(sb.run(["python3", "-c", ENV_PROBE]).stdout)
    assert env["BOTH"] == "create" and "FROM_EXEC" not in env
    assert env["HOME"] == "/home/sandbox" and env["SEALGATE_SANDBOX"] == "1"

    # How commands end: their code, a signal as 128 + N, a missing program as 127 and why.
    assert run(sb, "exit 42").exit_code == 42
    done = run(sb, "echo out; echo err >&2; kill -TERM $$")
    assert (done.exit_code, done.signal, done.stdout, done.stderr) == \
        (128 + signal.SIGTERM, signal.SIGTERM, b"out\n", b"err\n")
    missing = sb.run(["no-such-program-anywhere", "x"])
    assert missing.exit_code == 127
    assert missing.error and "no-such-program-anywhere" in missing.error
    nowhere = sb.run(["true"], cwd="/no/such/dir")
    assert nowhere.exit_code == 127 and nowhere.error and "/no/such/dir" in nowhere.error
    assert sb.refresh()["commands"] >= 12


# -- 2. the same confinement for every command ----------------------------------------------

CONFINEMENT = r"""
import json, os
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
print(json.dumps({
    "status": {k: status[k].split() for k in
               ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb",
                "NoNewPrivs", "Seccomp")},
    "ns": {n: os.readlink(f"/proc/self/ns/{n}") for n in NAMESPACES},
    "cgroup": open("/proc/self/cgroup").read(),
    "env": sorted(os.environ),
}))
""".replace("NAMESPACES", repr(NAMESPACES))


def test_every_command_is_confined_alike(make: Make) -> None:
    sb = make()
    uid = str(sb.info["uid"])
    host_ns = {n: os.readlink(f"/proc/self/ns/{n}") for n in NAMESPACES}
    seen = []
    # Different ways in: python directly, through a shell, in the background of a shell.
    for argv in (["python3", "-c", CONFINEMENT],
                 ["sh", "-c", 'exec python3 -c "$0"', CONFINEMENT],
                 ["sh", "-c", 'python3 -c "$0" & wait', CONFINEMENT],
                 ["python3", "-c", CONFINEMENT]):
        done = sb.run(argv)
        assert done.ok, done.stderr
        seen.append(json.loads(done.stdout))
    for probe in seen:
        status = probe["status"]
        assert status["Uid"] == [uid] * 4 and status["Gid"] == [uid] * 4
        assert status["Groups"] == []
        for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(status[cap][0], 16) == 0, (cap, status[cap])
        assert status["NoNewPrivs"] == ["1"] and status["Seccomp"] == ["2"]
        assert all(probe["ns"][n] != host_ns[n] for n in NAMESPACES), probe["ns"]
        assert set(probe.pop("env")) - {"PWD"} <= BASE_ENV  # PWD: the shell's own
    # Each command has PID and mount namespaces of its own (its /proc shows nothing else of
    # the sandbox, the agent included: test_agent_reach); the rest, the cgroup, all of it: one
    # sandbox.
    for probe in seen:
        del probe["ns"]["pid"], probe["ns"]["mnt"]
    assert all(probe == seen[0] for probe in seen)
    assert int(uid) >= UID_BASE


# -- 3. nothing outlives its command --------------------------------------------------------

# Their output goes elsewhere: the command's pipes are not what ends them.
ESCAPES = """
{
  setsid sh -c 'sleep 3001' &
  ( sleep 3002 & ) &
  nohup sleep 3003 &
  python3 -c 'import os, time
if os.fork(): os._exit(0)
os.setsid()
if os.fork(): os._exit(0)
os.execvp("sleep", ["sleep", "3004"])'
} >/dev/null 2>&1 </dev/null
sleep 0.2
echo started
"""


def test_nothing_outlives_its_command(make: Make) -> None:
    sb = make()
    uid = sb.info["uid"]
    done = run(sb, ESCAPES)
    assert (done.exit_code, done.text) == (0, "started\n"), done.stderr
    # From the host: no process of the sandbox's uid is any of them, nor in its cgroup.
    # At once: the shim killed and collected them before it reported the exit.
    assert not [c for c in host_processes(uid).values() if "sleep 300" in c]
    strays = [host_processes(uid).get(p, p) for p in sandbox_group_procs(uid)]
    assert not [s for s in strays if "sleep" in str(s)], strays
    # From inside, by a later command: the same.
    listing = run(sb, "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done")
    assert listing.ok and "sleep" not in listing.text, listing.text
    assert "agent" in listing.text  # what it lists is the sandbox's processes


# -- 4. a time limit ends only its own command ---------------------------------------------


def test_a_timeout_kills_only_its_own_command(make: Make) -> None:
    sb = make()
    results: list[Result] = []
    # Long enough to be running still when the short one's end is checked, on a loaded machine.
    long = threading.Thread(target=lambda: results.append(
        run(sb, "sleep 4; echo long-done", timeout=30)))
    long.start()
    try:
        start = time.monotonic()
        short = run(sb, "sleep 3011 & sleep 3012 & echo begun; wait", timeout=0.5)
        took = time.monotonic() - start
        assert (short.exit_code, short.ending, short.text) == (124, "timed_out", "begun\n")
        assert took < 3, took
        # Its children are gone, the other command's sleep is not.
        left = " ".join(host_processes(sb.info["uid"]).values())
        assert "sleep 301" not in left and "sleep 4" in left, left
    finally:
        long.join(30)
    assert [(r.exit_code, r.ending, r.text) for r in results] == [(0, "exit", "long-done\n")]


def test_a_command_started_later_holds_nothing_of_an_earlier_one(make: Make) -> None:
    """A command's end is reported when it ends, not when one started after it does: the later
    one's init (a clone of the agent) closes the agent's descriptors of other commands. Fails
    with the init keeping them: the short command's status waits for the long one."""
    sb = make()
    results: list[tuple[float, Result]] = []

    def short() -> None:
        start = time.monotonic()
        done = run(sb, "sleep 0.5; echo short", timeout=30)
        results.append((time.monotonic() - start, done))

    first = threading.Thread(target=short)
    first.start()
    # The short one runs (not a guess at how long its start takes): the long one starts after.
    assert eventually(lambda: "sleep 0.5" in " ".join(host_processes(sb.info["uid"]).values()))
    long = run(sb, "sleep 4; echo long", timeout=30)
    first.join(30)
    assert long.text == "long\n"
    [(took, done)] = results
    assert done.text == "short\n" and took < 3, (took, done)


# -- 5. two sandboxes, two identities -------------------------------------------------------


def test_two_sandboxes_are_two_identities(
    make: Make, dproxy: Proxy, origin_https: Origin
) -> None:
    ci, other = make("ci-bot"), make("other-bot")
    assert ci.info["uid"] != other.info["uid"]
    assert ci.info["address"] != other.info["address"]
    url = f"https://api.test:{origin_https.port}"

    origin_https.reset()
    got = ci.run(["curl", "-sS", "-m", "10", f"{url}/from-ci"])
    assert (got.exit_code, got.text) == (0, "hello from origin\n"), got.stderr
    assert [r.path for r in origin_https.requests] == ["/from-ci"]
    line = dproxy.wait_audit(lambda e: e.get("event") == "request"
                             and e.get("path") == "/from-ci")
    assert (line["sandbox"], line["identified_by"], line["decision"]) == \
        ("ci-bot", "source", "allow")

    refused = other.run(["curl", "-sS", "-m", "10", "-o", "/dev/null", "-w", "%{http_code}",
                         f"{url}/from-other"])
    assert refused.exit_code != 0 or refused.text == "403", refused
    line = dproxy.wait_audit(lambda e: e.get("event") in ("request", "connect", "tunnel")
                             and e.get("sandbox") == "other-bot"
                             and e.get("host") == "api.test")
    assert line["decision"] == "deny"
    assert [r.path for r in origin_https.requests] == ["/from-ci"]

    # Neither sees the other's files.
    assert run(ci, "echo ci-secret > /workspace/s; echo ci-tmp > /tmp/t; echo h > ~/h").ok
    look = run(other, "ls -A /workspace /tmp ~; grep -rs ci- /workspace /tmp ~ /run; "
                      "ls /run/sealgate-slots 2>&1")
    assert look.text.split("\n") == ["/home/sandbox:", "", "/tmp:", "", "/workspace:",
                                     "ls: cannot access '/run/sealgate-slots': No such "
                                     "file or directory", ""], look.text

    # Nor its processes; and killing all it can reach leaves the other's running.
    results: list[Result] = []
    long = threading.Thread(target=lambda: results.append(
        run(ci, "sleep 1.5; echo ci-survived", timeout=30)))
    long.start()
    try:
        assert eventually(lambda: "sleep 1.5" in " ".join(
            host_processes(ci.info["uid"]).values()))
        seen = run(other, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
        assert "sleep" not in seen.text, seen.text
        host_pid = next(p for p, c in host_processes(ci.info["uid"]).items() if "sleep 1.5" in c)
        aimed = run(other, f"kill -9 {host_pid}; echo $?")
        assert aimed.text.strip().splitlines()[-1] != "0", aimed
        # kill -1 reaches all it may: its own command's processes, never the agent.
        alive = run(other, "sleep 30 & kill -9 -1; wait $!; echo $?; sleep 1; echo done")
        assert (alive.exit_code, alive.text) == (0, "137\ndone\n"), alive
        assert not _ended(other) and run(other, "echo serving").text == "serving\n"
    finally:
        long.join(30)
    assert [(r.exit_code, r.text) for r in results] == [(0, "ci-survived\n")]


def _ended(sb: Sandbox) -> bool:
    try:
        sb.refresh()
    except DaemonError as exc:
        return exc.code == "sandbox_ended"
    return False


# -- 6. a disposable root --------------------------------------------------------------------

PYPROJECT = b"""
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "sgtiny"
version = "1.0"

[project.scripts]
sgtiny = "sgtiny:main"
"""
PACKAGE_JSON = b'{"name": "sgnode", "version": "1.0.0", "bin": {"sgnode": "cli.js"}}'


def test_installs_and_scratch_are_gone_with_the_sandbox(make: Make) -> None:
    sb = make()
    sb.write("pkg/pyproject.toml", PYPROJECT)
    sb.write("pkg/sgtiny.py", b"def main():\n    print('sgtiny ran')\n")
    pip = sb.run(["python3", "-m", "pip", "install", "--no-index", "--no-build-isolation",
                  "--user", "./pkg"], timeout=120)
    assert pip.ok, pip.stdout + pip.stderr
    assert sb.run(["sgtiny"]).text == "sgtiny ran\n"  # from ~/.local/bin, on PATH
    have_npm = Path("/usr/bin/npm").exists()
    if have_npm:
        sb.write("node/package.json", PACKAGE_JSON)
        sb.write("node/cli.js", b"#!/usr/bin/env node\nconsole.log('sgnode ran')\n", mode=0o755)
        npm = run(sb, "cd node && npm pack --silent >/dev/null && npm install -g --offline "
                      "./sgnode-1.0.0.tgz", timeout=120)
        assert npm.ok, npm.stdout + npm.stderr
        assert sb.run(["sgnode"]).text == "sgnode ran\n"
    assert run(sb, "echo x > /tmp/marker; echo x > /var/tmp/marker; echo x > ~/marker").ok
    assert not run(sb, "echo x > /usr/marker || echo x > /etc/marker").ok  # the rest: read-only
    sb.delete()

    fresh = make()
    looked = run(fresh, "ls -A /workspace /tmp /var/tmp ~; command -v sgtiny sgnode; "
                        "python3 -m pip show sgtiny")
    assert "marker" not in looked.text and "pkg" not in looked.text, looked.text
    assert "sgtiny" not in looked.text and "sgnode" not in looked.text, looked.text
    assert not Path("/usr/marker").exists() and not Path("/etc/marker").exists()


@pytest.fixture(scope="module")
def small_disk(dproxy: Proxy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon of its own: a 64 MiB scratch, and a canary in its environment that no sandbox
    may see."""
    where = tmp_path_factory.mktemp("sandboxd-small")
    sock, log = where / "sandboxd.sock", where / "sandboxd.log"
    with open(log, "a") as out:
        process = subprocess.Popen(
            [*SEALGATE, "sandboxd", *PLAN, "--state", str(dproxy.state), "--socket", str(sock),
             "--proxy-port", str(dproxy.port), "--transparent-port",
             str(dproxy.transparent_port), "--uid-base", str(UID_BASE + 20_000), "--pool", "0",
             "--no-selftest", "--disk", "64M"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), CANARY: "host-secret",
                 "HOME": "/root", "TERM": "xterm-canary"})
    daemon = Daemon(process, sock, log)
    try:
        daemon.wait_ready()
        yield daemon
    finally:
        daemon.stop()


def test_the_scratch_is_capped_and_the_host_env_unseen(make: Make, small_disk: Daemon) -> None:
    sb = make(daemon=small_disk)
    full = run(sb, "dd if=/dev/zero of=/workspace/big bs=1M count=100 2>&1; "
                   "df -k /workspace | tail -1")
    assert "No space left on device" in full.text, full.text
    assert int(full.text.split()[-5]) <= 64 * 1024, full.text  # the tmpfs's size
    # /tmp and the home directory share that one cap.
    assert "No space left" in run(sb, "echo more > /tmp/more 2>&1 || echo No space left").text
    assert run(sb, "rm /workspace/big && echo more > /tmp/more").ok

    env = json.loads(sb.run(["python3", "-c", ENV_PROBE]).stdout)
    assert CANARY not in env and "host-secret" not in json.dumps(env)
    assert env["HOME"] == "/home/sandbox"
    assert set(env) <= BASE_ENV
    assert Client(str(small_disk.socket)).health()["ready"]
