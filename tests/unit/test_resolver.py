"""The proxy's DNS client against a real stub server on loopback."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from ipaddress import ip_address
from pathlib import Path
from typing import Unpack

import pytest
from dnslib import QTYPE, RR, DNSRecord

from sealgate.proxy.net.resolver import Resolution, ResolveError, Resolver, ResolverOptions
from tests.dnsstub import StubDNS


@pytest.fixture
def stub() -> Iterator[StubDNS]:
    with StubDNS() as server:
        yield server


def make(stub: StubDNS, **kw: Unpack[ResolverOptions]) -> Resolver:
    # Short defaults keep the file fast; min_ttl 0 lets tests use tiny TTLs.
    options: ResolverOptions = {"timeout": 0.5, "min_ttl": 0.0}
    options.update(kw)
    return Resolver([stub.address], **options)


def resolve(resolver: Resolver, name: str) -> Resolution:
    return asyncio.run(resolver.resolve(name))


def failure(resolver: Resolver, name: str) -> ResolveError:
    with pytest.raises(ResolveError) as caught:
        resolve(resolver, name)
    return caught.value


def addrs(answer: Resolution) -> list[str]:
    return [str(a) for a in answer.addresses]


def test_a_and_aaaa_ipv4_first_in_received_order(stub: StubDNS) -> None:
    stub.set("host.test", "AAAA ::1", "A 127.0.0.2", "A 127.0.0.1")
    before = time.monotonic()
    answer = resolve(make(stub), "host.test")
    assert answer.name == "host.test"
    assert addrs(answer) == ["127.0.0.2", "127.0.0.1", "::1"]
    assert answer.duration > 0
    assert before + 59 < answer.expires <= time.monotonic() + 60
    assert Counter(stub.queries) == {("host.test", "A"): 1, ("host.test", "AAAA"): 1}


def test_cname_chain_followed_inside_one_answer(stub: StubDNS) -> None:
    stub.set("a.test", "CNAME b.test", ttl=10)
    stub.set("b.test", "CNAME c.test", ttl=100)
    stub.set("c.test", "A 127.0.0.3", "AAAA ::1", ttl=100)
    answer = resolve(make(stub), "a.test")
    assert addrs(answer) == ["127.0.0.3", "::1"]
    # The shortest TTL in the chain bounds the cache lifetime.
    assert answer.expires <= time.monotonic() + 10
    # Only the asked name went on the wire: no extra queries for the targets.
    assert {name for name, _ in stub.queries} == {"a.test"}


def test_cname_chain_too_long_is_an_error(stub: StubDNS) -> None:
    for i in range(10):
        stub.set(f"c{i}.test", f"CNAME c{i + 1}.test")
    stub.set("c10.test", "A 127.0.0.1")
    assert failure(make(stub, attempts=1), "c0.test").reason == "dns_error"


def test_cname_to_missing_name_is_nxdomain(stub: StubDNS) -> None:
    stub.set("dangling.test", "CNAME gone.test")
    assert failure(make(stub), "dangling.test").reason == "dns_nxdomain"


def test_positive_cache_until_ttl_then_asks_again(stub: StubDNS) -> None:
    stub.set("short.test", "A 127.0.0.1", ttl=0)
    resolver = make(stub, min_ttl=0.2)
    first = resolve(resolver, "short.test")
    hit = resolve(resolver, "short.test")
    assert hit.duration == 0.0 and hit.addresses == first.addresses
    assert resolver.cached("short.test") == hit
    assert len(stub.queries) == 2
    time.sleep(0.25)
    assert resolver.cached("short.test") is None
    resolve(resolver, "short.test")
    assert len(stub.queries) == 4


def test_ttl_clamped_to_max(stub: StubDNS) -> None:
    stub.set("long.test", "A 127.0.0.1", ttl=86400)
    answer = resolve(make(stub, max_ttl=10.0), "long.test")
    assert answer.expires <= time.monotonic() + 10


def test_cache_is_bounded_lru(stub: StubDNS) -> None:
    for name in ("one.test", "two.test", "three.test"):
        stub.set(name, "A 127.0.0.1")
    resolver = make(stub, cache_size=2)
    for name in ("one.test", "two.test", "one.test", "three.test"):
        resolve(resolver, name)
    assert resolver.cached("one.test") is not None
    assert resolver.cached("two.test") is None
    assert resolver.cached("three.test") is not None


def test_nxdomain_is_cached_negatively(stub: StubDNS) -> None:
    stub.nxdomain("gone.test")
    resolver = make(stub, negative_ttl=0.2)
    error = failure(resolver, "gone.test")
    assert error.reason == "dns_nxdomain" and "gone.test" in str(error)
    assert failure(resolver, "gone.test").reason == "dns_nxdomain"
    assert len(stub.queries) == 2
    assert resolver.cached("gone.test") is None
    time.sleep(0.25)
    failure(resolver, "gone.test")
    assert len(stub.queries) == 4


def test_unknown_name_is_nxdomain(stub: StubDNS) -> None:
    assert failure(make(stub), "nobody.test").reason == "dns_nxdomain"


def test_no_records_is_no_answer_and_cached(stub: StubDNS) -> None:
    stub.set("empty.test")
    resolver = make(stub)
    assert failure(resolver, "empty.test").reason == "dns_no_answer"
    assert failure(resolver, "empty.test").reason == "dns_no_answer"
    assert len(stub.queries) == 2


def test_servfail_is_error_and_not_cached(stub: StubDNS) -> None:
    stub.servfail("broken.test")
    resolver = make(stub, attempts=2)
    assert failure(resolver, "broken.test").reason == "dns_error"
    assert len(stub.queries) == 4  # two rounds, two families
    failure(resolver, "broken.test")
    assert len(stub.queries) == 8


def test_next_server_used_when_first_fails(stub: StubDNS) -> None:
    stub.servfail("host.test")
    with StubDNS() as second:
        second.set("host.test", "A 127.0.0.7")
        resolver = Resolver([stub.address, second.address], timeout=0.5, attempts=1)
        assert addrs(resolve(resolver, "host.test")) == ["127.0.0.7"]


def test_drop_times_out_within_bound(stub: StubDNS) -> None:
    stub.drop("slow.test")
    resolver = make(stub, timeout=0.15, attempts=2)
    started = time.monotonic()
    assert failure(resolver, "slow.test").reason == "dns_timeout"
    assert 0.25 < time.monotonic() - started < 1.0
    failure(resolver, "slow.test")  # timeouts are never cached
    assert len(stub.queries) == 8


def test_unreachable_server_is_an_error_not_a_hang() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    resolver = Resolver([("127.0.0.1", port)], timeout=2.0, attempts=1)
    started = time.monotonic()
    assert failure(resolver, "host.test").reason == "dns_error"
    assert time.monotonic() - started < 1.0


def test_truncated_udp_falls_back_to_tcp(stub: StubDNS) -> None:
    stub.set("big.test", "A 127.0.0.1", "AAAA ::1")
    stub.truncate_udp("big.test")
    answer = resolve(make(stub), "big.test")
    assert addrs(answer) == ["127.0.0.1", "::1"]
    assert Counter(stub.queries) == {("big.test", "A"): 2, ("big.test", "AAAA"): 2}


def test_rebinding_sequence_seen_only_after_expiry(stub: StubDNS) -> None:
    stub.sequence("rebind.test", ["A 93.184.216.34"], ["A 127.0.0.1"])
    resolver = make(stub, min_ttl=0.2)
    assert addrs(resolve(resolver, "rebind.test")) == ["93.184.216.34"]
    assert addrs(resolve(resolver, "rebind.test")) == ["93.184.216.34"]
    time.sleep(0.25)
    assert addrs(resolve(resolver, "rebind.test")) == ["127.0.0.1"]


def test_concurrent_resolves_share_one_lookup(stub: StubDNS) -> None:
    stub.set("busy.test", "A 127.0.0.1", "AAAA ::1")
    resolver = make(stub)

    async def many() -> list[Resolution]:
        return await asyncio.gather(*(resolver.resolve("busy.test") for _ in range(10)))

    answers = asyncio.run(many())
    assert len({a.addresses for a in answers}) == 1
    assert Counter(stub.queries) == {("busy.test", "A"): 1, ("busy.test", "AAAA"): 1}


def test_cancelled_waiter_does_not_cancel_shared_lookup(stub: StubDNS) -> None:
    stub.drop("slow.test")
    resolver = make(stub, timeout=0.2, attempts=1)

    async def scenario() -> BaseException | Resolution:
        quitter = asyncio.create_task(resolver.resolve("slow.test"))
        stayer = asyncio.create_task(resolver.resolve("slow.test"))
        await asyncio.sleep(0.05)
        quitter.cancel()
        results = await asyncio.gather(quitter, stayer, return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError)
        return results[1]

    outcome = asyncio.run(scenario())
    assert isinstance(outcome, ResolveError) and outcome.reason == "dns_timeout"


# A scripted UDP "server" for replies StubDNS will not produce: forged ones.

Reply = tuple[bytes, bool]  # (datagram, send from a different port)


def scripted_server(
    script: Callable[[DNSRecord], list[Reply]], queries: int
) -> tuple[tuple[str, int], threading.Thread]:
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.settimeout(2.0)
    address = server.getsockname()

    def run() -> None:
        with server, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
            other.bind(("127.0.0.1", 0))
            for _ in range(queries):
                try:
                    data, peer = server.recvfrom(4096)
                except TimeoutError:
                    return
                for datagram, from_other in script(DNSRecord.parse(data)):
                    (other if from_other else server).sendto(datagram, peer)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return address, thread


def reply_to(query: DNSRecord, *zone: str) -> DNSRecord:
    # reply() shares the question object; a copy lets each forgery edit its own.
    reply = DNSRecord.parse(query.pack()).reply()
    for line in zone:
        for rr in RR.fromZone(line):
            if rr.rtype == query.q.qtype:
                reply.add_answer(rr)
    return reply


def test_spoofed_and_mismatched_replies_are_ignored() -> None:
    def forge(query: DNSRecord) -> list[Reply]:
        evil = "host.test. 60 IN A 10.6.6.6"
        wrong_id = reply_to(query, evil)
        wrong_id.header.id ^= 0x5A5A
        wrong_name = reply_to(query, evil)
        wrong_name.q.qname = "other.test."
        wrong_type = reply_to(query, evil)
        wrong_type.q.qtype = QTYPE.MX
        not_a_reply = reply_to(query, evil)
        not_a_reply.header.qr = 0
        good = reply_to(query, "host.test. 60 IN A 127.0.0.9")
        return [
            (b"\x00", False),
            (bytes(wrong_id.pack()), False),
            (bytes(wrong_name.pack()), False),
            (bytes(wrong_type.pack()), False),
            (bytes(not_a_reply.pack()), False),
            (bytes(reply_to(query, evil).pack()), True),
            (bytes(good.pack()), False),
        ]

    address, thread = scripted_server(forge, queries=2)
    answer = resolve(Resolver([address], timeout=1.0, attempts=1), "host.test")
    thread.join(timeout=2.0)
    assert addrs(answer) == ["127.0.0.9"]


def test_one_family_timing_out_still_returns_the_other() -> None:
    def v4_only(query: DNSRecord) -> list[Reply]:
        if query.q.qtype != QTYPE.A:
            return []
        return [(bytes(reply_to(query, "host.test. 60 IN A 127.0.0.4").pack()), False)]

    address, thread = scripted_server(v4_only, queries=2)
    resolver = Resolver([address], timeout=0.2, attempts=1, negative_ttl=1.0)
    answer = resolve(resolver, "host.test")
    thread.join(timeout=2.0)
    assert addrs(answer) == ["127.0.0.4"]
    # Partial answers are kept only briefly so the missing family is retried.
    assert answer.expires <= time.monotonic() + 1.0


def test_truncated_reply_without_tcp_service_is_an_error() -> None:
    def truncated(query: DNSRecord) -> list[Reply]:
        reply = reply_to(query)
        reply.header.tc = 1
        return [(bytes(reply.pack()), False)]

    # Only a UDP socket is bound on that port, so the TCP retry is refused.
    address, thread = scripted_server(truncated, queries=2)
    error = failure(Resolver([address], timeout=1.0, attempts=1), "host.test")
    thread.join(timeout=2.0)
    assert error.reason == "dns_error"


def test_name_must_be_canonical(stub: StubDNS) -> None:
    resolver = make(stub)
    for bad in ("", "trailing.dot.", "a..b", "sp ace.test", "x" * 64 + ".test"):
        with pytest.raises(ResolveError) as caught:
            resolve(resolver, bad)
        assert caught.value.reason == "dns_error"
    assert stub.queries == []


def test_from_system_reads_only_nameservers(tmp_path: Path) -> None:
    conf = tmp_path / "resolv.conf"
    conf.write_text(
        "# generated\n"
        "search corp.example internal\n"
        "domain corp.example\n"
        "options ndots:5 timeout:1\n"
        "nameserver 127.0.0.53\n"
        "nameserver not-an-ip\n"
        "; nameserver 127.0.0.99\n"
        "nameserver ::1\n"
    )
    assert Resolver.from_system(conf).servers == (("127.0.0.53", 53), ("::1", 53))
    conf.write_text("search corp.example\n")
    assert Resolver.from_system(conf).servers == (("127.0.0.1", 53),)
    assert Resolver.from_system(tmp_path / "missing").servers == (("127.0.0.1", 53),)


@pytest.mark.parametrize(
    ("spec", "server"),
    [
        ("127.0.0.1:5353", ("127.0.0.1", 5353)),
        ("127.0.0.1", ("127.0.0.1", 53)),
        ("[::1]:5353", ("::1", 5353)),
        ("[::1]", ("::1", 53)),
        ("::1", ("::1", 53)),
    ],
)
def test_from_spec_forms(spec: str, server: tuple[str, int]) -> None:
    assert Resolver.from_spec(spec, timeout=1.0).servers == (server,)


@pytest.mark.parametrize(
    "spec", ["localhost:53", "127.0.0.1:dns", "127.0.0.1:70000", "127.0.0.1:0", "[::1", "::1]:53"]
)
def test_from_spec_rejects_bad_forms(spec: str) -> None:
    with pytest.raises(ValueError):
        Resolver.from_spec(spec)


def test_from_spec_none_means_system() -> None:
    assert Resolver.from_spec(None).servers
    assert all(ip_address(host) for host, _ in Resolver.from_spec(None).servers)


def test_stub_stops_promptly_with_a_client_still_connected() -> None:
    stub = StubDNS().start()
    with socket.create_connection(stub.address, timeout=1.0):
        started = time.monotonic()
        stub.stop()
        assert time.monotonic() - started < 1.0
