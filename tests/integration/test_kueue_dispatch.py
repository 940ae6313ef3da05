"""Kueue mode through the real dispatcher (scheduler/dispatch/dispatcher.py → scheduler/engines/kubernetes/launcher.py): jobs
reach the API suspended in the LocalQueue, sized by their memory profile and pinned to no node; a
fake Kubernetes API stands in for the cluster, and a fake Kueue admits by unsuspending while the
ClusterQueue drape rendered for the fleet has quota. drape orders, Kueue admits: a job stays
running-but-suspended until admitted, and only admitted jobs finish."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from drape.config import KubernetesLauncherConfig
from scheduler.engines.kubernetes.kueue import QUEUE_NAME_LABEL, flavors_from_fleet, kueue_objects
from scheduler.engines.kubernetes.launcher import KubernetesLauncher
from scheduler.queue.inventory import load_fleet
from scheduler.queue.store import JobSpec, JobStore
from tests.conftest import tiny_config

pytestmark = pytest.mark.slow

FLEET = {"groups": [{"model": "H100-80GB", "memory_gib": 80, "nodes": 1, "gpus_per_node": 4, "node_prefix": "h100"}]}


class FakeCluster:
    """The few calls the Kubernetes engine makes, against a dict of Jobs (the batch and core APIs)."""

    def __init__(self):
        self.jobs: dict[str, dict] = {}

    def create_namespaced_job(self, namespace, body, _request_timeout=None):
        if body["metadata"]["name"] in self.jobs:
            raise ApiException(status=409)
        self.jobs[body["metadata"]["name"]] = copy.deepcopy(body) | {"status": {}}

    def read_namespaced_job_status(self, name, namespace, _request_timeout=None):
        from kubernetes import client

        if name not in self.jobs:
            raise ApiException(status=404)
        body = self.jobs[name]
        return client.V1Job(
            spec=client.V1JobSpec(template=client.V1PodTemplateSpec(), completions=1, suspend=body["spec"]["suspend"]),
            status=client.V1JobStatus(**body["status"]),
        )

    def create_namespaced_service(self, namespace, body, _request_timeout=None):
        raise AssertionError("a one-node job needs no Service")

    def list_namespaced_pod(self, namespace, label_selector=None, _request_timeout=None):
        from kubernetes import client

        return client.V1PodList(items=[])  # where pods landed: tests/integration/test_placement_drift.py


def _gpus_of(job: dict) -> int:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return int(container["resources"]["limits"]["nvidia.com/gpu"])


def _admit(cluster: FakeCluster, quota: int) -> list[str]:
    """Kueue's part: admit suspended jobs in creation order while the quota holds them (BestEffortFIFO)."""
    used = sum(_gpus_of(j) for j in cluster.jobs.values() if not j["spec"]["suspend"] and not j["status"].get("succeeded"))
    admitted = []
    for name, job in cluster.jobs.items():
        if job["spec"]["suspend"] and used + _gpus_of(job) <= quota:
            job["spec"]["suspend"], used = False, used + _gpus_of(job)
            admitted.append(name)
    return admitted


def test_the_dispatcher_submits_suspended_workloads_that_finish_only_once_kueue_admits_them(tmp_path):
    from scheduler.dispatch.dispatcher import Dispatcher

    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(FLEET))
    settings = KubernetesLauncherConfig(kueue_queue="drape", node_label="kubernetes.io/hostname")
    queue = {"fleet": "static", "inventory": str(tmp_path / "fleet.yaml"), "launcher": "kubernetes"}
    config = tiny_config(tmp_path / "drape", queue={**queue, "kubernetes": settings.model_dump()})
    objects = kueue_objects(
        flavors_from_fleet(load_fleet(tmp_path / "fleet.yaml"), settings.product_label, settings.products), namespace="drape"
    )
    (quota,) = [
        r["nominalQuota"]
        for r in objects[1]["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
        if r["name"] == "nvidia.com/gpu"
    ]
    store = JobStore(config.queue_url)
    engine = KubernetesLauncher(config.queue.kubernetes)
    cluster = FakeCluster()
    engine._clients = {"batch": cluster, "core": cluster, "custom": None}
    dispatcher = Dispatcher(config, store, launcher=engine)
    ids = [
        store.submit(JobSpec(kind="finetune", mem_gib=30, duration_s=600, gpus=2, command=["true"]), now=float(i))
        for i in range(2)
    ]

    report = dispatcher.cycle(now=10.0)
    assert sorted(report.started) == sorted(ids)  # drape sized and ordered both: 2 GPUs each of a 4-GPU fleet
    for name, job in cluster.jobs.items():
        assert job["spec"]["suspend"] is True and job["metadata"]["labels"][QUEUE_NAME_LABEL] == "drape", name
        pod = job["spec"]["template"]["spec"]
        assert "affinity" not in pod and pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        kubernetes_validate.validate(job, "1.33", strict=True)
    dispatcher.cycle(now=11.0)
    assert all(store.get(i)["state"] == "running" for i in ids)  # suspended: not finished, not failed

    assert len(_admit(cluster, quota=2)) == 1  # a quota of 2 GPUs (a ClusterQueue smaller than the fleet) admits one
    first = next(name for name, job in cluster.jobs.items() if not job["spec"]["suspend"])
    cluster.jobs[first]["status"] = {"succeeded": 1}
    dispatcher.cycle(now=12.0)
    states = sorted(store.get(i)["state"] for i in ids)
    assert states == ["running", "succeeded"]
    assert len(_admit(cluster, quota=int(quota))) == 1  # the fleet's quota admits the other
    for job in cluster.jobs.values():
        job["status"] = {"succeeded": 1}
    dispatcher.cycle(now=13.0)
    assert all(store.get(i)["state"] == "succeeded" for i in ids)
