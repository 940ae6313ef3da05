"""Writes drape's Grafana dashboards (infra/grafana/dashboards/*.json) from one description.

    .venv/bin/python infra/grafana/build_dashboards.py

Every panel query uses only drape_* series, the DCGM exporter's series and the recording rules in
infra/prometheus/rules/; template variables filter with regex matchers (`=~"$run"`), so the
dashboards stay usable with "All". tests/integration/test_dashboards.py runs every query against a
real Prometheus fed by a pipeline run, a queue dispatch and a DCGM exporter, and requires data.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).parent / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def variable(name: str, query: str, label: str) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "sort": 1,
    }


DATASOURCE_VARIABLE = {
    "name": "datasource",
    "label": "Prometheus",
    "type": "datasource",
    "query": "prometheus",
    "current": {"text": "Prometheus", "value": "prometheus"},
}
RUN = variable("run", "label_values(drape_gate_passed, run)", "run")
STAGE = variable("stage", "label_values(drape_gate_passed, stage)", "stage")
NODE = variable("node", "label_values(DCGM_FI_DEV_GPU_UTIL, Hostname)", "GPU node")


def panel(
    title: str,
    exprs: list[tuple[str, str]],
    *,
    kind: str = "timeseries",
    unit: str = "short",
    width: int = 12,
    height: int = 8,
    description: str = "",
    legend: str | None = None,
) -> dict:
    targets = [
        {"refId": chr(65 + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": fmt, "range": True, "instant": False}
        for i, (expr, fmt) in enumerate(exprs)
    ]
    body = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": targets,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "gridPos": {"h": height, "w": width, "x": 0, "y": 0},
    }
    if kind == "timeseries":
        body["options"] = {
            "legend": {"displayMode": "table" if legend == "table" else "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif kind == "stat":
        body["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "justifyMode": "auto",
            "orientation": "auto",
            "textMode": "auto",
        }
    elif kind == "table":
        body["options"] = {"showHeader": True, "cellHeight": "sm"}
        body["transformations"] = [{"id": "reduce", "options": {"reducers": ["lastNotNull"], "mode": "seriesToRows"}}]
    return body


def dashboard(uid: str, title: str, description: str, panels: list[dict], variables: list[dict]) -> dict:
    x = y = row_height = 0
    for index, item in enumerate(panels, 1):
        item["id"] = index
        width, height = item["gridPos"]["w"], item["gridPos"]["h"]
        if x + width > 24:
            x, y = 0, y + row_height
            row_height = 0
        item["gridPos"].update(x=x, y=y)
        x, row_height = x + width, max(row_height, height)
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["drape"],
        "timezone": "utc",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [DATASOURCE_VARIABLE, *variables]},
        "annotations": {"list": []},
        "links": [{"title": "drape dashboards", "type": "dashboards", "tags": ["drape"], "asDropdown": True}],
        "panels": panels,
    }


R, S = 'run=~"$run"', 'stage=~"$stage"'


def fleet() -> dict:
    node = 'Hostname=~"$node"'
    return dashboard(
        "drape-fleet",
        "drape / fleet utilization",
        "GPU utilization and framebuffer per GPU and node (DCGM exporter)",
        [
            panel(
                "GPU utilization per GPU",
                [(f"DCGM_FI_DEV_GPU_UTIL{{{node}}}", "{{Hostname}} gpu{{gpu}}")],
                unit="percent",
                width=24,
            ),
            panel(
                "Average utilization per node",
                [(f"drape:dcgm_gpu_utilization:avg{{{node}}}", "{{Hostname}} {{modelName}}")],
                unit="percent",
            ),
            panel("Idle GPUs (utilization < 5%)", [("drape:dcgm_idle_gpus", "idle GPUs")], kind="stat", width=6),
            panel(
                "Fleet utilization", [(f"avg(DCGM_FI_DEV_GPU_UTIL{{{node}}})", "all GPUs")], kind="stat", unit="percent", width=6
            ),
            panel(
                "Framebuffer used per GPU",
                [(f"DCGM_FI_DEV_FB_USED{{{node}}} * 1048576", "{{Hostname}} gpu{{gpu}}")],
                unit="bytes",
            ),
            panel(
                "Framebuffer free per GPU",
                [(f"DCGM_FI_DEV_FB_FREE{{{node}}} * 1048576", "{{Hostname}} gpu{{gpu}}")],
                unit="bytes",
            ),
            panel(
                "Framebuffer used per node",
                [(f"sum by (Hostname) (DCGM_FI_DEV_FB_USED{{{node}}}) * 1048576", "{{Hostname}}")],
                unit="bytes",
                width=24,
            ),
        ],
        [NODE],
    )


# $/h of the GPUs the queue has allocated nothing on, each at its model's price (drape cost fleet)
IDLE_COST = (
    "sum by (model) ((drape_gpu_memory_allocated_gib == bool 0) "
    "* on (model) group_left max by (model) (drape_gpu_price_dollars_per_hour))"
)


def queue() -> dict:
    return dashboard(
        "drape-queue",
        "drape / GPU queue",
        "Depth, waits, starvation and placements of the memory-profile-aware queue",
        [
            panel("Jobs by state", [("drape_queue_jobs", "{{state}}")], width=12),
            panel("Starved jobs (waiting > 1 h)", [("drape_queue_starved_jobs", "starved")], kind="stat", width=6),
            panel(
                "Oldest queued job has waited", [("drape_queue_oldest_wait_seconds", "oldest")], kind="stat", unit="s", width=6
            ),
            panel(
                "Wait p95 (started jobs)",
                [
                    ("drape:queue_wait_seconds:p95", "p95"),
                    ("histogram_quantile(0.5, sum by (le) (drape_queue_wait_seconds_bucket))", "p50"),
                ],
                unit="s",
            ),
            panel("Placements by GPU class", [("sum by (model, kind) (drape_queue_placements_total)", "{{model}} {{kind}}")]),
            panel(
                "Placement drift (jobs found elsewhere than placed, per hour)",
                [("sum by (engine, kind) (increase(drape_queue_placement_drift_total[1h]))", "{{engine}} {{kind}}")],
                width=12,
            ),
            panel(
                "GPU memory allocated vs capacity per node",
                [
                    ("sum by (node) (drape_gpu_memory_allocated_gib) * 1073741824", "{{node}} allocated"),
                    ("sum by (node) (drape_gpu_memory_capacity_gib) * 1073741824", "{{node}} capacity"),
                ],
                unit="bytes",
            ),
            panel(
                "Allocated share per node and GPU model",
                [("drape:gpu_memory_allocated_ratio", "{{node}} {{model}}")],
                unit="percentunit",
            ),
            panel(
                "Dispatch cycle time (p95)",
                [("histogram_quantile(0.95, sum by (le) (drape_queue_dispatch_cycle_seconds_bucket))", "p95")],
                unit="s",
                width=12,
            ),
            panel("Fleet view source", [("drape_queue_fleet_source == 1", "{{source}}")], kind="stat", width=12),
            panel("Idle capacity cost at the fleet's plan", [(IDLE_COST, "{{model}}")], unit="currencyUSD", width=12),
            panel(
                "Idle capacity cost, last 24 h",
                [(f"sum(sum_over_time((sum({IDLE_COST}))[24h:1m])) / 60", "idle")],
                kind="stat",
                unit="currencyUSD",
                width=12,
            ),
        ],
        [],
    )


def pipeline() -> dict:
    return dashboard(
        "drape-pipeline",
        "drape / pipeline",
        "Stage timeline, gate values against thresholds, promotions",
        [
            panel(
                "Stage timeline: when each step finished",
                [(f"drape_stage_finished_timestamp_seconds{{{R},{S}}} * 1000", "{{run}} {{stage}} {{step}}")],
                kind="table",
                unit="dateTimeAsIso",
                width=24,
            ),
            panel("Step durations", [(f"drape_stage_step_seconds{{{R},{S}}}", "{{stage}} {{step}}")], unit="s"),
            panel("Train throughput", [(f"drape_train_samples_per_second{{{R},{S}}}", "{{stage}}")], unit="short"),
            panel(
                "Gate values (lower bound) vs thresholds",
                [
                    (f'drape_gate_check_value{{{R},{S},aggregate="lower"}}', "{{stage}} {{check}}"),
                    (f"drape_gate_check_threshold{{{R},{S}}}", "{{stage}} {{check}} threshold"),
                ],
                width=24,
                legend="table",
            ),
            panel(
                "Gate verdicts (1 pass, 0 fail)", [(f"drape_gate_passed{{{R},{S}}}", "{{run}} {{stage}}")], kind="stat", width=8
            ),
            panel(
                "Promotions",
                [(f"sum by (stage) (drape_snapshot_promotions_total{{{R},{S}}})", "{{stage}}")],
                kind="stat",
                width=8,
            ),
            panel("Baseline versions", [(f"drape_snapshot_baseline_version{{{R},{S}}}", "{{stage}}")], kind="stat", width=8),
            panel(
                "Cost per run by category",
                [(f"drape_run_cost_dollars{{{R}}}", "{{run}} {{category}}")],
                kind="table",
                unit="currencyUSD",
            ),
            panel(
                "Cost per promoted checkpoint",
                [
                    (f'drape_stage_cost_dollars{{{R},{S},promoted="true"}}', "{{run}} {{stage}}"),
                    (f"sum by (run) (drape_run_cost_dollars{{{R}}})", "{{run}} whole run"),
                ],
                kind="table",
                unit="currencyUSD",
            ),
        ],
        [RUN, STAGE],
    )


def storage() -> dict:
    return dashboard(
        "drape-storage",
        "drape / storage",
        "Live vs archived bytes and the modelled monthly cost",
        [
            panel(
                "Live storage after each archive",
                [(f"drape_live_bytes{{{R},{S}}}", "{{run}} {{stage}}"), (f"drape_live_budget_bytes{{{R},{S}}}", "budget")],
                unit="bytes",
            ),
            panel("Archived per stage", [(f"drape_archived_bytes{{{R},{S}}}", "{{run}} {{stage}}")], unit="bytes"),
            panel(
                "Archived total vs live",
                [(f"sum(drape_archived_bytes{{{R}}})", "archived"), (f"max(drape_live_bytes{{{R}}})", "live")],
                kind="stat",
                unit="bytes",
                width=12,
            ),
            panel(
                "Modelled storage cost",
                [("drape:storage_cost_usd_month", "USD / month")],
                kind="stat",
                unit="currencyUSD",
                width=12,
            ),
        ],
        [RUN, STAGE],
    )


def data() -> dict:
    return dashboard(
        "drape-data",
        "drape / data",
        "Data-wait of the trainer and pre-staging of stage shards",
        [
            panel(
                "Data-wait share of step time", [(f"drape:data_wait_ratio{{{R},{S}}}", "{{run}} {{stage}}")], unit="percentunit"
            ),
            panel(
                "Data-wait per step (p99)",
                [(f"histogram_quantile(0.99, sum by (le, stage) (drape_data_wait_seconds_bucket{{{R},{S}}}))", "{{stage}}")],
                unit="s",
            ),
            panel(
                "Data-wait share per rank",
                [
                    (
                        f"sum by (run, stage, rank) (drape_data_wait_seconds_sum{{{R},{S}}}) / "
                        f"sum by (run, stage, rank) (drape_train_step_seconds_sum{{{R},{S}}})",
                        "{{stage}} rank {{rank}}",
                    )
                ],
                unit="percentunit",
            ),
            panel(
                "Step time (p50)",
                [(f"histogram_quantile(0.5, sum by (le, stage) (drape_train_step_seconds_bucket{{{R},{S}}}))", "{{stage}}")],
                unit="s",
            ),
            panel(
                "Pre-staged shards",
                [
                    (f"drape_prestage_bytes{{{R},{S}}}", "{{stage}} in cache"),
                    (f"drape_prestage_downloaded_bytes{{{R},{S}}}", "{{stage}} downloaded"),
                ],
                unit="bytes",
            ),
            panel("Pre-stage time", [(f'drape_stage_step_seconds{{{R},{S},step="prestage"}}', "{{stage}}")], unit="s", width=24),
        ],
        [RUN, STAGE],
    )


def run_gpus() -> dict:
    gpus_of_run = 'label_replace(drape_queue_job_gpu_memory_gib{run=~"$run"}, "UUID", "$1", "gpu", "(.*)")'
    return dashboard(
        "drape-run-gpus",
        "drape / run → jobs → GPUs",
        "Which queue jobs a flow run has, and the GPUs they run on",
        [
            panel(
                "Queue jobs of the run, the GPUs they hold (GiB)",
                [('drape_queue_job_gpu_memory_gib{run=~"$run"}', "{{job_id}}")],
                kind="table",
                width=24,
            ),
            panel(
                "Utilization of the run's GPUs",
                [(f"DCGM_FI_DEV_GPU_UTIL and on (UUID) {gpus_of_run}", "{{Hostname}} gpu{{gpu}}")],
                unit="percent",
            ),
            panel(
                "Framebuffer used on the run's GPUs",
                [(f"(DCGM_FI_DEV_FB_USED and on (UUID) {gpus_of_run}) * 1048576", "{{Hostname}} gpu{{gpu}}")],
                unit="bytes",
            ),
            panel(
                "Memory the queue allocated to the run's jobs",
                [('sum by (job_id, stage) (drape_queue_job_gpu_memory_gib{run=~"$run"}) * 1073741824', "{{stage}} {{job_id}}")],
                unit="bytes",
                width=24,
            ),
        ],
        [RUN],
    )


DASHBOARDS = {"fleet": fleet, "queue": queue, "pipeline": pipeline, "storage": storage, "data": data, "run-gpus": run_gpus}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, build in DASHBOARDS.items():
        (OUT / f"{name}.json").write_text(json.dumps(build(), indent=2) + "\n")
        print(f"wrote {OUT / name}.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
