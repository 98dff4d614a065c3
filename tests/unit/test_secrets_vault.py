"""VaultStore with hvac against tests/vaultfake.py over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from sealgate.proxy.credentials.secrets import (
    SecretBroker,
    SecretDenied,
    SecretError,
    SecretNotFound,
    SecretUnavailable,
    VaultConfig,
    VaultStore,
    parse_ref,
)
from tests.vaultfake import VaultFake, self_signed_tls

CANARY = "CANARY-vault-c0ffee42"
SECRET_ID = "CANARY-secret-id-91ab"
GITHUB = parse_ref("vault:kv/data/ci/github#token")
V1_REF = parse_ref("vault:secret/app#api_key")
READ = "kv/data/ci/github"


@pytest.fixture
def fake() -> Iterator[VaultFake]:
    with VaultFake() as server:
        server.add_kv_mount("kv", version=2)
        server.add_kv_mount("secret", version=1)
        server.put("kv/ci/github", {"token": CANARY, "user": "ci"})
        server.put("secret/app", {"api_key": "v1-key"})
        yield server


@pytest.fixture(autouse=True)
def _debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Every test here also checks that no secret reached any log, hvac's included."""
    caplog.set_level(logging.DEBUG)
    yield
    records = caplog.get_records("setup") + caplog.get_records("call")
    assert records  # the check below must have something to look at
    logged = "\n".join(caplog.handler.format(r) for r in records)
    for canary in (CANARY, SECRET_ID):
        assert canary not in logged


def run(body: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(body(), timeout=20))


async def until(happened: Callable[[], bool], seconds: float = 10.0) -> None:
    """Until `happened()`, looking every 20 ms: the store's renewals and logins run on its own
    timers, which a loaded machine delays (a fixed sleep then fails for nothing)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not happened():
        assert asyncio.get_running_loop().time() < deadline, "not within the bound"
        await asyncio.sleep(0.02)


def token_file(tmp_path: Path, token: str, name: str = "token") -> Path:
    path = tmp_path / name
    path.write_text(token + "\n")
    path.chmod(0o600)
    return path


def token_store(fake: VaultFake, tmp_path: Path, **kw: float | str) -> VaultStore:
    token = fake.add_token(paths=["kv/data/ci/*", "secret/app"])
    config = VaultConfig.from_url(
        f"vault:{fake.url}", token_file=str(token_file(tmp_path, token)), **kw
    )
    return VaultStore(config)


def approle_store(fake: VaultFake, tmp_path: Path, **kw: float | str) -> VaultStore:
    sid = token_file(tmp_path, SECRET_ID, "secret-id")
    return VaultStore(
        VaultConfig.from_url(
            f"vault:{fake.url}?auth=approle&role_id=ci-role", secret_id_file=str(sid), **kw
        )
    )


def expect_error(kind: type[SecretError], coro: Awaitable[object]) -> Awaitable[SecretError]:
    async def check() -> SecretError:
        with pytest.raises(kind) as err:
            await coro
        assert CANARY not in str(err.value) and SECRET_ID not in str(err.value)
        return err.value

    return check()


# -- reads and auth methods ---------------------------------------------------------------


def test_token_auth_reads_kv_v2_and_v1(fake: VaultFake, tmp_path: Path) -> None:
    async def body() -> None:
        store = token_store(fake, tmp_path)
        secret, ttl = await store.fetch(GITHUB)
        assert secret.reveal() == CANARY
        assert ttl == math.inf  # KV v2 has no lease: the cache TTL decides
        secret, ttl = await store.fetch(V1_REF)
        assert secret.reveal() == "v1-key"
        assert ttl == 2764800
        await store.close()

    run(body)
    assert fake.count(READ) == 1
    assert fake.count("auth/token/lookup-self") == 1


def test_approle_login(fake: VaultFake, tmp_path: Path) -> None:
    fake.add_approle("ci-role", SECRET_ID, paths=["kv/data/ci/*"], ttl=60)

    async def body() -> None:
        store = approle_store(fake, tmp_path)
        assert (await store.fetch(GITHUB))[0].reveal() == CANARY
        await store.close()

    run(body)
    assert fake.count("auth/approle/login", "POST") == 1


def test_approle_wrong_secret_id_is_denied(fake: VaultFake, tmp_path: Path) -> None:
    fake.add_approle("ci-role", "some-other-secret-id", paths=["kv/data/ci/*"])

    async def body() -> None:
        store = approle_store(fake, tmp_path)
        err = await expect_error(SecretDenied, store.fetch(GITHUB))
        assert "approle login" in str(err)
        await store.close()

    run(body)


def test_kubernetes_login_reads_the_jwt_file(fake: VaultFake, tmp_path: Path) -> None:
    jwt = token_file(tmp_path, "eyJhbGciOi.sa-token.sig", "jwt")
    fake.add_kubernetes_role("sealgate", ["eyJhbGciOi.sa-token.sig"], paths=["kv/data/ci/*"])

    async def body() -> None:
        config = VaultConfig.from_url(
            f"vault:{fake.url}?auth=kubernetes&role=sealgate", jwt_file=str(jwt)
        )
        store = VaultStore(config)
        assert (await store.fetch(GITHUB))[0].reveal() == CANARY
        await store.close()
        jwt.write_text("eyJ.rotated-away.sig")
        store = VaultStore(config)
        await expect_error(SecretDenied, store.fetch(GITHUB))
        await store.close()

    run(body)


def test_namespace_header(fake: VaultFake, tmp_path: Path) -> None:
    fake.add_kv_mount("kv", namespace="team-a")
    fake.put("kv/app", {"token": "team-value"}, namespace="team-a")
    token = fake.add_token(paths=["kv/data/*"], namespace="team-a")
    path = token_file(tmp_path, token)

    async def body() -> None:
        store = VaultStore(
            VaultConfig.from_url(f"vault:{fake.url}", token_file=str(path), namespace="team-a")
        )
        assert (await store.fetch(parse_ref("vault:kv/data/app#token")))[0].reveal() == (
            "team-value"
        )
        await store.close()
        outside = VaultStore(VaultConfig.from_url(f"vault:{fake.url}", token_file=str(path)))
        await expect_error(SecretDenied, outside.fetch(parse_ref("vault:kv/data/app#token")))
        await outside.close()

    run(body)
    assert {r.namespace for r in fake.requests} == {"team-a", ""}


def test_tls_verified_with_ca_file(tmp_path: Path) -> None:
    context, ca_file = self_signed_tls(tmp_path)
    with VaultFake(ssl_context=context) as tls_fake:
        tls_fake.add_kv_mount("kv")
        tls_fake.put("kv/ci/github", {"token": CANARY})
        token = token_file(tmp_path, tls_fake.add_token(paths=["kv/data/*"]))
        assert tls_fake.url.startswith("https://127.0.0.1:")

        async def body() -> None:
            config = VaultConfig.from_url(
                f"vault:{tls_fake.url}", token_file=str(token), ca_file=str(ca_file)
            )
            store = VaultStore(config)
            assert (await store.fetch(GITHUB))[0].reveal() == CANARY
            await store.close()
            unverified = VaultStore(
                VaultConfig.from_url(f"vault:{tls_fake.url}", token_file=str(token))
            )
            err = await expect_error(SecretUnavailable, unverified.fetch(GITHUB))
            assert "TLS verification failed" in str(err)
            await unverified.close()

        run(body)


# -- renewal and re-login -----------------------------------------------------------------


def test_renewable_token_renewed_at_half_ttl(fake: VaultFake, tmp_path: Path) -> None:
    fake.add_approle("ci-role", SECRET_ID, paths=["kv/data/ci/*"], ttl=0.4)

    async def body() -> None:
        store = approle_store(fake, tmp_path)
        await store.fetch(GITHUB)
        # Past the first token's TTL: only renewal keeps it alive.
        await until(lambda: fake.count("auth/token/renew-self", "POST") >= 2)
        assert (await store.fetch(GITHUB))[0].reveal() == CANARY
        await store.close()

    run(body)
    assert fake.count("auth/approle/login") == 1


def test_relogin_when_renewal_fails(fake: VaultFake, tmp_path: Path) -> None:
    fake.add_approle("ci-role", SECRET_ID, paths=["kv/data/ci/*"], ttl=0.3, max_renewals=1)

    def refused_then_relogged() -> bool:
        # The renewal refused (the token past its max TTL), and a login after it.
        seen = [(r.path, r.status) for r in fake.requests]
        refused = ("auth/token/renew-self", 403)
        return refused in seen and ("auth/approle/login", 200) in seen[seen.index(refused):]

    async def body() -> None:
        store = approle_store(fake, tmp_path)
        await store.fetch(GITHUB)
        await until(refused_then_relogged)
        # Whether this lands inside the new token's life or after it (a loaded machine), the
        # store has a way to the secret: the renewer's login, or the read's own one.
        assert (await store.fetch(GITHUB))[0].reveal() == CANARY
        await store.close()

    run(body)


def test_expired_token_recovered_by_exactly_one_relogin(fake: VaultFake, tmp_path: Path) -> None:
    # A long TTL, so the renewer stays asleep: only the read's 403 can bring the new login.
    fake.add_approle("ci-role", SECRET_ID, paths=["kv/data/ci/*"], ttl=600)

    async def body() -> None:
        store = approle_store(fake, tmp_path)
        await store.fetch(GITHUB)
        (token,) = fake.live_tokens()
        fake.expire(token)
        assert (await store.fetch(GITHUB))[0].reveal() == CANARY
        await store.close()

    run(body)
    assert fake.count("auth/approle/login") == 2
    assert [r.status for r in fake.requests if r.path == READ] == [200, 403, 200]


def test_persistent_refusal_fails_closed_after_one_relogin(
    fake: VaultFake, tmp_path: Path
) -> None:
    fake.add_approle("ci-role", SECRET_ID, paths=["kv/data/ci/*"], ttl=600)

    async def body() -> None:
        store = approle_store(fake, tmp_path)
        await store.fetch(GITHUB)
        fake.refuse_tokens = True  # the new login's token too
        err = await expect_error(SecretDenied, store.fetch(GITHUB))
        assert "again after logging in again" in str(err)
        await store.close()

    run(body)
    # One login more and one read more, then a clear refusal: no loop.
    assert fake.count("auth/approle/login") == 2
    assert [r.status for r in fake.requests if r.path == READ] == [200, 403, 403]


def test_non_renewable_token_is_replaced_by_login(fake: VaultFake, tmp_path: Path) -> None:
    fake.add_approle("ci-role", SECRET_ID, paths=["kv/data/ci/*"], ttl=0.3, renewable=False)

    async def body() -> None:
        store = approle_store(fake, tmp_path)
        await store.fetch(GITHUB)
        await until(lambda: fake.count("auth/approle/login") >= 2)
        assert fake.count("auth/token/renew-self") == 0
        await store.close()

    run(body)


def test_revoked_token_recovered_by_one_relogin(fake: VaultFake, tmp_path: Path) -> None:
    fake.add_approle("ci-role", SECRET_ID, paths=["kv/data/ci/*"], ttl=60)

    async def body() -> None:
        store = approle_store(fake, tmp_path)
        await store.fetch(GITHUB)
        for token in fake.live_tokens():
            fake.revoke(token)
        assert (await store.fetch(GITHUB))[0].reveal() == CANARY
        await store.close()

    run(body)
    assert fake.count("auth/approle/login") == 2


def test_token_file_reread_when_it_changes(fake: VaultFake, tmp_path: Path) -> None:
    first = fake.add_token(paths=["kv/data/ci/*"])
    path = token_file(tmp_path, first)

    async def body() -> None:
        store = VaultStore(VaultConfig.from_url(f"vault:{fake.url}", token_file=str(path)))
        await store.fetch(GITHUB)
        fake.revoke(first)
        second = fake.add_token(paths=["kv/data/ci/*"])
        token_file(tmp_path, second + "  ")  # a different size, as a rotated file would be
        assert (await store.fetch(GITHUB))[0].reveal() == CANARY
        assert {r.token for r in fake.requests if r.path == READ} == {first, second}
        await store.close()

    run(body)


# -- failures -----------------------------------------------------------------------------


def test_permission_denied_names_the_path(fake: VaultFake, tmp_path: Path) -> None:
    fake.put("kv/prod/db", {"password": CANARY})

    async def body() -> None:
        store = token_store(fake, tmp_path)
        err = await expect_error(
            SecretDenied, store.fetch(parse_ref("vault:kv/data/prod/db#password"))
        )
        assert err.reason == "secret_denied"
        assert "kv/data/prod/db" in str(err)
        await store.close()

    run(body)
    # One read, then one lookup-self to tell a bad policy from a dead token; no retry.
    assert fake.count("kv/data/prod/db") == 1


def test_missing_secret_and_missing_field(fake: VaultFake, tmp_path: Path) -> None:
    async def body() -> None:
        store = token_store(fake, tmp_path)
        err = await expect_error(SecretNotFound, store.fetch(parse_ref("vault:kv/data/ci/none#t")))
        assert err.reason == "secret_not_found" and "kv/data/ci/none" in str(err)
        err = await expect_error(
            SecretNotFound, store.fetch(parse_ref("vault:kv/data/ci/github#pw"))
        )
        assert "'pw'" in str(err) and "kv/data/ci/github" in str(err)
        await store.close()

    run(body)


def test_sealed_dropped_and_down_are_unavailable(fake: VaultFake, tmp_path: Path) -> None:
    async def body() -> None:
        store = token_store(fake, tmp_path)
        await store.fetch(GITHUB)
        fake.sealed = True
        err = await expect_error(SecretUnavailable, store.fetch(GITHUB))
        assert "sealed" in str(err)
        fake.sealed = False
        fake.drop = True
        await expect_error(SecretUnavailable, store.fetch(GITHUB))
        fake.drop = False
        fake.down = True
        err = await expect_error(SecretUnavailable, store.fetch(GITHUB))
        assert "connection failed" in str(err)
        fake.down = False
        assert (await store.fetch(GITHUB))[0].reveal() == CANARY
        await store.close()

    run(body)


def test_rotation_and_outage_through_the_broker(fake: VaultFake, tmp_path: Path) -> None:
    clock = [0.0]

    async def body() -> None:
        broker = SecretBroker(
            [token_store(fake, tmp_path)], ttl=60, stale_grace=30, clock=lambda: clock[0]
        )
        assert (await broker.get(GITHUB)).reveal() == CANARY
        fake.put("kv/ci/github", {"token": "rotated-value"})
        clock[0] = 30
        assert (await broker.get(GITHUB)).reveal() == CANARY  # still within TTL
        clock[0] = 61
        assert (await broker.get(GITHUB)).reveal() == "rotated-value"

        fake.down = True
        clock[0] = 61 + 60 + 20  # expired, inside the grace
        assert (await broker.get(GITHUB)).reveal() == "rotated-value"
        clock[0] = 61 + 60 + 31  # past the grace: fail closed
        err = await expect_error(SecretUnavailable, broker.get(GITHUB))
        assert err.reason == "secret_unavailable"
        assert "rotated-value" not in str(err)
        fake.down = False
        await broker.close()

    run(body)
    assert fake.count(READ) == 2  # the reads tried while down never reached it


def test_slow_vault_one_request_bounded_threads(fake: VaultFake, tmp_path: Path) -> None:
    async def body() -> None:
        store = token_store(fake, tmp_path, timeout=2, workers=4)
        await store.fetch(V1_REF)  # log in first: only the reads are slow
        fake.delay = 0.4
        broker = SecretBroker([store], fetch_timeout=2)
        started = time.monotonic()
        results = await asyncio.gather(*(broker.get(GITHUB) for _ in range(50)))
        assert time.monotonic() - started < 1.2
        assert {s.reveal() for s in results} == {CANARY}
        threads = [t for t in threading.enumerate() if t.name.startswith(store.thread_name_prefix)]
        assert 1 <= len(threads) <= 4
        await broker.close()

    run(body)
    assert fake.count(READ) == 1


def test_vault_slower_than_timeout_fails_fast_without_pile_up(
    fake: VaultFake, tmp_path: Path
) -> None:
    async def body() -> None:
        store = token_store(fake, tmp_path, timeout=0.3, workers=2)
        await store.fetch(V1_REF)
        fake.delay = 1.0
        broker = SecretBroker([store], fetch_timeout=0.5)
        started = time.monotonic()
        outcomes = await asyncio.gather(
            *(broker.get(GITHUB) for _ in range(50)), return_exceptions=True
        )
        assert time.monotonic() - started < 0.9
        assert all(isinstance(o, SecretUnavailable) for o in outcomes)
        assert "no answer within 0.3s" in str(outcomes[0])
        threads = [t for t in threading.enumerate() if t.name.startswith(store.thread_name_prefix)]
        assert len(threads) <= 2
        fake.delay = 0
        await broker.close()

    run(body)
    assert fake.count(READ) == 1


def test_fake_answers_hvac_like_vault(fake: VaultFake) -> None:
    """The fake's own fidelity, checked with plain hvac: shapes and status codes."""
    import hvac
    import hvac.exceptions

    client = hvac.Client(url=fake.url, token=fake.add_token(paths=["kv/data/ci/*"]))
    read = client.secrets.kv.v2.read_secret_version(
        path="ci/github", mount_point="kv", raise_on_deleted_version=True
    )
    assert read["data"]["metadata"]["version"] == 1
    assert (read["lease_id"], read["renewable"], read["auth"]) == ("", False, None)
    assert fake.put("kv/ci/github", {"token": "x"}) == 2
    assert client.auth.token.lookup_self()["data"]["policies"] == ["default", "sealgate-reader"]
    assert client.sys.read_health_status(method="GET")["sealed"] is False
    with pytest.raises(hvac.exceptions.InvalidPath) as missing:
        client.secrets.kv.v2.read_secret_version(
            path="ci/none", mount_point="kv", raise_on_deleted_version=True
        )
    assert missing.value.errors == []
    with pytest.raises(hvac.exceptions.Forbidden) as denied:
        client.secrets.kv.v1.read_secret(path="app", mount_point="secret")
    assert denied.value.errors == ["permission denied"]
    fake.sealed = True
    assert client.sys.read_health_status(method="GET").status_code == 503
    with pytest.raises(hvac.exceptions.VaultDown) as sealed:
        client.auth.token.lookup_self()
    assert sealed.value.errors == ["Vault is sealed"]
