"""Deployments the way operators run them: a real `prefect server start`, work pools, `prefect deploy`,
a process worker running a queued job's flow run, then a clean teardown. A whole staged-training run
through `prefect deployment run ... --watch` on a server and worker is the rehearsal's first run
(tests/integration/test_rehearsal.py), which also checks its task runs and gate-report artifacts."""

from __future__ import annotations

import json
import re
import time
import urllib.request

import kubernetes_validate
import pytest
import yaml

from drape.cli.stack import GPU_TEMPLATE, PREFECT_FILE, Stack, free_port
from tests.conftest import prefect_api, tiny_config, wait_until

pytestmark = pytest.mark.slow

EXPECTED_DEPLOYMENTS = {
    "staged-training/demo",
    "staged-training/rehearsal",
    "staged-training/h100",
    "staged-training/h100-finetune",
    "staged-training/slurm",
    "queue-dispatcher/slurm",
    "retention-sweep/weekly",
    "retention-sweep/production",
    "prestage-dataset/demo",
    "queue-dispatcher/demo",
    "inference-benchmark/demo",
    "inference-benchmark/h100",
}


def _api(stack: Stack, path: str, body: dict) -> list | dict:
    return prefect_api(stack.api_url, path, body)


def test_prefect_yaml_uses_anchors_and_the_gpu_template_renders_a_valid_job():
    text = PREFECT_FILE.read_text()
    assert "&local" in text and "*local" in text and "<<: *staged_training" in text
    config = yaml.safe_load(text)
    names = {f"{d['entrypoint'].split(':')[1].replace('_', '-')}/{d['name']}" for d in config["deployments"]}
    assert names == EXPECTED_DEPLOYMENTS
    template = json.loads(GPU_TEMPLATE.read_text())
    variables = template["variables"]["properties"]
    values = {name: spec.get("default") for name, spec in variables.items()}
    values.update(
        name="drape-flow-run",
        command="prefect flow-run execute",
        labels={"drape.ai/flow": "staged-training"},
        finished_job_ttl=86400,
    )
    # a flow run cannot choose what runs, as whom, with which environment or which node paths
    assert not {"image", "service_account_name", "env", "namespace", "live_root", "shard_cache_host_path"} & set(variables)
    assert template["variables"]["additionalProperties"] is False

    def render(node):
        if isinstance(node, dict):
            return {k: render(v) for k, v in node.items()}
        if isinstance(node, list):
            return [render(v) for v in node]
        if isinstance(node, str) and node.startswith("{{ ") and node.endswith(" }}"):
            return values.get(node[3:-3])
        return node

    manifest = render(template["job_configuration"]["job_manifest"])
    manifest["metadata"]["name"] = "drape-flow-run-abc"
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": "PREFECT_API_URL", "value": "http://prefect-server:4200/api"}]  # as the worker sets it
    container["args"] = container["args"].split()
    kubernetes_validate.validate(manifest, "1.33", strict=True)
    assert container["image"] == "ghcr.io/drape-ai/drape:0.1.0"
    assert manifest["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    # the flow pod is CPU-only: its stage jobs ask the queue for a node's GPUs, so a flow pod holding any
    # would keep its own stage from starting; nor does it tolerate the GPU nodes' taint
    pod = manifest["spec"]["template"]["spec"]
    assert not any("gpu" in name for part in container["resources"].values() for name in part), container["resources"]
    assert container["resources"] == {
        "limits": {"cpu": "16", "memory": "64Gi"},
        "requests": {"cpu": "4", "memory": "16Gi"},
    }
    assert "nodeSelector" not in pod and "tolerations" not in pod and "gpu" not in json.dumps(pod).replace("gpu-k8s", "")
    deployed = yaml.safe_load(text)["definitions"]["work_pools"]["gpu_k8s"]["job_variables"]
    assert set(deployed) <= set(variables) and not {"gpus", "gpu_product"} & (set(deployed) | set(variables))
    dshm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert dshm["emptyDir"] == {"medium": "Memory", "sizeLimit": "2Gi"}
    assert {v["name"] for v in manifest["spec"]["template"]["spec"]["volumes"]} >= {"shard-cache", "live-root"}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    from drape.config import load_config
    from drape.mounts import job_paths, model_paths

    h100 = load_config(PREFECT_FILE.parents[1] / "configs" / "h100.yaml")
    assert set(job_paths(h100)) <= mounts  # the flow pod sees the paths its config writes to
    read_only = {m["mountPath"] for m in container["volumeMounts"] if m.get("readOnly")}
    assert all(any(path == m or path.startswith(f"{m}/") for m in read_only) for path in model_paths(h100))


def _a_deployment_run_through_the_worker(stack: Stack, config, config_path) -> None:
    """`prefect deployment run` as a person types it: the worker picks the flow run up and it completes."""
    from drape.data.dataset import ensure_dataset
    from drape.storage.store import open_store

    ensure_dataset(config, open_store(config))  # what the flow run pre-stages
    parameters = json.dumps({"config_path": str(config_path), "stages": ["control"]})
    said = stack.prefect("deployment", "run", "prestage-dataset/demo", "--params", parameters, timeout=60)
    run_id = re.search(r"UUID: ([0-9a-f-]{36})", said.stdout)
    assert run_id, said.stdout[-2000:]

    def ended() -> dict | None:
        flow_run = json.loads(urllib.request.urlopen(f"{stack.api_url}/flow_runs/{run_id.group(1)}", timeout=10).read())
        return flow_run if flow_run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None

    flow_run = wait_until(ended, 180, "the deployment's flow run to end", every=0.2)
    assert flow_run["state"]["type"] == "COMPLETED", flow_run["state"]


def test_deploy_and_run_a_flow_run_through_a_worker(tmp_path, monkeypatch):
    started = time.monotonic()
    monkeypatch.setenv("PREFECT_WORKER_QUERY_SECONDS", "0.5")  # the worker asks for scheduled runs every 0.5 s, not 10
    config = tiny_config(tmp_path / "drape")
    config_path = tmp_path / "tiny.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    stack = Stack(tmp_path / "prefect", free_port())
    try:
        stack.start_server()
        notes = stack.create_pools()
        assert not notes, notes
        stack.deploy()
        deployments = _api(stack, "/deployments/filter", {})
        flows = {f["id"]: f["name"] for f in _api(stack, "/flows/filter", {})}
        assert {f"{flows[d['flow_id']]}/{d['name']}" for d in deployments} == EXPECTED_DEPLOYMENTS
        sweep = next(d for d in deployments if d["name"] == "weekly")
        assert sweep["schedules"][0]["schedule"]["cron"] == "0 3 * * 0"
        production = next(d for d in deployments if d["name"] == "production")  # the production configs' weekly sweep
        assert production["work_pool_name"] == "gpu-k8s" and production["parameters"]["config_path"] == "configs/h100.yaml"
        assert production["schedules"][0]["schedule"]["cron"] == "0 4 * * 0"
        pools = {p["name"]: p for p in _api(stack, "/work_pools/filter", {})}
        assert pools["local"]["type"] == pools["slurm-login"]["type"] == "process" and pools["gpu-k8s"]["type"] == "kubernetes"
        pool_variables = pools["gpu-k8s"]["base_job_template"]["variables"]["properties"]
        assert "cpu_request" in pool_variables and "gpus" not in pool_variables  # the flow pod: CPU only
        evil = stack.prefect(
            "deployment", "run", "staged-training/h100", "--job-variable", "image=evil/miner:1", timeout=60, check=False
        )
        said = evil.stdout + evil.stderr
        assert evil.returncode != 0 and "unexpected" in said and "image" in said, said[-2000:]  # the server refuses it
        stack.start_worker("local")
        _a_deployment_run_through_the_worker(stack, config, config_path)
    finally:
        processes = list(stack.processes.values())
        stack.stop()
    assert len(processes) == 2 and all(process.poll() is not None for process in processes)  # server and worker gone
    print(f"deployment test: {time.monotonic() - started:.0f} s")
