"""What `sealgate kube forward` reads a connection's name from (kube/forward.py `named`): real
ClientHellos made by Python's TLS, HTTP/1 heads, and what must name nothing."""

from __future__ import annotations

import ssl

import pytest

from sealgate.kube.forward import PEEK_BYTES, named


def _hello(sni: str | None) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = sni is not None
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    conn = context.wrap_bio(incoming, outgoing, server_hostname=sni)
    with pytest.raises(ssl.SSLWantReadError):
        conn.do_handshake()
    return outgoing.read()


def test_a_client_hello_names_its_sni() -> None:
    hello = _hello("API.Example.test")
    assert named(hello) == "api.example.test"
    assert named(hello[:40]) is False  # more may still tell
    assert named(_hello(None)) is None  # no SNI: the address then


def test_an_http_head_names_its_host() -> None:
    assert named(b"GET / HTTP/1.1\r\nHost: api.test:8080\r\n\r\n") == "api.test"
    assert named(b"GET / HTTP/1.1\r\nhost:  api.test\r\n\r\nbody") == "api.test"
    assert named(b"GET / HTTP/1.1\r\nHost: api.te") is False


@pytest.mark.parametrize("first", [
    b"\x16\x03\x01\x00\x08\x01\x00\x00\x04abcd",  # a whole ClientHello that is garbage
    b"GET / HTTP/1.1\r\nHost: api.test HTTP/1.1\r\nX: y\r\n\r\n",  # a CONNECT line smuggled
    b"GET / HTTP/1.1\r\nHost: \xff\xfe\r\n\r\n",
    b"GET / HTTP/1.1\r\nX-Host: api.test\r\n\r\n",
    b"SSH-2.0-OpenSSH_9.2\r\n\r\n",
    b"A" * PEEK_BYTES,  # never ends within the peek
])
def test_what_names_nothing(first: bytes) -> None:
    assert named(first) is None
