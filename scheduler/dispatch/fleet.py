"""The fleet view: every GPU with its memory, what is in use and how busy it is.

Sources, by `queue.fleet`:
- ``prometheus``: the NVIDIA DCGM exporter's series in Prometheus (`DCGM_FI_DEV_FB_USED`,
  `DCGM_FI_DEV_FB_FREE` in MiB, `DCGM_FI_DEV_GPU_UTIL` in %, labels `gpu`, `UUID`, `Hostname`,
  `modelName`) through prometheus-api-client. If Prometheus cannot be reached the view falls back
  to the queue's ledger (the inventory it registered before) and says so: GPUs are then known
  only by what drape itself allocated, never assumed free beyond that.
- ``static``: an inventory YAML (`groups: [{model, memory_gib, nodes, gpus_per_node}]`).
- ``slurm``: Slurm's nodes (``scontrol show node -o``), their typed gres and state, GPU memory from
  `queue.slurm.gpu_memory_gib` (scheduler/engines/slurm/nodes.py); a drained or down node's GPUs
  are seen full. An unreachable slurmctld is an error, never an empty fleet.
- ``local``: this machine's CUDA devices; without CUDA, one CPU slot of `queue.cpu_slot_gib`.
"""

from __future__ import annotations

import math
import socket
from dataclasses import dataclass

from scheduler.engines import SPANS_NODES
from scheduler.policy import GpuState, PolicyConfig, RunningJob

MIB_PER_GIB = 1024.0


@dataclass
class FleetView:
    gpus: list[GpuState]
    source: str  # prometheus | ledger | static | local
    note: str = ""


def local_gpus(cpu_slot_gib: float = 16.0) -> list[GpuState]:
    """This machine's CUDA devices (uuid `<host>/cuda<i>`), or one `cpu` slot when there are none."""
    host = socket.gethostname()
    try:
        import torch

        if torch.cuda.is_available():
            return [
                GpuState(
                    f"{host}/cuda{i}",
                    host,
                    torch.cuda.get_device_name(i),
                    torch.cuda.get_device_properties(i).total_memory / 2**30,
                )
                for i in range(torch.cuda.device_count())
            ]
    except ImportError:
        pass
    return [GpuState(f"{host}/cpu", host, "cpu", cpu_slot_gib)]


def _check_framebuffer(uuid: str, prometheus_url: str, used: float, free: float) -> None:
    """ValueError naming the GPU when DCGM reports a framebuffer no GPU has (NaN, infinite, negative,
    beyond `MAX_GPU_MEMORY_GIB`): Prometheus answers are input, and a NaN would reach placement."""
    from scheduler.queue.inventory import MAX_GPU_MEMORY_GIB

    sizes = (used, free, used + free)
    if not (all(math.isfinite(size) and size >= 0 for size in sizes) and 0 < used + free <= MAX_GPU_MEMORY_GIB):
        raise ValueError(
            f"DCGM at {prometheus_url}: GPU {uuid} reports {used:g} GiB used and {free:g} GiB free; expected finite, "
            f"non-negative sizes totalling at most {MAX_GPU_MEMORY_GIB:g} GiB"
        )


def dcgm_gpus(prometheus_url: str, timeout: float = 5.0) -> list[GpuState]:
    """GPUs as the DCGM exporter reports them in Prometheus; raises OSError-like errors when unreachable.
    One retry at once: the client's default (3, with 2 and 4 s of backoff) held each dispatcher cycle
    6 s while Prometheus was down, and the next cycle asks again anyway."""
    from prometheus_api_client import PrometheusConnect
    from urllib3.util.retry import Retry

    retry = Retry(total=1, status_forcelist=(502, 503, 504), allowed_methods=None, raise_on_status=False)
    client = PrometheusConnect(url=prometheus_url, disable_ssl=True, timeout=timeout, retry=retry)
    series: dict[str, dict] = {}
    for metric in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_UTIL"):
        for sample in client.custom_query(metric):
            labels = sample["metric"]
            key = labels.get("UUID") or f"{labels.get('Hostname')}/gpu{labels.get('gpu')}"
            entry = series.setdefault(key, {"labels": labels})
            entry[metric] = float(sample["value"][1])
    gpus = []
    for uuid, entry in sorted(series.items()):
        if "DCGM_FI_DEV_FB_USED" not in entry or "DCGM_FI_DEV_FB_FREE" not in entry:
            continue
        labels = entry["labels"]
        used, free = entry["DCGM_FI_DEV_FB_USED"] / MIB_PER_GIB, entry["DCGM_FI_DEV_FB_FREE"] / MIB_PER_GIB
        _check_framebuffer(uuid, prometheus_url, used, free)
        util = entry.get("DCGM_FI_DEV_GPU_UTIL")
        gpus.append(
            GpuState(
                uuid,
                labels.get("Hostname", "unknown"),
                labels.get("modelName", "unknown"),
                used + free,
                observed_used_gib=used,
                observed_util=util if util is not None and math.isfinite(util) else None,
            )
        )
    return gpus


def fleet_view(config, store, running: list[RunningJob] | None = None, *, allocations: bool = True) -> FleetView:
    """The fleet per `config.queue`, with the ledger's allocations applied (and what the `running`
    jobs, read from the store when not given, declare: who runs alone, declared shares); registers
    what it sees. `allocations=False`: the GPUs alone, for a planner that keeps the allocations itself."""
    from scheduler.queue.inventory import load_fleet

    queue = config.queue
    source, note, ledger = queue.fleet, "", None
    if queue.fleet == "prometheus":
        try:
            gpus = dcgm_gpus(queue.prometheus_url or "http://127.0.0.1:9090")
            if not gpus:
                raise ConnectionError("no DCGM_FI_DEV_FB_* series")
        except Exception as error:  # noqa: BLE001 - unreachable, refused, bad answer: all mean "DCGM unknown"
            gpus, source = store.inventory(), "ledger"
            note = f"Prometheus at {queue.prometheus_url} unavailable ({type(error).__name__}: {error}); using the queue's ledger"
    elif queue.fleet == "static":
        if not queue.inventory:
            raise ValueError("queue.fleet 'static' needs queue.inventory (a fleet YAML)")
        gpus = load_fleet(queue.inventory)
    elif queue.fleet == "slurm":
        from scheduler.engines.slurm.fleet import slurm_gpus

        ledger = store.ledger()
        gpus = slurm_gpus(queue.slurm, ours={uuid for uuid, (_, jobs) in ledger.items() if jobs})  # the rest: others'
    else:
        gpus = local_gpus(queue.cpu_slot_gib)
    if source != "ledger":
        store.register_gpus(gpus)
    shares_node = mark_solo(gpus, config)
    if not allocations:
        return FleetView(gpus, source, note)
    ledger = store.ledger() if ledger is None else ledger
    alone: set[str] = set()
    shares: dict[str, float] = {}
    for job in store.running() if running is None else running:
        alone.update(job.gpus if not job.shareable else ())  # a multi-GPU or exclusive job's: nothing goes beside it
        for uuid in job.gpus:
            shares[uuid] = shares.get(uuid, 0.0) + job.share
    for gpu in gpus:
        gpu.allocated_gib, gpu.jobs = ledger.get(gpu.uuid, (0.0, 0))
        # a GPU of a node that cannot share (Kubernetes without sharing declared) takes nothing beside its job
        gpu.exclusive = gpu.uuid in alone or (gpu.jobs > 0 and not shares_node(gpu.node))
        gpu.shares = shares.get(gpu.uuid, 0.0)
    return FleetView(gpus, source, note)


def unshared(planned: list, gpus: list[GpuState], config) -> list:
    """`planned` less the placements that would put a second job on a GPU of a node that cannot share
    (`_sharing`): the fleet view keeps jobs off such a GPU once one runs there, and this keeps two jobs
    placed in one cycle from landing on it together (the second waits for the next cycle)."""
    shares_node = _sharing(config)
    nodes = {gpu.uuid: gpu.node for gpu in gpus}
    held = {gpu.uuid: gpu.jobs for gpu in gpus}
    kept = []
    for placement in planned:
        crowded = [u for u in placement.gpus if held.get(u, 0) > 0 and not shares_node(nodes.get(u, ""))]
        if crowded and not placement.evicts:  # a preemption frees its GPUs first
            continue
        for uuid in placement.gpus:
            held[uuid] = held.get(uuid, 0) + 1
        kept.append(placement)
    return kept


def mark_solo(gpus: list[GpuState], config):
    """Mark the GPUs of nodes that cannot share (`_sharing`) `solo`: the policy puts one job at a time
    on each. Returns the node test."""
    shares_node = _sharing(config)
    for gpu in gpus:
        gpu.solo = not shares_node(gpu.node)
    return shares_node


def _sharing(config):
    """Whether a node's GPUs may hold two jobs: on Kubernetes (drape placing, not Kueue) only where the config
    declares sharing or DRA claims (scheduler/engines/kubernetes/devices.py); every other engine: yes."""
    settings = config.queue.kubernetes
    if config.queue.launcher != "kubernetes" or settings.kueue_queue:
        return lambda node: True
    return settings.shares


def policy_config(config) -> PolicyConfig:
    """The queue's policy settings; where no node may share a GPU (Kubernetes without sharing declared,
    `_sharing`), one job per GPU, so the policy never plans what the launcher must refuse."""
    queue = config.queue
    alone = queue.launcher == "kubernetes" and not queue.kubernetes.kueue_queue and not _any_sharing(queue.kubernetes)
    return PolicyConfig(
        aging_per_hour=queue.aging_per_hour,
        max_jobs_per_gpu=1 if alone else queue.max_jobs_per_gpu,
        preempt_after_s=queue.preempt_after_seconds or None,
        max_preemptions=queue.max_preemptions,
        fragmentation=queue.placement == "fragmentation",
        spread_after_s=queue.spread_after_seconds or None,
        gang_max_wait_s=queue.gang_max_wait_seconds or None,
        gang_max_preemptions=queue.gang_max_preemptions,
        gang_stops_rehome=queue.gang_stops_rehome,
        gang_stops_longer=queue.gang_stops_longer or None,
        gang_bound_whole_wait=queue.gang_bound_whole_wait,
        gang_bound_backlog=queue.gang_bound_backlog,
        gang_stops_waited=queue.gang_stops_waited_seconds or None,
        gang_aging_whole_wait=queue.gang_aging_whole_wait,
        short_job_bonus=queue.short_job_bonus,
        short_job_s=queue.short_job_seconds,
        rescue_gangs=queue.rescue_gangs,
        span_nodes=queue.launcher in SPANS_NODES,  # gangs across nodes where the engine starts one so
    )


def _any_sharing(settings) -> bool:
    return (
        bool(settings.dra_device_class) or settings.sharing != "none" or any(v != "none" for v in settings.node_sharing.values())
    )
