"""websockets, unchanged, through a real proxy to a fake WebSocket API over TLS.

websockets (13+) reads HTTPS_PROXY (credentials included) for a wss:// URI and trusts
SSL_CERT_FILE through OpenSSL's default paths: both from the environment `sealgate env`
printed. The fake answers each message with what it received and the Authorization header of
the handshake, so a test sees whether the proxy masked a secret inside WebSocket messages.
"""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sealgate.credentials.processors import BearerProcessor
from tests.dnsstub import StubDNS
from tests.harness import OriginCA
from tests.sdk.kit import (
    PROXY_HEADERS,
    Arrived,
    World,
    masked,
    policy,
    rule,
    rules_file,
    world,
)

pytest.importorskip("websockets", reason="websockets is not installed (pip install -e '.[test]')")

HOST = "ws.sdk.test"
BLOCKED = "blocked.ws.sdk.test"
SECRET = "ws-CANARY-secret-6d3e8f1a2b"
KEYS = {"plain-1": "plain-key-ws-1", "broker-1": "broker-key-ws-1", "tokens-1": "tokens-key-ws-1"}
PATHS = ["/v1/**"]


def rules(port: int) -> str:
    return rules_file(
        [
            policy("plain", rule(HOST, [port], paths=PATHS)),
            policy("broker", rule(HOST, [port], paths=PATHS, inject="bearer")),
            policy("tokens", rule(HOST, [port], paths=PATHS), tokens=True),
            policy("anon", rule(HOST, [port], paths=PATHS), tokens=True),
        ],
        {"plain-1": ("plain", KEYS["plain-1"]), "broker-1": ("broker", KEYS["broker-1"]),
         "tokens-1": ("tokens", KEYS["tokens-1"])},
        default="anon",
    )


class WebSocketFake:
    """A wss server on 127.0.0.1 recording every handshake (as an Arrived) and message."""

    def __init__(self, ca: OriginCA, names: list[str]) -> None:
        from websockets.sync.server import serve

        self.names = tuple(names)
        self.requests: list[Arrived] = []
        self.messages: list[str | bytes] = []
        self.connections = 0
        self._lock = threading.Lock()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*(str(p) for p in ca.issue(*names)))
        self.server = serve(self._handle, "127.0.0.1", 0, ssl=context,
                            process_request=self._record, open_timeout=10)
        self.port = int(self.server.socket.getsockname()[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def _record(self, connection: Any, request: Any) -> None:
        with self._lock:
            self.connections += 1
            self.requests.append(Arrived("GET", request.path, list(request.headers.raw_items()),
                                         b"", self.connections))

    def _handle(self, connection: Any) -> None:
        auth = connection.request.headers.get("Authorization")
        for _ in range(100):
            try:
                message = connection.recv(timeout=10)
            except Exception:
                return
            with self._lock:
                self.messages.append(message)
            connection.send(json.dumps({"got": message, "authorization": auth}))

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.messages.clear()
            self.connections = 0

    def untouched(self) -> bool:
        return self.connections == 0 and not self.requests

    def last(self) -> Arrived:
        assert self.requests, "no handshake reached the fake"
        return self.requests[-1]

    def stop(self) -> None:
        self.server.shutdown()


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
      ) -> Iterator[World]:
    directory: Path = tmp_path_factory.mktemp("sdk-websockets")
    fake = WebSocketFake(test_ca, [HOST, BLOCKED])
    with world(directory, test_ca, dns, [HOST, BLOCKED], None, rules, KEYS, SECRET,
               fake=fake) as made:
        yield made


@pytest.fixture(autouse=True)
def _fresh(w: World) -> None:
    w.fake.reset()


TALK = """
def main(uri, headers=None, messages=("hello",)):
    from websockets.sync.client import connect
    from websockets.exceptions import InvalidStatus
    try:
        # 20 s, inside the call's 25: a full run on two loaded CPUs once left a refused host's
        # answer unread past 10 s, and the client's own timeout then hung in its close.
        with connect(uri, additional_headers=headers, open_timeout=20, close_timeout=5) as ws:
            replies = []
            for m in messages:
                ws.send(m)
                replies.append(ws.recv(timeout=10))
            return {"replies": replies}
    except InvalidStatus as exc:  # what websockets shows, and the body it kept
        return {"exception": str(exc), "status": exc.response.status_code,
                "body": exc.response.body.decode(errors="replace"),
                "error_header": exc.response.headers.get("X-Sealgate-Error")}
"""


def wss(w: World, path: str, host: str = HOST) -> str:
    return f"wss://{host}:{w.fake.port}{path}"


def clean(seen: Arrived) -> None:
    for name in PROXY_HEADERS:
        assert not seen.values(name), (name, seen.fields)


def test_plain_messages_both_ways(w: World) -> None:
    got = w.run(TALK, w.env("plain-1"), uri=wss(w, "/v1/socket?room=1"),
                     headers={"X-Trace": "t-3"}, messages=["hello", "again"]).ok()
    assert [json.loads(r)["got"] for r in got["replies"]] == ["hello", "again"]
    assert isinstance(w.fake, WebSocketFake)
    assert w.fake.messages == ["hello", "again"]
    seen = w.fake.last()
    assert seen.path == "/v1/socket?room=1"
    assert seen.headers["upgrade"].lower() == "websocket"
    assert seen.headers["x-trace"] == "t-3"
    clean(seen)
    assert w.fake.connections == 1


def test_broker_injects_into_the_handshake_and_masks_messages(w: World) -> None:
    got = w.run(TALK, w.env("broker-1"), uri=wss(w, "/v1/socket")).ok()
    assert w.fake.last().headers["authorization"] == f"Bearer {SECRET}"
    [reply] = got["replies"]
    assert SECRET not in reply
    assert json.loads(reply)["authorization"] == f"Bearer {masked(SECRET)}"


def test_token_in_the_handshake_headers(w: World) -> None:
    token = w.mint(BearerProcessor())
    got = w.run(TALK, w.env("tokens-1"), uri=wss(w, "/v1/socket"),
                     headers={"Proxy-Tokenizer": token}).ok()
    seen = w.fake.last()
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    clean(seen)
    assert json.loads(got["replies"][0])["authorization"] == f"Bearer {masked(SECRET)}"


def test_refused_handshake(w: World) -> None:
    """websockets' InvalidStatus says only the status; the reason is in the body it keeps."""
    got = w.run(TALK, w.env("plain-1"), uri=wss(w, "/v2/socket")).ok()
    print(got["exception"])
    assert got["exception"] == "server rejected WebSocket connection: HTTP 403"
    assert got["error_header"] == "not_allowed"
    assert "sealgate refused the request (not_allowed)" in got["body"]
    assert w.fake.untouched()


def test_refused_host(w: World) -> None:
    got = w.run(TALK, w.env("plain-1"), uri=wss(w, "/v1/socket", host=BLOCKED)).ok()
    assert (got.get("status"), got.get("error_header")) == (403, "not_allowed"), got
    assert BLOCKED in got["body"]
    assert w.fake.untouched()


def test_connection_scoped_token_in_the_proxy_credentials(w: World) -> None:
    token = w.mint(BearerProcessor())
    env = w.env("tokens-1", key=f"{KEYS['tokens-1']},{token}")
    got = w.run(TALK, env, uri=wss(w, "/v1/socket")).ok()
    assert w.fake.last().headers["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in json.dumps(got)


def test_base_url_mode(w: World) -> None:
    """ws:// to the proxy's /_/ prefix: a WebSocket upgrade in base-URL mode, wss upstream."""
    uri = w.base_url("/v1/socket").replace("http://", "ws://", 1)
    got = w.run(TALK, {}, uri=uri).ok()
    assert [json.loads(r)["got"] for r in got.get("replies", [])] == ["hello"], got
    seen = w.fake.last()
    assert (seen.path, seen.headers["host"]) == ("/v1/socket", w.authority)
    clean(seen)
