"""Signed port URLs: a sandbox's port handed to a browser, which carries no bearer key. The
token names the sandbox, the port and the expiry, with an HMAC-SHA256 of the three under a key
the daemon draws at start (`/v1/signed/{token}/...`, `sandbox.daemon.portroutes`).

The key is random per daemon process and never stored: a restart voids every URL it signed (a
URL that leaked is revoked by restarting, and nothing on disk can mint one), and so does a
hand-over to a successor (`--adopt`), which draws its own; the bearer key is not reused for a
second purpose (a daemon on its unix socket alone has none).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time

from sealgate.reasons import Reason

from .session import SessionError

# Exactly what `sign` writes, so that one signature has one spelling: a sandbox id (the
# daemon's, `sb-` and 16 hex digits), the port and the expiry (unix seconds) as `str` writes an
# int (ASCII digits, no leading zero: `int` also takes "08000" and other scripts' digits), and
# the HMAC-SHA256 in unpadded base64url (43 characters, the last holding 4 bits of it).
_TOKEN = re.compile(r"(sb-[0-9a-f]{16})\.([1-9][0-9]{0,4})\.([1-9][0-9]{0,11})\."
                    r"([A-Za-z0-9_-]{42}[AEIMQUYcgkosw048])")


class Signer:
    def __init__(self) -> None:
        self._key = secrets.token_bytes(32)

    def sign(self, sandbox: str, port: int, expires: int) -> str:
        return f"{sandbox}.{port}.{expires}.{self._mac(sandbox, port, expires)}"

    def check(self, token: str) -> tuple[str, int]:
        """The sandbox id and port `token` was signed for. Raises SessionError
        (bad_signature) for a token tampered with, another daemon's, or expired."""
        found = _TOKEN.fullmatch(token)
        if found is None:
            raise SessionError("not a signed port URL's token", reason=Reason.BAD_SIGNATURE)
        sandbox, port, expires, mac = found.groups()
        if not hmac.compare_digest(mac, self._mac(sandbox, int(port), int(expires))):
            raise SessionError("the URL's signature does not match its sandbox, port and expiry "
                               "(changed, or signed before the daemon restarted)",
                               reason=Reason.BAD_SIGNATURE)
        if int(expires) <= time.time():
            raise SessionError(f"the signed URL expired at {int(expires)} (unix time)",
                               reason=Reason.BAD_SIGNATURE)
        return sandbox, int(port)

    def _mac(self, sandbox: str, port: int, expires: int) -> str:
        digest = hmac.new(self._key, f"{sandbox}\n{port}\n{expires}".encode(),
                          hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
