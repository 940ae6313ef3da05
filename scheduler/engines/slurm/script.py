"""The shell of drape's sbatch script (scheduler/engines/slurm/launcher.py `batch_script` writes the rest).

`task_command`: what each ``srun`` task runs, torchrun across the allocation with an explicit c10d
rendezvous at the allocation's first node (``is_host=$((SLURM_NODEID == 0))``), or the job's own
command. `BODY`: the batch shell itself: the rendezvous endpoint and id of this run of the job (a
requeued run gets the next port), USR1 and TERM trapped and passed to the step as SIGTERM (the
trainer saves, publishes and exits), and a requeue after USR1 only on the trainer's word, for this
run, that a checkpoint newer than the run's start is whole in the store; a stop that came after the
trainer's last step ends the job as a success on its word that this run's result is in the store
(drape/training/loop/stop.py).
"""

from __future__ import annotations

import json
import shlex

from scheduler.engines import is_python, torchrun_program


def task_command(job: dict, request, settings) -> str:
    """The shell each srun task runs: torchrun across the allocation for a torchrun job, else the command."""
    command = json.loads(job["command"])
    ranks = max(request.gpus_per_node, 1)
    if json.loads(job.get("labels") or "{}").get("launch") != "torchrun" or (ranks == 1 and len(request.nodes) == 1):
        return 'export DRAPE_NODE="$SLURMD_NODENAME"; exec ' + shlex.join(command)
    runner = [command[0], "-m", "torch.distributed.run"] if is_python(command[0]) else ["torchrun"]
    fixed = [*runner, f"--nnodes={len(request.nodes)}", f"--nproc-per-node={ranks}", "--rdzv-backend=c10d"]
    timeout = settings.rendezvous_timeout_seconds
    conf = f'"--rdzv-conf=is_host=$((SLURM_NODEID == 0)),join_timeout={timeout},read_timeout={timeout}"'
    rendezvous = '"--rdzv-endpoint=$DRAPE_RDZV_ENDPOINT" "--rdzv-id=$DRAPE_RDZV_ID"'
    program = shlex.join(torchrun_program(command))
    return f'export DRAPE_NODE="$SLURMD_NODENAME"; exec {shlex.join(fixed)} {rendezvous} {conf} {program}'


BODY = """set -uo pipefail
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
head_addr=$(scontrol show node "$head_node" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
# each run of a requeued job its own port: the store of the run before may still hold the last one
export DRAPE_RDZV_ENDPOINT="${{head_addr:-$head_node}}:$(( {port} + ${{SLURM_RESTART_COUNT:-0}} % 16 ))"
export DRAPE_RDZV_ID="$SLURM_JOB_ID-${{SLURM_RESTART_COUNT:-0}}"
export DRAPE_RUN_MARK="$SLURM_JOB_ID.${{SLURM_RESTART_COUNT:-0}}"  # the trainer names this run when it has published
log={log}
echo "drape: Slurm job $SLURM_JOB_ID run ${{SLURM_RESTART_COUNT:-0}} on $SLURM_JOB_NODELIST, rendezvous $DRAPE_RDZV_ENDPOINT"
stopping="" stopped_at="" srun_pid=""
stop() {{  # $1: USR1 (the time limit or an operator: checkpoint, exit, requeue) or TERM (scancel, preemption)
  stopping="$1" stopped_at="$SECONDS"
  echo "drape: $1: asking the trainer to save a checkpoint and exit"
  # the step may not exist yet (srun still starting it): then srun itself passes the signal on
  scancel --signal=TERM "$SLURM_JOB_ID.0" 2>/dev/null || {{ [ -n "$srun_pid" ] && kill -TERM "$srun_pid" 2>/dev/null; }}
}}
trap 'stop USR1' USR1
trap 'stop TERM' TERM
# one task on each node of the allocation, said outright: a step Slurm would lay out otherwise fails
srun --kill-on-bad-exit=1 --nodes="$SLURM_JOB_NUM_NODES" --ntasks="$SLURM_JOB_NUM_NODES" --ntasks-per-node=1 bash -c {task} &
srun_pid=$!
status=0
while :; do  # a trapped signal ends `wait` early: wait again until srun is gone
  if wait "$srun_pid"; then status=0; break; else status=$?; fi
  kill -0 "$srun_pid" 2>/dev/null || break
done
if [ -n "$stopping" ] && [ "$status" != 0 ] \\
   && grep -qF "drape: finished during run $DRAPE_RUN_MARK: " "$log" 2>/dev/null; then
  # the signal met the wrap-up after the last step: torchrun, told to stop, exits non-zero, but this run
  # trained the stage to the end and its result is whole in the store (the trainer's word): the job is done
  echo "drape: $stopping came after run $DRAPE_RUN_MARK trained to the end and published its result: the job is done"
  status=0
elif [ "$stopping" = USR1 ] && [ "$status" != 0 ]; then
  # requeue only on the trainer's word, for this run, that a checkpoint newer than the run's start is in
  # the store: else the next run would start where this one did and meet the same signal (a requeue loop)
  published=$(grep -F "drape: published during run $DRAPE_RUN_MARK: " "$log" 2>/dev/null | tail -n 1)
  if [ -n "$published" ]; then
    echo "drape: requeueing job $SLURM_JOB_ID; its next run resumes from its ${{published#*"$DRAPE_RUN_MARK: "}}"
    scontrol requeue "$SLURM_JOB_ID"
  else
    echo "drape: error: USR1 came ${{stopped_at}} s into run $DRAPE_RUN_MARK, before the trainer published a checkpoint" \\
      "newer than the run's start: not requeued (its next run would meet the same signal before saving);" \\
      "the time limit must exceed start-up to the first checkpoint plus --signal's margin (docs/slurm.md)"
  fi
fi
exit "$status"
"""
