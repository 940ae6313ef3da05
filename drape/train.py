"""`python -m drape.train`: train one stage with no orchestrator (the command queue jobs and torchrun run).

The trainer lives in `drape.training`; this module only keeps the documented entry point.
"""

from drape.training.jobs.stage_job import main

if __name__ == "__main__":
    raise SystemExit(main())
