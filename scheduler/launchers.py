"""Launchers start a claimed job on its GPUs and report when it ends.

- `LocalLauncher`: a child process with `CUDA_VISIBLE_DEVICES` set to the assigned devices
  (empty for the CPU slot), `DRAPE_JOB_ID`, and `DRAPE_JOB_RESULT`, a JSON file where the job may
  write its measured peak memory; stdout and stderr go to `<log dir>/<job id>.log`.
- `KubernetesLauncher`: a `batch/v1` Job through the kubernetes client: the GPU product as node
  selector, `nvidia.com/gpu` limits, tolerations, the shard-cache volume, labels carrying job id
  and stage. Multi-node jobs become an indexed Job with torchrun rendezvous across pods (or a
  Kubeflow PyTorchJob with `training_operator`). `build_*` return plain objects that the tests
  validate against the Kubernetes API schema.
- `PrefectLauncher`: a flow run of a deployment on a work pool (`run_deployment`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

from scheduler.policy import GpuState


@dataclass
class Outcome:
    exit_code: int
    message: str = ""
    peak_gib: float | None = None


def device_indices(gpus: list[GpuState]) -> str:
    """`CUDA_VISIBLE_DEVICES` for the assigned GPUs (`<host>/cuda<i>` → i; the CPU slot → '')."""
    indices = [m.group(1) for g in gpus if (m := re.search(r"(?:cuda|gpu)(\d+)$", g.uuid))]
    return ",".join(indices)


class LocalLauncher:
    def __init__(self, log_dir: str | Path):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.children: dict[str, subprocess.Popen] = {}

    def result_path(self, job_id: str) -> Path:
        return self.log_dir / f"{job_id}.result.json"

    def log_path(self, job_id: str) -> Path:
        return self.log_dir / f"{job_id}.log"

    def launch(self, job: dict, gpus: list[GpuState]) -> str:
        env = {
            **os.environ,
            **json.loads(job["env"] or "{}"),
            "CUDA_VISIBLE_DEVICES": device_indices(gpus),
            "DRAPE_JOB_ID": job["id"],
            "DRAPE_JOB_RESULT": str(self.result_path(job["id"])),
        }
        log = open(self.log_path(job["id"]), "ab")
        try:
            child = subprocess.Popen(
                json.loads(job["command"]), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()
        self.children[job["id"]] = child
        return f"pid:{child.pid}"

    def poll(self, job_id: str) -> Outcome | None:
        child = self.children.get(job_id)
        if child is None:
            return Outcome(-1, "the process is not a child of this dispatcher (dispatcher restarted?)")
        code = child.poll()
        if code is None:
            return None
        self.children.pop(job_id)
        peak = None
        result = self.result_path(job_id)
        if result.is_file():
            try:
                peak = json.loads(result.read_text()).get("peak_memory_gib")
            except ValueError:
                peak = None
        tail = self.log_path(job_id).read_text(errors="replace")[-1500:] if code else ""
        return Outcome(code, f"exit code {code}" + (f"; log tail:\n{tail}" if tail else ""), peak)

    def cancel(self, job_id: str) -> None:
        child = self.children.get(job_id)
        if child is not None and child.poll() is None:
            os.killpg(child.pid, signal.SIGTERM)


# --- Kubernetes ---------------------------------------------------------------------------------
def _k8s_name(job_id: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", f"drape-{job_id}".lower())[:63].rstrip("-")


def _labels(job: dict) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/name": "drape",
        "app.kubernetes.io/component": "gpu-job",
        "drape.ai/job-id": _k8s_name(job["id"])[6:],
        "drape.ai/kind": job["kind"],
    }
    if job.get("stage"):
        labels["drape.ai/stage"] = job["stage"]
    return labels


def _pod_spec(job: dict, gpus_per_pod: int, model: str, settings, command: list[str], env: dict[str, str]):
    from kubernetes import client

    product = settings.products.get(model, model)
    container = client.V1Container(
        name="trainer",
        image=settings.image,
        command=command,
        env=[client.V1EnvVar(name=k, value=v) for k, v in sorted(env.items())],
        resources=client.V1ResourceRequirements(
            limits={"nvidia.com/gpu": str(gpus_per_pod)}, requests={"nvidia.com/gpu": str(gpus_per_pod)}
        ),
        volume_mounts=[
            client.V1VolumeMount(name="shard-cache", mount_path="/shard-cache"),
            client.V1VolumeMount(name="dshm", mount_path="/dev/shm"),
        ],
    )
    return client.V1PodSpec(
        restart_policy="Never",
        service_account_name=settings.service_account,
        containers=[container],
        node_selector={settings.product_label: product},
        tolerations=[client.V1Toleration(**t) for t in settings.tolerations],
        volumes=[
            client.V1Volume(
                name="shard-cache",
                host_path=client.V1HostPathVolumeSource(path=settings.shard_cache_host_path, type="DirectoryOrCreate"),
            ),
            client.V1Volume(name="dshm", empty_dir=client.V1EmptyDirVolumeSource(medium="Memory")),
        ],
    )


def build_job(job: dict, gpus: list[GpuState], settings, gpus_per_node: int = 8):
    """The Kubernetes object for a claimed job: a Job, an indexed Job across nodes, or a PyTorchJob (dict)."""
    from kubernetes import client

    name, labels, command = _k8s_name(job["id"]), _labels(job), json.loads(job["command"])
    env = {**json.loads(job["env"] or "{}"), "DRAPE_JOB_ID": job["id"]}
    nodes = sorted({g.node for g in gpus})
    per_pod = max(len(gpus) // max(len(nodes), 1), 1)
    model = gpus[0].model if gpus else "unknown"
    if len(nodes) <= 1:
        pod = _pod_spec(job, per_pod, model, settings, command, env)
        return client.V1Job(
            api_version="batch/v1",
            kind="Job",
            metadata=client.V1ObjectMeta(name=name, namespace=settings.namespace, labels=labels),
            spec=client.V1JobSpec(
                backoff_limit=0,
                ttl_seconds_after_finished=86400,
                template=client.V1PodTemplateSpec(metadata=client.V1ObjectMeta(labels=labels), spec=pod),
            ),
        )
    torchrun = [
        "torchrun",
        f"--nnodes={len(nodes)}",
        f"--nproc-per-node={per_pod}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={name}-0.{name}:29500",
        f"--rdzv-id={name}",
    ]
    if settings.training_operator:
        return _pytorchjob(name, labels, job, per_pod, len(nodes), model, settings, command, env)
    script = (
        " ".join(shlex.quote(part) for part in torchrun)
        + ' --node-rank="$JOB_COMPLETION_INDEX" '
        + " ".join(shlex.quote(part) for part in _module_args(command))
    )
    wrapped = ["/bin/sh", "-c", script]
    pod = _pod_spec(job, per_pod, model, settings, wrapped, env)
    pod.subdomain = name  # stable DNS for the rendezvous: <name>-<index>.<name>
    return client.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=client.V1ObjectMeta(name=name, namespace=settings.namespace, labels=labels),
        spec=client.V1JobSpec(
            completion_mode="Indexed",
            completions=len(nodes),
            parallelism=len(nodes),
            backoff_limit=0,
            ttl_seconds_after_finished=86400,
            template=client.V1PodTemplateSpec(metadata=client.V1ObjectMeta(labels=labels), spec=pod),
        ),
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


def _module_args(command: list[str]) -> list[str]:
    """`python -m mod args` → `-m mod args` for torchrun (which runs its own interpreter)."""
    return command[1:] if command and Path(command[0]).name.startswith("python") else command


def _pytorchjob(name, labels, job, per_pod, nodes, model, settings, command, env) -> dict:
    from kubernetes import client

    api = client.ApiClient()
    pod = api.sanitize_for_serialization(_pod_spec(job, per_pod, model, settings, command, env))
    pod["containers"][0]["name"] = "pytorch"

    def replica(count: int) -> dict:
        return {"replicas": count, "restartPolicy": "Never", "template": {"metadata": {"labels": labels}, "spec": pod}}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "spec": {"nprocPerNode": str(per_pod), "pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(nodes - 1)}},
    }


class KubernetesLauncher:
    """Creates the Jobs in the cluster of the current kube config (in-cluster or ~/.kube/config)."""

    def __init__(self, settings):
        self.settings = settings
        self._batch = None

    def _api(self):
        if self._batch is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            self._batch = client.BatchV1Api()
        return self._batch

    def launch(self, job: dict, gpus: list[GpuState]) -> str:
        body = build_job(job, gpus, self.settings)
        if isinstance(body, dict):
            from kubernetes import client

            client.CustomObjectsApi().create_namespaced_custom_object(
                "kubeflow.org", "v1", self.settings.namespace, "pytorchjobs", body
            )
            return f"pytorchjob:{body['metadata']['name']}"
        if body.spec.completion_mode == "Indexed":
            from kubernetes import client

            client.CoreV1Api().create_namespaced_service(
                self.settings.namespace, headless_service(body.metadata.name, self.settings.namespace, body.metadata.labels)
            )
        self._api().create_namespaced_job(self.settings.namespace, body)
        return f"job:{body.metadata.name}"

    def poll(self, job_id: str) -> Outcome | None:
        status = self._api().read_namespaced_job_status(_k8s_name(job_id), self.settings.namespace).status
        if status.succeeded:
            return Outcome(0)
        if status.failed:
            return Outcome(1, f"Kubernetes Job {_k8s_name(job_id)} failed")
        return None

    def cancel(self, job_id: str) -> None:
        self._api().delete_namespaced_job(_k8s_name(job_id), self.settings.namespace, propagation_policy="Background")


class PrefectLauncher:
    """Runs the job as a flow run of deployment ``labels['deployment']`` with ``labels['parameters']``."""

    def __init__(self):
        self.runs: dict[str, str] = {}

    def launch(self, job: dict, gpus: list[GpuState]) -> str:
        from prefect.deployments import run_deployment

        labels = json.loads(job["labels"] or "{}")
        if "deployment" not in labels:
            raise ValueError(f"job {job['id']}: the prefect launcher needs labels.deployment ('<flow>/<deployment>')")
        run = run_deployment(
            labels["deployment"],
            parameters=json.loads(labels.get("parameters", "{}")),
            timeout=0,
            job_variables={"env": {"CUDA_VISIBLE_DEVICES": device_indices(gpus), "DRAPE_JOB_ID": job["id"]}},
        )
        run_id = str(run.id)  # type: ignore[union-attr]  # run_deployment is sync outside an event loop
        self.runs[job["id"]] = run_id
        return f"flow-run:{run_id}"

    def poll(self, job_id: str) -> Outcome | None:
        from prefect import get_client

        with get_client(sync_client=True) as client:
            state = client.read_flow_run(UUID(self.runs[job_id])).state
        if state is None or not state.is_final():
            return None
        return Outcome(0 if state.is_completed() else 1, f"flow run {state.name}")

    def cancel(self, job_id: str) -> None:
        from prefect import get_client
        from prefect.states import Cancelling

        with get_client(sync_client=True) as client:
            client.set_flow_run_state(self.runs[job_id], Cancelling())


def build_launcher(config, log_dir: str | Path):
    kind = config.queue.launcher
    if kind == "kubernetes":
        return KubernetesLauncher(config.queue.kubernetes)
    if kind == "prefect":
        return PrefectLauncher()
    return LocalLauncher(log_dir)
