"""Real parts for integration tests: a test CA, HTTP(S) origins on loopback, the proxy process.

Everything listens on 127.0.0.1 with ephemeral ports. Origins record what reached them (every
accepted connection and every byte), so a test can prove that a denied request sent nothing.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

ROOT = Path(__file__).resolve().parent.parent
SEALGATE = [sys.executable, "-m", "sealgate.cli"]


# The fields every operational log line has (sealgate/oplog.py; docs/operations.md, "Log fields").
LOG_FIELDS = ("ts", "level", "event", "logger")


def log_lines(text: str, fields: tuple[str, ...] = LOG_FIELDS) -> list[dict[str, Any]]:
    """Every line of a process's log, parsed: each must be one JSON object with `fields`."""
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            parsed = json.loads(line)
        except ValueError:
            raise AssertionError(f"log line {number} is not JSON: {line[:300]!r}") from None
        assert isinstance(parsed, dict), line[:300]
        missing = [name for name in fields if name not in parsed]
        assert not missing, f"log line {number} has no {missing}: {line[:300]}"
        lines.append(parsed)
    return lines


def quiet(text: str) -> bool:
    """No traceback in a process's output: neither Python's own (a crash before the log was
    set up) nor a log line's `exception` field (sealgate.oplog)."""
    return "Traceback" not in text and '"exception": ' not in text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


# -- a CA for the origins -------------------------------------------------------------------


class OriginCA:
    """Signs origin certificates; the proxy is told to trust it with --upstream-ca."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sealgate test origin CA")])
        now = datetime.datetime.now(datetime.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.path = directory / "origin-ca.pem"
        self.path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, *names: str) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        sans: list[x509.GeneralName] = []
        for n in names:
            try:
                import ipaddress

                sans.append(x509.IPAddress(ipaddress.ip_address(n)))
            except ValueError:
                sans.append(x509.DNSName(n))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        stem = self.directory / f"origin-{hashlib.sha1(','.join(names).encode()).hexdigest()[:8]}"
        cert_path, key_path = stem.with_suffix(".crt"), stem.with_suffix(".key")
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return cert_path, key_path


# -- origins ----------------------------------------------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names; of repeated ones, the last
    body: bytes
    fields: list[tuple[str, str]] = field(default_factory=list)  # every header, as sent

    def values(self, name: str) -> list[str]:
        return [v for k, v in self.fields if k.lower() == name.lower()]


@dataclass
class Origin:
    """An HTTP or HTTPS server on 127.0.0.1 that records everything that reaches it."""

    tls: tuple[Path, Path] | None = None
    requests: list[Seen] = field(default_factory=list)
    connections: int = 0
    bytes_received: int = 0
    response_headers: dict[str, str] = field(default_factory=dict)
    response_body: bytes = b"hello from origin\n"
    # When set: the body is sent chunked, one write per item, with no Content-Length.
    response_chunks: list[bytes] | None = None
    echo: bool = False  # answer with the request's headers and target, like a debug endpoint
    response_status: int = 200

    def __post_init__(self) -> None:
        origin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with origin._lock:
                    origin.connections += 1

            def _handle(self) -> None:
                if "chunked" in self.headers.get("transfer-encoding", "").lower():
                    body = self._read_chunked()
                else:
                    length = int(self.headers.get("content-length") or 0)
                    body = self.rfile.read(length) if length else b""
                with origin._lock:
                    origin.requests.append(
                        Seen(self.command, self.path,
                             {k.lower(): v for k, v in self.headers.items()}, body,
                             list(self.headers.items()))
                    )
                    origin.bytes_received += len(body)
                payload = origin.response_body
                if origin.echo:
                    payload = json.dumps(
                        {"path": self.path, "headers": dict(self.headers.items())}
                    ).encode()
                self.send_response(origin.response_status)
                for k, v in origin.response_headers.items():
                    self.send_header(k, v)
                if origin.response_chunks is not None:
                    if "Transfer-Encoding" not in origin.response_headers:
                        self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for chunk in origin.response_chunks:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    return
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _read_chunked(self) -> bytes:
                body = b""
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    body += self.rfile.read(size)
                    self.rfile.readline()
                while self.rfile.readline().strip():  # trailers, then the blank line
                    pass
                return body

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._lock = threading.Lock()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if self.tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(str(self.tls[0]), str(self.tls[1]))
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def reset(self) -> None:
        self.response_headers.clear()
        self.response_body = b"hello from origin\n"
        self.response_chunks = None
        self.response_status = 200
        with self._lock:
            self.requests.clear()
            self.connections = 0
            self.bytes_received = 0

    def untouched(self) -> bool:
        return self.connections == 0 and not self.requests

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class RawListener:
    """A bare TCP listener that counts connections and bytes: the proof that nothing arrived.
    With `udp`, a UDP socket on the same port counts datagrams too."""

    def __init__(self, host: str = "127.0.0.1", *, udp: bool = False) -> None:
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.udp: socket.socket | None = None
        if udp:
            self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self.udp.bind((host, self.port))
            self.udp.setblocking(False)
        self.connections = 0
        self.bytes_received = 0
        self.datagrams = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._datagrams()
            self._accept()

    def _datagrams(self) -> None:
        while self.udp is not None:
            try:
                self.udp.recvfrom(65536)
            except OSError:
                return
            self.datagrams += 1

    def _accept(self) -> bool:
        """One connection taken and read to its end (or for 0.5 s); False if none came."""
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return False
        self.connections += 1
        conn.settimeout(0.5)
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(65536):
                self.bytes_received += len(data)
        return True

    def stop(self) -> None:
        """Stop listening. What arrived and was not looked at yet (a connection in the
        backlog, a datagram queued) is counted first: the counts read after are exact."""
        self._stop.set()
        self._thread.join(timeout=2)
        self.sock.setblocking(False)
        while self._accept():
            pass
        self._datagrams()
        self.sock.close()
        if self.udp is not None:
            self.udp.close()


# -- the proxy --------------------------------------------------------------------------------



def end(process: subprocess.Popen[bytes]) -> int:
    """`process` stopped: SIGTERM, and SIGKILL if it has not ended 10 s later; its status."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
    return int(process.returncode)

class Proxy:
    """`sealgate proxy` as a real process on an ephemeral loopback port."""

    def __init__(
        self,
        workdir: Path,
        rules: str | Path,
        *,
        resolver: tuple[str, int] | None = None,
        upstream_ca: Path | None = None,
        extra_args: list[str] | None = None,
        transparent_host: str | None = None,
        listen_host: str = "127.0.0.1",
        mitmproxy_errors: bool = False,  # mitmproxy's error records on stderr (tests.mitmlog)
        env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.upstream_ca = upstream_ca
        self.state = workdir / "state"
        if isinstance(rules, Path):
            self.rules = rules
        else:
            self.rules = workdir / "rules.yaml"
            self.rules.write_text(rules)
        self.port = free_port()
        self.transparent_port = free_port() if transparent_host else None
        command = [sys.executable, "-m", "tests.mitmlog"] if mitmproxy_errors else SEALGATE
        args = [
            *command, "proxy",
            "--listen", f"{listen_host}:{self.port}",
            "--rules", str(self.rules),
            "--state", str(self.state),
        ]
        if resolver is not None:
            args += ["--resolver", f"{resolver[0]}:{resolver[1]}"]
        if upstream_ca is not None:
            args += ["--upstream-ca", str(upstream_ca)]
        if self.transparent_port is not None:
            args += ["--transparent", f"{transparent_host}:{self.transparent_port}"]
        args += extra_args or []
        self.args = args
        self.stderr_path = workdir / "proxy.stderr"
        self._stderr = self.stderr_path.open("wb")
        self.process = subprocess.Popen(
            args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=self._stderr,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"proxy exited {self.process.returncode}: {self.stderr()}")
            if "sealgate proxy ready" in self.stderr():
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"proxy did not start: {self.stderr()}")

    @property
    def ca(self) -> Path:
        return self.state / "ca" / "mitmproxy-ca-cert.pem"

    def url(self, sandbox: str | None = None, key: str | None = None) -> str:
        auth = f"{sandbox}:{key}@" if sandbox is not None else ""
        return f"http://{auth}127.0.0.1:{self.port}"

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def audit_text(self) -> str:
        path = self.state / "audit.log"
        return path.read_text() if path.exists() else ""

    def audit(self) -> list[dict[str, Any]]:
        # Only complete lines: the proxy may be appending a batch while we read.
        complete = self.audit_text().rpartition("\n")[0]
        return [json.loads(line) for line in complete.splitlines() if line.strip()]

    def wait_audit(self, predicate: Any, timeout: float = 5.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.audit():
                if predicate(line):
                    return line
            time.sleep(0.05)
        raise AssertionError(f"no matching audit line in:\n{self.audit_text()[-3000:]}")

    def signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    def stop(self) -> int:
        code = end(self.process)
        self._stderr.close()
        return code


def secret_store(directory: Path, **secrets: str) -> list[str]:
    """A private file secret store holding `secrets`, as the proxy arguments that name it."""
    path = directory / "secrets.yaml"
    path.write_text("".join(f"{name}: {value}\n" for name, value in secrets.items()))
    os.chmod(path, 0o600)
    return ["--secret-store", f"file:{path}"]


class ProxyFactory:
    """Starts proxies the way the modules need them (conftest's `proxy_with`): the session's stub
    resolver, trusting the origins' CA, in a directory of its own; a context manager, so that a
    module's proxy stops with its module and a test's with its test.

    On a clean exit it checks what every module used to check in its own teardown: none of the
    `canaries` in the audit log or stderr (read after the stop, when both are complete), and with
    `clean_stderr`, no traceback nor crashed connection handler in stderr. A proxy given
    canaries logs at debug level, every library's records included, and each line of its
    stderr must be a JSON log line (`log_lines`): no canary at any level, in any line.
    """

    def __init__(self, directories: pytest.TempPathFactory, resolver: tuple[str, int],
                 origin_ca: Path) -> None:
        self.directories = directories
        self.resolver = resolver
        self.origin_ca = origin_ca

    @contextlib.contextmanager
    def __call__(
        self,
        rules: str | Path,
        *,
        name: str = "proxy",
        secrets: dict[str, str] | None = None,
        token_keys: Path | None = None,
        options: list[str] | None = None,
        canaries: tuple[str, ...] = (),
        clean_stderr: bool = False,
        directory: Path | None = None,
        **kwargs: Any,
    ) -> Iterator[Proxy]:
        where = directory or self.directories.mktemp(name)
        args = secret_store(where, **secrets) if secrets else []
        if token_keys is not None:
            args += ["--token-keys", str(token_keys)]
        args += options or []
        if canaries:
            kwargs.setdefault("env", {"SEALGATE_LOG_LEVEL": "debug"})
        proxy = Proxy(where, rules, resolver=self.resolver, upstream_ca=self.origin_ca,
                      extra_args=args, **kwargs)
        try:
            yield proxy
        finally:
            proxy.stop()
        everything = proxy.audit_text() + proxy.stderr()
        leaked = [canary for canary in canaries if canary in everything]
        assert not leaked, f"{leaked} in the audit log or stderr"
        if canaries:
            log_lines(proxy.stderr())
        if clean_stderr:
            stderr = proxy.stderr()
            assert quiet(stderr) and "has crashed" not in stderr, stderr


@contextlib.contextmanager
def sandbox_gateway(plan: list[str], *programs: str) -> Iterator[None]:
    """`sealgate sandbox setup` for `plan` (its --range and --gateway) around a group of tests,
    `teardown` after; skipped without root networking, bubblewrap and setpriv, or without the
    host-system `programs` the sandboxes' probes use (only the host's /usr is inside)."""
    from tests.netns import require_root_net

    require_root_net()
    if shutil.which("bwrap") is None or shutil.which("setpriv") is None:
        pytest.skip("needs bubblewrap and setpriv (Debian: bubblewrap, util-linux)")
    missing = [p for p in programs if not Path(p).exists()]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} for the probes inside")
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    done = subprocess.run([*SEALGATE, "sandbox", "setup", *plan], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    try:
        yield
    finally:
        subprocess.run([*SEALGATE, "sandbox", "teardown", *plan], cwd=ROOT, env=env,
                       capture_output=True, timeout=60, check=False)
