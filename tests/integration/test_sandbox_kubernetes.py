"""sandboxd with the Kubernetes backend (`sealgate sandboxd --backend kubernetes`), a real
process against the API double (`tests/claimfake.py`: Agent Sandbox claims, their controller,
`pods/exec` into pods that are process trees of their own under bubblewrap). The harness of
tests/sandboxharness.py runs unchanged against it, as against a daemon on this host
(tests/sandboxd/test_harness_unchanged.py)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sealgate.reasons import Reason
from sealgate.sandbox import Client, DaemonError, Sandbox
from tests.claimfake import ClaimFake
from tests.harness import ROOT, SEALGATE
from tests.kubefake import TOKEN
from tests.sandboxharness import EXPECTED, review
from tests.tsclient import PACKAGE, find_node, node_env

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="the pods need bwrap")
POOL_LABELS = {"sealgate.dev/sandbox": "agent-python"}
POD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/workspace",
           "HTTPS_PROXY": "http://sealgate-proxy.sealgate.svc:3128"}


@dataclass
class Backend:
    fake: ClaimFake
    socket: Path
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _start(fake: ClaimFake, where: Path, *flags: str, name: str = "sandboxd") -> Backend:
    """The daemon as a process, once its socket is there."""
    kubeconfig = where / "kubeconfig"
    kubeconfig.write_text(fake.kubeconfig())
    # The agent as a pod gets it (`sealgate sandbox pod-agent`, from an init container), run by
    # the system's python3, which has nothing of sealgate installed.
    agent = where / "opt" / "agent.pyz"
    if not agent.exists():
        subprocess.run([*SEALGATE, "sandbox", "pod-agent", str(agent)], cwd=ROOT, check=True,
                       timeout=60)
    sock, log = where / f"{name}.sock", where / f"{name}.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [*SEALGATE, "sandboxd", "--backend", "kubernetes", "--kubeconfig", str(kubeconfig),
             "--socket", str(sock), "--namespace", "sandboxes",
             "--warm-pool", "agent-python=sealgate-python", "--agent",
             f"/usr/bin/python3 -I {agent}", *flags],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    made = Backend(fake, sock, process, log)
    deadline = time.monotonic() + 30
    while not sock.exists():
        assert process.poll() is None, made.output()
        assert time.monotonic() < deadline, made.output()
        time.sleep(0.05)
    return made


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    where = tmp_path_factory.mktemp("kubesandboxd")
    with ClaimFake() as fake:
        fake.pool("sealgate-python", POOL_LABELS, POD_ENV)
        fake.pool("mislabelled", {"sealgate.dev/sandbox": "someone-else"}, POD_ENV)
        made = _start(fake, where, "--warm-pool", "ghost=no-such-pool",
                      "--warm-pool", "wrong=mislabelled", "--ready-seconds", "2")
        try:
            yield made
        finally:
            made.process.terminate()
            made.process.wait(30)
    assert TOKEN not in made.output()  # the cluster's credential, never in the daemon's log


def test_the_harness_runs_unchanged(backend: Backend) -> None:
    assert review(str(backend.socket), "agent-python") == EXPECTED
    # One claim on the warm pool, as the backend must make it: no env, no volumes (either
    # would force a cold start), deleted with the sandbox, and a shutdownTime of its own.
    body = backend.fake.asked[-1]
    assert body["spec"]["warmPoolRef"] == {"name": "sealgate-python"}
    assert body["spec"]["lifecycle"]["shutdownPolicy"] == "Delete"
    assert body["spec"]["lifecycle"]["shutdownTime"].endswith("Z")
    assert set(body["spec"]) == {"warmPoolRef", "lifecycle"}
    # The agent ran in the pod through the exec API, and went with the sandbox.
    assert backend.fake.execs[-1][-1].endswith("/opt/agent.pyz")
    assert body["metadata"]["name"] not in backend.fake.claims
    assert not backend.fake.pods_named()


def test_commands_start_from_the_pods_environment(backend: Backend) -> None:
    with Sandbox.create("agent-python", daemon=str(backend.socket), env={"MINE": "1"}) as sb:
        seen = sb.run(["sh", "-c", "echo $HTTPS_PROXY $MINE $PWD"]).stdout
        assert sb.info["address"].startswith("10.244.0.")
    assert seen == b"http://sealgate-proxy.sealgate.svc:3128 1 /workspace\n"


# The TypeScript client's steps, one node process each: `create` (a sandbox, a command, a file
# written and read back; what it saw as a JSON line, the sandbox left for the test to look at),
# then `delete ID` (and whether the daemon still knows it).
_TS_STEPS = """
const { Sandbox, DaemonError } = await import(process.env.SEALGATE_TS_CLIENT);
const [step, id] = process.argv.slice(2);
if (step === 'create') {
  const sb = await Sandbox.create('agent-python', { callTimeout: 60 });
  const ran = await sb.run(['sh', '-c',
    'echo "$PWD $HTTPS_PROXY"; echo to-stderr >&2; echo ran > ran-by-ts; exit 7'],
    { timeout: 30, callTimeout: 60 });
  const data = Buffer.from(process.env.SEALGATE_TS_DATA, 'base64');
  const size = await sb.write('from-ts/data.bin', data, { callTimeout: 60 });
  const back = await sb.read('from-ts/data.bin', { callTimeout: 60 });
  console.log(JSON.stringify({ id: sb.id, exitCode: ran.exitCode, ok: ran.ok,
    stdout: ran.stdout.toString('base64'), stderr: ran.stderr.toString('base64'), size,
    back: back.toString('base64') }));
} else {
  const sb = await Sandbox.connect(id, { callTimeout: 60 });
  await sb.delete({ callTimeout: 60 });
  let after = 'alive';
  try {
    await Sandbox.connect(id, { callTimeout: 60 });
  } catch (err) {
    if (!(err instanceof DaemonError)) throw err;
    after = err.reason;
  }
  console.log(JSON.stringify({ after }));
}
"""


def _ts_step(node: str, script: Path, backend: Backend, *args: str,
             data: bytes = b"") -> dict[str, object]:
    env = node_env(node, str(backend.socket), {
        "SEALGATE_TS_CLIENT": (PACKAGE / "index.js").as_uri(),
        "SEALGATE_TS_DATA": base64.b64encode(data).decode()})
    done = subprocess.run([node, str(script), *args], cwd=PACKAGE, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr + backend.output()[-4000:]
    said: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return said


def test_the_typescript_client_drives_the_kubernetes_backend(
    backend: Backend, tmp_path: Path
) -> None:
    """The same TypeScript client as against a daemon on this host (`@sealgate/sandbox`, as
    tests/sandboxd/test_typescript_client.py runs it): a create that is a claim on the warm pool,
    a command's output, error output and exit code from the pod, a file's bytes written and read
    back, as the pod's own workspace holds them, and a delete that deletes the claim and pod."""
    node = find_node()
    script = tmp_path / "steps.mjs"
    script.write_text(_TS_STEPS)
    data = bytes(range(256)) * 3 + b"\r\n\x00not utf-8: \xff\xfe end"
    client = Client(str(backend.socket))
    before = {s["id"] for s in client.list()}
    try:
        made = _ts_step(node, script, backend, "create", data=data)
        sid = str(made["id"])
        # What the client saw.
        assert made["exitCode"] == 7 and made["ok"] is False
        assert base64.b64decode(str(made["stdout"])) == (
            b"/workspace http://sealgate-proxy.sealgate.svc:3128\n")
        assert base64.b64decode(str(made["stderr"])) == b"to-stderr\n"
        assert made["size"] == len(data)
        assert base64.b64decode(str(made["back"])) == data
        # What the cluster holds: the sandbox is a claim of that name on the warm pool, and its
        # pod's workspace has the command's file and the written bytes, unchanged.
        claim = backend.fake.claims[sid]
        assert claim["spec"]["warmPoolRef"] == {"name": "sealgate-python"}
        pod = claim["status"]["sandbox"]["name"]
        assert pod in backend.fake.pods_named()
        workspace = Path(backend.fake._home.name) / pod  # the pod's /workspace (claimfake)
        assert (workspace / "ran-by-ts").read_bytes() == b"ran\n"
        assert (workspace / "from-ts" / "data.bin").read_bytes() == data
        gone = _ts_step(node, script, backend, "delete", sid)
        assert gone["after"] in ("no_such_sandbox", "sandbox_ended"), gone
        # Deleted in the cluster too: the claim, and with it the pod.
        deadline = time.monotonic() + 20
        while sid in backend.fake.claims or pod in backend.fake.pods_named():
            assert time.monotonic() < deadline, (backend.fake.claims, backend.fake.pods_named())
            time.sleep(0.05)
        assert sid not in {s["id"] for s in client.list()}
    finally:  # never left to the module's other tests, whatever failed
        for info in client.list():
            if info["id"] not in before:
                client.call("DELETE", f"/v1/sandboxes/{info['id']}")


def test_a_sandbox_no_warm_pool_serves_is_refused_and_nothing_claimed(backend: Backend) -> None:
    before = len(backend.fake.asked)
    with pytest.raises(DaemonError) as refused:
        Sandbox.create("nobody", daemon=str(backend.socket))
    assert refused.value.reason is Reason.UNKNOWN_SANDBOX
    assert len(backend.fake.asked) == before


def test_a_claim_never_ready_fails_clean(backend: Backend) -> None:
    """A claim on a pool the cluster lacks never becomes ready: the create fails after
    --ready-seconds and its claim is deleted, not left holding anything."""
    started = time.monotonic()
    with pytest.raises(DaemonError) as failed:
        Sandbox.create("ghost", daemon=str(backend.socket))
    assert failed.value.reason is Reason.SANDBOX_FAILED
    assert "not ready within 2 s" in str(failed.value)
    assert time.monotonic() - started < 15
    asked = backend.fake.asked[-1]
    assert asked["spec"]["warmPoolRef"] == {"name": "no-such-pool"}
    assert asked["metadata"]["name"] not in backend.fake.claims


def test_a_pool_whose_pods_are_another_sandboxs_is_refused(backend: Backend) -> None:
    """The proxy knows a pod by its label: a pool mapped to the wrong sandbox id (a mistaken
    --warm-pool) would give the harness another policy than it asked for. Refused, the claim
    deleted, no exec into the pod."""
    execs = len(backend.fake.execs)
    with pytest.raises(DaemonError) as refused:
        Sandbox.create("wrong", daemon=str(backend.socket))
    assert refused.value.reason is Reason.SANDBOX_FAILED
    assert "someone" not in str(refused.value) or "labelled" in str(refused.value)
    assert backend.fake.asked[-1]["metadata"]["name"] not in backend.fake.claims
    assert len(backend.fake.execs) == execs


def test_a_pod_whose_agent_dies_ends_its_sandbox(backend: Backend) -> None:
    client = Client(str(backend.socket))
    sb = Sandbox.create("agent-python", daemon=str(backend.socket))
    pod = backend.fake.pods_named()[-1]
    claim = backend.fake.asked[-1]["metadata"]["name"]
    backend.fake.kill_execs(pod)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.call("GET", f"/v1/sandboxes/{sb.id}")
        except DaemonError as exc:
            assert exc.reason is Reason.SANDBOX_ENDED
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    while claim in backend.fake.claims:  # deleted once the sandbox has ended, not with it
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_what_a_pod_cannot_do_is_unsupported(backend: Backend) -> None:
    with Sandbox.create("agent-python", daemon=str(backend.socket)) as sb:
        for path, body in ((f"/v1/sandboxes/{sb.id}/fork", {"n": 1}),
                           (f"/v1/sandboxes/{sb.id}/snapshot", {}),
                           (f"/v1/sandboxes/{sb.id}/pause", None)):
            with pytest.raises(DaemonError) as refused:
                sb.client.call("POST", path, body)
            assert refused.value.reason is Reason.UNSUPPORTED, path
        with pytest.raises(DaemonError) as refused:
            Sandbox.create("agent-python", daemon=str(backend.socket), image="alpine:3.20")
        assert refused.value.reason is Reason.UNSUPPORTED
        assert sb.run(["true"]).ok  # and the sandbox goes on


def test_the_backend_needs_no_root_and_says_what_is_missing() -> None:
    run = subprocess.run([*SEALGATE, "sandboxd", "--backend", "kubernetes"], cwd=ROOT,
                         capture_output=True, timeout=60, check=False,
                         env={**os.environ, "KUBECONFIG": ""})
    assert run.returncode == 2
    assert b"--warm-pool SANDBOX=POOL" in run.stderr and b"Traceback" not in run.stderr


def test_terminals_tar_and_watch_reach_the_pod(backend: Backend) -> None:
    """The rest of what goes through the agent: a terminal (typed into, resized, its exit), a
    directory out and in as tar, and a watch of the workspace, all over the one exec stream."""
    with Sandbox.create("agent-python", daemon=str(backend.socket)) as sb:
        with sb.pty(30, 100, ["sh", "-i"]) as terminal:
            terminal.write(b"echo typed-$((6*7)); stty size; exit 3\n")
            shown, deadline = b"", time.monotonic() + 20
            while b"30 100" not in shown:
                assert time.monotonic() < deadline, shown
                shown += terminal.read(timeout=5)
            assert b"typed-42\r\n" in shown
            assert terminal.wait(timeout=20).exit_code == 3
        sb.run(["sh", "-c", "mkdir -p d/e && echo one > d/a && echo two > d/e/b"])
        tar = sb.files.download_tar("d")
        sb.files.upload_tar(tar, "copy")
        assert sb.run(["cat", "copy/a", "copy/e/b"]).stdout == b"one\ntwo\n"
        with sb.files.watch("d") as watch:
            sb.write("d/new.txt", b"x")
            seen = next(e for e in watch if e.path == "d/new.txt")
        assert seen.event in ("create", "modify", "rename")  # a put lands by a rename


def test_a_restarted_daemon_deletes_the_claims_its_killed_run_left(tmp_path: Path) -> None:
    """A daemon killed (or its node lost) leaves its claims, whose pods would hold the warm
    pool until their shutdownTime with no one able to reach them; the next run of the same
    `--instance` deletes them before it serves, and no other instance's."""
    with ClaimFake() as fake:
        fake.pool("sealgate-python", POOL_LABELS, POD_ENV)
        first = _start(fake, tmp_path, "--instance", "ci", name="first")
        other = _start(fake, tmp_path, "--instance", "other", name="other")
        try:
            left = Sandbox.create("agent-python", daemon=str(first.socket))
            kept = Sandbox.create("agent-python", daemon=str(other.socket))
            assert left.run(["true"]).ok
            claim = fake.asked[-2]["metadata"]
            assert claim["labels"]["sealgate.dev/sandboxd"] == "ci"
            first.process.kill()
            first.process.wait(30)
            assert set(fake.claims) == {left.id, kept.id}  # nothing deleted it: it was killed
            pods = len(fake.pods_named())
            first.socket.unlink()
            again = _start(fake, tmp_path, "--instance", "ci", name="again")
            try:
                # Deleted before the socket was there: the pod and its agent gone with it.
                assert set(fake.claims) == {kept.id}, fake.claims
                assert len(fake.pods_named()) == pods - 1
                assert "claims of an earlier run deleted" in again.output()
                assert kept.run(["echo", "still"]).stdout == b"still\n"
                kept.delete()
            finally:
                again.process.terminate()
                again.process.wait(30)
        finally:
            for daemon in (first, other):
                if daemon.process.poll() is None:
                    daemon.process.terminate()
                    daemon.process.wait(30)


def test_a_slow_claim_is_watched_not_polled(tmp_path: Path) -> None:
    """A claim the controller takes two seconds to make ready: the daemon watches it (one
    request, told at once) instead of getting it every tenth of a second (twenty requests,
    at a fleet's rate of creates the API server's load), and the sandbox is there as soon as
    the claim is ready."""
    with ClaimFake(ready_after=1.0) as fake:  # Ready after two steps of 1 s
        fake.pool("sealgate-python", POOL_LABELS, POD_ENV)
        daemon = _start(fake, tmp_path, "--ready-seconds", "20")
        try:
            started = time.monotonic()
            with Sandbox.create("agent-python", daemon=str(daemon.socket)) as sb:
                took = time.monotonic() - started
                assert sb.run(["true"]).ok
            assert fake.claim_watches >= 1
            assert fake.claim_gets <= 3, fake.claim_gets  # before the watch, and after it
            assert took >= 2.0, took  # (its promptness is the gets' count above, not a clock)
        finally:
            daemon.process.terminate()
            daemon.process.wait(30)


def test_a_refused_watch_falls_back_to_gets(tmp_path: Path) -> None:
    """Without the watch (RBAC that forgot the verb, a proxy that cuts streams) a create still
    works: a get after each failed watch, with a pause that grows."""
    with ClaimFake(ready_after=0.5) as fake:
        fake.pool("sealgate-python", POOL_LABELS, POD_ENV)
        fake.refuse_watches = True
        daemon = _start(fake, tmp_path, "--ready-seconds", "20")
        try:
            with Sandbox.create("agent-python", daemon=str(daemon.socket)) as sb:
                assert sb.run(["true"]).ok
            assert fake.claim_watches >= 2 and fake.claim_gets >= 2
            assert fake.claim_gets < 20, fake.claim_gets  # paused, not spun
        finally:
            daemon.process.terminate()
            daemon.process.wait(30)
