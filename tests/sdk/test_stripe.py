"""stripe, unchanged, through a real proxy to a fake api.stripe.com.

stripe verifies TLS against the CA bundle it ships (`stripe.ca_bundle_path`), not the one in
REQUESTS_CA_BUNDLE, so through the explicit, intercepting proxy it fails with a certificate
error unless told the bundle `sealgate env` wrote. That is why base-URL mode exists: the client
speaks plain HTTP to the proxy (`/_/api.stripe.com/...`), which speaks verified TLS upstream,
and the sealed token rides in the base URL, so the SDK needs neither a CA nor code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs

import pytest

from sealgate.credentials.processors import BearerProcessor
from tests.dnsstub import StubDNS
from tests.harness import OriginCA
from tests.sdk.kit import (
    PROXY_HEADERS,
    Arrived,
    Reply,
    World,
    masked,
    policy,
    refusal_visible,
    rule,
    rules_file,
    world,
)

pytest.importorskip("stripe", reason="stripe is not installed (pip install -e '.[test]')")

HOST = "api.stripe.com"
BLOCKED = "files.stripe.com"
SECRET = "sk_live_CANARYstripe51Hx0123456789"
PLACEHOLDER = "sk_test_sgplaceholderstripe"
KEYS = {"plain-1": "plain-key-stripe-1", "broker-1": "broker-key-stripe-1",
        "tokens-1": "tokens-key-stripe-1"}
PATHS = ["/v1/customers", "/v1/customers/*"]


def rules(port: int) -> str:
    placeholder = f"{{type: placeholder, header: Authorization, placeholder: {PLACEHOLDER}}}"
    methods = ["GET", "POST"]
    return rules_file(
        [
            policy("plain", rule(HOST, [port], paths=PATHS, methods=methods)),
            policy("broker", rule(HOST, [port], paths=PATHS, methods=methods,
                                  inject=placeholder)),
            policy("tokens", rule(HOST, [port], paths=PATHS, methods=methods), tokens=True),
            policy("anon", rule(HOST, [port], paths=PATHS, methods=methods), tokens=True),
        ],
        {"plain-1": ("plain", KEYS["plain-1"]), "broker-1": ("broker", KEYS["broker-1"]),
         "tokens-1": ("tokens", KEYS["tokens-1"])},
        default="anon",
    )


def customer(cid: str, auth: str | None, **extra: object) -> dict[str, object]:
    return {"id": cid, "object": "customer", "created": 0, "livemode": False,
            "description": f"you sent {auth}", "metadata": {}, **extra}


def route(seen: Arrived) -> Reply:
    auth = seen.headers.get("authorization")
    path = seen.path.partition("?")[0]
    if path == "/v1/customers" and seen.method == "GET":
        return Reply(body={"object": "list", "url": "/v1/customers", "has_more": False,
                           "data": [customer("cus_fake1", auth)]})
    if path == "/v1/customers" and seen.method == "POST":
        form = {k: v[0] for k, v in parse_qs(seen.body.decode()).items()}
        return Reply(body=customer("cus_new", auth, email=form.get("email")))
    if path.startswith("/v1/customers/"):
        return Reply(body=customer(path.rsplit("/", 1)[1], auth))
    return Reply(404, {"error": {"type": "invalid_request_error", "message": "fake: no route"}})


@pytest.fixture(scope="module")
def w(tmp_path_factory: pytest.TempPathFactory, test_ca: OriginCA, dns: StubDNS
      ) -> Iterator[World]:
    directory: Path = tmp_path_factory.mktemp("sdk-stripe")
    with world(directory, test_ca, dns, [HOST, BLOCKED], route, rules, KEYS, SECRET) as made:
        yield made


@pytest.fixture(autouse=True)
def _fresh(w: World) -> None:
    w.fake.reset()


RETRIEVE = """
def main(api_base, api_key, headers=None, ca_from_env=False):
    import os, stripe
    if ca_from_env:  # the one setting the explicit proxy needs: trust sealgate env's bundle
        stripe.ca_bundle_path = os.environ["REQUESTS_CA_BUNDLE"]
    client = stripe.StripeClient(api_key, base_addresses={"api": api_base},
                                 max_network_retries=0)
    options = {"headers": headers} if headers else None
    found = client.v1.customers.retrieve("cus_fake1", options=options)
    return {"id": found.id, "description": found.description}
"""

CREATE = """
def main(api_base, api_key):
    import stripe
    client = stripe.StripeClient(api_key, base_addresses={"api": api_base},
                                 max_network_retries=0)
    made = client.v1.customers.create(params={"email": "a@example.com"})
    return {"id": made.id, "email": made.email, "description": made.description}
"""

DELETE = """
def main(api_base, api_key):
    import stripe
    client = stripe.StripeClient(api_key, base_addresses={"api": api_base},
                                 max_network_retries=0)
    client.v1.customers.delete("cus_fake1")
"""


def clean(seen: Arrived) -> None:
    for name in PROXY_HEADERS:
        assert not seen.values(name), (name, seen.fields)


# -- the explicit, intercepting proxy: stripe's pinned bundle -----------------------------------


def test_explicit_proxy_fails_on_stripes_own_ca_bundle(w: World) -> None:
    """HTTPS_PROXY is honoured, but stripe verifies the proxy's certificate against its own
    bundle: a certificate error, and nothing reaches the API."""
    out = w.run(RETRIEVE, w.env("plain-1"), api_base=w.url(), api_key="sk_test_dummy")
    assert out.exception == "stripe._error.APIConnectionError", out.detail
    print(out.text)
    assert "Could not verify Stripe's SSL certificate" in out.text
    assert "CERTIFICATE_VERIFY_FAILED" in out.detail
    assert w.fake.untouched()
    # It did go through the proxy: a CONNECT allowed, intercepted, and no request in it.
    w.proxy.wait_audit(lambda e: e.get("event") == "connection_closed"
                       and e.get("target") == w.authority and e.get("sandbox") == "plain-1"
                       and e.get("tunnel") is False and e.get("requests") == 0)


def test_explicit_proxy_works_with_ca_bundle_path_set(w: World) -> None:
    got = w.run(RETRIEVE, w.env("plain-1"), api_base=w.url(), api_key="sk_test_dummy",
                     ca_from_env=True).ok()
    assert got == {"id": "cus_fake1", "description": "you sent Bearer sk_test_dummy"}
    seen = w.fake.last()
    assert (seen.method, seen.path) == ("GET", "/v1/customers/cus_fake1")
    assert seen.headers["authorization"] == "Bearer sk_test_dummy"
    assert seen.headers["user-agent"].startswith("Stripe/v1 PythonBindings/")
    assert "stripe-version" in seen.headers
    clean(seen)
    assert (len(w.fake.requests), w.fake.connections) == (1, 1)


def test_explicit_proxy_broker_and_a_token_per_request(w: World) -> None:
    """With the bundle set: the broker replaces a placeholder key; a token rides in the
    per-request `headers` option."""
    got = w.run(RETRIEVE, w.env("broker-1"), api_base=w.url(), api_key=PLACEHOLDER,
                     ca_from_env=True).ok()
    assert w.fake.last().headers["authorization"] == f"Bearer {SECRET}"
    assert got["description"] == f"you sent Bearer {masked(SECRET)}"
    w.fake.reset()
    token = w.mint(BearerProcessor())
    got = w.run(RETRIEVE, w.env("tokens-1"), api_base=w.url(), api_key="sk_test_dummy",
                     headers={"Proxy-Tokenizer": token}, ca_from_env=True).ok()
    seen = w.fake.last()
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    clean(seen)
    assert got["description"] == f"you sent Bearer {masked(SECRET)}"


# -- base-URL mode: no CA, no proxy, no code -------------------------------------------------------


def test_base_url_mode_plain(w: World) -> None:
    got = w.run(CREATE, {}, api_base=w.base_url(), api_key="sk_test_dummy_base").ok()
    assert got == {"id": "cus_new", "email": "a@example.com",
                   "description": "you sent Bearer sk_test_dummy_base"}
    seen = w.fake.last()
    assert (seen.method, seen.path, seen.headers["host"]) == ("POST", "/v1/customers",
                                                              w.authority)
    assert parse_qs(seen.body.decode()) == {"email": ["a@example.com"]}
    assert seen.headers["authorization"] == "Bearer sk_test_dummy_base"
    clean(seen)
    line = w.proxy.wait_audit(lambda e: e.get("path") == "/v1/customers" and e.get("base_url"))
    assert (line["decision"], line["policy"], line["scheme"]) == ("allow", "anon", "https")


def test_base_url_mode_with_a_token_in_the_path(w: World) -> None:
    token = w.mint(BearerProcessor())
    got = w.run(RETRIEVE, {}, api_base=w.base_url(tokens=[token]),
                     api_key="sk_test_dummy").ok()
    seen = w.fake.last()
    assert seen.path == "/v1/customers/cus_fake1"
    assert seen.headers["authorization"] == f"Bearer {SECRET}"
    clean(seen)
    assert SECRET not in json.dumps(got)
    assert got["description"] == f"you sent Bearer {masked(SECRET)}"


def test_base_url_mode_token_is_strict(w: World) -> None:
    """A token for another host in the base URL refuses the request; nothing is forwarded."""
    token = w.mint(BearerProcessor(), host="api.other.test")
    out = w.run(RETRIEVE, {}, api_base=w.base_url(tokens=[token]), api_key="sk_test_x")
    assert out.exception == "stripe._error.PermissionError", out.detail
    print(out.text)
    refusal_visible(out.text, "token_scope")
    assert w.fake.untouched()


def test_base_url_mode_refusal_shows_the_reason_in_the_sdk_exception(w: World) -> None:
    out = w.run(DELETE, {}, api_base=w.base_url(), api_key="sk_test_dummy")
    assert out.exception == "stripe._error.PermissionError", out.detail
    print(out.text)
    refusal_visible(out.text, "not_allowed")
    assert "DELETE" in out.text
    assert w.fake.untouched()


def test_base_url_mode_refused_host(w: World) -> None:
    out = w.run(RETRIEVE, {}, api_base=w.base_url(host=BLOCKED), api_key="sk_test_dummy")
    assert out.exception == "stripe._error.PermissionError", out.detail
    print(out.text)
    refusal_visible(out.text, "not_allowed")
    assert BLOCKED in out.text
    assert w.fake.untouched()
