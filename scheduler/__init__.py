"""The GPU queue, in rooms. Imports run `tasks → scheduler → drape`; inside, each room may import
only the rooms below it (`tests/unit/test_house.py` holds them to it):

    policy/     pure placement decisions: the vocabulary (state.py), the incremental Planner, the
                reference `plan_drape`, the pieces both use (pool, reservation, preemption, gangs)
                and the baselines drape is measured against. No I/O, no clock of its own.
    queue/      durable state: the tables, the job store (SQLite or PostgreSQL), claims, leases,
                change versions, the allocation log for the cost report.
    engines/    one adapter per engine (local/, kubernetes/, slurm/): launch, poll, cancel, adopt, and
                where a job really landed. None imports another; `engines/__init__.py` is their shape.
    dispatch/   the cycle: fleet view, planning, claims, launches, reaping, placement drift.
    jobs/       what a stage, an inference benchmark or a personalization asks for (memory profiles).
    sim/        the trace simulator: replays the policy dispatch runs, on a trace and a fleet file.
                dispatch/ never imports it.

Offline analysis (provable floors on waits) lives in benchmarks/floors/, not here.
"""
