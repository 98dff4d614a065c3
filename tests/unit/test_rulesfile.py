"""Loading and validating rules files (proxy/policy/rulesfile.py)."""

from __future__ import annotations

import hashlib
import textwrap
from ipaddress import ip_network
from pathlib import Path

import pytest

from sealgate.hostname import canonical_host
from sealgate.proxy.policy.model import Budgets
from sealgate.proxy.policy.rulesfile import MAX_FILE_BYTES, RulesError, load_rules

REPO = Path(__file__).resolve().parents[2]
HEX = "ab" * 32
HEX2 = "cd" * 32


def write(directory: Path, text: str, name: str = "rules.yaml") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def error_for(tmp_path: Path, text: str) -> tuple[Path, RulesError]:
    path = write(tmp_path, text)
    with pytest.raises(RulesError) as info:
        load_rules(path)
    return path, info.value


def codes(path: Path) -> list[tuple[str, int | None, str]]:
    return [(w.code, w.line, w.field) for w in load_rules(path).warnings]


# --- a complete file --------------------------------------------------------------------------

FULL = f"""
version: 1
policies:
  ci-bot:
    mode: report
    tokens: true
    allow:
      - host: api.github.com
        ports: [443]
        methods: [GET, POST]
        paths: ["/repos/**"]
      - host: "*.pythonhosted.org"
    allow_networks: [10.1.0.0/16, "2001:db8:1::/48"]
    budgets:
      requests_per_second: 2.5
      burst: 5
      max_total_bytes: 1_000_000
  empty: {{}}
sandboxes:
  bot-1: {{policy: ci-bot, key_sha256: "{HEX.upper()}"}}
default_policy: empty
"""


def test_full_file(tmp_path: Path) -> None:
    path = write(tmp_path, FULL)
    rules = load_rules(path)
    assert rules.sources == (path,)
    # *.pythonhosted.org alone would pass through; tokens: true intercepts it.
    assert [w.code for w in rules.warnings] == ["tokens_intercept"]
    assert rules.default_policy == "empty"
    ci = rules.policies["ci-bot"]
    assert (ci.name, ci.mode, ci.tokens) == ("ci-bot", "report", True)
    assert ci.allow_networks == (ip_network("10.1.0.0/16"), ip_network("2001:db8:1::/48"))
    assert ci.budgets == Budgets(2.5, 5, 64, 10 * 1024 * 1024, 1_000_000)
    first, second = ci.rules
    assert first.host == "api.github.com"
    assert first.ports == frozenset({443})
    assert first.methods == frozenset({"GET", "POST"})
    assert first.paths == ("/repos/**",)
    assert first.source == f"{path}:7"
    assert first.needs_request_inspection
    assert second.host == "*.pythonhosted.org"
    assert second.ports == frozenset({80, 443})
    assert second.methods is None and second.paths is None
    assert not second.needs_request_inspection
    assert ci.match(canonical_host("api.github.com"), 443, "POST", "/repos/a/b") is first
    assert ci.match(canonical_host("files.pythonhosted.org"), 80, "PUT", "/x") is second
    empty = rules.policies["empty"]
    assert (empty.mode, empty.tokens, empty.rules, empty.allow_networks) == (
        "enforce",
        False,
        (),
        (),
    )
    assert empty.budgets == Budgets()
    bot = rules.sandboxes["bot-1"]
    assert (bot.id, bot.policy, bot.key_sha256) == ("bot-1", "ci-bot", bytes.fromhex(HEX))


def test_minimal_file_denies_everything(tmp_path: Path) -> None:
    rules = load_rules(write(tmp_path, "version: 1\n"))
    assert dict(rules.policies) == {}
    assert dict(rules.sandboxes) == {}
    assert rules.default_policy is None


def test_shipped_default_and_examples_load_cleanly() -> None:
    default = load_rules(REPO / "rules" / "default.yaml")
    assert default.warnings == ()
    assert dict(default.sandboxes) == {}
    assert default.default_policy is None
    example = default.policies["example"]
    assert all(rule.methods == frozenset({"GET"}) for rule in example.rules)
    assert example.match(canonical_host("pypi.org"), 443, "GET", "/") is None
    assert example.match(canonical_host("www.pypi.org"), 443, "GET", "/") is not None
    examples = load_rules(REPO / "rules" / "examples")
    assert examples.warnings == ()
    assert {"ci-bot", "new-agent"} <= set(examples.policies)
    for sandbox in examples.sandboxes.values():
        assert sandbox.policy in examples.policies


def test_sandbox_key_is_sha256_of_password(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"s3cret").hexdigest()
    path = write(
        tmp_path,
        f"""
        version: 1
        policies: {{p: {{}}}}
        sandboxes:
          s: {{policy: p, key_sha256: "{digest}"}}
        """,
    )
    assert load_rules(path).sandboxes["s"].key_sha256 == hashlib.sha256(b"s3cret").digest()


# --- errors -----------------------------------------------------------------------------------

ERRORS = [
    # (yaml, line, field, message fragment)
    ("version: 1\npolicy: {}\n", 2, "policy", "unknown key 'policy'"),
    ("policies: {}\n", 1, "version", "required key is missing"),
    ("version: 2\n", 1, "version", "unsupported rules version '2'"),
    ('version: "1"\n', 1, "version", "unsupported rules version '1'"),
    ("version: [1]\n", 1, "version", "unsupported rules version a list"),
    (
        "version: 1\npolicies:\n  p:\n    alow: []\n",
        4,
        "policies.p.alow",
        "unknown key 'alow'",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - host: a.com\n        port: [443]\n",
        6,
        "policies.p.allow[0].port",
        "unknown key 'port'",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - ports: [443]\n",
        5,
        "policies.p.allow[0].host",
        "required key is missing",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - host: a.com\n        ports:\n"
        "          - 443\n          - 0\n",
        8,
        "policies.p.allow[0].ports",
        "port 0 out of range 1-65535",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: a.com, ports: [65536]}\n",
        5,
        "policies.p.allow[0].ports",
        "port 65536 out of range 1-65535",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: a.com, ports: ['443']}\n",
        5,
        "policies.p.allow[0].ports",
        "expected an integer, got a string",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: a.com, ports: [0443]}\n",
        5,
        "policies.p.allow[0].ports",
        "not a plain decimal integer",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: a.com, ports: [0x1bb]}\n",
        5,
        "policies.p.allow[0].ports",
        "not a plain decimal integer",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: a.com, ports: 443}\n",
        5,
        "policies.p.allow[0].ports",
        "expected a list, got a number",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: a.com, methods: [get]}\n",
        5,
        "policies.p.allow[0].methods",
        "'get' is not an HTTP method token (methods are case-sensitive",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: a.com, methods: ['G ET']}\n",
        5,
        "policies.p.allow[0].methods",
        "is not an HTTP method token",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: a.com, paths: [repos]}\n",
        5,
        "policies.p.allow[0].paths",
        "'repos': path pattern must start with '/'",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: a.com, paths: ['/a**']}\n",
        5,
        "policies.p.allow[0].paths",
        "'**' must be a whole path segment",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: a.com, paths: ['/a/../b']}\n",
        5,
        "policies.p.allow[0].paths",
        "can never match a valid request path",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: 'exa mple.com'}\n",
        5,
        "policies.p.allow[0].host",
        "invalid host: ",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: 'a*.example.com'}\n",
        5,
        "policies.p.allow[0].host",
        "'*' is only allowed alone or as a leading '*.'",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: '*.*.example.com'}\n",
        5,
        "policies.p.allow[0].host",
        "'*' is only allowed alone or as a leading '*.'",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: '*.10.0.0.1'}\n",
        5,
        "policies.p.allow[0].host",
        "a wildcard cannot cover an IP address",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: '0x7f000001'}\n",
        5,
        "policies.p.allow[0].host",
        "invalid host",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: 'a.com:443'}\n",
        5,
        "policies.p.allow[0].host",
        "invalid host: ",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: '*.'}\n",
        5,
        "policies.p.allow[0].host",
        "invalid host: ",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: 'user@a.com'}\n",
        5,
        "policies.p.allow[0].host",
        "invalid host: ",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow: [api.github.com]\n",
        4,
        "policies.p.allow[0]",
        "expected a mapping, got a string",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - {host: 443}\n",
        5,
        "policies.p.allow[0].host",
        "expected a string, got a number",
    ),
    (
        "version: 1\npolicies:\n  p:\n    mode: permissive\n",
        4,
        "policies.p.mode",
        "must be enforce or report",
    ),
    (
        "version: 1\npolicies:\n  p:\n    tokens: yes\n",
        4,
        "policies.p.tokens",
        "write true or false, not 'yes'",
    ),
    (
        "version: 1\npolicies:\n  p:\n    tokens: 'true'\n",
        4,
        "policies.p.tokens",
        "expected true or false, got a string",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n",
        4,
        "policies.p.allow",
        "expected a list, got null",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow: {host: a.com}\n",
        4,
        "policies.p.allow",
        "expected a list, got a mapping",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow_networks: [10.0.0.0/33]\n",
        4,
        "policies.p.allow_networks",
        "invalid network",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow_networks: [10.0.0.1/8]\n",
        4,
        "policies.p.allow_networks",
        "has host bits set",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow_networks: [intranet]\n",
        4,
        "policies.p.allow_networks",
        "invalid network",
    ),
    (
        "version: 1\npolicies:\n  p:\n    budgets: {burst: 0}\n",
        4,
        "policies.p.budgets.burst",
        "0 out of range 1-",
    ),
    (
        "version: 1\npolicies:\n  p:\n    budgets: {requests_per_second: 0}\n",
        4,
        "policies.p.budgets.requests_per_second",
        "must be a decimal number > 0",
    ),
    (
        "version: 1\npolicies:\n  p:\n    budgets: {requests_per_second: -1}\n",
        4,
        "policies.p.budgets.requests_per_second",
        "must be a decimal number > 0",
    ),
    (
        "version: 1\npolicies:\n  p:\n    budgets: {requests_per_second: .inf}\n",
        4,
        "policies.p.budgets.requests_per_second",
        "must be a decimal number > 0",
    ),
    (
        "version: 1\npolicies:\n  p:\n    budgets: {max_request_bytes: -1}\n",
        4,
        "policies.p.budgets.max_request_bytes",
        "-1 out of range 0-",
    ),
    (
        "version: 1\npolicies:\n  p:\n    budgets: {max_conections: 3}\n",
        4,
        "policies.p.budgets.max_conections",
        "unknown key 'max_conections'",
    ),
    (
        "version: 1\npolicies:\n  'bad name': {}\n",
        3,
        "policies.bad name",
        "policy 'bad name' must be",
    ),
    (
        "version: 1\npolicies:\n  p: {}\n  p: {}\n",
        4,
        "policies.p",
        "duplicate key (first at line 3)",
    ),
    ("version: 1\npolicies:\n  1: {}\n", 3, "policies", "keys must be plain strings"),
    (
        "version: 1\npolicies: {p: {}}\nsandboxes:\n  'bot:1': {policy: p, key_sha256: x}\n",
        4,
        "sandboxes.bot:1",
        "id 'bot:1' must be",
    ),
    (
        "version: 1\npolicies: {p: {}}\nsandboxes:\n  bot:\n    policy: p\n",
        4,
        "sandboxes.bot.key_sha256",
        "required key is missing",
    ),
    (
        f"version: 1\npolicies: {{p: {{}}}}\nsandboxes:\n  bot:\n    policy: p\n"
        f"    key_sha256: '{HEX}'\n    role: admin\n",
        7,
        "sandboxes.bot.role",
        "unknown key 'role'",
    ),
    (
        f"version: 1\npolicies: {{p: {{}}}}\nsandboxes:\n  bot:\n    policy: q\n"
        f"    key_sha256: '{HEX}'\n",
        5,
        "sandboxes.bot.policy",
        "no policy named 'q'",
    ),
    (
        "version: 1\npolicies: {p: {}}\nsandboxes:\n  bot:\n    policy: p\n    key_sha256: 'abc'\n",
        6,
        "sandboxes.bot.key_sha256",
        "must be 64 hex digits",
    ),
    (
        "version: 1\npolicies: {p: {}}\nsandboxes:\n  bot:\n    policy: p\n"
        f"    key_sha256: '{'g' * 64}'\n",
        6,
        "sandboxes.bot.key_sha256",
        "must be 64 hex digits",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - host: a.test\n        inject:\n"
        "          - {secret: 'env:A', as: bearer}\n"
        "          - {secret: 'env:B', as: {type: placeholder, header: Authorization,"
        " placeholder: sg-placeholder}}\n",
        7,
        "policies.p.allow[0].inject",
        "[0] and [1] both write authorization",
    ),
    (
        "version: 1\npolicies:\n  p:\n    allow:\n      - host: a.test\n        inject:\n"
        "          - {secret: 'env:A', as: {type: query, param: k}}\n"
        "          - {secret: 'env:B', as: {type: header, header: X-K, format: '{secret}'}}\n"
        "          - {secret: 'env:C', as: {type: query, param: k}}\n",
        7,
        "policies.p.allow[0].inject",
        "[0] and [2] both write ?k",
    ),
    ("version: 1\ndefault_policy: nope\n", 2, "default_policy", "no policy named 'nope'"),
    ("version: 1\ndefault_policy: [p]\n", 2, "default_policy", "expected a string, got a list"),
    ("- version: 1\n", 1, "", "expected a mapping, got a list"),
    ("version: 1\npolicies: [p]\n", 2, "policies", "expected a mapping, got a list"),
]


@pytest.mark.parametrize(("text", "line", "field", "fragment"), ERRORS)
def test_validation_errors(tmp_path: Path, text: str, line: int, field: str, fragment: str) -> None:
    path, err = error_for(tmp_path, text)
    assert (err.path, err.line, err.field) == (path, line, field)
    prefix = f"{path}:{line}: {field}: " if field else f"{path}:{line}: "
    assert str(err).startswith(prefix), str(err)
    assert fragment in str(err), str(err)
    assert err.reason == "rules_invalid"


def test_error_matches_documented_format(tmp_path: Path) -> None:
    (tmp_path / "rules").mkdir()
    text = (
        "version: 1\npolicies:\n  ci-bot:\n    allow:\n      - host: api.github.com\n"
        "        ports: [0]\n"
    )
    (tmp_path / "rules" / "ci.yaml").write_text(text)
    with pytest.raises(RulesError) as info:
        load_rules(tmp_path / "rules" / "ci.yaml")
    assert str(info.value) == (
        f"{tmp_path}/rules/ci.yaml:6: policies.ci-bot.allow[0].ports: port 0 out of range 1-65535"
    )


def test_host_error_never_echoes_userinfo(tmp_path: Path) -> None:
    _, err = error_for(
        tmp_path,
        "version: 1\npolicies:\n  p:\n    allow: [{host: 'bot:hunter2@api.github.com'}]\n",
    )
    assert "hunter2" not in str(err)
    assert "policies.p.allow[0].host: invalid host: " in str(err)


def test_key_hash_error_never_echoes_the_value(tmp_path: Path) -> None:
    password = "hunter2-the-actual-password"
    _, err = error_for(
        tmp_path,
        "version: 1\npolicies: {p: {}}\nsandboxes:\n"
        f"  b: {{policy: p, key_sha256: '{password}'}}\n",
    )
    assert password not in str(err)
    assert "got 27 characters" in str(err)


@pytest.mark.parametrize(
    "reference",
    ["{secret}", "file:{secret}#x", "env:{secret}!", "vault:{secret}", "vault:kv/{secret}#f!"],
)
def test_secret_reference_error_never_echoes_the_reference(tmp_path: Path, reference: str) -> None:
    """A secret pasted where its reference belongs must not travel on into logs."""
    secret = "ghp_CANARY0123456789abcdef"
    _, err = error_for(
        tmp_path,
        "version: 1\npolicies:\n  p:\n    allow:\n      - host: a.test\n        inject:\n"
        f"          - {{secret: '{reference.format(secret=secret)}', as: bearer}}\n",
    )
    assert secret not in str(err)
    assert err.field == "policies.p.allow[0].inject[0].secret"


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("version: 1\npolicies:\n  p: &a {}\n  q: *a\n", 3, "anchors and aliases"),
        ("version: 1\npolicies: !!python/object:os.system {}\n", 2, "tags are not allowed"),
        ("version: !!int 1\n", 1, "tags are not allowed"),
        ("version: 1\npolicies: {p: {}\n", 3, "YAML syntax error"),
        ("version: 1\n  bad: indent\n", 2, "YAML syntax error"),
        ("version: 1\n---\nversion: 1\n", 2, "YAML syntax error"),
        ("version: 1\nx: " + "[" * 40 + "]" * 40 + "\n", 2, "nested deeper than 32 levels"),
    ],
)
def test_yaml_level_errors(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    path, err = error_for(tmp_path, text)
    assert err.line == line
    assert str(err).startswith(f"{path}:{line}: ")
    assert fragment in str(err)


def test_billion_laughs_is_refused_before_expansion(tmp_path: Path) -> None:
    lines = ["version: 1", "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    _, err = error_for(tmp_path, "\n".join(lines) + "\n")
    assert "anchors and aliases" in str(err)


def test_file_level_errors(tmp_path: Path) -> None:
    empty = write(tmp_path, "", "empty.yaml")
    with pytest.raises(RulesError, match="file is empty"):
        load_rules(empty)
    comments = write(tmp_path, "# nothing\n", "comments.yaml")
    with pytest.raises(RulesError, match="file is empty"):
        load_rules(comments)
    big = tmp_path / "big.yaml"
    big.write_text("version: 1\n" + "#" * MAX_FILE_BYTES + "\n")
    with pytest.raises(RulesError, match="larger than 1048576 bytes") as info:
        load_rules(big)
    assert info.value.line is None
    assert str(info.value).startswith(f"{big}: ")
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"version: 1\n# caf\xe9\n")
    with pytest.raises(RulesError, match="not valid UTF-8"):
        load_rules(latin1)
    with pytest.raises(RulesError, match="not a file or directory"):
        load_rules(tmp_path / "missing.yaml")


# --- warnings ---------------------------------------------------------------------------------

WARNINGS = [
    # (policy body lines under `p:`, code, line, field)
    ("allow:\n  - {host: a.com, ports: []}", "never_matches", 5, "policies.p.allow[0].ports"),
    ("allow:\n  - {host: a.com, methods: []}", "never_matches", 5, "policies.p.allow[0].methods"),
    ("allow:\n  - {host: a.com, paths: []}", "never_matches", 5, "policies.p.allow[0].paths"),
    ("allow:\n  - {host: localhost}", "never_matches", 5, "policies.p.allow[0].host"),
    ("allow:\n  - {host: '*.internal'}", "never_matches", 5, "policies.p.allow[0].host"),
    (
        "allow:\n  - {host: metadata.google.internal}",
        "never_matches",
        5,
        "policies.p.allow[0].host",
    ),
    ("allow:\n  - {host: intranet}", "never_matches", 5, "policies.p.allow[0].host"),
    ("allow:\n  - {host: '*'}", "any_host", 5, "policies.p.allow[0].host"),
    ("allow:\n  - {host: '*.com'}", "broad_wildcard", 5, "policies.p.allow[0].host"),
    ("allow:\n  - {host: 93.184.216.34}", "ip_literal_host", 5, "policies.p.allow[0].host"),
    ("allow:\n  - {host: '2001:db8::1'}", "ip_literal_host", 5, "policies.p.allow[0].host"),
    ("allow:\n  - {host: Example.COM}", "noncanonical_host", 5, "policies.p.allow[0].host"),
    ("allow:\n  - {host: 'bücher.example'}", "noncanonical_host", 5, "policies.p.allow[0].host"),
    (
        "allow:\n  - {host: a.com, ports: [443]}\n  - {host: a.com, ports: [443]}",
        "duplicate_rule",
        6,
        "policies.p.allow[1]",
    ),
    ("allow_networks: [10.0.0.0/8]", "wide_network", 4, "policies.p.allow_networks"),
    ("allow_networks: ['2001:db8::/32']", "wide_network", 4, "policies.p.allow_networks"),
    ("allow_networks: [169.254.169.254/32]", "metadata_network", 4, "policies.p.allow_networks"),
    ("allow_networks: ['fd00:ec2::/64']", "metadata_network", 4, "policies.p.allow_networks"),
    ("allow_networks: ['::ffff:0:0/96']", "metadata_network", 4, "policies.p.allow_networks"),
    ("tokens: true\nallow:\n  - {host: a.com}", "tokens_intercept", 4, "policies.p.tokens"),
]


@pytest.mark.parametrize(("body", "code", "line", "field"), WARNINGS)
def test_warnings(tmp_path: Path, body: str, code: str, line: int, field: str) -> None:
    text = "version: 1\npolicies:\n  p:\n" + textwrap.indent(body, "    ") + "\n"
    path = write(tmp_path, text)
    rules = load_rules(path)
    found = [w for w in rules.warnings if w.code == code]
    assert len(found) == 1, rules.warnings
    warning = found[0]
    assert (warning.path, warning.line, warning.field) == (path, line, field)
    assert str(warning).startswith(f"{path}:{line}: {field}: ")


def test_warned_rules_still_load_with_canonical_patterns(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        version: 1
        policies:
          p:
            allow:
              - host: "*.Example.COM."
              - host: "[2001:DB8:0::1]"
              - host: 'bücher.example'
        """,
    )
    rules = load_rules(path)
    assert [r.host for r in rules.policies["p"].rules] == [
        "*.example.com",
        "2001:db8::1",
        "xn--bcher-kva.example",
    ]
    assert [w.code for w in rules.warnings] == [
        "noncanonical_host",
        "noncanonical_host",
        "ip_literal_host",
        "noncanonical_host",
    ]
    assert "'*.example.com'" in rules.warnings[0].message


def test_canonical_ipv6_without_brackets_is_not_noncanonical(tmp_path: Path) -> None:
    path = write(tmp_path, "version: 1\npolicies:\n  p:\n    allow: [{host: '2001:db8::1'}]\n")
    assert codes(path) == [("ip_literal_host", 4, "policies.p.allow[0].host")]


def test_both_wide_and_metadata_network(tmp_path: Path) -> None:
    path = write(tmp_path, "version: 1\npolicies:\n  p:\n    allow_networks: [0.0.0.0/0]\n")
    assert [c for c, _, _ in codes(path)] == ["wide_network", "metadata_network"]


def test_shared_key_warning(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
        version: 1
        policies: {{p: {{}}}}
        sandboxes:
          a: {{policy: p, key_sha256: "{HEX}"}}
          b: {{policy: p, key_sha256: "{HEX}"}}
          c: {{policy: p, key_sha256: "{HEX2}"}}
        """,
    )
    assert codes(path) == [("shared_key", 5, "sandboxes.b.key_sha256")]


# --- directories ------------------------------------------------------------------------------


def test_directory_merges_sorted_yaml_files(tmp_path: Path) -> None:
    write(tmp_path, f"version: 1\nsandboxes:\n  bot: {{policy: p, key_sha256: '{HEX}'}}\n", "b.yml")
    write(tmp_path, "version: 1\npolicies:\n  p:\n    allow: [{host: '*'}]\n", "a.yaml")
    write(tmp_path, "version: 1\ndefault_policy: p\n", "c.yaml")
    write(tmp_path, "not: [valid", ".#a.yaml")  # editor lock file: skipped
    write(tmp_path, "not: [valid", "notes.txt")
    (tmp_path / "sub.yaml").mkdir()  # a directory, not a rules file
    rules = load_rules(tmp_path)
    assert rules.sources == (tmp_path / "a.yaml", tmp_path / "b.yml", tmp_path / "c.yaml")
    assert rules.sandboxes["bot"].policy == "p"
    assert rules.default_policy == "p"
    assert [(w.code, w.path) for w in rules.warnings] == [("any_host", tmp_path / "a.yaml")]


@pytest.mark.parametrize(
    ("first", "second", "field", "fragment"),
    [
        (
            "version: 1\npolicies:\n  p: {}\n",
            "version: 1\n\npolicies:\n  p: {}\n",
            "policies.p",
            "policy 'p' is also defined at {a}:3",
        ),
        (
            "version: 1\npolicies: {p: {}}\nsandboxes:\n"
            f"  s: {{policy: p, key_sha256: '{HEX}'}}\n",
            f"version: 1\n\nsandboxes:\n  s: {{policy: p, key_sha256: '{HEX2}'}}\n",
            "sandboxes.s",
            "sandbox 's' is also defined at {a}:4",
        ),
        (
            "version: 1\npolicies: {p: {}}\ndefault_policy: p\n",
            "version: 1\n\n\ndefault_policy: p\n",
            "default_policy",
            "default_policy is also set at {a}:3",
        ),
    ],
)
def test_directory_duplicates_name_both_places(
    tmp_path: Path, first: str, second: str, field: str, fragment: str
) -> None:
    a = write(tmp_path, first, "a.yaml")
    b = write(tmp_path, second, "b.yaml")
    with pytest.raises(RulesError) as info:
        load_rules(tmp_path)
    err = info.value
    assert (err.path, err.line, err.field) == (b, 4, field)
    assert fragment.format(a=a) in str(err)
    assert str(err).startswith(f"{b}:4: {field}: ")


def test_null_default_policy_in_several_files_is_fine(tmp_path: Path) -> None:
    write(tmp_path, "version: 1\ndefault_policy: null\n", "a.yaml")
    write(tmp_path, "version: 1\npolicies: {p: {}}\ndefault_policy: p\n", "b.yaml")
    write(tmp_path, "version: 1\ndefault_policy: ~\n", "c.yaml")
    assert load_rules(tmp_path).default_policy == "p"


def test_directory_error_names_the_failing_file(tmp_path: Path) -> None:
    write(tmp_path, "version: 1\n", "a.yaml")
    bad = write(tmp_path, "version: 1\npolicies:\n  p: {mode: off}\n", "b.yaml")
    with pytest.raises(RulesError) as info:
        load_rules(tmp_path)
    assert info.value.path == bad
    assert str(info.value).startswith(f"{bad}:3: policies.p.mode: ")


def test_empty_directory_is_an_error(tmp_path: Path) -> None:
    write(tmp_path, "version: 1\n", "rules.json")
    with pytest.raises(RulesError, match=r"no \*\.yaml or \*\.yml files") as info:
        load_rules(tmp_path)
    assert info.value.line is None


def test_vault_secret_in_split_form(tmp_path: Path) -> None:
    rules = load_rules(write(tmp_path, (
        "version: 1\npolicies:\n  p:\n    allow:\n      - host: a.test\n        inject:\n"
        "          - secret: {mount: kv, path: ci/github, field: token}\n            as: bearer\n"
        "          - secret: {mount: secret, path: app, field: k, kv_version: 1}\n"
        "            as: {type: header, header: X-Key, format: '{secret}'}\n"
    )))
    refs = [str(i.secret) for i in rules.policies["p"].rules[0].inject]
    assert refs == ["vault:kv/data/ci/github#token", "vault:secret/app#k"]


@pytest.mark.parametrize(("secret", "field", "fragment"), [
    ("{mount: kv, path: a}", "inject[0].secret.field", "required key is missing"),
    ("{mount: kv, path: a, field: f, kv_version: 3}", "inject[0].secret.kv_version",
     "out of range 1-2"),
    ("{mount: kv, path: a, field: f, engine: kv}", "inject[0].secret.engine", "unknown key"),
])
def test_vault_split_form_errors(tmp_path: Path, secret: str, field: str, fragment: str) -> None:
    _, err = error_for(
        tmp_path,
        "version: 1\npolicies:\n  p:\n    allow:\n      - host: a.test\n        inject:\n"
        f"          - {{secret: {secret}, as: bearer}}\n",
    )
    assert err.field == f"policies.p.allow[0].{field}"
    assert fragment in err.message


# --- response_timeout -----------------------------------------------------------------------

@pytest.mark.parametrize("value", ["0", "-1", "86401", "soon", "1e3", "[5]", "true"])
def test_response_timeout_must_be_a_sane_number_of_seconds(tmp_path: Path, value: str) -> None:
    _, err = error_for(tmp_path, f"""
        version: 1
        policies:
          p:
            allow:
              - host: api.example.com
                response_timeout: {value}
        """)
    assert "response_timeout" in str(err)


def test_response_timeout_is_read_and_means_the_request_is_seen(tmp_path: Path) -> None:
    rules = load_rules(write(tmp_path, """
        version: 1
        policies:
          p:
            allow:
              - host: api.example.com
                response_timeout: 300
              - host: other.example.com
        """))
    first, second = rules.policies["p"].rules
    assert first.response_timeout == 300.0 and first.needs_request_inspection
    assert second.response_timeout is None and not second.needs_request_inspection
