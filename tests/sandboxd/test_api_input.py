"""Bad input to every call of the daemon's API, over its real unix socket: each is refused with
its reason as JSON (`{"error", "detail"}`, never a traceback), nothing of it reaches past the
workspace, and the daemon goes on serving.

Requests are written by hand (http.client, or bytes on the socket) so they can be malformed in
ways the client never would.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sealgate.sandbox.clients.client import Sandbox, _Unix
from tests.harness import quiet
from tests.sandboxd.conftest import Daemon

MiB = 1 << 20


class Answer:
    def __init__(self, status: int, raw: bytes) -> None:
        self.status = status
        self.raw = raw
        self.body: Any = json.loads(raw) if raw else None

    @property
    def error(self) -> str | None:
        return self.body.get("error") if isinstance(self.body, dict) else None

    def __repr__(self) -> str:
        return f"Answer({self.status}, {self.raw[:300]!r})"


def call(daemon: Daemon, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> Answer:
    conn = _Unix(str(daemon.socket), 30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return Answer(response.status, response.read())
    finally:
        conn.close()


def refused(answer: Answer, status: int, reason: str) -> None:
    """Refused as asked, in the API's own shape."""
    assert (answer.status, answer.error) == (status, reason), answer
    assert set(answer.body) == {"error", "detail"}, answer
    assert isinstance(answer.body["detail"], str) and "Traceback" not in answer.body["detail"]


def post_json(daemon: Daemon, path: str, body: Any) -> Answer:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return call(daemon, "POST", path, raw, {"Content-Type": "application/json"})


def exec_path(ident: str) -> str:
    return f"/v1/sandboxes/{ident}/exec"


def host_sleeps(marker: str) -> list[str]:
    found = []
    for entry in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found.append(entry.read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return [c for c in found if marker in c]


def serving(daemon: Daemon, sb: Sandbox) -> bool:
    """The daemon answers and the sandbox runs commands."""
    return bool(daemon.client.health()["ready"]) and sb.run(["echo", "ok"]).text == "ok\n"


@pytest.fixture
def sb(sandboxd: Daemon) -> Iterator[Sandbox]:
    box = Sandbox.create("ci-bot", daemon=str(sandboxd.socket))
    yield box
    box.delete()


# -- ids that are not, or are no longer ------------------------------------------------------


def each_call(ident: str) -> list[tuple[str, str, bytes | None]]:
    return [("GET", f"/v1/sandboxes/{ident}", None),
            ("DELETE", f"/v1/sandboxes/{ident}", None),
            ("POST", exec_path(ident), json.dumps({"argv": ["true"]}).encode()),
            ("PUT", f"/v1/sandboxes/{ident}/files/a.txt", b"data"),
            ("GET", f"/v1/sandboxes/{ident}/files/a.txt", None)]


def test_unknown_and_ended_ids(sandboxd: Daemon) -> None:
    for method, path, body in each_call("sb-0000000000000000"):
        refused(call(sandboxd, method, path, body), 404, "no_such_sandbox")
    box = Sandbox.create("ci-bot", daemon=str(sandboxd.socket))
    box.delete()
    for method, path, body in each_call(box.id):
        refused(call(sandboxd, method, path, body), 410, "sandbox_ended")
    # A name the rules do not know is refused at create, and nothing is made for it.
    before = len(sandboxd.client.list())
    refused(post_json(sandboxd, "/v1/sandboxes", {"sandbox": "no-such-bot"}), 404,
            "unknown_sandbox")
    assert len(sandboxd.client.list()) == before


def test_unknown_calls_and_methods(sandboxd: Daemon) -> None:
    refused(call(sandboxd, "GET", "/v1/nothing"), 400, "bad_request")
    refused(call(sandboxd, "PATCH", "/v1/sandboxes"), 400, "bad_request")
    refused(call(sandboxd, "GET", "/"), 400, "bad_request")


# -- paths outside the workspace -------------------------------------------------------------

TRAVERSALS = ["../x", "a/../../x", "%2E%2E/x", "a/%2E%2E/%2E%2E/x", "/etc/passwd",
              "%2Fetc%2Fpasswd", "./x", "a//b", "a/./b", "x%00y"]


def test_paths_outside_the_workspace_are_refused(sandboxd: Daemon, sb: Sandbox) -> None:
    base = f"/v1/sandboxes/{sb.id}/files/"
    for path in TRAVERSALS:
        put = call(sandboxd, "PUT", base + path, b"planted")
        get = call(sandboxd, "GET", base + path)
        refused(put, 400, "bad_path")
        refused(get, 400, "bad_path")
    found = sb.run(["sh", "-c", "ls -A /workspace /tmp ~; cat /x /y /b /etc/passwd 2>&1 | "
                    "grep planted; test -e /x || test -e /workspace/x || echo none"])
    assert found.text == "/home/sandbox:\n\n/tmp:\n\n/workspace:\nnone\n", found.text


def test_links_in_the_workspace_are_never_followed(sandboxd: Daemon, sb: Sandbox) -> None:
    assert sb.run(["sh", "-c", "ln -s /etc/passwd pw && ln -s /etc d && ln -s /tmp t && "
                   "ln -s /nowhere dangling && echo inside > /tmp/f"]).ok
    base = f"/v1/sandboxes/{sb.id}/files/"
    for path in ("pw", "d/passwd", "t/f", "dangling"):
        refused(call(sandboxd, "GET", base + path), 400, "bad_path")
    for path in ("d/planted", "t/planted", "t/sub/planted"):
        refused(call(sandboxd, "PUT", base + path, b"planted"), 400, "bad_path")
    assert sb.run(["sh", "-c", "ls /tmp; test ! -e /etc/planted"]).text == "f\n"
    # A write to the link's own name replaces the link; its target is untouched.
    for name in ("pw", "dangling"):
        done = call(sandboxd, "PUT", base + name, b"replaced")
        assert done.status == 200, done
    assert sb.run(["sh", "-c", "test ! -L pw && test -f pw && cat pw dangling && "
                   "test ! -e /nowhere"]).text == "replacedreplaced"
    assert Path("/etc/passwd").read_bytes().startswith(b"root:")
    # Other things that are not files.
    assert sb.run(["sh", "-c", "mkdir dir && mkfifo fifo"]).ok
    for path in ("dir", "fifo", "missing", "missing/x", "pw/x"):
        answer = call(sandboxd, "GET", base + path)
        refused(answer, 404, "no_such_file")


# -- bodies too large -------------------------------------------------------------------------


def test_bodies_over_their_caps(sandboxd: Daemon, sb: Sandbox) -> None:
    # A file over the cap: refused on its Content-Length, before a byte of it is read.
    with socket.socket(socket.AF_UNIX) as raw:
        raw.settimeout(10)
        raw.connect(str(sandboxd.socket))
        raw.sendall(f"PUT /v1/sandboxes/{sb.id}/files/big HTTP/1.1\r\nHost: x\r\n"
                    f"Content-Length: {(1 << 30) + 1}\r\n\r\n".encode() + b"x" * 1000)
        head = raw.recv(4096)
    assert head.startswith(b"HTTP/1.1 413"), head
    assert json.loads(head.split(b"\r\n\r\n", 1)[1])["error"] == "too_large"
    # Stdin over 16 MiB (as base64, under the body's own cap): too_large.
    stdin = base64.b64encode(b"x" * (16 * MiB + 1)).decode()
    refused(post_json(sandboxd, exec_path(sb.id), {"argv": ["true"], "stdin": stdin}), 413,
            "too_large")
    # A JSON body over its cap of 24 MiB.
    refused(post_json(sandboxd, exec_path(sb.id), b'{"argv": ["' + b"a" * (25 * MiB) + b'"]}'),
            413, "too_large")
    # Exactly 16 MiB of stdin is fine, and arrives whole.
    done = sb.run(["sh", "-c", "wc -c"], stdin=b"y" * (16 * MiB))
    assert done.text.strip() == str(16 * MiB)
    # Chunked uploads (no Content-Length) are refused.
    conn = _Unix(str(sandboxd.socket), 10)
    try:
        conn.request("PUT", f"/v1/sandboxes/{sb.id}/files/c", body=iter([b"abc"]),
                     encode_chunked=True)
        response = conn.getresponse()
        answer = Answer(response.status, response.read())
    finally:
        conn.close()
    refused(answer, 400, "bad_request")
    assert serving(sandboxd, sb)


def test_a_file_past_the_scratch_cap_leaves_nothing(sandboxd: Daemon, sb: Sandbox) -> None:
    """The write fails as too_large (ENOSPC), and its partial file does not keep the space."""
    # Fill the scratch but for 8 MiB, then put 16 MiB.
    assert sb.run(["sh", "-c", "avail=$(df -k /workspace | awk 'NR==2 {print $4}'); "
                   "dd if=/dev/zero of=/tmp/fill bs=1k count=$((avail - 8192)) 2>/dev/null"],
                  timeout=60).ok
    answer = call(sandboxd, "PUT", f"/v1/sandboxes/{sb.id}/files/big", b"z" * (16 * MiB))
    refused(answer, 413, "too_large")
    left = sb.run(["sh", "-c", "ls -A /workspace; df -k /workspace | awk 'NR==2 {print $4}'"])
    lines = left.text.split()
    assert lines[:-1] == [] and int(lines[-1]) >= 8000, left.text
    assert sb.run(["rm", "/tmp/fill"]).ok


# -- malformed and mistyped -------------------------------------------------------------------

BAD_CREATES: list[tuple[Any, str]] = [
    (b"{not json", "bad_json"), (b"\xff\xfe", "bad_json"), (b"", "bad_json"),
    ([], "bad_json"), ("ci-bot", "bad_json"), (None, "bad_json"),
    ({"sandbox": "ci-bot", "colour": "red"}, "bad_request"),
    ({}, "bad_request"), ({"sandbox": 5}, "bad_request"), ({"sandbox": ""}, "bad_request"),
    ({"sandbox": "ci-bot", "ttl": "60"}, "bad_request"),
    ({"sandbox": "ci-bot", "ttl": True}, "bad_request"),
    ({"sandbox": "ci-bot", "ttl": 0}, "bad_request"),
    (b'{"sandbox": "ci-bot", "ttl": NaN}', "bad_request"),
    (b'{"sandbox": "ci-bot", "ttl": 1e400}', "bad_request"),
    (b'{"sandbox": "ci-bot", "idle_timeout": Infinity}', "bad_request"),
    ({"sandbox": "ci-bot", "isolation": "docker"}, "bad_request"),
    ({"sandbox": "ci-bot", "env": ["A=1"]}, "bad_request"),
    ({"sandbox": "ci-bot", "env": {"A": 1}}, "bad_request"),
    ({"sandbox": "ci-bot", "env": {"1A": "x"}}, "bad_request"),
    ({"sandbox": "ci-bot", "env": {"A=B": "x"}}, "bad_request"),
    ({"sandbox": "ci-bot", "env": {"A": "x\0y"}}, "bad_request"),
    ({"sandbox": "ci-bot", "limits": {"pids": "many"}}, "bad_request"),
    ({"sandbox": "ci-bot", "limits": {"pids": "64"}}, "bad_request"),
    ({"sandbox": "ci-bot", "limits": {"pids": True}}, "bad_request"),
    ({"sandbox": "ci-bot", "limits": {"pids": 2}}, "bad_request"),
    ({"sandbox": "ci-bot", "limits": {"pids": 10 ** 30}}, "bad_request"),
    (b'{"sandbox": "ci-bot", "limits": {"pids": 1e400}}', "bad_request"),
    ({"sandbox": "ci-bot", "limits": {"memory": "lots"}}, "bad_request"),
    ({"sandbox": "ci-bot", "limits": {"memory": [1]}}, "bad_request"),
    ({"sandbox": "ci-bot", "limits": {"memory": 10 ** 30}}, "bad_request"),
    ({"sandbox": "ci-bot", "limits": {"cpus": "1"}}, "bad_request"),
    (b'{"sandbox": "ci-bot", "limits": {"cpus": NaN}}', "bad_request"),
    ({"sandbox": "ci-bot", "limits": {"disk": "1G"}}, "bad_request"),
    ({"sandbox": "ci-bot", "limits": [1]}, "bad_request"),
]

BAD_EXECS: list[tuple[Any, str]] = [
    (b"{not json", "bad_json"), (b'{"argv": ["true"]', "bad_json"), ([], "bad_json"),
    ({"argv": ["true"], "shell": True}, "bad_request"),
    ({}, "bad_request"), ({"argv": "true"}, "bad_request"), ({"argv": []}, "bad_request"),
    ({"argv": [1]}, "bad_request"), ({"argv": ["a\0b"]}, "bad_request"),
    ({"argv": ["true"], "cwd": "relative"}, "bad_request"),
    ({"argv": ["true"], "cwd": 1}, "bad_request"),
    ({"argv": ["true"], "stdin": "not base64!"}, "bad_request"),
    ({"argv": ["true"], "stdin": 5}, "bad_request"),
    ({"argv": ["true"], "timeout": "5"}, "bad_request"),
    ({"argv": ["true"], "timeout": -1}, "bad_request"),
    ({"argv": ["true"], "timeout": 0}, "bad_request"),
    (b'{"argv": ["true"], "timeout": Infinity}', "bad_request"),
    (b'{"argv": ["true"], "timeout": NaN}', "bad_request"),
    (b'{"argv": ["true"], "timeout": 1e400}', "bad_request"),
    ({"argv": ["true"], "timeout": 1e12}, "bad_request"),
    ({"argv": ["true"], "env": {"": "x"}}, "bad_request"),
    ({"argv": ["true"], "env": "A=1"}, "bad_request"),
    ({"argv": ["true"], "stream": "no"}, "bad_request"),
    ({"argv": ["true"], "stream": 0}, "bad_request"),
]


def test_malformed_and_mistyped_bodies(sandboxd: Daemon, sb: Sandbox) -> None:
    before = {s["id"] for s in sandboxd.client.list()}
    for body, reason in BAD_CREATES:
        refused(post_json(sandboxd, "/v1/sandboxes", body), 400, reason)
    assert {s["id"] for s in sandboxd.client.list()} == before  # nothing was made
    commands = sb.refresh()["commands"]
    for body, reason in BAD_EXECS:
        refused(post_json(sandboxd, exec_path(sb.id), body), 400, reason)
    assert sb.refresh()["commands"] == commands  # nothing ran
    # The mode of a put, and what is fine: a timeout of null is no limit.
    refused(call(sandboxd, "PUT", f"/v1/sandboxes/{sb.id}/files/m?mode=999", b"x"), 400,
            "bad_request")
    refused(call(sandboxd, "PUT", f"/v1/sandboxes/{sb.id}/files/m?mode=u%2Bx", b"x"), 400,
            "bad_request")
    answer = post_json(sandboxd, exec_path(sb.id), {"argv": ["true"], "timeout": None,
                                                    "stream": False})
    assert (answer.status, answer.body["exit"]) == (200, 0), answer
    # A setuid bit asked for is not given.
    assert call(sandboxd, "PUT", f"/v1/sandboxes/{sb.id}/files/s?mode=4755", b"x").status == 200
    assert sb.run(["stat", "-c", "%a", "s"]).text == "755\n"
    assert serving(sandboxd, sb)


# -- callers that go away -------------------------------------------------------------------


def test_a_caller_gone_mid_stream_ends_its_command(sandboxd: Daemon, sb: Sandbox) -> None:
    body = json.dumps({"argv": ["sh", "-c", "echo begun; sleep 3031 & sleep 3032; echo no"],
                       "timeout": 60}).encode()
    with socket.socket(socket.AF_UNIX) as raw:
        raw.settimeout(10)
        raw.connect(str(sandboxd.socket))
        raw.sendall(f"POST {exec_path(sb.id)} HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    f"application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        seen = b""
        deadline = time.monotonic() + 10
        while base64.b64encode(b"begun\n") not in seen and time.monotonic() < deadline:
            seen += raw.recv(4096)
        assert seen.startswith(b"HTTP/1.1 200") and base64.b64encode(b"begun\n") in seen, seen
        assert host_sleeps("sleep 303")
    deadline = time.monotonic() + 20  # 5 s was too short in a full run on two loaded CPUs
    while host_sleeps("sleep 303") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not host_sleeps("sleep 303")
    assert eventually_idle(sb)
    assert serving(sandboxd, sb)


def test_callers_gone_mid_upload_and_mid_download(sandboxd: Daemon, sb: Sandbox) -> None:
    # An upload cut short: no file, no temporary file, the request no longer counted.
    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(str(sandboxd.socket))
        raw.sendall(f"PUT /v1/sandboxes/{sb.id}/files/half HTTP/1.1\r\nHost: x\r\n"
                    f"Content-Length: {MiB}\r\n\r\n".encode() + b"h" * 1000)
        time.sleep(0.2)
    assert eventually_idle(sb)
    assert sb.run(["ls", "-A", "/workspace"]).text == ""
    # A download left after its first bytes.
    sb.write("big", b"b" * (32 * MiB))
    with socket.socket(socket.AF_UNIX) as raw:
        raw.settimeout(10)
        raw.connect(str(sandboxd.socket))
        raw.sendall(f"GET /v1/sandboxes/{sb.id}/files/big HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert raw.recv(4096).startswith(b"HTTP/1.1 200")
    assert eventually_idle(sb)
    # A download that asked for nothing of the body: the request line and headers only, then
    # a close before the answer.
    with socket.socket(socket.AF_UNIX) as raw:
        raw.connect(str(sandboxd.socket))
        raw.sendall(f"GET /v1/sandboxes/{sb.id}/files/big HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert eventually_idle(sb)
    assert sb.read("big") == b"b" * (32 * MiB)
    assert serving(sandboxd, sb)


def eventually_idle(sb: Sandbox, seconds: float = 5.0) -> bool:
    """The sandbox counts no request running (its descriptors and counts were let go)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if sb.refresh()["running"] == 0:
            return True
        time.sleep(0.05)
    return False


def test_raw_answers_are_json(sandboxd: Daemon) -> None:
    """http.client's own view: the error answers have a JSON content type, and the daemon
    logged no traceback for anything the tests above sent it (nor for the requests it could
    not parse: test_api_wire.py)."""
    conn = _Unix(str(sandboxd.socket), 10)
    try:
        conn.request("GET", "/v1/sandboxes/sb-nope")
        response: http.client.HTTPResponse = conn.getresponse()
        assert response.getheader("Content-Type", "").startswith("application/json")
        assert json.loads(response.read())["error"] == "no_such_sandbox"
    finally:
        conn.close()
    log = sandboxd.log.read_text()
    assert quiet(log), log[-4000:]
