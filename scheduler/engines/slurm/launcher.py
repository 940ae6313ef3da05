"""The Slurm engine: a claimed job as an ``sbatch`` script whose ``srun`` starts torchrun on every node.

Who places: drape's queue. Its policy chose the nodes and GPUs from the memory profile; the script
asks Slurm for exactly those (``--nodelist``, ``--nodes``, ``--gres=gpu[:<type>]:<per node>``), with
CPUs, memory, partition and time fitted to the placed nodes as Slurm has them (requests.py), so
Slurm either runs the job where drape put it or says no, and never silently elsewhere:
- before submitting, every placed node must be a Slurm node offering at least the GPUs asked for
  (``scontrol show node``), else the launch fails naming the node and both counts;
- sbatch's own refusal fails the launch with sbatch's words;
- a job Slurm keeps pending for a reason other than its turn (a node down or drained) longer than
  `queue.slurm.pending_timeout_seconds` is cancelled and fails with Slurm's reason.
GPUs are whole (`queue.max_jobs_per_gpu` is 1 with this engine): Slurm's gres gives no fractions.

The script (`batch_script`, its shell in script.py): ``srun`` one task per node, each execs torchrun with an explicit c10d
rendezvous at the first node of the allocation (``scontrol show hostnames`` → its NodeAddr from
``scontrol show node``), that node hosting the store (``is_host=$((SLURM_NODEID == 0))``), and
``DRAPE_NODE`` set to the Slurm node's name. ``--requeue`` and ``--signal=B:USR1@<s>``: on USR1 the
batch shell sends SIGTERM to the step (the trainer saves a checkpoint, publishes it and exits, see
drape/training/loop/stop.py), then requeues the job only when the trainer said, for this run
(``DRAPE_RUN_MARK``), that a checkpoint newer than the run's start is whole in the store; else it
says why not and the job fails (never a requeue loop of runs that each meet the signal before
their first save); on SIGTERM (scancel, preemption) it only passes it on. The job's environment is the dispatcher's filtered one
(`scheduler.engines.job_environment`) exported by sbatch: no value is ever written in the script.

Handles are ``slurm:<job id>:<job name>``; the name is ``drape-<queue job id>-a<attempt>`` and the
comment ``drape:<queue job id>``. A launch first looks for a job of that name (a dispatcher that
died between sbatch and recording the handle): it adopts it instead of submitting it twice.
Finished runs and their GPU-hours come from ``sacct`` (`usage`), into the cost report
(scheduler/dispatch/accounting.py) and the metric ``drape_engine_job_gpu_hours``. A job is taken
for ended only on slurmctld's word (``scontrol`` knows it ended, or no longer knows it): a
controller that does not answer (busy under load, restarting) says nothing, and the job is asked
about again next cycle, never failed or requeued to run a second time beside itself.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from drape.config import names
from scheduler.engines import Outcome, exit_message, job_environment
from scheduler.engines.reasons import failure_message, read_tail
from scheduler.engines.slurm.fleet import SlurmUnreachable, read_nodes, read_partitions
from scheduler.engines.slurm.nodes import UNTYPED, SlurmNode, fields
from scheduler.engines.slurm.requests import FitError, Fitted, fit
from scheduler.engines.slurm.sacct import SlurmRun, _requested_gpus, parse_runs, run_gpu_hours
from scheduler.engines.slurm.script import BODY, task_command
from scheduler.policy import GpuState

RUNNING = {"RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED", "STOPPED"}
WAITING_TURN = {"None", "Priority", "Resources", "BeginTime", "Dependency", "JobHeldUser", "Reservation", "QOSResourceLimit"}
SLURM_VARIABLES = ("SLURM_CONF",)  # what the Slurm clients (sbatch here, scontrol in the script) need to find the cluster


UNKNOWN_JOB = "Invalid job id specified"  # scontrol's words for a job it does not (or no longer) know


class SlurmError(RuntimeError):
    pass


class SlurmUnanswered(SlurmError):
    """slurmctld did not answer (busy, restarting): nothing is known about the job."""


@dataclass(frozen=True)
class SlurmRequest:
    """What a job asks Slurm for: the nodes drape placed it on and the GPUs on each."""

    nodes: list[str]
    gpus_per_node: int
    model: str

    @classmethod
    def of(cls, gpus: list[GpuState]) -> SlurmRequest:
        nodes = sorted({g.node for g in gpus})
        per_node = {node: sum(1 for g in gpus if g.node == node) for node in nodes}
        if len(set(per_node.values())) > 1:
            raise SlurmError(f"the placement {per_node} is uneven; a Slurm job has the same GPUs on every node")
        return cls(nodes, max(per_node.values(), default=0), gpus[0].model if gpus else "")


def job_name(job: dict) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"drape-{job['id']}-a{job.get('attempts') or 1}")


def gres_type(model: str, settings) -> str | None:
    """The gres type a GPU model is asked by: `gres_types`' entry, else the model itself when it is a
    type of `gpu_memory_gib` (a fleet read from Slurm names models by type), else None (untyped)."""
    kind = settings.gres_types.get(model)
    if kind is None and model in settings.gpu_memory_gib and model != UNTYPED:
        kind = model
    return kind


def _gres(request: SlurmRequest, settings) -> str:
    kind = gres_type(request.model, settings)
    return f"gpu:{kind}:{request.gpus_per_node}" if kind else f"gpu:{request.gpus_per_node}"


def _size(mib: int) -> str:
    return f"{mib // 1024}G" if mib % 1024 == 0 else f"{mib}M"


def _directives(job: dict, request: SlurmRequest, settings, log_path: Path, fitted: Fitted) -> list[str]:
    lines = [
        f"--job-name={job_name(job)}",
        f"--comment=drape:{job['id']}",
        f"--nodes={len(request.nodes)}",
        f"--nodelist={','.join(request.nodes)}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={fitted.cpus_per_task}",
        f"--time={fitted.time_minutes}",
        f"--signal=B:USR1@{settings.signal_seconds}",
        f"--output={log_path}",
        "--open-mode=append",
        "--export=ALL",
    ]
    if request.gpus_per_node:
        lines.insert(5, f"--gres={_gres(request, settings)}")
    if fitted.mem_per_gpu_mib and request.gpus_per_node:
        lines.append(f"--mem-per-gpu={_size(fitted.mem_per_gpu_mib)}")
    elif fitted.mem_mib:
        lines.append(f"--mem={_size(fitted.mem_mib)}")
    lines.append("--requeue" if settings.requeue else "--no-requeue")
    lines += [f"--partition={fitted.partition}"] * bool(fitted.partition) + [f"--account={settings.account}"] * bool(
        settings.account
    )
    return [f"#SBATCH {line}" for line in lines]


def batch_script(
    job: dict,
    gpus: list[GpuState],
    settings,
    log_path: Path,
    nodes: list[SlurmNode] | None = None,
    limits: dict[str, int | None] | None = None,
) -> str:
    """The sbatch script of `job` placed on `gpus` (see the module docstring), its requests sized to
    the placed `nodes` as Slurm has them and their partition's time limit (`limits`; requests.py);
    without `nodes`, the configured values alone. Every name in it is checked against Slurm's grammar
    (drape.config.names), a NameRefused naming the job otherwise."""
    names.slurm_job_name(job["id"], "queue job id")  # it is written in a comment line, and --comment
    request = SlurmRequest.of(gpus)
    for node in request.nodes:  # each on its own: a comma in one would ask --nodelist for another node
        names.node_name(node, f"job {job['id']}: placed node")
    try:
        fitted = fit(settings, request.gpus_per_node, nodes or [], limits)
    except FitError as error:
        raise SlurmError(f"job {job['id']} on {', '.join(request.nodes)}: {error}") from None
    env = {**json.loads(job.get("env") or "{}"), "DRAPE_JOB_ID": job["id"]}
    exports = [
        f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items()) if re.fullmatch(r"[A-Z_][A-Z0-9_]*", name)
    ]
    header = [
        "#!/bin/bash",
        f"# drape queue job {job['id']} ({job.get('kind', '')}, stage {job.get('stage') or '-'}): scheduler/engines/slurm",
        *(f"# {note}" for note in fitted.notes),
    ]
    task = shlex.quote(task_command(job, request, settings))
    body = BODY.format(port=settings.rendezvous_port, task=task, log=shlex.quote(str(log_path)))
    script = "\n".join([*header, *_directives(job, request, settings, log_path, fitted), *exports, *settings.setup, body])
    names.sbatch_directives(script, f"job {job['id']}")
    return script


class SlurmLauncher:
    """Submits, watches, cancels and adopts drape's Slurm jobs (`queue.slurm`)."""

    def __init__(self, settings, log_dir: Path, script_dir: Path, passed=()):
        self.settings, self.log_dir, self.script_dir = settings, Path(log_dir), Path(script_dir)
        self.passed = (*passed, *SLURM_VARIABLES)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.script_dir.mkdir(parents=True, exist_ok=True)
        self.pending_since: dict[str, float] = {}
        self.requeued_since: dict[str, float] = {}  # "<job id>:<restarts>" → when first seen waiting to restart

    def _run(self, *argv: str, env: dict[str, str] | None = None, check: bool = True) -> str:
        environ = env or {**os.environ}
        try:
            done = subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SlurmError(f"{argv[0]}: {error}") from None
        if check and done.returncode:
            raise SlurmError(f"{' '.join(argv[:2])}: {(done.stderr or done.stdout).strip()}")
        return done.stdout

    def log_path(self, job_id: str) -> Path:
        return self.log_dir / f"{job_id}.log"

    def check_request(self, request: SlurmRequest) -> list[SlurmNode]:
        """The placed nodes as Slurm has them; refuses a placement Slurm cannot run as asked: a node it
        does not know, or with fewer GPUs (of the type asked for) than placed there."""
        try:
            found = {node.name: node for node in read_nodes(request.nodes)}
        except (SlurmUnreachable, ValueError) as error:
            raise SlurmError(f"reading nodes {', '.join(request.nodes)} from Slurm: {error}") from None
        kind = gres_type(request.model, self.settings)
        for name in request.nodes:
            if name not in found:
                raise SlurmError(f"node {name} of drape's fleet is not a node of this Slurm cluster (scontrol show node)")
            gres = ",".join(f"gpu:{t}:{n}" if t != UNTYPED else f"gpu:{n}" for t, n in found[name].gpus)
            offered = sum(n for t, n in found[name].gpus if kind is None or t == kind)
            if offered < request.gpus_per_node:
                raise SlurmError(
                    f"drape placed {request.gpus_per_node} GPU(s){f' of type {kind}' if kind else ''} on node {name}, but "
                    f"Slurm's gres there is {gres or 'none'} ({offered} GPU(s)): fix the fleet inventory or gres.conf so "
                    "both schedulers count the same GPUs"
                )
        return [found[name] for name in request.nodes]

    def partition_limits(self) -> dict[str, int | None] | None:
        """Partition → time limit (sinfo), or None when sinfo cannot say (the configured --time stands)."""
        try:
            return read_partitions()
        except (SlurmUnreachable, ValueError):
            return None

    def find(self, name: str) -> str | None:
        """The Slurm job id of the job named `name` still known to Slurm, if any."""
        out = self._run("squeue", "-h", "-t", "all", f"--name={name}", "-o", "%i", check=False)
        ids = out.split()
        return ids[0] if ids else None

    def launch(self, job: dict, gpus: list[GpuState]) -> str:
        name = job_name(job)
        if (existing := self.find(name)) is not None:  # submitted before a restart: it is this job's
            return f"slurm:{existing}:{name}"
        request = SlurmRequest.of(gpus)
        nodes = self.check_request(request)
        text = batch_script(job, gpus, self.settings, self.log_path(job["id"]), nodes, self.partition_limits())
        script = self.script_dir / f"{name}.sbatch"
        partial = script.with_suffix(".tmp")
        partial.write_text(text)
        partial.replace(script)
        env = {**job_environment(self.passed), **json.loads(job.get("env") or "{}"), "DRAPE_JOB_ID": job["id"]}
        try:
            slurm_id = self._run("sbatch", "--parsable", str(script), env=env).strip().split(";")[0]
        except SlurmError as error:
            raise SlurmError(f"Slurm refused job {job['id']}: {error}") from None
        return f"slurm:{slurm_id}:{name}"

    @staticmethod
    def _parse(handle: str | None) -> tuple[str, str] | None:
        parts = (handle or "").split(":")
        return (parts[1], parts[2]) if len(parts) == 3 and parts[0] == "slurm" and parts[1].isdigit() else None

    def _show(self, slurm_id: str) -> dict[str, str] | None:
        """The job as slurmctld has it; None when slurmctld says it does not know it (ended MinJobAge ago);
        SlurmUnanswered when it did not say (a timeout, no controller): never taken for a job gone."""
        try:
            out = self._run("scontrol", "show", "job", "-o", slurm_id)
        except SlurmError as error:
            if UNKNOWN_JOB in str(error):
                return None
            raise SlurmUnanswered(f"scontrol show job {slurm_id}: {error}") from None
        if not out.startswith("JobId="):
            raise SlurmUnanswered(f"scontrol show job {slurm_id} answered {out[:200]!r}")
        return fields(out)

    def sees(self, handle: str | None) -> bool:
        """Whether Slurm has (or had) the job; a job slurmctld did not answer about is seen: adopted and
        asked again, never requeued while it may run on."""
        parsed = self._parse(handle)
        if parsed is None:
            return False
        try:
            shown = self._show(parsed[0])
        except SlurmUnanswered:
            return True
        if shown is not None:
            return shown.get("JobName") == parsed[1]
        return any(run.name == parsed[1] for run in self.usage([parsed[0]]))

    def poll(self, job_id: str, handle: str) -> Outcome | None:
        parsed = self._parse(handle)
        if parsed is None:
            return Outcome(-1, f"{handle} is not a Slurm job handle")
        try:
            shown = self._show(parsed[0])
        except SlurmUnanswered as error:
            print(f"queue: {job_id}: Slurm did not answer ({str(error)[:300]}); asked again next cycle")
            return None
        if shown is None:
            runs = [run for run in self.usage([parsed[0]]) if run.name == parsed[1]]
            if not runs:
                return Outcome(-1, f"Slurm no longer knows job {parsed[0]} ({parsed[1]})")
            return self._ended(job_id, parsed[0], runs[-1].state, "0:0", "", None)
        state, reason = shown.get("JobState", ""), shown.get("Reason", "None")
        if state == "PENDING":
            return self._pending(job_id, parsed[0], shown, reason)
        self.pending_since.pop(job_id, None)
        if state in RUNNING:
            return None
        return self._ended(job_id, parsed[0], state, shown.get("ExitCode", "0:0"), reason, _requested_gpus(shown))

    def _pending(self, job_id: str, slurm_id: str, shown: dict[str, str], reason: str) -> Outcome | None:
        self._lift_requeue_delay(job_id, slurm_id, shown, reason)
        if reason in WAITING_TURN:
            self.pending_since.pop(job_id, None)
            return None
        since = self.pending_since.setdefault(job_id, time.monotonic())
        if time.monotonic() - since < self.settings.pending_timeout_seconds:
            return None
        self._run("scancel", slurm_id, check=False)
        self.pending_since.pop(job_id, None)
        return Outcome(
            -1,
            f"Slurm kept job {slurm_id} pending for {self.settings.pending_timeout_seconds:g} s ({reason}) on the nodes drape "
            "placed it on: the schedulers disagree about those nodes; cancelled",
        )

    def _lift_requeue_delay(self, job_id: str, slurm_id: str, shown: dict[str, str], reason: str) -> None:
        after = self.settings.requeued_start_after_seconds
        if after is None or reason != "BeginTime" or shown.get("Restarts", "0") == "0":
            return
        key = f"{job_id}:{shown.get('Restarts')}"
        seen = self.requeued_since.setdefault(key, time.monotonic())
        if time.monotonic() - seen >= after:
            self._run("scontrol", "update", f"JobId={slurm_id}", "StartTime=now", check=False)

    def _ended(self, job_id: str, slurm_id: str, state: str, exit_code: str, reason: str, gpus: int | None) -> Outcome:
        from drape.ops import metrics

        hours = sum(run_gpu_hours(run, gpus) for run in self.usage([slurm_id]))
        metrics.ENGINE_GPU_HOURS.labels(job_id=job_id, engine="slurm", state=state).set(hours)
        code_text, _, signal_text = exit_code.partition(":")
        code = int(code_text) if code_text.isdigit() else -1
        if state == "COMPLETED" and code == 0:
            return Outcome(0, f"Slurm job {slurm_id} COMPLETED")
        code = code or (128 + int(signal_text) if signal_text.isdigit() and int(signal_text) else 1)
        account = f"Slurm job {slurm_id} {state} ({reason}), {exit_message(code)}"
        return Outcome(code, failure_message(account, read_tail(self.log_path(job_id))))

    def cancel(self, job_id: str, handle: str) -> None:
        """scancel: Slurm sends the batch script and the step SIGTERM (the trainer saves), then SIGKILL."""
        parsed = self._parse(handle)
        if parsed is not None:
            self._run("scancel", parsed[0], check=False)

    def usage(self, slurm_ids: list[str] | None = None, since: str = "now-30days", check: bool = False) -> list[SlurmRun]:
        """drape's runs as sacct accounts them (every run of a requeued job; `slurm_ids`: only those);
        `check`: SlurmError when sacct fails (accounting off), else none found."""
        argv = ["sacct", "-X", "-P", "-n", "-o", "JobID,JobName,State,Start,End,AllocTRES", "-S", since]
        if self.settings.accounting == "jobcomp":
            argv.insert(1, "-c")
        if slurm_ids:
            argv += ["-j", ",".join(slurm_ids)]
        return parse_runs(self._run(*argv, check=check))


def build(config, log_dir: Path) -> SlurmLauncher:
    settings = config.queue.slurm
    script_dir = Path(settings.script_dir) if settings.script_dir else log_dir.parent / "slurm"
    logs = Path(settings.log_dir) if settings.log_dir else log_dir
    return SlurmLauncher(settings, logs, script_dir, config.queue.job_environment)
