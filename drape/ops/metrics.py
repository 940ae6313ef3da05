"""drape's Prometheus metrics: one registry, names that start with ``drape_`` (a public API).

Long-running processes serve the registry on ``/metrics``; a flow run pushes the series of one
run and stage to a Pushgateway when `metrics.pushgateway_url` is configured, grouped by
``run`` and ``stage`` so one stage's push never overwrites another's (a distributed trainer's
ranks each push their own group, ``rank`` added). A push that fails is
reported and never fails the work it describes.
"""

from __future__ import annotations

import sys
import time
from urllib.error import HTTPError

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, pushadd_to_gateway
from prometheus_client.core import GaugeMetricFamily, Metric

from drape.storage.store import redact_url

REGISTRY = CollectorRegistry(auto_describe=True)


class GaugeTable:
    """A gauge whose series are the rows of a table replaced whole (`replace`) and read at scrape
    time: the queue's per-job and per-GPU state. A dispatch cycle sets thousands of rows, and a
    Gauge child per row re-validates its label names when created, which cost more than the rest
    of the cycle's export; rows that leave the table leave the exposition with them."""

    def __init__(self, name: str, documentation: str, labelnames: list[str], registry: CollectorRegistry):
        self._name, self._documentation, self._labelnames = name, documentation, tuple(labelnames)
        self._rows: dict[tuple[str, ...], float] = {}
        registry.register(self)

    def replace(self, rows: dict[tuple[str, ...], float]) -> None:
        """The table becomes `rows` (label values in `labelnames` order → value); one assignment, so a
        scrape reads the old table or the new one whole."""
        self._rows = dict(rows)

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(self._name, self._documentation, labels=self._labelnames)

    def describe(self):
        return [self._family()]

    def collect(self):
        family = self._family()
        for labels, value in self._rows.items():
            family.add_metric(labels, value)
        yield family


DATA_WAIT = Histogram(
    "drape_data_wait_seconds",
    "Time a training step blocked waiting for its batch (data-wait), per step and rank",
    ["run", "stage", "rank"],
    registry=REGISTRY,
    buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0),
)
STEP_SECONDS = Histogram(
    "drape_train_step_seconds",
    "Wall time of one training step, data-wait included",
    ["run", "stage", "rank"],
    registry=REGISTRY,
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)

# --- the pipeline: one series per run and stage, pushed to the Pushgateway by the flow -------------
RUN_STAGE = ["run", "stage"]
STAGE_STEP_SECONDS = Gauge(
    "drape_stage_step_seconds",
    "Wall time of a stage's step (prestage, train, gate, snapshot, archive)",
    [*RUN_STAGE, "step"],
    registry=REGISTRY,
)
STAGE_FINISHED = Gauge(
    "drape_stage_finished_timestamp_seconds", "When a stage's step finished (Unix time)", [*RUN_STAGE, "step"], registry=REGISTRY
)
TRAIN_THROUGHPUT = Gauge("drape_train_samples_per_second", "Training throughput of the stage", RUN_STAGE, registry=REGISTRY)
TRAIN_STEPS = Gauge("drape_train_steps", "Steps the stage trained", RUN_STAGE, registry=REGISTRY)
GATE_VALUE = Gauge(
    "drape_gate_check_value",
    "Gate check aggregate over the control set (lower: bootstrap 5th percentile)",
    [*RUN_STAGE, "check", "aggregate"],
    registry=REGISTRY,
)
GATE_THRESHOLD = Gauge(
    "drape_gate_check_threshold", "Configured value threshold of a gate check", [*RUN_STAGE, "check"], registry=REGISTRY
)
GATE_PASSED = Gauge(
    "drape_gate_passed", "1 when the stage's candidate passed its gate, 0 when it failed", RUN_STAGE, registry=REGISTRY
)
PROMOTIONS = Counter("drape_snapshot_promotions", "Checkpoints promoted to the stage baseline", RUN_STAGE, registry=REGISTRY)
BASELINE_VERSION = Gauge(
    "drape_snapshot_baseline_version", "Registry version of the stage's baseline after promotion", RUN_STAGE, registry=REGISTRY
)
ARCHIVED_BYTES = Gauge(
    "drape_archived_bytes", "Bytes archived (verified) to the object store by the stage", RUN_STAGE, registry=REGISTRY
)
LIVE_BYTES = Gauge("drape_live_bytes", "Live storage bytes after the stage's archive", RUN_STAGE, registry=REGISTRY)
LIVE_BUDGET = Gauge(
    "drape_live_budget_bytes", "Configured live storage budget (retention.live_budget_bytes)", RUN_STAGE, registry=REGISTRY
)
PRESTAGED_BYTES = Gauge(
    "drape_prestage_bytes", "Bytes of the stage's shards in the local cache after pre-staging", RUN_STAGE, registry=REGISTRY
)
PRESTAGE_DOWNLOADED = Gauge(
    "drape_prestage_downloaded_bytes", "Bytes pre-staging downloaded for the stage", RUN_STAGE, registry=REGISTRY
)

# --- the services a run talks to (`drape/ops/outage.py`) ------------------------------------------
SERVICE_OUTAGES = Counter(
    "drape_service_outages",
    "Outages of a service drape met mid-run (mlflow, queue_database, pushgateway): waited out "
    "(outcome recovered) or longer than its wait budget (exhausted)",
    ["service", "outcome"],
    registry=REGISTRY,
)

# --- the inference measuring stick (`drape bench inference`), pushed grouped by bench ----------------
BENCH = ["bench", "model", "variant"]
INFERENCE_LATENCY = Gauge(
    "drape_inference_latency_seconds",
    "Latency of one request (scope: denoise or end_to_end; quantile 0.5 or 0.9), one at a time on a warm device",
    [*BENCH, "scope", "quantile"],
    registry=REGISTRY,
)
INFERENCE_SPEEDUP = Gauge(
    "drape_inference_speedup", "Drift-corrected denoise speed-up of a variant over the reference", BENCH, registry=REGISTRY
)
INFERENCE_PEAK_MEMORY = Gauge(
    "drape_inference_peak_memory_bytes",
    "Peak memory of one request (GPU: allocated; CPU: RSS above resident)",
    BENCH,
    registry=REGISTRY,
)
INFERENCE_ATTENTION_COSINE = Gauge(
    "drape_inference_attention_cosine", "Worst attention-block cosine similarity against the reference", BENCH, registry=REGISTRY
)
INFERENCE_OVERLAP = Gauge(
    "drape_inference_overlap", "1 - time of n concurrent requests / (n x one alone)", [*BENCH, "concurrency"], registry=REGISTRY
)
INFERENCE_APPROVED = Gauge(
    "drape_inference_approved", "1 when the variant's quality is within the noise floor, else 0", BENCH, registry=REGISTRY
)

# --- the GPU queue (scheduler/), exported by the dispatcher on /metrics -----------------------------
RUN_COST = Gauge(
    "drape_run_cost_dollars",
    "What the run cost (USD), by category: GPU time training and each overhead, and storage (drape cost report)",
    ["run", "category"],
    registry=REGISTRY,
)
STAGE_COST = Gauge(
    "drape_stage_cost_dollars",
    "What the run's stage cost (USD); promoted: its checkpoint became the baseline",
    ["run", "stage", "promoted"],
    registry=REGISTRY,
)
GPU_PRICE = Gauge(
    "drape_gpu_price_dollars_per_hour",
    "Price of one GPU-hour of the fleet's models at the fleet's plan (cost.fleet_plan)",
    ["model", "plan"],
    registry=REGISTRY,
)
QUEUE_JOBS = Gauge("drape_queue_jobs", "Jobs in the queue by state", ["state"], registry=REGISTRY)
QUEUE_WAIT = Histogram(
    "drape_queue_wait_seconds",
    "Time from submit to start, per started job",
    ["kind"],
    registry=REGISTRY,
    buckets=(1, 10, 60, 300, 900, 1800, 3600, 7200, 14400, 43200, 86400),
)
QUEUE_STARVED = Gauge("drape_queue_starved_jobs", "Queued jobs waiting for more than an hour", registry=REGISTRY)
QUEUE_OLDEST_WAIT = Gauge("drape_queue_oldest_wait_seconds", "Wait so far of the oldest queued job", registry=REGISTRY)
QUEUE_PLACEMENTS = Counter("drape_queue_placements", "Jobs started, by kind and GPU model", ["kind", "model"], registry=REGISTRY)
QUEUE_PLACEMENT_DRIFT = Counter(
    "drape_queue_placement_drift",
    "Jobs found running elsewhere than the queue placed them (kind: node or gpu), books corrected",
    ["engine", "kind"],
    registry=REGISTRY,
)
QUEUE_PREEMPTIONS = Counter(
    "drape_queue_preemptions", "Running jobs preempted for a starving multi-GPU job, by kind", ["kind"], registry=REGISTRY
)
QUEUE_JOB_GPU_MEMORY = GaugeTable(
    "drape_queue_job_gpu_memory_gib",
    "GiB a running queue job holds on a GPU: joins flow runs (run) to queue jobs (job_id) to GPUs (gpu)",
    ["job_id", "kind", "run", "stage", "gpu", "node"],
    registry=REGISTRY,
)
GPU_MEMORY_ALLOCATED = GaugeTable(
    "drape_gpu_memory_allocated_gib", "GPU memory the queue has allocated to jobs", ["gpu", "node", "model"], registry=REGISTRY
)
GPU_MEMORY_CAPACITY = GaugeTable(
    "drape_gpu_memory_capacity_gib", "GPU memory capacity", ["gpu", "node", "model"], registry=REGISTRY
)
ENGINE_GPU_HOURS = Gauge(
    "drape_engine_job_gpu_hours",
    "GPU-hours the engine's own accounting (Slurm's sacct) gives a finished queue job, every run of it",
    ["job_id", "engine", "state"],
    registry=REGISTRY,
)
DISPATCH_CYCLE = Histogram(
    "drape_queue_dispatch_cycle_seconds",
    "Wall time of one dispatch cycle",
    registry=REGISTRY,
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
DISPATCH_ERRORS = Counter(
    "drape_queue_dispatch_errors", "Dispatch cycles that failed (logged; the dispatcher goes on)", registry=REGISTRY
)
QUEUE_DISPATCHER_SILENT = Gauge(
    "drape_queue_dispatcher_silent_seconds",
    "How long a waiting flow's queued job has seen no dispatcher cycle (0: one cycles); pushed by the flow",
    ["run", "stage"],
    registry=REGISTRY,
)
FLEET_SOURCE = Gauge(
    "drape_queue_fleet_source",
    "1 for the source of the fleet view in use (prometheus, ledger, static, local, slurm)",
    ["source"],
    registry=REGISTRY,
)


_CHILDREN: dict[tuple[int, tuple[str, ...]], object] = {}


def child(metric, *values: str):
    """`metric.labels(*values)`, kept: a dispatch cycle counts each job it starts, and `labels()`
    re-validates on every call. Only for metrics nothing clears."""
    key = (id(metric), values)
    found = _CHILDREN.get(key)
    if found is None:
        found = _CHILDREN[key] = metric.labels(*values)
    return found


class _Only:
    """The registry's samples whose labels match `labels` (what one push may carry)."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]):
        self.registry, self.labels = registry, labels

    def collect(self):
        for metric in self.registry.collect():
            kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            kept.samples = [s for s in metric.samples if all(s.labels.get(k) == v for k, v in self.labels.items())]
            if kept.samples:
                yield kept


def series_for(labels: dict[str, str], registry: CollectorRegistry = REGISTRY) -> CollectorRegistry:
    view = CollectorRegistry(auto_describe=False)
    view.register(_Only(registry, labels))
    return view


def exposition(labels: dict[str, str] | None = None) -> str:
    """The text exposition of the registry (or of the series matching `labels`)."""
    return generate_latest(series_for(labels) if labels else REGISTRY).decode()


def serve_metrics(port: int) -> str:
    """Serve the registry on ``/metrics`` at `port` (all interfaces) from a background thread; returns the URL."""
    from prometheus_client import start_http_server

    start_http_server(port, registry=REGISTRY)
    return f"http://0.0.0.0:{port}/metrics"


class _Gateway:
    """What one process pushed to one Pushgateway (url, job): the groups, in order, and since when it
    has been unreachable. A Pushgateway that restarts without a persistence file comes back empty,
    so after an outage every group this process pushed is sent again, with the series' values now."""

    MAX_GROUPS = 512  # a run pushes a group per stage (a queue job per rank): far fewer

    def __init__(self) -> None:
        self.groups: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        self.down_since: float | None = None

    def remember(self, grouping: dict[str, str]) -> None:
        key = tuple(sorted(grouping.items()))
        self.groups.pop(key, None)
        self.groups[key] = dict(grouping)
        while len(self.groups) > self.MAX_GROUPS:
            self.groups.pop(next(iter(self.groups)))


_GATEWAYS: dict[tuple[str, str], _Gateway] = {}


def push_metrics(config, grouping: dict[str, str]) -> bool:
    """Push the series labelled `grouping` to the configured Pushgateway; False when none or it failed.
    A push that fails is held: the next push that gets through (or `flush_metrics`) sends it and every
    group pushed before, for a Pushgateway that restarted lost them (`_Gateway`)."""
    url = config.metrics.pushgateway_url
    if not url:
        return False
    gateway = _GATEWAYS.setdefault((url, config.metrics.job), _Gateway())
    gateway.remember(grouping)
    return _send(config, gateway, [grouping] if gateway.down_since is None else list(gateway.groups.values()))


def flush_metrics(config) -> bool:
    """Send again what pushes held while the Pushgateway was down (a run's close calls it); True when
    nothing is held any more."""
    gateway = _GATEWAYS.get((config.metrics.pushgateway_url or "", config.metrics.job))
    if gateway is None or gateway.down_since is None:
        return True
    return _send(config, gateway, list(gateway.groups.values()))


def _send(config, gateway: _Gateway, groups: list[dict[str, str]]) -> bool:
    url, shown = config.metrics.pushgateway_url, redact_url(config.metrics.pushgateway_url)
    refused = False
    try:
        for grouping in groups:
            try:
                # POST (pushadd): replaces only these metric names in the group, so the trainer's and the flow's pushes coexist
                pushadd_to_gateway(url, job=config.metrics.job, registry=series_for(grouping), grouping_key=grouping, timeout=10)
            except HTTPError as error:
                if error.code >= 500:  # a proxy or the gateway failing: an outage, held below
                    raise
                # the gateway answered and refused these series (e.g. inconsistent with a group's): not an
                # outage, and never sent again, or every later push would fail on it
                refused = True
                gateway.groups.pop(tuple(sorted(grouping.items())), None)
                print(
                    f"drape: the Pushgateway at {shown} refused the series of {grouping} ({error.code}: {error.reason})",
                    file=sys.stderr,
                )
    except OSError as error:  # unreachable or refused: say so, hold the groups, keep training
        if gateway.down_since is None:
            gateway.down_since = time.monotonic()
            print(
                f"drape: metrics push to {shown} failed ({error}); the Pushgateway is down: holding the series, "
                "sent again once it answers; continuing",
                file=sys.stderr,
            )
        return False
    if gateway.down_since is not None:
        print(
            f"drape: the Pushgateway at {shown} answered again after {time.monotonic() - gateway.down_since:.1f} s of "
            f"outage; sent again the {len(groups)} groups of series this process pushed",
            file=sys.stderr,
        )
        SERVICE_OUTAGES.labels(service="pushgateway", outcome="recovered").inc()
        gateway.down_since = None
    return not refused
