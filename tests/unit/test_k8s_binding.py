"""The binding rule on Kubernetes (scheduler/engines/kubernetes/devices.py): the node pinned by default, whole
GPUs or the declared shared resource, refusals where the cluster cannot be told the queue's plan, DRA
claims that name the devices the queue chose (validated against Kubernetes 1.34's own schema and
drape's schema of the fields it writes); the drift arithmetic (scheduler/dispatch/drift.py); and the GPU
indices reaching a local process."""

from __future__ import annotations

import json
import sys
import time

import kubernetes_validate
import pytest
from kubernetes import client

from drape.config import KubernetesLauncherConfig
from scheduler.dispatch.drift import placement_drift
from scheduler.engines import Landing, claimed_view, device_indices
from scheduler.engines.kubernetes.devices import BindingError, validate_claim
from scheduler.engines.kubernetes.objects import build_job, build_objects
from scheduler.policy import GpuState, Placement

NODE_A = [GpuState(f"h100-00/gpu{i}", "h100-00", "H100-80GB", 80) for i in range(8)]
NODE_B = [GpuState(f"h100-01/gpu{i}", "h100-01", "H100-80GB", 80) for i in range(8)]
DRA = KubernetesLauncherConfig(dra_device_class="gpu.nvidia.com")


def _job(job_id: str = "finetune-1", **labels) -> dict:
    return {
        "id": job_id,
        "kind": "finetune",
        "stage": None,
        "env": "{}",
        "command": json.dumps(["python", "-m", "drape.train"]),
        "labels": json.dumps(labels),
        "attempts": 1,
        "mem_gib": 20.0,
    }


def _pod(obj) -> dict:
    plain = obj if isinstance(obj, dict) else client.ApiClient().sanitize_for_serialization(obj)
    return plain["spec"]["template"]["spec"]


def _valid(obj) -> None:
    plain = obj if isinstance(obj, dict) else client.ApiClient().sanitize_for_serialization(obj)
    kubernetes_validate.validate(plain, "1.34", strict=True)


def _gpus_asked(pod: dict) -> dict:
    return {k: v for k, v in pod["containers"][0]["resources"]["limits"].items() if k != "memory"}


def test_by_default_the_node_is_pinned_by_hostname_and_whole_gpus_are_counted():
    """0.5 s. configs/h100.yaml no longer leaves the node to kube-scheduler."""
    settings = KubernetesLauncherConfig()
    assert settings.node_label == "kubernetes.io/hostname" and settings.sharing == "none"
    job = build_job(_job(), NODE_A[2:4], settings)
    _valid(job)
    pod = _pod(job)
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["h100-00"]}]
    assert _gpus_asked(pod) == {"nvidia.com/gpu": "2"} and "resourceClaims" not in pod


def test_a_shared_gpu_takes_the_declared_shared_resource_and_a_mismatch_is_refused():
    """0.3 s. Planned to share → the node's shared resource, only where the node declares sharing;
    planned alone on a node that only offers shares → refused; beside another job on a node that
    does not share → refused (never a silent GPU of its own)."""
    sliced = KubernetesLauncherConfig(sharing="time-slicing")
    pod = _pod(build_job(_job(share="0.5"), NODE_A[:1], sliced))
    assert _gpus_asked(pod) == {"nvidia.com/gpu.shared": "1"}
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in {e["name"] for e in pod["containers"][0]["env"]}  # MPS only
    mps = _pod(build_job(_job(share="0.25"), NODE_A[:1], KubernetesLauncherConfig(sharing="mps")))
    assert {e["name"]: e.get("value") for e in mps["containers"][0]["env"]}["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    with pytest.raises(BindingError, match="planned to run alone on 2 GPU.*h100-00's GPUs are offered only as shares"):
        build_job(_job(), NODE_A[:2], sliced)
    with pytest.raises(BindingError, match="planned to run alone on 1 GPU"):
        build_job(_job(exclusive="true"), NODE_A[:1], sliced)
    crowded = [GpuState("h100-00/gpu0", "h100-00", "H100-80GB", 80, allocated_gib=20.0, jobs=1)]
    with pytest.raises(BindingError, match="beside another job on GPU h100-00/gpu0, but node h100-00 declares no GPU sharing"):
        build_job(_job(), crowded, KubernetesLauncherConfig())
    # per node: whole-GPU nodes and time-sliced ones in one cluster
    mixed = KubernetesLauncherConfig(node_sharing={"h100-01": "time-slicing"})
    assert _gpus_asked(_pod(build_job(_job(), NODE_A[:2], mixed))) == {"nvidia.com/gpu": "2"}
    assert _gpus_asked(_pod(build_job(_job(), NODE_B[:1], mixed))) == {"nvidia.com/gpu.shared": "1"}
    assert mixed.shares("h100-01") and not mixed.shares("h100-00") and DRA.shares("h100-00")


def test_sharing_config_is_checked_at_load():
    """0.1 s. Time-slicing without renameByDefault offers slices as nvidia.com/gpu: refused at load."""
    with pytest.raises(ValueError, match="is the whole-GPU resource"):
        KubernetesLauncherConfig(sharing="time-slicing", shared_resource="nvidia.com/gpu")
    with pytest.raises(ValueError, match="no node shares its GPUs"):
        KubernetesLauncherConfig(shared_resource="nvidia.com/gpu.shared")
    with pytest.raises(ValueError, match="sharing"):
        KubernetesLauncherConfig(sharing="vgpu")
    assert KubernetesLauncherConfig(sharing="mps", shared_resource="nvidia.com/gpu.mps").shared_resource_name() == (
        "nvidia.com/gpu.mps"
    )


def test_dra_claims_name_the_devices_the_queue_chose():
    """0.6 s. A job alone: its own ResourceClaim selecting exactly its device indices, the pod referencing
    it and asking no extended resource; both validate against Kubernetes 1.34 (resource.k8s.io/v1 GA)."""
    job, (claim,) = build_objects(_job(), [NODE_A[2], NODE_A[5]], DRA)
    _valid(job)
    _valid(claim)
    validate_claim(claim)
    pod = _pod(job)
    assert pod["resourceClaims"] == [{"name": "gpus", "resourceClaimName": "drape-finetune-1-a1"}]
    assert pod["containers"][0]["resources"]["claims"] == [{"name": "gpus"}]
    assert _gpus_asked(pod) == {}
    (request,) = claim["spec"]["devices"]["requests"]
    assert claim["metadata"]["name"] == "drape-finetune-1-a1"
    assert request["exactly"] == {
        "deviceClassName": "gpu.nvidia.com",
        "allocationMode": "ExactCount",
        "count": 2,
        "selectors": [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].index in [2, 5]'}}],
    }
    dcgm = [GpuState("GPU-1b2c3d4e-0000-1111-2222-333344445555", "h100-00", "H100-80GB", 80)]
    (_, (by_uuid,)) = build_objects(_job(exclusive="true"), dcgm, DRA)
    expression = by_uuid["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]
    assert expression == 'device.attributes["gpu.nvidia.com"].uuid in ["GPU-1b2c3d4e-0000-1111-2222-333344445555"]'


def test_dra_jobs_that_share_a_gpu_share_its_claim_and_a_gang_gets_a_template():
    """0.6 s. Two shareable jobs on one GPU reference one claim named for the GPU; a job across nodes gets
    a ResourceClaimTemplate (one claim per pod) when its device indices agree on every node, else refused."""
    (first, (claim,)), (second, _) = (build_objects(_job(i), NODE_A[3:4], DRA) for i in ("a", "b"))
    assert claim["metadata"]["name"] == "drape-gpu-h100-00-3"
    assert (
        _pod(first)["resourceClaims"]
        == _pod(second)["resourceClaims"]
        == [{"name": "gpus", "resourceClaimName": "drape-gpu-h100-00-3"}]
    )
    _valid(claim)
    gang, (template,) = build_objects(_job(), NODE_A + NODE_B, DRA)
    _valid(gang)
    _valid(template)
    assert template["kind"] == "ResourceClaimTemplate" and _pod(gang)["resourceClaims"] == [
        {"name": "gpus", "resourceClaimTemplateName": "drape-finetune-1-a1"}
    ]
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 8
    with pytest.raises(BindingError, match="different devices per node"):
        build_objects(_job(), NODE_A[:2] + NODE_B[2:4], DRA)
    broken = json.loads(json.dumps(claim))
    broken["spec"]["devices"]["requests"][0]["exactly"]["count"] = 0
    with pytest.raises(BindingError, match=r"ResourceClaim drape-gpu-h100-00-3: spec.devices.requests.0.exactly.count"):
        validate_claim(broken)
    with pytest.raises(kubernetes_validate.ValidationError):
        _valid({**claim, "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClass": "x"}}]}}})


def test_placement_drift_finds_the_node_and_devices_a_job_really_runs_on():
    """0.1 s. Pure arithmetic: planned 2 GPUs of h100-00."""
    inventory = {g.uuid: g for g in NODE_A + NODE_B}
    planned = ["h100-00/gpu0", "h100-00/gpu1"]
    assert placement_drift(planned, [], inventory, {}) is None  # not bound yet
    assert placement_drift(planned, [Landing("h100-00")], inventory, {}) is None  # as planned (devices unknown)
    assert placement_drift(planned, [Landing("h100-00", (0, 1))], inventory, {}) is None
    moved = placement_drift(planned, [Landing("h100-00", (4, 6))], inventory, {})
    assert moved == (["h100-00/gpu4", "h100-00/gpu6"], ["gpu"])
    busy = {"h100-01/gpu0": (60.0, 1), "h100-01/gpu1": (20.0, 1)}  # the device plugin gave it free devices
    assert placement_drift(planned, [Landing("h100-01")], inventory, busy) == (["h100-01/gpu2", "h100-01/gpu3"], ["node"])
    assert placement_drift(planned, [Landing("elsewhere")], inventory, {}) == (planned, ["node"])  # unknown node


def test_claimed_view_counts_the_jobs_placed_beside_each_other_in_one_cycle():
    """0.1 s. The launcher sees a GPU as shared when this cycle's other jobs land on it too."""
    by_uuid = {g.uuid: g for g in NODE_A[:2]}
    view = claimed_view([Placement("a", ("h100-00/gpu0",), 20.0), Placement("b", ("h100-00/gpu0",), 20.0)], by_uuid)
    assert [g.jobs for g in view["a"]] == [1] and [g.jobs for g in view["b"]] == [1]
    alone = claimed_view([Placement("c", ("h100-00/gpu1",), 20.0)], by_uuid)
    assert [g.jobs for g in alone["c"]] == [0] and by_uuid["h100-00/gpu0"].jobs == 0  # the view is left as it was


def test_the_local_launcher_gives_the_process_exactly_its_gpu_indices(tmp_path):
    """0.5 s. GPUs 2 and 5 of a node: CUDA_VISIBLE_DEVICES=2,5 in the job's process."""
    from scheduler.engines.local.launcher import LocalLauncher

    gpus = [NODE_A[2], NODE_A[5]]
    assert device_indices(gpus) == "2,5" and device_indices([GpuState("host/cpu", "host", "cpu", 16)]) == ""
    launcher = LocalLauncher(tmp_path)
    script = "import os; print('devices=' + os.environ['CUDA_VISIBLE_DEVICES'])"
    job = {**_job(), "command": json.dumps([sys.executable, "-c", script]), "labels": "{}"}
    handle = launcher.launch(job, gpus)
    deadline = time.monotonic() + 30
    while (outcome := launcher.poll(job["id"], handle)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert outcome is not None and outcome.exit_code == 0, outcome
    assert "devices=2,5" in launcher.log_path(job["id"]).read_text()


def test_the_rendered_objects_in_the_docs_are_what_the_command_prints():
    """1-2 s. docs/placement.md pastes `drape queue render` outputs; each must still be what it prints."""
    import re
    import shlex

    from typer.testing import CliRunner

    from drape.cli import app
    from tests.conftest import TESTS

    page = (TESTS.parent / "docs" / "placement.md").read_text()
    blocks = re.findall(r"```console\n\$ drape (queue render [^\n]+)\n(.*?)```", page, re.S)
    assert len(blocks) >= 4
    for command, pasted in blocks:
        result = CliRunner().invoke(app, shlex.split(command), env={"COLUMNS": "400"})
        if result.exit_code == 0:
            assert result.output == pasted, command
        else:  # a refusal: the same reason, however the terminal wrapped it
            assert " ".join(result.output.split()) == " ".join(pasted.split()), command


def _series(pod: str, gpu: str, host: str = "h100-00", namespace: str = "drape", exported: bool = False, **extra) -> dict:
    """One DCGM_FI_DEV_FB_USED sample as Prometheus answers it; `exported`: scraped with honor_labels false
    through kubernetes_sd, so the exporter's pod labels carry an `exported_` prefix beside the target's own."""
    own = {"pod": pod, "namespace": namespace, "container": "main"}
    if exported:
        own = {f"exported_{k}": v for k, v in own.items()} | {"pod": "nvidia-dcgm-exporter-x7", "namespace": "gpu-operator"}
    labels = {"__name__": "DCGM_FI_DEV_FB_USED", "gpu": gpu, "UUID": f"GPU-0000000{gpu}-aaaa-bbbb", "Hostname": host}
    return {"metric": own | labels | extra, "value": [0, "1024"]}


def test_dcgm_pod_labels_give_the_devices_and_bad_series_are_ignored():
    """0.1 s. Pod and exported_pod both read; a wrong Hostname, a bad index, another namespace: ignored, logged."""
    from scheduler.engines.kubernetes.dcgm import pod_gpus, pod_query

    said: list[str] = []
    samples = [
        _series("job-a-x", "4"),
        _series("job-a-x", "5"),
        _series("job-b-y", "3", exported=True),
        _series("job-b-y", "6", host="h100-07"),  # stale or foreign: not the pod's node
        _series("job-b-y", "-1", exported=True),
        _series("job-b-y", "99", exported=True),
        _series("job-b-y", "x", exported=True),
        _series("job-a-x", "7", namespace="other"),
        _series("nvidia-dcgm-exporter-x7", "0", namespace="gpu-operator"),  # a GPU no pod holds
    ]
    found = pod_gpus(samples, "drape", {"job-a-x": "h100-00", "job-b-y": "h100-00"}, log=said.append)
    assert found["job-a-x"].indices == (4, 5) and found["job-a-x"].uuids == ("GPU-00000004-aaaa-bbbb", "GPU-00000005-aaaa-bbbb")
    assert found["job-b-y"].indices == (3,)
    assert len(said) == 4 and "h100-07" in said[0] and "bound to node h100-00" in said[0]
    assert all("not a GPU index" in line for line in said[1:])
    assert pod_gpus([_series("job-a-x", "4", UUID="nonsense")], "drape", {"job-a-x": "h100-00"})["job-a-x"].uuids is None
    assert pod_gpus("not a list", "drape", {"job-a-x": "h100-00"}) == {}
    assert pod_query('a"b') == 'DCGM_FI_DEV_FB_USED{namespace="a\\"b"} or DCGM_FI_DEV_FB_USED{exported_namespace="a\\"b"}'


def test_dcgm_late_labels_are_waited_for_then_the_landing_is_node_only():
    """0.1 s. Missing labels → None (asked again) until WAIT_S after the pods were first seen, then node-only."""
    from scheduler.engines.kubernetes.dcgm import WAIT_S, DcgmPods

    answers: list = [[], [_series("job-a-x", "4")], ConnectionError("refused"), []]
    clock = iter([0.0, 30.0, 60.0, WAIT_S + 1, 500.0, 501.0]).__next__

    def query(expr: str) -> list:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    dcgm = DcgmPods(query, "drape", clock=clock)
    pods = [("job-a-x", "h100-00", 2)]
    assert dcgm.landings("job:a", pods) is None  # no labels yet
    assert dcgm.landings("job:a", pods) is None  # one GPU of the two it requested
    assert dcgm.landings("job:a", pods) is None  # Prometheus unreachable
    assert dcgm.landings("job:a", pods) == [Landing("h100-00")]  # past the bound: devices unknown, as before
    answers.append([_series("job-a-x", "4"), _series("job-a-x", "6")])
    assert dcgm.landings("job:b", pods) == [Landing("h100-00", (4, 6), ("GPU-00000004-aaaa-bbbb", "GPU-00000006-aaaa-bbbb"))]
    assert dcgm.first_seen == {}

    asked: list[str] = []

    def down(expr: str) -> list:
        asked.append(expr)
        raise TimeoutError("read timed out")

    quiet = DcgmPods(down, "drape", clock=iter([0.0, 1.0, 4.0, 6.0]).__next__)
    assert [quiet.landings(f"job:{i}", pods) for i in range(4)] == [None] * 4
    assert len(asked) == 2  # at 0 s and 6 s: a failing Prometheus is not asked again for 5 s


def test_dcgm_uuids_name_the_gpus_of_a_fleet_read_from_dcgm():
    """0.1 s. A fleet from DCGM knows GPUs by UUID: the reported UUIDs place the drift."""
    fleet = [GpuState(f"GPU-0000000{i}-aaaa-bbbb", "h100-00", "H100-80GB", 80) for i in range(8)]
    inventory = {g.uuid: g for g in fleet}
    planned = [fleet[0].uuid, fleet[1].uuid]
    landing = Landing("h100-00", (4, 5), (fleet[4].uuid, fleet[5].uuid))
    assert placement_drift(planned, [landing], inventory, {}) == ([fleet[4].uuid, fleet[5].uuid], ["gpu"])
    assert placement_drift(planned, [Landing("h100-00", (4, 5))], inventory, {}) is None  # indices alone name none of them
    assert placement_drift(planned, [Landing("h100-00", (4,), (fleet[4].uuid,))], inventory, {}) is None  # never resized
