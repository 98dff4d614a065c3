"""grpcio, unchanged, through a real proxy to a fake gRPC service over TLS (HTTP/2).

grpc's C core reads the proxy from the lower-case `https_proxy` (credentials included) and its
roots from GRPC_DEFAULT_SSL_ROOTS_FILE_PATH: both from the environment `sealgate env` printed.
The service is one generic unary method with raw bytes in and out (no protoc): it answers with
the message it got and the `authorization` metadata it saw, so a test sees whether the proxy
masked a secret inside a gRPC response.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent import futures
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
    refusal_visible,
    rule,
    rules_file,
    world,
)

grpc = pytest.importorskip("grpc", reason="grpcio is not installed (pip install -e '.[test]')")

HOST = "grpc.sdk.test"
BLOCKED = "blocked.grpc.sdk.test"
SECRET = "grpc-CANARY-secret-9b8a7c6d5e"
KEYS = {"plain-1": "plain-key-grpc-1", "broker-1": "broker-key-grpc-1",
        "tokens-1": "tokens-key-grpc-1"}
SERVICE = "sealgate.test.Echo"
PATHS = [f"/{SERVICE}/Call"]


def rules(port: int) -> str:
    return rules_file(
        [
            policy("plain", rule(HOST, [port], paths=PATHS, methods=["POST"])),
            policy("broker", rule(HOST, [port], paths=PATHS, inject="bearer")),
            policy("tokens", rule(HOST, [port], paths=PATHS), tokens=True),
            policy("anon", rule(HOST, [port], paths=PATHS), tokens=True),
        ],
        {"plain-1": ("plain", KEYS["plain-1"]), "broker-1": ("broker", KEYS["broker-1"]),
         "tokens-1": ("tokens", KEYS["tokens-1"])},
        default="anon",
    )


class GrpcFake:
    """A grpc server on 127.0.0.1 with TLS from the test CA; every call recorded as an Arrived
    (method POST, the RPC's path, its metadata as fields, the request message as body)."""

    def __init__(self, ca: OriginCA, names: list[str]) -> None:
        self.names = tuple(names)
        self.requests: list[Arrived] = []
        self.connections = 0  # calls, for grpc keeps its connections to itself
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {name: grpc.unary_unary_rpc_method_handler(self._method(f"/{SERVICE}/{name}"))
                    for name in ("Call", "Other")}
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers),))
        cert, key = ca.issue(*names)
        credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
        self.port = int(self.server.add_secure_port("127.0.0.1:0", credentials))
        self.server.start()

    def _method(self, path: str) -> Any:
        def call(request: bytes, context: Any) -> bytes:
            metadata = [(k, v if isinstance(v, str) else v.decode("latin-1"))
                        for k, v in context.invocation_metadata()]
            with self._lock:
                self.connections += 1
                self.requests.append(Arrived("POST", path, metadata, request, self.connections))
            auth = dict(metadata).get("authorization")
            return json.dumps({"got": request.decode(), "authorization": auth}).encode()

        return call

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.connections = 0

    def untouched(self) -> bool:
        return self.connections == 0 and not self.requests

    def last(self) -> Arrived:
        assert self.requests, "no call reached the fake"
        return self.requests[-1]

    def stop(self) -> None:
        self.server.stop(grace=None)


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
      ) -> Iterator[World]:
    directory: Path = tmp_path_factory.mktemp("sdk-grpc")
    fake = GrpcFake(test_ca, [HOST, BLOCKED])
    with world(directory, test_ca, dns, [HOST, BLOCKED], None, rules, KEYS, SECRET,
               fake=fake) as made:
        yield made


@pytest.fixture(autouse=True)
def _fresh(w: World) -> None:
    w.fake.reset()


CALL = """
def main(target, method="Call", metadata=None, messages=("hello",)):
    import grpc
    credentials = grpc.ssl_channel_credentials()  # roots: GRPC_DEFAULT_SSL_ROOTS_FILE_PATH
    with grpc.secure_channel(target, credentials) as channel:
        call = channel.unary_unary(f"/sealgate.test.Echo/{method}")
        try:
            return {"replies": [call(m.encode(), timeout=10,
                                     metadata=[tuple(x) for x in metadata or ()]).decode()
                                for m in messages]}
        except grpc.RpcError as exc:
            return {"exception": str(exc), "code": exc.code().name, "details": exc.details(),
                    "trailing": [list(m) for m in exc.trailing_metadata() or ()]}
"""


def clean(seen: Arrived) -> None:
    for name in PROXY_HEADERS:
        assert not seen.values(name), (name, seen.fields)


def test_plain_calls_arrive_as_sent(w: World) -> None:
    got = w.run(CALL, w.env("plain-1"), target=w.authority, messages=["hello", "again"],
                     metadata=[["x-trace", "t-4"]]).ok()
    assert [json.loads(r)["got"] for r in got["replies"]] == ["hello", "again"], got
    assert [(r.path, r.body) for r in w.fake.requests] == [
        (f"/{SERVICE}/Call", b"hello"), (f"/{SERVICE}/Call", b"again")]
    seen = w.fake.last()
    assert seen.headers["x-trace"] == "t-4"
    assert seen.headers["user-agent"].startswith("grpc-python/")
    clean(seen)


def test_broker_injects_metadata_and_masks_the_response(w: World) -> None:
    got = w.run(CALL, w.env("broker-1"), target=w.authority).ok()
    assert w.fake.last().headers["authorization"] == f"Bearer {SECRET}"
    [reply] = got["replies"]
    assert SECRET not in reply
    assert json.loads(reply)["authorization"] == f"Bearer {masked(SECRET)}"


def test_token_in_call_metadata(w: World) -> None:
    token = w.mint(BearerProcessor())
    got = w.run(CALL, w.env("tokens-1"), target=w.authority,
                     metadata=[["proxy-tokenizer", token]]).ok()
    seen = w.fake.last()
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    clean(seen)
    assert json.loads(got["replies"][0])["authorization"] == f"Bearer {masked(SECRET)}"


def test_refused_method(w: World) -> None:
    """A refusal in gRPC's terms (grpc-status 7, the message in grpc-message): the reason is
    in grpc's own exception."""
    got = w.run(CALL, w.env("plain-1"), target=w.authority, method="Other").ok()
    print(got["exception"])
    assert got["code"] == "PERMISSION_DENIED", got
    refusal_visible(got["exception"], "not_allowed")
    assert got["details"].startswith("sealgate refused the request (not_allowed): POST ")
    assert f"/{SERVICE}/Other" in got["details"]
    assert w.fake.untouched()


def test_refused_host(w: World) -> None:
    got = w.run(CALL, w.env("plain-1"), target=f"{BLOCKED}:{w.fake.port}").ok()
    print(got["exception"])
    assert got["code"] == "PERMISSION_DENIED", got
    refusal_visible(got["exception"], "not_allowed")
    assert BLOCKED in got["details"]
    assert w.fake.untouched()


def test_a_token_that_fails_is_refused_in_grpc_terms(w: World) -> None:
    token = w.mint(BearerProcessor(), host="grpc.elsewhere.test")
    got = w.run(CALL, w.env("tokens-1"), target=w.authority,
                metadata=[["proxy-tokenizer", token]]).ok()
    assert got["code"] == "PERMISSION_DENIED", got
    refusal_visible(got["exception"], "token_scope")
    assert w.fake.untouched()


def test_connection_scoped_token_in_the_proxy_credentials(w: World) -> None:
    token = w.mint(BearerProcessor())
    env = w.env("tokens-1", key=f"{KEYS['tokens-1']},{token}")
    got = w.run(CALL, env, target=w.authority, messages=["a", "b"]).ok()
    assert [r.values("authorization") for r in w.fake.requests] == [[f"Bearer {SECRET}"]] * 2
    assert SECRET not in json.dumps(got)
