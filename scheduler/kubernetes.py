"""Queue jobs as Kubernetes objects, and the launcher that creates, watches and adopts them.

- One node: a `batch/v1` Job; more than one GPU of a torchrun job (`labels.launch`) runs its
  ranks under ``torchrun --standalone --nproc-per-node=N``.
- Several nodes: an indexed Job with torchrun rendezvous across pods through a headless
  Service, or a Kubeflow PyTorchJob with `queue.kubernetes.training_operator`.
- Every pod mounts the job's paths (`labels.mounts`: its config's live root and shard cache) at
  the same paths, from the node (`hostPath`) or from the PersistentVolumeClaim that
  `queue.kubernetes.volume_claims` names for that path. One rule: a path the job's config names
  is the same path in the pod, so checkpoints, gate outputs and results land where the flow
  reads them, never on the container's own disk.
- Each attempt has its own name (``drape-<job id>-a<attempt>``): a retry never collides with
  the Job of the attempt before it (409), and a restarted dispatcher adopts a Job by the name
  the queue recorded.

`build_job` returns plain objects that the tests validate against the Kubernetes API schema.
The API clients are built after the kube config is loaded (in-cluster, else ~/.kube/config),
and every call has a request timeout (`queue.kubernetes.request_timeout_seconds`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import PurePosixPath

from scheduler.launchers import Outcome, module_args, torchrun_command
from scheduler.policy import GpuState


def k8s_name(job_id: str, attempt: int | None = None) -> str:
    """A DNS-1123 name for the job's attempt (63 characters at most)."""
    suffix = f"-a{attempt}" if attempt else ""
    base = re.sub(r"[^a-z0-9-]", "-", f"drape-{job_id}".lower())[: 63 - len(suffix)].rstrip("-")
    return base + suffix


def _labels(job: dict) -> dict[str, str]:
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


def _volumes(job: dict, settings):
    """(mounts, volumes): /dev/shm in memory, every path of the job's config at its own path, and
    its pretrained files (the VAE, the identity embedder) read-only from the node."""
    from kubernetes import client

    mounts = [client.V1VolumeMount(name="dshm", mount_path="/dev/shm")]
    volumes = [client.V1Volume(name="dshm", empty_dir=client.V1EmptyDirVolumeSource(medium="Memory"))]
    paths = json.loads(job_labels(job).get("mounts", "[]"))
    for index, path in enumerate(paths):
        if not PurePosixPath(path).is_absolute():
            raise ValueError(f"job {job['id']}: path {path!r} of its config is relative; a pod needs absolute paths")
        name = f"drape-path-{index}"
        mounts.append(client.V1VolumeMount(name=name, mount_path=path))
        claim = settings.volume_claims.get(path)
        source = (
            {"persistent_volume_claim": client.V1PersistentVolumeClaimVolumeSource(claim_name=claim)}
            if claim
            else {"host_path": client.V1HostPathVolumeSource(path=path, type="DirectoryOrCreate")}
        )
        volumes.append(client.V1Volume(name=name, **source))
    for index, path in enumerate(json.loads(job_labels(job).get("models", "[]"))):  # pretrained files: read-only
        if not PurePosixPath(path).is_absolute():
            raise ValueError(f"job {job['id']}: model path {path!r} of its config is relative; a pod needs absolute paths")
        name = f"drape-model-{index}"
        mounts.append(client.V1VolumeMount(name=name, mount_path=path, read_only=True))
        volumes.append(client.V1Volume(name=name, host_path=client.V1HostPathVolumeSource(path=path, type="Directory")))
    return mounts, volumes


def _affinity(job: dict, model: str, settings, nodes: list[str]):
    """Where Kubernetes may run the job's pods: on the GPU products the job allows (its `gpu_models`,
    matched against the configured products' models), so Kubernetes enforces what the queue's policy
    honoured; with `node_label`, on the nodes the queue placed it on, one pod per node. None when
    neither applies (the node selector pins the placed model's product)."""
    from kubernetes import client

    from scheduler.policy import allows
    from scheduler.schema import scheduling_of

    models = scheduling_of(job.get("labels")).models
    requirements = []
    if models:
        products = sorted({settings.products.get(model, model)} | {p for m, p in settings.products.items() if allows(models, m)})
        requirements.append(client.V1NodeSelectorRequirement(key=settings.product_label, operator="In", values=products))
    if settings.node_label and nodes:
        requirements.append(client.V1NodeSelectorRequirement(key=settings.node_label, operator="In", values=nodes))
    if not requirements:
        return None
    apart = None
    if settings.node_label and len(nodes) > 1:  # the pods of one job on distinct nodes of those
        apart = client.V1PodAntiAffinity(
            required_during_scheduling_ignored_during_execution=[
                client.V1PodAffinityTerm(
                    label_selector=client.V1LabelSelector(match_labels={"drape.ai/job-id": _labels(job)["drape.ai/job-id"]}),
                    topology_key=settings.node_label,
                )
            ]
        )
    selector = client.V1NodeSelector(node_selector_terms=[client.V1NodeSelectorTerm(match_expressions=requirements)])
    return client.V1Affinity(
        node_affinity=client.V1NodeAffinity(required_during_scheduling_ignored_during_execution=selector),
        pod_anti_affinity=apart,
    )


def gpu_resource(job: dict, gpus: int, settings) -> tuple[str, dict[str, str]]:
    """(the extended resource a pod of `job` requests, environment it adds). A shareable single-GPU
    job takes `shared_resource` when one is configured (a GPU the device plugin time-slices or runs
    under MPS), with a declared share as MPS's thread percentage; a multi-GPU or exclusive job, or
    any job when none is configured, takes whole GPUs (`nvidia.com/gpu`, which a node that shares
    its GPUs under a renamed resource does not offer: Kubernetes then keeps it off such nodes)."""
    from scheduler.schema import scheduling_of

    how = scheduling_of(job.get("labels"))
    if not settings.shared_resource or gpus != 1 or how.exclusive:
        return "nvidia.com/gpu", {}
    env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, round(100 * how.share)))} if how.share < 1 else {}
    return settings.shared_resource, env


def _pod_spec(
    job: dict,
    gpus_per_pod: int,
    model: str,
    settings,
    command: list[str],
    env: dict[str, str],
    nodes: list[str],
    gpus: int = 0,
):
    """The pod of `job` placed on `nodes` (`gpus`: the job's GPUs in all, when it may share one:
    `gpu_resource`)."""
    from kubernetes import client

    product = settings.products.get(model, model)
    mounts, volumes = _volumes(job, settings)
    resource, extra = gpu_resource(job, gpus, settings)
    container = client.V1Container(
        name="trainer",
        image=settings.image,
        command=command,
        env=[client.V1EnvVar(name=k, value=v) for k, v in sorted({**env, **extra}.items())],
        resources=client.V1ResourceRequirements(limits={resource: str(gpus_per_pod)}, requests={resource: str(gpus_per_pod)}),
        volume_mounts=mounts,
        security_context=client.V1SecurityContext(
            allow_privilege_escalation=False, capabilities=client.V1Capabilities(drop=["ALL"])
        ),
    )
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
        node_selector={settings.product_label: product},
        affinity=_affinity(job, model, settings, nodes),
        tolerations=[client.V1Toleration(**t) for t in settings.tolerations],
        volumes=volumes,
    )


def _batch_job(name: str, labels: dict, namespace: str, pod, **spec):
    from kubernetes import client

    return client.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=labels),
        spec=client.V1JobSpec(
            backoff_limit=0,
            ttl_seconds_after_finished=86400,
            template=client.V1PodTemplateSpec(metadata=client.V1ObjectMeta(labels=labels), spec=pod),
            **spec,
        ),
    )


def build_job(job: dict, gpus: list[GpuState], settings):
    """The Kubernetes object for a claimed job: a Job, an indexed Job across nodes, or a PyTorchJob (dict)."""
    name, labels, command = k8s_name(job["id"], job.get("attempts")), _labels(job), json.loads(job["command"])
    env = {**json.loads(job.get("env") or "{}"), "DRAPE_JOB_ID": job["id"]}
    nodes = sorted({g.node for g in gpus})
    per_pod = max(len(gpus) // max(len(nodes), 1), 1)
    model = gpus[0].model if gpus else "unknown"
    if len(nodes) <= 1:
        ranks = per_pod if job_labels(job).get("launch") == "torchrun" else 1
        return _batch_job(
            name,
            labels,
            settings.namespace,
            _pod_spec(job, per_pod, model, settings, torchrun_command(command, ranks), env, nodes, gpus=len(gpus)),
        )
    if settings.training_operator:
        return _pytorchjob(name, labels, job, per_pod, nodes, model, settings, command, env)
    torchrun = [
        "torchrun",
        f"--nnodes={len(nodes)}",
        f"--nproc-per-node={per_pod}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={name}-0.{name}:29500",
        f"--rdzv-id={name}",
    ]
    script = (
        " ".join(shlex.quote(part) for part in torchrun)
        + ' --node-rank="$JOB_COMPLETION_INDEX" '
        + " ".join(shlex.quote(part) for part in module_args(command))
    )
    pod = _pod_spec(job, per_pod, model, settings, ["/bin/sh", "-c", script], env, nodes)
    pod.subdomain = name  # stable DNS for the rendezvous: <name>-<index>.<name>
    return _batch_job(
        name, labels, settings.namespace, pod, completion_mode="Indexed", completions=len(nodes), parallelism=len(nodes)
    )


def headless_service(job_name: str, namespace: str, labels: dict[str, str]):
    """The headless Service an indexed Job's pods resolve each other by."""
    from kubernetes import client

    return client.V1Service(
        api_version="v1",
        kind="Service",
        metadata=client.V1ObjectMeta(name=job_name, namespace=namespace, labels=labels),
        spec=client.V1ServiceSpec(
            cluster_ip="None", selector={"job-name": job_name}, ports=[client.V1ServicePort(name="rdzv", port=29500)]
        ),
    )


def _pytorchjob(name, labels, job, per_pod, nodes: list[str], model, settings, command, env) -> dict:
    from kubernetes import client

    api = client.ApiClient()
    pod = api.sanitize_for_serialization(_pod_spec(job, per_pod, model, settings, command, env, nodes))
    pod["containers"][0]["name"] = "pytorch"

    def replica(count: int) -> dict:
        return {"replicas": count, "restartPolicy": "Never", "template": {"metadata": {"labels": labels}, "spec": pod}}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "spec": {"nprocPerNode": str(per_pod), "pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(len(nodes) - 1)}},
    }


PYTORCHJOBS = ("kubeflow.org", "v1")


def pytorchjob_outcome(body: dict) -> Outcome | None:
    """A PyTorchJob's end from its status conditions (Succeeded / Failed with status True)."""
    conditions = {c.get("type"): c for c in (body.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}
    if "Succeeded" in conditions:
        return Outcome(0)
    if "Failed" in conditions:
        return Outcome(1, f"PyTorchJob {body['metadata']['name']} failed: {conditions['Failed'].get('message', '')}")
    return None


class KubernetesLauncher:
    """Creates the jobs' objects in the cluster of the current kube config; `handle` is
    ``job:<name>`` or ``pytorchjob:<name>``."""

    def __init__(self, settings):
        self.settings = settings
        self._clients: dict | None = None

    def _api(self) -> dict:
        if self._clients is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # read now, not at import
            # built after the config is loaded: a client built before targets localhost
            self._clients = {"batch": client.BatchV1Api(), "core": client.CoreV1Api(), "custom": client.CustomObjectsApi()}
        return self._clients

    def _call(self, api: str, method: str, *args, **kwargs):
        return getattr(self._api()[api], method)(*args, _request_timeout=self.settings.request_timeout_seconds, **kwargs)

    def launch(self, job: dict, gpus: list[GpuState]) -> str:
        from kubernetes.client.exceptions import ApiException

        body, namespace = build_job(job, gpus, self.settings), self.settings.namespace
        try:
            if isinstance(body, dict):
                self._call("custom", "create_namespaced_custom_object", *PYTORCHJOBS, namespace, "pytorchjobs", body)
                return f"pytorchjob:{body['metadata']['name']}"
            if body.spec.completion_mode == "Indexed":
                service = headless_service(body.metadata.name, namespace, body.metadata.labels)
                self._call("core", "create_namespaced_service", namespace, service)
            self._call("batch", "create_namespaced_job", namespace, body)
        except ApiException as error:
            if error.status != 409:  # 409: this attempt's object exists already (created before a restart): it is ours
                raise
        return f"job:{body.metadata.name}" if not isinstance(body, dict) else f"pytorchjob:{body['metadata']['name']}"

    def _read(self, handle: str):
        kind, _, name = handle.partition(":")
        if kind == "pytorchjob":
            return kind, self._call(
                "custom", "get_namespaced_custom_object", *PYTORCHJOBS, self.settings.namespace, "pytorchjobs", name
            )
        return kind, self._call("batch", "read_namespaced_job_status", name, self.settings.namespace)

    def sees(self, handle: str | None) -> bool:
        """Whether the attempt's object exists (a restarted dispatcher adopts it)."""
        from kubernetes.client.exceptions import ApiException

        if not handle or ":" not in handle:
            return False
        try:
            self._read(handle)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return True

    def poll(self, job_id: str, handle: str) -> Outcome | None:
        from kubernetes.client.exceptions import ApiException

        try:
            kind, body = self._read(handle)
        except ApiException as error:
            if error.status == 404:
                return Outcome(-1, f"{handle} is gone from the cluster (deleted, or its TTL passed)")
            raise
        if kind == "pytorchjob":
            return pytorchjob_outcome(body)
        status = body.status
        if status.succeeded and status.succeeded >= (body.spec.completions or 1):
            return Outcome(0)
        if status.failed:
            return Outcome(1, f"Kubernetes {handle} failed")
        return None

    def cancel(self, job_id: str, handle: str) -> None:
        kind, _, name = handle.partition(":")
        if kind == "pytorchjob":
            self._call("custom", "delete_namespaced_custom_object", *PYTORCHJOBS, self.settings.namespace, "pytorchjobs", name)
        else:
            self._call("batch", "delete_namespaced_job", name, self.settings.namespace, propagation_policy="Background")
