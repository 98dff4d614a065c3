"""docker/: the compose file valid against the Compose Specification's own JSON Schema
(tests/data/compose-spec, from compose-spec/compose-spec at 170098ba), and right by its meaning:
every command one sealgate parses, the files it mounts ones sealgate loads, the example sandbox
reaching nothing but the proxy and never the CA's key, sealgate's containers hardened as the
Dockerfile's users and privileges say. (hadolint lints the Dockerfile in `make lint`; the images
themselves are built and run in tests/integration/test_container_images.py.)"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import yaml

from sealgate.cli import full_parser
from sealgate.issuer.callers import load_callers
from sealgate.proxy.policy.rulesfile import load_rules
from tests.harness import ROOT

DOCKER = ROOT / "docker"
SCHEMA = ROOT / "tests" / "data" / "compose-spec" / "compose-spec.json"


def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def sealgate_services() -> dict[str, dict[str, Any]]:
    return {name: service for name, service in compose()["services"].items()
            if "sealgate-" in str(service.get("image", ""))}


def test_the_compose_file_is_valid_by_the_specification() -> None:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(compose()), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]


def test_the_schema_refuses_what_compose_would() -> None:
    """The check can fail: a service key the specification has not (a typo) is refused."""
    broken = compose()
    broken["services"]["proxy"]["read-only"] = True
    assert list(jsonschema.Draft7Validator(json.loads(SCHEMA.read_text())).iter_errors(broken))


def test_sealgate_s_commands_parse_and_its_files_load() -> None:
    parser = full_parser()
    services = sealgate_services()
    assert set(services) == {"proxy", "issuer"}
    for service in services.values():
        parser.parse_args(service["command"])
    assert load_rules(DOCKER / "rules.yaml").sandboxes
    assert load_callers(DOCKER / "callers.yaml")


def test_sealgate_s_containers_are_hardened() -> None:
    for name, service in sealgate_services().items():
        assert service["read_only"] is True, name
        assert service["cap_drop"] == ["ALL"] and "cap_add" not in service, name
        assert "no-new-privileges:true" in service["security_opt"], name
        assert "user" not in service, name  # the image's own, uid 10001
        assert "privileged" not in service and "network_mode" not in service, name


def test_the_sandbox_reaches_only_the_proxy_and_holds_no_key() -> None:
    spec = compose()
    sandbox = spec["services"]["sandbox"]
    (network,) = sandbox["networks"]
    assert spec["networks"][network]["internal"] is True
    members = {name for name, s in spec["services"].items() if network in s.get("networks", [])}
    assert members == {"sandbox", "proxy"}
    assert "ports" not in sandbox
    mounts = [v.split(":") for v in sandbox["volumes"]]
    assert mounts == [["./state/ca/mitmproxy-ca-cert.pem", "/etc/sealgate-ca/ca.pem", "ro"]]
    env = sandbox["environment"]
    proxy_url = env["HTTPS_PROXY"]
    assert proxy_url.endswith("@proxy:3128") and env["SSL_CERT_FILE"] == "/etc/sealgate-ca/ca.pem"
    assert "vault" not in json.dumps(sandbox).lower()


def test_the_proxy_logs_in_with_what_the_seed_job_writes() -> None:
    spec = compose()
    command = spec["services"]["proxy"]["command"]
    store = command[command.index("--secret-store") + 1]
    token_file = store.split("token_file=")[1]
    mounted = {v.split(":")[1]: v.split(":")[0]
               for v in spec["services"]["proxy"]["volumes"]}
    directory, _, name = token_file.rpartition("/")
    assert mounted[directory] == "./vault-out"
    assert f'"$out/{name}"' in (DOCKER / "vault-seed.sh").read_text()


def test_prometheus_scrapes_the_admin_listeners() -> None:
    scrape = yaml.safe_load((DOCKER / "prometheus.yml").read_text())["scrape_configs"]
    targets = {t for job in scrape for c in job["static_configs"] for t in c["targets"]}
    admins = set()
    for name, service in sealgate_services().items():
        command = service["command"]
        admins.add(f"{name}:{command[command.index('--admin') + 1].rpartition(':')[2]}")
    assert targets == admins


def test_the_dockerfile_s_services_run_without_root() -> None:
    stages: dict[str, list[str]] = {}
    current = ""
    for line in (DOCKER / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["FROM"]:
            current = words[-1]
            stages[current] = []
        elif words[:1] == ["USER"]:
            stages[current].append(words[1])
    assert stages["proxy"] == ["10001:10001"] and stages["issuer"] == ["10001:10001"]
    assert stages["sandboxd"] == ["0:0"]  # root by necessity, its privileges listed there
    assert all(not users for stage, users in stages.items()
               if stage not in ("proxy", "issuer", "sandboxd")), stages


def test_no_secret_is_written_into_an_image() -> None:
    text = (DOCKER / "Dockerfile").read_text()
    for word in ("COPY", "ADD"):
        for line in text.splitlines():
            if line.startswith(word):
                assert not any(k in line for k in ("key", "secret", "token", ".pem")), line
