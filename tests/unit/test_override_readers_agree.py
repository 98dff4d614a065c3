"""The two readers of method-override and reroute headers agree (policy/reshaping.py says what
they are): the proxy's, `RequestFacts.of`, over a mitmproxy request's raw fields (bytes, in its
one pass), and `reshaping.overrides_in`, over the `(str, str)` pairs the `http_request` tool is
given. Fed the same header sets, both refuse them (the proxy: `malformed` or `rerouted`; the
tool's reader: a Denial) or both take them, naming the same methods in the same order.

The same header set, as each reader's caller has it: the proxy a real `http.Request` holding
the bytes on the wire; the tool the strings those bytes are (UTF-8, as the tool's strings are
sent; mitmproxy's own str view of the same fields). Header sets hold no control characters
outside the override headers' values: the proxy refuses any field that does (malformed) and the
tool refuses them before its reader runs."""

# ruff: noqa: RUF001 - confusable characters are the point of these inputs

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy import http

from sealgate.proxy.errors import Denial
from sealgate.proxy.policy import reshaping
from sealgate.proxy.request.flowstate import RequestFacts

REFUSED = "refused"
Reading = tuple[str, ...] | str


def _request(fields: list[tuple[bytes, bytes]]) -> http.Request:
    return http.Request.make("POST", "https://api.example.test/v1/items", b"", fields)


def _proxy(fields: list[tuple[bytes, bytes]]) -> Reading:
    facts = RequestFacts.of(_request(fields))
    return REFUSED if facts.malformed or facts.rerouted else facts.overrides


def _tool(fields: list[tuple[bytes, bytes]]) -> Reading:
    try:
        return reshaping.overrides_in(_request(fields).headers.items(multi=True))
    except Denial:
        return REFUSED


def _fields(pairs: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.encode(), value.encode()) for name, value in pairs]


OVERRIDE = "X-HTTP-Method-Override"
# fmt: off
CASES: list[tuple[list[tuple[str, str]], Reading]] = [
    ([], ()),
    ([("Accept", "application/json")], ()),
    ([(OVERRIDE, "DELETE")], ("DELETE",)),
    ([("x-http-method-override", "delete")], ("DELETE",)),
    ([("X_HTTP_Method_Override", "Delete")], ("DELETE",)),
    ([("X-Http_METHOD-override", "put")], ("PUT",)),
    ([("X-HTTP-Method", "PATCH")], ("PATCH",)),
    ([("X_Method_Override", "patch")], ("PATCH",)),
    ([(OVERRIDE, " DELETE "), ("X-HTTP-Method", "\tget\t")], ("DELETE", "GET")),
    ([(OVERRIDE, "DELETE"), (OVERRIDE, "PUT")], ("DELETE", "PUT")),  # duplicates, in order
    ([(OVERRIDE, "DELETE"), ("x_http_method_override", "DELETE")], ("DELETE", "DELETE")),
    ([(OVERRIDE, "M-SEARCH")], ("M-SEARCH",)),  # any token is a method
    ([(OVERRIDE, "")], REFUSED),
    ([(OVERRIDE, "  ")], REFUSED),
    ([(OVERRIDE, "DELETE"), (OVERRIDE, "")], REFUSED),
    ([(OVERRIDE, "DE LETE")], REFUSED),
    ([(OVERRIDE, "GET, DELETE")], REFUSED),
    ([(OVERRIDE, "DELETE;")], REFUSED),
    # Non-ASCII: never a method, though Unicode's case and space rules make some look like one.
    ([(OVERRIDE, "poſt")], REFUSED),  # U+017F upper-cases to S
    ([(OVERRIDE, "ﬁnd")], REFUSED),  # U+FB01 upper-cases to FI
    ([(OVERRIDE, "delete\u0131")], REFUSED),  # dotless i upper-cases to I
    ([(OVERRIDE, "DELETE\u00a0")], REFUSED),  # no-break space: Unicode space, not HTTP's
    ([(OVERRIDE, "\u2003DELETE")], REFUSED),
    ([(OVERRIDE, "\u3000DELETE\u3000")], REFUSED),
    ([(OVERRIDE, "DELETE\x85")], REFUSED),  # NEL: a C1 control, Unicode space
    ([(OVERRIDE, "ＤＥＬＥＴＥ")], REFUSED),  # fullwidth
    ([(OVERRIDE, "DELÉTE")], REFUSED),
    # Names that only look like an override or a reroute are neither.
    ([("X-HTTP-Method-Overrides", "DELETE")], ()),
    ([("X-HTTP-Methods", "DELETE")], ()),
    ([("XHTTP-Method-Override", "DELETE")], ()),
    ([("X-HTTP-Method-Override-", "DELETE")], ()),
    ([("X--HTTP-Method", "DELETE")], ()),
    ([("X.HTTP.Method", "DELETE")], ()),
    ([("X-Method", "DELETE")], ()),
    ([("X-Original-URLs", "/admin")], ()),
    ([("X-Original", "/admin")], ()),
    ([("Method-Override", "DELETE")], ()),
    ([("X-HTTP-Method-Override", "DELETE"), ("X-HTTP-Methods", "nonsense value")],
     ("DELETE",)),
    # Reroutes, under any spelling, refused whatever comes with them.
    ([("X-Original-URL", "/admin")], REFUSED),
    ([("x_rewrite_url", "/admin")], REFUSED),
    ([("X-REWRITE_url", "")], REFUSED),
    ([(OVERRIDE, "GET"), ("X_Original_Url", "/admin")], REFUSED),
]
# fmt: on


@pytest.mark.parametrize(("pairs", "expected"), CASES)
def test_both_readers_read_a_header_set_alike(pairs: list[tuple[str, str]],
                                              expected: Reading) -> None:
    fields = _fields(pairs)
    assert (_proxy(fields), _tool(fields)) == (expected, expected)


@pytest.mark.parametrize("raw", [b"DELETE\xff", b"\xa0DELETE", b"DEL\x80ETE", b"\xc5\xbfOST"])
def test_bytes_that_are_not_utf8_or_not_ascii_name_no_method_to_either(raw: bytes) -> None:
    fields = [(OVERRIDE.encode(), raw)]
    assert (_proxy(fields), _tool(fields)) == (REFUSED, REFUSED)


@pytest.mark.parametrize("name", ["X-HTTP-Method-Оverride",  # Cyrillic O
                                  "X-HTTP-Method-Overrİde",  # lower-cases to two characters
                                  "X-Orİginal-URL", "X‐HTTP‐Method"])  # U+2010 hyphens
def test_a_non_ascii_lookalike_name_is_no_override_to_either(name: str) -> None:
    """Such a name is not a token, so the proxy refuses the request whole (the tool refuses the
    header before its reader); what matters here is that neither reads it as an override."""
    fields = _fields([(name, "DELETE")])
    assert RequestFacts.of(_request(fields)).overrides == ()
    assert not RequestFacts.of(_request(fields)).rerouted
    assert _tool(fields) == ()


# Generated sets: each name a spelling of an override, a reroute or a lookalike, each
# character's case and each '-' or '_' chosen; values from a pool of near-methods or any text
# without the control characters both callers refuse beforehand.
_NAMES = [*reshaping.METHOD_OVERRIDES, *reshaping.REROUTES, "x-http-method-overrides",
          "x-http", "x-methods-override", "accept", "range", "x-original-uri"]
_CONTROLS = "".join(chr(c) for c in [*range(0x09), *range(0x0a, 0x20), 0x7f])


@st.composite
def _spelling(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(_NAMES))
    return "".join(
        draw(st.sampled_from(["-", "_"])) if c == "-"
        else draw(st.sampled_from([c.lower(), c.upper()])) for c in name)


_VALUES = st.one_of(
    st.sampled_from(["GET", "delete", " Put ", "\tPATCH", "", " ", "poſt", "ﬁ", "DELETE\u00a0",
                     "\x85GET", "ＧＥＴ", "GET POST", "get,post"]),
    st.text(alphabet=st.characters(exclude_categories=["Cs"], exclude_characters=_CONTROLS),
            max_size=12),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(_spelling(), _VALUES), max_size=5))
def test_both_readers_agree_on_generated_header_sets(pairs: list[tuple[str, str]]) -> None:
    fields = _fields(pairs)
    assert _proxy(fields) == _tool(fields)
