"""The secrets of the token-exchange processors (`oauth2`, `github-app`, `gcp-service-account`)
and the calls that exchange them for the token a request carries: what is sent and how the
answer is read, without I/O (the proxy dials: `proxy.credentials.exchanges`).

    oauth2               {"refresh_token": "...", "client_id": "...", "client_secret": "..."}
                         (refresh_token grant: client_id and client_secret optional) or
                         {"client_id": "...", "client_secret": "..."} (client_credentials)
    github-app           {"app_id": "123456", "private_key": "-----BEGIN RSA PRIVATE KEY-----..."}
    gcp-service-account  the service-account key file Google hands out (type, client_email,
                         private_key, private_key_id, token_uri, ...)

The token endpoint of oauth2 and GitHub's API are the processor's (`token_url`, `api`); Google's
is the key's `token_uri`, as Google writes it. A sealed token's may be anyone's (whoever holds the
proxy's public key can mint): the proxy dials it only where the sandbox's policy allows a POST
(`proxy.credentials.exchanges`). No error raised here quotes a value.
"""

from __future__ import annotations

import base64
import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Final
from urllib.parse import urlsplit

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from sealgate.reasons import Reason

from .errors import CredentialError

__all__ = [
    "GITHUB_JWT_SECONDS",
    "JWT_BEARER",
    "AppKey",
    "GrantError",
    "OAuthClient",
    "ServiceAccount",
    "TokenAnswer",
    "app_jwt",
    "https_url",
    "parse_app",
    "parse_oauth",
    "parse_service_account",
    "read_answer",
    "service_account_assertion",
]

JWT_BEARER: Final = "urn:ietf:params:oauth:grant-type:jwt-bearer"
# GitHub takes an app JWT for at most 10 minutes; iat is put 60 s back for clock drift, as
# GitHub advises, so exp is 9 minutes ahead of our clock.
GITHUB_JWT_SECONDS: Final = 540
GOOGLE_JWT_SECONDS: Final = 3600
_VISIBLE: Final = re.compile(r"[\x21-\x7e]{1,4096}")
_CLIENT_ID: Final = re.compile(r"[\x20-\x7e]{1,512}")
_APP_ID: Final = re.compile(r"[A-Za-z0-9.]{1,64}")  # an app id, or its client id (Iv1.…)
_EMAIL: Final = re.compile(r"[A-Za-z0-9._%+-]{1,128}@[A-Za-z0-9.-]{1,253}")
_ERROR_CODE: Final = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_KEY_TEXT: Final = 8192


class GrantError(CredentialError):
    """A secret that is not its processor's, or an answer that holds no token. Names fields
    and error codes, never a value. The proxy refuses a secret that is not its processor's as
    `secret_invalid`, and an endpoint that gave no token as `secret_unavailable`."""

    reason = Reason.SECRET_INVALID


def https_url(value: str, what: str) -> str:
    """`value` if it is an https URL with a host, no credentials and no fragment."""
    parts = urlsplit(value)
    if (parts.scheme != "https" or not parts.hostname or parts.username is not None
            or parts.fragment or len(value) > 512 or not value.isascii()
            or any(c in value for c in " \t\r\n")):
        raise GrantError(f"{what} must be an https URL with a host (no user, no fragment)")
    return value


def _object(secret: str, kind: str) -> dict[str, object]:
    try:
        obj = json.loads(secret)
    except ValueError:
        obj = None  # not raised in here: the decoder's error holds the whole text
    if not isinstance(obj, dict):
        raise GrantError(f"a {kind} secret must be a JSON object")
    return obj


def _string(obj: dict[str, object], name: str, kind: str, pattern: re.Pattern[str] = _VISIBLE,
            *, required: bool = True) -> str | None:
    value = obj.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise GrantError(f"a {kind} secret needs {name} as a string of its allowed characters")
    return value


def _only(obj: dict[str, object], known: frozenset[str], kind: str) -> None:
    unknown = set(obj) - known
    if unknown:  # names may be anything pasted: how many, not which
        raise GrantError(f"a {kind} secret has {len(unknown)} unknown field(s); it takes "
                         f"{', '.join(sorted(known))}")


# --- oauth2 -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OAuthClient:
    refresh_token: str | None = field(repr=False)
    client_id: str | None
    client_secret: str | None = field(repr=False)

    def to_json(self) -> str:
        obj = {k: v for k, v in (("refresh_token", self.refresh_token),
                                 ("client_id", self.client_id),
                                 ("client_secret", self.client_secret)) if v is not None}
        return json.dumps(obj)


_OAUTH_FIELDS: Final = frozenset({"refresh_token", "client_id", "client_secret"})


@lru_cache(maxsize=256)
def parse_oauth(secret: str, grant: str) -> OAuthClient:
    obj = _object(secret, "oauth2")
    _only(obj, _OAUTH_FIELDS, "oauth2")
    refresh = _string(obj, "refresh_token", "oauth2", required=grant == "refresh_token")
    if grant != "refresh_token" and refresh is not None:
        raise GrantError("an oauth2 secret for the client_credentials grant has no refresh_token")
    client_id = _string(obj, "client_id", "oauth2", _CLIENT_ID,
                        required=grant == "client_credentials")
    client_secret = _string(obj, "client_secret", "oauth2",
                            required=grant == "client_credentials")
    if client_secret is not None and client_id is None:
        raise GrantError("an oauth2 secret's client_secret needs client_id")
    return OAuthClient(refresh, client_id, client_secret)


# --- RS256 JWTs ---------------------------------------------------------------------------------


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _private_key(pem: object, kind: str) -> rsa.RSAPrivateKey:
    if not isinstance(pem, str) or not 0 < len(pem) <= MAX_KEY_TEXT:
        raise GrantError(f"a {kind} secret needs private_key as a PEM string")
    try:
        key = serialization.load_pem_private_key(pem.encode("ascii", "replace"), password=None)
    except (ValueError, TypeError):
        key = None  # cryptography's messages say nothing of the key, but nor do we need them
    if not isinstance(key, rsa.RSAPrivateKey) or key.key_size < 2048:
        raise GrantError(f"a {kind} secret's private_key must be an unencrypted RSA key "
                         "(2048 bits or more) in PEM")
    return key


def _jwt(key: rsa.RSAPrivateKey, claims: dict[str, object], kid: str | None = None) -> str:
    header: dict[str, str] = {"alg": "RS256", "typ": "JWT"}
    if kid is not None:
        header["kid"] = kid
    signed = ".".join(_b64url(json.dumps(part, separators=(",", ":")).encode())
                      for part in (header, claims))
    signature = key.sign(signed.encode("ascii"), padding.PKCS1v15(), hashes.SHA256())
    return f"{signed}.{_b64url(signature)}"


# --- github-app -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppKey:
    app_id: str
    private_key: rsa.RSAPrivateKey = field(repr=False)
    pem: str = field(repr=False)


@lru_cache(maxsize=64)
def parse_app(secret: str) -> AppKey:
    obj = _object(secret, "github-app")
    _only(obj, frozenset({"app_id", "private_key"}), "github-app")
    app_id = obj.get("app_id")
    if isinstance(app_id, int) and not isinstance(app_id, bool) and app_id > 0:
        app_id = str(app_id)
    if not isinstance(app_id, str) or not _APP_ID.fullmatch(app_id):
        raise GrantError("a github-app secret needs app_id: the app's id (or client id)")
    pem = obj.get("private_key")
    return AppKey(app_id, _private_key(pem, "github-app"), str(pem))


def app_jwt(app: AppKey, now: float | None = None) -> str:
    """The app's JWT: iat 60 s back (clock drift), exp under GitHub's 10 minutes."""
    issued = int(time.time() if now is None else now)
    return _jwt(app.private_key, {"iat": issued - 60, "exp": issued + GITHUB_JWT_SECONDS,
                                  "iss": app.app_id})


# --- gcp-service-account ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ServiceAccount:
    client_email: str
    token_uri: str
    private_key_id: str | None
    private_key: rsa.RSAPrivateKey = field(repr=False)
    pem: str = field(repr=False)


@lru_cache(maxsize=64)
def parse_service_account(secret: str) -> ServiceAccount:
    obj = _object(secret, "gcp-service-account")
    if obj.get("type") != "service_account":
        raise GrantError('a gcp-service-account secret must be a key file of '
                         '"type": "service_account"')
    email = _string(obj, "client_email", "gcp-service-account", _EMAIL)
    uri = _string(obj, "token_uri", "gcp-service-account")
    assert email is not None and uri is not None
    kid = _string(obj, "private_key_id", "gcp-service-account", re.compile(r"[0-9a-f]{1,128}"),
                  required=False)
    pem = obj.get("private_key")
    key = _private_key(pem, "gcp-service-account")
    return ServiceAccount(email, https_url(uri, "a gcp-service-account secret's token_uri"), kid,
                          key, str(pem))


def service_account_assertion(account: ServiceAccount, *, scopes: str | None,
                              audience: str | None, now: float | None = None) -> str:
    """The JWT-bearer assertion (RFC 7523) for an access token over `scopes` (space-separated),
    or for an ID token whose audience is `audience`."""
    issued = int(time.time() if now is None else now)
    claims: dict[str, object] = {"iss": account.client_email, "aud": account.token_uri,
                                 "iat": issued, "exp": issued + GOOGLE_JWT_SECONDS}
    if audience is not None:
        claims["target_audience"] = audience
    else:
        claims["scope"] = scopes or ""
    return _jwt(account.private_key, claims, account.private_key_id)


# --- answers ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenAnswer:
    token: str = field(repr=False)
    expires: float  # wall clock
    refresh_token: str | None = field(default=None, repr=False)  # a rotated one, if sent


def _token(value: object, what: str) -> str:
    if not isinstance(value, str) or not _VISIBLE.fullmatch(value):
        raise GrantError(f"the answer's {what} is not a token of visible ASCII")
    return value


def error_code(body: object) -> str:
    """An OAuth2 (or GitHub) error answer's code, if it looks like one; never other text."""
    code = body.get("error") if isinstance(body, dict) else None
    return code if isinstance(code, str) and _ERROR_CODE.fullmatch(code) else "an error"


def read_answer(status: int, body: object, now: float, *, kind: str) -> TokenAnswer:
    """A token endpoint's JSON answer: OAuth2's (`access_token`, `expires_in`, perhaps a new
    `refresh_token`), Google's ID token (`id_token`, expiry from its own claims), or GitHub's
    (`token`, `expires_at`). GrantError naming the status and error code otherwise."""
    if status not in (200, 201):
        raise GrantError(f"the {kind} token endpoint answered {status} {error_code(body)}")
    if not isinstance(body, dict):
        raise GrantError(f"the {kind} token endpoint's answer is not a JSON object")
    if "token" in body and "expires_at" in body:  # GitHub
        token = _token(body["token"], "token")
        stamp = body["expires_at"]
        try:
            when = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
            if when.tzinfo is None:
                raise ValueError
            expires = when.timestamp()
        except ValueError:
            raise GrantError("the answer's expires_at is not a UTC timestamp") from None
        return TokenAnswer(token, expires)
    if "access_token" not in body and "id_token" in body:  # Google's ID token
        token = _token(body["id_token"], "id_token")
        return TokenAnswer(token, _jwt_expiry(token, now))
    token = _token(body.get("access_token"), "access_token")
    lifetime = body.get("expires_in", 3600)
    if isinstance(lifetime, str) and lifetime.isdigit():
        lifetime = int(lifetime)
    if not isinstance(lifetime, int | float) or isinstance(lifetime, bool) or lifetime <= 0:
        raise GrantError("the answer's expires_in is not a positive number")
    rotated = body.get("refresh_token")
    return TokenAnswer(token, now + float(lifetime),
                  None if rotated is None else _token(rotated, "refresh_token"))


def _jwt_expiry(token: str, now: float) -> float:
    """An ID token's `exp`, read (not verified: it came over verified TLS from the issuer)."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        exp = claims["exp"]
    except (IndexError, ValueError, KeyError, TypeError):
        raise GrantError("the answer's id_token is not a JWT with exp") from None
    if not isinstance(exp, int | float) or exp <= now:
        raise GrantError("the answer's id_token has expired already")
    return float(exp)
