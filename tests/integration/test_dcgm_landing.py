"""Device-level drift under the NVIDIA device plugin, found from the DCGM exporter's pod labels through a
real Prometheus (engines/kubernetes/dcgm.py → engines/kubernetes/launcher.py `landed` → dispatch/drift.py).

A dcgm-exporter-style /metrics (served here: there is no GPU) reports one node's 4 GPUs; the queue reads
its fleet from the same Prometheus, so it knows the GPUs by their DCGM UUIDs. The fake Kubernetes API of
test_placement_drift binds the job's pod on the planned node; the device plugin's choice is told only by
DCGM: at first DCGM has no pod labels (the dispatcher waits, books untouched), then it labels two other
GPUs than planned with the pod, and the books move there with drape_queue_placement_drift_total{kind="gpu"}.
About 7-10 s on the shared 2 cores (Prometheus' start, scrapes at 1 s)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client

from drape.config import KubernetesLauncherConfig
from scheduler.dispatch.dispatcher import Dispatcher
from scheduler.engines.kubernetes.launcher import build
from scheduler.queue.store import JobSpec, JobStore
from tests.conftest import start_prometheus, tiny_config, wait_for_series
from tests.integration.test_placement_drift import FakeCluster, _drift

pytestmark = pytest.mark.slow

NODE = "h100-00"
UUIDS = [f"GPU-{index:08d}-0000-4000-8000-00000000000{index}" for index in range(4)]


class Exporter:
    """dcgm-exporter's FB_USED/FB_FREE series with DCGM_EXPORTER_KUBERNETES=true: `holders` (GPU index → pod)
    add pod, namespace and container labels to that GPU's series."""

    def __init__(self):
        self.holders: dict[int, str] = {}
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = exporter.text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.target = f"127.0.0.1:{self.server.server_address[1]}"

    def text(self) -> str:
        lines = []
        for metric, held, free in (("DCGM_FI_DEV_FB_USED", 20480, 0), ("DCGM_FI_DEV_FB_FREE", 81559 - 20480, 81559)):
            for index, uuid in enumerate(UUIDS):
                pod = self.holders.get(index)
                labels = f'gpu="{index}",UUID="{uuid}",Hostname="{NODE}",modelName="NVIDIA H100 80GB HBM3"'
                labels += f',pod="{pod}",namespace="drape",container="main"' if pod else ""
                lines.append(f"{metric}{{{labels}}} {held if pod else free}")
        return "\n".join(lines) + "\n"

    def close(self):
        self.server.shutdown()


def test_the_device_plugin_s_choice_is_read_from_dcgm_and_the_books_follow_it(tmp_path):
    exporter = Exporter()
    url, process = start_prometheus(tmp_path / "prom", {"dcgm": [exporter.target]})
    try:
        assert len(wait_for_series(url, "DCGM_FI_DEV_FB_USED")) == 4, "Prometheus never scraped the exporter"
        settings = KubernetesLauncherConfig(namespace="drape").model_dump()
        queue = {"fleet": "prometheus", "prometheus_url": url, "launcher": "kubernetes", "kubernetes": settings}
        config = tiny_config(tmp_path / "drape", queue=queue)
        store, cluster = JobStore(config.queue_url), FakeCluster()
        engine = build(config, tmp_path)  # with the DCGM pod reader: Prometheus is the fleet source
        engine._clients = {"batch": cluster, "core": cluster, "custom": cluster}
        dispatcher = Dispatcher(config, store, launcher=engine)
        job_id = store.submit(JobSpec(kind="finetune", mem_gib=30, duration_s=600, gpus=2, command=["true"]), now=0.0)
        assert dispatcher.cycle(now=1.0).started == [job_id]
        planned = json.loads(store.get(job_id)["assigned"])
        assert len(planned) == 2 and set(planned) < set(UUIDS)
        (name,) = cluster.jobs
        cluster.bind(name, NODE)  # on the planned node; which devices, the device plugin alone knows
        limits = cluster.jobs[name]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "2"
        (pod,) = cluster.pods[name]
        pod.spec.containers = [client.V1Container(name="main", resources=client.V1ResourceRequirements(limits=limits))]
        before = _drift("gpu")

        dispatcher.cycle(now=2.0)  # DCGM has no pod labels yet: asked again later, books as placed
        assert json.loads(store.get(job_id)["assigned"]) == planned and _drift("gpu") == before

        given = [index for index, uuid in enumerate(UUIDS) if uuid not in planned]
        exporter.holders = dict.fromkeys(given, pod.metadata.name)
        held = wait_for_series(url, f'DCGM_FI_DEV_FB_USED{{pod="{pod.metadata.name}"}}')
        assert sorted(int(s["metric"]["gpu"]) for s in held) == given
        dispatcher.cycle(now=8.0)  # RECHECK_S later
        moved = json.loads(store.get(job_id)["assigned"])
        assert moved == sorted(UUIDS[index] for index in given), (moved, planned)
        assert set(store.ledger()) == set(moved) and _drift("gpu") == before + 1
        dispatcher.cycle(now=20.0)
        assert _drift("gpu") == before + 1  # counted once
    finally:
        process.terminate()
        process.wait(timeout=10)
        exporter.close()
