"""A harness's use of sandboxes, written once against the public client and run unchanged
against a daemon on this host (tests/sandboxd/test_harness_unchanged.py) and against the
Kubernetes backend (tests/integration/test_sandbox_kubernetes.py): its answer is what the
harness saw, and both must see the same."""

from __future__ import annotations

import time
from typing import Any

from sealgate.reasons import Reason
from sealgate.sandbox import DaemonError, Sandbox

SCRIPT = b"import os, sys\nprint('stage', os.environ['STAGE'], sys.stdin.read().upper())\n"


def review(daemon: str, sandbox: str) -> dict[str, Any]:
    """What a code-review harness does: write the code, run it (collected and streamed, with
    input), list and read back what it wrote, a command in the background, a port served in the
    sandbox, and the sandbox gone at the end."""
    with Sandbox.create(sandbox, daemon=daemon, env={"STAGE": "one"}) as sb:
        sb.write("src/app.py", SCRIPT)
        first = sb.run(["python3", "src/app.py"], stdin=b"input")
        events = list(sb.stream(["sh", "-c", "echo a; echo b >&2; exit 3"]))
        sb.run(["sh", "-c", "head -c 300000 /dev/zero | tr '\\0' x > big.txt"])
        big = sb.read("big.txt")
        listed = sorted((e.name, e.type) for e in sb.files.list("."))
        background = sb.start(["sh", "-c", "read line; echo got $line"])
        background.write(b"hello\n", close=True)
        waited = background.wait(call_timeout=30)
        said = b"".join(d for kind, d in background.output(0) if kind == "stdout")
        killed = sb.run(["sleep", "30"], timeout=1)
        sb.write("site/index.html", b"<p>served</p>")
        sb.start(["python3", "-m", "http.server", "8765", "--bind", "127.0.0.1",
                  "--directory", "site"])
        served = _first_answer(sb, 8765)
    return {
        "first": (first.exit_code, first.stdout, first.stderr),
        # Two streams: what each says is ordered, not how the two interleave.
        "events": sorted(e for e in events if e[0] != "exit")
        + [("exit", e[1].exit_code) for e in events if e[0] == "exit"],
        "big": (len(big), set(big)),
        "listed": listed,
        "background": (waited.exit_code, said),
        "timed_out": killed.exit_code,
        "served": served,
    }


def _first_answer(sb: Sandbox, port: int) -> tuple[int, bytes]:
    """The port's answer once its server listens (bounded: 20 s)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            status, _, body = sb.port(port, "/index.html")
            return status, body
        except DaemonError as exc:
            if exc.reason is not Reason.PORT_UNREACHABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


EXPECTED = {
    "first": (0, b"stage one INPUT\n", b""),
    "events": [("stderr", b"b\n"), ("stdout", b"a\n"), ("exit", 3)],
    "big": (300000, {ord("x")}),
    "listed": [("big.txt", "file"), ("src", "dir")],
    "background": (0, b"got hello\n"),
    "timed_out": 124,
    "served": (200, b"<p>served</p>"),
}
