"""Signed port URLs (#25's ports), through a daemon on TCP with a bearer key, as a browser would
use them: without the key, HTTP and WebSocket; refused (bad_signature) when tampered with,
expired, or carried over to another sandbox or port, with nothing reaching the server; no
other route of the daemon's reachable with one; and neither the URL nor the daemon reachable
from inside another sandbox, nor anything outside from the served one while a stream is open.

The signature's checks are the daemon's, whatever the tier; the forward after them is the port
route's, which test_port_streams runs on every tier."""

from __future__ import annotations

import asyncio
import http.client
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit

import aiohttp
import pytest

from sealgate.sandbox.clients.client import Sandbox
from tests.harness import Proxy, free_port

from .conftest import GATEWAY, Daemon, sealgate, start_daemon
from .portservers import seen, serve

PORT = 8000
MAX_TTL = 900


@dataclass
class Keyed:
    daemon: Daemon
    url: str  # http://127.0.0.1:PORT
    key: str
    key_file: Path


@pytest.fixture(scope="module")
def keyed(dproxy: Proxy, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keyed]:
    where = tmp_path_factory.mktemp("sandboxd-keyed")
    key = secrets.token_urlsafe(24)
    key_file = where / "key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    port = free_port()
    # A maximum TTL under the hour a signed URL lasts by default (`test_the_default_expiry`).
    daemon = start_daemon(dproxy, where, "--pool", "1", "--no-selftest", "--max-ttl", str(MAX_TTL),
                          "--listen", f"127.0.0.1:{port}", "--key-file", str(key_file))
    yield Keyed(daemon, f"http://127.0.0.1:{port}", key, key_file)
    daemon.stop()


@pytest.fixture
def served(keyed: Keyed) -> Iterator[Sandbox]:
    with Sandbox.create("ci-bot", daemon=keyed.url, key=keyed.key) as sb:
        serve(sb, PORT, lambda: sb.port(PORT, "/ready"))
        yield sb


def _get(url: str, method: str = "GET", headers: dict[str, str] | None = None
         ) -> tuple[int, dict[str, str], bytes]:
    """`url` fetched as a browser would: no daemon key, the path sent exactly as written."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=30)
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""),
                     headers=headers or {})
        answer = conn.getresponse()
        headers: dict[str, str] = {}  # a repeated header's values joined, as HTTP reads them
        for name, value in answer.getheaders():
            headers[name.lower()] = f"{headers[name.lower()]}, {value}" \
                if name.lower() in headers else value
        return answer.status, headers, answer.read()
    finally:
        conn.close()


def _refusal(url: str) -> str:
    status, headers, body = _get(url)
    assert status == 403 and headers.get("x-sealgate-error") == "bad_signature", (status, body)
    return str(json.loads(body)["detail"])


def test_a_signed_url_works_without_the_key(served: Sandbox, keyed: Keyed) -> None:
    url = served.url(PORT, expires_in=60)
    assert url.startswith(keyed.url + "/v1/signed/") and url.endswith("/"), url
    status, headers, body = _get(url + "app/page?q=1")  # a relative link of the app's
    assert (status, body) == (200, b"plain GET /app/page?q=1 HTTP/1.1")
    assert headers["x-from"] == "the-sandbox"
    # Found by review: the token in the page's URL went on in Referer, and the app could scope a
    # service worker over the daemon's whole origin (every sandbox's signed URLs) or clear it.
    assert headers["referrer-policy"] == "no-referrer", headers
    assert not {"service-worker-allowed", "clear-site-data"} & set(headers), headers

    async def websocket() -> object:
        async with aiohttp.ClientSession() as http, http.ws_connect(url + "live") as ws:
            await ws.send_str("through a signed URL")
            return (await ws.receive(timeout=20)).data

    assert asyncio.run(asyncio.wait_for(websocket(), 60)) == "through a signed URL"
    log = seen(served)
    assert log[0] == "GET /app/page?q=1 HTTP/1.1" and log[2] == "GET /live HTTP/1.1", log
    assert not any("signed" in line for line in log), log  # the token never reaches it
    # Through the bearer route (not a browser), the server's own headers pass.
    _, own, _ = served.port(PORT, "/not-a-browser")
    assert (own["referrer-policy"], own["service-worker-allowed"]) == ("unsafe-url", "/")


def test_the_cli_prints_a_signed_url(served: Sandbox, keyed: Keyed) -> None:
    done = sealgate("sandbox", "url", served.id, str(PORT), "--expires-in", "60",
                    "--daemon", keyed.url, "--key-file", str(keyed.key_file))
    assert done.returncode == 0, done.stderr
    assert _get(done.stdout.strip() + "cli")[2] == b"plain GET /cli HTTP/1.1"
    assert sealgate("sandbox", "url", served.id, "0", "--daemon", keyed.url, "--key-file",
                    str(keyed.key_file)).stderr.startswith("sealgate: bad_request")


def test_the_default_expiry_is_within_the_daemons_maximum_ttl(served: Sandbox,
                                                             keyed: Keyed) -> None:
    """Found by review: without `expires_in` a URL was asked for an hour (the clients sent it,
    the daemon defaulted to it), which a daemon whose maximum TTL is shorter refused."""
    before = time.time()
    url = served.url(PORT)
    expires = int(url.rstrip("/").rsplit("/", 1)[1].split(".")[2])
    assert before + MAX_TTL - 5 <= expires <= time.time() + MAX_TTL, (expires, before)
    assert _get(url + "default")[2] == b"plain GET /default HTTP/1.1"
    done = sealgate("sandbox", "url", served.id, str(PORT), "--daemon", keyed.url,
                    "--key-file", str(keyed.key_file))
    assert done.returncode == 0 and _get(done.stdout.strip() + "cli")[0] == 200, done.stderr


def test_tampered_expired_and_carried_over_urls_are_refused(served: Sandbox,
                                                            keyed: Keyed) -> None:
    url = served.url(PORT, expires_in=60)
    base, token = url.rstrip("/").rsplit("/", 1)
    ident, port, expires, mac = token.split(".")
    assert ident == served.id and port == str(PORT)
    # The first character: any of the 64 is well formed there, while the last holds 4 bits and
    # takes only 16 (flipping it failed one run in 16 as malformed instead of not matching).
    flipped = ("A" if mac[0] != "A" else "B") + mac[1:]
    with Sandbox.create("ci-bot", daemon=keyed.url, key=keyed.key) as other:
        carried = {
            "tampered": f"{ident}.{port}.{expires}.{flipped}",
            "later expiry": f"{ident}.{port}.{int(expires) + 3600}.{mac}",
            "another sandbox": f"{other.id}.{port}.{expires}.{mac}",
            "another port": f"{ident}.{PORT + 1}.{expires}.{mac}",
        }
        for what, forged in carried.items():
            assert "does not match" in _refusal(f"{base}/{forged}/"), what
        # The other sandbox's own URL opens the other sandbox, never this one.
        assert _get(other.url(PORT) + "x")[1].get("x-sealgate-error") == "port_unreachable"
    assert "not a signed" in _refusal(f"{base}/not-a-token/")
    # Found by review: the token's pattern took what `int` reads as the same number (a leading
    # zero, another script's digits), so one signature had many spellings.
    arabic = quote("".join(chr(0x0660 + int(d)) for d in port))
    for what, respelled in {"a leading zero": f"{ident}.0{port}.{expires}.{mac}",
                            "other digits": f"{ident}.{arabic}.{expires}.{mac}",
                            "a zero before the expiry": f"{ident}.{port}.0{expires}.{mac}",
                            }.items():
        assert "not a signed" in _refusal(f"{base}/{respelled}/"), what
    short = served.url(PORT, expires_in=1)
    time.sleep(2.1)
    assert "expired" in _refusal(short + "late")
    assert seen(served) == []  # nothing reached the server


def test_a_signed_url_reaches_no_other_route(served: Sandbox, keyed: Keyed) -> None:
    url = served.url(PORT, expires_in=60)
    token = url.rstrip("/").rsplit("/", 1)[1]
    sandbox = f"/v1/sandboxes/{served.id}"
    for path, method in ((f"/v1/signed/{token}/../../sandboxes/{served.id}", "GET"),
                         (f"/v1/signed/{token}/%2e%2e/%2e%2e/sandboxes/{served.id}", "GET"),
                         (f"{sandbox}/exec?sig={token}", "POST"), (f"{sandbox}/urls", "POST"),
                         (f"{sandbox}/ports/{PORT}/", "GET"), (f"{sandbox}/tcp/{PORT}", "GET"),
                         (f"/v1/signed/{token}", "GET"), ("/v1/sandboxes", "GET")):
        status, _, body = _get(keyed.url + path, method)
        forwarded = body.startswith(b"plain ")
        # Either the key is asked for, or the path went to the sandbox's server as a path of
        # its own (a dot-segment the daemon resolved inside the signed route).
        assert status == 401 or (forwarded and b"sandboxes" in body), (path, status, body)
    # With the daemon's key stripped from what the client holds: nothing works but the URL.
    assert _get(url)[0] == 200


_PROBE = """
import socket, sys
for host, port, path in zip(sys.argv[1::3], sys.argv[2::3], sys.argv[3::3]):
    try:
        with socket.create_connection((host, int(port)), timeout=3) as c:
            c.sendall(f"GET {path} HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n".encode())
            c.settimeout(5)
            print(host, port, c.recv(65536).decode(errors="replace"))
    except OSError as exc:
        print(host, port, "refused", exc)
"""


def test_another_sandbox_cannot_use_the_url_or_reach_the_daemon(served: Sandbox,
                                                                keyed: Keyed) -> None:
    """From inside a second sandbox: the daemon's listener at its own loopback (which is the
    sandbox's, not the host's) and at the gateway (captured to the proxy, which refuses), with
    a good signed URL's path."""
    url = served.url(PORT, expires_in=60)
    path = urlsplit(url).path + "from-the-other"
    daemon_port = urlsplit(keyed.url).port
    with Sandbox.create("ci-bot", daemon=keyed.url, key=keyed.key) as other:
        probe = other.run(["python3", "-c", _PROBE, "127.0.0.1", str(daemon_port), path,
                           GATEWAY, str(daemon_port), path, served.info["address"],
                           str(PORT), "/direct"])
        print(probe.text)
        assert probe.ok and "plain" not in probe.text and "x-from" not in probe.text, probe
        assert _refused_twice(probe.text), probe
    assert seen(served) == []


def test_an_open_stream_opens_no_way_out(served: Sandbox, keyed: Keyed) -> None:
    """While a TCP stream into the served sandbox is open, the sandbox still reaches nothing
    but the proxy: the daemon's listener at the gateway is captured and refused."""
    daemon_port = str(urlsplit(keyed.url).port)

    async def during() -> str:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {keyed.key}"}) \
                as http, http.ws_connect(f"{keyed.url}/v1/sandboxes/{served.id}/tcp/"
                                         f"{PORT + 1}") as ws:
            await ws.send_bytes(b"open")
            assert (await ws.receive(timeout=20)).data == b"open"
            probe = await asyncio.to_thread(served.run, [
                "python3", "-c", _PROBE, GATEWAY, daemon_port, "/v1/sandboxes", "127.0.0.1",
                daemon_port, "/v1/sandboxes"])
            return probe.text

    text = asyncio.run(asyncio.wait_for(during(), 60))
    print(text)
    assert _refused_twice(text), text


def _refused_twice(text: str) -> bool:
    """Both probes refused: by the proxy (which answers for itself) or at connect; neither
    reached the daemon (whose answer without a key would be `unauthorized`)."""
    return "unauthorized" not in text and \
        text.count("(sealgate: ") + text.count("refused") >= 2

