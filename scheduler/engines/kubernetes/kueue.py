"""drape beside Kueue: the objects Kueue needs for drape's fleet, and drape's jobs as Kueue workloads.

The rule, written once: in Kueue mode drape orders and sizes, Kueue admits.
- drape decides the order jobs are submitted in (its priority with aging) and each job's size:
  GPUs, and from its measured memory profile the smallest GPU (a whole GPU model, or a MIG slice)
  that holds it, which becomes the pod's node selector on the GPU product label and its resource
  (`nvidia.com/gpu` or `nvidia.com/mig-<profile>`);
- Kueue decides when a job starts: drape creates it suspended with `kueue.x-k8s.io/queue-name`,
  Kueue admits it against the ClusterQueue's quota and unsuspends it, injecting its flavor's node
  labels; kube-scheduler then picks the node. drape pins no node in this mode, so the two never
  disagree about where: the queue's books follow what ran (the dispatcher reads the pods).

`kueue_objects` renders the ResourceFlavors (one per GPU model or MIG profile of the fleet, with the
node label that selects it), one ClusterQueue whose nominal quota is the fleet (GPUs, and the CPUs
and host memory the pods request per GPU), and the LocalQueue jobs name, all in Kueue's storage API
`kueue.x-k8s.io/v1beta2` (v1beta1 is still served). `validate` checks an object against a schema
of the fields drape uses, written from Kueue's API reference (`KUEUE_SCHEMAS`).
"""

from __future__ import annotations

import copy
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import jsonschema

from drape.config import names
from scheduler.policy import GpuState, allows

API_VERSION = "kueue.x-k8s.io/v1beta2"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
WHOLE_GPU = "nvidia.com/gpu"
_MIG = re.compile(r"-MIG-(\d+g\.\d+gb)$", re.IGNORECASE)  # "H100-80GB-MIG-3g.40gb": a MIG slice of an H100
_DNS_LABEL = re.compile(r"[^a-z0-9]+")


class KueueError(ValueError):
    """A job no flavor of the fleet can hold, or an object Kueue's API would refuse."""


@dataclass(frozen=True)
class Flavor:
    """One ResourceFlavor: GPUs of one model (or MIG profile) and how their nodes are selected."""

    name: str
    model: str
    memory_gib: float
    resource: str  # the extended resource a pod requests: nvidia.com/gpu or nvidia.com/mig-<profile>
    node_labels: dict[str, str]
    gpus: int


def flavor_name(model: str) -> str:
    """A fleet GPU model as a DNS-1123 name: 'H100-80GB' → 'h100-80gb', 'A100-MIG-3g.40gb' → 'a100-mig-3g-40gb'."""
    name = _DNS_LABEL.sub("-", model.lower()).strip("-")
    if not name:
        raise KueueError(f"GPU model {model!r} has no letters or digits to name a ResourceFlavor")
    return name[:63].rstrip("-")


def _resource(model: str) -> str:
    mig = _MIG.search(model)
    return f"nvidia.com/mig-{mig.group(1).lower()}" if mig else WHOLE_GPU


def flavors_from_fleet(gpus: list[GpuState], product_label: str, products: dict[str, str]) -> list[Flavor]:
    """The fleet's flavors, smallest GPU memory first: GPUs grouped by model, each selected by the
    product label's value (`queue.kubernetes.products`; a model not listed: its own name)."""
    by_model: dict[str, list[GpuState]] = defaultdict(list)
    for gpu in gpus:
        by_model[gpu.model].append(gpu)
    flavors = []
    for model, members in by_model.items():
        base = _MIG.sub("", model)
        flavors.append(
            Flavor(
                flavor_name(model),
                model,
                min(g.total_gib for g in members),
                _resource(model),
                {product_label: names.product_label(base, products)},
                len(members),
            )
        )
    return sorted(flavors, key=lambda f: (f.memory_gib, f.name))


def flavor_for(mem_gib: float, flavors: list[Flavor], models: tuple[str, ...] = ()) -> Flavor:
    """The smallest flavor whose GPU memory holds `mem_gib` (among the models `models` names, as the
    policy reads them: `allows`); KueueError with why when none does."""
    allowed = [f for f in flavors if allows(models, f.model)]
    for flavor in allowed:  # smallest first
        if flavor.memory_gib >= mem_gib:
            return flavor
    have = ", ".join(f"{f.model} ({f.memory_gib:g} GiB)" for f in allowed) or "none of the models it names"
    raise KueueError(f"a job of {mem_gib:g} GiB per GPU fits no flavor of the fleet: {have}")


def _quantity(value: float) -> str:
    return f"{value:g}"


def kueue_objects(
    flavors: list[Flavor],
    *,
    namespace: str,
    cluster_queue: str = "drape",
    local_queue: str = "drape",
    cpu_per_gpu: float = 10.0,
    memory_gib_per_gpu: float = 160.0,
) -> list[dict[str, Any]]:
    """ResourceFlavors, the ClusterQueue (one resource group: cpu, memory and the GPU resources; quota = the fleet),
    and the LocalQueue in `namespace`, each validated against `KUEUE_SCHEMAS`."""
    objects: list[dict[str, Any]] = [
        {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": f.name}, "spec": {"nodeLabels": f.node_labels}}
        for f in flavors
    ]
    # Kueue puts a resource in one group only, so cpu and memory make one group with every GPU
    # resource: each flavor lists them all, in order, with 0 of the GPU resources it does not have
    gpu_resources = list(dict.fromkeys(f.resource for f in flavors))
    covered = ["cpu", "memory", *gpu_resources]
    resource_groups = [
        {
            "coveredResources": covered,
            "flavors": [
                {
                    "name": f.name,
                    "resources": [
                        {"name": "cpu", "nominalQuota": _quantity(f.gpus * cpu_per_gpu)},
                        {"name": "memory", "nominalQuota": f"{_quantity(f.gpus * memory_gib_per_gpu)}Gi"},
                        *({"name": r, "nominalQuota": str(f.gpus if r == f.resource else 0)} for r in gpu_resources),
                    ],
                }
                for f in flavors
            ],
        }
    ]
    spec = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        "queueingStrategy": "BestEffortFIFO",  # drape submits in its own order; a blocked head blocks nothing else
        "preemption": {"withinClusterQueue": "Never", "reclaimWithinCohort": "Never"},  # drape preempts (its checkpoints)
        "resourceGroups": resource_groups,
    }
    objects.append({"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": {"name": cluster_queue}, "spec": spec})
    objects.append(
        {
            "apiVersion": API_VERSION,
            "kind": "LocalQueue",
            "metadata": {"name": local_queue, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue},
        }
    )
    for item in objects:
        validate(item)
    return objects


def as_workload(manifest: dict[str, Any], *, local_queue: str, flavor: Flavor, product_label: str) -> dict[str, Any]:
    """A rendered Job or PyTorchJob as a Kueue workload: suspended, labelled with the LocalQueue, its
    pods selecting the flavor's GPU product and requesting its resource, and no node pinned (Kueue
    admits, kube-scheduler places). The manifest passed in is left as it was."""
    workload = copy.deepcopy(manifest)
    workload.setdefault("metadata", {}).setdefault("labels", {})[QUEUE_NAME_LABEL] = local_queue
    kind = workload.get("kind")
    if kind == "Job":
        workload["spec"]["suspend"] = True
        templates = [workload["spec"]["template"]]
    elif kind == "PyTorchJob":
        workload["spec"].setdefault("runPolicy", {})["suspend"] = True
        templates = [replica["template"] for replica in workload["spec"]["pytorchReplicaSpecs"].values()]
    else:
        raise KueueError(f"a {kind!r} cannot be queued in Kueue by drape (expected a Job or a PyTorchJob)")
    for template in templates:
        _select_flavor(template["spec"], flavor, product_label)
    return workload


def workload_for(body, gpus: list[GpuState], settings) -> dict[str, Any]:
    """Kueue mode (`queue.kubernetes`): the job's object suspended in the LocalQueue, on the flavor of
    the GPUs drape sized it for (the model its memory profile fits), no node pinned."""
    from kubernetes import client

    (flavor,) = flavors_from_fleet(gpus[:1], settings.product_label, settings.products)
    plain = body if isinstance(body, dict) else client.ApiClient().sanitize_for_serialization(body)
    return as_workload(plain, local_queue=settings.kueue_queue, flavor=flavor, product_label=settings.product_label)


def _select_flavor(pod: dict[str, Any], flavor: Flavor, product_label: str) -> None:
    pod.pop("affinity", None)  # node pinning and spreading are drape's own placement: Kueue's mode has none
    pod["nodeSelector"] = {**pod.get("nodeSelector", {}), product_label: flavor.node_labels[product_label]}
    for container in pod.get("containers", []):
        resources = container.setdefault("resources", {})
        for part in ("requests", "limits"):
            amounts = resources.get(part, {})
            gpus = next((amounts.pop(name) for name in list(amounts) if name.startswith("nvidia.com/")), None)
            if gpus is not None:
                amounts[flavor.resource] = gpus


_NAME = {"type": "string", "maxLength": 253, "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"}
_QUANTITY = {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?([numkMGTPE]|[KMGTPE]i)?$"}
_POLICY = {"enum": ["Never", "LowerPriority", "Any", "LowerOrNewerEqualPriority"]}


def _object(kind: str, spec: dict[str, Any], namespaced: bool = False) -> dict[str, Any]:
    metadata = {"type": "object", "required": ["name", *(["namespace"] if namespaced else [])], "properties": {"name": _NAME}}
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {"apiVersion": {"const": API_VERSION}, "kind": {"const": kind}, "metadata": metadata, "spec": spec},
    }


# The fields drape writes, with their types, enums and limits as Kueue's v1beta2 API reference gives
# them (ResourceFlavorSpec, ClusterQueueSpec, ResourceGroup, FlavorQuotas, ResourceQuota, LocalQueueSpec).
KUEUE_SCHEMAS: dict[str, dict[str, Any]] = {
    "ResourceFlavor": _object(
        "ResourceFlavor",
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "nodeLabels": {"type": "object", "maxProperties": 8, "additionalProperties": {"type": "string", "maxLength": 63}},
            },
        },
    ),
    "ClusterQueue": _object(
        "ClusterQueue",
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["resourceGroups"],
            "properties": {
                "namespaceSelector": {"type": "object"},
                "queueingStrategy": {"enum": ["StrictFIFO", "BestEffortFIFO"]},
                "cohortName": _NAME,
                "preemption": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"withinClusterQueue": _POLICY, "reclaimWithinCohort": _POLICY},
                },
                "resourceGroups": {
                    "type": "array",
                    "maxItems": 16,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["coveredResources", "flavors"],
                        "properties": {
                            "coveredResources": {"type": "array", "minItems": 1, "maxItems": 64, "items": {"type": "string"}},
                            "flavors": {
                                "type": "array",
                                "minItems": 1,
                                "maxItems": 64,
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["name", "resources"],
                                    "properties": {
                                        "name": _NAME,
                                        "resources": {
                                            "type": "array",
                                            "minItems": 1,
                                            "maxItems": 64,
                                            "items": {
                                                "type": "object",
                                                "additionalProperties": False,
                                                "required": ["name", "nominalQuota"],
                                                "properties": {"name": {"type": "string"}, "nominalQuota": _QUANTITY},
                                            },
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    ),
    "LocalQueue": _object(
        "LocalQueue",
        {"type": "object", "additionalProperties": False, "required": ["clusterQueue"], "properties": {"clusterQueue": _NAME}},
        namespaced=True,
    ),
}


def validate(item: dict[str, Any]) -> None:
    """`item` against its kind's schema, and the rules the schema cannot say (each flavor lists the
    group's resources in order, a resource in one group only, 256 flavors at most); KueueError naming
    the object and the field."""
    kind = item.get("kind")
    name = item.get("metadata", {}).get("name", "?")
    if kind not in KUEUE_SCHEMAS:
        raise KueueError(f"{kind!r} is not a Kueue object drape writes (expected one of {sorted(KUEUE_SCHEMAS)})")
    try:
        jsonschema.validate(item, KUEUE_SCHEMAS[kind])
    except jsonschema.ValidationError as error:
        where = ".".join(str(part) for part in error.absolute_path) or "(object)"
        raise KueueError(f"{kind} {name}: {where}: {error.message}") from None
    try:
        names.kubernetes_object(item, f"{kind} {name}")  # the namespace, labels and selectors the schema leaves as strings
    except names.NameRefused as error:
        raise KueueError(str(error)) from None
    if kind == "ClusterQueue":
        _validate_groups(name, item["spec"]["resourceGroups"])


def _validate_groups(name: str, groups: list[dict[str, Any]]) -> None:
    seen: set[str] = set()
    flavors = 0
    for number, group in enumerate(groups):
        covered = group["coveredResources"]
        if seen & set(covered):
            raise KueueError(f"ClusterQueue {name}: resourceGroups[{number}]: {sorted(seen & set(covered))} in two groups")
        seen |= set(covered)
        for flavor in group["flavors"]:
            flavors += 1
            if [r["name"] for r in flavor["resources"]] != covered:
                raise KueueError(f"ClusterQueue {name}: flavor {flavor['name']} must list {covered} in that order")
    if flavors > 256:
        raise KueueError(f"ClusterQueue {name}: {flavors} flavors (Kueue allows 256 across its resource groups)")
