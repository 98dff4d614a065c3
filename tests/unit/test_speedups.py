"""The lean master's replacements for mitmproxy's per-request conveniences (proxy/speedups.py)."""

from __future__ import annotations

import contextlib
import inspect
import ssl
import typing
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from mitmproxy import certs, connection, http, options, optmanager
from mitmproxy.proxy import context
from OpenSSL import SSL, crypto

from sealgate.proxy.engine.speedups import (
    RandomIds,
    converted_once,
    forks_keeping_the_server,
    header_lookups,
    keys_once,
    option_reads,
)


def test_ids_are_random_version_4_uuids_across_refills() -> None:
    ids = RandomIds()
    drawn = [ids.uuid4() for _ in range(1000)]  # several refills of the 256-id buffer
    assert len(set(drawn)) == len(drawn)
    for text in drawn:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, text)


def test_ids_are_not_a_sequence() -> None:
    # A denial shows the sandbox its request id: consecutive ids must share no more than chance.
    ids = RandomIds()
    a, b = ids.uuid4(), ids.uuid4()
    assert sum(x == y for x, y in zip(a.replace("-", ""), b.replace("-", ""), strict=True)) < 12


def _handshake(cert: object, key: object) -> bytes:
    """A TLS handshake over a socket pair, the server side served as mitmproxy serves a leaf;
    the certificate the client received, DER."""
    server_ctx = SSL.Context(SSL.TLS_SERVER_METHOD)
    server = SSL.Connection(server_ctx, None)
    server.use_certificate(cert)
    server.use_privatekey(key)
    server.set_accept_state()
    client = ssl.create_default_context()
    client.check_hostname, client.verify_mode = False, ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client.wrap_bio(incoming, outgoing, server_hostname="leaf.test")
    for _ in range(10):
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            server.bio_write(outgoing.read())
            with contextlib.suppress(SSL.WantReadError):
                server.do_handshake()
            incoming.write(server.bio_read(65536))
    der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def test_a_leaf_is_converted_for_pyopenssl_once_and_serves_every_handshake(
        tmp_path: Path) -> None:
    store = certs.CertStore.from_store(tmp_path, "ca", 2048)
    entry = store.get_cert("leaf.test", ["leaf.test"])
    made: list[object] = []

    def convert(cert: certs.Cert) -> object:
        made.append(cert)
        return certs.Cert.to_pyopenssl(cert)

    to_pyopenssl, pkey = converted_once(convert), keys_once(crypto.PKey)
    served = [_handshake(to_pyopenssl(entry.cert), pkey.from_cryptography_key(entry.privatekey))
              for _ in range(3)]
    assert served == [ssl.PEM_cert_to_DER_cert(entry.cert.to_pem().decode())] * 3
    assert made == [entry.cert]  # once, for three handshakes
    assert pkey.from_cryptography_key(entry.privatekey) is pkey.from_cryptography_key(
        entry.privatekey)
    assert isinstance(pkey.from_cryptography_key(entry.privatekey), crypto.PKey)


_FIELDS = [
    (b"Host", b"origin.test"), (b"Content-Length", b"12"), (b"X-Dup", b"one"),
    (b"x-dup", b"two"), (b"X-Empty", b""), (b"X-Bytes", b"\xff\xfe caf\xc3\xa9"),
    (b"TRANSFER-ENCODING", b"chunked"),
]
_NAMES: list[str | bytes] = [
    "host", "HOST", b"content-length", "x-dup", "X-DUP", "x-empty", "x-bytes", "missing",
    b"missing", "transfer-encoding", "caf\xe9", "",
]


def _mitmproxys(name: str) -> Callable[..., Any]:
    """mitmproxy's own lookup, whatever this process installed over it."""
    original = http.Headers.__dict__.get(name)
    if original is not None:
        return inspect.unwrap(original)
    return getattr(Mapping, name)  # type: ignore[no-any-return]  # get and in: Mapping's


def test_header_lookups_answer_and_fail_as_mitmproxy_s() -> None:
    fast = header_lookups(http._always_bytes)
    for fields in (_FIELDS, _FIELDS[::-1], [], _FIELDS[:1]):
        headers = http.Headers(fields)
        for name in _NAMES:
            assert fast["get_all"](headers, name) == _mitmproxys("get_all")(headers, name)
            assert fast["get"](headers, name) == _mitmproxys("get")(headers, name)
            assert fast["get"](headers, name, "d") == _mitmproxys("get")(headers, name, "d")
            assert fast["__contains__"](headers, name) == \
                _mitmproxys("__contains__")(headers, name)
        for lookup in ("get_all", "get", "__contains__"):
            with pytest.raises(TypeError):
                _mitmproxys(lookup)(headers, 7)
            with pytest.raises(TypeError):
                fast[lookup](headers, 7)


def test_option_reads_answer_as_mitmproxy_s_and_still_copy_containers() -> None:
    original = inspect.unwrap(optmanager._Option.current)
    fast = option_reads(original, optmanager.unset)
    options = optmanager.OptManager()
    # mitmproxy's option types are typing's, as its own options.py spells them.
    for name, typespec, default, value in [
        ("flag", bool, False, True), ("count", int, 3, 0), ("ratio", float, 0.5, 2.0),
        ("text", str, "a", ""), ("maybe", typing.Optional[str], None, "x"),  # noqa: UP045
        ("items", typing.Sequence[str], [], ["a", "b"]),
        ("maybe_items", typing.Optional[typing.Sequence[str]], None, ["c"]),  # noqa: UP045
    ]:
        options.add_option(name, typespec, default, "")
        option = options._options[name]
        for _ in ("default", "set"):
            got, expected = fast(option), original(option)
            assert (type(got), got) == (type(expected), expected)
            if isinstance(got, list):  # a container is the caller's own copy, as before
                assert got is not fast(option) and got is not option.value
            option.set(value)


def test_a_fork_is_mitmproxy_s_without_a_server_made_and_dropped(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    original = inspect.unwrap(context.Context.fork)
    fork = forks_keeping_the_server(context.Context)
    client = connection.Client(peername=("127.0.0.1", 5), sockname=("127.0.0.1", 6),
                               timestamp_start=1.0)
    parent = context.Context(client, options.Options())
    parent.server = connection.Server(address=("127.0.0.1", 443))
    parent.layers = [object(), object()]
    made = []
    server_init = connection.Server.__init__
    monkeypatch.setattr(connection.Server, "__init__",
                        lambda self, *a, **kw: made.append(1) or server_init(self, *a, **kw))
    theirs, ours = original(parent), fork(parent)
    assert made == [1]  # mitmproxy's fork made one, ours none
    for forked in (theirs, ours):
        assert type(forked) is context.Context
        assert (forked.client, forked.options, forked.server) == (
            parent.client, parent.options, parent.server)
        assert forked.client is client and forked.server is parent.server
        assert forked.layers == parent.layers and forked.layers is not parent.layers
    assert vars(ours).keys() == vars(theirs).keys()
