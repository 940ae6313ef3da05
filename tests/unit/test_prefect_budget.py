"""Prefect's client within `orchestration.max_wait_seconds` (issue 68): an API that accepts TCP and
never answers held a flow's start 428.6 s with Prefect's defaults; within the budget it is a
PrefectUnavailable naming the API URL, never its credentials."""

from __future__ import annotations

import time

import pytest

from drape.config import load_config
from flows.budget import PrefectUnavailable, backoff_seconds, client_budget, prefect_bounds
from tests.conftest import silent_endpoint


def test_the_default_budget_is_at_most_a_minute_and_the_attempts_fit_it():
    budget = load_config("configs/demo.yaml").orchestration.max_wait_seconds
    bounds = prefect_bounds(budget)
    timeout, retries = int(bounds["PREFECT_API_REQUEST_TIMEOUT"]), int(bounds["PREFECT_CLIENT_MAX_RETRIES"])
    assert budget <= 60 and retries >= 2  # still carries a run through a restart of a few seconds
    assert (retries + 1) * timeout + backoff_seconds(retries) <= budget
    assert 6 * 60 + backoff_seconds(5) > 400  # Prefect's defaults: 6 attempts of 60 s and backoff
    assert prefect_bounds(10) == {"PREFECT_API_REQUEST_TIMEOUT": "10", "PREFECT_CLIENT_MAX_RETRIES": "0"}
    assert prefect_bounds(3) == {"PREFECT_API_REQUEST_TIMEOUT": "3", "PREFECT_CLIENT_MAX_RETRIES": "0"}  # the tests' budget


def test_a_silent_prefect_api_is_a_clear_error_within_the_budget(monkeypatch):
    from prefect import flow
    from prefect.settings import PREFECT_API_URL, temporary_settings

    for name in ("PREFECT_API_REQUEST_TIMEOUT", "PREFECT_CLIENT_MAX_RETRIES"):
        monkeypatch.delenv(name, raising=False)
    endpoint = silent_endpoint(monkeypatch).replace("http://", "http://drape:hunter2@") + "/api"

    @flow
    def nothing() -> int:
        return 1

    started = time.monotonic()  # a budget of 3 s: the wait the test spends is the budget
    with temporary_settings(updates={PREFECT_API_URL: endpoint}), pytest.raises(PrefectUnavailable) as raised:
        with client_budget(3):
            nothing()
    assert time.monotonic() - started <= 3 + 5  # the budget, and slack for a loaded machine (the defaults: 428.6 s)
    message = str(raised.value)
    assert "did not answer within orchestration.max_wait_seconds 3 s" in message
    assert endpoint.split("@")[1] in message and "hunter2" not in message


def test_drape_run_against_a_silent_prefect_api_exits_1_with_one_line_naming_it(tmp_path, monkeypatch):
    import yaml
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from typer.testing import CliRunner

    from drape.cli import app
    from tests.conftest import tiny_config

    for name in ("PREFECT_API_REQUEST_TIMEOUT", "PREFECT_CLIENT_MAX_RETRIES"):
        monkeypatch.delenv(name, raising=False)
    endpoint = silent_endpoint(monkeypatch) + "/api"
    path = tmp_path / "config.yaml"
    config = tiny_config(tmp_path / "drape", orchestration={"max_wait_seconds": 3})  # the wait the test spends
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True)))
    started = time.monotonic()
    with temporary_settings(updates={PREFECT_API_URL: endpoint}):
        result = CliRunner().invoke(app, ["run", "--config", str(path)])
    assert time.monotonic() - started < 90  # the flow's imports and the budget (Prefect's defaults: 428.6 s)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"the Prefect API at {endpoint} did not answer within" in " ".join(result.output.split())


def test_flows_a_worker_starts_get_the_default_budget():
    """A flow run a worker starts (`prefect deployment run`) never passes through `drape run`'s
    `client_budget`: every pool's environment carries the bounds of the default budget."""
    import json
    from pathlib import Path

    import yaml

    from drape.config import OrchestrationConfig
    from flows.budget import prefect_bounds

    repo = Path(__file__).resolve().parents[2]
    bounds = prefect_bounds(OrchestrationConfig().max_wait_seconds)
    deployments = yaml.safe_load((repo / "deployments" / "prefect.yaml").read_text())["deployments"]
    template = json.loads((repo / "deployments" / "gpu-k8s-job-template.json").read_text())
    container = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][0]
    assert bounds.items() <= {variable["name"]: variable["value"] for variable in container["env"]}.items()
    for deployment in deployments:
        pool = deployment["work_pool"]
        if pool["name"] != "gpu-k8s":  # the process pools: the deployment's job variables
            assert bounds.items() <= pool["job_variables"]["env"].items(), deployment["name"]
