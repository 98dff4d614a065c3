"""Node 20's built-in fetch, unchanged, through a real proxy to a fake HTTPS API.

Node 20's fetch ignores HTTPS_PROXY (NODE_USE_ENV_PROXY, which `sealgate env` sets, is Node
24's), so it goes through the proxy in base-URL mode: plain HTTP to `http://<proxy>/_/<host>`,
no proxy support and no CA in the client, verified TLS from the proxy on. A sealed token rides
in the base URL; the sandbox's key, where it has one, in a Proxy-Authorization header.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sealgate.credentials.processors import BearerProcessor
from tests.dnsstub import StubDNS
from tests.harness import OriginCA
from tests.sdk.kit import (
    PROXY_HEADERS,
    Arrived,
    Reply,
    World,
    basic,
    echo,
    free_port,
    masked,
    policy,
    rule,
    rules_file,
    run_node,
    sse,
    world,
)

NODE = "/usr/bin/node"
if shutil.which(NODE) is None:
    pytest.skip("needs node (/usr/bin/node)", allow_module_level=True)
_VERSION = subprocess.run([NODE, "--version"], capture_output=True, text=True, timeout=10,
                          check=False).stdout.strip()
_MAJOR = int(_VERSION[1:].split(".")[0]) if _VERSION[1:2].isdigit() else 0
if _MAJOR < 20:
    pytest.skip(f"needs node 20 or later for fetch (found {_VERSION!r})", allow_module_level=True)

HOST = "api.node.test"
BLOCKED = "blocked.node.test"
SECRET = "node-CANARY-secret-2c4e6a8b0d"
KEYS = {"broker-1": "broker-key-node-1"}
PATHS = ["/v1/**"]


def rules(port: int) -> str:
    return rules_file(
        [
            policy("broker", rule(HOST, [port], paths=PATHS, inject="bearer")),
            policy("anon", rule(HOST, [port], paths=PATHS, methods=["GET", "POST"]),
                   tokens=True),
        ],
        {"broker-1": ("broker", KEYS["broker-1"])},
        default="anon",
    )


def route(seen: Arrived) -> Reply:
    if seen.path.startswith("/v1/events"):
        auth = seen.headers.get("authorization", "")
        return Reply(headers={"Content-Type": "text/event-stream"},
                     chunks=sse([("tick", {"n": 1}), ("echo", {"auth": auth}),
                                 ("tick", {"n": 2})]))
    return Reply(body={**echo(seen), "body": seen.body.decode(errors="replace")})


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
      ) -> Iterator[World]:
    directory: Path = tmp_path_factory.mktemp("sdk-node")
    with world(directory, test_ca, dns, [HOST, BLOCKED], route, rules, KEYS, SECRET) as made:
        yield made


@pytest.fixture(autouse=True)
def _fresh(w: World) -> None:
    w.fake.reset()


FETCH = """
async function main({url, method = "GET", headers = {}, body = null}) {
  const r = await fetch(url, {method, headers, body, signal: AbortSignal.timeout(15000)});
  return {status: r.status, text: await r.text(), error_header: r.headers.get("x-sealgate-error")};
}
"""

STREAM = """
async function main({url}) {
  const r = await fetch(url, {signal: AbortSignal.timeout(15000)});
  const decoder = new TextDecoder();
  const chunks = [];
  for await (const chunk of r.body) chunks.push(decoder.decode(chunk, {stream: true}));
  return {status: r.status, type: r.headers.get("content-type"), text: chunks.join("")};
}
"""


def clean(seen: Arrived) -> None:
    for name in PROXY_HEADERS:
        assert not seen.values(name), (name, seen.fields)


FROM_ENV = """
async function main({upstream, method, headers, body}) {
  const r = await fetch(process.env.SEALGATE_BASE_URL + upstream,
                        {method, headers, body, signal: AbortSignal.timeout(15000)});
  return {status: r.status, text: await r.text()};
}
"""


def test_base_url_mode_plain(w: World) -> None:
    """With exactly what `sealgate env` prints (no sandbox): the script writes its URL after
    $SEALGATE_BASE_URL."""
    got = run_node(FROM_ENV, w.env(None), upstream=f"{w.authority}/v1/things?a=1",
                   method="POST", headers={"Content-Type": "application/json", "X-Trace": "t-5"},
                   body='{"x":1}').ok()
    assert got["status"] == 200, got
    seen = w.fake.last()
    assert (seen.method, seen.path, seen.body) == ("POST", "/v1/things?a=1", b'{"x":1}')
    assert seen.headers["host"] == w.authority
    assert seen.headers["x-trace"] == "t-5"
    assert seen.headers["user-agent"] == "node"
    clean(seen)
    line = w.proxy.wait_audit(lambda e: e.get("path") == "/v1/things" and e.get("base_url"))
    assert (line["decision"], line["policy"], line["scheme"]) == ("allow", "anon", "https")


def test_base_url_mode_token_in_the_path(w: World) -> None:
    token = w.mint(BearerProcessor())
    got = run_node(FETCH, {}, url=w.base_url("/v1/token", tokens=[token])).ok()
    assert got["status"] == 200, got
    seen = w.fake.last()
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    clean(seen)
    assert SECRET not in got["text"]
    assert json.loads(got["text"])["authorization"] == f"Bearer {masked(SECRET)}"


def test_base_url_mode_sandbox_key_in_proxy_authorization(w: World) -> None:
    """The sandbox's identity in base-URL mode: its key in a Proxy-Authorization header (fetch
    sends it as given); its policy's broker then injects."""
    got = run_node(FETCH, {}, url=w.base_url("/v1/broker"),
                   headers={"Proxy-Authorization": basic("broker-1", KEYS["broker-1"])}).ok()
    assert got["status"] == 200, got
    seen = w.fake.last()
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    clean(seen)
    assert json.loads(got["text"])["authorization"] == f"Bearer {masked(SECRET)}"
    line = w.proxy.wait_audit(lambda e: e.get("path") == "/v1/broker")
    assert (line["sandbox"], line["policy"]) == ("broker-1", "broker")


def test_base_url_mode_streams_masked(w: World) -> None:
    token = w.mint(BearerProcessor())
    got = run_node(STREAM, {}, url=w.base_url("/v1/events", tokens=[token])).ok()
    assert (got["status"], got["type"]) == (200, "text/event-stream")
    assert got["text"] == (
        'event: tick\ndata: {"n": 1}\n\n'
        f'event: echo\ndata: {{"auth": "Bearer {masked(SECRET)}"}}\n\n'
        'event: tick\ndata: {"n": 2}\n\n'
    )


def test_base_url_mode_refusal(w: World) -> None:
    """fetch does not throw on a 403: the refusal is the JSON body the SDKs read."""
    got = run_node(FETCH, {}, url=w.base_url("/v1/x"), method="DELETE").ok()
    assert (got["status"], got["error_header"]) == (403, "not_allowed")
    body = json.loads(got["text"])
    assert (body["error"]["type"], body["error"]["code"]) == ("egress_denied", "not_allowed")
    assert body["error"]["message"].startswith("sealgate refused the request (not_allowed)")
    assert w.fake.untouched()
    got = run_node(FETCH, {}, url=w.base_url("/v1/x", host=BLOCKED)).ok()
    assert (got["status"], got["error_header"]) == (403, "not_allowed")
    assert w.fake.untouched()


@pytest.mark.skipif(_MAJOR >= 24, reason="Node 24+ honours the proxy variables "
                    "(NODE_USE_ENV_PROXY): this is Node 20's limit")
def test_node_20_fetch_ignores_the_proxy_variables(w: World) -> None:
    """Why base-URL mode: with everything `sealgate env` prints, Node 20's fetch still dials
    the origin itself (here 127.0.0.2, where nothing listens) and never the proxy."""
    env = w.env("broker-1")
    assert env["HTTPS_PROXY"].endswith(f"@127.0.0.1:{w.proxy.port}")
    assert env["NODE_USE_ENV_PROXY"] == "1"
    port = free_port()
    before = len(w.proxy.audit())
    out = run_node(FETCH, env, url=f"https://127.0.0.2:{port}/v1/x")
    assert out.exception == "TypeError", out.text
    assert "fetch failed" in out.text
    assert "ECONNREFUSED" in out.text
    assert not [e for e in w.proxy.audit()[before:] if e.get("host") == "127.0.0.2"]
