"""How drape's own processes end: without a garbage collection over everything they imported.

When the interpreter ends it tears down its modules and collects garbage, and a collection walks
every object the process holds. torch, diffusers and transformers hold millions, so a `drape`
command or a stage job's rank went on long after its work was done, every time (a stage job's
ranks and torchrun wait for each other; the queue reaps the job only then; `benchmarks/exit.py`
measures it). Freezing the
collector's objects at exit skips that walk; exit handlers still run, and files, logs and
subprocesses are closed as before (drape closes what it opens; it never relies on a collection
at exit to flush anything).
"""

from __future__ import annotations

import atexit
import gc
import signal

_registered = False


def end_without_collection() -> None:
    """At this process's exit, freeze the collector's objects (`gc.freeze`) so the interpreter's
    final collections skip them. For entry points only (the `drape` command, `python -m drape.train`)."""
    global _registered
    if not _registered:
        atexit.register(gc.freeze)
        _registered = True


class Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) arrived: raised like Ctrl-C, so every `finally` and context manager
    that stops a child (`drape serve`'s stack, `subprocess.run`, an inference worker) runs."""


def _on_termination(signum: int, frame: object) -> None:
    # one stop, bounded by whoever stops the children; a second signal must not cut that short
    for other in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(other, signal.SIG_IGN)
    raise Terminated(f"stopped by {signal.Signals(signum).name}")


def stop_children_on_termination() -> None:
    """Make SIGTERM and SIGHUP stop this process the way SIGINT does (`Terminated`, a
    KeyboardInterrupt) instead of ending it on the spot, which would leave its children (a Prefect
    server in its own session, a torchrun) running. For entry points, in the main thread."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _on_termination)
