"""Queue jobs as Kubernetes objects (the launcher that creates, watches and adopts them: `launcher.py`).

Three shapes, each started by torchrun with an explicit c10d rendezvous (no variable an
operator may or may not set is read):

- One node: a `batch/v1` Job. A torchrun job (`labels.launch`) on N > 1 GPUs runs
  ``torchrun --nnodes=1 --nproc-per-node=N --rdzv-backend=c10d --rdzv-endpoint=localhost:29500``
  (the pod has its own network namespace: the port never collides); other jobs run as they are.
- Several nodes, an indexed Job (one pod per node) with a headless Service: every pod runs
  ``torchrun --nnodes=<nodes> --nproc-per-node=<GPUs per pod> --rdzv-endpoint=<name>-0.<name>:29500
  --rdzv-id=<name>``; the pod's `JOB_COMPLETION_INDEX` (set by the Job controller) decides only
  that pod 0 hosts the rendezvous store (`is_host`).
- Several nodes with `queue.kubernetes.training_operator`: a Kubeflow PyTorchJob whose Master runs
  the same torchrun as pod 0 (`is_host=1`, endpoint ``<name>-master-0:29500``, the Service the
  operator creates for the Master from its `pytorchjob-port`) and whose Workers join it
  (`is_host=0`). The operator's MASTER_ADDR, RANK, WORLD_SIZE and PET_* are not relied on:
  torchrun's flags are explicit and torchrun sets each rank's own.

c10d numbers the nodes as they join (torchrun ignores ``--node-rank`` for it), and each rank gets
RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT from torchrun. A pod's credentials,
CPU and memory, /dev/shm and mounts are `scheduler/engines/kubernetes/pods.py`'s. Each attempt has its own
name (``drape-<job id>-a<attempt>``): a retry never collides with the objects of the attempt
before it (409), and a restarted dispatcher adopts a Job by the name the queue recorded.

How the GPUs the queue chose reach the pods (node affinity, whole or shared GPUs, DRA claims, and
the launches refused because Kubernetes would change the plan) is `scheduler/engines/kubernetes/devices.py`;
`landed` reads back where the pods run, for the dispatcher's drift check (`scheduler/dispatch/drift.py`; the
devices under the device plugin from DCGM's pod labels, `scheduler/engines/kubernetes/dcgm.py`).

`build_job` returns plain objects that the tests validate against the Kubernetes API schema.
The API clients are built after the kube config is loaded (in-cluster, else ~/.kube/config),
and every call has a request timeout (`queue.kubernetes.request_timeout_seconds`).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from drape.config import names
from scheduler.engines import Outcome, torchrun_program
from scheduler.engines.kubernetes.devices import WHOLE_GPU, Binding, bind
from scheduler.engines.kubernetes.pods import (
    Placement,
    job_labels,
    k8s_name,
    pod_labels,
    pod_spec,
)
from scheduler.policy import GpuState

RDZV_PORT = 29500
INDEX = "${JOB_COMPLETION_INDEX:?not a pod of an indexed Job}"  # a pod of an indexed Job always has it


def torchrun_args(nnodes: int, nproc: int, endpoint: str, rdzv_id: str) -> list[str]:
    """torchrun with a c10d rendezvous at `endpoint` (host:port), `nnodes` nodes of `nproc` ranks each."""
    return [
        "torchrun",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rdzv_id}",
    ]


def rendezvous_conf(is_host: str, timeout_s: int) -> str:
    """``--rdzv-conf``: whether this node hosts the rendezvous store ("1"/"0", or a shell expression),
    and how long a node waits for the others (a pod on a fresh node pulls its image first)."""
    return f"--rdzv-conf=is_host={is_host},join_timeout={timeout_s},read_timeout={timeout_s}"


def _single_node_command(command: list[str], name: str, ranks: int, settings) -> list[str]:
    if ranks <= 1:
        return command
    args = torchrun_args(1, ranks, f"localhost:{RDZV_PORT}", name)
    return [*args, rendezvous_conf("1", settings.rendezvous_timeout_seconds), *torchrun_program(command)]


def _indexed_script(command: list[str], name: str, nodes: int, per_pod: int, settings) -> list[str]:
    """The indexed Job's container command: a shell that makes pod 0 the rendezvous host, then
    execs torchrun (PID 1 then, so a deletion's SIGTERM reaches the ranks)."""
    fixed = torchrun_args(nodes, per_pod, f"{name}-0.{name}:{RDZV_PORT}", name)
    conf = rendezvous_conf(f"$(({INDEX} == 0))", settings.rendezvous_timeout_seconds)
    quoted = [shlex.quote(part) for part in fixed] + [f'"{conf}"'] + [shlex.quote(part) for part in torchrun_program(command)]
    return ["/bin/sh", "-c", "exec " + " ".join(quoted)]


def _placement(job: dict, gpus: list[GpuState], settings, name: str) -> Placement:
    nodes = sorted({g.node for g in gpus})
    per_pod = max(len(gpus) // max(len(nodes), 1), 1)
    model, total = (gpus[0].model, gpus[0].total_gib) if gpus else ("unknown", 0.0)
    # Kueue mode: Kueue admits and kube-scheduler places; the GPUs are sized, never named (scheduler/engines/kubernetes/kueue.py)
    binding = Binding(WHOLE_GPU) if settings.kueue_queue else bind(job, gpus, settings, name)
    return Placement(nodes=nodes, gpus_per_pod=per_pod, model=model, gpu_total_gib=total, gpus=len(gpus), binding=binding)


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
    return build_objects(job, gpus, settings)[0]


def build_objects(job: dict, gpus: list[GpuState], settings) -> tuple[Any, tuple[dict, ...]]:
    """(the job's object as `build_job` gives it, the DRA claims or claim templates its pods reference);
    BindingError when the cluster cannot be told the queue's plan (scheduler/engines/kubernetes/devices.py),
    NameRefused when a name in them (namespace, label, node) is not in Kubernetes' grammar (drape.config.names)."""
    from kubernetes import client

    body, claims = _objects(job, gpus, settings)
    for item in (body, *claims):
        names.kubernetes_object(item if isinstance(item, dict) else client.ApiClient().sanitize_for_serialization(item))
    return body, claims


def _objects(job: dict, gpus: list[GpuState], settings) -> tuple[Any, tuple[dict, ...]]:
    name, labels, command = k8s_name(job["id"], job.get("attempts")), pod_labels(job), json.loads(job["command"])
    env = {**json.loads(job.get("env") or "{}"), "DRAPE_JOB_ID": job["id"]}
    placement = _placement(job, gpus, settings, name)
    claims = placement.binding.objects
    if len(placement.nodes) <= 1:
        ranks = placement.gpus_per_pod if job_labels(job).get("launch") == "torchrun" else 1
        pod = pod_spec(job, placement, settings, _single_node_command(command, name, ranks, settings), env)
        return _batch_job(name, labels, settings.namespace, pod), claims
    if settings.training_operator:
        return _pytorchjob(name, labels, job, placement, settings, command, env), claims
    script = _indexed_script(command, name, len(placement.nodes), placement.gpus_per_pod, settings)
    pod = pod_spec(job, placement, settings, script, env, ports=(("rdzv", RDZV_PORT),))
    pod.subdomain = name  # stable DNS for the rendezvous: <name>-<index>.<name>
    count = len(placement.nodes)
    indexed = _batch_job(name, labels, settings.namespace, pod, completion_mode="Indexed", completions=count, parallelism=count)
    return indexed, claims


def headless_service(job_name: str, namespace: str, labels: dict[str, str], owner: list[dict] | None = None):
    """The headless Service an indexed Job's pods resolve each other by; it publishes a pod's address
    before it is ready, so pod 0's name resolves as soon as it has one. `owner`: the Job's
    ownerReferences, so the Service is collected with its Job."""
    from kubernetes import client

    return client.V1Service(
        api_version="v1",
        kind="Service",
        metadata=client.V1ObjectMeta(
            name=job_name,
            namespace=namespace,
            labels=labels,
            owner_references=[
                client.V1OwnerReference(api_version=o["apiVersion"], kind=o["kind"], name=o["name"], uid=o["uid"])
                for o in owner or ()
            ]
            or None,
        ),
        spec=client.V1ServiceSpec(
            cluster_ip="None",
            publish_not_ready_addresses=True,
            selector={"job-name": job_name},
            ports=[client.V1ServicePort(name="rdzv", port=RDZV_PORT)],
        ),
    )


def _pytorchjob(name: str, labels: dict, job: dict, placement: Placement, settings, command: list[str], env) -> dict:
    """A PyTorchJob: the Master hosts the rendezvous at the Service the operator gives it
    (``<name>-master-0``, port from the container's `pytorchjob-port`), the Workers join it."""
    from kubernetes import client

    api, nodes, per_pod = client.ApiClient(), len(placement.nodes), placement.gpus_per_pod
    fixed = torchrun_args(nodes, per_pod, f"{name}-master-0:{RDZV_PORT}", name)

    def replica(count: int, is_host: str) -> dict:
        run = [*fixed, rendezvous_conf(is_host, settings.rendezvous_timeout_seconds), *torchrun_program(command)]
        pod = api.sanitize_for_serialization(
            pod_spec(job, placement, settings, run, env, ports=(("pytorchjob-port", RDZV_PORT),))
        )
        pod["containers"][0]["name"] = "pytorch"  # the operator's name for the training container
        return {"replicas": count, "restartPolicy": "Never", "template": {"metadata": {"labels": labels}, "spec": pod}}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "spec": {
            "nprocPerNode": str(per_pod),
            "pytorchReplicaSpecs": {"Master": replica(1, "1"), "Worker": replica(nodes - 1, "0")},
        },
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
