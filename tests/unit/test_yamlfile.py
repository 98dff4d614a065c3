"""The one strict YAML reader (sealgate/yamlfile.py), and the files read with it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sealgate.issuer.callers import CallersFileError, load_callers
from sealgate.yamlfile import YamlFile, YamlFileError

CALLER = (
    "    hosts: [api.example.com]\n"
    "    processors: [bearer]\n"
    "    max_ttl: 15m\n"
    f"    key_sha256: '{'ab' * 32}'\n"
)


def write(tmp_path: Path, text: str, name: str = "f.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_data_is_plain_values(tmp_path: Path) -> None:
    text = "a: [1, -2, 1_000, true, False, null, x, '0x10', 1.5]\nb: {c: {}}\n"
    assert YamlFile(write(tmp_path, text)).data() == {
        "a": [1, -2, 1000, True, False, None, "x", "0x10", 1.5],
        "b": {"c": {}},
    }


def test_an_empty_file_has_no_data(tmp_path: Path) -> None:
    assert YamlFile(write(tmp_path, "# only a comment\n")).data() is None


@pytest.mark.parametrize(
    ("text", "line", "field", "words"),
    [
        # YAML 1.1 reads these as 8, 16, 90 and True: one spelling per value instead.
        ("a:\n  b: 010\n", 2, "a.b", "not a plain decimal integer"),
        ("a:\n  b: 0x10\n", 2, "a.b", "not a plain decimal integer"),
        ("a: [1, 1:30]\n", 1, "a[1]", "not a plain decimal integer"),
        ("a: {b: yes}\n", 1, "a.b", "write true or false"),
        ("a: 1\na: 2\n", 2, "a", "duplicate key (first at line 1)"),
        ("a:\n  1: x\n", 2, "a", "keys must be plain strings"),
        ("a: &x [1]\nb: *x\n", 1, "", "anchors and aliases are not allowed"),
        ("a: !!str 1\n", 1, "", "tags are not allowed"),
        ("a: [1\n", 2, "", "YAML syntax error"),
    ],
)
def test_refusals_name_file_line_and_field(
    tmp_path: Path, text: str, line: int, field: str, words: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(YamlFileError) as info:
        YamlFile(path).data()
    err = info.value
    assert (err.path, err.line, err.field) == (path, line, field)
    assert str(err).startswith(f"{path}:{line}: ") and words in str(err)


def test_file_level_refusals(tmp_path: Path) -> None:
    with pytest.raises(YamlFileError, match="larger than 10 bytes"):
        YamlFile(write(tmp_path, "a: 12345678901\n"), max_bytes=10)
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"a: caf\xe9\n")
    with pytest.raises(YamlFileError, match=r"not valid UTF-8 \(byte 6\)"):
        YamlFile(latin1)
    with pytest.raises(YamlFileError, match="cannot read"):
        YamlFile(tmp_path / "missing.yaml")


def test_a_subclass_raises_its_own_error(tmp_path: Path) -> None:
    class MyError(YamlFileError):
        pass

    class MyFile(YamlFile):
        error_type = MyError

    with pytest.raises(MyError):
        MyFile(write(tmp_path, "a: &x 1\n"))


# --- the callers file: read as strictly as the rules (issue 10, item 2) ----------------------


def test_callers_file_reads_as_before(tmp_path: Path) -> None:
    registry = load_callers(write(tmp_path, "callers:\n  ci:\n" + CALLER, "callers.yaml"))
    assert registry.names == ("ci",)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        # An alias pulls one caller's limits into another, out of sight of the reviewer of
        # the second: the old loader accepted this, the shared reader refuses it.
        (
            "defaults: &d\n" + CALLER.replace("    ", "  ") + "callers:\n  ci: *d\n",
            ":1: YAML anchors and aliases are not allowed",
        ),
        ("callers:\n  ci:\n" + CALLER.replace("15m", "!!str 15m"), ":5: YAML tags are not allowed"),
        # YAML 1.1 reads 01604 as octal, 900 seconds: a typo becomes an error, not a lifetime.
        (
            "callers:\n  ci:\n" + CALLER.replace("15m", "01604"),
            ":5: callers.ci.max_ttl: '01604' is not a plain decimal integer",
        ),
    ],
)
def test_callers_file_refuses_what_rules_refuse(tmp_path: Path, text: str, words: str) -> None:
    path = write(tmp_path, text, "callers.yaml")
    with pytest.raises(CallersFileError) as info:
        load_callers(path)
    assert str(info.value).startswith(str(path)) and words in str(info.value)


def test_callers_file_as_json_still_reads(tmp_path: Path) -> None:
    # JSON is YAML: a generated callers file keeps working.
    entry = {"hosts": ["api.example.com"], "processors": ["bearer"], "max_ttl": 900,
             "key_sha256": "ab" * 32}
    registry = load_callers(write(tmp_path, json.dumps({"callers": {"ci": entry}}), "c.json"))
    assert registry.names == ("ci",)
