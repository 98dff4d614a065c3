"""The harness's two ways in, through a real daemon: the Python client (sync and asyncio) and
the CLI, which is a thin client of the same API."""

from __future__ import annotations

import asyncio
import json
import subprocess

from sealgate.sandbox import AsyncSandbox, DaemonError, Sandbox
from tests.harness import ROOT, SEALGATE
from tests.sandboxd.conftest import Daemon


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


def test_the_async_client_drives_a_session(sandboxd: Daemon) -> None:
    async def session() -> tuple[bytes, bytes, list[int | None]]:
        async with AsyncSandbox.create("ci-bot", daemon=str(sandboxd.socket)) as sb:
            await sb.write("a.txt", b"async data")
            results = await asyncio.gather(*(sb.run(["sh", "-c", f"sleep 0.2; exit {n}"])
                                             for n in range(4)))
            out = await sb.run(["cat", "a.txt"])
            return out.stdout, await sb.read("a.txt"), [r.exit_code for r in results]

    out, read, codes = asyncio.run(session())
    assert (out, read, codes) == (b"async data", b"async data", [0, 1, 2, 3])


def test_the_cli_is_a_thin_client(sandboxd: Daemon) -> None:
    made = cli(sandboxd, "create", "ci-bot", "--json", "--ttl", "120", "--memory", "256M")
    assert made.returncode == 0, made.stderr
    info = json.loads(made.stdout)
    ident = info["id"]
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
    assert table.splitlines()[0].split()[:3] == ["ID", "SANDBOX", "ADDRESS"] and ident in table
    timed = cli(sandboxd, "exec", ident, "--timeout", "0.5", "--", "sleep", "30")
    assert timed.returncode == 124
    assert cli(sandboxd, "rm", ident).returncode == 0
    gone = cli(sandboxd, "exec", ident, "--", "true")
    assert gone.returncode == 125 and b"sandbox_ended" in gone.stderr
    unknown = cli(sandboxd, "create", "no-such-bot")
    assert unknown.returncode == 125 and b"unknown_sandbox" in unknown.stderr
