"""Upstream connections kept between tool calls (mcp/pool.py, issue 29's benchmark), seen from
a real HTTPS origin on loopback that numbers the connections it accepts: one sandbox's calls
ride one connection; two sandboxes never share one; a DNS answer that changed between two
calls sends the second to the new address, on a new connection, not down the old one.
"""

from __future__ import annotations

import http.server
import itertools
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KEYS
from tests.dnsstub import StubDNS
from tests.harness import OriginCA, key_digest
from tests.mcpkit import McpServer, basic, needs_mcp_venv

pytestmark = needs_mcp_venv()

CANARY = "pool-canary-4c1e9a"
BOT = basic("bot-1", KEYS["bot-1"])
REP = basic("rep-1", KEYS["rep-1"])
ADDRESSES = ("127.0.0.1", "127.0.0.2")
NAMES = ("one.pool.test", "two.pool.test", "pin.pool.test")


@dataclass(frozen=True)
class Hit:
    address: str  # the origin's address the request came in on
    connection: int  # the number of the connection it came on (each accept a new number)
    host: str


class Twin:
    """One HTTPS origin, the same port on two loopback addresses, numbering connections."""

    def __init__(self, cert: tuple[Path, Path]) -> None:
        self.hits: list[Hit] = []
        self._lock = threading.Lock()
        self._numbers = itertools.count(1)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(cert[0]), str(cert[1]))
        self.servers: list[http.server.ThreadingHTTPServer] = []
        for _ in range(20):  # a port free on both addresses
            first = self._serve(ADDRESSES[0], 0, context)
            try:
                second = self._serve(ADDRESSES[1], first.server_address[1], context)
            except OSError:
                first.server_close()
                continue
            self.servers = [first, second]
            break
        assert self.servers, "no port free on both loopback addresses"
        self.port = int(self.servers[0].server_address[1])
        for server in self.servers:
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def _serve(self, address: str, port: int, context: ssl.SSLContext
               ) -> http.server.ThreadingHTTPServer:
        twin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # kept alive unless told otherwise

            def setup(self) -> None:
                super().setup()
                self.number = next(twin._numbers)

            def do_GET(self) -> None:
                hit = Hit(address, self.number, self.headers.get("host", ""))
                with twin._lock:
                    twin.hits.append(hit)
                body = json.dumps({"address": hit.address, "connection": hit.connection,
                                   "authorization": self.headers.get("authorization")}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = http.server.ThreadingHTTPServer((address, port), Handler)
        server.daemon_threads = True
        server.socket = context.wrap_socket(server.socket, server_side=True)
        return server

    def of(self, host: str) -> list[Hit]:
        with self._lock:
            return [hit for hit in self.hits if hit.host.partition(":")[0] == host]

    def stop(self) -> None:
        for server in self.servers:
            server.shutdown()
            server.server_close()


def rules(port: int) -> str:
    tools = "".join(f"""
      - name: {name.partition('.')[0]}
        description: The origin, as {name}.
        method: GET
        url: https://{name}:{port}/x
        credential: api""" for name in NAMES)
    return f"""
version: 1
policies:
  ci:
    allow:
      - host: "*.pool.test"
        ports: [{port}]
        inject:
          - {{secret: "file:api", as: bearer, name: api}}
    allow_networks: [127.0.0.0/8]
    tools:{tools}
sandboxes:
  bot-1: {{policy: ci, key_sha256: "{key_digest(KEYS['bot-1'])}"}}
  rep-1: {{policy: ci, key_sha256: "{key_digest(KEYS['rep-1'])}"}}
default_policy: null
"""


@pytest.fixture(scope="module")
def twin(test_ca: OriginCA) -> Iterator[Twin]:
    started = Twin(test_ca.issue(*NAMES))
    yield started
    started.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, twin: Twin, dns: StubDNS,
           test_ca: OriginCA) -> Iterator[McpServer]:
    dns.set("one.pool.test", "A 127.0.0.1")
    dns.set("two.pool.test", "A 127.0.0.1")
    started = McpServer(tmp_path_factory.mktemp("mcp-pool"), rules(twin.port),
                        resolver=dns.address, upstream_ca=test_ca.path,
                        secrets={"api": CANARY})
    yield started
    started.stop()
    assert CANARY not in started.audit_text() + started.stderr()
    assert "Traceback" not in started.stderr(), started.stderr()


def _calls(server: McpServer, authorization: str, *steps: dict[str, Any]) -> list[Any]:
    answer, printed = server.client(list(steps), authorization)
    assert CANARY not in printed
    results = [step["result"] for step in answer["steps"] if "result" in step]
    assert all(not r["is_error"] for r in results), results
    return [r["structured"] for r in results]


def test_a_sandboxs_calls_ride_one_kept_connection(server: McpServer, twin: Twin) -> None:
    _calls(server, BOT, {"call": "one"}, {"call": "one"})
    _calls(server, BOT, {"call": "one"})  # another client, later: the server kept it
    hits = twin.of("one.pool.test")
    assert len(hits) == 3
    assert len({hit.connection for hit in hits}) == 1, hits


def test_two_sandboxes_never_share_a_connection(server: McpServer, twin: Twin) -> None:
    first = _calls(server, BOT, {"call": "two"})
    second = _calls(server, REP, {"call": "two"})
    again = _calls(server, BOT, {"call": "two"}) + _calls(server, REP, {"call": "two"})
    # The bearer is the policy's, the same for both: the connection is what differs.
    assert first[0]["authorization"] == second[0]["authorization"]
    assert first[0]["authorization"].startswith("Bearer [REDACTED]")
    bots = {first[0]["connection"], again[0]["connection"]}
    reps = {second[0]["connection"], again[1]["connection"]}
    assert len(bots) == 1 and len(reps) == 1, (bots, reps)  # each kept its own
    assert bots.isdisjoint(reps), twin.of("two.pool.test")


def test_a_changed_dns_answer_is_a_new_connection_to_the_new_address(
        server: McpServer, twin: Twin, dns: StubDNS) -> None:
    # The guard's resolver keeps an answer at least a second: the pause lets it ask again.
    dns.sequence("pin.pool.test", ["A 127.0.0.1"], ["A 127.0.0.2"], ttl=0)
    first, second = _calls(server, BOT, {"call": "pin"}, {"sleep": 1.5}, {"call": "pin"})
    assert first["address"] == "127.0.0.1" and second["address"] == "127.0.0.2"
    assert first["connection"] != second["connection"]
    addresses = [line["address"] for line in server.calls() if line["tool"] == "pin"]
    assert addresses[-2:] == ["127.0.0.1", "127.0.0.2"]  # what the guard pinned, each time
