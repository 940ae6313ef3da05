"""The objects drape would create on Kubernetes for a placement, for people to read (`drape queue render`).

A job placed by the queue on `gpus` GPUs of `nodes` 8-GPU H100 nodes (h100-00, h100-01, …, the first
GPUs of each), or, `shared`, one GPU that already holds another job: its DRA claims, the headless
Service a job across nodes resolves its pods by, and its Job or PyTorchJob, as plain dicts in the
order `kubectl apply` needs them. The same `build_objects` the launcher calls, so what is shown is
what is created; a placement the cluster cannot be told is refused with the launcher's reason.
"""

from __future__ import annotations

import json
from typing import Any

from scheduler.engines.kubernetes.objects import build_objects, headless_service
from scheduler.policy import GpuState

GPUS_PER_NODE = 8


def placed_gpus(gpus: int, nodes: int, shared: bool) -> list[GpuState]:
    """The GPUs of the example placement: `gpus` / `nodes` on each of h100-00…; ValueError when uneven or too wide."""
    if gpus % nodes or gpus // nodes > GPUS_PER_NODE:
        raise ValueError(f"{gpus} GPU(s) on {nodes} node(s): expected the same GPUs on each node, {GPUS_PER_NODE} at most")
    if shared and gpus != 1:
        raise ValueError(f"--shared places one GPU beside another job; got {gpus} GPUs (a multi-GPU job shares with nobody)")
    per_node = gpus // nodes
    return [
        GpuState(f"h100-{n:02d}/gpu{i}", f"h100-{n:02d}", "H100-80GB", 80.0, jobs=int(shared))
        for n in range(nodes)
        for i in range(per_node)
    ]


def example_job(gpus: int, mem_gib: float, shared: bool) -> dict[str, Any]:
    """A queue row as the claim leaves it: a stage's torchrun job, or a single-GPU fine-tune that shares."""
    kind = "finetune" if shared or gpus == 1 else "stage-training"
    labels = {"launch": "torchrun", "mounts": json.dumps(["/mnt/drape"])} if gpus > 1 else {"share": "0.5"} if shared else {}
    return {
        "id": f"{kind}-example",
        "kind": kind,
        "stage": "geometry" if kind == "stage-training" else None,
        "env": json.dumps({"DRAPE_RUN": "example"}),
        "command": json.dumps(["python", "-m", "drape.train", "--job", "s3://drape-artifacts/runs/example/job.json"]),
        "labels": json.dumps(labels),
        "attempts": 1,
        "gpus": gpus,
        "mem_gib": mem_gib,
    }


def render_placed(settings, *, gpus: int, nodes: int, mem_gib: float, shared: bool) -> list[dict[str, Any]]:
    """The objects for the example placement under `settings` (queue.kubernetes); BindingError when refused."""
    from kubernetes import client

    body, claims = build_objects(example_job(gpus, mem_gib, shared), placed_gpus(gpus, nodes, shared), settings)
    api = client.ApiClient()
    plain = body if isinstance(body, dict) else api.sanitize_for_serialization(body)
    objects: list[dict[str, Any]] = list(claims)
    if plain["kind"] == "Job" and plain["spec"].get("completionMode") == "Indexed":
        name = plain["metadata"]["name"]
        objects.append(api.sanitize_for_serialization(headless_service(name, settings.namespace, plain["metadata"]["labels"])))
    return [*objects, plain]
