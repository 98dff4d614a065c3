"""The proxy end to end: identity, policy, interception, tunnelling, audit, header hygiene."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import KEYS, client
from tests.harness import Origin, Proxy


def test_plain_http_allowed_reaches_origin(proxy: Proxy, origins: tuple[Origin, Origin]) -> None:
    http_origin, _ = origins
    r = client(proxy).get(f"http://api.test:{http_origin.port}/hello?x=1", timeout=10)
    assert r.status_code == 200
    assert r.text == "hello from origin\n"
    seen = http_origin.requests[-1]
    assert seen.path == "/hello?x=1"
    assert "proxy-authorization" not in seen.headers
    line = proxy.wait_audit(lambda e: e.get("path") == "/hello" and e["event"] == "request")
    assert line["decision"] == "allow"
    assert line["sandbox"] == "bot-1"
    assert line["address"] == "127.0.0.1"
    assert "x=1" not in json.dumps(line)


def test_https_intercepted_reaches_origin(proxy: Proxy, origins: tuple[Origin, Origin]) -> None:
    _, https_origin = origins
    r = client(proxy).get(f"https://api.test:{https_origin.port}/secure", timeout=10)
    assert r.status_code == 200
    assert https_origin.requests[-1].path == "/secure"


def test_missing_identity_is_407(proxy: Proxy, origins: tuple[Origin, Origin]) -> None:
    http_origin, _ = origins
    r = client(proxy, sandbox=None).get(f"http://api.test:{http_origin.port}/", timeout=10)
    assert r.status_code == 407
    assert r.headers["Proxy-Authenticate"].startswith("Basic")
    assert r.json()["reason"] == "identity_required"
    assert http_origin.untouched()


def test_wrong_key_is_407(proxy: Proxy, origins: tuple[Origin, Origin]) -> None:
    http_origin, _ = origins
    session = client(proxy)
    bad = proxy.url("bot-1", "not-the-key")
    session.proxies = {"http": bad, "https": bad}
    r = session.get(f"http://api.test:{http_origin.port}/", timeout=10)
    assert r.status_code == 407
    assert r.json()["reason"] == "identity_invalid"
    assert http_origin.untouched()
    assert KEYS["bot-1"] not in proxy.audit_text()


def test_host_outside_policy_is_403_json(proxy: Proxy, origins: tuple[Origin, Origin]) -> None:
    http_origin, _ = origins
    r = client(proxy).get(f"http://other.test:{http_origin.port}/", timeout=10)
    assert r.status_code == 403
    body = r.json()
    assert body["error"]["type"] == "egress_denied"
    assert body["error"]["code"] == body["reason"] == "not_allowed"
    assert body["error"]["request_id"] == body["request_id"]
    assert "not_allowed" in body["error"]["message"]
    assert body["policy"] == "ci"
    assert body["host"] == "other.test"
    assert body["request_id"]
    assert r.headers["X-Sealgate-Error"] == "not_allowed"
    assert http_origin.untouched()


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/ok/deep/er", 200), ("POST", "/ok/x", 403), ("GET", "/nope", 403),
     ("GET", "/ok/%2e%2e/admin", 400)],
)
def test_method_and_path_rules(
    proxy: Proxy, origins: tuple[Origin, Origin], method: str, path: str, status: int
) -> None:
    _, https_origin = origins
    r = client(proxy).request(method, f"https://limited.test:{https_origin.port}{path}", timeout=10)
    assert r.status_code == status
    assert len(https_origin.requests) == (1 if status == 200 else 0)


@pytest.mark.parametrize(("headers", "status"), [
    ({"X-HTTP-Method-Override": "DELETE"}, 403), ({"X-HTTP-Method": "PUT"}, 403),
    ({"X-Method-Override": "post"}, 403), ({"X-HTTP-Method-Override": "get"}, 200),
    ({"X-HTTP-Method-Override": "DE LETE"}, 400), ({"X-Original-URL": "/admin"}, 400),
    ({"X-Rewrite-URL": "/admin"}, 400),
    # As a CGI-style server reads them: X_HTTP_Method_Override is HTTP_X_HTTP_METHOD_OVERRIDE.
    ({"X_HTTP_Method_Override": "DELETE"}, 403), ({"x-http_method-OVERRIDE": "PUT"}, 403),
    ({"X_Original_URL": "/admin"}, 400)],
    ids=["override-delete", "x-http-method-put", "method-override-post", "override-get",
         "override-not-a-method", "original-url", "rewrite-url", "underscored-override",
         "mixed-override", "underscored-original-url"])
def test_method_and_target_overrides_are_decided_too(
    proxy: Proxy, origins: tuple[Origin, Origin], headers: dict[str, str], status: int
) -> None:
    """An API that honours an override header takes a GET the rule allows for the method it
    names, or for another path: the rule must allow the named method too, and the target
    overrides are refused outright (found by review). Counted at the origin."""
    _, https_origin = origins
    r = client(proxy).get(f"https://limited.test:{https_origin.port}/ok/x", headers=headers,
                          timeout=10)
    assert r.status_code == status, r.text
    assert len(https_origin.requests) == (1 if status == 200 else 0)
    if status == 403:
        assert r.json()["reason"] == "not_allowed" and "method override" in r.text


def test_report_mode_allows_and_logs(proxy: Proxy, origins: tuple[Origin, Origin]) -> None:
    http_origin, _ = origins
    r = client(proxy, "rep-1").get(f"http://api.test:{http_origin.port}/reported", timeout=10)
    assert r.status_code == 200
    line = proxy.wait_audit(lambda e: e.get("path") == "/reported")
    assert line["decision"] == "report"
    assert line["reason"] == "not_allowed"


def test_loopback_denied_without_allow_networks(
    proxy: Proxy, origins: tuple[Origin, Origin]
) -> None:
    http_origin, _ = origins
    r = client(proxy, "closed-1").get(f"http://api.test:{http_origin.port}/", timeout=10)
    assert r.status_code == 403
    assert r.json()["reason"] == "loopback"
    assert "127.0.0.1" not in r.text
    assert http_origin.untouched()


def test_forwarding_headers_stripped_both_ways(
    proxy: Proxy, origins: tuple[Origin, Origin]
) -> None:
    http_origin, _ = origins
    http_origin.response_headers = {"X-Sealgate-Error": "forged", "X-Other": "kept"}
    try:
        r = client(proxy).get(
            f"http://api.test:{http_origin.port}/h",
            headers={"Forwarded": "for=1.2.3.4", "X-Forwarded-For": "1.2.3.4",
                     "X-Sealgate-Policy": "admin"},
            timeout=10,
        )
    finally:
        http_origin.response_headers = {}
    assert r.status_code == 200
    assert "X-Sealgate-Error" not in r.headers
    assert r.headers["X-Other"] == "kept"
    seen = http_origin.requests[-1].headers
    for name in ("forwarded", "x-forwarded-for", "x-sealgate-policy", "proxy-authorization"):
        assert name not in seen


def test_ca_print(proxy: Proxy) -> None:
    import subprocess

    from tests.harness import ROOT, SEALGATE

    out = subprocess.run(
        [*SEALGATE, "ca", "--print", "--state", str(proxy.state)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=30,
    ).stdout
    assert out.startswith("-----BEGIN CERTIFICATE-----")
    key_file = proxy.state / "ca" / "mitmproxy-ca.pem"
    assert key_file.stat().st_mode & 0o777 == 0o600


def test_large_and_chunked_bodies_stream_intact(
    proxy: Proxy, origins: tuple[Origin, Origin]
) -> None:
    http_origin, _ = origins
    big = bytes(range(256)) * (3 * 4096)  # 3 MiB: over the streaming threshold
    http_origin.response_body = big
    try:
        session = client(proxy)
        r = session.get(f"http://api.test:{http_origin.port}/big", timeout=20)
        assert r.status_code == 200
        assert r.content == big
        upload = b"u" * (2 * 1024 * 1024)
        assert session.post(f"http://api.test:{http_origin.port}/up", data=upload,
                            timeout=20).status_code == 200
        assert http_origin.requests[-1].body == upload
        chunks = (b"c" * 65536 for _ in range(8))  # a generator: sent chunked
        assert session.post(f"http://api.test:{http_origin.port}/chunked", data=chunks,
                            timeout=20).status_code == 200
        assert http_origin.requests[-1].body == b"c" * 65536 * 8
    finally:
        http_origin.response_body = b"hello from origin\n"
    line = proxy.wait_audit(lambda e: e.get("path") == "/big")
    assert line["bytes_in"] == len(big)


def test_curl_through_env_proxy_variables(proxy: Proxy, origins: tuple[Origin, Origin]) -> None:
    """What a sandbox does: HTTPS_PROXY in the environment, CONNECT, the proxy's CA trusted."""
    import os
    import subprocess

    _, https_origin = origins
    url = proxy.url("bot-1", KEYS["bot-1"])
    env = {**os.environ, "HTTPS_PROXY": url, "HTTP_PROXY": url, "NO_PROXY": ""}
    out = subprocess.run(
        ["curl", "-sS", "--max-time", "10", "--cacert", str(proxy.ca), "-o", "/dev/stdout",
         "-w", "\n%{http_code}", f"https://limited.test:{https_origin.port}/ok/env"],
        env=env, capture_output=True, text=True, timeout=30,
    )
    assert out.stdout.endswith("200"), out
    assert https_origin.requests[-1].path == "/ok/env"
    assert "proxy-authorization" not in https_origin.requests[-1].headers


def test_ca_never_makes_one_by_accident(proxy: Proxy, tmp_path: Path) -> None:
    """Without the proxy's state directory `sealgate ca` refuses, naming where it looked,
    rather than make a CA the proxy does not use; `--create` makes one deliberately."""
    import subprocess

    from tests.harness import ROOT, SEALGATE

    elsewhere = tmp_path / "not-the-proxy"
    refused = subprocess.run([*SEALGATE, "ca", "--state", str(elsewhere)], cwd=ROOT,
                             capture_output=True, text=True, timeout=30, check=False)
    assert refused.returncode == 1
    assert f"no proxy CA in {elsewhere.resolve() / 'ca'}" in refused.stderr
    assert not elsewhere.exists()
    shown = subprocess.run([*SEALGATE, "ca", "--state", str(proxy.state)], cwd=ROOT,
                           capture_output=True, text=True, timeout=30, check=True)
    assert Path(shown.stdout.strip()).is_absolute()
    assert Path(shown.stdout.strip()) == (proxy.state / "ca" / "mitmproxy-ca-cert.pem").resolve()
    made = subprocess.run([*SEALGATE, "ca", "--create", "--state", str(elsewhere)], cwd=ROOT,
                          capture_output=True, text=True, timeout=30, check=True)
    assert Path(made.stdout.strip()).read_text().startswith("-----BEGIN CERTIFICATE-----")


def test_env_is_all_a_client_needs(
    proxy: Proxy, origins: tuple[Origin, Origin], tmp_path: Path
) -> None:
    """`sealgate env` output, sourced into an empty environment, takes curl through the proxy
    (intercepted, so trusting the proxy's CA from the bundle it wrote) as the sandbox named."""
    import subprocess

    from sealgate import clientenv
    from tests.harness import ROOT, SEALGATE

    _, https_origin = origins
    key_file = tmp_path / "key"
    key_file.write_text(KEYS["bot-1"] + "\n")
    base = [*SEALGATE, "env", "--state", str(proxy.state), "--proxy", f"127.0.0.1:{proxy.port}",
            "--sandbox", "bot-1", "--key-file", str(key_file), "--bundle",
            str(tmp_path / "bundle.pem")]
    as_json = json.loads(subprocess.run([*base, "--format", "json"], cwd=ROOT, check=True,
                                        capture_output=True, text=True, timeout=30).stdout)
    assert set(clientenv.TRUST_VARIABLES) <= set(as_json)
    assert {as_json[v] for v in clientenv.TRUST_VARIABLES} == {str(tmp_path / "bundle.pem")}
    assert (tmp_path / "bundle.pem").read_text().endswith(proxy.ca.read_text())
    assert "SEALGATE_MCP_URL" not in as_json
    # The MCP endpoint, when named: its URL, and reached directly.
    with_mcp = json.loads(subprocess.run([*base, "--format", "json", "--mcp", "10.9.8.7:9000"],
                                         cwd=ROOT, check=True, capture_output=True, text=True,
                                         timeout=30).stdout)
    assert with_mcp["SEALGATE_MCP_URL"] == "http://10.9.8.7:9000/mcp"
    assert with_mcp["NO_PROXY"].split(",") == ["localhost", "127.0.0.1", "10.9.8.7"]
    bad = subprocess.run([*base, "--mcp", "no-port"], cwd=ROOT, capture_output=True, text=True,
                         timeout=30, check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("sealgate: --mcp:"), bad.stderr
    script = tmp_path / "env.sh"
    script.write_text(subprocess.run(base, cwd=ROOT, check=True, capture_output=True,
                                     text=True, timeout=30).stdout)
    https_origin.reset()
    done = subprocess.run(
        ["env", "-i", "PATH=/usr/bin:/bin", "sh", "-c",
         f". {script} && curl -sS -m 10 https://limited.test:{https_origin.port}/ok/env"],
        capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    assert [r.path for r in https_origin.requests] == ["/ok/env"]
    line = proxy.wait_audit(lambda e: e.get("event") == "request" and e.get("path") == "/ok/env")
    assert line["sandbox"] == "bot-1"
