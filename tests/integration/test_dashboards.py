"""Every Grafana panel query returns data from a real Prometheus fed by a pipeline run, a queue
dispatch and a DCGM exporter; the dashboards validate as Grafana dashboard JSON; the Prometheus
config and rules pass promtool."""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

import pytest
import yaml

from drape import STAGES
from tests.conftest import (
    PASS_ANYTHING,
    DcgmExporter,
    _free_port,
    prometheus_query,
    start_prometheus,
    tiny_config,
    wait_for_series,
    wait_until,
)

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((REPO / "infra" / "grafana" / "dashboards").glob("*.json"))
RULES = REPO / "infra" / "prometheus" / "rules" / "drape.yml"


def _targets(dashboard: dict) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


def _substitute(expr: str) -> str:
    """The panel's query as the test asks it: every variable matches all, and a subquery's step is
    1 s. A `[24h:1m]` subquery samples at minute boundaries only, so at 1 m a series a few seconds
    old has no point yet; at 1 s it has the same series, labels and joins without a minute's wait."""
    expr = re.sub(r"\$(run|stage|node)\b", ".*", expr).replace("$__rate_interval", "5m")
    return re.sub(r"\[(\w+):1m\]", r"[\1:1s]", expr)


def test_promtool_checks_config_rules_and_rule_unit_tests():
    infra = REPO / "infra" / "prometheus"
    for args in (
        ["check", "config", str(infra / "prometheus.yml")],
        ["check", "rules", str(RULES)],
        ["test", "rules", "drape_test.yml"],
    ):
        result = subprocess.run(["promtool", *args], cwd=infra / "tests", capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}\n{result.stderr}"


def test_dashboards_are_grafana_dashboard_json_and_match_their_generator():
    from grafana_foundation_sdk.models.dashboard import Dashboard

    assert {p.stem for p in DASHBOARDS} == {"fleet", "queue", "pipeline", "storage", "data", "run-gpus"}
    generated = subprocess.run(
        [
            "python",
            "-c",
            "import json, sys; sys.path.insert(0, 'infra/grafana'); import build_dashboards as b; "
            "print(json.dumps({n: f() for n, f in b.DASHBOARDS.items()}))",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    built = json.loads(generated.stdout)
    uids = set()
    for path in DASHBOARDS:
        data = json.loads(path.read_text())
        assert data == built[path.stem], f"{path.name} is stale: run infra/grafana/build_dashboards.py"
        model = Dashboard.from_json(data)  # Grafana's dashboard schema (grafana-foundation-sdk models)
        again = json.loads(json.dumps(model.to_json(), default=lambda o: o.to_json()))
        for key in ("uid", "title", "schemaVersion", "templating", "time"):
            assert key in again, (path.name, key)
        assert len(again["panels"]) == len(data["panels"])
        for before, after in zip(data["panels"], again["panels"]):
            assert after["type"] == before["type"] and after["gridPos"] == before["gridPos"]
            assert [t["expr"] for t in after["targets"]] == [t["expr"] for t in before["targets"]]
            assert before["gridPos"]["x"] + before["gridPos"]["w"] <= 24
        assert len({p["id"] for p in data["panels"]}) == len(data["panels"])
        uids.add(data["uid"])
    assert len(uids) == len(DASHBOARDS)


@pytest.fixture(scope="module")
def fed_prometheus(tmp_path_factory, pushgateway, prefect_harness):
    """Prometheus scraping the Pushgateway, this process's /metrics (the in-process queue dispatch)
    and a DCGM exporter, after a tiny staged-training run whose train jobs went through the queue."""
    from prometheus_client import start_http_server

    from drape.ops.metrics import REGISTRY
    from flows.staged_training import staged_training

    root = tmp_path_factory.mktemp("dashboards")
    exporter = DcgmExporter(
        [
            {
                "index": i,
                "uuid": f"GPU-{i:04d}",
                "host": "gpu-node-a",
                "model": "NVIDIA H100 80GB HBM3",
                "total_mib": 81559,
                "used_mib": 512 + 30000 * i,
                "util": 0 if i == 0 else 93,
            }
            for i in range(2)
        ]
    )
    port = _free_port()
    server, _ = start_http_server(port, addr="127.0.0.1", registry=REGISTRY)
    url, process = start_prometheus(
        root / "prometheus",
        {
            "pushgateway": [pushgateway.removeprefix("http://")],
            "drape-dispatcher": [f"127.0.0.1:{port}"],
            "dcgm": [exporter.target],
        },
        rule_files=[str(RULES)],
    )
    started = time.time()
    try:
        assert wait_for_series(url, "DCGM_FI_DEV_FB_USED"), "Prometheus never scraped the DCGM exporter"
        config = tiny_config(
            root / "drape",
            metrics={"pushgateway_url": pushgateway},
            queue={"enabled": True, "fleet": "prometheus", "prometheus_url": url, "poll_seconds": 0.2},
            retention={"live_budget_bytes": 10**9},
            # the series are the subject, not the model: a few steps a stage, gates any output but a flat one passes
            train={"stages": {stage: {"steps": 30 if stage == "identity" else 10} for stage in STAGES}},
            gates=PASS_ANYTHING,
        )
        path = root / "tiny.yaml"
        path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
        summary = staged_training(config_path=str(path), run_name="dashboards")
        ended = time.time()
        wait_until(
            lambda: _scraped_and_evaluated_since(url, ended),
            30,
            "two scrapes of every target and a rule evaluation after the run (a rate needs two samples)",
        )
        yield url, started, summary
    finally:
        process.terminate()
        process.wait(timeout=10)
        exporter.close()
        server.shutdown()


def _scraped_and_evaluated_since(url: str, since: float) -> bool:
    """Every target scraped at least twice since `since` (scraped each second: a scrape after `since` + 1 s
    had one before it after `since`), and every rule group evaluated after both (after `since` + 2 s)."""
    last_scrapes = [float(s["value"][0]) for s in prometheus_query(url, "timestamp(up)")]
    groups = json.loads(urllib.request.urlopen(f"{url}/api/v1/rules", timeout=10).read())["data"]["groups"]
    evaluations = [_rfc3339(group["lastEvaluation"]) for group in groups]
    return bool(last_scrapes and evaluations) and min(last_scrapes) > since + 1 and min(evaluations) > since + 2


def _rfc3339(stamp: str) -> float:
    """Prometheus's RFC 3339 time (nanoseconds, `Z`) as Unix seconds."""
    from datetime import datetime

    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(whole + "+00:00").timestamp() + float(f"0.{fraction or 0}")


def _range_has_data(url: str, expr: str, start: float) -> bool:
    query = urlencode({"query": expr, "start": f"{start:.3f}", "end": f"{time.time():.3f}", "step": "1"})
    answer = json.loads(urllib.request.urlopen(f"{url}/api/v1/query_range?{query}", timeout=30).read())
    assert answer["status"] == "success", (expr, answer)
    return any(series["values"] for series in answer["data"]["result"])


def test_every_panel_query_returns_data(fed_prometheus):
    url, started, summary = fed_prometheus
    assert all(row["verdict"] == "pass" for row in summary["stages"])
    empty = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text())
        for variable in dashboard["templating"]["list"]:
            if variable["type"] == "query":
                metric, label = re.match(r"label_values\((\w+), (\w+)\)", variable["query"]["query"]).groups()
                assert any(label in s["metric"] for s in prometheus_query(url, metric)), (path.name, variable["name"])
        for title, expr in _targets(dashboard):
            if not _range_has_data(url, _substitute(expr), started):
                empty.append(f"{path.name}: {title}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_run_joins_to_its_queue_jobs_and_gpus(fed_prometheus):
    url, started, summary = fed_prometheus
    run = summary["run_id"]
    expr = f'drape_queue_job_gpu_memory_gib{{run="{run}"}}'
    assert _range_has_data(url, expr, started)
    joined = (
        f'DCGM_FI_DEV_GPU_UTIL and on (UUID) label_replace(drape_queue_job_gpu_memory_gib{{run="{run}"}}, '
        '"UUID", "$1", "gpu", "(.*)")'
    )
    assert _range_has_data(url, joined, started)  # the run's train jobs sat on the idle DCGM GPU


def test_alert_rules_load_and_the_live_budget_series_is_there(fed_prometheus):
    url, _, summary = fed_prometheus
    rules = json.loads(urllib.request.urlopen(f"{url}/api/v1/rules", timeout=10).read())["data"]["groups"]
    names = {rule["name"] for group in rules for rule in group["rules"]}
    assert {
        "DrapeGateFailed",
        "DrapeDataWaitHigh",
        "DrapeJobsStarved",
        "DrapeGpusIdleWhileJobsWait",
        "DrapeLiveStorageOverBudget",
        "drape:data_wait_ratio",
    } <= names
    assert all(rule.get("health") == "ok" for group in rules for rule in group["rules"])
    assert prometheus_query(url, f'drape_live_budget_bytes{{run="{summary["run_id"]}"}}')
