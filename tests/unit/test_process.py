"""drape's entry points end without a collection over everything they imported (drape/ops/process.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import atexit, gc, sys
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0, flush=True))  # runs after the next
{setup}
print("frozen before exit:", gc.get_freeze_count() > 0, flush=True)
"""


def _run(setup: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(setup=setup)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_collectors_objects_are_frozen_at_exit_only_once_asked():
    asked = "from drape.ops.process import end_without_collection\nend_without_collection(); end_without_collection()"
    assert _run(asked) == ["frozen before exit: False", "frozen at exit: True"]
    assert _run("import drape.ops.process") == ["frozen before exit: False", "frozen at exit: False"]


def test_the_drape_command_and_the_stage_job_ask_for_it():
    command = "sys.argv = ['drape', 'cost', '--help']\nfrom drape.cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass"
    stage_job = "from drape.training.stage_job import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    for setup in (command, stage_job):
        lines = _run(setup)
        assert lines[-2:] == ["frozen before exit: False", "frozen at exit: True"], lines[-5:]
    assert 'drape = "drape.cli:main"' in (REPO / "pyproject.toml").read_text()  # the console command goes through main
