"""A request to stop training early, by signal: save a checkpoint now, publish it, exit.

What ends a queue job from outside sends SIGTERM first: Slurm's scancel and preemption, the batch
script drape writes when Slurm's ``--signal=B:USR1@<s>`` warns of the time limit (it turns USR1
into SIGTERM on the job step, then requeues the job), Kubernetes deleting a pod, the local
launcher's cancel. `install()` (the job's entry point, every rank) makes SIGTERM and SIGUSR1 set a
flag instead of ending the process. The training loop asks `requested(context)` after each step;
under torchrun the ranks agree first (a MAX all-reduce of one number), so every rank saves the
same step. The loop then saves that step and raises `StopRequested`; the job publishes what it
saved and exits with `EXIT_STOPPED`, and its next run resumes from that checkpoint.

A request that comes before the run trained a step (during start-up: fetching, restoring,
building the model) stops it before its first step, with nothing new to save
(`StopRequested.saved` false): a step and a save there would only repeat what the store holds.
A job run apart says on stdout when a checkpoint newer than its run's start is in the store
(`published_line`, rank 0, checked in the store after every node published): the Slurm batch
script requeues the job only on that line of this run (``$DRAPE_RUN_MARK``), else it says so and
fails, so a signal that keeps arriving before the first save never makes a requeue loop.

A signal can also come after the last step, while the job wraps up (its final save, its result
into the store): the ranks finish, but torchrun, told to stop, exits non-zero all the same. Rank 0
of such a job says, once its result is whole in the store, that this run trained its stage to the
end (`finished_line`), and the batch script takes that line of this run as the job's success: it
neither fails the job nor requeues it (on a loaded machine, a time-limit warning that met the
wrap-up failed a finished job and the queue ran it again).
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import torch

EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped on request, resumable; not a success
_flag = threading.Event()
_installed = threading.Event()
_owner: list[int] = []  # the pid that installed the handlers; a forked child (a data loader worker) keeps the default


RUN_MARK_VARIABLE = "DRAPE_RUN_MARK"  # which run of a requeued job this is (the Slurm batch script sets it)
PUBLISHED_PREFIX = "drape: published during run "
FINISHED_PREFIX = "drape: finished during run "


class StopRequested(Exception):
    """Training stopped after `step` on request: with a checkpoint of that step saved, or (`saved`
    false) before this run trained any step, with nothing new to save."""

    def __init__(self, step: int, *, started: int = 0, saved: bool = True):
        if saved:
            super().__init__(f"stopped on request after step {step}, with a checkpoint of it")
        else:
            super().__init__(
                f"stopped on request before this run trained a step (it started at step {step}): nothing new to save"
            )
        self.step, self.started, self.saved = step, started, saved


def run_mark() -> str:
    """This run's mark (``<Slurm job id>.<restart count>``), or '' outside such a script."""
    return os.environ.get(RUN_MARK_VARIABLE, "")


def published_line(step: int, started: int) -> str:
    """The line the batch script looks for before a requeue: a checkpoint of `step`, newer than the
    run's start (`started`), is whole in the store."""
    return f"{PUBLISHED_PREFIX}{run_mark() or '-'}: checkpoint of step {step} (this run started at step {started})"


def finished_line(stage: str) -> str:
    """The line the batch script takes as the job's success after a stop signal: this run trained
    `stage` to the end and its result is whole in the store."""
    return f"{FINISHED_PREFIX}{run_mark() or '-'}: stage {stage} trained to the end, its result is in the store"


def say_finished(stage: str) -> None:
    """On rank 0 of a job run apart, once its result is whole in the store: `finished_line`, where a
    batch script marked the run (elsewhere no one reads it)."""
    if run_mark():
        print(finished_line(stage), flush=True)


def _handler(signum: int, frame) -> None:
    if _owner and os.getpid() != _owner[0]:  # inherited by a forked helper: end it as the default would
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if not _flag.is_set():
        print(
            f"drape: {signal.Signals(signum).name}: saving a checkpoint after this step, then exiting",
            file=sys.stderr,
            flush=True,
        )
    _flag.set()


def install() -> None:
    """SIGTERM and SIGUSR1 ask the training loop to checkpoint and stop (main thread only)."""
    _owner[:] = [os.getpid()]
    for signum in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, _handler)
    _installed.set()


def requested(context) -> bool:
    """Whether any rank was asked to stop (every rank must call this at the same step)."""
    if not _installed.is_set():
        return False
    if not context.is_distributed:
        return _flag.is_set()
    vote = torch.tensor([1.0 if _flag.is_set() else 0.0], device=context.device)
    torch.distributed.all_reduce(vote, op=torch.distributed.ReduceOp.MAX)
    return bool(vote.item())


def say_stopped(stopped: StopRequested, newest_step: int | None, where: str, stage: str) -> None:
    """After a stop, on rank 0: `published_line` when the newest whole checkpoint in `where` (the store,
    run apart; else the stage folder), of `newest_step`, is newer than the run's start; else why not."""
    if not stopped.saved:
        print(f"train-{stage}: {stopped}", flush=True)
    elif newest_step is not None and newest_step > stopped.started:
        print(published_line(newest_step, stopped.started), flush=True)
    else:
        print(
            f"train-{stage}: the checkpoint of step {stopped.step} is not whole in {where}: nothing newer than this "
            f"run's start (step {stopped.started}) to resume from",
            file=sys.stderr,
            flush=True,
        )
