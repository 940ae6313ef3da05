"""How long a drape process takes to end once its work is done, with and without
`drape.ops.process.end_without_collection` (the collector's objects frozen at exit).

Each case starts a fresh interpreter that imports what the process imports, prints a mark when
its work is done, and exits; the time from the mark to the process's end is the exit. Side by
side in alternation, `--runs` times each (median and range, and the ratio):

- a stage job's rank (`drape.training.jobs.stage_job`: torch, diffusers, the trainer);
- the `drape` command (`drape.cli`: every command group).

And the whole of one short `drape cost --help` (start, import, work, exit), as a user runs it.

    .venv/bin/python benchmarks/exit.py            # about two minutes
    .venv/bin/python benchmarks/exit.py --runs 9
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARK = "work done"
FROZEN = "from drape.ops.process import end_without_collection; end_without_collection()\n"
CASES = {
    "a stage job's rank (drape.training.jobs.stage_job)": "import drape.training.jobs.stage_job\n",
    "the drape command (drape.cli)": "import drape.cli\n",
}


def exit_seconds(code: str) -> float:
    """Seconds from `code`'s mark to the end of its interpreter."""
    program = f"{code}print({MARK!r}, flush=True)\n"
    process = subprocess.Popen([sys.executable, "-c", program], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    marked = None
    for line in process.stdout:
        if line.strip() == MARK:
            marked = time.perf_counter()
    if process.wait() != 0 or marked is None:
        raise SystemExit(f"benchmark process failed ({process.returncode}): {code!r}")
    return time.perf_counter() - marked


def command_seconds(frozen: bool) -> float:
    """Seconds for a whole `drape cost --help`, through the console entry (`main`) or the Typer app alone."""
    entry = "main()" if frozen else "app()"
    program = f"import sys\nsys.argv = ['drape', 'cost', '--help']\nfrom drape.cli import app, main\n{entry}\n"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", program], cwd=REPO, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    rows = []
    for what, code in CASES.items():
        before, after = [], []
        for _ in range(runs):  # alternating: the machine's drift touches both alike
            before.append(exit_seconds(code))
            after.append(exit_seconds(FROZEN + code))
        rows.append((f"exit of {what}", before, after))
    before, after = [], []
    for _ in range(runs):
        before.append(command_seconds(False))
        after.append(command_seconds(True))
    rows.append(("all of `drape cost --help`", before, after))
    print(f"\n## A drape process's end, {runs} runs each, alternating (median, range)\n")
    print("| what | as it was | collector frozen at exit | ratio |\n|---|---|---|---|")
    for what, before, after in rows:
        print(f"| {what} | {_cell(before)} | {_cell(after)} | {statistics.median(after) / statistics.median(before):.2f} |")


if __name__ == "__main__":
    main()
