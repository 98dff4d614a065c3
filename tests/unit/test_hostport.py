"""`host:port` written and read (sealgate/hostport.py), and the command lines that use it."""

from __future__ import annotations

import pytest

from sealgate.hostport import format_hostport, parse_hostport
from sealgate.proxy.process.cli import _listen_address


@pytest.mark.parametrize(
    ("host", "port", "text"),
    [
        ("127.0.0.1", 3128, "127.0.0.1:3128"),
        ("api.example.com", 443, "api.example.com:443"),
        ("::1", 8080, "[::1]:8080"),
        ("2001:db8::1", 53, "[2001:db8::1]:53"),
    ],
)
def test_format_and_parse_agree(host: str, port: int, text: str) -> None:
    assert format_hostport(host, port) == text
    assert parse_hostport(text) == (host, port)


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        (":3128", ("", 3128)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),  # port 0: the caller decides whether that means "any"
        ("::1:8080", ("::1", 8080)),  # unbracketed, as the command lines always accepted it
        ("localhost:65535", ("localhost", 65535)),
    ],
)
def test_parse_edges(text: str, parsed: tuple[str, int]) -> None:
    assert parse_hostport(text) == parsed


@pytest.mark.parametrize("text", ["", "3128", "host:", "host:http", "host:65536", "h:-1", "h:²"])
def test_parse_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        parse_hostport(text)


def test_proxy_listen_address() -> None:
    assert _listen_address(":3128") == ("127.0.0.1", 3128)
    assert _listen_address("[::]:3128") == ("::", 3128)
    for bad in ("0.0.0.0:0", "3128", "host:x"):
        with pytest.raises(SystemExit, match="expected HOST:PORT"):
            _listen_address(bad)
