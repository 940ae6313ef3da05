"""Queue jobs as Kubernetes objects, and the launcher that creates, watches and adopts them.

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
CPU and memory, /dev/shm and mounts are `scheduler/kubernetes_pods.py`'s. Each attempt has its own
name (``drape-<job id>-a<attempt>``): a retry never collides with the objects of the attempt
before it (409), and a restarted dispatcher adopts a Job by the name the queue recorded.

How the GPUs the queue chose reach the pods (node affinity, whole or shared GPUs, DRA claims, and
the launches refused because Kubernetes would change the plan) is `scheduler/kubernetes_devices.py`;
`landed` reads back where the pods run, for the dispatcher's drift check (`scheduler/drift.py`; the
devices under the device plugin from DCGM's pod labels, `scheduler/dcgm_pods.py`).

`build_job` returns plain objects that the tests validate against the Kubernetes API schema.
The API clients are built after the kube config is loaded (in-cluster, else ~/.kube/config),
and every call has a request timeout (`queue.kubernetes.request_timeout_seconds`).
"""

from __future__ import annotations

import json
import os
import shlex
from typing import Any

from scheduler.dcgm_pods import DcgmPods, dcgm_pods, requested_gpus
from scheduler.drift import Landing
from scheduler.engine import Outcome, torchrun_program
from scheduler.kubernetes_devices import DRA_GROUP, DRA_VERSION, WHOLE_GPU, Binding, bind, check_node_sharing, gpu_index
from scheduler.kubernetes_pods import Placement, describe_object, job_labels, k8s_name, owner_references, pod_labels, pod_spec
from scheduler.kueue import workload_for
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
    # Kueue mode: Kueue admits and kube-scheduler places; the GPUs are sized, never named (scheduler/kueue.py)
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
    BindingError when the cluster cannot be told the queue's plan (scheduler/kubernetes_devices.py)."""
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


MAX_KUBECONFIG_BYTES = 16 << 20  # embedded certificates for many clusters, and room


def checked_kubeconfig() -> None:
    """Read each kube config file (`KUBECONFIG`'s, else ~/.kube/config) through drape's bounded YAML
    loader first: a YAML bomb or a huge file is refused naming the file, before the client reads it."""
    from pathlib import Path

    import yaml

    from drape.config.loading import YamlBoundError, read_yaml

    for name in (os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")).split(os.pathsep):
        if name and Path(name).is_file():
            try:
                read_yaml(Path(name), max_bytes=MAX_KUBECONFIG_BYTES)
            except YamlBoundError as error:
                raise ValueError(f"kube config {name}: {error}") from None
            except yaml.YAMLError as error:
                raise ValueError(f"kube config {name}: not YAML ({str(error).splitlines()[0]})") from None


class KubernetesLauncher:
    """Creates the jobs' objects in the cluster of the current kube config; `handle` is
    ``job:<name>`` or ``pytorchjob:<name>``."""

    def __init__(self, settings, dcgm: DcgmPods | None = None):
        self.settings, self.dcgm = settings, dcgm  # dcgm: the device plugin's device choice, read from DCGM
        self._clients: dict | None = None

    def _api(self) -> dict:
        if self._clients is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                checked_kubeconfig()  # the client's own loader expands aliases without a bound
                config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # read now, not at import
            # built after the config is loaded: a client built before targets localhost
            self._clients = {"batch": client.BatchV1Api(), "core": client.CoreV1Api(), "custom": client.CustomObjectsApi()}
        return self._clients

    def _call(self, api: str, method: str, *args, **kwargs):
        return getattr(self._api()[api], method)(*args, _request_timeout=self.settings.request_timeout_seconds, **kwargs)

    def launch(self, job: dict, gpus: list[GpuState]) -> str:
        from kubernetes.client.exceptions import ApiException

        body, claims = build_objects(job, gpus, self.settings)
        namespace = self.settings.namespace
        check_node_sharing(sorted({g.node for g in gpus}), self.settings, self._node_labels)
        if self.settings.kueue_queue:
            body = workload_for(body, gpus, self.settings)
        kind, name, labels, indexed = describe_object(body)
        for claim in claims:
            if claim["metadata"]["name"] != name:  # a shared GPU's claim: made by the first job on it, used by all
                self._create_claim(claim)
        try:
            if kind == "pytorchjob":
                created = self._call("custom", "create_namespaced_custom_object", *PYTORCHJOBS, namespace, "pytorchjobs", body)
            else:
                created = self._call("batch", "create_namespaced_job", namespace, body)
        except ApiException as error:
            if error.status != 409:  # 409: this attempt's object exists already (created before a restart): it is ours
                raise
            created = self._read(f"{kind}:{name}")[1]
        owner = owner_references(kind, name, created)
        if indexed:  # owned by the Job: deleted with it (cancel, or its TTL after it finished)
            plain = {k: v for k, v in labels.items() if "kueue.x-k8s.io" not in k}
            self._create_service(headless_service(name, namespace, plain, owner), f"{kind}:{name}")
        for claim in claims:
            if claim["metadata"]["name"] == name:  # the job's own claim (or template): collected with its Job
                self._create_claim({**claim, "metadata": {**claim["metadata"], **({"ownerReferences": owner} if owner else {})}})
        return f"{kind}:{name}"

    def _node_labels(self, node: str) -> dict[str, str] | None:
        """The labels of the one node whose `node_label` is `node`; None if not one, or nodes may not be listed."""
        from kubernetes.client.exceptions import ApiException

        try:
            found = self._call("core", "list_node", label_selector=f"{self.settings.node_label}={node}").items
        except ApiException as error:
            if error.status in (401, 403):
                return None
            raise
        return dict(found[0].metadata.labels or {}) if len(found) == 1 else None

    def _create_service(self, service, handle: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._call("core", "create_namespaced_service", self.settings.namespace, service)
        except ApiException as error:
            if error.status != 409:  # without its Service the pods cannot find each other: take the Job back
                self.cancel("", handle)
                raise

    def _create_claim(self, claim: dict) -> None:
        from kubernetes.client.exceptions import ApiException

        plural = "resourceclaims" if claim["kind"] == "ResourceClaim" else "resourceclaimtemplates"
        try:
            self._call(
                "custom", "create_namespaced_custom_object", DRA_GROUP, DRA_VERSION, self.settings.namespace, plural, claim
            )
        except ApiException as error:
            if error.status != 409:  # 409: the claim exists (a shared GPU's, or this attempt's before a restart)
                raise

    def landed(self, handle: str) -> list[Landing] | None:
        """Where the attempt's pods run, read from the API after binding: each pod's `spec.nodeName`, and
        its devices (its DRA claim's, or DCGM's under the device plugin); None while a pod is unbound or DCGM late."""
        kind, _, name = handle.partition(":")
        selector = f"training.kubeflow.org/job-name={name}" if kind == "pytorchjob" else f"job-name={name}"
        pods = self._call("core", "list_namespaced_pod", self.settings.namespace, label_selector=selector).items
        if not pods or any(not pod.spec.node_name for pod in pods):
            return None
        landings = [Landing(pod.spec.node_name, self._allocated(pod)) for pod in pods]
        if self.dcgm is None or any(landing.devices is not None for landing in landings):
            return landings
        return self.dcgm.landings(handle, [(pod.metadata.name, pod.spec.node_name, requested_gpus(pod)) for pod in pods])

    def _allocated(self, pod) -> tuple[int, ...] | None:
        """The device indices a pod's DRA claim was allocated (status.allocation.devices.results), None without DRA."""
        if not self.settings.dra_device_class or not pod.spec.resource_claims:
            return None
        generated = {
            s.name: s.resource_claim_name
            for s in ((pod.status and pod.status.resource_claim_statuses) or [])
            if s.resource_claim_name
        }
        ref = pod.spec.resource_claims[0]
        claim_name = ref.resource_claim_name or generated.get(ref.name)
        if not claim_name:
            return None
        namespace = self.settings.namespace
        claim = self._call(
            "custom", "get_namespaced_custom_object", DRA_GROUP, DRA_VERSION, namespace, "resourceclaims", claim_name
        )
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
        indices = [gpu_index(str(result.get("device", "")).replace("-", "")) for result in results]
        return tuple(sorted(i for i in indices if i is not None)) if results and None not in indices else None

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


def build(config, log_dir) -> KubernetesLauncher:
    return KubernetesLauncher(config.queue.kubernetes, dcgm_pods(config.queue))
