"""Micro-benchmark of credential injection's parts: sealed tokens, the secret cache, the broker.

    .venv/bin/python bench/injection_micro.py                        # a table on stdout
    .venv/bin/python bench/injection_micro.py --cpu 1 --server-cpu 0 --json

`bench/injection_overhead.py` runs it alone on the proxy's CPU and reports its figures. Names
end in their unit: `_us` is microseconds per operation (best of several passes), `_ms`
milliseconds. Secret-store misses are timed one by one and given as p50 and p99, because a
miss is a request to a backend, not a loop of pure Python: the Vault misses go over real HTTP on
loopback to bench/fakes.py's `Vault`, whose server thread runs on `--server-cpu`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import secrets
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's sealgate, not whichever one is installed

from fakes import Vault  # noqa: E402
from mitmproxy import http  # noqa: E402
from rounds import percentile  # noqa: E402
from services import pinned  # noqa: E402

from sealgate.credentials import Claims, Destination, SandboxBinding, seal, unseal  # noqa: E402
from sealgate.credentials.keys import Keyring, PublicKeyEntry, generate  # noqa: E402
from sealgate.credentials.processors import BearerProcessor  # noqa: E402
from sealgate.proxy.credentials.broker import Broker  # noqa: E402
from sealgate.proxy.credentials.inject import Credential, Injected, credential, write  # noqa: E402
from sealgate.proxy.credentials.scrub import Scrubber  # noqa: E402
from sealgate.proxy.credentials.secrets import SecretBroker, SecretRef, open_store, parse_ref  # noqa: E402
from sealgate.proxy.credentials.tokenizer import HEADER, Tokenizer, TokenRequest  # noqa: E402
from sealgate.proxy.policy.rulesfile import load_rules  # noqa: E402

HOST, PORT, PATH = "api.bench", 443, "/v1/items"
SANDBOX = "bench-1"
COLD_TOKENS = 300  # distinct tokens, each opened once per pass
MISSES = 200  # distinct secrets, each fetched once: every get is a miss
BODY = b"x" * 1024


def _per_op(body: Callable[[], object], number: int, repeat: int = 5) -> float:
    """Best-of-`repeat` µs per call of `body`, `number` calls per pass."""
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            body()
        best = min(best, time.perf_counter() - start)
    return best / number * 1e6


async def _aper_op(body: Callable[[], Awaitable[object]], number: int, repeat: int = 5) -> float:
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            await body()
        best = min(best, time.perf_counter() - start)
    return best / number * 1e6


def _mint(public: PublicKeyEntry, jti: str) -> str:
    now = int(time.time())
    claims = Claims(
        kid=public.kid, secret=secrets.token_urlsafe(24), processor=BearerProcessor(),
        hosts=(Destination(HOST, PORT),), exp=now + 3600, iat=now, jti=jti,
        binding=SandboxBinding(SANDBOX),
    )
    return seal(claims, public)


def _request() -> http.Request:
    return http.Request.make("GET", f"https://{HOST}{PATH}", b"", http.Headers(accept="*/*"))


def _write_us(cred: Credential, number: int = 5000, repeat: int = 5) -> float:
    """Best-of-`repeat` µs per `write` into a fresh request; the requests are built (and
    thrown away) outside the timed loop, since `write` changes them."""
    best = math.inf
    for _ in range(repeat):
        fresh = [_request() for _ in range(number)]
        start = time.perf_counter()
        for request in fresh:
            write(request, [cred], Injected(), strip=(HEADER.encode(),))
        best = min(best, time.perf_counter() - start)
    return best / number * 1e6


def token_figures(work: Path) -> dict[str, float]:
    public = generate(work / "token-keys")
    keyring = Keyring.load(work / "token-keys")
    token = _mint(public, "hot")
    fresh = [_mint(public, f"cold-{i}") for i in range(COLD_TOKENS)]
    check = TokenRequest(SANDBOX, "bench", HOST, PORT, "GET", PATH, ["Basic eDp5"])
    warm = Tokenizer(keyring)
    (granted,) = warm.authorise([token], check)

    def authorise_fresh() -> None:
        # A new cache each pass, so every one of the distinct tokens is a miss.
        tokenizer = Tokenizer(keyring)
        for t in fresh:
            tokenizer.authorise([t], check)

    secret = granted.secret
    bearer = credential(BearerProcessor(), secret, "token:x")
    return {
        "unseal_cold_us": _per_op(lambda: [unseal(t, keyring) for t in fresh], 1,
                                  repeat=3) / COLD_TOKENS,
        "tokenizer_authorise_cold_us": _per_op(authorise_fresh, 1, repeat=3) / COLD_TOKENS,
        "tokenizer_authorise_cached_us": _per_op(lambda: warm.authorise([token], check), 20000),
        "write_bearer_us": _write_us(bearer),
        "scrub_1k_response_us": _per_op(lambda: Scrubber([secret]).data(BODY), 20000),
    }


async def _file_figures(work: Path) -> dict[str, float]:
    path = work / "secrets.yaml"
    path.write_text("".join(f"name_{i}: value-{secrets.token_hex(16)}\n" for i in range(MISSES)))
    path.chmod(0o600)
    store = open_store(f"file:{path}")
    hit = SecretRef("file", "name_0")
    rules_file = work / "rules.yaml"
    rules_file.write_text(f"""
version: 1
policies:
  bench:
    allow:
      - host: {HOST}
        methods: [GET]
        inject:
          - secret: file:name_0
            as: bearer
sandboxes: {{}}
default_policy: null
""")
    rules = load_rules(rules_file)
    rule = rules.policies["bench"].rules[0]
    cache = SecretBroker([store])
    broker = Broker(cache)
    broker.check(rules)  # as the proxy does on every (re)load
    await cache.get(hit)
    figures = {
        "secret_get_hit_us": await _aper_op(lambda: cache.get(hit), 20000),
        "broker_credentials_hit_us": await _aper_op(
            lambda: broker.credentials(rule.inject), 20000
        ),
    }
    # The store stays (its file parsed once, as in the proxy); each pass gets a new cache.
    misses: list[float] = []
    for _ in range(3):
        cold = SecretBroker([store])
        for i in range(MISSES):
            start = time.perf_counter()
            await cold.get(SecretRef("file", f"name_{i}"))
            misses.append(time.perf_counter() - start)
    figures["file_miss_p50_us"] = percentile(misses, 50) * 1e6
    figures["file_miss_p99_us"] = percentile(misses, 99) * 1e6
    await cache.close()
    return figures


async def _vault_figures(vault: Vault, work: Path) -> dict[str, float]:
    token_file = work / "vault-token"
    token_file.write_text(vault.add_token("kv/data/bench/"))
    token_file.chmod(0o600)
    store = open_store(f"vault:{vault.url}?auth=token&token_file={token_file}")
    cache = SecretBroker([store])
    try:
        # Log in and open the keep-alive connection before timing anything.
        for i in range(5):
            await cache.get(parse_ref(f"vault:kv/data/bench/warm-{i}#token"))
        hit = parse_ref("vault:kv/data/bench/warm-0#token")
        figures = {"vault_get_hit_us": await _aper_op(lambda: cache.get(hit), 20000)}
        misses: list[float] = []
        for i in range(MISSES):
            ref = parse_ref(f"vault:kv/data/bench/s-{i}#token")
            start = time.perf_counter()
            await cache.get(ref)
            misses.append(time.perf_counter() - start)
        figures["vault_miss_p50_ms"] = percentile(misses, 50) * 1e3
        figures["vault_miss_p99_ms"] = percentile(misses, 99) * 1e3
        return figures
    finally:
        await cache.close()


def run(cpu: int | None = None, server_cpu: int | None = None) -> dict[str, float]:
    """Figures by name (unit in the name). `cpu` pins the measuring thread, `server_cpu` the
    fake Vault's server thread; None leaves a thread where the scheduler puts it."""
    with tempfile.TemporaryDirectory(prefix="sealgate-injection-micro-") as tmp:
        work = Path(tmp)
        vault = Vault()
        with pinned(server_cpu):
            vault.start()  # its thread keeps this affinity
        try:
            for name in [f"warm-{i}" for i in range(5)] + [f"s-{i}" for i in range(MISSES)]:
                vault.put("kv", f"bench/{name}", {"token": f"vault-{secrets.token_hex(16)}"})
            with pinned(cpu):
                figures = token_figures(work)
                figures |= asyncio.run(_file_figures(work))
                figures |= asyncio.run(_vault_figures(vault, work))
        finally:
            vault.stop()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--cpu", type=int, help="pin the measuring thread to this CPU")
    parser.add_argument("--server-cpu", type=int, help="pin the fake Vault server to this CPU")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args()
    figures = run(args.cpu, args.server_cpu)
    if args.json:
        print(json.dumps(figures))
        return
    for name, value in figures.items():
        print(f"{name:32} {value:10.2f}")


if __name__ == "__main__":
    main()
