"""The official openai SDK, unchanged, through a real proxy to a fake api.openai.com.

Each call runs in a fresh interpreter whose whole environment is what `sealgate env` printed
(explicit mode), or only OPENAI_BASE_URL and OPENAI_API_KEY (base-URL mode: no proxy, no CA).
"""

from __future__ import annotations

import json
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
    echo,
    masked,
    policy,
    refusal_visible,
    rule,
    rules_file,
    sse,
    world,
)

pytest.importorskip("openai", reason="the openai SDK is not installed (pip install -e '.[test]')")

HOST = "api.openai.com"
BLOCKED = "files.openai.com"  # resolves to the fake too, but no rule names it
SECRET = "sk-proj-CANARY-openai-5e1f0a9c7b3d"
PLACEHOLDER = "sg-placeholder-openai"
KEYS = {"plain-1": "plain-key-openai-1", "broker-1": "broker-key-openai-1",
        "tokens-1": "tokens-key-openai-1"}
PATHS = ["/v1/models", "/v1/models/*", "/v1/chat/completions"]
PAUSE = 0.8  # seconds the fake's stream stops for after the chunk echoing the credential
# Imported once by the module's forkserver (the SDK takes most of a second to import).
PRELOAD = ["openai", "openai.resources.chat", "openai.resources.models",
           "openai.resources.embeddings"]


def rules(port: int) -> str:
    placeholder = f"{{type: placeholder, header: Authorization, placeholder: {PLACEHOLDER}}}"
    return rules_file(
        [
            policy("plain", rule(HOST, [port], paths=PATHS)),
            policy("broker", rule(HOST, [port], paths=PATHS, inject=placeholder)),
            policy("tokens", rule(HOST, [port], paths=PATHS), tokens=True),
            policy("anon", rule(HOST, [port], paths=PATHS), tokens=True),
        ],
        {"plain-1": ("plain", KEYS["plain-1"]), "broker-1": ("broker", KEYS["broker-1"]),
         "tokens-1": ("tokens", KEYS["tokens-1"])},
        default="anon",
    )


def completion_chunk(delta: dict[str, str], finish: str | None = None) -> dict[str, object]:
    return {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
            "model": "gpt-fake", "choices": [{"index": 0, "delta": delta,
                                              "finish_reason": finish}]}


def route(seen: Arrived) -> Reply:
    auth = seen.headers.get("authorization", "")
    path = seen.path.partition("?")[0]
    if seen.method == "GET" and path == "/v1/models":
        return Reply(body={"object": "list", "data": [
            {"id": "gpt-fake", "object": "model", "created": 0, "owned_by": "sealgate-test"}]})
    if seen.method == "GET" and path.startswith("/v1/models/"):
        return Reply(body={"id": path.rsplit("/", 1)[1], "object": "model", "created": 0,
                           "owned_by": auth, "echo": echo(seen)})
    if seen.method == "POST" and path == "/v1/chat/completions":
        if seen.json()["messages"][-1]["content"] == "split":  # the echo over two events
            half = len(auth) // 2
            return Reply(headers={"Content-Type": "text/event-stream"}, chunks=sse([
                (None, completion_chunk({"role": "assistant", "content": auth[:half]})),
                (None, completion_chunk({"content": auth[half:]})),
                (None, completion_chunk({}, finish="stop")), (None, "[DONE]")]))
        if seen.json().get("stream"):
            events: list[tuple[str | None, object]] = [
                (None, completion_chunk({"role": "assistant", "content": ""})),
                (None, completion_chunk({"content": "you sent "})),
                (None, completion_chunk({"content": auth})),
            ]
            rest: list[tuple[str | None, object]] = [
                (None, completion_chunk({"content": " ok"})),
                (None, completion_chunk({}, finish="stop")),
                (None, "[DONE]"),
            ]
            # A pause before the rest: what came before it must reach the SDK before it ends.
            return Reply(headers={"Content-Type": "text/event-stream"},
                         chunks=[*sse(events), PAUSE, *sse(rest)])
        return Reply(body={
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 0,
            "model": "gpt-fake",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"you sent {auth}"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        })
    return Reply(404, {"error": {"message": f"fake: no route {seen.method} {path}"}})


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
      ) -> Iterator[World]:
    directory: Path = tmp_path_factory.mktemp("sdk-openai")
    with world(directory, test_ca, dns, [HOST, BLOCKED], route, rules, KEYS, SECRET,
               preload=PRELOAD) as made:
        yield made


@pytest.fixture(autouse=True)
def _fresh(w: World) -> None:
    w.fake.reset()


LIST_MODELS = """
def main(base_url, api_key, headers=None):
    import openai
    client = openai.OpenAI(api_key=api_key, base_url=base_url, default_headers=headers,
                           max_retries=0, timeout=15)
    return [m.id for m in client.models.list()]
"""

RETRIEVE = """
def main(base_url, api_key, headers=None):
    import openai
    client = openai.OpenAI(api_key=api_key, base_url=base_url, default_headers=headers,
                           max_retries=0, timeout=15)
    return client.models.retrieve("gpt-fake").to_dict()
"""

CHAT = """
def main(base_url=None, api_key=None, headers=None):
    import openai
    kwargs = {} if base_url is None else {"base_url": base_url, "api_key": api_key}
    client = openai.OpenAI(default_headers=headers, max_retries=0, timeout=15, **kwargs)
    done = client.chat.completions.create(
        model="gpt-fake", messages=[{"role": "user", "content": "hi"}])
    return done.choices[0].message.content
"""

STREAM = """
def main(base_url=None, api_key=None, headers=None, say="hi"):
    import openai
    kwargs = {} if base_url is None else {"base_url": base_url, "api_key": api_key}
    client = openai.OpenAI(default_headers=headers, max_retries=0, timeout=15, **kwargs)
    stream = client.chat.completions.create(
        model="gpt-fake", messages=[{"role": "user", "content": say}], stream=True)
    import time
    seen = [(chunk.choices[0].delta.content, time.monotonic()) for chunk in stream]
    return {"deltas": [d for d, _ in seen], "at": [t - seen[0][1] for _, t in seen]}
"""

EMBED = """
def main(base_url, api_key):
    import openai
    client = openai.OpenAI(api_key=api_key, base_url=base_url, max_retries=0, timeout=15)
    client.embeddings.create(model="text-embedding-fake", input="hi")
"""

BASE_URL_LIST = """
def main():
    import openai
    client = openai.OpenAI(max_retries=0, timeout=15)  # OPENAI_BASE_URL, OPENAI_API_KEY
    return [m.id for m in client.models.list()]
"""


def clean(seen: Arrived) -> None:
    """Nothing meant for the proxy reached the API."""
    for name in PROXY_HEADERS:
        assert not seen.values(name), (name, seen.fields)


# -- 1. plain --------------------------------------------------------------------------------


def test_plain_request_arrives_as_sent(w: World) -> None:
    got = w.run(LIST_MODELS, w.env("plain-1"), base_url=w.url("/v1"),
                     api_key="sk-dummy-plain").ok()
    assert got == ["gpt-fake"]
    seen = w.fake.last()
    assert (seen.method, seen.path) == ("GET", "/v1/models")
    assert seen.headers["authorization"] == "Bearer sk-dummy-plain"
    assert seen.headers["user-agent"].startswith("OpenAI/Python")
    assert seen.headers["host"] == w.authority
    clean(seen)
    assert (len(w.fake.requests), w.fake.connections) == (1, 1)
    line = w.proxy.wait_audit(lambda e: e.get("path") == "/v1/models"
                              and e.get("sandbox") == "plain-1")
    assert (line["decision"], line["policy"]) == ("allow", "plain")


# -- 2. broker placeholder, echo scrubbed ------------------------------------------------------


def test_broker_replaces_the_placeholder_and_masks_the_echo(w: World) -> None:
    content = w.run(CHAT, w.env("broker-1"), base_url=w.url("/v1"),
                         api_key=PLACEHOLDER).ok()
    seen = w.fake.last()
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    assert json.loads(seen.body)["messages"] == [{"role": "user", "content": "hi"}]
    clean(seen)
    assert SECRET not in content
    assert content == f"you sent Bearer {masked(SECRET)}"


# -- 3. a sealed token per request in default_headers -------------------------------------------


def test_token_in_default_headers(w: World) -> None:
    token = w.mint(BearerProcessor())
    model = w.run(RETRIEVE, w.env("tokens-1"), base_url=w.url("/v1"),
                       api_key="sk-dummy-token", headers={"Proxy-Tokenizer": token}).ok()
    seen = w.fake.last()
    assert seen.path == "/v1/models/gpt-fake"
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    clean(seen)
    assert SECRET not in json.dumps(model)
    assert model["owned_by"] == f"Bearer {masked(SECRET)}"


# -- 4. streaming ----------------------------------------------------------------------------


def test_stream_arrives_in_chunks_with_the_secret_masked(w: World) -> None:
    got = w.run(STREAM, w.env("broker-1"), base_url=w.url("/v1"), api_key=PLACEHOLDER).ok()
    assert w.fake.last().headers["authorization"] == f"Bearer {SECRET}"
    assert got["deltas"] == ["", "you sent ", f"Bearer {masked(SECRET)}", " ok", None]
    # The scrubbed chunk was passed on as it came, not held back until the stream ended.
    assert got["at"][3] - got["at"][2] >= PAUSE / 2, got["at"]
    line = w.proxy.wait_audit(lambda e: e.get("path") == "/v1/chat/completions"
                              and e.get("sandbox") == "broker-1" and e.get("scrubbed"))
    assert line["scrubbed"] >= 1


@pytest.mark.xfail(strict=True, reason=(
    "limitation of byte-level scrubbing, like a secret split across two WebSocket messages "
    "(docs/architecture.md): an upstream that echoes the secret over two SSE events has JSON "
    "framing between the halves, so neither half is the needle, and the SDK joins them"))
def test_a_secret_split_across_two_stream_events_is_masked(w: World) -> None:
    got = w.run(STREAM, w.env("broker-1"), base_url=w.url("/v1"), api_key=PLACEHOLDER,
                say="split").ok()
    assert w.fake.last().headers["authorization"] == f"Bearer {SECRET}"
    assert SECRET not in "".join(d or "" for d in got["deltas"])


# -- 5. refusals -----------------------------------------------------------------------------


def test_refused_path_shows_the_reason_in_the_sdk_exception(w: World) -> None:
    out = w.run(EMBED, w.env("plain-1"), base_url=w.url("/v1"), api_key="sk-dummy")
    assert out.exception == "openai.PermissionDeniedError", out.detail
    print(out.text)
    refusal_visible(out.raised(), "not_allowed")
    assert "POST" in out.text
    assert w.fake.untouched()


def test_refused_host_shows_the_reason_in_the_sdk_exception(w: World) -> None:
    """A host no rule names: the CONNECT gets 200, the proxy answers inside TLS with its CA."""
    out = w.run(LIST_MODELS, w.env("plain-1"), base_url=w.url("/v1", host=BLOCKED),
                     api_key="sk-dummy")
    assert out.exception == "openai.PermissionDeniedError", out.detail
    print(out.text)
    refusal_visible(out.raised(), "not_allowed")
    assert BLOCKED in out.text
    assert w.fake.untouched()


def test_wrong_proxy_key_shows_identity_invalid_in_the_sdk_exception(w: World) -> None:
    out = w.run(LIST_MODELS, w.env("plain-1", key="not-the-key"), base_url=w.url("/v1"),
                api_key="sk-dummy")
    assert out.exception == "openai.APIStatusError", out.detail
    print(out.text)
    assert out.text.startswith("Error code: 407 - ")
    refusal_visible(out.text, "identity_invalid")
    assert "not-the-key" not in out.text
    assert w.fake.untouched()


# -- 6. base-URL mode, no proxy variables and no CA ------------------------------------------


def test_base_url_mode_needs_no_proxy_and_no_ca(w: World) -> None:
    env = {"OPENAI_BASE_URL": w.base_url("/v1"), "OPENAI_API_KEY": "sk-dummy-base"}
    assert w.run(BASE_URL_LIST, env).ok() == ["gpt-fake"]
    seen = w.fake.last()
    assert (seen.method, seen.path) == ("GET", "/v1/models")
    assert seen.headers["authorization"] == "Bearer sk-dummy-base"
    assert seen.headers["host"] == w.authority
    clean(seen)
    line = w.proxy.wait_audit(lambda e: e.get("path") == "/v1/models" and e.get("base_url"))
    assert (line["decision"], line["policy"], line["sandbox"]) == ("allow", "anon", None)


def test_base_url_mode_streams(w: World) -> None:
    token = w.mint(BearerProcessor())
    env = {"OPENAI_BASE_URL": w.base_url("/v1", tokens=[token]), "OPENAI_API_KEY": "sk-dummy"}
    got = w.run(STREAM, env).ok()
    assert w.fake.last().headers["authorization"] == f"Bearer {SECRET}"
    assert got["deltas"] == ["", "you sent ", f"Bearer {masked(SECRET)}", " ok", None]
    assert got["at"][3] - got["at"][2] >= PAUSE / 2, got["at"]


# -- 7. tokens without code: in the base URL, or in the proxy credentials ------------------------


def test_token_in_the_base_url(w: World) -> None:
    token = w.mint(BearerProcessor())
    env = {"OPENAI_BASE_URL": w.base_url("/v1", tokens=[token]), "OPENAI_API_KEY": "sk-dummy"}
    content = w.run(CHAT, env).ok()
    seen = w.fake.last()
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    clean(seen)
    assert content == f"you sent Bearer {masked(SECRET)}"


def test_connection_scoped_token_in_the_proxy_credentials(w: World) -> None:
    token = w.mint(BearerProcessor())
    env = w.env("tokens-1", key=f"{KEYS['tokens-1']},{token}")
    content = w.run(CHAT, env, base_url=w.url("/v1"), api_key="sk-dummy").ok()
    seen = w.fake.last()
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    clean(seen)
    assert content == f"you sent Bearer {masked(SECRET)}"
