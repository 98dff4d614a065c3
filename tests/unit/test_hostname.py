"""Host canonicalisation: the evasions of ssrf.md section 3 (A-E, K, L), one row each."""

# ruff: noqa: RUF001 - confusable characters are the point of these inputs

from __future__ import annotations

from ipaddress import IPv4Address, IPv6Address

import pytest

from sealgate.hostname import Host, HostError, canonical_host, denied_name, split_authority

ACCEPTED: list[tuple[str, str, IPv4Address | IPv6Address | None]] = [
    # E: case, one trailing dot, UTS-46 mapping to the A-label
    ("example.com", "example.com", None),
    ("EXAMPLE.Com.", "example.com", None),
    ("ⓔⓧⓐⓜⓟⓛⓔ.ⓒⓞⓜ", "example.com", None),
    ("ＥＸＡＭＰＬＥ．ｃｏｍ", "example.com", None),
    ("exa\u00admple.com", "example.com", None),  # soft hyphen is ignored by UTS-46
    ("Bücher.DE", "xn--bcher-kva.de", None),
    ("xn--bcher-kva.de", "xn--bcher-kva.de", None),
    ("XN--BCHER-KVA.de", "xn--bcher-kva.de", None),
    ("_dmarc.example.com", "_dmarc.example.com", None),
    ("rr3---sn-abc.googlevideo.com", "rr3---sn-abc.googlevideo.com", None),
    ("127.0.0.1.nip.io", "127.0.0.1.nip.io", None),  # a name; its addresses are checked later
    ("09.example", "09.example", None),
    # A: canonical dotted quads, including the fullwidth and ideographic spellings
    ("127.0.0.1", "127.0.0.1", IPv4Address("127.0.0.1")),
    ("127.0.0.1.", "127.0.0.1", IPv4Address("127.0.0.1")),
    ("0.0.0.0", "0.0.0.0", IPv4Address("0.0.0.0")),
    ("255.255.255.255", "255.255.255.255", IPv4Address("255.255.255.255")),
    ("１２７．０．０．１", "127.0.0.1", IPv4Address("127.0.0.1")),
    ("１２７.０.０.１", "127.0.0.1", IPv4Address("127.0.0.1")),
    ("169。254。169。254", "169.254.169.254", IPv4Address("169.254.169.254")),
    ("169｡254｡169｡254", "169.254.169.254", IPv4Address("169.254.169.254")),
    # B: bracketed IPv6, compressed
    ("[::1]", "::1", IPv6Address("::1")),
    ("[::]", "::", IPv6Address("::")),
    ("[0:0::1]", "::1", IPv6Address("::1")),
    ("[0000:0000:0000:0000:0000:0000:0000:0001]", "::1", IPv6Address("::1")),
    ("[::FFFF:127.0.0.1]", "::ffff:7f00:1", IPv6Address("::ffff:127.0.0.1")),
    ("[::ffff:a9fe:a9fe]", "::ffff:a9fe:a9fe", IPv6Address("::ffff:169.254.169.254")),
    ("[::127.0.0.1]", "::7f00:1", IPv6Address("::7f00:1")),
    ("[64:ff9b::169.254.169.254]", "64:ff9b::a9fe:a9fe", IPv6Address("64:ff9b::a9fe:a9fe")),
    ("[2002:AABB:CCDD::]", "2002:aabb:ccdd::", IPv6Address("2002:aabb:ccdd::")),
    ("[2001:0::]", "2001::", IPv6Address("2001::")),
]


@pytest.mark.parametrize(("raw", "name", "ip"), ACCEPTED)
def test_accepted(raw: str, name: str, ip: IPv4Address | IPv6Address | None) -> None:
    assert canonical_host(raw) == Host(name, ip)


REJECTED: list[tuple[str, str]] = [
    # A: every inet_aton spelling that is not a canonical dotted quad
    ("2130706433", "host_numeric"),
    ("0x7f000001", "host_numeric"),
    ("0X7F000001", "host_numeric"),
    ("017700000001", "host_numeric"),
    ("0177.0.0.1", "host_numeric"),
    ("0x7f.1", "host_numeric"),
    ("127.1", "host_numeric"),
    ("127.0.1", "host_numeric"),
    ("0", "host_numeric"),
    ("0x", "host_numeric"),
    ("1.2.3.4.5", "host_numeric"),
    ("425.510.425.510", "host_numeric"),
    ("7147006462", "host_numeric"),
    ("256.0.0.1", "host_numeric"),
    ("127.0.0.01", "host_numeric"),
    ("127.00.0.1", "host_numeric"),
    ("0177.0.0.01", "host_numeric"),
    ("127.0.0.0x1", "host_numeric"),
    ("example.com.0x1", "host_numeric"),
    ("evil.127", "host_numeric"),
    ("２１３０７０６４３３", "host_numeric"),
    ("０ｘ７ｆ.１", "host_numeric"),
    ("127。1", "host_numeric"),
    # B: IPv6 outside brackets, and non-IPv6 inside them
    ("::1", "host_ipv6_unbracketed"),
    ("::ffff:127.0.0.1", "host_ipv6_unbracketed"),
    ("fe80::1", "host_ipv6_unbracketed"),
    ("example.com:443", "host_ipv6_unbracketed"),
    ("ａ：８０", "host_ipv6_unbracketed"),
    ("[1.2.3.4]", "host_invalid_char"),
    ("[example.com]", "host_invalid_char"),
    ("[::1", "host_invalid_char"),
    ("[::1]x", "host_invalid_char"),
    ("[]", "host_invalid_char"),
    ("[:::1]", "host_invalid_char"),
    ("[::1]]", "host_invalid_char"),
    ("［::1］", "host_ipv6_unbracketed"),
    ("［１：：１］", "host_invalid_char"),  # fullwidth brackets are not brackets
    # C: zone ids
    ("[fe80::1%25eth0]", "host_invalid_char"),
    ("[fe80::1%lo]", "host_invalid_char"),
    ("fe80--1%lo.example", "host_invalid_char"),
    ("example.com％", "host_invalid_char"),
    # E: empty labels, length, control characters, NUL truncation, URL delimiters
    ("", "host_empty"),
    (".", "host_empty"),
    ("..", "host_empty_label"),
    ("a..b", "host_empty_label"),
    (".example.com", "host_empty_label"),
    ("example.com..", "host_empty_label"),
    ("example。。com", "host_empty_label"),
    ("127.0.0.1\x00.evil.com", "host_invalid_char"),
    ("example.com\r\nX-Evil: 1", "host_invalid_char"),
    ("example.com\n", "host_invalid_char"),
    ("example.com\t", "host_invalid_char"),
    (" example.com", "host_invalid_char"),
    ("exa mple.com", "host_invalid_char"),
    ("example\u3000com", "host_invalid_char"),
    ("example\u00a0.com", "host_invalid_char"),
    ("bücher\x85.de", "host_invalid_char"),
    ("example.com\x7f", "host_invalid_char"),
    ("example.com/path", "host_invalid_char"),
    ("example.com\\path", "host_invalid_char"),
    ("example.com?q", "host_invalid_char"),
    ("example.com#f", "host_invalid_char"),
    ("example.com／path", "host_invalid_char"),
    ("exa*mple.com", "host_invalid_char"),
    ("exa!mple.com", "host_invalid_char"),
    # E: IDNA failures
    ("xn--", "host_idna"),
    ("xn--zz.com", "host_idna"),
    ("xn---bbk.com", "host_idna"),  # non-canonical Punycode for xn--bbk
    ("xn--abc-.com", "host_idna"),
    ("bad\u202ename.com", "host_idna"),  # bidi override
    ("a\u200db.com", "host_idna"),  # ZWJ outside its permitted context
    ("\u0301accent.com", "host_idna"),  # leading combining mark
    ("foo_bär.com", "host_idna"),
    # K: userinfo, including the UTS-46 at-signs
    ("user@example.com", "host_userinfo"),
    ("allowed@127.0.0.1", "host_userinfo"),
    ("a@b@c", "host_userinfo"),
    ("user＠example.com", "host_userinfo"),
    ("user﹫example.com", "host_userinfo"),
    ("[::1@x]", "host_userinfo"),
]


@pytest.mark.parametrize(("raw", "reason"), REJECTED)
def test_rejected(raw: str, reason: str) -> None:
    with pytest.raises(HostError) as info:
        canonical_host(raw)
    assert info.value.reason == reason


def test_length_limits() -> None:
    label63 = "a" * 63
    assert canonical_host(label63 + ".com").name == label63 + ".com"
    with pytest.raises(HostError) as info:
        canonical_host("a" * 64 + ".com")
    assert info.value.reason == "host_too_long"
    name253 = ".".join([label63] * 3 + ["b" * 61])
    assert len(name253) == 253
    assert canonical_host(name253 + ".").name == name253
    with pytest.raises(HostError) as info:
        canonical_host(name253 + "b")
    assert info.value.reason == "host_too_long"
    with pytest.raises(HostError) as info:
        canonical_host("a." * 600 + "com")
    assert info.value.reason == "host_too_long"
    # A U-label that fits in 63 characters but whose A-label does not.
    with pytest.raises(HostError) as info:
        canonical_host("ü" * 60 + ".de")
    assert info.value.reason == "host_too_long"


def test_errors_do_not_echo_secrets() -> None:
    for raw in ("user:s3cret@example.com", "user:s3cret＠example.com"):
        with pytest.raises(HostError) as info:
            canonical_host(raw)
        assert "s3cret" not in str(info.value)
    with pytest.raises(HostError) as info:
        canonical_host("example.com/api?token=s3cret")
    assert "s3cret" not in str(info.value)
    assert "'example.com'" in str(info.value)
    for authority in (
        "user:s3cret@example.com:443",
        "example.com:443/api?token=s3cret",
        "[::1]/api?token=s3cret",
        "a:b:443/api?token=s3cret",
    ):
        with pytest.raises(HostError) as info:
            split_authority(authority)
        assert "s3cret" not in str(info.value), authority


def test_error_message_is_bounded() -> None:
    with pytest.raises(HostError) as info:
        canonical_host("a" * 300 + ".com")
    assert len(str(info.value)) < 200


AUTHORITIES: list[tuple[str, int | None, Host, int]] = [
    ("example.com:443", None, Host("example.com"), 443),
    ("Example.COM.:8443", None, Host("example.com"), 8443),
    ("example.com", 80, Host("example.com"), 80),
    ("example.com:1", None, Host("example.com"), 1),
    ("example.com:65535", None, Host("example.com"), 65535),
    ("[::1]:8080", None, Host("::1", IPv6Address("::1")), 8080),
    ("[::1]", 443, Host("::1", IPv6Address("::1")), 443),
    ("127.0.0.1:80", None, Host("127.0.0.1", IPv4Address("127.0.0.1")), 80),
    ("bücher.de:443", None, Host("xn--bcher-kva.de"), 443),
]


@pytest.mark.parametrize(("authority", "default", "host", "port"), AUTHORITIES)
def test_split_authority(authority: str, default: int | None, host: Host, port: int) -> None:
    assert split_authority(authority, default) == (host, port)


BAD_AUTHORITIES: list[tuple[str, int | None, str]] = [
    ("example.com:0", None, "port_invalid"),
    ("example.com:65536", None, "port_invalid"),
    ("example.com:99999", None, "port_invalid"),
    ("example.com:123456", None, "port_invalid"),
    ("example.com:" + "9" * 5000, None, "port_invalid"),
    ("example.com:", None, "port_invalid"),
    ("example.com:", 443, "port_invalid"),
    ("example.com:+443", None, "port_invalid"),
    ("example.com:-1", None, "port_invalid"),
    ("example.com: 443", None, "port_invalid"),
    ("example.com:443 ", None, "port_invalid"),
    ("example.com:0x1bb", None, "port_invalid"),
    ("example.com:007", None, "port_invalid"),
    ("example.com:0443", None, "port_invalid"),
    ("example.com:４４３", None, "port_invalid"),
    ("example.com", None, "port_invalid"),
    ("[::1]", None, "port_invalid"),
    ("[::1]:", None, "port_invalid"),
    ("example.com", 0, "port_invalid"),
    ("example.com", 70000, "port_invalid"),
    ("user@example.com:443", None, "host_userinfo"),
    ("user:pw@example.com", 443, "host_userinfo"),
    ("example.com:443@evil.com", None, "host_userinfo"),
    ("::1:443", None, "host_ipv6_unbracketed"),
    ("fe80::1", 443, "host_ipv6_unbracketed"),
    ("[::1]443", None, "host_invalid_char"),
    ("[::1:443", None, "host_invalid_char"),
    ("[fe80::1%25lo]:443", None, "host_invalid_char"),
    (":443", None, "host_empty"),
    ("2130706433:80", None, "host_numeric"),
]


@pytest.mark.parametrize(("authority", "default", "reason"), BAD_AUTHORITIES)
def test_split_authority_rejects(authority: str, default: int | None, reason: str) -> None:
    with pytest.raises(HostError) as info:
        split_authority(authority, default)
    assert info.value.reason == reason


DENIED_NAMES: list[tuple[str, str | None]] = [
    ("metadata", "metadata_name"),
    ("metadata.google.internal", "metadata_name"),
    ("computeMetadata.metadata.google.internal", "metadata_name"),
    ("metadata.goog", "metadata_name"),
    ("instance-data", "metadata_name"),
    ("instance-data.", "metadata_name"),
    ("metadata.tencentyun.com", "metadata_name"),
    ("localhost", "localhost_name"),
    ("LOCALHOST.", "localhost_name"),
    ("foo.localhost", "localhost_name"),
    ("ip6-localhost", "localhost_name"),
    ("ip6-loopback", "localhost_name"),
    ("db.internal", "internal_name"),
    ("printer.local", "internal_name"),
    ("localhost.localdomain", "internal_name"),
    ("router.home.arpa", "internal_name"),
    ("home.arpa", "internal_name"),
    ("1.0.0.127.in-addr.arpa", "internal_name"),
    ("1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.ip6.arpa", "internal_name"),
    ("kubernetes", "single_label"),
    ("com", "single_label"),
    ("ⓛⓞⓒⓐⓛⓗⓞⓢⓣ", "localhost_name"),
    ("example.com", None),
    ("localhost.example.com", None),
    ("internal.example.com", None),
    ("notlocal", "single_label"),
    ("example.localhost.com", None),
    ("metadata.google.internal.evil.com", None),
    ("127.0.0.1", None),
    ("0.0.0.0", None),
    ("[::1]", None),
]


@pytest.mark.parametrize(("raw", "reason"), DENIED_NAMES)
def test_denied_name(raw: str, reason: str | None) -> None:
    assert denied_name(canonical_host(raw)) == reason
