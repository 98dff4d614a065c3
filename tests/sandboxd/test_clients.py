"""The harness's two ways in, through a real daemon: the Python client (sync and asyncio) and
the CLI, which is a thin client of the same API."""

from __future__ import annotations

import asyncio
import http.client
import json
import secrets
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sealgate.sandbox import AsyncSandbox, Client, DaemonError, Sandbox
from tests.harness import ROOT, SEALGATE, Proxy, free_port
from tests.sandboxd.conftest import Daemon, start_daemon


def cli(daemon: Daemon, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*SEALGATE, "sandbox", args[0], "--daemon", str(daemon.socket),
                           *args[1:]], cwd=ROOT, input=stdin, capture_output=True, timeout=60,
                          check=False)


def test_the_sync_client_drives_a_session(sandboxd: Daemon) -> None:
    with Sandbox.create("ci-bot", daemon=str(sandboxd.socket), env={"STAGE": "one"}) as sb:
        assert sb.write("src/app.py", b"import os\nprint('stage', os.environ['STAGE'])\n") == 46
        first = sb.run(["python3", "src/app.py"])
        assert (first.exit_code, first.stdout) == (0, b"stage one\n")
        assert sb.run(["python3", "src/app.py"], env={"STAGE": "two"}).stdout == b"stage two\n"
        assert sb.run(["sh", "-c", "cat > out.bin"], stdin=b"\0\1\2" * 1000).ok
        assert sb.read("out.bin") == b"\0\1\2" * 1000
        events = list(sb.stream(["sh", "-c", "echo a; echo b >&2; exit 3"]))
        assert ("stdout", b"a\n") in events and ("stderr", b"b\n") in events
        assert events[-1][0] == "exit" and events[-1][1].exit_code == 3  # type: ignore[union-attr]
        ident = sb.id
    try:
        Sandbox(sb.client, {"id": ident}).run(["true"])
        raise AssertionError("a deleted sandbox ran a command")
    except DaemonError as exc:
        assert (exc.code, exc.status) == ("sandbox_ended", 410)
    with pytest.raises(DaemonError) as gone:
        Sandbox.connect(ident, daemon=str(sandboxd.socket))
    assert (gone.value.code, gone.value.status) == ("sandbox_ended", 410)


def test_the_async_client_drives_a_session(sandboxd: Daemon) -> None:
    async def session() -> tuple[bytes, bytes, list[int | None]]:
        async with AsyncSandbox.create("ci-bot", daemon=str(sandboxd.socket)) as sb:
            await sb.write("a.txt", b"async data")
            results = await asyncio.gather(*(sb.run(["sh", "-c", f"sleep 0.2; exit {n}"])
                                             for n in range(4)))
            out = await sb.run(["cat", "a.txt"])
            # Found again by its id, as a restarted harness would.
            found = await AsyncSandbox.connect(sb.id, daemon=str(sandboxd.socket))
            try:
                assert (await found.run(["cat", "a.txt"])).stdout == b"async data"
            finally:
                await found.close()
            return out.stdout, await sb.read("a.txt"), [r.exit_code for r in results]

    out, read, codes = asyncio.run(session())
    assert (out, read, codes) == (b"async data", b"async data", [0, 1, 2, 3])


def test_the_cli_is_a_thin_client(sandboxd: Daemon) -> None:
    made = cli(sandboxd, "create", "ci-bot", "--json", "--ttl", "120", "--memory", "256M",
               "--metadata", "via=cli")
    assert made.returncode == 0, made.stderr
    info = json.loads(made.stdout)
    ident = info["id"]
    try:
        _drive(sandboxd, ident, info)
    finally:  # never left to the package's other tests, whatever failed
        Sandbox(sandboxd.client, {"id": ident}).delete()


def _drive(sandboxd: Daemon, ident: str, info: dict[str, object]) -> None:
    assert info["limits"]["memory"] == 256 << 20
    put = cli(sandboxd, "put", ident, "-", "dir/in.txt", stdin=b"via cli\n")
    assert put.returncode == 0, put.stderr
    run = cli(sandboxd, "exec", ident, "--", "sh", "-c", "cat dir/in.txt; echo oops >&2; exit 7")
    assert (run.returncode, run.stdout, run.stderr) == (7, b"via cli\n", b"oops\n")
    got = cli(sandboxd, "get", ident, "dir/in.txt")
    assert got.stdout == b"via cli\n"
    listed = json.loads(cli(sandboxd, "ls", "--json").stdout)
    assert ident in [s["id"] for s in listed]
    table = cli(sandboxd, "ls").stdout.decode()
    assert table.splitlines()[0].split()[:4] == ["ID", "SANDBOX", "IMAGE", "ADDRESS"]
    assert ident in table and "via=cli" in table
    assert ident not in cli(sandboxd, "ls", "--metadata", "via=other").stdout.decode()
    updated = cli(sandboxd, "update", ident, "--ttl", "300", "--json")
    assert updated.returncode == 0 and json.loads(updated.stdout)["expires_in"] > 290
    nothing = cli(sandboxd, "update", ident)
    assert nothing.returncode == 2 and b"say what to change" in nothing.stderr
    timed = cli(sandboxd, "exec", ident, "--timeout", "0.5", "--", "sleep", "30")
    assert timed.returncode == 124
    assert cli(sandboxd, "rm", ident).returncode == 0
    gone = cli(sandboxd, "exec", ident, "--", "true")
    assert gone.returncode == 125 and b"sandbox_ended" in gone.stderr
    unknown = cli(sandboxd, "create", "no-such-bot")
    assert unknown.returncode == 125 and b"unknown_sandbox" in unknown.stderr


def test_the_tcp_listener_takes_only_the_bearer_key(
    dproxy: Proxy, tmp_path: Path
) -> None:
    key = secrets.token_urlsafe(24)
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n")
    port = free_port()
    # A key others may read is refused (sandboxes see the host's /etc, for one).
    loose = subprocess.run([*SEALGATE, "sandboxd", "--listen", f"127.0.0.1:{port}", "--key-file",
                            str(key_file), "--state", str(dproxy.state)], cwd=ROOT,
                           capture_output=True, text=True, timeout=60, check=False)
    assert loose.returncode == 2 and "readable by others" in loose.stderr, loose.stderr
    key_file.chmod(0o600)
    daemon = start_daemon(dproxy, tmp_path, "--pool", "0", "--no-selftest",
                          "--listen", f"127.0.0.1:{port}", "--key-file", str(key_file))
    try:
        for header in ({}, {"Authorization": "Bearer wrong-key-of-some-length"},
                       {"Authorization": f"Bearer {key}x"}, {"Authorization": key},
                       {"Authorization": "Bearer \u00e9t\u00e9"}):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("POST", "/v1/sandboxes", body=b'{"sandbox": "ci-bot"}',
                         headers=header)
            answer = conn.getresponse()
            assert answer.status == 401, header
            assert json.loads(answer.read())["error"] == "unauthorized"
            conn.close()
        assert Client(str(daemon.socket)).list() == []  # nothing was created
        url = f"http://127.0.0.1:{port}"
        with Sandbox.create("ci-bot", daemon=url, key=key) as sb:
            assert sb.run(["echo", "over tcp"]).stdout == b"over tcp\n"
        # The key is never on a command line.
        assert key not in Path(f"/proc/{daemon.process.pid}/cmdline").read_text()
    finally:
        daemon.stop()


def test_a_request_too_big_for_the_agent_is_refused_and_the_sandbox_serves_on(
    sandboxd: Daemon
) -> None:
    with Sandbox.create("ci-bot", daemon=str(sandboxd.socket)) as sb:
        try:
            sb.run(["sh", "-c", "echo never", "x" * 300_000])
            raise AssertionError("a 300 KB argv was sent")
        except DaemonError as exc:
            assert (exc.code, exc.status) == ("too_large", 413)
        assert sb.refresh()["running"] == 0  # the refused request is not counted as running
        assert sb.run(["echo", "still here"]).stdout == b"still here\n"


def test_argv_is_capped_by_its_bytes_not_by_a_count(sandboxd: Daemon) -> None:
    """The one cap docs/sandbox-api.md names for argv: the 128 KiB it shares with env and cwd.
    Far more than 4,096 short items fit in it, and the kernel takes them; a list that cannot
    fit is too_large however short its items."""
    with Sandbox.create("ci-bot", daemon=str(sandboxd.socket)) as sb:
        counted = sb.run(["sh", "-c", 'echo "$#"', "sh", *["a"] * 20_000])
        assert counted.stdout == b"20000\n", counted
        for argv in (["true", *["a"] * 30_000], ["true", *[""] * 40_000]):
            try:
                sb.run(argv)
                raise AssertionError(f"an argv of {len(argv)} items was sent")
            except DaemonError as exc:
                assert (exc.code, exc.status) == ("too_large", 413)
        assert sb.refresh()["running"] == 0


def test_concurrent_cold_creates_stop_at_the_daemons_maximum(
    dproxy: Proxy, tmp_path: Path
) -> None:
    daemon = start_daemon(dproxy, tmp_path, "--pool", "0", "--no-selftest",
                          "--max-sandboxes", "2")
    try:
        def attempt(_: int) -> str:
            try:
                return Sandbox.create("ci-bot", daemon=str(daemon.socket)).id
            except DaemonError as exc:
                return exc.code

        with ThreadPoolExecutor(6) as pool:
            outcomes = list(pool.map(attempt, range(6)))
        made = [o for o in outcomes if o.startswith("sb-")]
        assert len(made) == 2 and outcomes.count("at_capacity") == 4, outcomes
        assert len(Client(str(daemon.socket)).list()) == 2
    finally:
        daemon.stop()
