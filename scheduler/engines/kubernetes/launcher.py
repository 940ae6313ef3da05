"""The Kubernetes launcher: creates a queue job's objects (`objects.py`), watches them, adopts them after a
dispatcher restart, cancels them, and reads back where their pods landed (node, and devices: from DRA
allocations, or under the device plugin from DCGM, `dcgm.py`). The API clients are built after the
kube config is loaded (in-cluster, else ~/.kube/config), and every call has a request timeout
(`queue.kubernetes.request_timeout_seconds`).
"""

from __future__ import annotations

import os

from scheduler.engines import Landing, Outcome, gpu_index
from scheduler.engines.kubernetes.dcgm import DcgmPods, dcgm_pods, requested_gpus
from scheduler.engines.kubernetes.devices import DRA_GROUP, DRA_VERSION, check_node_sharing
from scheduler.engines.kubernetes.kueue import workload_for
from scheduler.engines.kubernetes.objects import PYTORCHJOBS, build_objects, headless_service, pytorchjob_outcome
from scheduler.engines.kubernetes.pods import (
    describe_object,
    owner_references,
)
from scheduler.engines.reasons import LOG_TAIL_BYTES, failure_message
from scheduler.policy import GpuState

MAX_KUBECONFIG_BYTES = 16 << 20  # embedded certificates for many clusters, and room


def checked_kubeconfig() -> None:
    """Read each kube config file (`KUBECONFIG`'s, else ~/.kube/config) through drape's bounded YAML
    loader first: a YAML bomb or a huge file is refused naming the file, before the client reads it."""
    from pathlib import Path

    import yaml

    from drape.config.reading.loading import YamlBoundError, read_yaml

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
            outcome = pytorchjob_outcome(body)
        else:
            status = body.status
            if status.succeeded and status.succeeded >= (body.spec.completions or 1):
                return Outcome(0)
            outcome = Outcome(1, f"Kubernetes {handle} failed") if status.failed else None
        if outcome is not None and outcome.exit_code:
            outcome.message = failure_message(outcome.message, self._failed_log(kind, handle.partition(":")[2]))
        return outcome

    def _failed_log(self, kind: str, name: str) -> str:
        """The log tail of the job's first failed pod (bounded: `LOG_TAIL_BYTES`), '' when none can be read:
        the trainer's error is the failure's reason (scheduler/engines/reasons.py)."""
        selector = f"training.kubeflow.org/job-name={name}" if kind == "pytorchjob" else f"job-name={name}"
        try:
            pods = self._call("core", "list_namespaced_pod", self.settings.namespace, label_selector=selector).items
            failed = [pod for pod in pods if (pod.status and pod.status.phase) == "Failed"] or pods
            if not failed:
                return ""
            return self._call(
                "core",
                "read_namespaced_pod_log",
                failed[0].metadata.name,
                self.settings.namespace,
                limit_bytes=LOG_TAIL_BYTES,
                tail_lines=400,
            )
        except Exception:  # noqa: BLE001 - no log (RBAC, the pod gone): the engine's own account stands
            return ""

    def cancel(self, job_id: str, handle: str) -> None:
        kind, _, name = handle.partition(":")
        if kind == "pytorchjob":
            self._call("custom", "delete_namespaced_custom_object", *PYTORCHJOBS, self.settings.namespace, "pytorchjobs", name)
        else:
            self._call("batch", "delete_namespaced_job", name, self.settings.namespace, propagation_policy="Background")


def build(config, log_dir) -> KubernetesLauncher:
    return KubernetesLauncher(config.queue.kubernetes, dcgm_pods(config.queue))
