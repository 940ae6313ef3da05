"""Which GPUs a pod holds under the NVIDIA device plugin, read from the DCGM exporter's pod labels in Prometheus.

With the device plugin the plugin, not drape, picks a pod's devices, and the pod's API object does not
say which. The NVIDIA dcgm-exporter does: with ``DCGM_EXPORTER_KUBERNETES=true`` (the GPU Operator's
default) it asks the kubelet's pod-resources API which pod uses each GPU and labels that GPU's series
with `pod`, `namespace` and `container`. Scraped through a Kubernetes service discovery with
``honor_labels: false``, those clash with the target's own labels and arrive as `exported_pod`,
`exported_namespace`, `exported_container` (then `pod` is the exporter's own pod): both are read, the
`exported_` ones first.

`DcgmPods.landings` asks Prometheus once per check (`pod_query`: one instant query for the job's
namespace, a bounded timeout, no retries) and answers one `Landing` per pod with the GPU indices (and
UUIDs) DCGM reports. The labels appear only at the first scrape after the pod starts, and are sometimes
missing for a while (NVIDIA/dcgm-exporter#342): until every pod is reported with as many GPUs as it
requested, it answers None (the dispatcher asks again, `drift.RECHECK_S` later), for at most `WAIT_S`
after it first saw the pods bound; then the node-only landing (devices unknown), as without DCGM. A
failed query counts as "not reported yet" and is not repeated for `QUIET_AFTER_FAILURE_S`, so a hanging
Prometheus costs the dispatcher one timeout that often, however many jobs wait.

Prometheus' answer is input: a series whose `gpu` index is not a small non-negative integer, or whose
`Hostname` is not the node the pod is bound to, is ignored, with a line saying which and why.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from scheduler.engines import Landing

POD_SERIES = "DCGM_FI_DEV_FB_USED"  # one series per GPU, always exported
WAIT_S = 120.0  # how long after a job's pods are first seen bound DCGM may take to report them
QUERY_TIMEOUT_S = 3.0
QUIET_AFTER_FAILURE_S = 5.0  # a failed query is not repeated sooner: a hanging Prometheus costs one timeout per 5 s
MAX_GPU_INDEX = 63  # NVML indices of one node; anything larger is not a GPU index
DEFAULT_PROMETHEUS = "http://127.0.0.1:9090"  # the fleet source's default (scheduler/dispatch/fleet.py)
GPU_RESOURCE_PREFIX = "nvidia.com/gpu"  # nvidia.com/gpu, and nvidia.com/gpu.shared under sharing
_INDEX = re.compile(r"[0-9]{1,2}")
_UUID = re.compile(r"GPU-[0-9a-fA-F-]{8,64}")


@dataclass(frozen=True)
class PodGpus:
    """The GPUs DCGM reports one pod holds: their indices on its node, and their UUIDs where every one has a valid one."""

    indices: tuple[int, ...]
    uuids: tuple[str, ...] | None


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def pod_query(namespace: str) -> str:
    """The instant query for the GPU series of the pods in `namespace` (labelled directly or as exported_)."""
    quoted = _label(namespace)
    return f'{POD_SERIES}{{namespace="{quoted}"}} or {POD_SERIES}{{exported_namespace="{quoted}"}}'


def _owner(labels: dict) -> tuple[str, str]:
    """(namespace, pod) of the workload on a GPU: the exported_ labels when Prometheus renamed the exporter's."""
    if labels.get("exported_pod"):
        return str(labels.get("exported_namespace", "")), str(labels["exported_pod"])
    return str(labels.get("namespace", "")), str(labels.get("pod", ""))


def _index(text) -> int | None:
    if not isinstance(text, str) or not _INDEX.fullmatch(text) or int(text) > MAX_GPU_INDEX:
        return None
    return int(text)


def _series_gpu(labels: dict, namespace: str, pods: dict[str, str], log) -> tuple[str, int, str | None] | None:
    """(pod, GPU index, UUID or None) of one series of one of `pods` in `namespace`; None for another's or a bad one (logged)."""
    owner_namespace, pod = _owner(labels)
    if owner_namespace != namespace or pod not in pods:
        return None
    index, host, uuid = _index(labels.get("gpu")), labels.get("Hostname"), labels.get("UUID")
    where = f"queue: DCGM series of pod {namespace}/{pod}"
    if index is None:
        log(f"{where}: gpu={str(labels.get('gpu'))[:40]!r} is not a GPU index 0-{MAX_GPU_INDEX}; ignored")
        return None
    if host and host != pods[pod]:
        log(f"{where}: Hostname {str(host)[:80]!r}, but the pod is bound to node {pods[pod]}; ignored")
        return None
    return pod, index, uuid if isinstance(uuid, str) and _UUID.fullmatch(uuid) else None


def pod_gpus(samples, namespace: str, pods: dict[str, str], log: Callable[[str], None] = print) -> dict[str, PodGpus]:
    """The GPUs of each of `pods` (name → the node it is bound to) in `namespace` that DCGM reports in `samples`
    (Prometheus' instant-query result); a pod absent from the answer is absent here. Bad series are logged and skipped."""
    found: dict[str, dict[int, str | None]] = {}
    for sample in samples if isinstance(samples, list) else []:
        labels = sample.get("metric") if isinstance(sample, dict) else None
        seen = _series_gpu(labels, namespace, pods, log) if isinstance(labels, dict) else None
        if seen is not None:
            found.setdefault(seen[0], {})[seen[1]] = seen[2]
    return {pod: PodGpus(tuple(sorted(gpus)), _uuids(gpus)) for pod, gpus in found.items()}


def _uuids(gpus: dict[int, str | None]) -> tuple[str, ...] | None:
    named = [gpus[index] for index in sorted(gpus)]
    return tuple(uuid for uuid in named if uuid) if all(named) else None


def requested_gpus(pod) -> int:
    """How many GPUs a pod's containers ask the device plugin for (`nvidia.com/gpu*` limits); 0 if not readable."""
    total = 0
    for container in (pod.spec.containers if pod.spec else None) or []:
        limits = (container.resources.limits if container.resources else None) or {}
        for name, value in limits.items():
            if str(name).startswith(GPU_RESOURCE_PREFIX) and str(value).isascii() and str(value).isdigit():
                total += int(value)
    return total


def _complete(gpus: PodGpus, wanted: int) -> bool:
    """Whether DCGM reports as many GPUs as the pod requested (any, where the request is unknown)."""
    return len(gpus.indices) == wanted if wanted else bool(gpus.indices)


def _prometheus_query(url: str, timeout_s: float) -> Callable[[str], list]:
    from prometheus_api_client import PrometheusConnect
    from urllib3.util.retry import Retry

    client = PrometheusConnect(url=url, disable_ssl=True, timeout=timeout_s, retry=Retry(total=0))
    return client.custom_query


class DcgmPods:
    """The devices of a job's pods, from DCGM's pod labels, waiting up to `wait_s` (by `clock`) for them to appear."""

    def __init__(self, query: Callable[[str], list], namespace: str, wait_s: float = WAIT_S, clock=time.monotonic):
        self.query, self.namespace, self.wait_s, self.clock = query, namespace, wait_s, clock
        self.first_seen: dict[str, float] = {}  # handle → when its pods were first seen bound
        self.failed_at = -float("inf")  # when the last query failed

    def landings(self, handle: str, pods: list[tuple[str, str, int]]) -> list[Landing] | None:
        """One Landing per pod (name, node, GPUs requested or 0 if unknown) with the devices DCGM reports;
        None while DCGM has not reported them all and `wait_s` has not passed; then node-only landings."""
        now = self.clock()
        for stale in [h for h, at in self.first_seen.items() if now - at > 2 * self.wait_s]:
            del self.first_seen[stale]  # a job that ended while waiting
        first = self.first_seen.setdefault(handle, now)
        samples = self._samples(handle, now)
        reported = pod_gpus(samples, self.namespace, {name: node for name, node, _ in pods})
        known = {name: reported[name] for name, _, wanted in pods if name in reported and _complete(reported[name], wanted)}
        if len(known) < len(pods) and now - first < self.wait_s:
            return None
        del self.first_seen[handle]
        if len(known) < len(pods):
            late = ", ".join(sorted(name for name, _, _ in pods if name not in known))
            print(
                f"queue: DCGM did not report all GPUs of {handle}'s pods ({late}) within {self.wait_s:g} s; their devices unknown"
            )
        return [
            Landing(node, known[name].indices, known[name].uuids) if name in known else Landing(node) for name, node, _ in pods
        ]

    def _samples(self, handle: str, now: float) -> list:
        """Prometheus' answer to `pod_query`; [] (not reported yet) when it fails, or failed less than
        `QUIET_AFTER_FAILURE_S` ago."""
        if now - self.failed_at < QUIET_AFTER_FAILURE_S:
            return []
        try:
            return self.query(pod_query(self.namespace))
        except Exception as error:  # noqa: BLE001 - unreachable, refused, a bad answer: DCGM is silent this time
            self.failed_at = now
            print(f"queue: DCGM pod labels for {handle} unavailable ({type(error).__name__}: {str(error)[:200]})")
            return []


def dcgm_pods(queue) -> DcgmPods | None:
    """The DCGM pod reader for `queue` (the config's queue section): where Prometheus is the fleet source or
    `prometheus_url` is set; None otherwise (devices stay unknown under the device plugin, as before)."""
    if not queue.prometheus_url and queue.fleet != "prometheus":
        return None
    return DcgmPods(_prometheus_query(queue.prometheus_url or DEFAULT_PROMETHEUS, QUERY_TIMEOUT_S), queue.kubernetes.namespace)
