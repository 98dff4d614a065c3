"""deploy/k8s/agent-sandbox: the Agent Sandbox resources valid against that project's own CRDs
(tests/data/agent-sandbox-crds, strictly: a field the schema does not name fails, as the API
server would prune it silently), the template's pod valid as a Pod against Kubernetes' schemas,
and what the pods must say checked from its meaning: `sealgate env`'s variables, the identity
label the pod watcher reads, no service-account token, gVisor, and egress to the proxy alone
by its address (DNS only through the opt-in overlay overlays/sandbox-dns)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from sealgate.cli import full_parser
from sealgate.clientenv import variables
from tests.unit.test_k8s_manifests import KUBERNETES, ROOT, documents

CRDS = Path(__file__).resolve().parents[1] / "data" / "agent-sandbox-crds"
# The template names the proxy by its Service's fixed ClusterIP (no DNS); the opt-in overlay
# overlays/sandbox-dns by the Service's name, the transparent template's forwarder too.
PROXY = "http://10.96.53.128:3128"
NAMED_PROXY = "http://sealgate-proxy.sealgate.svc:3128"
BUNDLE = "/etc/sealgate-trust/bundle.pem"


def _schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the CRD's schema of that version."""
    found = {}
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            key = (f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])
            found[key] = version["schema"]["openAPIV3Schema"]
    return found


SCHEMAS = _schemas()
RESOURCES = [doc for _, doc in documents(ROOT / "agent-sandbox")]


def unknown_fields(value: Any, schema: dict[str, Any], where: str = "") -> Iterator[str]:
    """Fields the structural schema does not name: the API server drops them without a word,
    so a misspelt field would simply not apply."""
    if isinstance(value, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return
        properties, extra = schema.get("properties", {}), schema.get("additionalProperties")
        for key, item in value.items():
            if key in properties:
                yield from unknown_fields(item, properties[key], f"{where}.{key}")
            elif isinstance(extra, dict):
                yield from unknown_fields(item, extra, f"{where}.{key}")
            elif extra is not True:
                yield f"{where}.{key}"
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            yield from unknown_fields(item, schema["items"], f"{where}[{i}]")


def check(doc: dict[str, Any]) -> list[str]:
    schema = SCHEMAS[(doc["apiVersion"], doc["kind"])]
    problems = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]
    spec = {k: v for k, v in doc.items() if k != "metadata"}
    return problems + [f"unknown field {f}" for f in unknown_fields(spec, schema)]


@pytest.mark.parametrize("doc", RESOURCES, ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_valid_against_the_agent_sandbox_crds(doc: dict[str, Any]) -> None:
    assert doc["apiVersion"] == "extensions.agents.x-k8s.io/v1beta1"
    assert check(doc) == []


def test_the_strict_check_catches_a_misspelt_field() -> None:
    claim = next(d for d in RESOURCES if d["kind"] == "SandboxClaim")
    misspelt = {**claim, "spec": {**claim["spec"], "warmPoolRefs": {"name": "x"}}}
    assert "unknown field .spec.warmPoolRefs" in check(misspelt)
    wrong = {**claim, "spec": {**claim["spec"], "lifecycle": {"shutdownPolicy": "Never"}}}
    assert any("Never" in p for p in check(wrong))


def _template(name: str = "sealgate-python") -> dict[str, Any]:
    return next(d for d in RESOURCES if d["kind"] == "SandboxTemplate"
                and d["metadata"]["name"] == name)


def test_the_template_pod_is_a_valid_hardened_pod() -> None:
    pod_template = _template()["spec"]["podTemplate"]
    spec = pod_template["spec"]
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod",
                                  "metadata": {"name": "sandbox", **pod_template["metadata"]},
                                  "spec": spec}, KUBERNETES, strict=True)
    assert spec["automountServiceAccountToken"] is False and spec["runtimeClassName"] == "gvisor"
    assert spec["securityContext"]["runAsNonRoot"] is True
    for container in spec["initContainers"] + spec["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert "limits" in container["resources"]


def test_the_pods_get_sealgate_env_and_the_watcher_s_label() -> None:
    pod_template = _template()["spec"]["podTemplate"]
    (container,) = pod_template["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert {k: v for k, v in env.items() if k != "HOME"} == variables(PROXY, BUNDLE)
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert str(Path(BUNDLE).parent) in mounts
    label = full_parser().parse_args(["kube", "identity"]).label
    assert label in pod_template["metadata"]["labels"]
    assert _template()["spec"]["envVarsInjectionPolicy"] == "Disallowed"


def _egress_peers(template: dict[str, Any]) -> list[tuple[dict[str, str], list[Any]]]:
    policy = template["spec"]["networkPolicy"]
    assert policy["ingress"] == []
    peers = []
    for rule in policy["egress"]:
        for peer in rule["to"]:
            assert "ipBlock" not in peer
            peers.append((peer["podSelector"]["matchLabels"],
                          sorted((p["port"], p["protocol"]) for p in rule["ports"])))
    return peers


PROXY_PEER = ({"app.kubernetes.io/name": "sealgate-proxy"}, [(3128, "TCP")])
DNS_PEER = ({"k8s-app": "kube-dns"}, [(53, "TCP"), (53, "UDP")])


def test_the_pods_reach_the_proxy_alone_by_its_fixed_address() -> None:
    assert _egress_peers(_template()) == [PROXY_PEER]
    (service,) = [d for _, d in documents(ROOT / "base")
                  if d["kind"] == "Service" and d["metadata"]["name"] == "sealgate-proxy"]
    assert f"http://{service['spec']['clusterIP']}:3128" == PROXY


@pytest.mark.skipif(shutil.which("kubectl") is None,
                    reason="kubectl not installed (its built-in kustomize renders the overlay)")
def test_the_dns_overlay_adds_dns_and_names_the_proxy() -> None:
    rendered = subprocess.run(["kubectl", "kustomize", str(ROOT / "overlays" / "sandbox-dns")],
                              check=True, capture_output=True, text=True, timeout=60).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    assert [check(d) for d in docs] == [[] for _ in docs]  # the whole rendering, not the patch
    (template,) = [d for d in docs if d["kind"] == "SandboxTemplate" and
                   d["metadata"]["name"] == _template()["metadata"]["name"]]
    assert _egress_peers(template) == [PROXY_PEER, DNS_PEER]
    (container,) = template["spec"]["podTemplate"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert {k: v for k, v in env.items() if k != "HOME"} == variables(NAMED_PROXY, BUNDLE)


def test_the_pool_and_the_claim_point_at_each_other() -> None:
    pool = next(d for d in RESOURCES if d["kind"] == "SandboxWarmPool")
    claim = next(d for d in RESOURCES if d["kind"] == "SandboxClaim")
    assert pool["spec"]["sandboxTemplateRef"]["name"] == _template()["metadata"]["name"]
    assert claim["spec"]["warmPoolRef"]["name"] == pool["metadata"]["name"]
    # Either would force a cold start; credentials are never a pod's environment.
    assert "env" not in claim["spec"] and "volumeClaimTemplates" not in claim["spec"]
    kustomization = yaml.safe_load((ROOT / "agent-sandbox" / "kustomization.yaml").read_text())
    assert {d["metadata"]["namespace"] for d in RESOURCES} == {kustomization["namespace"]}


def test_the_transparent_template_redirects_and_forwards() -> None:
    """Transparent mode in a pod (kube/redirect.py, kube/forward.py): a valid pod whose
    redirect runs as root with NET_ADMIN alone and before the forwarder, a native sidecar as
    the uid the table exempts (no other container may have it), the port and the proxy the
    same on both sides, and the sandbox given the trust variables but no proxy ones."""
    transparent = _template("sealgate-python-transparent")
    pod_template = transparent["spec"]["podTemplate"]
    spec = pod_template["spec"]
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "Pod",
                                  "metadata": {"name": "sandbox", **pod_template["metadata"]},
                                  "spec": spec}, KUBERNETES, strict=True)
    assert spec["automountServiceAccountToken"] is False and spec["runtimeClassName"] == "gvisor"
    inits = {c["name"]: c for c in spec["initContainers"]}
    assert list(inits) == ["redirect", "trust", "forward"]
    redirect = full_parser().parse_args(inits["redirect"]["command"][1:])
    forward = full_parser().parse_args(inits["forward"]["command"][1:])
    assert redirect.port == forward.port and redirect.dns
    assert inits["redirect"]["securityContext"]["capabilities"] == {
        "drop": ["ALL"], "add": ["NET_ADMIN"]}
    assert inits["forward"]["restartPolicy"] == "Always"
    for container in spec["initContainers"] + spec["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False and "limits" in container["resources"]
        uid = context["runAsUser"]
        assert (uid == redirect.exempt_uid) == (container["name"] == "forward"), container
        if container["name"] != "redirect":
            assert context["capabilities"] == {"drop": ["ALL"]} and context["runAsNonRoot"]
    proxy = {e["name"]: e["value"] for e in inits["forward"]["env"]}["SEALGATE_PROXY_ADDR"]
    assert f"http://{proxy}" == NAMED_PROXY
    (container,) = spec["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    trust = {k: v for k, v in variables(PROXY, BUNDLE).items() if v.endswith(BUNDLE)}
    assert {k: v for k, v in env.items() if k != "HOME"} == trust
    # Transparent mode asks for DNS: its clients resolve the names they dial (`--dns` above).
    assert _egress_peers(transparent) == [PROXY_PEER, DNS_PEER]
