"""What every SDK test module shares: a fake of an API over HTTPS on loopback, a real proxy in
front of it, the client's environment as `sealgate env` prints it, and a way to run an SDK call
in a fresh interpreter with exactly that environment.

The fake is served under the API's real name (api.openai.com, ...): the tests' stub DNS, given
to the proxy with --resolver, answers 127.0.0.1 for it, and its certificate is issued for that
name by the test OriginCA, which only the proxy trusts (--upstream-ca). The client trusts only
the bundle `sealgate env` wrote (system roots plus the proxy's CA): every host here is
intercepted, so a client that reached the fake by any other way would fail its handshake.

The fake records what reached it (each request's method, target, header fields and body, and
every connection), so a test asserts at the far end what arrived, not only the status the
client saw.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import os
import select
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from sealgate.credentials import Claims, Destination, seal
from sealgate.credentials.keys import PublicKeyEntry, generate
from sealgate.credentials.processors import Processor
from tests.dnsstub import StubDNS
from tests.harness import ROOT, SEALGATE, OriginCA, Proxy, key_digest

MASK = "[REDACTED]"
CALL_TIMEOUT = 30.0
PROXY_HEADERS = ("proxy-authorization", "proxy-tokenizer", "forwarded", "x-forwarded-for")


def masked(secret: str) -> str:
    """What the proxy's scrubber writes over `secret`: the mask repeated, cut to its length."""
    return (MASK * (len(secret) // len(MASK) + 1))[: len(secret)]


# -- the fake API ------------------------------------------------------------------------------


@dataclass
class Arrived:
    """One request as the fake read it."""

    method: str
    path: str
    fields: list[tuple[str, str]]  # every header field, as sent
    body: bytes
    connection: int  # which accepted connection (1, 2, ...) carried it
    sni: str | None = None  # the server name that connection's TLS handshake asked for

    @property
    def headers(self) -> dict[str, str]:
        """Lower-case names; of a repeated one, the last."""
        return {k.lower(): v for k, v in self.fields}

    def values(self, name: str) -> list[str]:
        return [v for k, v in self.fields if k.lower() == name.lower()]

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Reply:
    status: int = 200
    body: Any = b""  # bytes as they are; anything else sent as JSON
    headers: dict[str, str] = field(default_factory=dict)
    # When set: sent chunked, one write (and flush) per item, and `body` ignored; a number
    # among them is a pause of that many seconds.
    chunks: list[bytes | float] | None = None

    def payload(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        return json.dumps(self.body).encode()


Route = Callable[[Arrived], Reply]


def echo(seen: Arrived) -> dict[str, Any]:
    """What a debug endpoint would answer: the request as it arrived, credentials included (so a
    test sees whether the proxy masked them on the way back)."""
    return {
        "method": seen.method,
        "path": seen.path,
        "authorization": seen.headers.get("authorization"),
        "x-api-key": seen.headers.get("x-api-key"),
        "headers": dict(seen.fields),
    }


def sse(events: Sequence[tuple[str | None, Any]]) -> list[bytes | float]:
    """Server-sent events, one chunk each: (event name or None, data as JSON or raw text)."""
    chunks: list[bytes | float] = []
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data)
        head = f"event: {name}\n" if name else ""
        chunks.append(f"{head}data: {text}\n\n".encode())
    return chunks


class FakeAPI:
    """An HTTPS server on 127.0.0.1 for `names` (certificate from the test CA) that answers with
    `route` and records everything that reached it."""

    def __init__(self, ca: OriginCA, names: Sequence[str], route: Route) -> None:
        self.names = tuple(names)
        self.route = route
        self.requests: list[Arrived] = []
        self.connections = 0
        # The Content-Length body being read, as far as it has come (of the request to start
        # last): a test sees from it (a copy, `bytes(fake.arriving)`) what reached the fake
        # before the client sent the rest.
        self.arriving = bytearray()
        self._lock = threading.Lock()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with fake._lock:
                    fake.connections += 1
                    self.number = fake.connections
                self.sni: str | None = getattr(self.request, "sealgate_sni", None)

            def _handle(self) -> None:
                if "chunked" in self.headers.get("transfer-encoding", "").lower():
                    body = self._read_chunked()
                else:
                    body = self._read(int(self.headers.get("content-length") or 0))
                seen = Arrived(self.command, self.path, list(self.headers.items()), body,
                               self.number, self.sni)
                with fake._lock:
                    fake.requests.append(seen)
                try:
                    reply = fake.route(seen)
                except Exception as exc:  # a broken route is a 500 the test will see
                    reply = Reply(500, {"fake_error": repr(exc)})
                self.send_response(reply.status)
                headers = {"Content-Type": "application/json", **reply.headers}
                for k, v in headers.items():
                    self.send_header(k, v)
                if reply.chunks is not None:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for chunk in reply.chunks:
                        if isinstance(chunk, float):
                            time.sleep(min(chunk, 5.0))
                            continue
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                    return
                payload = reply.payload()
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _read(self, length: int) -> bytes:
                fake.arriving = body = bytearray()
                while len(body) < length:
                    piece = self.rfile.read1(min(length - len(body), 65536))
                    if not piece:
                        break
                    body += piece
                return bytes(body)

            def _read_chunked(self) -> bytes:
                body = b""
                for _ in range(100_000):
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if not size:
                        break
                    body += self.rfile.read(size)
                    self.rfile.readline()
                for _ in range(100):  # trailers, then the blank line
                    if not self.rfile.readline().strip():
                        break
                return body

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*(str(p) for p in ca.issue(*names)))

        def remember_sni(sock: Any, name: str | None, _: ssl.SSLContext) -> None:
            sock.sealgate_sni = name

        context.sni_callback = remember_sni
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.connections = 0

    def untouched(self) -> bool:
        return self.connections == 0 and not self.requests

    def last(self) -> Arrived:
        assert self.requests, "nothing reached the fake"
        return self.requests[-1]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Fake(Protocol):
    """What the tests read of a fake: FakeAPI, or a server of another protocol."""

    names: tuple[str, ...]
    port: int
    requests: list[Arrived]
    connections: int

    def reset(self) -> None: ...
    def untouched(self) -> bool: ...
    def last(self) -> Arrived: ...
    def stop(self) -> None: ...


# -- rules --------------------------------------------------------------------------------------


def rule(host: str, ports: Sequence[int], *, paths: Sequence[str] | None = None,
         methods: Sequence[str] | None = None, inject: str | None = None) -> str:
    """One allow rule, as YAML list item text (six spaces deep). `inject` is the `as:` value of
    a broker injection of `file:api_key`."""
    lines = [f"      - host: {host}", f"        ports: [{', '.join(map(str, ports))}]"]
    if methods is not None:
        lines.append(f"        methods: [{', '.join(methods)}]")
    if paths is not None:
        lines.append(f"        paths: [{', '.join(json.dumps(p) for p in paths)}]")
    if inject is not None:
        lines += ["        inject:", "          - secret: file:api_key",
                  f"            as: {inject}"]
    return "\n".join(lines)


def policy(name: str, *rules: str, tokens: bool = False) -> str:
    """A policy allowing `rules` (from rule()), loopback opened as allow_networks."""
    allow = "    allow:\n" + "\n".join(rules) if rules else "    allow: []"
    return (f"  {name}:\n    tokens: {'true' if tokens else 'false'}\n{allow}\n"
            "    allow_networks: [127.0.0.1/32]\n")


def rules_file(policies: Sequence[str], sandboxes: Mapping[str, tuple[str, str]],
               default: str | None) -> str:
    """`sandboxes`: id -> (policy, key)."""
    entries = "".join(
        f'  {sid}: {{policy: {pol}, key_sha256: "{key_digest(key)}"}}\n'
        for sid, (pol, key) in sandboxes.items()
    )
    return (f"version: 1\npolicies:\n{''.join(policies)}sandboxes:\n{entries}"
            f"default_policy: {default or 'null'}\n")


# -- the world a module's tests share -------------------------------------------------------------


@dataclass
class World:
    """A fake API, the proxy in front of it, and what a client is given."""

    directory: Path
    fake: Fake
    proxy: Proxy
    keys: dict[str, str]  # sandbox id -> its proxy key
    public: PublicKeyEntry
    secret: str  # what the broker's file store holds as `api_key`, and tokens seal
    forkserver: Forkserver | None = None
    minted: list[str] = field(default_factory=list)
    _envs: dict[str, dict[str, str]] = field(default_factory=dict)

    def run(self, code: str, env: Mapping[str, str], **args: Any) -> Outcome:
        """An SDK call with exactly `env` (see run_python), through the module's forkserver
        when it has one."""
        try:
            if self.forkserver is not None:
                return self.forkserver.run(code, env, **args)
            return run_python(code, env, **args)
        except (AssertionError, subprocess.TimeoutExpired) as exc:
            # The client died or hung: what the proxy logged last goes with it.
            stderr = "\n".join(self.proxy.stderr().splitlines()[-20:])
            audit = "\n".join(self.proxy.audit_text().splitlines()[-8:])
            raise AssertionError(f"{exc}\n--- the proxy's stderr, last lines:\n{stderr}\n"
                                 f"--- its audit log, last lines:\n{audit}") from exc

    def env(self, sandbox: str | None, *, key: str | None = None) -> dict[str, str]:
        """What `sealgate env --format json` prints for `sandbox` (its key, or `key` in the key
        file: connection-scoped tokens ride there as `<key>,<token>,...`), or for no sandbox."""
        if sandbox is not None and key is None:
            key = self.keys[sandbox]
        cache = f"{sandbox}\0{key}"
        if cache not in self._envs:
            identity: list[str] = []
            if sandbox is not None:
                key_file = self.directory / f"key-{len(self._envs)}"
                key_file.write_text(f"{key}\n")
                key_file.chmod(0o600)
                identity = ["--sandbox", sandbox, "--key-file", str(key_file)]
            done = subprocess.run(
                [*SEALGATE, "env", *identity, "--proxy", f"127.0.0.1:{self.proxy.port}",
                 "--state", str(self.proxy.state), "--format", "json"],
                cwd=ROOT, capture_output=True, text=True, timeout=30, check=False,
            )
            assert done.returncode == 0, done.stderr
            env = json.loads(done.stdout)
            bundle = Path(env["SSL_CERT_FILE"])
            assert os.access(bundle, os.R_OK), f"sealgate env's bundle {bundle} is unreadable"
            assert self.proxy.ca.read_text().strip() in bundle.read_text()
            self._envs[cache] = env
        return dict(self._envs[cache])

    def mint(self, processor: Processor, *, host: str | None = None, port: int | None = None,
             secret: str | None = None, ttl: int = 300, **extra: Any) -> str:
        now = int(time.time())
        claims = Claims(
            kid=self.public.kid, secret=self.secret if secret is None else secret,
            processor=processor,
            hosts=(Destination(host or self.fake.names[0], port or self.fake.port),),
            exp=now + ttl, iat=now, **extra,
        )
        token = seal(claims, self.public)
        self.minted.append(token)
        return token

    @property
    def authority(self) -> str:
        return f"{self.fake.names[0]}:{self.fake.port}"

    def url(self, path: str = "", host: str | None = None) -> str:
        return f"https://{host or self.fake.names[0]}:{self.fake.port}{path}"

    def base_url(self, path: str = "", *, tokens: Sequence[str] = (),
                 host: str | None = None) -> str:
        """Base-URL mode: `$SEALGATE_BASE_URL[<tokens>@]<host>:<port><path>`, the prefix as
        `sealgate env` prints it (`http://<proxy>/_/`)."""
        prefix = self.env(None)["SEALGATE_BASE_URL"]
        assert prefix == f"http://127.0.0.1:{self.proxy.port}/_/", prefix
        named = f"{','.join(tokens)}@" if tokens else ""
        return f"{prefix}{named}{host or self.fake.names[0]}:{self.fake.port}{path}"



@contextlib.contextmanager
def world(
    directory: Path, ca: OriginCA, dns: StubDNS, names: Sequence[str], route: Route | None,
    rules: Callable[[int], str], keys: Mapping[str, str], secret: str,
    fake: Fake | None = None, preload: Sequence[str] = (),
) -> Iterator[World]:
    """Start a FakeAPI answering with `route` (or take `fake`: another server with FakeAPI's
    port, names, requests, connections, reset, untouched, last and stop), point `names` at
    loopback in the stub DNS and start a proxy enforcing `rules(fake.port)`. With `preload`,
    World.run goes through a Forkserver that imported those modules."""
    if fake is None:
        assert route is not None
        fake = FakeAPI(ca, names, route)
    server = fake
    for name in names:
        dns.set(name, "A 127.0.0.1")
    secrets = directory / "secrets.yaml"
    secrets.write_text(f"api_key: {secret}\n")
    secrets.chmod(0o600)
    token_keys = directory / "token-keys"
    token_keys.mkdir()
    public = generate(token_keys)
    try:
        proxy = Proxy(directory, rules(server.port), resolver=dns.address, upstream_ca=ca.path,
                      extra_args=["--secret-store", f"file:{secrets}",
                                  "--token-keys", str(token_keys)])
    except BaseException:
        server.stop()
        raise
    forkserver = Forkserver(directory, preload) if preload else None
    made = World(directory, server, proxy, dict(keys), public, secret, forkserver)
    try:
        yield made
    finally:
        if forkserver is not None:
            forkserver.stop()
        proxy.stop()
        server.stop()
    # Neither the secret nor a sandbox's key nor a sealed token is ever logged.
    logged = proxy.audit_text() + proxy.stderr()
    assert secret not in logged
    assert not [k for k in keys.values() if k in logged]
    assert not [t for t in made.minted if t in logged or t.rpartition(".")[2] in logged]


# -- running a client ---------------------------------------------------------------------------

# A call that hangs dumps every thread's stack to its stderr and exits, before the parent's
# timeout kills it: the failure then says where the client was stuck ("the client died").
_PRELUDE = f'''
import faulthandler, json, sys, traceback
faulthandler.dump_traceback_later({CALL_TIMEOUT - 5:.0f}, exit=True)
ARGS = json.loads(sys.argv[1])

def _emit(value):
    sys.stdout.write("\\n@@result@@" + json.dumps(value, default=str) + "\\n")
    sys.stdout.flush()
'''

_EPILOGUE = '''
try:
    _result = {"ok": main(**ARGS)}
except BaseException as _exc:
    _result = {"exception": type(_exc).__module__ + "." + type(_exc).__qualname__,
               "text": str(_exc), "repr": repr(_exc),
               "traceback": traceback.format_exc()}
_emit(_result)
'''


@dataclass
class Outcome:
    value: Any = None
    exception: str | None = None  # module.qualname of what the SDK raised
    text: str = ""  # str() of it
    detail: str = ""  # repr and traceback, for failure messages only
    stdout: str = ""
    stderr: str = ""

    def ok(self) -> Any:
        assert self.exception is None, f"{self.exception}: {self.text}\n{self.detail}"
        return self.value

    def raised(self) -> str:
        assert self.exception is not None, f"no exception; got {self.value!r}"
        return self.text


def run_python(code: str, env: Mapping[str, str], **args: Any) -> Outcome:
    """`code` (defining `main(**args)`, returning something JSON can hold) in a fresh
    interpreter of this venv, isolated (-I: no PYTHON* variables, no user site, no cwd on the
    path) and with exactly `env` as its environment."""
    program = _PRELUDE + textwrap.dedent(code) + _EPILOGUE
    done = subprocess.run(
        [sys.executable, "-I", "-c", program, json.dumps(args)],
        env=dict(env), cwd="/", capture_output=True, text=True, timeout=CALL_TIMEOUT,
        check=False,
    )
    marker = "\n@@result@@"
    if marker not in done.stdout:
        raise AssertionError(f"the client died ({done.returncode}):\n{done.stderr[-8000:]}")
    result = json.loads(done.stdout.rpartition(marker)[2])
    if "ok" in result:
        return Outcome(value=result["ok"], stdout=done.stdout, stderr=done.stderr)
    return Outcome(exception=result["exception"], text=result["text"],
                   detail=result["repr"] + "\n" + result["traceback"], stdout=done.stdout,
                   stderr=done.stderr)


_FORKSERVER = r"""
import importlib, json, os, sys, traceback
for _name in json.loads(sys.argv[1]):
    importlib.import_module(_name)
_replies = os.fdopen(os.dup(1), "w")
_null = os.open(os.devnull, os.O_RDONLY)
for _line in sys.stdin:
    _job = json.loads(_line)
    _pid = os.fork()
    if _pid == 0:
        _code = 1
        try:
            _log = os.open(_job["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(_log, 1)
            os.dup2(_log, 2)
            os.dup2(_null, 0)
            os.environ.clear()
            os.environ.update(_job["env"])
            sys.argv = ["-c", _job["args"]]
            exec(compile(_job["program"], "<sdk call>", "exec"), {"__name__": "__main__"})
            _code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(_code)
    _, _status = os.waitpid(_pid, 0)
    _replies.write(json.dumps({"status": _status}) + "\n")
    _replies.flush()
"""


class Forkserver:
    """run_python's contract, cheaper for SDKs that take most of a second to import (openai,
    anthropic): one isolated interpreter of this venv, started with an empty environment,
    imports `preload` once and forks a child per call. The child replaces its whole environment
    with exactly `env` before the call's code runs, and has made no call before: the same
    fresh, exact environment as a new interpreter, without paying the import each time.
    Nothing in `preload` may start a thread at import (grpc would), or read the environment
    then."""

    def __init__(self, directory: Path, preload: Sequence[str]) -> None:
        self.directory = directory
        self.preload = list(preload)
        self._process: subprocess.Popen[str] | None = None
        self._calls = 0

    def _start(self) -> subprocess.Popen[str]:
        if self._process is None or self._process.poll() is not None:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-c", _FORKSERVER, json.dumps(self.preload)],
                env={}, cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=(self.directory / "forkserver.stderr").open("w"), text=True,
                start_new_session=True,
            )
        return self._process

    def run(self, code: str, env: Mapping[str, str], **args: Any) -> Outcome:
        process = self._start()
        assert process.stdin is not None and process.stdout is not None
        self._calls += 1
        log = self.directory / f"call-{self._calls}.log"
        job = {"program": _PRELUDE + textwrap.dedent(code) + _EPILOGUE, "env": dict(env),
               "args": json.dumps(args), "log": str(log)}
        process.stdin.write(json.dumps(job) + "\n")
        process.stdin.flush()
        ready, _, _ = select.select([process.stdout], [], [], CALL_TIMEOUT + 15)
        line = process.stdout.readline() if ready else ""
        if not line:
            self.stop()
            raise AssertionError(f"no answer from the forkserver in time; call log:\n"
                                 f"{log.read_text()[-8000:] if log.exists() else ''}")
        output = log.read_text()
        marker = "\n@@result@@"
        if marker not in output:
            raise AssertionError(f"the client died ({json.loads(line)}):\n{output[-8000:]}")
        result = json.loads(output.rpartition(marker)[2])
        if "ok" in result:
            return Outcome(value=result["ok"], stdout=output)
        return Outcome(exception=result["exception"], text=result["text"],
                       detail=result["repr"] + "\n" + result["traceback"], stdout=output)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
        if process.stdout is not None:
            process.stdout.close()


def run_node(script: str, env: Mapping[str, str], **args: Any) -> Outcome:
    """An ES module for Node: its `main(args)` (async) returns JSON; /usr/bin/node, exactly
    `env`. Skips when there is no node."""
    node = Path("/usr/bin/node")
    if not node.exists():
        pytest.skip("needs node (/usr/bin/node)")
    program = textwrap.dedent(script) + textwrap.dedent('''
        const ARGS = JSON.parse(process.argv[process.argv.length - 1]);
        let result;
        try {
          result = {ok: await main(ARGS)};
        } catch (e) {
          result = {exception: e?.constructor?.name ?? "Error", text: String(e),
                    cause: e?.cause ? String(e.cause) + " " + (e.cause.code ?? "") : ""};
        }
        process.stdout.write("\\n@@result@@" + JSON.stringify(result) + "\\n");
    ''')
    done = subprocess.run(
        [str(node), "--input-type=module", "-e", program, json.dumps(args)],
        env=dict(env), cwd="/", capture_output=True, text=True, timeout=CALL_TIMEOUT,
        check=False,
    )
    marker = "\n@@result@@"
    if marker not in done.stdout:
        raise AssertionError(f"node died ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.rpartition(marker)[2])
    if "ok" in result:
        return Outcome(value=result["ok"], stdout=done.stdout, stderr=done.stderr)
    return Outcome(exception=result["exception"], text=result["text"] + " " + result["cause"],
                   stdout=done.stdout, stderr=done.stderr)


def refusal_visible(text: str, reason: str) -> None:
    """The SDK's own exception text shows sealgate's reason code and its message."""
    assert reason in text, text
    assert f"sealgate refused the request ({reason})" in text, text


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
