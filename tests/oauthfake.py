"""Fakes of the token services the exchange processors call, checking what the real ones do,
each a route for `tests.sdk.kit.FakeAPI` (HTTPS on loopback under the service's name), with the
API the token is then used for beside it:

- `OAuthFake`: an OAuth2 token endpoint (RFC 6749: `refresh_token` and `client_credentials`
  grants, client authentication by HTTP Basic or in the body, refresh tokens rotated on use,
  `invalid_grant` for a revoked or used-up one, `expires_in`), and an API that answers 401 to
  an access token it did not issue, that has expired or was revoked. Knobs: `delay` (seconds
  before a token answer), `down` (503 from the token endpoint), `rotate`.
- `GitHubFake`: `POST /app/installations/{id}/access_tokens` verifying the app JWT (RS256 with
  the app's public key, iss the app id, iat not ahead of its clock, exp at most 10 minutes past
  iat) and answering like GitHub (`{"token", "expires_at", ...}`), and `/repos/{o}/{r}` for an
  installation token. `skew`: its clock ahead (+) or behind (-) ours.
- `GoogleFake`: Google's token endpoint for the JWT-bearer grant (RFC 7523), verifying the
  assertion with the key's public key (iss, aud = token_uri, iat/exp, scope or
  target_audience), answering an access token or an ID token (a JWT the fake signs), and an API
  that accepts either.

Every call to a token endpoint is counted (`calls`), with the most calls seen in flight at once
(`most_at_once`).
"""

from __future__ import annotations

import base64
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, unquote_plus

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.sdk.kit import Arrived, Reply


def rsa_key() -> tuple[rsa.RSAPrivateKey, str]:
    """A fresh RSA-2048 key and its PEM (PKCS#8, as Google's key files hold it)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return key, pem


def _bearer(seen: Arrived, scheme: str = "bearer") -> str | None:
    value = seen.headers.get("authorization", "")
    given, _, token = value.partition(" ")
    return token if given.lower() == scheme else None


def _error(status: int, code: str) -> Reply:
    return Reply(status, {"error": code, "error_description": f"fake says {code}"})


@dataclass
class _Counted:
    """A token endpoint's call counting, shared by the fakes."""

    calls: int = 0
    most_at_once: int = 0
    delay: float = 0.0
    down: bool = False
    _at_once: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self) -> None:
        with self._lock:
            self.calls += 1
            self._at_once += 1
            self.most_at_once = max(self.most_at_once, self._at_once)
        if self.delay:
            time.sleep(self.delay)

    def leave(self) -> None:
        with self._lock:
            self._at_once -= 1

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._at_once

    def reset_counts(self) -> None:
        with self._lock:
            self.calls = self.most_at_once = 0


class OAuthFake(_Counted):
    def __init__(self, *, client_id: str, client_secret: str, refresh_token: str) -> None:
        super().__init__()
        self.client_id, self.client_secret = client_id, client_secret
        self.live_refresh = {refresh_token}
        self.access: dict[str, float] = {}  # access token -> expiry
        self.issued: list[str] = []  # every access token and refresh token handed out
        self.expires_in = 3600
        self.rotate = True
        self.grants: list[dict[str, str]] = []  # the forms, client secret left out

    def __call__(self, seen: Arrived) -> Reply:
        path = seen.path.partition("?")[0]
        if path == "/token" and seen.method == "POST":
            self.enter()
            try:
                return self._token(seen)
            finally:
                self.leave()
        token = _bearer(seen)
        if token is None or self.access.get(token, 0) <= time.time():
            return Reply(401, {"error": "invalid_token"},
                         {"WWW-Authenticate": 'Bearer error="invalid_token"'})
        if path.endswith("/leak"):
            # An API that also holds the client's grant (one server for both): what it gives
            # away must not reach the client either.
            return Reply(200, {"refresh_tokens": sorted(self.live_refresh),
                               "client_secret": self.client_secret})
        # An echo of the credential, as a debug endpoint would: the proxy must mask it.
        return Reply(200, {"path": path, "you_sent": seen.headers["authorization"]})

    def revoke_access(self) -> None:
        self.access.clear()

    def _client(self, seen: Arrived, form: dict[str, str]) -> bool:
        basic = _bearer(seen, "basic")
        if basic is not None:
            ident, _, secret = base64.b64decode(basic).decode().partition(":")
            ident, secret = unquote_plus(ident), unquote_plus(secret)
        else:
            ident, secret = form.get("client_id", ""), form.get("client_secret", "")
        return ident == self.client_id and secret == self.client_secret

    def _token(self, seen: Arrived) -> Reply:
        if self.down:
            return _error(503, "temporarily_unavailable")
        form = dict(parse_qsl(seen.body.decode()))
        self.grants.append({k: v for k, v in form.items() if k != "client_secret"})
        if not self._client(seen, form):
            return _error(401, "invalid_client")
        grant = form.get("grant_type")
        answer: dict[str, Any] = {"token_type": "Bearer", "expires_in": self.expires_in}
        if grant == "refresh_token":
            used = form.get("refresh_token", "")
            if used not in self.live_refresh:
                return _error(400, "invalid_grant")
            if self.rotate:
                self.live_refresh.discard(used)
                fresh = f"rt-rotated-{secrets.token_hex(12)}"
                self.live_refresh.add(fresh)
                self.issued.append(fresh)
                answer["refresh_token"] = fresh
        elif grant != "client_credentials":
            return _error(400, "unsupported_grant_type")
        else:
            answer["scope"] = form.get("scope", "")
        access = f"at-{secrets.token_hex(16)}"
        self.access[access] = time.time() + self.expires_in
        self.issued.append(access)
        answer["access_token"] = access
        return Reply(200, answer)


class GitHubFake(_Counted):
    def __init__(self, app_id: str, public_key: rsa.RSAPublicKey, installation: str) -> None:
        super().__init__()
        self.app_id, self.public_key, self.installation = app_id, public_key, installation
        self.skew = 0.0
        self.tokens: dict[str, float] = {}
        self.asked: list[dict[str, Any]] = []  # the access_tokens bodies
        self.lifetime = 3600

    def __call__(self, seen: Arrived) -> Reply:
        path = seen.path.partition("?")[0]
        if path.startswith("/app/installations/") and seen.method == "POST":
            self.enter()
            try:
                return self._access_token(seen, path)
            finally:
                self.leave()
        token = _bearer(seen, "token") or _bearer(seen)
        if token is None or self.tokens.get(token, 0) <= time.time():
            return Reply(401, {"message": "Bad credentials",
                               "documentation_url": "https://docs.github.com/rest"})
        if path.startswith("/repos/"):
            owner, name = path.split("/")[2:4]
            return Reply(200, {"id": 1, "name": name, "full_name": f"{owner}/{name}",
                               "private": True, "owner": {"login": owner, "id": 2},
                               "description": f"seen with {seen.headers['authorization']}"})
        return Reply(404, {"message": "Not Found"})

    def _access_token(self, seen: Arrived, path: str) -> Reply:
        now = time.time() + self.skew
        if self.down:
            return Reply(503, {"message": "Service unavailable"})
        app_jwt = _bearer(seen)
        try:
            claims = jwt.decode(app_jwt or "", self.public_key, algorithms=["RS256"],
                                options={"verify_exp": False, "verify_iat": False})
        except jwt.InvalidTokenError:
            return Reply(401, {"message": "A JSON web token could not be decoded"})
        if (str(claims.get("iss")) != self.app_id or claims["iat"] > now
                or claims["exp"] <= now or claims["exp"] - claims["iat"] > 600):
            return Reply(401, {"message": "'Expiration time' claim ('exp') is too far in the "
                                          "future"})
        if path != f"/app/installations/{self.installation}/access_tokens":
            return Reply(404, {"message": "Not Found"})
        body = json.loads(seen.body or b"{}")
        self.asked.append(body)
        token = f"ghs_{secrets.token_hex(18)}"
        self.tokens[token] = time.time() + self.lifetime
        expires = datetime.fromtimestamp(time.time() + self.lifetime, UTC)
        return Reply(201, {"token": token,
                           "expires_at": expires.strftime("%Y-%m-%dT%H:%M:%SZ"),
                           "permissions": body.get("permissions", {"contents": "read"}),
                           "repository_selection": "selected" if "repositories" in body
                           else "all"})


class GoogleFake(_Counted):
    def __init__(self, email: str, public_key: rsa.RSAPublicKey, token_uri: str) -> None:
        super().__init__()
        self.email, self.public_key, self.token_uri = email, public_key, token_uri
        self.signer, _ = rsa_key()  # what the fake signs ID tokens with
        self.tokens: dict[str, float] = {}
        self.claims: list[dict[str, Any]] = []  # of each verified assertion

    def __call__(self, seen: Arrived) -> Reply:
        path = seen.path.partition("?")[0]
        if path == "/token" and seen.method == "POST":
            self.enter()
            try:
                return self._token(seen)
            finally:
                self.leave()
        token = _bearer(seen)
        if token is None or self.tokens.get(token, 0) <= time.time():
            return Reply(401, {"error": {"code": 401, "status": "UNAUTHENTICATED"}})
        return Reply(200, {"kind": "storage#buckets", "items": [{"name": "b"}]})

    def _token(self, seen: Arrived) -> Reply:
        form = dict(parse_qsl(seen.body.decode()))
        if form.get("grant_type") != "urn:ietf:params:oauth:grant-type:jwt-bearer":
            return _error(400, "unsupported_grant_type")
        try:
            claims = jwt.decode(form.get("assertion", ""), self.public_key,
                                algorithms=["RS256"], audience=self.token_uri,
                                issuer=self.email, leeway=60)
        except jwt.InvalidTokenError:
            return _error(400, "invalid_grant")
        if claims["exp"] - claims["iat"] > 3600:
            return _error(400, "invalid_grant")
        self.claims.append(claims)
        now = int(time.time())
        if "target_audience" in claims:
            token = jwt.encode({"iss": "https://accounts.google.com", "aud":
                                claims["target_audience"], "sub": "1", "email": self.email,
                                "iat": now, "exp": now + 3600}, self.signer, algorithm="RS256")
            self.tokens[token] = now + 3600
            return Reply(200, {"id_token": token})
        if not claims.get("scope"):
            return _error(400, "invalid_scope")
        token = f"ya29.{secrets.token_hex(20)}"
        self.tokens[token] = now + 3599
        return Reply(200, {"access_token": token, "expires_in": 3599, "token_type": "Bearer"})
