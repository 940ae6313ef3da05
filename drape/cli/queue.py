"""`drape queue …` (submit, list, cancel, dispatch, profile, simulate, sbatch, trace, kueue, render): the GPU queue."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.markup import escape

from drape import JOB_KINDS, STAGES, JobKind
from drape.cli.common import ConfigOption, Typer, console, fail, finite, load
from drape.cli.render import table_of
from drape.secrets import redact
from scheduler.policy.state import MAX_PRIORITY

app = Typer(help="The GPU queue: submit, list, cancel, dispatch, profile, simulate, trace.", no_args_is_help=True)


@app.command("submit", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def queue_submit(
    ctx: typer.Context,
    kind: str = typer.Option(..., help="|".join(JOB_KINDS)),
    mem_gib: float = typer.Option(..., help="peak GPU memory per GPU (GiB)"),
    duration: float = typer.Option(3600.0, help="expected run time (s)"),
    gpus: int = typer.Option(1, help="GPUs (more than one: whole GPUs on one node)"),
    priority: int = typer.Option(3, min=-MAX_PRIORITY, max=MAX_PRIORITY, help="higher runs first; waiting raises it (aging)"),
    stage: str | None = typer.Option(None, help="the pipeline stage it trains, if any (its memory history is kept per stage)"),
    gpu_model: list[str] = typer.Option([], help="a GPU model it may run on, a part of its name (repeat; default: any)"),
    exclusive: bool = typer.Option(False, help="run alone on its GPU: never co-located, never preempted"),
    share: float = typer.Option(1.0, help="the part of a GPU's compute it uses; under 1 it shares a GPU by declaration"),
    preemptible: bool = typer.Option(True, help="it resumes from checkpoints: a gang job waiting past its bound may stop it"),
    checkpoint_every: float = typer.Option(600.0, help="how often it checkpoints (s): what a stop loses at most"),
    config: Path | None = ConfigOption,
) -> None:
    """Queue the command after `--` (e.g. drape queue submit --kind gate-eval --mem-gib 12 -- python -m x)."""
    from scheduler.queue.store import JobSpec, JobStore, QueueError

    cfg = load(config)
    if not ctx.args:
        fail("no command: put it after --")
    try:
        spec = JobSpec(
            kind=kind,
            command=list(ctx.args),
            mem_gib=mem_gib,
            duration_s=duration,
            gpus=gpus,
            priority=priority,
            stage=stage,
            gpu_models=gpu_model,
            exclusive=exclusive,
            share=share,
            preemptible=preemptible,
            checkpoint_every_s=checkpoint_every,
        )
        store = JobStore(cfg.queue_url)
        _refuse_unplaceable(cfg, store, spec)
        job_id = store.submit(spec)
    except QueueError as error:
        fail(str(error))
    console.print(job_id)


def _refuse_unplaceable(cfg, store, spec) -> None:
    """Refuse at submit a job no node of the fleet can ever hold, with why (when the fleet is known)."""
    from scheduler.dispatch.dispatcher import refusal
    from scheduler.dispatch.fleet import fleet_view
    from scheduler.policy import JobRequest

    view = fleet_view(cfg, store)
    if not view.gpus or view.source == "ledger":
        return  # the fleet is unknown here (its inventory not registered yet): the dispatcher checks
    request = JobRequest("-", spec.priority, 0.0, spec.gpus, spec.mem_gib, spec.duration_s, tuple(spec.gpu_models))
    reason = refusal(request, view.gpus, cfg)
    if reason:
        fail(f"refused: {spec.gpus} GPU(s) × {spec.mem_gib:g} GiB ({spec.kind}): {reason}")


@app.command("list")
def queue_list(
    config: Path | None = ConfigOption,
    state: str | None = typer.Option(None, help="only jobs in this state"),
    limit: int = typer.Option(50, help="at most this many jobs"),
) -> None:
    """Jobs, oldest first, with state, GPUs, memory and waits."""
    import json
    import time

    from scheduler.queue.store import JobStore

    store = JobStore(load(config).queue_url)
    table = table_of(
        f"queue: {', '.join(f'{k} {v}' for k, v in store.counts().items() if v)}",
        ("job", "kind", "stage", "state", "prio", "gpus", "mem GiB", "waited", "on"),
    )
    now = time.time()
    for job in store.jobs((state,) if state else None, limit):
        waited = (job["start_s"] or now) - job["submit_s"]
        table.add_row(
            job["id"],
            job["kind"],
            job["stage"] or "",
            job["state"],
            str(job["priority"]),
            str(job["gpus"]),
            f"{job['mem_gib']:.1f}",
            f"{waited:.0f} s",
            ", ".join(json.loads(job["assigned"] or "[]")),
        )
    console.print(table)


@app.command("cancel")
def queue_cancel(job_id: str = typer.Argument(...), config: Path | None = ConfigOption) -> None:
    """Cancel a queued job, or stop a running one (its dispatcher ends it on its next cycle)."""
    from scheduler.queue.schema import QueueError
    from scheduler.queue.store import JobStore

    try:
        job = JobStore(load(config).queue_url).cancel(job_id)
    except QueueError as error:
        fail(str(error))
    console.print(f"{job_id}: {job['state']}")


@app.command("dispatch")
def queue_dispatch(
    config: Path | None = ConfigOption,
    once: bool = typer.Option(False, help="one cycle, then exit"),
    metrics_port: int | None = typer.Option(None, help="serve Prometheus /metrics on this port"),
) -> None:
    """Run a dispatcher: place queued jobs on idle capacity, launch them, reap them."""
    from scheduler.dispatch.dispatcher import Dispatcher

    cfg = load(config)
    if metrics_port:
        from drape.ops.metrics import serve_metrics

        console.print(f"metrics on {serve_metrics(metrics_port)}")
    dispatcher = Dispatcher(cfg)
    console.print(
        f"dispatcher {dispatcher.id}: policy {cfg.queue.policy}, fleet {cfg.queue.fleet}, launcher {cfg.queue.launcher}"
    )

    def show(report) -> None:
        if report.started or report.finished or report.requeued:
            console.print(
                f"started {len(report.started)}, finished {len(report.finished)}, requeued {len(report.requeued)} "
                f"({report.seconds * 1000:.0f} ms, fleet: {report.fleet_source})"
            )

    try:
        dispatcher.run(max_cycles=1 if once else None, on_cycle=show)
    except KeyboardInterrupt:
        console.print("dispatcher stopped; its running jobs keep their leases until they lapse")


def _profile_row(table, p, kind: str, stage: str, gpus: int, trains: int, lora: bool) -> None:
    measured = "-" if p.measured_p95_gib is None else f"{p.measured_p95_gib:.2f}"
    table.add_row(
        kind,
        stage,
        str(gpus),
        f"{trains / 1e6:,.2f} M" + (" (LoRA)" if lora else ""),
        f"{p.estimate_gib:.2f}",
        f"{p.estimate_duration_s / 60:.1f} min",
        measured,
        str(p.measurements),
        f"{p.mem_gib:.2f}",
        p.source,
    )


@app.command("profile")
def queue_profile(config: Path | None = ConfigOption) -> None:
    """Memory profiles per job kind and stage: the estimate from the config vs the measured history."""
    from scheduler.jobs.profiles import lora_parameters, parameter_counts, profile
    from scheduler.queue.schema import QueueError
    from scheduler.queue.store import JobStore

    cfg = load(config)
    try:
        store: JobStore | None = JobStore(cfg.queue_url)
    except QueueError as error:  # the scheduler host's database may be out of reach from here: estimates still hold
        console.print(f"[yellow]{escape(redact(str(error)))}: estimates only, no measured history[/yellow]")
        store = None
    total = parameter_counts(cfg, None)[0]
    table = table_of(
        f"memory profiles: {cfg.name} ({cfg.data.resolution_label}, batch {cfg.train.batch_size}, {cfg.train.precision}; "
        f"{total / 1e6:,.2f} M parameters)",
        (
            "kind",
            "stage",
            "GPUs",
            "trains",
            "estimate GiB/GPU",
            "est. duration",
            "measured p95 GiB",
            "runs",
            "queue uses GiB",
            "from",
        ),
    )
    for kind in (JobKind.STAGE_TRAINING, JobKind.FINETUNE, JobKind.GATE_EVAL):
        for stage in STAGES:
            counts = parameter_counts(cfg, stage)
            gpus = cfg.train.gpus_for(stage) if kind != JobKind.GATE_EVAL else 1
            lora = kind == JobKind.FINETUNE and cfg.train.lora.enabled
            trains = lora_parameters(cfg, stage) if lora else counts[1] if kind != JobKind.GATE_EVAL else 0
            _profile_row(table, profile(cfg, store, kind, stage, gpus, counts=counts), kind, stage, gpus, trains, lora)
    # a shopper's adapter (drape shopper personalize): `shoppers` patterns, rank, steps and batch
    personal = profile(cfg, store, JobKind.PERSONALIZATION, None)
    _profile_row(table, personal, JobKind.PERSONALIZATION, "-", 1, lora_parameters(cfg, None), True)
    console.print(table)


@app.command("simulate")
def queue_simulate(
    trace: Path = typer.Option(..., help="CSV: job_id,submit_s,duration_s,peak_mem_gib,gpus,priority,kind"),
    fleet: Path = typer.Option(..., help="fleet YAML: groups: [{model, memory_gib, nodes, gpus_per_node}]"),
    policy: str = typer.Option("fifo-exclusive,drape", help="policies to compare, comma-separated"),
    config: Path | None = typer.Option(
        None,
        "--config",
        "-c",
        help="pipeline config YAML whose queue settings the policy runs with (gang_max_wait_seconds, the engine: "
        "Slurm's gangs span nodes, Kubernetes nodes that do not share); default: the policy's defaults",
    ),
) -> None:
    """Replay a trace against a fleet with the live policy code; utilization, waits, starvation, bound."""
    from scheduler.dispatch.fleet import mark_solo, policy_config
    from scheduler.policy import PolicyConfig
    from scheduler.policy.baselines import POLICIES
    from scheduler.queue.inventory import FleetFileError, load_fleet
    from scheduler.sim import TraceError, load_trace, simulate
    from scheduler.sim.model import check_fits
    from scheduler.sim.tables import render

    names = [p.strip() for p in policy.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        fail(f"unknown policy {unknown or repr(policy)}; expected some of {sorted(POLICIES)}, comma-separated")
    settings = PolicyConfig()
    try:
        jobs, gpus = load_trace(trace), load_fleet(fleet)
        if config is not None:
            cfg = _replay_config(config)
            settings = policy_config(cfg)
            mark_solo(gpus, cfg)
        check_fits(jobs, gpus, settings.span_nodes)  # the trace's own faults, the same for every policy
    except (TraceError, FleetFileError) as error:
        fail(str(error))
    results, stuck = [], []
    for name in names:  # a policy that leaves jobs waiting forever does not hide the others' results
        try:
            results.append(simulate(jobs, gpus, name, settings))
        except TraceError as error:
            stuck.append(str(error))
    if results:
        print(render(results, jobs))
    if stuck:
        fail("\n".join(stuck))


def _replay_config(config: Path):
    """The config whose queue settings a replay runs with. A production config takes site values from a
    site file; with none given (no DRAPE_SITE) a replay takes the example site's: it opens no path or
    endpoint of the site, and the one site value it reads, queue.kubernetes.kueue_queue, is unset there
    (drape places, not Kueue). It says so on stderr."""
    import sys

    from drape.config import EXAMPLE_SITE, read_config_data
    from drape.config.reading.site import declared_site_fields, site_path

    if site_path() is not None:
        return load(config)
    cfg = load(config, site=EXAMPLE_SITE)  # a config that declares no site value reads none
    declared = declared_site_fields(read_config_data(config), str(config))
    if declared:
        reads = "none of them"
        if cfg.queue.launcher == "kubernetes":
            reads = (
                "only queue.kubernetes.kueue_queue, unset there: drape places, not Kueue (set DRAPE_SITE to replay your site's)"
            )
        print(
            f"{config}: no site file given (DRAPE_SITE): the replay takes the config's queue settings; its {len(declared)} "
            f"site values (where things are) come from {EXAMPLE_SITE.name}, and the replay reads {reads}",
            file=sys.stderr,
        )
    return cfg


@app.command("sbatch")
def queue_sbatch(
    config: Path | None = ConfigOption,
    stage: str = typer.Option(STAGES[0], help="|".join(STAGES)),
    nodes: int = typer.Option(1, help="whole nodes the queue places the stage's GPUs on"),
    python: str | None = typer.Option(None, help="the interpreter on the nodes (default: this one)"),
) -> None:
    """Print the sbatch script the Slurm engine writes for the stage's training job (queue.slurm; docs/slurm.md)."""
    import sys

    from scheduler.jobs.slurm_script import stage_script

    cfg = load(config)
    try:
        print(stage_script(cfg, stage=stage, nodes=nodes, python=python or sys.executable), end="")
    except ValueError as error:
        fail(str(error))


@app.command("trace")
def queue_trace(
    out: Path = typer.Option(..., help="CSV to write: the columns `drape queue simulate --trace` reads"),
    since_hours: float | None = typer.Option(None, help="only jobs submitted in the last this many hours"),
    config: Path | None = ConfigOption,
) -> None:
    """The queue's succeeded jobs as a trace to replay: run time measured alone or shared, peak memory, scheduling fields."""
    import time

    from scheduler.queue.store import JobStore
    from scheduler.sim.export import export_trace

    if since_hours is not None and since_hours <= 0:
        fail(f"--since-hours must be positive, got {since_hours}")
    if not out.parent.is_dir():
        fail(f"--out {out}: its folder {out.parent} does not exist")
    since = time.time() - since_hours * 3600 if since_hours is not None else None
    count = export_trace(JobStore(load(config).queue_url), out, since)
    console.print(f"{out}: {count} job(s); replay with drape queue simulate --trace {out} --fleet FLEET.yaml")


@app.command("kueue")
def queue_kueue(
    fleet: Path = typer.Option(..., help="fleet YAML: groups: [{model, memory_gib, nodes, gpus_per_node}]"),
    local_queue: str = typer.Option("drape", help="the LocalQueue jobs name (kueue.x-k8s.io/queue-name)"),
    cluster_queue: str = typer.Option("drape", help="the ClusterQueue whose quota is the fleet"),
    config: Path | None = ConfigOption,
) -> None:
    """Kueue's objects for a fleet (kueue.x-k8s.io/v1beta2): a ResourceFlavor per GPU model or MIG
    profile, the ClusterQueue, the LocalQueue; YAML to `kubectl apply -f -`."""
    import yaml

    from scheduler.engines.kubernetes.kueue import KueueError, flavors_from_fleet, kueue_objects
    from scheduler.queue.inventory import FleetFileError, load_fleet

    settings = load(config).queue.kubernetes
    try:
        flavors = flavors_from_fleet(load_fleet(fleet), settings.product_label, settings.products)
        objects = kueue_objects(
            flavors,
            namespace=settings.namespace,
            cluster_queue=cluster_queue,
            local_queue=local_queue,
            cpu_per_gpu=settings.cpu_per_gpu,
            memory_gib_per_gpu=settings.host_memory_gib_per_gpu + settings.shm_gib_per_gpu,
        )
    except (FleetFileError, KueueError) as error:
        fail(str(error))
    print(yaml.safe_dump_all(objects, sort_keys=False), end="")


@app.command("render")
def queue_render(
    gpus: int = typer.Option(1, min=1, max=512, help="GPUs the queue placed the job on"),
    nodes: int = typer.Option(1, min=1, max=64, help="nodes they span (the same GPUs on each)"),
    mem_gib: float = typer.Option(20.0, parser=finite("--mem-gib", 0.1, 1024), help="its memory profile: GiB per GPU"),
    shared: bool = typer.Option(False, "--shared", help="a single-GPU job placed beside another job on its GPU"),
    sharing: str | None = typer.Option(None, help="as if queue.kubernetes.sharing were this (none|time-slicing|mps)"),
    dra: bool = typer.Option(False, "--dra", help="as if queue.kubernetes.dra_device_class were gpu.nvidia.com"),
    config: Path | None = ConfigOption,
) -> None:
    """The Kubernetes objects drape creates for a job the queue placed (8-GPU H100 nodes h100-00, h100-01, …):
    its DRA claims, the Service of a job across nodes and its Job or PyTorchJob; YAML, or why it is refused."""
    import yaml
    from pydantic import ValidationError

    from scheduler.engines.kubernetes.render import render_placed

    settings = load(config).queue.kubernetes
    overrides = {"sharing": sharing} if sharing else {}
    overrides |= {"dra_device_class": "gpu.nvidia.com"} if dra else {}
    try:
        settings = type(settings).model_validate({**settings.model_dump(), **overrides})
        objects = render_placed(settings, gpus=gpus, nodes=nodes, mem_gib=mem_gib, shared=shared)
    except (ValidationError, ValueError) as error:
        fail(str(error))
    print(yaml.safe_dump_all(objects, sort_keys=False), end="")
