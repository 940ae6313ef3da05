"""The trace simulator: the policy the dispatcher runs, replayed on a trace (`traces.py`) and a fleet
file (`scheduler.queue.inventory.py`), GPU contention and preemption modelled (`model.py`).

    model.py      the model both replays share: pace under sharing, starts, ends, preemption, the tally
    replay.py     drape's policy as the incremental Planner, at a cost per event that does not grow
    reference.py  `simulate`: the entry point; the baselines and `plan_drape` in the plain loop
    traces.py     trace files, read without trusting them; export.py: the queue's history as a trace
    tables.py     results as Markdown tables

dispatch/ never imports this room: the simulator replays what dispatch runs, not the reverse.
"""

from scheduler.sim.model import CONTENTION_OVERLAP, RESTART_S, SimResult, job_class, offered_load_bound
from scheduler.sim.reference import simulate
from scheduler.sim.traces import TRACE_COLUMNS, TraceError, TraceJob, load_trace

__all__ = [
    "CONTENTION_OVERLAP",
    "RESTART_S",
    "TRACE_COLUMNS",
    "SimResult",
    "TraceError",
    "TraceJob",
    "job_class",
    "load_trace",
    "offered_load_bound",
    "simulate",
]
