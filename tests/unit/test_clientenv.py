"""The client environment `sealgate env` prints and the sandbox runtime sets (one list)."""

from __future__ import annotations

from sealgate.clientenv import TRUST_VARIABLES, variables


def test_every_trust_variable_names_the_one_bundle() -> None:
    env = variables("http://bot-1:key@10.0.0.5:8080", "/b/bundle.pem")
    assert {name: env[name] for name in TRUST_VARIABLES} == dict.fromkeys(TRUST_VARIABLES,
                                                                          "/b/bundle.pem")
    # npm's own cafile (from an npmrc) would replace Node's roots, NODE_EXTRA_CA_CERTS with
    # them: npm's config from the environment overrides it, in the case npm exports itself.
    assert env["npm_config_cafile"] == env["NODE_EXTRA_CA_CERTS"] == "/b/bundle.pem"
    assert "NPM_CONFIG_CAFILE" not in env  # one spelling: npm would take either, in any order


def test_the_proxy_in_both_cases_and_itself_not_proxied() -> None:
    env = variables("http://bot-1:key@10.0.0.5:8080", "/b/bundle.pem")
    assert {env[n] for n in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")} == {
        "http://bot-1:key@10.0.0.5:8080"}
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,10.0.0.5"
    assert env["SEALGATE_BASE_URL"] == "http://10.0.0.5:8080/_/"
