"""How a queue job's GPUs reach its pods on Kubernetes: the binding rule, written once.

drape's queue decides the node, the GPU count and whether a GPU is shared; Kubernetes is told exactly
that, or the launch is refused with why (never a silent change of plan):

- the node: required node affinity on `queue.kubernetes.node_label` (kubernetes.io/hostname by
  default), in scheduler/engines/kubernetes/pods.py;
- the GPUs, with the device plugin (`dra_device_class` unset): their count as `nvidia.com/gpu`, the
  device plugin picks which ones. A job that shares a GPU requests the node's shared resource
  (`nvidia.com/gpu.shared` under time-slicing or MPS with renameByDefault), only on a node the
  config declares as sharing (`sharing`, `node_sharing`). A job the queue put beside another on a
  node that does not share, or a job planned to run alone (an exclusive or multi-GPU job) on a node
  whose GPUs are offered only as shares, is refused: launched anyway, the first would silently get
  a GPU of its own, the second would silently share (or never be scheduled);
- the GPUs, with Dynamic Resource Allocation (`dra_device_class` set, resource.k8s.io/v1, GA in
  Kubernetes 1.34): a ResourceClaim whose selector names the very devices the queue chose (their
  index, or their UUID where the fleet knows it), so the devices are drape's decision too. A job
  planned to run alone gets a claim of its own (owned by its Job, collected with it); jobs that
  share a GPU reference one claim named for that GPU, which Kubernetes allows several pods to use.
  A job across nodes gets a ResourceClaimTemplate (one claim per pod): the same device indices on
  every node, or the launch is refused.

`validate_claim` checks a rendered claim against a schema of the fields drape writes, from the
resource.k8s.io/v1 API reference (`CLAIM_SCHEMAS`); the tests check them against Kubernetes' own.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from scheduler.engines import gpu_index
from scheduler.policy import GpuState

DRA_API = "resource.k8s.io/v1"
DRA_GROUP, DRA_VERSION = "resource.k8s.io", "v1"
CLAIM_NAME = "gpus"  # the pod's name for its claim (spec.resourceClaims[].name, resources.claims[].name)
WHOLE_GPU = "nvidia.com/gpu"
SHARING_LABEL = "nvidia.com/gpu.sharing-strategy"  # GPU Feature Discovery: none | time-slicing | mps
_DCGM_UUID = re.compile(r"^GPU-[0-9a-fA-F-]{8,}$")


class BindingError(ValueError):
    """A placement Kubernetes cannot be told as the queue made it; the message says why and what to change."""


@dataclass(frozen=True)
class Binding:
    """How a pod of the job asks for its GPUs: an extended resource (`resource`, count per pod), or a DRA
    claim (`claim_ref`: the pod's resourceClaims entry; `objects`: the claim or template to create)."""

    resource: str | None
    env: dict[str, str] = field(default_factory=dict)
    claim_ref: dict[str, str] | None = None
    objects: tuple[dict[str, Any], ...] = ()
    shared: bool = False


def _shares_gpu(job: dict, gpus: list[GpuState]) -> bool:
    """Whether the queue may put (or put) another job on this job's GPU: a single-GPU job that did not ask to run alone."""
    from scheduler.queue.schema import scheduling_of

    return len(gpus) == 1 and not scheduling_of(job.get("labels")).exclusive


def bind(job: dict, gpus: list[GpuState], settings, name: str) -> Binding:
    """The binding of `job` placed on `gpus` under `settings` (queue.kubernetes); `name` is the
    attempt's object name. BindingError when the cluster cannot be told the plan (see the module)."""
    if settings.dra_device_class:
        return _dra_binding(job, gpus, settings, name)
    nodes = sorted({g.node for g in gpus})
    shared = _shares_gpu(job, gpus)
    for node in nodes:
        how = settings.sharing_on(node)
        if shared and how == "none" and any(g.jobs > 0 for g in gpus):
            raise BindingError(
                f"job {job['id']}: the queue put it beside another job on GPU {gpus[0].uuid}, but node {node} declares "
                "no GPU sharing (queue.kubernetes.sharing / node_sharing: none): Kubernetes would give it a GPU of its "
                "own the queue's books do not know; declare time-slicing or mps for the node, or dra_device_class"
            )
        if not shared and how != "none":
            raise BindingError(
                f"job {job['id']}: planned to run alone on {len(gpus)} GPU(s), but node {node}'s GPUs are offered "
                f"only as shares ({how}, {settings.shared_resource_name()}): it would share them or never be "
                "scheduled; keep whole-GPU nodes out of node_sharing, or claim devices with dra_device_class"
            )
    if shared and settings.sharing_on(nodes[0]) != "none":
        return Binding(settings.shared_resource_name(), _mps_env(job, settings.sharing_on(nodes[0])), shared=True)
    return Binding(WHOLE_GPU)


def check_node_sharing(nodes: list[str], settings, labels_of: Callable[[str], dict[str, str] | None]) -> None:
    """Refuse a launch onto a node that says its GPUs are shared otherwise than drape declares.

    NVIDIA's GPU Feature Discovery labels each GPU node `nvidia.com/gpu.sharing-strategy` (none,
    time-slicing or mps): how its device plugin offers the GPUs. The queue planned on the
    declaration (`sharing`, `node_sharing`); launched where the node disagrees, a job planned to
    share would get a GPU of its own (or the reverse). A node without the label, or labels drape
    may not read (`labels_of` gives None), is taken at the declaration's word. Not checked under
    DRA claims, in Kueue mode (drape pins no node) or without a `node_label`."""
    if settings.dra_device_class or settings.kueue_queue or not settings.node_label:
        return
    for node in nodes:
        said = (labels_of(node) or {}).get(SHARING_LABEL)
        if said is not None and said != settings.sharing_on(node):
            raise BindingError(
                f"node {node} says its GPUs are shared by {said!r} ({SHARING_LABEL}), but drape declares "
                f"{settings.sharing_on(node)!r} (queue.kubernetes.sharing / node_sharing), which the queue planned on: "
                f"declare node_sharing {{{node}: {said}}} (or fix the device plugin's config on the node)"
            )


def _mps_env(job: dict, how: str) -> dict[str, str]:
    """Under MPS, a declared compute share as MPS's thread percentage (time-slicing has no such knob)."""
    from scheduler.queue.schema import scheduling_of

    share = scheduling_of(job.get("labels")).share
    if how != "mps" or share >= 1:
        return {}
    return {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, round(100 * share)))}


def shared_claim_name(gpu: GpuState) -> str:
    """The one claim every job sharing `gpu` references: drape-gpu-<node>-<index or uuid>, DNS-1123."""
    index = gpu_index(gpu.uuid)
    tail = f"{gpu.node}-{index}" if index is not None else gpu.uuid
    name = re.sub(r"[^a-z0-9-]", "-", f"drape-gpu-{tail}".lower())
    return re.sub(r"-+", "-", name)[:63].rstrip("-")


def _selector(gpus: list[GpuState], driver: str) -> str:
    """A CEL expression true for exactly the devices the queue chose (on the node the pod's affinity pins)."""
    indices = [gpu_index(g.uuid) for g in gpus]
    if all(index is not None for index in indices):
        values = ", ".join(str(i) for i in sorted(set(indices)))  # type: ignore[type-var]
        return f'device.attributes["{driver}"].index in [{values}]'
    if all(_DCGM_UUID.match(g.uuid) for g in gpus):
        values = ", ".join(f'"{g.uuid}"' for g in sorted(gpus, key=lambda g: g.uuid))
        return f'device.attributes["{driver}"].uuid in [{values}]'
    raise BindingError(
        f"GPUs {[g.uuid for g in gpus]} carry neither a device index (<node>/gpu<i>) nor an NVIDIA UUID (GPU-…): "
        "a DRA claim cannot name them"
    )


def _claim_spec(gpus: list[GpuState], settings) -> dict[str, Any]:
    request = {
        "deviceClassName": settings.dra_device_class,
        "allocationMode": "ExactCount",
        "count": len(gpus),
        "selectors": [{"cel": {"expression": _selector(gpus, settings.dra_driver)}}],
    }
    return {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}


def resource_claim(name: str, gpus: list[GpuState], settings, labels: dict[str, str]) -> dict[str, Any]:
    """A ResourceClaim (resource.k8s.io/v1) for exactly `gpus`, validated."""
    claim = {
        "apiVersion": DRA_API,
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "spec": _claim_spec(gpus, settings),
    }
    validate_claim(claim)
    return claim


def _dra_binding(job: dict, gpus: list[GpuState], settings, name: str) -> Binding:
    from scheduler.engines.kubernetes.pods import pod_labels

    labels = pod_labels(job)
    by_node: dict[str, list[GpuState]] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node, []).append(gpu)
    if _shares_gpu(job, gpus):
        claim_name = shared_claim_name(gpus[0])
        shared_labels = {"app.kubernetes.io/part-of": "drape", "drape.ai/gpu": claim_name[len("drape-gpu-") :]}
        claim = resource_claim(claim_name, gpus, settings, shared_labels)
        return Binding(None, claim_ref={"name": CLAIM_NAME, "resourceClaimName": claim_name}, objects=(claim,), shared=True)
    if len(by_node) == 1:
        claim = resource_claim(name, gpus, settings, labels)
        return Binding(None, claim_ref={"name": CLAIM_NAME, "resourceClaimName": name}, objects=(claim,))
    index_sets = {node: sorted(str(gpu_index(g.uuid)) for g in found) for node, found in by_node.items()}
    if len({tuple(v) for v in index_sets.values()}) > 1 or any("None" in v for v in index_sets.values()):
        raise BindingError(
            f"job {job['id']}: its pods share one claim template, but the queue chose different devices per node "
            f"({index_sets}); a job across nodes needs the same device indices on each"
        )
    template = {
        "apiVersion": DRA_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "spec": {"metadata": {"labels": labels}, "spec": _claim_spec(next(iter(by_node.values())), settings)},
    }
    validate_claim(template)
    return Binding(None, claim_ref={"name": CLAIM_NAME, "resourceClaimTemplateName": name}, objects=(template,))


_DNS = {"type": "string", "maxLength": 253, "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"}
_LABEL_NAME = {"type": "string", "maxLength": 63, "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}
# ResourceClaimSpec as drape writes it (resource.k8s.io/v1: DeviceClaim, DeviceRequest, ExactDeviceRequest,
# DeviceSelector, CELDeviceSelector; a request names one device class and at most 32 selectors).
_CLAIM_SPEC = {
    "type": "object",
    "additionalProperties": False,
    "required": ["devices"],
    "properties": {
        "devices": {
            "type": "object",
            "additionalProperties": False,
            "required": ["requests"],
            "properties": {
                "requests": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 32,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name", "exactly"],
                        "properties": {
                            "name": _LABEL_NAME,
                            "exactly": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["deviceClassName"],
                                "properties": {
                                    "deviceClassName": _DNS,
                                    "allocationMode": {"enum": ["ExactCount", "All"]},
                                    "count": {"type": "integer", "minimum": 1},
                                    "selectors": {
                                        "type": "array",
                                        "maxItems": 32,
                                        "items": {
                                            "type": "object",
                                            "additionalProperties": False,
                                            "required": ["cel"],
                                            "properties": {
                                                "cel": {
                                                    "type": "object",
                                                    "additionalProperties": False,
                                                    "required": ["expression"],
                                                    "properties": {"expression": {"type": "string", "maxLength": 10240}},
                                                }
                                            },
                                        },
                                    },
                                },
                            },
                        },
                    },
                }
            },
        }
    },
}
_METADATA = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {"name": _DNS, "namespace": _LABEL_NAME, "labels": {"type": "object"}},
}
CLAIM_SCHEMAS: dict[str, dict[str, Any]] = {
    "ResourceClaim": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": DRA_API},
            "kind": {"const": "ResourceClaim"},
            "metadata": _METADATA,
            "spec": _CLAIM_SPEC,
        },
    },
    "ResourceClaimTemplate": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": DRA_API},
            "kind": {"const": "ResourceClaimTemplate"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "required": ["spec"],
                "properties": {"metadata": {"type": "object"}, "spec": _CLAIM_SPEC},
            },
        },
    },
}


def validate_claim(item: dict[str, Any]) -> None:
    """`item` (a ResourceClaim or ResourceClaimTemplate) against `CLAIM_SCHEMAS`; BindingError naming the field."""
    kind = item.get("kind")
    if kind not in CLAIM_SCHEMAS:
        raise BindingError(f"{kind!r} is not a DRA object drape writes (expected one of {sorted(CLAIM_SCHEMAS)})")
    try:
        jsonschema.validate(item, CLAIM_SCHEMAS[kind])
    except jsonschema.ValidationError as error:
        where = ".".join(str(part) for part in error.absolute_path) or "(object)"
        name = item.get("metadata", {}).get("name", "?")
        raise BindingError(f"{kind} {name}: {where}: {error.message}") from None
