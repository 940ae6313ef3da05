"""Render the `drape / pipeline` Grafana dashboard's panels from a real Prometheus into a PNG for the docs.

Grafana cannot run here, so this is not a screenshot: it is a matplotlib rendering of the panels of
infra/grafana/dashboards/pipeline.json (their titles, layout, queries, legends and units), each
query answered by a real Prometheus (Debian's `prometheus`, as the integration tests run it) that
scraped drape's metrics registry every second while a real run of the demo config trained and
gated its identity and texture stages in this process (`drape.pipeline`, no Prefect). A panel whose
query returns nothing says "No data", as Grafana would.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python docs/examples/dashboard_panels.py

About 110 s of CPU (7 minutes' wall time on a 2-core machine shared with other work).
Writes docs/img/dashboard-pipeline.png (refused over 300 KB).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlencode

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "infra" / "grafana" / "dashboards" / "pipeline.json"
OUTPUT = REPO / "docs" / "img" / "dashboard-pipeline.png"
STAGES = ("identity", "texture")
MAX_IMAGE_BYTES = 300_000
UNIT_SCALE = {"bytes": (2**20, "MiB"), "s": (1, "s"), "currencyUSD": (1, "$")}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_prometheus(directory: Path, target: str) -> tuple[str, subprocess.Popen]:
    """Prometheus on 127.0.0.1 scraping `target` every second: (URL, process)."""
    config = {
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{"job_name": "drape", "honor_labels": True, "static_configs": [{"targets": [target]}]}],
    }
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    command = ["prometheus", f"--config.file={directory / 'prometheus.yml'}", f"--storage.tsdb.path={directory / 'data'}"]
    process = subprocess.Popen([*command, f"--web.listen-address=127.0.0.1:{port}"], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(120):
        try:
            urllib.request.urlopen(f"{url}/-/ready", timeout=2)
            return url, process
        except OSError:
            time.sleep(0.5)
    process.terminate()
    raise SystemExit("prometheus did not become ready in 60 s")


def run_stages(root: Path) -> str:
    """A real run of the demo config (root under `root`): each of STAGES trained, gated, promoted, archived."""
    from drape import pipeline
    from drape.config import load_config

    data = yaml.safe_load((REPO / "configs" / "demo.yaml").read_text())
    data["paths"]["root"] = str(root / "drape")
    (root / "demo.yaml").write_text(yaml.safe_dump(data))
    config = load_config(root / "demo.yaml")
    context = pipeline.start_run(config, run_name="docs-dashboard")
    for stage in STAGES:
        pipeline.prestage(config, context, stage)
        trained = pipeline.train(config, context, stage)
        report = pipeline.gate(config, context, stage, trained.checkpoint)
        if not report.passed:
            raise SystemExit(f"stage {stage}: the gate failed ({report.failures()}); the rendering needs a passing run")
        row = pipeline.passed_gate(config, context, stage, trained, report)
        row = {**row, "version": pipeline.snapshot(config, context, stage, row)["version"]}
        pipeline.archive_passed(config, context, stage, row)
    return context.run_id


def query_range(url: str, expr: str, start: float, end: float) -> list[dict]:
    expr = re.sub(r"\$(run|stage|node)\b", ".*", expr)
    query = urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "2"})
    answer = json.loads(urllib.request.urlopen(f"{url}/api/v1/query_range?{query}", timeout=30).read())
    if answer["status"] != "success":
        raise SystemExit(f"query {expr!r} failed: {answer}")
    return answer["data"]["result"]


def _legend(target: dict, labels: dict) -> str:
    return re.sub(r"\{\{(\w+)\}\}", lambda m: labels.get(m.group(1), ""), target.get("legendFormat", "")).strip()


def _series(url: str, panel: dict, window: tuple[float, float]) -> list[tuple[str, list[float], list[float]]]:
    """(legend, times, values) of every series each of the panel's queries returns over `window`."""
    found = []
    for target in panel["targets"]:
        for series in query_range(url, target["expr"], *window):
            times, values = zip(*((float(t), float(v)) for t, v in series["values"]))
            found.append((_legend(target, series["metric"]), list(times), list(values)))
    return found


def _format(value: float, unit: str) -> str:
    if unit == "dateTimeAsIso":
        return datetime.fromtimestamp(value / 1000, UTC).strftime("%H:%M:%S")
    scale, suffix = UNIT_SCALE.get(unit, (1, ""))
    return f"{value / scale:.3g} {suffix}".strip()


def draw_timeseries(ax, series, unit: str, start: float) -> None:
    scale, suffix = UNIT_SCALE.get(unit, (1, ""))
    for legend, times, values in series:
        ax.plot([(t - start) / 60 for t in times], [v / scale for v in values], label=legend, linewidth=1.4)
    ax.set_xlabel("minutes into the run", fontsize=7)
    ax.set_ylabel(suffix, fontsize=7)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, loc="best", ncol=2)


def draw_values(ax, series, unit: str) -> None:
    """A stat or table panel: each series' last value, one line each (Grafana's lastNotNull)."""
    ax.axis("off")
    rows = [(legend or "value", _format(values[-1], unit)) for legend, _, values in series]
    size = 18 if len(rows) <= 2 else 8
    for index, (legend, value) in enumerate(rows[:12]):
        ax.text(0.02, 0.88 - index * (0.8 / max(len(rows[:12]), 1)), f"{legend}:  {value}", fontsize=size, va="top")


def render(url: str, window: tuple[float, float], run_id: str) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in dashboard["panels"])
    figure = plt.figure(figsize=(15, rows * 0.3 + 1.0), dpi=72)
    title = f"{dashboard['title']}: a matplotlib rendering of the dashboard's panels (not a Grafana screenshot)"
    figure.suptitle(
        f"{title}\nqueries answered by a real Prometheus after run {run_id} (demo config, stages {', '.join(STAGES)})"
    )
    top, unit_height = 1 - 1.0 / (rows * 0.3 + 1.0), (1 - 1.0 / (rows * 0.3 + 1.0)) / rows
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        left, bottom = grid["x"] / 24 + 0.035, top - (grid["y"] + grid["h"]) * unit_height + 0.035
        ax = figure.add_axes((left, bottom, grid["w"] / 24 - 0.05, grid["h"] * unit_height - 0.06))
        ax.set_title(panel["title"], fontsize=9, loc="left")
        series, unit = _series(url, panel, window), panel["fieldConfig"]["defaults"].get("unit", "short")
        if not series:
            ax.axis("off")
            ax.text(0.5, 0.5, "No data", ha="center", va="center", fontsize=12, color="grey")
        elif panel["type"] == "timeseries":
            draw_timeseries(ax, series, unit, window[0])
        else:
            draw_values(ax, series, unit)
    figure.savefig(OUTPUT)
    if OUTPUT.stat().st_size > MAX_IMAGE_BYTES:
        raise SystemExit(f"{OUTPUT}: {OUTPUT.stat().st_size} bytes, over {MAX_IMAGE_BYTES}")


def main() -> int:
    from prometheus_client import start_http_server

    from drape.ops.metrics import REGISTRY

    with tempfile.TemporaryDirectory(prefix="drape-dashboard-") as tmp:
        port = _free_port()
        server, _ = start_http_server(port, addr="127.0.0.1", registry=REGISTRY)
        url, process = start_prometheus(Path(tmp), f"127.0.0.1:{port}")
        try:
            started = time.time()
            run_id = run_stages(Path(tmp))
            time.sleep(5)  # a few more scrapes
            render(url, (started, time.time()), run_id)
        finally:
            process.terminate()
            process.wait(timeout=20)
            server.shutdown()
    print(f"wrote {OUTPUT} ({OUTPUT.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
