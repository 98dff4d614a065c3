"""deploy/k8s: every manifest valid against Kubernetes' own schemas (kubernetes-validate, its
OpenAPI schemas for the version below, strict: an unknown field fails), and what they must say
checked from their meaning: each container's command line parsed by sealgate's own CLI (a flag
renamed fails here), hardened containers, probes on the admin listener, the rules loadable, RBAC
read-only on pods, the proxy's egress policy reaching no private, link-local or metadata
address, sandboxes reaching the proxy alone."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from sealgate.cli import full_parser
from sealgate.proxy.credentials.secrets.vault import K8S_JWT_FILE, VaultConfig
from sealgate.proxy.policy.rulesfile import load_rules
from sealgate.proxy.process import exposition

ROOT = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KUBERNETES = "1.33.0"
OPTIONAL = {"dns.yaml"}  # kept beside a kustomization, not in it (its comment says why)
CUSTOM = {"monitoring.coreos.com/v1"}  # CRDs kubernetes-validate has no schema for
# The Agent Sandbox's, validated against its CRDs by tests/unit/test_agent_sandbox.py.
AGENT_GROUPS = {"agents.x-k8s.io", "extensions.agents.x-k8s.io"}


def documents(directory: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    listed = yaml.safe_load((directory / "kustomization.yaml").read_text())["resources"]
    for name in listed:
        for doc in yaml.safe_load_all((directory / name).read_text()):
            if doc:
                yield directory / name, doc


def every() -> list[tuple[Path, dict[str, Any]]]:
    return [d for k in sorted(ROOT.glob("*/kustomization.yaml")) for d in documents(k.parent)]


def pods() -> Iterator[tuple[str, dict[str, Any]]]:
    for _, doc in every():
        if doc["kind"] == "Deployment":
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def test_every_file_is_in_its_kustomization() -> None:
    for kustomization in ROOT.glob("*/kustomization.yaml"):
        listed = set(yaml.safe_load(kustomization.read_text())["resources"])
        present = {p.name for p in kustomization.parent.glob("*.yaml")} - {"kustomization.yaml"}
        assert present - OPTIONAL == listed, kustomization


@pytest.mark.parametrize("path,doc", [
    (path, doc) for path, doc in every() if doc["apiVersion"].split("/")[0] not in AGENT_GROUPS
], ids=lambda v: v.name if isinstance(v, Path)
                         else f"{v['kind']}/{v['metadata']['name']}")
def test_valid_against_kubernetes_schemas(path: Path, doc: dict[str, Any]) -> None:
    if doc["apiVersion"] in CUSTOM:
        assert doc["spec"]["endpoints"] and doc["spec"]["selector"]
        return
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_containers_run_sealgate_commands_that_exist_hardened() -> None:
    parser = full_parser()
    for name, spec in pods():
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        for container in spec.get("initContainers", []) + spec["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["readOnlyRootFilesystem"] is True
            assert context["capabilities"]["drop"] == ["ALL"]
            assert container["resources"]["limits"]["memory"]
            if "command" not in container:  # the image's entry point: sealgate
                args = parser.parse_args(container["args"])
                assert callable(args.func), container["name"]


def test_probes_ask_the_admin_listener_the_command_opens() -> None:
    parser = full_parser()
    for name, spec in pods():
        for container in spec["containers"]:
            args = parser.parse_args(container["args"])
            if getattr(args, "admin", None) is None:
                continue
            port = int(args.admin.rpartition(":")[2])
            # Port names are the pod's, unique in it: the proxy's is `admin`, its watcher's
            # `identity-admin`.
            (named,) = [p["name"] for p in container["ports"] if p["containerPort"] == port]
            assert named.endswith("admin"), name
            assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": named}
            assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": named}


def test_the_rules_load(tmp_path: Path) -> None:
    (found,) = [d for _, d in every() if d["kind"] == "ConfigMap"
                and d["metadata"]["name"] == "sealgate-rules"]
    for key, text in found["data"].items():
        (tmp_path / key).write_text(text)
    assert load_rules(tmp_path).sandboxes


def test_the_pod_watcher_may_only_read_pods() -> None:
    roles = {d["metadata"]["name"]: d for _, d in every() if d["kind"] in ("ClusterRole", "Role")}
    assert set(roles) == {"sealgate-pod-watcher", "sealgate-sandboxd"}
    assert roles["sealgate-pod-watcher"]["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]


def test_sandboxd_may_only_claim_and_exec_in_the_sandboxes_namespace() -> None:
    """The Kubernetes backend's Role: its claims, the Sandbox a claim names, the pods' list and
    exec, in one namespace; nothing cluster-wide, no Secrets, no pods made or deleted."""
    docs = [d for _, d in every() if d["metadata"]["name"] == "sealgate-sandboxd"]
    (role,) = [d for d in docs if d["kind"] == "Role"]
    assert role["metadata"]["namespace"] == "sandboxes"
    assert {(r["apiGroups"][0], r["resources"][0]): r["verbs"] for r in role["rules"]} == {
        ("extensions.agents.x-k8s.io", "sandboxclaims"): ["create", "get", "list", "watch",
                                                        "patch", "delete"],
        ("agents.x-k8s.io", "sandboxes"): ["get"], ("", "pods"): ["list"],
        ("", "pods/exec"): ["create"]}
    assert all(len(r["apiGroups"]) == len(r["resources"]) == 1 for r in role["rules"])
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "sealgate-sandboxd",
                                    "namespace": "sealgate"}]
    assert not [d for _, d in every() if d["kind"] == "ClusterRoleBinding"
                and d["roleRef"]["name"] == "sealgate-sandboxd"]


def _allowed(policy: dict[str, Any], address: str, port: int) -> bool:
    """Whether an egress rule's ipBlock lets `address`:`port` out."""
    ip = ipaddress.ip_address(address)
    for rule in policy["spec"].get("egress", []):
        if rule.get("ports") and port not in [p["port"] for p in rule["ports"]]:
            continue
        for peer in rule.get("to", []):
            block = peer.get("ipBlock")
            if block is None or ip.version != ipaddress.ip_network(block["cidr"]).version:
                continue
            if ip in ipaddress.ip_network(block["cidr"]) and not any(
                    ip in ipaddress.ip_network(e) for e in block.get("except", [])):
                return True
    return False


@pytest.mark.parametrize("address", [
    "169.254.169.254", "10.0.0.1", "172.16.0.1", "192.168.1.1", "100.64.0.1", "127.0.0.1",
    "0.0.0.0", "fd00:ec2::254", "fe80::1", "::1", "::ffff:10.0.0.1", "64:ff9b::a00:1"])
def test_the_proxy_reaches_nothing_internal(address: str) -> None:
    (policy,) = [d for _, d in every() if d["kind"] == "NetworkPolicy"
                 and d["metadata"]["name"] == "sealgate-proxy"]
    assert not _allowed(policy, address, 443) and not _allowed(policy, address, 80)
    assert _allowed(policy, "93.184.215.14", 443)  # the policy is not simply closed


def test_sandboxes_reach_the_proxy_alone() -> None:
    (policy,) = [d for _, d in every() if d["kind"] == "NetworkPolicy"
                 and d["metadata"]["name"] == "sealgate-sandboxes"]
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"] and spec["ingress"] == []
    (rule,) = spec["egress"]
    assert rule["ports"] == [{"port": 3128, "protocol": "TCP"}]
    (peer,) = rule["to"]
    assert peer["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "sealgate-proxy"}}
    assert "ipBlock" not in peer


# Keys under which kustomize's rendering is the listed files with the namespace set, so the
# file-based checks above are checks of what `kubectl apply -k` sends: any other key (patches,
# generators, images, labels...) would change the rendering behind those checks' back.
PLAIN_KEYS = {"apiVersion", "kind", "namespace", "resources"}
BASES = sorted(k.parent for k in ROOT.glob("*/kustomization.yaml"))


@pytest.mark.parametrize("base", BASES, ids=lambda p: p.name)
def test_kustomizations_render_their_files_alone(base: Path) -> None:
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    assert set(kustomization) <= PLAIN_KEYS, base
    for name in kustomization["resources"]:
        assert (base / name).is_file(), (base, name)


@pytest.mark.skipif(shutil.which("kubectl") is None,
                    reason="kubectl not installed (its built-in kustomize renders the bases)")
@pytest.mark.parametrize("base", BASES, ids=lambda p: p.name)
def test_the_rendering_validates_and_is_the_files(base: Path) -> None:
    rendered = subprocess.run(["kubectl", "kustomize", str(base)], check=True,
                              capture_output=True, text=True, timeout=60).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    for doc in docs:
        if doc["apiVersion"] in CUSTOM or doc["apiVersion"].split("/")[0] in AGENT_GROUPS:
            continue  # no schema here; test_agent_sandbox.py validates these against the CRDs
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)
    namespace = yaml.safe_load((base / "kustomization.yaml").read_text()).get("namespace")

    # Cluster-scoped kinds get no namespace from kustomize: compared without one.
    def key(doc: dict[str, Any], default: str | None) -> tuple[str, str, str | None]:
        kind, meta = doc["kind"], doc["metadata"]
        scoped = kind not in {"Namespace", "ClusterRole", "ClusterRoleBinding"}
        return kind, meta["name"], meta.get("namespace", default) if scoped else None

    files = sorted(key(d, namespace) for _, d in documents(base))
    assert sorted(key(d, None) for d in docs) == files


def test_the_autoscaler_s_pods_metric_is_one_the_proxy_exports() -> None:
    # A gauge: an average per pod of in-flight requests is what scaling on load means.
    (hpa,) = [d for _, d in every() if d["kind"] == "HorizontalPodAutoscaler"]
    names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert names and all(n.removeprefix(exposition.PREFIX) in exposition.GAUGES for n in names)
    assert all(n.startswith(exposition.PREFIX) for n in names)


def test_the_secret_store_is_vault_by_the_pod_s_identity_with_a_mounted_ca() -> None:
    """The proxy's `--secret-store` as the broker reads it (parsed, never dialed): Vault's
    Kubernetes auth under a role, and its CA a file a volume of the same container mounts."""
    parser = full_parser()
    stores = []
    for _, spec in pods():
        for container in spec["containers"]:
            args = parser.parse_args(container["args"])
            for url in getattr(args, "secret_store", None) or []:
                config = VaultConfig.from_url(url)
                mounts = [m["mountPath"] for m in container["volumeMounts"]]
                assert config.ca_file is not None
                assert any(config.ca_file.is_relative_to(m) for m in mounts), url
                stores.append((config.auth, config.role, config.jwt_file))
    assert stores == [("kubernetes", "sealgate-proxy", K8S_JWT_FILE)]
