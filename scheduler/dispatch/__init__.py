"""The dispatch cycle: renew leases, reap, look at the fleet (`fleet.py`), plan with the live
planner (`live.py`), claim, launch through the engine `queue.launcher` names (`dispatcher.py`);
placement drift written into the books (`drift.py`); the queue's side of a run's cost
(`accounting.py`). Never imports sim/."""
