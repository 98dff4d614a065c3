"""The official anthropic SDK, unchanged, through a real proxy to a fake api.anthropic.com.

The SDK sends its key in `x-api-key`; the broker replaces a placeholder there and tokens write
that header. Each call runs in a fresh interpreter with exactly the environment `sealgate env`
printed (explicit mode), or only ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY (base-URL mode).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from sealgate.credentials.processors import HeaderProcessor
from tests.dnsstub import StubDNS
from tests.harness import OriginCA
from tests.sdk.kit import (
    PROXY_HEADERS,
    Arrived,
    Reply,
    World,
    masked,
    policy,
    refusal_visible,
    rule,
    rules_file,
    sse,
    world,
)

pytest.importorskip("anthropic",
                    reason="the anthropic SDK is not installed (pip install -e '.[test]')")

HOST = "api.anthropic.com"
BLOCKED = "console.anthropic.com"
SECRET = "sk-ant-api03-CANARY-anthropic-8c2d4e6f"
PLACEHOLDER = "sg-placeholder-anthropic"
KEYS = {"plain-1": "plain-key-anthropic-1", "broker-1": "broker-key-anthropic-1",
        "tokens-1": "tokens-key-anthropic-1"}
PATHS = ["/v1/messages"]
# Imported once by the module's forkserver (the SDK takes most of a second to import).
PRELOAD = ["anthropic", "anthropic.resources.messages", "anthropic.resources.models",
           "anthropic.lib.streaming"]


def rules(port: int) -> str:
    placeholder = f"{{type: placeholder, header: X-Api-Key, placeholder: {PLACEHOLDER}}}"
    return rules_file(
        [
            policy("plain", rule(HOST, [port], paths=PATHS, methods=["POST"])),
            policy("broker", rule(HOST, [port], paths=PATHS, inject=placeholder)),
            policy("tokens", rule(HOST, [port], paths=PATHS), tokens=True),
            policy("anon", rule(HOST, [port], paths=PATHS), tokens=True),
        ],
        {"plain-1": ("plain", KEYS["plain-1"]), "broker-1": ("broker", KEYS["broker-1"]),
         "tokens-1": ("tokens", KEYS["tokens-1"])},
        default="anon",
    )


MESSAGE = {"id": "msg_fake", "type": "message", "role": "assistant", "model": "claude-fake",
           "stop_reason": None, "stop_sequence": None,
           "usage": {"input_tokens": 1, "output_tokens": 1}}


def route(seen: Arrived) -> Reply:
    key = seen.headers.get("x-api-key", "")
    if seen.method == "POST" and seen.path.partition("?")[0] == "/v1/messages":
        if seen.json().get("stream"):
            def delta(text: str) -> tuple[str, object]:
                return ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                "delta": {"type": "text_delta", "text": text}})
            events: list[tuple[str | None, object]] = [
                ("message_start", {"type": "message_start", "message": {**MESSAGE,
                                                                         "content": []}}),
                ("content_block_start", {"type": "content_block_start", "index": 0,
                                         "content_block": {"type": "text", "text": ""}}),
                delta("you sent "), delta(key), delta(" ok"),
                ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                ("message_delta", {"type": "message_delta",
                                   "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                   "usage": {"output_tokens": 3}}),
                ("message_stop", {"type": "message_stop"}),
            ]
            return Reply(headers={"Content-Type": "text/event-stream"}, chunks=sse(events))
        return Reply(body={**MESSAGE, "stop_reason": "end_turn",
                           "content": [{"type": "text", "text": f"you sent {key}"}]})
    return Reply(404, {"type": "error", "error": {"type": "not_found_error",
                                                  "message": f"fake: no route {seen.path}"}})


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
      ) -> Iterator[World]:
    directory: Path = tmp_path_factory.mktemp("sdk-anthropic")
    with world(directory, test_ca, dns, [HOST, BLOCKED], route, rules, KEYS, SECRET,
               preload=PRELOAD) as made:
        yield made


@pytest.fixture(autouse=True)
def _fresh(w: World) -> None:
    w.fake.reset()


CREATE = """
def main(base_url=None, api_key=None, headers=None):
    import anthropic
    kwargs = {} if base_url is None else {"base_url": base_url, "api_key": api_key}
    client = anthropic.Anthropic(default_headers=headers, max_retries=0, timeout=15, **kwargs)
    done = client.messages.create(model="claude-fake", max_tokens=16,
                                  messages=[{"role": "user", "content": "hi"}])
    return [block.text for block in done.content]
"""

STREAM = """
def main(base_url=None, api_key=None, headers=None):
    import anthropic
    kwargs = {} if base_url is None else {"base_url": base_url, "api_key": api_key}
    client = anthropic.Anthropic(default_headers=headers, max_retries=0, timeout=15, **kwargs)
    with client.messages.stream(model="claude-fake", max_tokens=16,
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    return {"texts": texts, "final": [b.text for b in final.content],
            "stop": final.stop_reason}
"""

MODELS = """
def main(base_url, api_key):
    import anthropic
    client = anthropic.Anthropic(base_url=base_url, api_key=api_key, max_retries=0, timeout=15)
    return [m.id for m in client.models.list()]
"""


def clean(seen: Arrived) -> None:
    for name in PROXY_HEADERS:
        assert not seen.values(name), (name, seen.fields)


def test_plain_request_arrives_as_sent(w: World) -> None:
    texts = w.run(CREATE, w.env("plain-1"), base_url=w.url(),
                       api_key="sk-ant-dummy-plain").ok()
    assert texts == ["you sent sk-ant-dummy-plain"]
    seen = w.fake.last()
    assert (seen.method, seen.path) == ("POST", "/v1/messages")
    assert seen.headers["x-api-key"] == "sk-ant-dummy-plain"
    assert "anthropic-version" in seen.headers
    assert seen.json()["messages"] == [{"role": "user", "content": "hi"}]
    assert seen.headers["host"] == w.authority
    clean(seen)
    assert (len(w.fake.requests), w.fake.connections) == (1, 1)


def test_broker_replaces_the_placeholder_and_masks_the_echo(w: World) -> None:
    texts = w.run(CREATE, w.env("broker-1"), base_url=w.url(), api_key=PLACEHOLDER).ok()
    seen = w.fake.last()
    assert seen.headers["x-api-key"] == SECRET
    clean(seen)
    assert texts == [f"you sent {masked(SECRET)}"]


def test_token_in_default_headers(w: World) -> None:
    token = w.mint(HeaderProcessor(header="X-Api-Key", format="{secret}"))
    texts = w.run(CREATE, w.env("tokens-1"), base_url=w.url(), api_key="sk-ant-dummy",
                       headers={"Proxy-Tokenizer": token}).ok()
    seen = w.fake.last()
    assert seen.values("x-api-key") == [SECRET]
    clean(seen)
    assert texts == [f"you sent {masked(SECRET)}"]


def test_stream_arrives_in_events_with_the_secret_masked(w: World) -> None:
    got = w.run(STREAM, w.env("broker-1"), base_url=w.url(), api_key=PLACEHOLDER).ok()
    assert w.fake.last().headers["x-api-key"] == SECRET
    assert got["texts"] == ["you sent ", masked(SECRET), " ok"]
    assert got["final"] == [f"you sent {masked(SECRET)} ok"]
    assert got["stop"] == "end_turn"
    assert SECRET not in json.dumps(got)


def test_refused_request_shows_the_reason_in_the_sdk_exception(w: World) -> None:
    out = w.run(MODELS, w.env("plain-1"), base_url=w.url(), api_key="sk-ant-dummy")
    assert out.exception == "anthropic.PermissionDeniedError", out.detail
    print(out.text)
    refusal_visible(out.raised(), "not_allowed")
    assert w.fake.untouched()


def test_refused_host_shows_the_reason_in_the_sdk_exception(w: World) -> None:
    out = w.run(CREATE, w.env("plain-1"), base_url=w.url(host=BLOCKED),
                     api_key="sk-ant-dummy")
    assert out.exception == "anthropic.PermissionDeniedError", out.detail
    print(out.text)
    refusal_visible(out.raised(), "not_allowed")
    assert BLOCKED in out.text
    assert w.fake.untouched()


def test_base_url_mode_needs_no_proxy_and_no_ca(w: World) -> None:
    env = {"ANTHROPIC_BASE_URL": w.base_url(), "ANTHROPIC_API_KEY": "sk-ant-dummy-base"}
    assert w.run(CREATE, env).ok() == ["you sent sk-ant-dummy-base"]
    seen = w.fake.last()
    assert seen.path == "/v1/messages"
    assert seen.headers["host"] == w.authority
    clean(seen)
    line = w.proxy.wait_audit(lambda e: e.get("path") == "/v1/messages" and e.get("base_url"))
    assert (line["decision"], line["policy"]) == ("allow", "anon")


def test_base_url_mode_streams_with_a_token_in_the_url(w: World) -> None:
    token = w.mint(HeaderProcessor(header="X-Api-Key", format="{secret}"))
    env = {"ANTHROPIC_BASE_URL": w.base_url(tokens=[token]), "ANTHROPIC_API_KEY": "sk-ant-x"}
    got = w.run(STREAM, env).ok()
    assert w.fake.last().values("x-api-key") == [SECRET]
    assert got["texts"] == ["you sent ", masked(SECRET), " ok"]


def test_connection_scoped_token_in_the_proxy_credentials(w: World) -> None:
    token = w.mint(HeaderProcessor(header="X-Api-Key", format="{secret}"))
    env = w.env("tokens-1", key=f"{KEYS['tokens-1']},{token}")
    texts = w.run(CREATE, env, base_url=w.url(), api_key="sk-ant-dummy").ok()
    assert w.fake.last().values("x-api-key") == [SECRET]
    assert texts == [f"you sent {masked(SECRET)}"]
