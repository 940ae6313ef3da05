"""The queue's placement reaching Kubernetes, through the real dispatcher (scheduler/dispatch/dispatcher.py →
scheduler/engines/kubernetes/launcher.py) and a real queue database, with a fake Kubernetes API that stands in for the
cluster: it records what drape creates and binds pods where the test says (as kube-scheduler would,
or as it would when it ignores drape's affinity, or as a DRA driver allocates devices).

- a pod that lands on another node than planned is found from its `spec.nodeName`, the job's GPUs in
  the books move to that node, and drape_queue_placement_drift_total{engine="kubernetes",kind="node"}
  counts it once; the GPUs it really holds are released when it ends;
- under DRA, the devices its claim was allocated are read back; other devices than planned: kind gpu;
- two shareable jobs share a GPU only where the node declares sharing; elsewhere the second waits."""

from __future__ import annotations

import copy
import json
import uuid

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from drape.config import KubernetesLauncherConfig
from drape.ops import metrics
from scheduler.engines.kubernetes.devices import SHARING_LABEL
from scheduler.engines.kubernetes.launcher import KubernetesLauncher
from scheduler.engines.kubernetes.pods import k8s_name
from scheduler.queue.store import JobSpec, JobStore
from tests.conftest import tiny_config

pytestmark = pytest.mark.slow


class FakeCluster:
    """The batch, core and custom-object calls the Kubernetes engine makes, over dicts."""

    def __init__(self):
        self.jobs: dict[str, dict] = {}
        self.objects: dict[tuple[str, str], dict] = {}  # (plural, name) → body (claims, templates)
        self.pods: dict[str, list[client.V1Pod]] = {}  # job name → its bound pods
        self.nodes: dict[str, dict[str, str]] = {}  # node name → its labels (kubernetes.io/hostname, GFD's)

    def list_node(self, label_selector=None, _request_timeout=None):
        key, _, value = label_selector.partition("=")
        found = [name for name, labels in self.nodes.items() if labels.get(key) == value]
        return client.V1NodeList(items=[client.V1Node(metadata=client.V1ObjectMeta(name=n, labels=self.nodes[n])) for n in found])

    def create_namespaced_job(self, namespace, body, _request_timeout=None):
        plain = client.ApiClient().sanitize_for_serialization(body)
        if plain["metadata"]["name"] in self.jobs:
            raise ApiException(status=409)
        plain["metadata"]["uid"] = str(uuid.uuid4())
        self.jobs[plain["metadata"]["name"]] = plain | {"status": {}}
        return client.V1Job(metadata=client.V1ObjectMeta(name=plain["metadata"]["name"], uid=plain["metadata"]["uid"]))

    def read_namespaced_job_status(self, name, namespace, _request_timeout=None):
        if name not in self.jobs:
            raise ApiException(status=404)
        return client.V1Job(
            metadata=client.V1ObjectMeta(name=name, uid=self.jobs[name]["metadata"]["uid"]),
            spec=client.V1JobSpec(template=client.V1PodTemplateSpec(), completions=1),
            status=client.V1JobStatus(**self.jobs[name]["status"]),
        )

    def create_namespaced_custom_object(self, group, version, namespace, plural, body, _request_timeout=None):
        key = (plural, body["metadata"]["name"])
        if key in self.objects:
            raise ApiException(status=409)
        self.objects[key] = copy.deepcopy(body)

    def get_namespaced_custom_object(self, group, version, namespace, plural, name, _request_timeout=None):
        if (plural, name) not in self.objects:
            raise ApiException(status=404)
        return copy.deepcopy(self.objects[(plural, name)])

    def list_namespaced_pod(self, namespace, label_selector=None, _request_timeout=None):
        name = label_selector.removeprefix("job-name=")
        return client.V1PodList(items=self.pods.get(name, []))

    def bind(self, job_name: str, node: str) -> None:
        """kube-scheduler puts the job's pod on `node` (with the Job's pod spec, its claims included)."""
        spec = self.jobs[job_name]["spec"]["template"]["spec"]
        claims = [client.V1PodResourceClaim(**_snake(c)) for c in spec.get("resourceClaims", [])]
        pod_spec = client.V1PodSpec(containers=[], node_name=node, resource_claims=claims or None)
        self.pods[job_name] = [client.V1Pod(metadata=client.V1ObjectMeta(name=f"{job_name}-x"), spec=pod_spec)]

    def allocate(self, claim_name: str, node: str, devices: list[str]) -> None:
        """The DRA driver's allocation, as ResourceClaim status reports it."""
        results = [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": d} for d in devices]
        self.objects[("resourceclaims", claim_name)]["status"] = {"allocation": {"devices": {"results": results}}}


def _snake(ref: dict) -> dict:
    names = {
        "name": "name",
        "resourceClaimName": "resource_claim_name",
        "resourceClaimTemplateName": "resource_claim_template_name",
    }
    return {names[k]: v for k, v in ref.items()}


def _setup(tmp_path, nodes: int, gpus_per_node: int, **settings):
    fleet = {
        "groups": [
            {"model": "H100-80GB", "memory_gib": 80, "nodes": nodes, "gpus_per_node": gpus_per_node, "node_prefix": "h100"}
        ]
    }
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    queue = {"fleet": "static", "inventory": str(tmp_path / "fleet.yaml"), "launcher": "kubernetes"}
    config = tiny_config(tmp_path / "drape", queue={**queue, "kubernetes": KubernetesLauncherConfig(**settings).model_dump()})
    store, cluster = JobStore(config.queue_url), FakeCluster()
    engine = KubernetesLauncher(config.queue.kubernetes)
    engine._clients = {"batch": cluster, "core": cluster, "custom": cluster}
    from scheduler.dispatch.dispatcher import Dispatcher

    return store, cluster, Dispatcher(config, store, launcher=engine)


def _drift(kind: str) -> float:
    return metrics.REGISTRY.get_sample_value("drape_queue_placement_drift_total", {"engine": "kubernetes", "kind": kind}) or 0.0


def test_a_pod_on_another_node_is_found_and_the_books_follow_it(tmp_path):
    store, cluster, dispatcher = _setup(tmp_path, nodes=2, gpus_per_node=4)
    job_id = store.submit(JobSpec(kind="finetune", mem_gib=30, duration_s=600, gpus=2, command=["true"]), now=0.0)
    assert dispatcher.cycle(now=1.0).started == [job_id]
    planned = json.loads(store.get(job_id)["assigned"])
    (name,) = cluster.jobs
    pod = cluster.jobs[name]["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    planned_node = planned[0].split("/")[0]
    assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "In", "values": [planned_node]}]
    before = _drift("node")
    dispatcher.cycle(now=2.0)  # not bound yet: nothing to check (asked again 5 s later)
    assert json.loads(store.get(job_id)["assigned"]) == planned and _drift("node") == before

    other = "h100-01" if planned_node == "h100-00" else "h100-00"
    cluster.bind(name, other)  # affinity ignored (a wrong node label, a pod recreated elsewhere)
    dispatcher.cycle(now=3.0)
    assert json.loads(store.get(job_id)["assigned"]) == planned  # not asked again yet
    dispatcher.cycle(now=7.0)
    moved = json.loads(store.get(job_id)["assigned"])
    assert {g.split("/")[0] for g in moved} == {other} and len(moved) == 2
    assert set(store.ledger()) == set(moved)  # the ledger holds the GPUs it really runs on
    assert _drift("node") == before + 1
    dispatcher.cycle(now=20.0)
    assert _drift("node") == before + 1  # counted once
    cluster.jobs[name]["status"] = {"succeeded": 1}
    dispatcher.cycle(now=21.0)
    assert store.get(job_id)["state"] == "succeeded" and store.ledger() == {}
    events = store.allocation_events([job_id])
    assert [(e["event"], e["gpu_uuid"].split("/")[0]) for e in events].count(("release", other)) == 2


def test_under_dra_the_claim_names_the_devices_and_other_devices_are_drift(tmp_path):
    store, cluster, dispatcher = _setup(tmp_path, nodes=1, gpus_per_node=4, dra_device_class="gpu.nvidia.com")
    job_id = store.submit(
        JobSpec(kind="finetune", mem_gib=30, duration_s=600, gpus=1, command=["true"], labels={"exclusive": "true"}), now=0.0
    )
    dispatcher.cycle(now=1.0)
    (planned,) = json.loads(store.get(job_id)["assigned"])
    (name,) = cluster.jobs
    claim = cluster.objects[("resourceclaims", name)]
    index = planned.rsplit("gpu", 1)[1]
    expression = claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"]
    assert expression == f'device.attributes["gpu.nvidia.com"].index in [{index}]'
    assert claim["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": cluster.jobs[name]["metadata"]["uid"]}
    ]  # collected with its Job
    other = str((int(index) + 1) % 4)
    cluster.bind(name, "h100-00")
    cluster.allocate(name, "h100-00", [f"gpu-{other}"])
    before = _drift("gpu")
    dispatcher.cycle(now=2.0)
    assert json.loads(store.get(job_id)["assigned"]) == [f"h100-00/gpu{other}"] and _drift("gpu") == before + 1


@pytest.mark.parametrize("sharing", ["none", "time-slicing"])
def test_two_jobs_share_a_gpu_only_where_the_node_declares_sharing(tmp_path, sharing):
    store, cluster, dispatcher = _setup(tmp_path, nodes=1, gpus_per_node=1, sharing=sharing)
    cluster.nodes["h100-00"] = {"kubernetes.io/hostname": "h100-00", SHARING_LABEL: sharing}  # GPU Feature Discovery agrees
    ids = [store.submit(JobSpec(kind="finetune", mem_gib=20, duration_s=600, command=["true"]), now=float(i)) for i in range(2)]
    started = dispatcher.cycle(now=10.0).started + dispatcher.cycle(now=11.0).started
    states = sorted(store.get(i)["state"] for i in ids)
    from scheduler.dispatch.fleet import fleet_view

    (gpu,) = fleet_view(dispatcher.config, store).gpus
    assert gpu.exclusive is (sharing == "none")  # the queue sees a busy GPU of a node that cannot share as taken
    if sharing == "none":
        assert len(started) == 1 and states == ["queued", "running"]  # the second waits: no silent GPU of its own
        (job,) = cluster.jobs.values()
        assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    else:
        assert sorted(started) == sorted(ids) and states == ["running", "running"]
        for job in cluster.jobs.values():
            assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu.shared"] == "1"


def test_a_node_whose_gpu_feature_discovery_label_contradicts_the_declaration_is_refused_naming_both(tmp_path):
    """The config declares no sharing; the node's device plugin time-slices (its GFD label says so):
    the launch is refused with both named, not launched as something the queue did not plan. A node
    with no such label is taken at the declaration's word."""
    store, cluster, dispatcher = _setup(tmp_path, nodes=2, gpus_per_node=1)
    cluster.nodes["h100-00"] = {"kubernetes.io/hostname": "h100-00", SHARING_LABEL: "time-slicing"}
    cluster.nodes["h100-01"] = {"kubernetes.io/hostname": "h100-01"}
    ids = [store.submit(JobSpec(kind="finetune", mem_gib=20, duration_s=600, command=["true"]), now=float(i)) for i in range(2)]
    dispatcher.cycle(now=10.0)
    rows = {row["assigned"]: row for row in (store.get(i) for i in ids)}
    refused, launched = rows['["h100-00/gpu0"]'], rows['["h100-01/gpu0"]']
    assert launched["state"] == "running" and list(cluster.jobs) == [k8s_name(launched["id"], 1)]
    assert refused["state"] in ("queued", "failed") and refused["id"] not in " ".join(cluster.jobs)
    assert "node h100-00 says its GPUs are shared by 'time-slicing' (nvidia.com/gpu.sharing-strategy)" in refused["message"]
    assert "declares 'none'" in refused["message"], refused["message"]
