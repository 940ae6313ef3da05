"""Shared fixtures: a tiny pipeline config rooted in a temporary directory, small datasets."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
# the production configs take their site values (paths, endpoints, names) from a site file: the
# tests read them with the example's, the values the manifests and docs assume
os.environ.setdefault("DRAPE_SITE", str(Path(__file__).resolve().parents[1] / "configs" / "site.example.yaml"))
if os.environ.get("PYTEST_XDIST_WORKER"):
    # One of `make test`'s workers, each with a core: torch's OpenMP threads (and those of the
    # subprocesses it starts) would otherwise spin against the other worker's.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import yaml  # noqa: E402

from drape.config import deep_merge, parse_config  # noqa: E402

TESTS = Path(__file__).parent
# per-file wall, CPU and sleep seconds when DRAPE_TEST_TIMES names a folder (tests/timing.py)
pytest_plugins = ("tests.timing",)
TINY = TESTS / "configs" / "tiny.yaml"

# Modules that run for minutes, longest first. `make test` hands whole modules to its workers
# (`--dist loadfile --no-loadscope-reorder`) in collection order: these start first, so no worker
# begins one near the end. (Without --no-loadscope-reorder xdist sends modules with the most tests
# first, and the one-test rehearsal ran last, alone, while the other worker idled.)
LONGEST_FIRST = (
    "integration/test_guide.py",  # the guide's commands: a four-stage run on Slurm and eval (~6 min)
    "integration/test_rehearsal.py",
    "integration/test_models.py",
    "integration/test_slurm.py",
    "integration/test_slurm_faults.py",
    "integration/test_watchdog.py",
    "integration/test_service_restarts.py",  # three servers started twice each: long, mostly waiting on them
    "integration/test_slurm_fleet.py",  # ~95 s, then the root-only disk and restart modules (~60-90 s each)
    "integration/test_full_disk.py",
    "integration/test_restarts.py",
    "integration/test_dispatcher_down.py",
    "integration/test_double_starts.py",
    "integration/test_full_disk_logs.py",
    # then the modules that mostly wait (bounded timeouts, retry backoff, signals: a core idle for
    # 35-90% of their time), while the other worker's long multi-process modules can use that
    # core; run last, they left it idle (test_trust_more, whose waits are now in test_process,
    # test_storage and test_tracking, ended the suite: 18.6 s, 69% idle). Alone, on two cores:
    # test_process 19.5 s wall for 10.0 s of CPU, test_storage 14.9 s for 4.1 s, test_tracking
    # 16.4 s for 6.7 s.
    "unit/test_process.py",
    "integration/test_s3.py",
    "unit/test_storage.py",
    "unit/test_tracking.py",
    "integration/test_archive_crash.py",
    "integration/test_flow_s3.py",
    "integration/test_s3_stalls.py",
    "integration/test_shoppers.py",
    "integration/test_recipes.py",
    "integration/test_staged_training.py",
    "integration/test_inference.py",
    "integration/test_distributed.py",
    "integration/test_dashboards.py",
    "integration/test_deployments.py",
    "unit/test_likeness.py",
    "integration/test_serve_signals.py",
    "unit/test_floor.py",
    "integration/test_trainer_process.py",
    "integration/test_multinode.py",
)


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        relative = item.path.relative_to(TESTS).as_posix()
        return LONGEST_FIRST.index(relative) if relative in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each module's tests keep their order


def tiny_config(root: Path, *, fresh_mlflow: bool = False, **overrides):
    """The tiny test config with live storage, MLflow and the object store under `root` (MLflow's
    database there already migrated unless `fresh_mlflow`)."""
    data = yaml.safe_load(TINY.read_text())
    data = deep_merge(data, {"paths": {"root": str(root)}})
    config = parse_config(deep_merge(data, overrides), str(TINY))
    if config.tracking_uri.startswith("sqlite:///") and not fresh_mlflow:
        _seed_mlflow(Path(config.tracking_uri.removeprefix("sqlite:///")))
    return config


_MLFLOW_TEMPLATE: list[Path] = []


def _seed_mlflow(database: Path) -> None:
    """An empty MLflow database at `database` unless one is there, copied from one MLflow migrated
    once per session: migrating a new SQLite database takes seconds, and the suite makes dozens.
    Only MLflow's own tables are in it (drape's experiment is made by the run, with its root's
    artifact location); tests/unit/conftest.py's `dag_config` starts its run from no database."""
    import atexit
    import shutil
    import tempfile

    if database.exists():
        return
    if not _MLFLOW_TEMPLATE:
        from mlflow.tracking import MlflowClient

        folder = tempfile.mkdtemp(prefix="drape-mlflow-template-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        template = Path(folder) / "mlflow.db"
        MlflowClient(tracking_uri=f"sqlite:///{template}").search_experiments()
        _MLFLOW_TEMPLATE.append(template)
    database.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_MLFLOW_TEMPLATE[0], database)


@pytest.fixture
def config(tmp_path):
    return tiny_config(tmp_path / "drape")


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory):
    """A small synthetic dataset built once per session: (directory, manifest, config)."""
    from drape.data.dataset import build_dataset

    root = tmp_path_factory.mktemp("dataset")
    cfg = tiny_config(
        root / "drape",
        data={
            "synthetic": {"samples_per_stage": {"identity": 24, "texture": 16, "geometry": 16, "denoise": 16}},
            "control_samples": 6,
            "shard_max_samples": 10,
        },
    )
    manifest = build_dataset(cfg, root / "shards")
    return root / "shards", manifest, cfg


@contextlib.contextmanager
def slack_stand_in():
    """A local HTTP server standing in for Slack: (base URL, received payloads).

    ``/ok/...`` answers 200; ``/seq/429,500,200/...`` answers those codes in turn (429 with
    Retry-After: 1) and then repeats the last; anything else answers 500.
    """
    received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            if self.path.startswith("/seq/"):
                codes = [int(c) for c in self.path.split("/")[2].split(",")]
                code = codes[min(len(received), len(codes)) - 1]
            else:
                code = 200 if self.path.startswith("/ok") else 500
            self.send_response(code)
            if code == 429:
                self.send_header("Retry-After", "1")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    # shutdown() waits for serve_forever's next poll: 0.05 s, not its default 0.5 s at each test's end
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", received
    finally:
        server.shutdown()


@pytest.fixture
def slack_webhook():
    """`slack_stand_in` for one test: (base URL, received payloads)."""
    with slack_stand_in() as served:
        yield served


@pytest.fixture(scope="session")
def moto_server():
    """A moto S3 server over HTTP on 127.0.0.1: (endpoint URL). Credentials via the environment."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server_bin = Path(sys.executable).with_name("moto_server")
    process = subprocess.Popen(
        [str(server_bin), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto_server did not start on {endpoint}") from None
            time.sleep(0.1)
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    yield endpoint
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _stop(process)


def silent_endpoint(monkeypatch, held: list | None = None) -> str:
    """An HTTP endpoint on 127.0.0.1 that accepts connections and never answers (with made-up AWS
    credentials set): what a hung object store looks like to a client. Each accepted connection is
    appended to `held` (a list the caller may pass to count them)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    server, held = socket.socket(), ([] if held is None else held)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    threading.Thread(target=lambda: [held.append(server.accept()) for _ in iter(int, 1)], daemon=True).start()
    return f"http://127.0.0.1:{server.getsockname()[1]}"


def _stop(process: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds: a throwaway service that drains its connections
    slowly (the Pushgateway once took longer than 10 s at the end of the suite) neither fails a
    teardown nor holds the end of the suite."""
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=grace)


@pytest.fixture
def s3_bucket(moto_server):
    """A fresh bucket on the moto server: (bucket name, endpoint)."""
    import uuid

    import boto3

    name = f"drape-test-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1").create_bucket(Bucket=name)
    return name, moto_server


@pytest.fixture(scope="session")
def prefect_harness():
    """Prefect's test harness (a temporary API and database), started once per session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_service(argv: list[str], ready_url: str, name: str):
    import shutil

    if shutil.which(argv[0]) is None:
        pytest.fail(
            f"{argv[0]} is not installed; `make services` installs it (apt-get install prometheus "
            f"prometheus-pushgateway), as .ci/run does"
        )
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(ready_url, timeout=1)
            return process
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"{name} did not start: {process.stderr.read().decode()[-2000:]}") from None
            time.sleep(0.1)


@pytest.fixture(scope="session")
def pushgateway():
    """Debian's prometheus-pushgateway on 127.0.0.1, in memory only: (base URL).

    (Debian's build persists to /var/lib/prometheus/pushgateway.data by default, which would carry
    one session's pushes into the next.)
    """
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    process = _start_service(
        ["prometheus-pushgateway", f"--web.listen-address=127.0.0.1:{port}", "--persistence.file="],
        f"{url}/-/ready",
        "prometheus-pushgateway",
    )
    yield url
    _stop(process)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real `mlflow server` on 127.0.0.1 (SQLite backend, artifacts served over HTTP): (URL)."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    mlflow = str(Path(sys.executable).with_name("mlflow"))
    argv = [mlflow, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    argv += ["--backend-store-uri", f"sqlite:///{root}/mlflow.db", "--artifacts-destination", str(root / "artifacts")]
    # drape runs no MLflow server jobs (GenAI prompt optimisation, trace roll-ups): without this the
    # server starts a huey job runner whose processes took 36.8 s of CPU over a suite
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = open(root / "server.log", "wb")
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True)
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                os.killpg(process.pid, signal.SIGKILL)
                raise RuntimeError(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}") from None
            time.sleep(0.3)
    yield url
    # a throwaway server: SIGTERM, and SIGKILL after 3 s (its job runner once held the end of the
    # suite 15 s); nothing it holds outlives the session
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=3)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def start_prometheus(
    directory: Path,
    scrape: dict[str, list[str]],
    rule_files: list[str] | None = None,
    honor_labels: tuple[str, ...] = ("pushgateway",),
):
    """Debian's prometheus on 127.0.0.1 scraping `scrape` (job → targets) every second: (URL, process)."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": job, "honor_labels": job in honor_labels, "static_configs": [{"targets": targets}]}
            for job, targets in scrape.items()
        ],
    }
    if rule_files:
        config["rule_files"] = rule_files
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    process = _start_service(
        [
            "prometheus",
            f"--config.file={directory / 'prometheus.yml'}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        f"{url}/-/ready",
        "prometheus",
    )
    return url, process


def prefect_api(api_url: str, path: str, body: dict) -> list | dict:
    """POST `body` to a Prefect server's REST API (`api_url` ends in /api)."""
    request = urllib.request.Request(
        f"{api_url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    return json.loads(urllib.request.urlopen(request, timeout=30).read())


def prometheus_query(url: str, expr: str) -> list[dict]:
    from urllib.parse import urlencode

    answer = json.loads(urllib.request.urlopen(f"{url}/api/v1/query?{urlencode({'query': expr})}", timeout=10).read())
    if answer.get("status") != "success":
        raise AssertionError(f"query {expr!r} failed: {answer}")
    return answer["data"]["result"]


def wait_for_series(url: str, expr: str, timeout: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        result = prometheus_query(url, expr)
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.5)


def quiet_ports(runs: int = 1) -> int:
    """The first of `runs` ports in a row, free now, below the kernel's ephemeral range
    (net.ipv4.ip_local_port_range): there any outgoing connection or `bind(0)` of the other tests
    may take one meanwhile. For a port a test must bind again later: a Slurm job's rendezvous
    (a requeued run's is `port + restart % 16`: one failed with EADDRINUSE on `free_port() + 1`), a
    relay that restarts on its port."""
    import random

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, low - runs)
        try:
            with contextlib.ExitStack() as held:
                for port in range(base, base + runs):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {runs} free ports in a row between 20000 and {low}")


def wait_until(predicate, timeout: float, what: str, every: float = 0.2):
    """Call `predicate` every `every` seconds until it returns something true, and return that; after
    `timeout` seconds fail the test saying what it waited for. A wait bounded by its condition, never
    a fixed sleep: as short as the machine allows, and a failure that names what never happened."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)
    return value


class DcgmExporter:
    """Serves DCGM-exporter-named series for made-up GPUs (there is no GPU here): FB used/free (MiB), util (%)."""

    def __init__(self, gpus: list[dict]):
        from prometheus_client import CollectorRegistry, Gauge, start_http_server

        self.registry = CollectorRegistry()
        labels = ["gpu", "UUID", "Hostname", "modelName", "device"]
        used = Gauge("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", labels, registry=self.registry)
        free = Gauge("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", labels, registry=self.registry)
        util = Gauge("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", labels, registry=self.registry)
        for gpu in gpus:
            values = dict(
                gpu=str(gpu["index"]),
                UUID=gpu["uuid"],
                Hostname=gpu["host"],
                modelName=gpu["model"],
                device=f"nvidia{gpu['index']}",
            )
            used.labels(**values).set(gpu["used_mib"])
            free.labels(**values).set(gpu["total_mib"] - gpu["used_mib"])
            util.labels(**values).set(gpu["util"])
        self.port = _free_port()
        self.server, _ = start_http_server(self.port, addr="127.0.0.1", registry=self.registry)
        self.target = f"127.0.0.1:{self.port}"

    def close(self):
        self.server.shutdown()


@pytest.fixture(scope="session")
def postgres_url():
    """A throwaway PostgreSQL (Debian's, already on these machines or `make services`) on 127.0.0.1."""
    import glob
    import shutil

    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not bins:
        pytest.fail("PostgreSQL is not installed; `make services` installs it (apt-get install postgresql)")
    bindir = Path(bins[-1]).parent
    import tempfile

    directory = Path(tempfile.mkdtemp(prefix="drape-pg-"))  # not under pytest's 0700 root-owned tree: postgres must reach it
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_postgres:
        shutil.chown(directory, "postgres")
    port = _free_port()
    subprocess.run(
        [*as_postgres, str(bindir / "initdb"), "-D", str(directory / "data"), "-U", "drape", "--auth=trust"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    subprocess.run(
        [
            *as_postgres,
            str(bindir / "pg_ctl"),
            "-D",
            str(directory / "data"),
            "-l",
            str(directory / "log"),
            "-w",
            "-o",
            f"-h 127.0.0.1 -p {port} -k {directory}",
            "start",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    subprocess.run(
        [*as_postgres, str(bindir / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "drape", "queue"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    yield f"postgresql+psycopg://drape@127.0.0.1:{port}/queue"
    # immediate: a throwaway database needs no shutdown checkpoint (fast's took seconds after the queue tests)
    subprocess.run(
        [*as_postgres, str(bindir / "pg_ctl"), "-D", str(directory / "data"), "-m", "immediate", "stop"],
        capture_output=True,
        timeout=120,
    )
    shutil.rmtree(directory, ignore_errors=True)


SENTINEL = "s3cr3t-SENTINEL-9f2c"  # a made-up secret: no error, log line or job environment may show it


def billion_laughs(depth: int = 9) -> str:
    """A fleet file of a few hundred bytes whose aliases expand to 10**depth nodes."""
    lines = ['l0: &l0 ["ha", "ha", "ha", "ha", "ha", "ha", "ha", "ha", "ha", "ha"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, depth)]
    return "\n".join(lines) + f"\ngroups: [*l{depth - 1}]\n"


def random_tryon_batch(size: int = 2, resolution: int = 32) -> dict:
    """A model-input batch of random images in [-1, 1] (target, agnostic, pose, garment) and a binary mask."""
    import torch

    generator = torch.Generator().manual_seed(0)
    batch = {
        name: torch.rand(size, 3, resolution, resolution, generator=generator) * 2 - 1
        for name in ("target", "agnostic", "pose", "garment")
    }
    batch["mask"] = (torch.rand(size, 1, resolution, resolution, generator=generator) > 0.5).float()
    return batch


PASS_ANYTHING = {  # the lowest gate bounds allowed: only a flat output fails
    "identity": {"min_similarity": 1e-6},
    "texture": {"min_fidelity": 1e-6},
    "coherence": {"min_score": 1e-6},
}
# SD1.5-inpainting's UNet block structure (three cross-attention levels, then one without) at tiny widths
TINY_UNET = {
    "block_out_channels": [8, 8, 16, 16],
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
    "layers_per_block": 2,
    "attention_head_dim": 2,
    "norm_num_groups": 4,
    "cross_attention_dim": 8,
    "in_channels": 9,
    "out_channels": 4,
    "sample_size": 16,
}


def register_untrained_baseline(config, root: Path) -> Path:
    """The config's model, untrained, registered as `drape-tryon` v1 with the alias denoise-baseline;
    the config written beside it as `config.yaml` (its path returned)."""
    from drape.ops.tracking import Tracker
    from drape.training.checkpoints.checkpoint import save_checkpoint
    from drape.training.recipes.model import build_model

    checkpoint = save_checkpoint(
        root / "checkpoint",
        model=build_model(config),
        optimizer=None,
        trainable_names=[],
        ema=None,
        manifest={"stage": "denoise", "step": 0},
    )
    tracker = Tracker(config)
    run = tracker.start_run("denoise")
    source = tracker.log_artifacts(run, checkpoint, "snapshot/checkpoint").removesuffix("/checkpoint")
    assert tracker.register_baseline(run, source, "denoise", {"drape.stage": "denoise"}) == "1"
    path = root / "config.yaml"
    path.write_text(json.dumps(config.model_dump(mode="json", by_alias=True)))
    return path
