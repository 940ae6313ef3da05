"""drape beside Kueue (scheduler/engines/kubernetes/kueue.py): the v1beta2 objects for a fleet, validated against the
schema of the fields drape writes; the flavor a memory profile needs; jobs as suspended workloads."""

from __future__ import annotations

import copy
import json

import kubernetes_validate
import pytest
import yaml
from kubernetes import client
from typer.testing import CliRunner

from drape.config import KubernetesLauncherConfig
from scheduler.engines.kubernetes.kueue import (
    API_VERSION,
    QUEUE_NAME_LABEL,
    KueueError,
    as_workload,
    flavor_for,
    flavors_from_fleet,
    kueue_objects,
    validate,
)
from scheduler.engines.kubernetes.objects import build_job
from scheduler.policy import GpuState

SETTINGS = KubernetesLauncherConfig(node_label="kubernetes.io/hostname")
H100 = [GpuState(f"h100-{n:02d}/gpu{i}", f"h100-{n:02d}", "H100-80GB", 80) for n in range(4) for i in range(8)]
MIG = [GpuState(f"mig-00/gpu{i}", "mig-00", "H100-80GB-MIG-3g.40gb", 40) for i in range(16)]
L40S = [GpuState(f"l40s-{n:02d}/gpu{i}", f"l40s-{n:02d}", "L40S-48GB", 48) for n in range(2) for i in range(8)]
FLEET = H100 + MIG + L40S


def _flavors():
    return flavors_from_fleet(FLEET, SETTINGS.product_label, SETTINGS.products)


def _objects():
    return kueue_objects(_flavors(), namespace="drape", cpu_per_gpu=10, memory_gib_per_gpu=168)


def test_the_fleet_becomes_flavors_smallest_first_with_the_node_label_that_selects_them():
    flavors = _flavors()
    assert [(f.name, f.memory_gib, f.resource, f.gpus) for f in flavors] == [
        ("h100-80gb-mig-3g-40gb", 40, "nvidia.com/mig-3g.40gb", 16),
        ("l40s-48gb", 48, "nvidia.com/gpu", 16),
        ("h100-80gb", 80, "nvidia.com/gpu", 32),
    ]
    assert flavors[2].node_labels == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert flavors[0].node_labels == flavors[2].node_labels  # a MIG slice is told apart by its resource


def test_the_objects_are_kueues_storage_api_with_the_fleet_as_quota():
    objects = _objects()
    assert [o["kind"] for o in objects] == ["ResourceFlavor"] * 3 + ["ClusterQueue", "LocalQueue"]
    assert {o["apiVersion"] for o in objects} == {API_VERSION} == {"kueue.x-k8s.io/v1beta2"}
    queue = objects[3]["spec"]
    (group,) = queue["resourceGroups"]  # a resource in one group only: cpu and memory beside every GPU resource
    assert group["coveredResources"] == ["cpu", "memory", "nvidia.com/mig-3g.40gb", "nvidia.com/gpu"]
    quotas = {f["name"]: {r["name"]: r["nominalQuota"] for r in f["resources"]} for f in group["flavors"]}
    assert quotas["h100-80gb"] == {"cpu": "320", "memory": "5376Gi", "nvidia.com/mig-3g.40gb": "0", "nvidia.com/gpu": "32"}
    assert quotas["h100-80gb-mig-3g-40gb"]["nvidia.com/mig-3g.40gb"] == "16"
    assert sum(int(q["nvidia.com/gpu"]) + int(q["nvidia.com/mig-3g.40gb"]) for q in quotas.values()) == len(FLEET)
    assert queue["preemption"] == {"withinClusterQueue": "Never", "reclaimWithinCohort": "Never"}  # drape preempts
    assert objects[4] == {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": "drape", "namespace": "drape"},
        "spec": {"clusterQueue": "drape"},
    }


def _broken(kind: str, change) -> dict:
    item = copy.deepcopy(next(o for o in _objects() if o["kind"] == kind))
    change(item)
    return item


@pytest.mark.parametrize(
    ("kind", "change", "message"),
    [
        ("ResourceFlavor", lambda o: o.update(apiVersion="kueue.x-k8s.io/v1beta1"), "apiVersion"),
        ("ResourceFlavor", lambda o: o["metadata"].update(name="H100_80GB"), "metadata.name"),
        ("ResourceFlavor", lambda o: o["spec"]["nodeLabels"].update({f"l{i}": "v" for i in range(8)}), "spec.nodeLabels"),
        ("ResourceFlavor", lambda o: o["spec"].update(nodeSelector={}), "spec"),
        ("ClusterQueue", lambda o: o["spec"].update(queueingStrategy="Fifo"), "spec.queueingStrategy"),
        ("ClusterQueue", lambda o: o["spec"]["preemption"].update(withinClusterQueue="Sometimes"), "withinClusterQueue"),
        (
            "ClusterQueue",
            lambda o: o["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0].update(nominalQuota="ten"),
            "nominalQuota",
        ),
        ("ClusterQueue", lambda o: o["spec"]["resourceGroups"][0]["flavors"][0]["resources"].reverse(), "in that order"),
        (
            "ClusterQueue",
            lambda o: o["spec"]["resourceGroups"].append(copy.deepcopy(o["spec"]["resourceGroups"][0])),
            "in two groups",
        ),
        ("ClusterQueue", lambda o: o["spec"]["resourceGroups"][0].update(flavors=[]), "flavors"),
        ("LocalQueue", lambda o: o["metadata"].pop("namespace"), "namespace"),
        ("LocalQueue", lambda o: o["spec"].update(clusterQueue="Drape"), "spec.clusterQueue"),
    ],
)
def test_the_schema_refuses_what_kueues_api_would(kind, change, message):
    with pytest.raises(KueueError, match=message):
        validate(_broken(kind, change))


def test_a_memory_profile_gets_the_smallest_flavor_that_holds_it():
    flavors = _flavors()
    assert flavor_for(30, flavors).name == "h100-80gb-mig-3g-40gb"
    assert flavor_for(44, flavors).name == "l40s-48gb"
    assert flavor_for(44, flavors, models=("H100",)).name == "h100-80gb"  # the job names the models it may run on
    assert flavor_for(44, flavors, models=("h100",)).name == "h100-80gb"  # in any case, as the policy reads it
    with pytest.raises(KueueError, match="none of the models it names"):
        flavor_for(10, flavors, models=("L4",))  # an L40S is not an L4
    with pytest.raises(KueueError, match=r"a job of 96 GiB per GPU fits no flavor of the fleet: .*H100-80GB \(80 GiB\)"):
        flavor_for(96, flavors)


def _job(gpus: int, mem_gib: float) -> dict:
    return {
        "id": "stage-training-abc123",
        "kind": "stage-training",
        "stage": "geometry",
        "command": json.dumps(["python", "-m", "drape.train", "--job", "s3://drape-artifacts/runs/r1/geometry/job.json"]),
        "labels": json.dumps({"launch": "torchrun"}),
        "attempts": 1,
        "gpus": gpus,
        "mem_gib": mem_gib,
    }


def _plain(obj) -> dict:
    return obj if isinstance(obj, dict) else client.ApiClient().sanitize_for_serialization(obj)


def test_a_job_becomes_a_suspended_workload_on_its_flavor_with_no_node_pinned():
    flavors = _flavors()
    job = _plain(build_job(_job(1, 30), MIG[:1], SETTINGS))
    before = copy.deepcopy(job)
    workload = as_workload(job, local_queue="drape", flavor=flavor_for(30, flavors), product_label=SETTINGS.product_label)
    assert job == before  # the rendered manifest is left as it was
    assert workload["spec"]["suspend"] is True and workload["metadata"]["labels"][QUEUE_NAME_LABEL] == "drape"
    pod = workload["spec"]["template"]["spec"]
    assert "affinity" not in pod and pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    resources = pod["containers"][0]["resources"]
    assert resources["requests"]["nvidia.com/mig-3g.40gb"] == resources["limits"]["nvidia.com/mig-3g.40gb"] == "1"
    assert "nvidia.com/gpu" not in resources["requests"]
    kubernetes_validate.validate(workload, "1.33", strict=True)  # still a valid batch/v1 Job


def test_a_multi_node_pytorchjob_is_suspended_through_its_run_policy():
    settings = KubernetesLauncherConfig(node_label="kubernetes.io/hostname", training_operator=True)
    job = build_job(_job(16, 70), H100[:16], settings)
    workload = as_workload(job, local_queue="drape", flavor=flavor_for(70, _flavors()), product_label=settings.product_label)
    assert workload["spec"]["runPolicy"]["suspend"] is True and workload["metadata"]["labels"][QUEUE_NAME_LABEL] == "drape"
    for replica in workload["spec"]["pytorchReplicaSpecs"].values():
        pod = replica["template"]["spec"]
        assert "affinity" not in pod and pod["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    with pytest.raises(KueueError, match="a 'Deployment' cannot be queued in Kueue by drape"):
        as_workload({"kind": "Deployment", "spec": {}}, local_queue="drape", flavor=_flavors()[0], product_label="x")


def test_drape_queue_kueue_prints_the_objects_for_a_fleet_file(tmp_path):
    from drape.cli import app

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump({"groups": [{"model": "H100-80GB", "memory_gib": 80, "nodes": 2, "gpus_per_node": 8}]}))
    result = CliRunner().invoke(app, ["queue", "kueue", "--fleet", str(fleet)])
    assert result.exit_code == 0, result.output
    objects = list(yaml.safe_load_all(result.output))
    assert [o["kind"] for o in objects] == ["ResourceFlavor", "ClusterQueue", "LocalQueue"]
    for item in objects:
        validate(item)
    fleet.write_text("groups: [{model: H100}]\n")
    result = CliRunner().invoke(app, ["queue", "kueue", "--fleet", str(fleet)])
    assert result.exit_code == 2 and "expected model, memory_gib, nodes, gpus_per_node" in result.output


@pytest.mark.parametrize(
    "declared", [{"sharing": "time-slicing"}, {"node_sharing": {"h100-00": "mps"}}, {"dra_device_class": "gpu.nvidia.com"}]
)
def test_kueue_mode_refuses_gpu_sharing_and_dra_it_would_ignore(declared):
    from pydantic import ValidationError

    from drape.config import KubernetesLauncherConfig

    with pytest.raises(ValidationError, match="in Kueue mode each job gets whole GPUs .* would be ignored"):
        KubernetesLauncherConfig(kueue_queue="drape", **declared)
    KubernetesLauncherConfig(**declared)  # drape placing: fine
    KubernetesLauncherConfig(kueue_queue="drape", node_sharing={"h100-00": "none"})  # says nothing is shared: fine
