"""The secret an `aws-sigv4` processor carries: an AWS key pair, and a session token for
temporary credentials, as one JSON object (docs/rules.md, `aws-sigv4`):

    {"access_key_id": "AKIA...", "secret_access_key": "...", "session_token": "..."}

`session_token` is optional. With `role_arn` the keys are not the ones requests are signed
with but those the proxy assumes the role with (STS AssumeRole), optionally with
`external_id`, `role_session_name`, `duration_seconds`, `sts_endpoint` and `sts_region`.
No error raised here quotes the secret or any part of it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Final
from urllib.parse import urlsplit

__all__ = ["AssumeRole", "AwsKeys", "parse"]

# AWS's key ids are 16-128 word characters (IAM's AccessKey type); a secret key and a session
# token go into an HMAC key and a header value, so visible ASCII only.
_KEY_ID: Final = re.compile(r"[A-Za-z0-9]{16,128}")
_VISIBLE: Final = re.compile(r"[\x21-\x7e]{1,4096}")
# IAM's patterns for these (AssumeRole's parameters).
_ROLE_ARN: Final = re.compile(r"arn:aws[a-z-]{0,16}:iam::\d{12}:role/[\w+=,.@/-]{1,512}")
_EXTERNAL_ID: Final = re.compile(r"[\w+=,.@:/-]{2,1224}")
_SESSION_NAME: Final = re.compile(r"[\w+=,.@-]{2,64}")
_REGION: Final = re.compile(r"[a-z0-9-]{1,64}")
_KEYS: Final = ("access_key_id", "secret_access_key", "session_token")
_ROLE: Final = ("role_arn", "external_id", "role_session_name", "duration_seconds",
                "sts_endpoint", "sts_region")
_FIELDS: Final = frozenset((*_KEYS, *_ROLE))


@dataclass(frozen=True, slots=True)
class AssumeRole:
    """What the proxy asks STS for with the keys beside it."""

    role_arn: str
    external_id: str | None = field(default=None, repr=False)
    role_session_name: str = "sealgate"
    duration_seconds: int = 3600
    sts_endpoint: str = "https://sts.amazonaws.com"
    sts_region: str = "us-east-1"


@dataclass(frozen=True, slots=True)
class AwsKeys:
    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)
    role: AssumeRole | None = None

    def to_json(self) -> str:
        """The secret's form of these keys (without a role)."""
        obj = {"access_key_id": self.access_key_id, "secret_access_key": self.secret_access_key}
        if self.session_token is not None:
            obj["session_token"] = self.session_token
        return json.dumps(obj)


def _problem(name: str, value: object) -> str | None:
    if name == "duration_seconds":
        ok = isinstance(value, int) and not isinstance(value, bool) and 900 <= value <= 43200
        return None if ok else "an integer of 900-43200"
    if not isinstance(value, str):
        return "a string"
    if name == "sts_endpoint":
        parts = urlsplit(value)
        ok = parts.scheme == "https" and bool(parts.hostname) and parts.path in ("", "/") \
            and not parts.query and not parts.username and len(value) <= 256
        return None if ok else "an https URL with a host and nothing after it"
    patterns = {"access_key_id": (_KEY_ID, "16-128 letters and digits"),
                "role_arn": (_ROLE_ARN, "an IAM role ARN"),
                "external_id": (_EXTERNAL_ID, "2-1224 characters of IAM's set"),
                "role_session_name": (_SESSION_NAME, "2-64 characters of IAM's set"),
                "sts_region": (_REGION, "a region name")}
    pattern, what = patterns.get(name, (_VISIBLE, "1-4096 visible ASCII characters"))
    return None if pattern.fullmatch(value) else what


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
    unknown = set(obj) - _FIELDS
    if unknown:
        # Names may be anything the operator pasted: say how many, not which.
        raise ValueError(f"an aws-sigv4 secret has {len(unknown)} unknown field(s); "
                         f"it takes {', '.join(sorted(_FIELDS))}")
    for name in ("access_key_id", "secret_access_key"):
        if name not in obj:
            raise ValueError(f"an aws-sigv4 secret needs {name} as a string")
    if "role_arn" not in obj and set(obj) & set(_ROLE):
        raise ValueError("an aws-sigv4 secret's role fields need role_arn")
    for name, value in obj.items():
        if (problem := _problem(name, value)) is not None:
            raise ValueError(f"an aws-sigv4 secret's {name} must be {problem}")
    role = AssumeRole(**{k: obj[k] for k in _ROLE if k in obj}) if "role_arn" in obj else None
    return AwsKeys(obj["access_key_id"], obj["secret_access_key"], obj.get("session_token"),
                   role)
