"""How fast the tests' Slurm cluster reacts, with its former settings and its current ones, side by side.

The Slurm tests (tests/integration/test_slurm*.py) wait on Slurm between the things they check: a
job submitted until it runs, a requeued job until it runs again, a cancelled job whose processes
ignore SIGTERM until it ends, and a node that died until Slurm has it down. These waits are set by
slurm.conf (tests/integration/slurm_cluster.py `TIMING`), not by the tests. For each variant, a
fresh two-node cluster (munged, slurmctld, two slurmd; root and Debian's slurm-wlm) and
`--rounds` rounds of:

- start: `sbatch` of a one-GPU `true` job until `scontrol` shows it RUNNING (or done);
- requeue: `scontrol requeue` of a running job until it runs again (Slurm holds a requeued job
  `cred_expire` seconds);
- cancel: `scancel` of a job whose script ignores SIGTERM until it is gone (`KillWait`);
- node down: a slurmd SIGKILLed until `sinfo` says the node is down (`SlurmdTimeout`), then back.

Printed: the median and range of each, per variant, and the ratio former / current.

    .venv/bin/python benchmarks/slurm_latency.py            # about 4 minutes (root)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.slurm_cluster import FORMER_TIMING, TIMING, SlurmCluster, slurm_installed  # noqa: E402

NODE = "slurm-00"


def _state(cluster: SlurmCluster, job: str) -> str:
    shown = cluster.run("scontrol", "show", "job", "-o", job, check=False)
    field = next((word for word in shown.split() if word.startswith("JobState=")), "JobState=GONE")
    return field.removeprefix("JobState=")


def _until(predicate: Callable[[], bool], timeout: float = 300.0) -> float:
    """Seconds until `predicate` holds (polled every 50 ms)."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"not within {timeout:.0f} s")
        time.sleep(0.05)
    return time.monotonic() - started


def _submit(cluster: SlurmCluster, script: str, *options: str) -> str:
    argv = ["sbatch", "--parsable", f"--nodelist={NODE}", "--gres=gpu:1", "--output=/dev/null", *options]
    return cluster.run(*argv, "--wrap", script).strip().split(";")[0]


def _round(cluster: SlurmCluster) -> dict[str, float]:
    times = {}
    started = time.monotonic()
    job = _submit(cluster, "true")
    _until(lambda: _state(cluster, job) in ("RUNNING", "COMPLETING", "COMPLETED"))
    times["start"] = time.monotonic() - started
    job = _submit(cluster, "sleep 300", "--requeue")
    _until(lambda: _state(cluster, job) == "RUNNING")
    cluster.run("scontrol", "requeue", job)
    times["requeue"] = _until(lambda: _state(cluster, job) == "RUNNING")
    cluster.run("scancel", job)
    _until(lambda: _state(cluster, job) not in ("RUNNING", "COMPLETING"))
    job = _submit(cluster, "trap '' TERM; for i in $(seq 300); do sleep 1; done")
    _until(lambda: _state(cluster, job) == "RUNNING")
    started = time.monotonic()
    cluster.run("scancel", job)
    times["cancel"] = _until(lambda: _state(cluster, job) not in ("RUNNING", "COMPLETING"))
    cluster.kill_node("slurm-01")
    times["node down"] = _until(lambda: cluster.node_states().get("slurm-01", "").startswith("down"))
    cluster.start_node("slurm-01")
    cluster.run("scontrol", "update", "NodeName=slurm-01", "State=RESUME", check=False)
    cluster.wait_idle(["slurm-01"], 60)
    return times


def measure(timing: dict[str, str], rounds: int) -> dict[str, list[float]]:
    root = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))  # slurmstepd's socket paths stay short
    cluster = SlurmCluster(root, timing=timing)
    try:
        cluster.start()
        results: dict[str, list[float]] = {}
        for _ in range(rounds):
            for name, seconds in _round(cluster).items():
                results.setdefault(name, []).append(seconds)
        return results
    finally:
        cluster.run("scancel", "--full", "--user=root", check=False) if cluster.processes else None
        cluster.close()
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per variant (default 3)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if why := slurm_installed():
        raise SystemExit(f"slurm_latency: {why}")
    former, current = measure(FORMER_TIMING, args.rounds), measure(TIMING, args.rounds)
    changed = sorted(key for key in TIMING if TIMING[key] != FORMER_TIMING.get(key))
    print("settings changed: " + ", ".join(f"{key} {FORMER_TIMING.get(key)} -> {TIMING[key]}" for key in changed))
    print(f"{'wait (s, median [min-max])':28} {'former':>20} {'current':>20} {'former/current':>15}")
    for name in former:
        a, b = former[name], current[name]
        ratio = statistics.median(a) / max(statistics.median(b), 1e-9)
        cells = [f"{statistics.median(x):6.2f} [{min(x):.2f}-{max(x):.2f}]" for x in (a, b)]
        print(f"{name:28} {cells[0]:>20} {cells[1]:>20} {ratio:14.1f}x")


if __name__ == "__main__":
    main()
