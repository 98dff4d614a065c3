"""Hostile or ambiguous input gets its own clear answer, never a traceback or a guess.

Proxy-Authorization that is not ASCII is a 407, not a 500; two identities on one request are
refused rather than the first one deciding; a method that is not a token is a 400; a broken
rules file is reported once per change, not once per poll.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path

from tests.conftest import KEYS, rules_allowing
from tests.harness import Origin, Proxy, ProxyFactory
from tests.security.rawclient import exchange, proxy_auth, request_bytes


def _get(proxy: Proxy, origin: Origin, *headers: tuple[str | bytes, str | bytes],
         method: bytes = b"GET") -> tuple[int, str | None, bytes]:
    authority = f"api.test:{origin.port}"
    response = exchange(proxy.port, request_bytes(
        method, f"http://{authority}/clear", [("Host", authority), *headers,
                                              ("Connection", "close")],
    ))
    return response.status, response.reason, response.body


def test_non_ascii_basic_credentials_are_a_407(
    proxy: Proxy, origins: tuple[Origin, Origin]
) -> None:
    origin = origins[0]
    for value in (b"Basic \xe9\xe9\xe9", b"Basic Ym90LTE6\xff", "Basic " + base64.b64encode(
            b"bot-1:\xff\xfe").decode()):
        status, reason, body = _get(proxy, origin, ("Proxy-Authorization", value))
        assert (status, reason) == (407, "identity_invalid"), body
    assert origin.untouched()
    assert "Traceback" not in proxy.stderr()


def test_two_identities_on_one_request_are_refused(
    proxy: Proxy, origins: tuple[Origin, Origin]
) -> None:
    origin = origins[0]
    good, bad = proxy_auth("bot-1", KEYS["bot-1"]), proxy_auth("bot-1", "wrong")
    for pair in ((good, bad), (bad, good), (good, proxy_auth("rep-1", KEYS["rep-1"])),
                 (good, good)):
        status, reason, _ = _get(proxy, origin, *(("Proxy-Authorization", v) for v in pair))
        assert (status, reason) == (407, "identity_invalid"), pair
    assert _get(proxy, origin, ("Proxy-Authorization", good))[0] == 200  # the control
    assert len(origin.requests) == 1


def test_a_method_that_is_not_a_token_is_a_400(
    proxy: Proxy, origins: tuple[Origin, Origin]
) -> None:
    origin = origins[0]
    auth = ("Proxy-Authorization", proxy_auth("bot-1", KEYS["bot-1"]))
    for method in (b"G\xe9T", b"GE(T", b"GET/"):
        status, reason, body = _get(proxy, origin, auth, method=method)
        assert status == 400, (method, status, body)
        assert reason in ("bad_request", None), body
    assert origin.untouched()


def test_a_broken_rules_file_is_reported_once_per_change(
    tmp_path: Path, origin_http: Origin, proxy_with: ProxyFactory
) -> None:
    with proxy_with(rules_allowing("api.test", origin_http.port), directory=tmp_path) as p:
        p.rules.write_text("version: 1\npolicies: [oops\n")
        p.wait_audit(lambda e: e["event"] == "rules_reload_failed")
        time.sleep(3.5)  # the watcher polls every second
        failures = [e for e in p.audit() if e["event"] == "rules_reload_failed"]
        # Once, although the watcher reads it again while its timestamp is too recent to trust
        # (watch.Snapshot): not once a second.
        assert len(failures) == 1, failures
        assert p.stderr().count("rules reload failed") == len(failures)
        p.rules.write_text("version: 1\npolicies: [still, oops\n")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(
            [e for e in p.audit() if e["event"] == "rules_reload_failed"]
        ) == len(failures):
            time.sleep(0.1)
        assert len([e for e in p.audit() if e["event"] == "rules_reload_failed"]) > len(failures)
        p.rules.write_text(rules_allowing("a.svc.test", origin_http.port))
        p.wait_audit(lambda e: e["event"] == "rules_reloaded")


def test_an_unchanged_rules_file_is_not_reported_reloaded(
    tmp_path: Path, origin_http: Origin, proxy_with: ProxyFactory
) -> None:
    """A proxy started right after its rules were written reads them again while their
    timestamp is too fresh to trust; nothing changed, so nothing is reported."""
    with proxy_with(rules_allowing("api.test", origin_http.port), directory=tmp_path) as p:
        time.sleep(3.2)
        assert not [e for e in p.audit() if e["event"] == "rules_reloaded"]
        p.rules.write_text(rules_allowing("a.svc.test", origin_http.port))
        p.wait_audit(lambda e: e["event"] == "rules_reloaded")
