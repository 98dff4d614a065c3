"""sealgate.oplog: one JSON line per record, the audit line's field names, exceptions as one
field, and nothing that looks like a credential in any field at any depth."""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog

from sealgate import oplog

TOKEN = "sg1.0123456789abcdef.QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFB"
CANARIES = ("oplog-canary-secret-1", "proxy-key-canary-2", TOKEN.split(".", 2)[2])


@pytest.fixture()
def logged() -> Iterator[Callable[..., list[dict[str, Any]]]]:
    """Configures the log into a buffer; returns a function giving its lines, parsed."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, sys.excepthook, threading.excepthook,
             logging.getLogger("sealgate").level)
    buffers: list[io.StringIO] = []

    def configure(fmt: str | None = "json", level: str = "info",
                  events: io.StringIO | None = None) -> list[dict[str, Any]]:
        buffers.append(io.StringIO())
        oplog.configure(fmt, level, stream=buffers[-1], events=events)
        return []

    def lines(which: int = -1) -> list[dict[str, Any]]:
        return [json.loads(line) for line in buffers[which].getvalue().splitlines()]

    configure()
    lines.configure = configure  # type: ignore[attr-defined]
    yield lines
    oplog.configure(stream=io.StringIO())  # takes its handlers off
    for logger, handler in oplog._installed:
        logger.removeHandler(handler)
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    sys.excepthook, threading.excepthook = saved[2], saved[3]
    logging.getLogger("sealgate").setLevel(saved[4])
    logging.getLogger(oplog.EVENTS).propagate = True
    structlog.reset_defaults()


def test_a_record_is_one_json_line_with_its_fields(logged: Callable[..., Any]) -> None:
    log = logging.getLogger("sealgate.proxy.test")
    log.warning("secret fetch failed", extra={"request_id": "r-1", "sandbox": "bot-1",
                                              "policy": "ci", "reason": "secret_unavailable"})
    structlog.get_logger("sealgate.issuer").info("minted", caller="ci", ttl=60)
    first, second = logged()
    assert list(first)[:3] == ["ts", "level", "event"]
    assert first["ts"].endswith("Z") and len(first["ts"]) == len("2025-01-31T12:00:00.000Z")
    assert first | {"ts": None} == {
        "ts": None, "level": "warning", "event": "secret fetch failed", "request_id": "r-1",
        "sandbox": "bot-1", "policy": "ci", "reason": "secret_unavailable",
        "logger": "sealgate.proxy.test"}
    assert (second["event"], second["caller"], second["ttl"], second["level"]) == \
        ("minted", "ci", 60, "info")


def test_levels_and_libraries(logged: Callable[..., Any]) -> None:
    logging.getLogger("sealgate.x").debug("not at info")
    logging.getLogger("aiohttp.x").info("a library's info: not at info")
    logging.getLogger("mitmproxy.proxy.server").error("mitmproxy's own: never")
    logging.getLogger("asyncio").error("a library's error")
    assert [line["event"] for line in logged()] == ["a library's error"]
    logged.configure("json", "debug")  # type: ignore[attr-defined]
    logging.getLogger("sealgate.x").debug("now")
    logging.getLogger("hvac.adapters").debug("and the libraries'")
    assert [line["event"] for line in logged()] == ["now", "and the libraries'"]


def test_an_exception_is_one_field_without_locals(logged: Callable[..., Any]) -> None:
    def fails(secret: str) -> None:
        raise ValueError(f"could not use Bearer {secret} with {TOKEN}")

    try:
        try:
            fails(CANARIES[0])
        except ValueError as exc:
            raise RuntimeError("proxy http://bot-1:" + CANARIES[1] + "@127.0.0.1:8080") from exc
    except RuntimeError:
        logging.getLogger("sealgate.x").exception("internal error", extra={"request_id": "r"})
    (line,) = logged()
    assert line["level"] == "error" and line["request_id"] == "r"
    chain = line["exception"]
    assert [e["exc_type"] for e in chain] == ["RuntimeError", "ValueError"]
    assert chain[1]["frames"][-1]["name"] == "fails"
    assert all("locals" not in frame for e in chain for frame in e["frames"])
    text = json.dumps(line)
    assert not [c for c in CANARIES if c in text], text
    assert "http://bot-1:[redacted]@127.0.0.1:8080" in text and "sg1.[redacted]" in text


@pytest.mark.parametrize("text", [
    "Authorization: Bearer oplog-canary-secret-1",
    "proxy-authorization=Basic b3Bsb2ctY2FuYXJ5LXNlY3JldC0x",
    "bearer oplog-canary-secret-1",
    "http://bot-1:proxy-key-canary-2,sg1.x@proxy:8080",
    f"token {TOKEN} refused",
    "-----BEGIN PRIVATE KEY-----\noplog-canary-secret-1\n-----END PRIVATE KEY-----",
    "vault said hvs.oplog-canary-secret-1",
    "github ghp_oplogcanarysecret1",
    "key sk-ant-oplog-canary-secret-1",
])
def test_what_looks_like_a_credential_is_masked(text: str) -> None:
    masked = oplog.scrub(text)
    assert oplog.MASK in masked
    assert "oplog-canary-secret-1" not in masked and "proxy-key-canary-2" not in masked
    assert "b3Bsb2ct" not in masked and "oplogcanarysecret1" not in masked
    assert CANARIES[2] not in masked


def test_ordinary_text_is_left_alone() -> None:
    for text in ("secret vault:kv/data/ci/github#token: fetch failed (SecretNotFound)",
                 "token refresh failed (TimeoutError); retrying", "basic auth", "sg1 tokens",
                 "http://127.0.0.1:8080/path", "task-1234567890 ended"):
        assert oplog.scrub(text) == text


def test_fields_named_like_credentials_are_masked_at_any_depth(
        logged: Callable[..., Any]) -> None:
    logging.getLogger("sealgate.x").info("call", extra={
        "token": CANARIES[0], "headers": {"Authorization": "x", "Proxy-Authorization": "y",
                                          "accept": "*/*"},
        "sent": [{"password": CANARIES[1]}], "object": ValueError("Bearer " + CANARIES[0])})
    (line,) = logged()
    assert line["token"] == oplog.MASK
    assert line["headers"] == {"Authorization": oplog.MASK, "Proxy-Authorization": oplog.MASK,
                               "accept": "*/*"}
    assert line["sent"] == [{"password": oplog.MASK}]
    assert line["object"] == "Bearer [redacted]"


def test_events_go_to_their_own_stream_in_the_same_shape(logged: Callable[..., Any]) -> None:
    events = io.StringIO()
    logged.configure("json", events=events)  # type: ignore[attr-defined]
    logging.getLogger(oplog.EVENTS).info("created", extra={"id": "a1", "sandbox": "ci-bot"})
    logging.getLogger("sealgate.sandbox.daemon").error("pool failed", extra={"error": "x"})
    (event,) = [json.loads(line) for line in events.getvalue().splitlines()]
    (error,) = logged()
    assert list(event)[:3] == list(error)[:3] == ["ts", "level", "event"]
    assert (event["event"], event["id"], event["sandbox"]) == ("created", "a1", "ci-bot")
    assert error["event"] == "pool failed"


def test_console_lines_are_one_line_each(logged: Callable[..., Any]) -> None:
    logged.configure("console")  # type: ignore[attr-defined]
    try:
        raise ValueError("Bearer " + CANARIES[0])
    except ValueError:
        logging.getLogger("sealgate.x").exception("boom", extra={"sandbox": "bot-1"})
    handler = oplog._installed[0][1]
    assert isinstance(handler, logging.StreamHandler)
    text = handler.stream.getvalue()
    assert text.count("\n") == 1 and "sandbox=bot-1" in text and "ValueError" in text
    assert CANARIES[0] not in text


def test_an_uncaught_exception_is_one_line(logged: Callable[..., Any]) -> None:
    try:
        raise KeyError("Bearer " + CANARIES[0])
    except KeyError:
        sys.excepthook(*sys.exc_info())  # type: ignore[arg-type]
    (line,) = logged()
    assert line["level"] == "critical" and line["exception"][0]["exc_type"] == "KeyError"
    assert CANARIES[0] not in json.dumps(line)


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_pipe_drops_the_line_quietly(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = list(root.handlers)
    try:
        oplog.configure("json", stream=_ClosedPipe())
        logging.getLogger("sealgate.x").error("nowhere to go")
    finally:
        for logger, handler in oplog._installed:
            logger.removeHandler(handler)
        root.handlers[:] = saved
        structlog.reset_defaults()
    assert "Logging error" not in capsys.readouterr().err
