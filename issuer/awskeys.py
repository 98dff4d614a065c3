"""The secret an `aws-sigv4` processor carries: an AWS key pair, and a session token for
temporary credentials, as one JSON object (docs/rules.md, `aws-sigv4`):

    {"access_key_id": "AKIA...", "secret_access_key": "...", "session_token": "..."}

`session_token` is optional. No error raised here quotes the secret or any part of it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Final

__all__ = ["AwsKeys", "parse"]

# AWS's key ids are 16-128 word characters (IAM's AccessKey type); a secret key and a session
# token go into an HMAC key and a header value, so visible ASCII only.
_KEY_ID: Final = re.compile(r"[A-Za-z0-9]{16,128}")
_VISIBLE: Final = re.compile(r"[\x21-\x7e]{1,4096}")
_FIELDS: Final = frozenset({"access_key_id", "secret_access_key", "session_token"})


@dataclass(frozen=True, slots=True)
class AwsKeys:
    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


@lru_cache(maxsize=256)
def parse(secret: str) -> AwsKeys:
    """The keys in `secret`; ValueError (naming fields, never values) if it is not that
    object. Cached: every request re-signed with a credential reads its keys (the credential
    and the tokenizer's cache hold the same secret anyway)."""
    try:
        obj = json.loads(secret)
    except ValueError:
        # Not raised in here: the decoder's error holds the whole text (`doc`), and would stay
        # on ours as its context.
        obj = None
    if not isinstance(obj, dict):
        raise ValueError("an aws-sigv4 secret must be a JSON object")
    unknown = sorted(set(obj) - _FIELDS)
    if unknown:
        # Names may be anything the operator pasted: say how many, not which.
        raise ValueError(f"an aws-sigv4 secret has {len(unknown)} unknown field(s); "
                         f"it takes {', '.join(sorted(_FIELDS))}")
    values = {}
    for name in sorted(_FIELDS):
        value = obj.get(name)
        if value is None and name == "session_token":
            continue
        if not isinstance(value, str):
            raise ValueError(f"an aws-sigv4 secret needs {name} as a string")
        pattern = _KEY_ID if name == "access_key_id" else _VISIBLE
        if not pattern.fullmatch(value):
            what = "16-128 letters and digits" if name == "access_key_id" else (
                "1-4096 visible ASCII characters")
            raise ValueError(f"an aws-sigv4 secret's {name} must be {what}")
        values[name] = value
    return AwsKeys(**values)
