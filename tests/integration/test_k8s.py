"""infra/k8s renders with kustomize (kubectl kustomize) and every object validates against the
Kubernetes API schema; secrets are referenced, never inlined; the dispatcher's RBAC is minimal."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "infra" / "k8s"
SECRETS = {"drape-s3", "drape-postgres", "drape-slack"}


def render(target: Path) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is not installed; `make services` installs it (apt-get install kubectl), as .ci/run does")
    result = subprocess.run([kubectl, "kustomize", str(target)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _walk(node, key):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from _walk(v, key)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item, key)


@pytest.mark.parametrize("target", ["base", "overlays/production"])
def test_every_rendered_object_validates_against_the_api_schema(target):
    objects = render(K8S / target)
    kinds = {obj["kind"] for obj in objects}
    assert {
        "Namespace",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Deployment",
        "StatefulSet",
        "Service",
        "ConfigMap",
        "StorageClass",
    } <= kinds
    for obj in objects:
        kubernetes_validate.validate(obj, "1.33", strict=True)
        if obj["kind"] not in ("Namespace", "StorageClass", "PersistentVolume", "ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == "drape", obj["metadata"]["name"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "drape"
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {
        ("Deployment", "drape-dispatcher"),
        ("Deployment", "prefect-worker-gpu-k8s"),
        ("Deployment", "mlflow"),
        ("Deployment", "pushgateway"),
        ("StatefulSet", "drape-postgres"),
    } <= names


def test_secrets_are_referenced_never_inlined():
    objects = render(K8S / "overlays/production")
    assert not [o for o in objects if o["kind"] == "Secret"]
    referenced = {ref["name"] for ref in _walk(objects, "secretKeyRef")} | {ref["name"] for ref in _walk(objects, "secretRef")}
    assert {"drape-s3", "drape-postgres"} <= referenced <= SECRETS
    for env in _walk(objects, "env"):
        for item in env:
            assert (
                not any(word in item["name"].upper() for word in ("SECRET", "PASSWORD", "TOKEN", "WEBHOOK"))
                or "value" not in item
            )


def test_dispatcher_rbac_is_exactly_the_calls_the_engine_makes():
    objects = render(K8S / "base")
    role = next(o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == "drape-dispatcher")
    bound = [o for o in objects if o["kind"] == "ClusterRoleBinding" and o["roleRef"]["name"] == "drape-dispatcher-nodes"]
    assert [s["name"] for b in bound for s in b["subjects"]] == ["drape-dispatcher"]
    namespace = next(o for o in objects if o["kind"] == "Namespace")["metadata"]["name"]
    assert bound[0]["subjects"][0]["namespace"] == namespace
    cluster_role = next(o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "drape-dispatcher-nodes")
    granted = {
        (group, resource, verb)
        for rule in role["rules"] + cluster_role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert not {verb for *_, verb in granted} & {"*", "update", "patch", "escalate", "bind", "impersonate"}
    assert ("", "pods", "create") not in granted
    assert granted == set().union(*ENGINE_CALLS.values())  # exactly what it calls (below)


# What each API call of scheduler/engines/kubernetes/launcher.py needs, as RBAC rules (apiGroup, resource, verb)
ENGINE_CALLS = {
    ("batch", "create_namespaced_job"): {("batch", "jobs", "create")},
    ("batch", "read_namespaced_job_status"): {("batch", "jobs/status", "get")},
    ("batch", "delete_namespaced_job"): {("batch", "jobs", "delete")},
    ("core", "create_namespaced_service"): {("", "services", "create")},
    ("core", "list_namespaced_pod"): {("", "pods", "list")},
    ("core", "read_namespaced_pod_log"): {("", "pods/log", "get")},
    ("core", "list_node"): {("", "nodes", "list")},
    ("custom", "create_namespaced_custom_object"): {
        ("kubeflow.org", "pytorchjobs", "create"),
        ("resource.k8s.io", "resourceclaims", "create"),
        ("resource.k8s.io", "resourceclaimtemplates", "create"),
    },
    ("custom", "get_namespaced_custom_object"): {
        ("kubeflow.org", "pytorchjobs", "get"),
        ("resource.k8s.io", "resourceclaims", "get"),
    },
    ("custom", "delete_namespaced_custom_object"): {("kubeflow.org", "pytorchjobs", "delete")},
}


def test_the_engine_makes_exactly_the_api_calls_the_role_is_written_for():
    """Every `self._call(<client>, <method>, ...)` in scheduler/engines/kubernetes/launcher.py is in ENGINE_CALLS (so a
    new call fails here until the Role grants it), and every entry there is still made."""
    import ast

    tree = ast.parse((REPO / "scheduler" / "engines" / "kubernetes" / "launcher.py").read_text())
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_call"
    ]
    assert calls and all(len(c.args) >= 2 and all(isinstance(a, ast.Constant) for a in c.args[:2]) for c in calls)
    assert {(c.args[0].value, c.args[1].value) for c in calls} == set(ENGINE_CALLS)


@pytest.mark.parametrize("target", ["base", "overlays/production"])
def test_workloads_run_non_root_without_privileges_behind_network_policies(target):
    objects = render(K8S / target)
    workloads = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, workload["metadata"]["name"]
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
            assert not container["image"].endswith(":latest") and ":" in container["image"]
            assert "PASSWORD}" not in " ".join(container.get("command", []) + container.get("args", []))
    namespace = next(o for o in objects if o["kind"] == "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/audit"] == "restricted"
    policies = {o["metadata"]["name"]: o for o in objects if o["kind"] == "NetworkPolicy"}
    assert policies["default-deny-ingress"]["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    postgres = policies["postgres-from-drape"]["spec"]["ingress"][0]["from"]
    assert postgres == [{"podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "drape"}}}]
    mlflow = next(o for o in workloads if o["metadata"]["name"] == "mlflow")
    assert mlflow["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/part-of"] == "drape"
    service = next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "mlflow")
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"  # cluster-internal only


def test_production_overlay_pins_the_image_and_scales_the_dispatcher():
    objects = render(K8S / "overlays/production")
    images = {c["image"] for o in objects for c in _walk(o, "containers") for c in c}
    assert "ghcr.io/drape-ai/drape:0.1.0" in images and not any(i.endswith(":latest") for i in images)
    dispatcher = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "drape-dispatcher")
    assert dispatcher["spec"]["replicas"] == 3
    pv = next(o for o in objects if o["kind"] == "PersistentVolume")
    assert pv["spec"]["local"]["path"] == "/mnt/nvme/drape-shards" and pv["spec"]["storageClassName"] == "drape-shard-cache"


def test_trainer_pods_reach_each_other_and_nothing_else_reaches_them():
    """A multi-node job's pods meet at the torchrun rendezvous and talk NCCL: under default-deny-ingress
    a policy must admit the pods the dispatcher labels (scheduler/engines/kubernetes/launcher.py), and only from them."""
    import json

    from drape.config import KubernetesLauncherConfig
    from scheduler.engines.kubernetes.objects import build_job
    from scheduler.policy import GpuState

    objects = render(K8S / "overlays/production")
    policy = next(o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "trainers-from-trainers")
    gpus = [GpuState(f"n{n}/gpu{i}", f"n{n}", "H100-80GB", 80) for n in range(2) for i in range(8)]
    job = {"id": "stage-training-x", "kind": "stage-training", "command": json.dumps(["python", "-m", "drape.train"])}
    pod_labels = build_job(job, gpus, KubernetesLauncherConfig()).spec.template.metadata.labels
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": selector}}]}]
