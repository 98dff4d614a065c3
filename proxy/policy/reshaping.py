"""Request headers that ask for another request, or another answer, than the one decided: one
list and one behaviour for every way sealgate makes a request for a sandbox (the proxy's
request path, request/flowstate.py and request/steps.py; the MCP `http_request` tool,
policy/httptool.py and mcp/calls.py), since `http_request` is the sandbox's own request in
another form.

- A **method override** (`X-HTTP-Method-Override`, `X-HTTP-Method`, `X-Method-Override`) asks
  an API that honours it for the method it names: `POST` carries a `DELETE`. The named method
  goes to `decide` (`Question.overrides`), and the rule that allows the request must allow it
  too. A value that is not a method is refused (400).
- A **reroute** (`X-Original-URL`, `X-Rewrite-URL`) asks some servers for another target than
  the request line's, which the path rules never saw: always refused (400).
- A **slice** (`Range`, `If-Range`, and `Request-Range`, which Apache httpd and squid read when
  `Range` is absent) asks for part of an answer. It is harmless until a credential is injected:
  an answer that echoes the credential then comes back in pieces the scrubber, which finds
  whole secrets, cannot see (a sandbox could read the secret a few bytes at a time). So with an
  injected credential slices are not sent, and the whole answer comes. An answer that is a
  slice anyway (a 206, or any `Content-Range`: a range header of the API's own, that no list
  has, asked for it) to a request a credential was injected into is refused (`sliced`): by the
  proxy (request/responses.py) and by the MCP tools (mcp/upstream.py) alike.

Names are compared as servers that read headers CGI-style see them (`X_HTTP_Method_Override`
becomes `HTTP_X_HTTP_METHOD_OVERRIDE`, as the dash spelling does): lower-cased, `_` read as
`-` (`canonical`). Not covered by any header list: a method some frameworks take from the body
or the query (`_method=DELETE` in a form); a rule that allows POST to a path allows what such
an application does with it.

(All found by review.)
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from sealgate.reasons import Reason

from ..errors import Denial

__all__ = ["METHOD_OVERRIDES", "REROUTES", "SLICED", "SLICES", "canonical", "is_slice",
           "overrides_in", "sliced"]

METHOD_OVERRIDES: Final = frozenset({"x-http-method-override", "x-http-method",
                                     "x-method-override"})
REROUTES: Final = frozenset({"x-original-url", "x-rewrite-url"})
SLICES: Final = frozenset({"range", "if-range", "request-range"})
_METHOD: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # RFC 9110 9.1: a method is a token
# What the proxy's reader strips from a value (bytes.strip(): ASCII whitespace). str.strip()
# would strip Unicode's spaces too (U+00A0, U+0085, U+3000...), which the wire still carries.
_SPACE: Final = " \t\n\r\x0b\x0c"

NOT_A_METHOD: Final = "a method override that is not a method"
REROUTED: Final = ("X-Original-URL and X-Rewrite-URL are refused: a target other than the one "
                   "decided")
SLICED: Final = ("the upstream answered part of an answer (206 or Content-Range) to a request a "
                 "credential was injected into")


def canonical(name: str) -> str:
    """A field name as every server reads it: lower-cased, `_` as `-`."""
    return name.lower().replace("_", "-")


def is_slice(name: str) -> bool:
    """Whether a header of this name asks for part of an answer, under any spelling."""
    return canonical(name) in SLICES


def sliced(status: int, content_range: bool) -> Denial | None:
    """The refusal (`response_sliced`) of an answer that is a slice: a 206, or one with a
    `Content-Range` (each caller asks its own case-insensitive headers); None for a whole one.
    Asked only of an answer to a request a credential was injected into."""
    if status == 206 or content_range:
        return Denial(Reason.RESPONSE_SLICED, SLICED)
    return None


def overrides_in(headers: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    """The methods `headers`' overrides name, upper-cased, for `Question.overrides`; a Denial
    (400) for a reroute or an override that is not a method. The proxy's path reads the same
    headers in its one pass over the raw fields (RequestFacts.of) and refuses the same way."""
    named: list[str] = []
    for name, value in headers:
        lower = canonical(name)
        if lower in REROUTES:
            raise Denial(Reason.BAD_REQUEST, REROUTED)
        if lower in METHOD_OVERRIDES:
            # A token before it is upper-cased: Unicode's upper case makes methods of what is
            # none on the wire (a long s, U+017F, is S; the ligature U+FB01 is FI), and the
            # proxy reads bytes, whose upper case is ASCII's (test_override_readers_agree).
            method = value.strip(_SPACE)
            if not _METHOD.fullmatch(method):
                raise Denial(Reason.BAD_REQUEST, NOT_A_METHOD)
            named.append(method.upper())
    return tuple(named)
