"""Host patterns (sealgate/hostname.py): the one grammar and meaning of `name` / `*.name` that
rules and sealed tokens share."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address

import pytest

from sealgate import credentials as tk
from sealgate.hostname import Host, HostError, canonical_name, parse_host_pattern
from sealgate.proxy.policy.targets import TargetError, host_pattern


@pytest.mark.parametrize(
    ("raw", "host", "wildcard"),
    [
        ("example.com", Host("example.com"), False),
        ("*.example.com", Host("example.com"), True),
        ("Example.COM.", Host("example.com"), False),
        ("*.bücher.example", Host("xn--bcher-kva.example"), True),
        ("10.0.0.1", Host("10.0.0.1", IPv4Address("10.0.0.1")), False),
        ("2001:DB8:0::1", Host("2001:db8::1", IPv6Address("2001:db8::1")), False),
        ("[2001:db8::1]", Host("2001:db8::1", IPv6Address("2001:db8::1")), False),
    ],
)
def test_parse(raw: str, host: Host, wildcard: bool) -> None:
    pattern = parse_host_pattern(raw)
    assert (pattern.host, pattern.wildcard) == (host, wildcard)


@pytest.mark.parametrize(
    "raw",
    ["", "*", "*.", "*.*.example.com", "a.*.example.com", "*example.com", "*.10.0.0.1",
     "*.2001:db8::1", "127.1", "exa mple.com", "example.com:443", "fe80::1%eth0", "user@host"],
)
def test_refused(raw: str) -> None:
    with pytest.raises(HostError):
        parse_host_pattern(raw)


@pytest.mark.parametrize(
    ("raw", "host", "ok"),
    [
        ("api.example.com", "api.example.com", True),
        ("api.example.com", "API.example.com.", True),
        ("api.example.com", "x.api.example.com", False),
        ("api.example.com", "evilapi.example.com", False),
        ("*.example.com", "a.example.com", True),
        ("*.example.com", "a.b.example.com", True),
        ("*.example.com", "example.com", False),
        ("*.example.com", "badexample.com", False),
        ("10.0.0.1", "10.0.0.1", True),
        ("10.0.0.1", "10.0.0.2", False),
        ("2001:db8::1", "[2001:db8:0::1]", True),
        ("*.in-addr.arpa", "1.0.0.10.in-addr.arpa", True),
    ],
)
def test_matches(raw: str, host: str, ok: bool) -> None:
    assert parse_host_pattern(raw).matches(canonical_name(host)) is ok


@pytest.mark.parametrize(
    "raw",
    ["api.example.com", "*.example.com", "API.Example.com.", "*.bücher.example", "10.0.0.1",
     "2001:DB8::1", "[2001:db8::1]", "*.com", "-a.example.com", "*.*.example.com", "*.10.0.0.1",
     "127.1", "exa mple.com", "xn--zz.example"],
)
def test_rules_read_a_pattern_as_the_shared_grammar_does(raw: str) -> None:
    try:
        shared = str(parse_host_pattern(raw))
    except HostError:
        with pytest.raises(TargetError):
            host_pattern(raw)
        return
    assert host_pattern(raw)[0] == shared


@pytest.mark.parametrize(
    "raw", ["api.example.com", "*.example.com", "[2001:db8::1]:8443", "10.0.0.1:80"]
)
def test_a_token_pattern_means_what_the_shared_one_means(raw: str) -> None:
    token = tk.Destination.parse(raw)
    shared = parse_host_pattern(raw.rpartition(":")[0] if raw.endswith(("]:8443", ":80")) else raw)
    for host in ("api.example.com", "a.b.example.com", "example.com", "2001:db8::1", "10.0.0.1"):
        assert token.matches(canonical_name(host), token.port) is shared.matches(
            canonical_name(host)
        )


@pytest.mark.parametrize(
    "raw",
    ["example.com.", "-a.example.com", "a-.example.com", "*.com", "xn--zz.example",
     "bücher.example", "2001:db8::1", "[fe80::1%eth0]", "*.[2001:db8::1]", "example.com:0443"],
)
def test_a_token_asks_more_of_the_spelling(raw: str) -> None:
    with pytest.raises(tk.TokenMalformed):
        tk.Destination.parse(raw)


def test_a_token_pattern_built_directly_is_checked_as_parsed() -> None:
    for host, wildcard in (("Example.com", False), ("example.com.", False), ("com", True)):
        with pytest.raises(tk.TokenMalformed):
            tk.Destination(host, 443, wildcard)
    assert str(tk.Destination("2001:db8::1", 8443)) == "[2001:db8::1]:8443"
