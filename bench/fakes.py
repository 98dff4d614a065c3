"""The stand-ins the benchmarks run against: an origin CA, a name server, a Vault, an OAuth2
token endpoint.

The benchmarks keep their own (tests/ has fuller fakes for the test suite): a benchmark must
not change when a test's fake learns a new failure mode, and a package never depends on its
tests. Each does only what a benchmark asks of it.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import http.server
import ipaddress
import json
import secrets
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from dnslib import QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OriginCA:
    """Signs the origin's certificate; the proxies are told to trust `path`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sealgate bench CA")])
        cert = self._sign(self.name, self.key.public_key(),
                          x509.BasicConstraints(ca=True, path_length=None), critical=True)
        self.path = directory / "origin-ca.pem"
        self.path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, *names: str) -> tuple[Path, Path]:
        """Certificate and key files for `names` (host names or IP addresses)."""
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = []
        for name in names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                sans.append(x509.DNSName(name))
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
        cert = self._sign(subject, key.public_key(), x509.SubjectAlternativeName(sans))
        stem = self.directory / f"origin-{hashlib.sha256(','.join(names).encode()).hexdigest()[:8]}"
        cert_path, key_path = stem.with_suffix(".crt"), stem.with_suffix(".key")
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
        return cert_path, key_path

    def _sign(self, subject: x509.Name, public: ec.EllipticCurvePublicKey,
              extension: x509.ExtensionType, *, critical: bool = False) -> x509.Certificate:
        now = datetime.datetime.now(datetime.UTC)
        return (
            x509.CertificateBuilder().subject_name(subject).issuer_name(self.name)
            .public_key(public).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(extension, critical=critical)
            .sign(self.key, hashes.SHA256())
        )


class StubDNS(BaseResolver):  # type: ignore[misc]  # dnslib ships no types
    """A name server on loopback (UDP) for the names `set`; others are NXDOMAIN. Its thread
    takes the starting thread's CPU affinity."""

    def __init__(self) -> None:
        self._zone: dict[str, list[RR]] = {}
        self._server = DNSServer(self, address="127.0.0.1", port=0,
                                 logger=DNSLogger(logf=lambda _: None))

    def start(self) -> StubDNS:
        self._server.start_thread()
        return self

    def stop(self) -> None:
        self._server.stop()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server.server_address[:2]
        return str(host), int(port)

    def set(self, name: str, record: str, ttl: int = 60) -> None:
        """`record` is "A <address>", the only kind a benchmark needs."""
        kind, address = record.split()
        if kind != "A":
            raise ValueError(f"StubDNS answers A records only, not {kind}")
        self._zone[name.lower().rstrip(".")] = [RR(name, QTYPE.A, rdata=A(address), ttl=ttl)]

    def resolve(self, request: Any, handler: Any) -> Any:
        reply = request.reply()
        question = request.q
        records = self._zone.get(str(question.qname).lower().rstrip("."))
        if records is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif question.qtype == QTYPE.A:
            for record in records:
                reply.add_answer(record)
        return reply  # a known name asked for anything but A: no data


class Vault:
    """The two calls a token-authenticated KV v2 read makes (token lookup, the read), answered
    as Vault answers them, from a thread of its own; tokens never expire."""

    def __init__(self) -> None:
        self._tokens: dict[str, str] = {}  # token -> path prefix it may read
        self._kv: dict[str, dict[str, str]] = {}  # "mount/path" -> the secret's fields
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self.url = ""

    def start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/auth/token/lookup-self", self._lookup_self)
        app.router.add_get("/v1/{mount}/data/{path:.+}", self._read)
        self._runner = web.AppRunner(app, access_log=None)
        port = free_port()
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", port).start())
        self.url = f"http://127.0.0.1:{port}"
        threading.Thread(target=self._loop.run_forever, name="bench-vault", daemon=True).start()

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)

    def add_token(self, prefix: str) -> str:
        token = f"hvs.{secrets.token_urlsafe(24)}"
        self._tokens[token] = prefix
        return token

    def put(self, mount: str, path: str, data: dict[str, str]) -> None:
        self._kv[f"{mount}/{path}"] = dict(data)

    async def _lookup_self(self, request: web.Request) -> web.Response:
        if request.headers.get("X-Vault-Token") not in self._tokens:
            return _json({"errors": ["permission denied"]}, 403)
        return _json(_envelope(data={"ttl": 0, "renewable": False, "policies": ["bench"]}))

    async def _read(self, request: web.Request) -> web.Response:
        mount, path = request.match_info["mount"], request.match_info["path"]
        prefix = self._tokens.get(request.headers.get("X-Vault-Token", ""))
        if prefix is None or not f"{mount}/data/{path}".startswith(prefix):
            return _json({"errors": ["permission denied"]}, 403)
        data = self._kv.get(f"{mount}/{path}")
        if data is None:
            return _json({"errors": []}, 404)
        metadata = {"created_time": "2026-01-01T00:00:00Z", "custom_metadata": None,
                    "deletion_time": "", "destroyed": False, "version": 1}
        return _json(_envelope(data={"data": data, "metadata": metadata}))


class TokenEndpoint:
    """An OAuth2 token endpoint over HTTPS on loopback, with a certificate from `ca` for `name`,
    from a thread of its own: every POST gets a fresh bearer access token valid for 2 hours.
    Plain and threaded: a benchmark calls it once, then the proxy serves the token from its
    cache."""

    def __init__(self, ca: OriginCA, name: str) -> None:
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TokenHandler)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*(str(p) for p in ca.issue(name)))
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.url = f"https://{name}:{self._server.server_address[1]}/token"

    def start(self) -> TokenEndpoint:
        threading.Thread(target=self._server.serve_forever, name="bench-token-endpoint",
                         daemon=True).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _TokenHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.dumps({"access_token": f"at-{secrets.token_urlsafe(24)}",
                           "token_type": "Bearer", "expires_in": 7200}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _envelope(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"request_id": secrets.token_hex(16), "lease_id": "",
                            "renewable": False, "lease_duration": 0, "data": None,
                            "wrap_info": None, "warnings": None, "auth": None}
    body.update(fields)
    return body


def _json(body: dict[str, Any], status: int = 200) -> web.Response:
    # Vault's exact content type: hvac reads `errors` only when it is this, without charset.
    return web.Response(body=json.dumps(body).encode(), status=status,
                        headers={"Content-Type": "application/json"})
