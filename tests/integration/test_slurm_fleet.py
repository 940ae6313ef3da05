"""The Slurm fleet as Slurm sees it, on a cluster shaped like a site's (tests/integration/slurm_cluster.py
`SITE`): gpu-a100-r07n03 (6 CPUs, 6000 MiB, gpu:a100:2), gpu-a100-r07n04 (4 CPUs, 4000 MiB,
gpu:a100:2), gpu-h100-r12n01 (8 CPUs, 8000 MiB, gpu:h100:4); partitions a100 (2 h, default) and
h100 (30 min); memory a consumable; no slurmdbd. One cluster for the module (up in ~1-2 s), each
slurmd in its node's mount namespace (node-local disks); the shared-disk variant is its own.

1. `queue.fleet: slurm` reads the nodes, gres types and memory, and a drained node's GPUs take no
   job (the job goes to the other A100 node; with both drained an A100 job waits, it is not
   refused, and runs once the nodes are back);
2. `drape queue sbatch` on this mixed fleet previews scripts ``sbatch --test-only`` accepts (2 A100
   nodes; the H100 node with its partition and time limit), where the unfitted requests (8 CPUs a
   GPU, no partition) are refused by Slurm;
3. a 2-node × 2-rank stage job on the fleet read from Slurm (`queue.slurm.partition: a100`: the
   fleet is that partition's nodes) trains (gloo, torchrun, the object store
   a moto S3 server): its script names both A100 nodes with per-node requests, and
   ``scontrol show job`` shows them (printed: the issue's closing note quotes them);
   The cost report's job times: ``sacct -c`` (jobcomp) said as their source; with
   `accounting: slurmdbd` on this cluster without slurmdbd, the queue's own times, saying why;
4. the disk variants: with node-local disks each node's paths.root is its own; on a shared disk
   both nodes of one job see one folder;
5. a node Slurm has down is seen full, until Slurm takes it back;
6. a shared partition: a GPU another user's job holds is seen full (a 2-GPU drape job goes to the
   other A100 node, not to wait in Slurm behind it), while drape's own running job is not taken for
   someone else's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from drape.cli import app
from drape.cost.account import job_times
from drape.storage.handoff import result_key
from drape.storage.store import open_store
from scheduler.dispatch.accounting import run_attempts
from scheduler.dispatch.dispatcher import Dispatcher, submit_and_wait
from scheduler.dispatch.fleet import fleet_view
from scheduler.queue.store import JobSpec, JobStore
from tests.conftest import quiet_ports, tiny_config, wait_until
from tests.integration.nodes import Nodes
from tests.integration.slurm_cluster import SITE, SlurmCluster, slurm_installed
from tests.integration.test_slurm import REPO, STEPS, _submit, _weights

pytestmark = pytest.mark.slow
A100 = ("gpu-a100-r07n03", "gpu-a100-r07n04")
H100 = "gpu-h100-r12n01"
JOB_TIMEOUT = 240.0


def _config(root: Path, bucket: str = "unused", endpoint: str | None = None, **slurm):
    storage = {"object_store_url": f"s3://{bucket}/drape", "endpoint_url": endpoint} if endpoint else {}
    return tiny_config(
        root / "drape",
        storage=storage,
        data={"shard_max_samples": 12},
        train={
            "gpus": 4,
            "data_partitions": 4,
            "parallelism": "fsdp",
            "checkpoint_every": 6,
            "stages": {"identity": {"steps": STEPS, "trainable": ["*"]}},
        },
        queue={
            "enabled": True,
            "launcher": "slurm",
            "fleet": "slurm",
            "max_jobs_per_gpu": 1,
            "poll_seconds": 0.3,
            "lease_seconds": 4,
            "max_attempts": 1,
            "slurm": {
                "gpu_memory_gib": {"a100": 16, "h100": 80},
                "accounting": "jobcomp",
                "rendezvous_port": quiet_ports(16),
                "cpus_per_gpu": 1,
                "time_limit_minutes": 60,
                "signal_seconds": 120,
                "rendezvous_timeout_seconds": 120,
                **slurm,
            },
        },
    )


def _start(disks: Nodes | None) -> tuple[SlurmCluster, Path]:
    if why := slurm_installed():
        pytest.fail(why)
    short = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))  # slurmstepd's sockets: paths under 108 bytes
    slurm = SlurmCluster(short, disks, shape=SITE)
    started = time.monotonic()
    slurm.start()
    print(f"slurm: {len(SITE.nodes)} nodes up in {time.monotonic() - started:.2f} s")
    return slurm, short


def _stop(slurm: SlurmCluster, short: Path) -> None:
    print(slurm.logs(tail=20000))
    slurm.run("scancel", "--full", "--user=root", check=False) if slurm.processes else None
    slurm.close()
    shutil.rmtree(short, ignore_errors=True)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """(SlurmCluster, Nodes, root): the SITE cluster, node-local disks under `root`/drape/live."""
    root = tmp_path_factory.mktemp("site")
    disks = Nodes(root, [(root / "drape" / "live").resolve()])
    for name in SITE.names:
        disks.add(name)
    slurm, short = _start(disks)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CONF", str(slurm.conf))
        patch.setenv("PYTHONPATH", str(REPO))  # the jobs import this checkout
        patch.setenv("OMP_NUM_THREADS", "1")
        try:
            yield slurm, disks, root
        finally:
            _stop(slurm, short)
            disks.close()


def _true_job(gpus: int, models: list[str]) -> JobSpec:
    return JobSpec(kind="stage-training", command=["true"], gpus=gpus, mem_gib=1.0, duration_s=60, gpu_models=models)


def test_the_fleet_is_read_from_slurm_and_a_drained_node_gets_no_job(site, tmp_path):
    slurm, _, _ = site
    config = _config(tmp_path)
    store = JobStore(config.queue_url)
    gpus = fleet_view(config, store).gpus
    per_node = {node: sorted((g.model, g.total_gib) for g in gpus if g.node == node) for node in SITE.names}
    assert per_node == {A100[0]: [("a100", 16.0)] * 2, A100[1]: [("a100", 16.0)] * 2, H100: [("h100", 80.0)] * 4}
    slurm.run("scontrol", "update", f"NodeName={A100[0]}", "State=DRAIN", "Reason=drape-test")
    try:
        drained = {g.node for g in fleet_view(config, store).gpus if g.free_gib() == 0}
        assert drained == {A100[0]}
        row = submit_and_wait(config, _true_job(2, ["a100"]), timeout_s=60)
        assert row["state"] == "succeeded" and {u.split("/")[0] for u in json.loads(row["assigned"])} == {A100[1]}, row
        slurm.run("scontrol", "update", f"NodeName={A100[1]}", "State=DRAIN", "Reason=drape-test")
        waiting = store.submit(_true_job(2, ["a100"]))  # every A100 node drained: it waits, it is not refused
        dispatcher = Dispatcher(config, store)
        for _ in range(3):
            dispatcher.cycle()
        assert store.get(waiting)["state"] == "queued", store.get(waiting)
    finally:
        slurm.run("scontrol", "update", f"NodeName={','.join(A100)}", "State=RESUME")

    def done() -> bool:
        dispatcher.cycle()
        return store.get(waiting)["state"] in ("succeeded", "failed")

    wait_until(done, 60, "the A100 job once the drained nodes are back")
    assert store.get(waiting)["state"] == "succeeded", store.get(waiting)


def _preview(config_path: Path, nodes: int) -> str:
    result = CliRunner().invoke(app, ["queue", "sbatch", "--config", str(config_path), "--nodes", str(nodes)])
    assert result.exit_code == 0, result.output
    return result.output


def _accepted(slurm: SlurmCluster, script: str, at: Path) -> tuple[bool, str]:
    """Whether ``sbatch --test-only`` accepts `script` (it schedules nothing), and what sbatch said."""
    path = at / "preview.sbatch"
    path.write_text(script)
    done = subprocess.run(["sbatch", "--test-only", str(path)], env=slurm.env, capture_output=True, text=True, timeout=30)
    return done.returncode == 0, (done.stderr + done.stdout).strip()


def test_the_sbatch_preview_on_a_mixed_fleet_is_one_slurm_accepts(site, tmp_path):
    slurm, _, _ = site
    config = _config(tmp_path, cpus_per_gpu=8)
    config_path = tmp_path / "drape.yaml"
    config_path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    two = _preview(config_path, 2)  # 4 GPUs as 2 nodes × 2: the A100 nodes, sized to the 4-CPU one
    assert f"#SBATCH --nodelist={','.join(A100)}" in two and "#SBATCH --gres=gpu:a100:2" in two
    assert "#SBATCH --cpus-per-task=4" in two and "#SBATCH --mem-per-gpu=1800M" in two and "--partition=a100" in two
    ok, said = _accepted(slurm, two, tmp_path)
    assert ok, said
    one = _preview(config_path, 1)  # 4 GPUs on one node: the H100 node, its partition and its 30-minute limit
    assert f"--nodelist={H100}" in one and "--gres=gpu:h100:4" in one and "--partition=h100" in one
    assert "#SBATCH --time=30" in one and "#SBATCH --cpus-per-task=8" in one and "#SBATCH --mem-per-gpu=1800M" in one
    ok, said = _accepted(slurm, one, tmp_path)
    assert ok, said
    # before: one cpus_per_gpu for every node and no partition; Slurm refuses such a script
    unfitted = one.replace("--cpus-per-task=8", "--cpus-per-task=32").replace("#SBATCH --partition=h100\n", "")
    ok, said = _accepted(slurm, unfitted, tmp_path)
    assert not ok and said, said


def test_a_two_node_stage_job_on_the_fleet_read_from_slurm(site, s3_bucket):
    slurm, disks, root = site
    bucket, endpoint = s3_bucket
    config = _config(root, bucket, endpoint, partition="a100")  # the queue's fleet: partition a100's nodes
    spec = _submit(config, "site")  # 4 GPUs: wider than any A100 node, so 2 nodes × 2
    started = time.monotonic()
    row = submit_and_wait(config, spec, timeout_s=JOB_TIMEOUT)
    print(f"slurm: a 2-node × 2-rank stage job of {STEPS} steps in {time.monotonic() - started:.1f} s")
    assert row["state"] == "succeeded", row
    assert {u.split("/")[0] for u in json.loads(row["assigned"])} == set(A100)
    script = Path(config.paths.root) / "queue" / "slurm" / f"{row['handle'].split(':')[2]}.sbatch"
    text = script.read_text()
    slurm_id = row["handle"].split(":")[1]
    shown = slurm.run("scontrol", "show", "job", slurm_id)
    print(f"--- {script.name}\n{text}\n--- scontrol show job {slurm_id}\n{shown}")
    assert f"#SBATCH --nodelist={','.join(A100)}" in text and "#SBATCH --gres=gpu:a100:2" in text
    assert "#SBATCH --cpus-per-task=2" in text and "#SBATCH --mem-per-gpu=1800M" in text and "--partition=a100" in text
    assert f"NodeList={A100[0]},{A100[1]}" in shown or "NodeList=gpu-a100-r07n[03-04]" in shown, shown
    assert "JobState=COMPLETED" in shown and "NumNodes=2" in shown and "MinMemoryCPU" not in shown
    assert "mem-per-tres=gres:gpu:1800" in shown.replace("MemPerTres", "mem-per-tres").replace("=gres/gpu:", "=gres:gpu:")
    result = json.loads(open_store(config).read_bytes(result_key("site", "identity")))
    assert result["world_size"] == 4 and result["steps"] == STEPS and result["node"] in A100
    weights = _weights(config, root / "flow", "site")
    assert weights
    store = JobStore(config.queue_url)  # accounting stated: where the cost report's job times come from, and why
    attempts = run_attempts(store, "site", config)
    assert attempts.source == "sacct -c (jobcomp)" and [a.gpus for a in attempts] == [4], (attempts.source, attempts)
    assert job_times(attempts)["why"].startswith("Slurm's accounting")
    off = _config(root, bucket, endpoint, partition="a100", accounting="slurmdbd")  # no slurmdbd here: accounting off
    fallback = run_attempts(store, "site", off)
    assert fallback.source == "queue" and "sacct (slurmdbd) could not answer" in fallback.why, fallback.why
    assert "includes the wait in Slurm's queue" in fallback.why and [a.gpus for a in fallback] == [4]


def test_node_local_disks_are_each_node_s_own_and_a_shared_disk_is_one(site, tmp_path):
    slurm, disks, root = site
    live = (root / "drape" / "live").resolve()
    script = tmp_path / "mark.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH --nodes=2\n#SBATCH --nodelist={','.join(A100)}\n#SBATCH --mem-per-gpu=100M\n#SBATCH --gres=gpu:a100:1\n"
        f"#SBATCH --output={tmp_path}/mark.out\n"
        f"srun --nodes=2 --ntasks=2 --ntasks-per-node=1 bash -c 'echo \"$SLURMD_NODENAME\" > {live}/mark-$SLURMD_NODENAME'\n"
    )
    slurm.run("sbatch", "--wait", str(script))
    assert [p.name for p in disks.disk(A100[0]).glob("0/mark-*")] == [f"mark-{A100[0]}"]
    assert [p.name for p in disks.disk(A100[1]).glob("0/mark-*")] == [f"mark-{A100[1]}"]
    shared, short = _start(None)  # the same cluster shape, every node on this host's disk
    try:
        folder = tmp_path / "shared-root"
        folder.mkdir()
        text = script.read_text().replace(str(live), str(folder)).replace(str(tmp_path / "mark.out"), str(folder / "out"))
        script.write_text(text)
        shared.run("sbatch", "--wait", str(script))
        assert sorted(p.name for p in folder.glob("mark-*")) == [f"mark-{A100[0]}", f"mark-{A100[1]}"]
    finally:
        _stop(shared, short)


def test_a_node_set_down_is_seen_full_and_back_when_slurm_takes_it_back(site, tmp_path):
    slurm, _, _ = site
    config = _config(tmp_path)
    store = JobStore(config.queue_url)

    def full(node: str) -> bool:
        return all(g.free_gib() == 0 for g in fleet_view(config, store).gpus if g.node == node)

    def down() -> bool:
        # As Slurm marks a lost node, without waiting SlurmdTimeout. ReturnToService=2 returns a DOWN
        # node whose slurmd answers: CI once saw an answer already on its way undo this 36 ms later,
        # so the slurmd is frozen first and DOWN set again until it holds.
        slurm.run("scontrol", "update", f"NodeName={H100}", "State=DOWN", "Reason=drape-test")
        time.sleep(0.3)
        return slurm.node_states()[H100].startswith("down")

    slurm.freeze_node(H100)
    try:
        wait_until(down, 15, f"{H100} held DOWN")
        assert full(H100)
        assert not full(A100[0]) and not full(A100[1])
    finally:
        slurm.freeze_node(H100, frozen=False)
    wait_until(lambda: not full(H100), 30, f"{H100} back in the fleet once its slurmd answers")


def _squeue_state(slurm: SlurmCluster, name: str) -> str:
    """The state squeue gives the job named `name` ('' when it has none)."""
    return slurm.run("squeue", "-h", "-n", name, "-o", "%T").strip()


def test_gpus_another_user_s_job_holds_are_seen_full_and_drape_s_own_are_not(site, tmp_path):
    slurm, _, _ = site
    config = _config(tmp_path)
    store = JobStore(config.queue_url)

    def held(node: str) -> list[str]:
        return [g.uuid for g in fleet_view(config, store).gpus if g.node == node and g.observed_used_gib is not None]

    other = "someone-else"  # not a drape job: submitted to Slurm directly, on one of A100[0]'s two GPUs
    request = ["-J", other, "-o", str(tmp_path / "other.out"), "-p", "a100", "-w", A100[0], "--gres=gpu:a100:1", "--mem=100"]
    slurm.run("sbatch", *request, "--wrap", "sleep 300")
    try:
        wait_until(lambda: _squeue_state(slurm, other) == "RUNNING", 30, "the other user's job running")
        assert held(A100[0]) == [f"{A100[0]}/gpu1"] and held(A100[1]) == [] and held(H100) == []
        # the one A100 node with two free GPUs takes a 2-GPU job (by name, A100[0] would come first)
        row = submit_and_wait(config, _true_job(2, ["a100"]), timeout_s=60)
        assert row["state"] == "succeeded" and {u.split("/")[0] for u in json.loads(row["assigned"])} == {A100[1]}, row
        # drape's own job on two of the H100 node's four GPUs: in Slurm's GresUsed, not someone else's
        spec = JobSpec(kind="stage-training", command=["sleep", "12"], gpus=2, mem_gib=1.0, duration_s=60, gpu_models=["h100"])
        ours = store.submit(spec)
        dispatcher = Dispatcher(config, store)

        def running() -> bool:
            dispatcher.cycle()
            return "gpu:h100:2" in slurm.run("scontrol", "show", "node", "-o", "-d", H100)

        wait_until(running, 60, "drape's 2-GPU job holding its GPUs in Slurm")
        assert store.get(ours)["state"] == "running"
        assert held(H100) == [] and held(A100[0]) == [f"{A100[0]}/gpu1"]

        def ended() -> bool:
            dispatcher.cycle()
            return store.get(ours)["state"] in ("succeeded", "failed")

        wait_until(ended, 90, "drape's H100 job to end")
        assert store.get(ours)["state"] == "succeeded", store.get(ours)
    finally:
        slurm.run("scancel", "-n", other, check=False)
    wait_until(lambda: not held(A100[0]), 30, "the other user's GPU free once its job is cancelled")
