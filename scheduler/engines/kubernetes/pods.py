"""The pod a queue job runs in on Kubernetes: what it requests, what it mounts, where it may land.

Every pod of a job (a Job's, an indexed Job's, a PyTorchJob's replicas) is built here, so they all
hold the same promises:

- GPUs as the binding asks for them (scheduler/engines/kubernetes/devices.py): whole `nvidia.com/gpu`, a
  node's shared resource, or the pod's DRA claim naming the devices; the node by required affinity.
- Credentials come from one named Secret (`queue.kubernetes.credentials_secret`) through
  ``envFrom``: the spec names the Secret, never a value in it.
- Host resources follow the GPUs the pod holds (`gpu_units`): a pod of whole GPUs counts each, a
  pod on a shared GPU counts the part of that GPU's memory its memory profile holds (the job's
  `mem_gib` of the GPU's total), so jobs that share a GPU also share its node's CPUs and memory.
  Per unit it requests `cpu_per_gpu` CPUs (at least 1), `host_memory_gib_per_gpu` GiB plus a
  `shm_gib_per_gpu` GiB /dev/shm in memory; the memory limit equals the request (an emptyDir in
  memory is charged to the pod, so /dev/shm counts in both), and no CPU limit (throttled ranks
  stall every other rank at the next collective).
- /dev/shm is a memory-backed emptyDir with a size limit: Kubernetes' default of 64 MB kills
  DataLoader workers, an unbounded one lets a leak take the node.
- Every path of the job's config at the same path (drape/mounts.py derives them from the config's
  fields), and its pretrained weights read-only: the denoiser, the VAE, the gates' and eval's models.
- Non-root, no privilege escalation, no capabilities, RuntimeDefault seccomp, no API token.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from drape.config import names
from scheduler.engines.kubernetes.devices import Binding


@dataclass(frozen=True)
class Placement:
    """Where the queue put a job, as its pods need it: the nodes, GPUs per pod, the GPU model and its memory."""

    nodes: list[str]
    gpus_per_pod: int
    model: str
    gpu_total_gib: float
    gpus: int  # the job's GPUs in all
    binding: Binding  # how its pods ask for their GPUs (scheduler/engines/kubernetes/devices.py)


@dataclass(frozen=True)
class HostShare:
    """What one pod requests of its node besides GPUs."""

    cpu: int
    memory_gib: int  # request and limit, /dev/shm included
    shm_gib: int


def k8s_name(job_id: str, attempt: int | None = None) -> str:
    """A DNS-1123 name for the job's attempt (63 characters at most)."""
    suffix = f"-a{attempt}" if attempt else ""
    base = re.sub(r"[^a-z0-9-]", "-", f"drape-{job_id}".lower())[: 63 - len(suffix)].rstrip("-")
    return base + suffix


def pod_labels(job: dict) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/name": "drape",
        "app.kubernetes.io/component": "gpu-job",
        "app.kubernetes.io/part-of": "drape",  # what the NetworkPolicies admit to MLflow and the database
        "drape.ai/job-id": k8s_name(job["id"])[6:],
        "drape.ai/kind": job["kind"],
    }
    if job.get("stage"):
        labels["drape.ai/stage"] = job["stage"]
    return labels


def job_labels(job: dict) -> dict:
    return json.loads(job.get("labels") or "{}")


def gpu_units(job: dict, gpus_per_pod: int, shared: bool, gpu_total_gib: float) -> float:
    """How many GPUs' worth of its node a pod holds: its whole GPUs, or on a shared GPU the part of
    that GPU's memory the job's memory profile asks for (`mem_gib` / the GPU's total, at most 1)."""
    mem_gib = job.get("mem_gib")
    if not shared or not mem_gib or gpu_total_gib <= 0:
        return float(gpus_per_pod)
    return min(1.0, float(mem_gib) / gpu_total_gib)


def host_share(units: float, settings) -> HostShare:
    """The CPUs, memory and /dev/shm of a pod holding `units` GPUs (see the module docstring)."""
    shm = max(1, math.ceil(units * settings.shm_gib_per_gpu))
    memory = max(1, math.ceil(units * settings.host_memory_gib_per_gpu)) + shm
    return HostShare(cpu=max(1, math.ceil(units * settings.cpu_per_gpu)), memory_gib=memory, shm_gib=shm)


def _volume_source(path: str, settings) -> dict:
    from kubernetes import client

    claim = settings.volume_claims.get(path)
    if claim:
        return {"persistent_volume_claim": client.V1PersistentVolumeClaimVolumeSource(claim_name=claim)}
    return {"host_path": client.V1HostPathVolumeSource(path=path, type="DirectoryOrCreate")}


def _absolute(job: dict, path: str, what: str) -> str:
    if not PurePosixPath(path).is_absolute():
        hub = " (a hub id is read from the node's Hugging Face cache, which a pod does not see: name the mounted folder)"
        raise ValueError(
            f"job {job['id']}: {what} {path!r} of its config is relative; a pod needs absolute paths{hub if '/' in path else ''}"
        )
    return path


def volumes(job: dict, settings, shm_gib: int):
    """(mounts, volumes): /dev/shm in memory (`shm_gib`), every path of the job's config at its own
    path (its PersistentVolumeClaim from `volume_claims`, else the node's directory), and its
    pretrained weights (`drape.mounts.model_paths`) read-only from the node."""
    from kubernetes import client

    shm = client.V1EmptyDirVolumeSource(medium="Memory", size_limit=f"{shm_gib}Gi")
    mounts = [client.V1VolumeMount(name="dshm", mount_path="/dev/shm")]
    found = [client.V1Volume(name="dshm", empty_dir=shm)]
    for index, path in enumerate(json.loads(job_labels(job).get("mounts", "[]"))):
        name = f"drape-path-{index}"
        mounts.append(client.V1VolumeMount(name=name, mount_path=_absolute(job, path, "path")))
        found.append(client.V1Volume(name=name, **_volume_source(path, settings)))
    for index, path in enumerate(json.loads(job_labels(job).get("models", "[]"))):  # pretrained files: read-only
        name = f"drape-model-{index}"
        mounts.append(client.V1VolumeMount(name=name, mount_path=_absolute(job, path, "model path"), read_only=True))
        found.append(client.V1Volume(name=name, host_path=client.V1HostPathVolumeSource(path=path, type="Directory")))
    return mounts, found


def _apart(job: dict, settings, nodes: list[str]):
    """The pods of one job on distinct nodes of those the queue placed it on (None for one node)."""
    from kubernetes import client

    if not settings.node_label or len(nodes) < 2:
        return None
    term = client.V1PodAffinityTerm(
        label_selector=client.V1LabelSelector(match_labels={"drape.ai/job-id": pod_labels(job)["drape.ai/job-id"]}),
        topology_key=settings.node_label,
    )
    return client.V1PodAntiAffinity(required_during_scheduling_ignored_during_execution=[term])


def affinity(job: dict, model: str, settings, nodes: list[str]):
    """Where Kubernetes may run the job's pods: on the GPU products the job allows (its `gpu_models`,
    matched against the configured products' models), so Kubernetes enforces what the queue's policy
    honoured; with `node_label`, on the nodes the queue placed it on, one pod per node. None when
    neither applies (the node selector pins the placed model's product)."""
    from kubernetes import client

    from scheduler.policy import allows
    from scheduler.queue.schema import scheduling_of

    models = scheduling_of(job.get("labels")).models
    requirements = []
    if models:
        products = sorted(
            {names.product_label(model, settings.products)} | {p for m, p in settings.products.items() if allows(models, m)}
        )
        requirements.append(client.V1NodeSelectorRequirement(key=settings.product_label, operator="In", values=products))
    if settings.node_label and nodes:
        requirements.append(client.V1NodeSelectorRequirement(key=settings.node_label, operator="In", values=nodes))
    if not requirements:
        return None
    selector = client.V1NodeSelector(node_selector_terms=[client.V1NodeSelectorTerm(match_expressions=requirements)])
    return client.V1Affinity(
        node_affinity=client.V1NodeAffinity(required_during_scheduling_ignored_during_execution=selector),
        pod_anti_affinity=_apart(job, settings, nodes),
    )


def _resources(job: dict, placement: Placement, settings):
    """(the container's resource requirements, the host share): its GPUs as the binding asks for them
    (an extended resource, or the pod's DRA claim), CPUs and memory by the GPUs it holds."""
    from kubernetes import client

    binding = placement.binding
    share = host_share(gpu_units(job, placement.gpus_per_pod, binding.shared, placement.gpu_total_gib), settings)
    memory = f"{share.memory_gib}Gi"
    requests, limits = {"cpu": str(share.cpu), "memory": memory}, {"memory": memory}
    if binding.resource:
        gpus = {binding.resource: str(placement.gpus_per_pod)}
        requests, limits = {**gpus, **requests}, {**gpus, **limits}
    claims = [client.CoreV1ResourceClaim(name=binding.claim_ref["name"])] if binding.claim_ref else None
    return client.V1ResourceRequirements(requests=requests, limits=limits, claims=claims), share


def _credentials(settings) -> list | None:
    from kubernetes import client

    if not settings.credentials_secret:
        return None
    return [client.V1EnvFromSource(secret_ref=client.V1SecretEnvSource(name=settings.credentials_secret))]


def _node_name():
    """DRAPE_NODE: the node the pod runs on (the downward API), which the trainer reports so the
    next stage's job prefers the node whose shard cache it warmed."""
    from kubernetes import client

    selector = client.V1ObjectFieldSelector(field_path="spec.nodeName")
    return client.V1EnvVar(name="DRAPE_NODE", value_from=client.V1EnvVarSource(field_ref=selector))


def _container(job: dict, placement: Placement, settings, command: list[str], env: dict[str, str], ports):
    from kubernetes import client

    resources, share = _resources(job, placement, settings)
    extra = placement.binding.env
    mounts, found = volumes(job, settings, share.shm_gib)
    container = client.V1Container(
        name="trainer",
        image=settings.image,
        command=command,
        env=[client.V1EnvVar(name=k, value=v) for k, v in sorted({**env, **extra}.items())] + [_node_name()],
        env_from=_credentials(settings),
        ports=[client.V1ContainerPort(name=name, container_port=port) for name, port in ports] or None,
        resources=resources,
        volume_mounts=mounts,
        security_context=client.V1SecurityContext(
            allow_privilege_escalation=False, capabilities=client.V1Capabilities(drop=["ALL"])
        ),
    )
    return container, found


def pod_spec(
    job: dict, placement: Placement, settings, command: list[str], env: dict[str, str], ports: tuple[tuple[str, int], ...] = ()
):
    """The pod of `job` placed by `placement`, running `command` with `env` (plus the credentials
    Secret's variables), exposing the named container `ports`."""
    from kubernetes import client

    container, found = _container(job, placement, settings, command, env, ports)
    return client.V1PodSpec(
        restart_policy="Never",
        service_account_name=settings.service_account,
        automount_service_account_token=False,  # a training job never calls the Kubernetes API
        security_context=client.V1PodSecurityContext(
            run_as_non_root=True,
            run_as_user=settings.run_as_user,
            run_as_group=settings.run_as_user,
            fs_group=settings.run_as_user,
            seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
        ),
        containers=[container],
        node_selector={settings.product_label: names.product_label(placement.model, settings.products)},
        affinity=affinity(job, placement.model, settings, placement.nodes),
        tolerations=[client.V1Toleration(**t) for t in settings.tolerations],
        volumes=found,
        resource_claims=_claims(placement.binding),
    )


def _claims(binding: Binding):
    """The pod's DRA claim (spec.resourceClaims): the claim, or claim template, naming its devices; None without DRA."""
    from kubernetes import client

    if not binding.claim_ref:
        return None
    ref = binding.claim_ref
    return [
        client.V1PodResourceClaim(
            name=ref["name"],
            resource_claim_name=ref.get("resourceClaimName"),
            resource_claim_template_name=ref.get("resourceClaimTemplateName"),
        )
    ]


def owner_references(kind: str, name: str, created) -> list[dict] | None:
    """The ownerReferences that make an object (a job's own claim, its Service) go with its Job or PyTorchJob; None when
    its uid is unknown."""
    metadata = created.get("metadata", {}) if isinstance(created, dict) else getattr(created, "metadata", None)
    uid = metadata.get("uid") if isinstance(metadata, dict) else getattr(metadata, "uid", None)
    if not uid:
        return None
    api, owner_kind = ("kubeflow.org/v1", "PyTorchJob") if kind == "pytorchjob" else ("batch/v1", "Job")
    return [{"apiVersion": api, "kind": owner_kind, "name": name, "uid": uid}]


def describe_object(body) -> tuple[str, str, dict, bool]:
    """(handle kind, name, labels, indexed) of a Job object, or of a Job or PyTorchJob as a dict."""
    if isinstance(body, dict):
        kind = "pytorchjob" if body["kind"] == "PyTorchJob" else "job"
        indexed = body["spec"].get("completionMode") == "Indexed"
        return kind, body["metadata"]["name"], body["metadata"].get("labels", {}), indexed
    return "job", body.metadata.name, body.metadata.labels, body.spec.completion_mode == "Indexed"
