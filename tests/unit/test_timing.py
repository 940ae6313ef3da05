"""tests/timing.py: the per-file times a pytest run writes when DRAPE_TEST_TIMES names a folder, and their table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.timing import report

REPO = Path(__file__).resolve().parents[2]


def test_a_run_writes_each_file_s_wall_cpu_and_sleep_and_nothing_without_the_variable(tmp_path):
    (tmp_path / "test_waits.py").write_text(
        "import time\n\ndef test_sleeps():\n    time.sleep(0.3)\n\ndef test_spins():\n"
        "    end = time.process_time() + 0.2\n    while time.process_time() < end:\n        pass\n"
    )
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_XDIST")}  # `make test`'s worker names
    env |= {"PYTHONPATH": str(REPO), "DRAPE_TEST_TIMES": str(tmp_path / "times")}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "tests.timing", "-p", "no:cacheprovider"]
    done = subprocess.run([*argv, "test_waits.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    entry = json.loads((tmp_path / "times" / "main.json").read_text())["test_waits.py"]
    assert entry["tests"] == 2 and entry["slept_s"] >= 0.3 and entry["cpu_s"] >= 0.2 and entry["wall_s"] >= 0.5, entry
    del env["DRAPE_TEST_TIMES"]
    done = subprocess.run([*argv, "test_waits.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and sorted(p.name for p in (tmp_path / "times").iterdir()) == ["main.json"]


def test_the_table_is_slowest_first_and_the_estimate_is_the_busiest_worker(tmp_path):
    def entry(wall, cpu, start):
        return {"wall_s": wall, "cpu_s": cpu, "slept_s": 1.0, "tests": 1, "start": start, "end": start + wall}

    (tmp_path / "gw0.json").write_text(json.dumps({"a.py": entry(100.0, 90.0, 0.0), "b.py": entry(20.0, 2.0, 100.0)}))
    (tmp_path / "gw1.json").write_text(json.dumps({"c.py": entry(50.0, 50.0, 5.0)}))
    lines = report(tmp_path).splitlines()
    assert [line.split()[0] for line in lines[1:4]] == ["a.py", "c.py", "b.py"]
    assert lines[3].split()[-1] == "90"  # b.py: 2 s of CPU in 20 s, idle 90% of it
    assert "worker gw0: 2 files, wall 120.0 s (first start to last end 120.0 s)" in lines[5]
    assert lines[-1].endswith("estimate on 2 worker(s): 120.0 s (the busiest worker), 85.0 s balanced")
