"""A failed job's recorded reason is the trainer's own error from its log (scheduler/engines/reasons.py),
not the signal that ended it: on logs of the shapes torchrun and Slurm write, and on a real 2-rank
torchrun job run by the local engine, with a secret of the environment kept out."""

from __future__ import annotations

import json
import sys
import textwrap
import time

from scheduler.engines.local.launcher import LocalLauncher
from scheduler.engines.reasons import LOG_TAIL_BYTES, MAX_REASON_CHARS, failure_message, read_tail, trainer_error
from scheduler.policy import GpuState
from tests.conftest import SENTINEL, wait_until

TORCHRUN_LOG = """\
drape: Slurm job 12 run 0 on slurm-[00-01], rendezvous 127.0.0.1:29500
train-identity: step 6/24 (25%)
[rank1]: Traceback (most recent call last):
[rank1]:   File "/repo/drape/training/jobs/stage_job.py", line 190, in _take_from_store
[rank1]:     restored = align_to(store, self.run_id, self.stage, self.out_dir, chosen[0], bases=bases)
[rank1]: FileNotFoundError: [Errno 2] No such file or directory: '/data/live/runs/r1/identity/step-000006'
[rank0]: Traceback (most recent call last):
[rank0]:   File "/repo/drape/training/loop/distributed.py", line 80, in barrier
[rank0]: torch.distributed.DistBackendError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer
W1205 17:40:01.000 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 77 closing signal SIGTERM
Traceback (most recent call last):
  File "/usr/lib/python3.11/runpy.py", line 198, in _run_module_as_main
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
srun: error: slurm-01: task 1: Exited with exit code 1
slurmstepd: error: *** STEP 12.0 ON slurm-00 CANCELLED AT 2026-12-05T17:40:02 ***
"""


def test_the_root_cause_is_chosen_over_the_collective_error_and_torchrun_s_wrapper():
    assert trainer_error(TORCHRUN_LOG) == (
        "FileNotFoundError: [Errno 2] No such file or directory: '/data/live/runs/r1/identity/step-000006'"
    )
    only_secondary = "\n".join(line for line in TORCHRUN_LOG.splitlines() if "rank1" not in line)
    assert trainer_error(only_secondary).startswith("torch.distributed.DistBackendError: ")
    wrapper = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"
    wrapper_only = f"Traceback (most recent call last):\n  File x\n{wrapper}\n"
    assert trainer_error(wrapper_only) == wrapper
    assert trainer_error("train-identity: step 6/24\nsrun: error: task 0: Exited with exit code 143\n") is None


def test_drape_s_own_error_lines_count_and_a_message_leads_with_the_reason(monkeypatch):
    log = "python -m drape.train: cannot read the job file s3://b/job.json: NoSuchKey\n"
    assert trainer_error(log) == "python -m drape.train: cannot read the job file s3://b/job.json: NoSuchKey"
    script = "drape: USR1: asking the trainer to save a checkpoint and exit\ndrape: error: no checkpoint was published\n"
    assert trainer_error(script) == "drape: error: no checkpoint was published"
    message = failure_message("exit code 143 (killed by SIGTERM)", TORCHRUN_LOG)
    first = message.splitlines()[0]
    assert first.startswith("FileNotFoundError: ") and first.endswith("(exit code 143 (killed by SIGTERM)); log tail:"), first
    assert failure_message("exit code 1", "") == "exit code 1"


def test_the_reason_is_redacted_bounded_and_read_from_the_tail_only(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SENTINEL)
    long = f"Traceback (most recent call last):\n  File x\nValueError: key {SENTINEL} {'x' * 2000}\n"
    reason = trainer_error(long)
    assert SENTINEL not in reason and len(reason) <= MAX_REASON_CHARS and reason.startswith("ValueError: key ***")
    assert SENTINEL not in failure_message("exit code 1", long)
    log = tmp_path / "job.log"
    log.write_text("Traceback (most recent call last):\n  File x\nOldError: long ago\n" + "." * (2 * LOG_TAIL_BYTES) + "\n")
    tail = read_tail(log)
    assert len(tail) == LOG_TAIL_BYTES and trainer_error(tail) is None  # an error before the tail is not read
    assert read_tail(tmp_path / "missing.log") == ""


def test_a_local_torchrun_job_whose_rank_fails_is_recorded_with_that_rank_s_error(tmp_path, monkeypatch):
    """Two gloo ranks: rank 1 raises FileNotFoundError (with a secret in it), rank 0 waits in a barrier
    and fails as its peer goes; on main the message began "exit code 1", the reason now is rank 1's."""
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SENTINEL)
    program = tmp_path / "ranks.py"
    program.write_text(
        textwrap.dedent(
            """
            import os, torch.distributed as dist
            dist.init_process_group("gloo")
            if dist.get_rank() == 1:
                raise FileNotFoundError(f"stage folder gone under {os.environ['AWS_SECRET_ACCESS_KEY']}: step-000006")
            dist.barrier()
            """
        )
    )
    launcher = LocalLauncher(tmp_path / "logs", passed=("AWS_SECRET_ACCESS_KEY",))
    job = {
        "id": "stage-training-1-identity",
        "command": json.dumps([sys.executable, str(program)]),
        "env": "{}",
        "labels": json.dumps({"launch": "torchrun"}),
    }
    gpus = [GpuState(f"cpu-00/cpu{i}", "cpu-00", "cpu", 16.0) for i in range(2)]
    handle = launcher.launch(job, gpus)
    started = time.monotonic()
    outcome = wait_until(lambda: launcher.poll(job["id"], handle), 120, "the torchrun job's end")
    print(f"torchrun job failed in {time.monotonic() - started:.1f} s: {outcome.message.splitlines()[0]}")
    first = outcome.message.splitlines()[0]
    assert outcome.exit_code != 0
    assert first.startswith("FileNotFoundError: stage folder gone under ***: step-000006 (exit code"), first
    assert SENTINEL not in outcome.message


def test_the_kubernetes_engine_reads_the_failed_pod_s_log_for_the_reason():
    """A failed Job's reason from its failed pod's log (bounded by limit_bytes); no log: the engine's account."""
    from types import SimpleNamespace

    from scheduler.engines.kubernetes.launcher import KubernetesLauncher
    from tests.conftest import TINY, tiny_config

    calls = []

    class Core:
        def list_namespaced_pod(self, namespace, label_selector=None, _request_timeout=None):
            calls.append(("list", label_selector))
            pods = [("drape-x-0", "Running"), ("drape-x-1", "Failed")]
            return SimpleNamespace(
                items=[SimpleNamespace(metadata=SimpleNamespace(name=n), status=SimpleNamespace(phase=p)) for n, p in pods]
            )

        def read_namespaced_pod_log(self, name, namespace, limit_bytes=None, tail_lines=None, _request_timeout=None):
            calls.append(("log", name, limit_bytes))
            return TORCHRUN_LOG

    class Batch:
        def read_namespaced_job_status(self, name, namespace, _request_timeout=None):
            return SimpleNamespace(status=SimpleNamespace(succeeded=0, failed=1), spec=SimpleNamespace(completions=2))

    launcher = KubernetesLauncher(tiny_config(TINY.parent).queue.kubernetes)
    launcher._clients = {"core": Core(), "batch": Batch(), "custom": None}
    outcome = launcher.poll("stage-training-1-identity", "job:drape-x")
    first = outcome.message.splitlines()[0]
    assert first.startswith("FileNotFoundError: ") and first.endswith("(Kubernetes job:drape-x failed); log tail:"), first
    assert calls == [("list", "job-name=drape-x"), ("log", "drape-x-1", LOG_TAIL_BYTES)]

    class NoLogs(Core):
        def read_namespaced_pod_log(self, *args, **kwargs):
            raise RuntimeError("pods/log is forbidden")

    launcher._clients["core"] = NoLogs()
    assert launcher.poll("stage-training-1-identity", "job:drape-x").message == "Kubernetes job:drape-x failed"
