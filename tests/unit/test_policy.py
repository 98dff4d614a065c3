"""Compiled policy matching, path normalisation and path globs (proxy/policy/model.py)."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sealgate.hostname import canonical_host
from sealgate.proxy.policy.model import (
    Budgets,
    PathError,
    PathPatternError,
    Policy,
    Rule,
    SandboxEntry,
    normalize_path,
    path_glob_regex,
)


def rule(
    host: str,
    ports: tuple[int, ...] = (80, 443),
    methods: tuple[str, ...] | None = None,
    paths: tuple[str, ...] | None = None,
    source: str = "t.yaml:1",
) -> Rule:
    return Rule(
        host,
        frozenset(ports),
        None if methods is None else frozenset(methods),
        paths,
        source,
    )


def policy(*rules: Rule) -> Policy:
    return Policy("p", "enforce", False, rules, (), Budgets())


def allowed(p: Policy, host: str, port: int = 443, method: str = "GET", path: str = "/") -> bool:
    return p.match(canonical_host(host), port, method, path) is not None


# --- hosts ------------------------------------------------------------------------------------

HOSTS = policy(
    rule("api.github.com"),
    rule("*.example.com"),
    rule("93.184.216.34"),
    rule("2001:db8::1"),
)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("api.github.com", True),
        ("API.GitHub.com.", True),  # canonicalised by hostname.py before matching
        ("github.com", False),
        ("x.api.github.com", False),  # exact means exact
        ("a.example.com", True),
        ("a.b.c.example.com", True),  # any depth below the suffix
        ("example.com", False),  # the apex is not a subdomain
        ("badexample.com", False),
        ("example.com.evil.net", False),
        ("93.184.216.34", True),
        ("93.184.216.35", False),
        ("[2001:db8::1]", True),
        ("[2001:db8:0:0::1]", True),  # one canonical spelling
        ("[2001:db8::2]", False),
    ],
)
def test_host_matching(host: str, expected: bool) -> None:
    assert allowed(HOSTS, host) is expected


def test_star_matches_every_name_but_no_ip_literal() -> None:
    p = policy(rule("*"))
    assert allowed(p, "anything.example.org")
    assert allowed(p, "example.com")
    assert not allowed(p, "93.184.216.34")
    assert not allowed(p, "[2001:db8::1]")


def test_wildcard_suffix_never_matches_ip_literal() -> None:
    # A name index keyed "216.34" must not be reachable from the IP 93.184.216.34.
    p = policy(rule("*.216.34"), rule("*.34"))
    assert not allowed(p, "93.184.216.34")


def test_ip_literal_rule_does_not_match_a_name() -> None:
    assert not allowed(policy(rule("93.184.216.34")), "example.com")


@pytest.mark.parametrize(
    ("port", "expected"), [(443, True), (80, True), (8443, False), (22, False)]
)
def test_default_ports(port: int, expected: bool) -> None:
    assert allowed(policy(rule("example.com")), "example.com", port=port) is expected


def test_explicit_ports_and_empty_ports() -> None:
    assert allowed(policy(rule("example.com", ports=(8443,))), "example.com", port=8443)
    assert not allowed(policy(rule("example.com", ports=(8443,))), "example.com", port=443)
    assert not allowed(policy(rule("example.com", ports=())), "example.com", port=443)


def test_methods_are_case_sensitive_and_empty_matches_nothing() -> None:
    p = policy(rule("example.com", methods=("GET", "HEAD")))
    assert allowed(p, "example.com", method="GET")
    assert allowed(p, "example.com", method="HEAD")
    assert not allowed(p, "example.com", method="POST")
    assert not allowed(p, "example.com", method="get")
    assert not allowed(policy(rule("example.com", methods=())), "example.com")
    assert allowed(policy(rule("example.com")), "example.com", method="DELETE")


def test_first_match_wins_in_file_order() -> None:
    first = rule("*", ports=(443,), source="f:1")
    second = rule("*.example.com", source="f:2")
    third = rule("a.example.com", source="f:3")
    p = policy(first, second, third)
    host = canonical_host("a.example.com")
    assert p.match(host, 443, "GET", "/") is first
    assert p.match(host, 80, "GET", "/") is second
    assert p.match_host(host, 443) == (first, second, third)
    assert [r.source for r in p.match_host(host, 80)] == ["f:2", "f:3"]
    # File order, not specificity: the exact rule listed first wins over a later wildcard.
    p = policy(third, second, first)
    assert p.match(host, 443, "GET", "/") is third


def test_match_falls_through_to_later_rule_when_earlier_one_restricts() -> None:
    reads = rule("api.github.com", methods=("GET",), source="f:1")
    comments = rule(
        "api.github.com", methods=("POST",), paths=("/repos/*/*/issues/*/comments",), source="f:2"
    )
    p = policy(reads, comments)
    host = canonical_host("api.github.com")
    assert p.match(host, 443, "GET", "/anything") is reads
    assert p.match(host, 443, "POST", "/repos/o/r/issues/1/comments") is comments
    assert p.match(host, 443, "POST", "/repos/o/r/pulls") is None
    assert p.match_host(host, 443) == (reads, comments)
    assert p.match_host(canonical_host("github.com"), 443) == ()


def test_empty_policy_allows_nothing() -> None:
    p = policy()
    assert p.match_host(canonical_host("example.com"), 443) == ()
    assert not allowed(p, "example.com")


def test_needs_request_inspection() -> None:
    assert not rule("example.com").needs_request_inspection
    assert rule("example.com", methods=("GET",)).needs_request_inspection
    assert rule("example.com", paths=("/**",)).needs_request_inspection
    assert rule("example.com", methods=()).needs_request_inspection


def test_rule_equality_ignores_source_and_sandbox_repr_hides_key() -> None:
    assert rule("example.com", source="a:1") == rule("example.com", source="b:9")
    entry = SandboxEntry("bot-1", "ci", bytes(32))
    assert "key_sha256" not in repr(entry)


# --- path globs -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("/repos/**", "/repos", True),
        ("/repos/**", "/repos/", True),
        ("/repos/**", "/repos/a/b/c", True),
        ("/repos/**", "/reposx", False),
        ("/repos/**", "/other/repos/x", False),
        ("/repos/*", "/repos/a", True),
        ("/repos/*", "/repos/", True),
        ("/repos/*", "/repos/a/b", False),
        ("/repos/*", "/repos", False),
        ("/repos/*/issues", "/repos/a/issues", True),
        ("/repos/*/issues", "/repos/a/b/issues", False),
        ("/a/**/b", "/a/b", True),
        ("/a/**/b", "/a/x/y/b", True),
        ("/a/**/b", "/a/x/y/bc", False),
        ("/v1/*.json", "/v1/data.json", True),
        ("/v1/*.json", "/v1/dir/data.json", False),
        ("/v1/*.json", "/v1/data.jsonp", False),
        ("/**/*.tar.gz", "/x/y/pkg-1.0.tar.gz", True),
        ("/**/*.tar.gz", "/pkg-1.0.tar.gz", True),
        ("/**", "/", True),
        ("/**", "/anything/at/all", True),
        ("/", "/", True),
        ("/", "/a", False),
        ("/exact", "/exact", True),
        ("/exact", "/exact/", False),
        ("/a.b", "/aXb", False),  # regex metacharacters are literal
        ("/my%20repo/*", "/my%20repo/x", True),  # compared with the raw encoded path
        ("/my%20repo/*", "/my repo/x", False),
    ],
)
def test_path_globs(pattern: str, path: str, expected: bool) -> None:
    p = policy(rule("example.com", paths=(pattern,)))
    assert allowed(p, "example.com", path=path) is expected


def test_several_paths_in_one_rule() -> None:
    p = policy(rule("example.com", paths=("/a/*", "/b/**")))
    assert allowed(p, "example.com", path="/a/x")
    assert allowed(p, "example.com", path="/b/x/y")
    assert not allowed(p, "example.com", path="/c")
    assert not allowed(policy(rule("example.com", paths=())), "example.com", path="/a/x")


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("repos/**", "must start with '/'"),
        ("/a?b=1", "query"),
        ("/a#frag", "fragment"),
        ("/a/../b", "dot segment"),
        ("/a//b", "empty segment"),
        ("/a\\b", "backslash"),
        ("/a b", "space"),
        ("/a%2fb", "encoded '/'"),
        ("/a**", "whole path segment"),
        ("/***", "whole path segment"),
        ("/a/*-*", "at most one '*' per path segment"),
        ("/**/a/**", "at most one '**'"),
    ],
)
def test_bad_path_patterns(pattern: str, message: str) -> None:
    with pytest.raises(PathPatternError, match=re.escape(message)) as info:
        path_glob_regex(pattern)
    assert info.value.reason == "path_pattern_invalid"


def test_hostile_paths_match_in_linear_time() -> None:
    p = policy(
        rule("example.com", paths=("/**/*x.json", "/a/*b/c/**", "/*/*/*/*/*/*/z")),
    )
    host = canonical_host("example.com")
    hostile = ["/" + "a" * 200_000, "/a/" * 50_000 + "x.jsonq", "/" + "/".join("b" * 40_000)]
    start = time.perf_counter()
    for path in hostile:
        assert p.match(host, 443, "GET", path) is None
    assert time.perf_counter() - start < 1.0


# --- normalize_path ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("/", "/"),
        ("/repos/a/b", "/repos/a/b"),
        ("/repos/a?x=1&y=/../z", "/repos/a"),  # the query is not part of the match
        ("/repos/a#frag", "/repos/a"),
        ("/repos/a?q#f", "/repos/a"),
        ("/repos/", "/repos/"),  # a trailing slash is a real (empty) last segment
        ("/.well-known/openid-configuration", "/.well-known/openid-configuration"),
        ("/a/..b/c.", "/a/..b/c."),
        ("/my%20repo/%41", "/my%20repo/%41"),  # returned as sent, never decoded
        ("/a;v=1/b", "/a;v=1/b"),
        ("/%25", "/%25"),
        ("/~user/x:y@z!$&'()*+,=", "/~user/x:y@z!$&'()*+,="),
    ],
)
def test_normalize_path_accepts(raw: str, expected: str) -> None:
    assert normalize_path(raw) == expected


@pytest.mark.parametrize(
    "raw",
    [
        "/repos/../admin",
        "/repos/./admin",
        "/repos/..",
        "/repos/.../admin",  # Windows trims trailing dots: "..." can act as ".."
        "/..",
        "/repos/%2e%2e/admin",
        "/repos/%2E%2E/admin",
        "/repos/.%2e/admin",
        "/repos/%2e/admin",
        "/repos/%252e%252e/admin",  # double-encoded
        "/repos/%25252e%25252e/admin",  # triple-encoded
        "/repos/..;/admin",  # Tomcat path parameter
        "/repos/..;jsessionid=1/admin",
        "/repos/%2e%2e%3b/admin",
        "/repos/%ef%bc%8e%ef%bc%8e/admin",  # fullwidth dots (NFKC)
        "/repos/%c0%ae%c0%ae/admin",  # overlong UTF-8
        "/repos%2fadmin",
        "/repos%2Fadmin",
        "/repos%252fadmin",
        "/repos%5cadmin",
        "/repos%ef%bc%8fadmin",  # fullwidth solidus
        "/a\\b",
        "/a\\..\\admin",
        "//admin",
        "/repos//admin",
        "/a%00b",
        "/a%0d%0ab",
        "/a\x00b",
        "/a\tb",
        "/a b",
        "/a\x7fb",
        "/caf\u00e9",
        "/a%zz",
        "/a%2",
        "/a%u002e",
        "repos/a",
        "",
        "*",
        "http://example.com/a",
        "?x=1",
    ],
)
def test_normalize_path_refuses(raw: str) -> None:
    with pytest.raises(PathError) as info:
        normalize_path(raw)
    assert info.value.reason == "path_invalid"


def test_normalize_path_refuses_encoding_deeper_than_three_rounds() -> None:
    with pytest.raises(PathError, match="too many times"):
        normalize_path("/a%2525252e")


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="/.%2eEfF5cC;a", max_size=24))
def test_normalize_path_output_has_no_dot_segments(raw: str) -> None:
    try:
        path = normalize_path(raw)
    except PathError:
        return
    segments = path.split("/")[1:]
    assert "" not in segments[:-1]
    for segment in segments:
        assert segment.partition(";")[0] not in (".", "..")
        assert "%2f" not in segment.lower() and "%5c" not in segment.lower()
