"""The live dispatcher's cycle with 1,000 to 100,000 jobs queued in PostgreSQL, before and after.

A PostgreSQL of its own (Debian's binaries, as the tests start one; or `--url`), a static fleet
of `--gpus` GPUs (8-GPU nodes, H100 and A100 80 GB alternating) every GPU of which holds a
running job (76 GiB: nothing else fits beside it), and `--queued` jobs waiting (nine in ten on
one GPU at 8-70 GiB, one in ten on a whole node; priorities 1-6, submitted within the last
quarter hour). Before each timed cycle a node's eight jobs end and eight jobs are submitted (not
timed: what the rest of the world did meanwhile), so every cycle places a few jobs on a full
fleet, a dispatcher's steady state. The whole cycle is timed (`CycleReport.seconds`: leases,
takeovers, the ledger fleet view, the plan, the claims, the launches (a `NullLauncher`), the
failures and the metrics), each database a copy of the same filled one:

- before: `Dispatcher(incremental=False)`: `plan_drape` over every queued and running job, read
  whole from the database each cycle;
- after: the `LivePlanner` (`scheduler/dispatch/live.py`): the jobs whose state changed since the last
  cycle (`jobs.version`), the first cycle a full read (shown apart).

`--explain` prints, for one cycle after at the largest queue, PostgreSQL's plan of every distinct
statement the cycle ran (the lines naming scans and limits).

    .venv/bin/python benchmarks/dispatch_scale.py --cycles 7 --explain          # ~4 min on 2 cores
    .venv/bin/python benchmarks/dispatch_scale.py --queued 1000 --cycles 3 --explain
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import glob
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sqlalchemy
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drape.config import parse_config  # noqa: E402
from scheduler.dispatch.dispatcher import Dispatcher  # noqa: E402
from scheduler.engines.local.launcher import NullLauncher  # noqa: E402
from scheduler.queue.inventory import load_fleet  # noqa: E402
from scheduler.queue.schema import execute_many  # noqa: E402
from scheduler.queue.store import JobSpec, JobStore  # noqa: E402

CHURN = 8  # jobs that end, and jobs submitted, before each timed cycle: one node's worth
COLUMNS = "id, kind, shape, priority, gpus, mem_gib, duration_s, command, env, labels, state, submit_s, attempts"


@contextlib.contextmanager
def postgres():
    """A throwaway PostgreSQL on 127.0.0.1 (as `tests/conftest.py`'s `postgres_url`); its URL."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not bins:
        raise SystemExit("PostgreSQL is not installed (apt-get install postgresql), or pass --url")
    bindir, directory = Path(bins[-1]).parent, Path(tempfile.mkdtemp(prefix="drape-pg-bench-"))
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_postgres:
        shutil.chown(directory, "postgres")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    run = lambda *argv: subprocess.run([*as_postgres, *argv], check=True, capture_output=True, timeout=120)  # noqa: E731
    data = str(directory / "data")
    run(str(bindir / "initdb"), "-D", data, "-U", "drape", "--auth=trust")
    run(
        str(bindir / "pg_ctl"),
        "-D",
        data,
        "-l",
        str(directory / "log"),
        "-w",
        "-o",
        f"-h 127.0.0.1 -p {port} -k {directory}",
        "start",
    )
    try:
        yield f"postgresql+psycopg://drape@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_postgres, str(bindir / "pg_ctl"), "-D", data, "-m", "fast", "stop"], capture_output=True, timeout=120)
        shutil.rmtree(directory, ignore_errors=True)


def database(server: str, name: str, template: str | None = None) -> str:
    """A new database `name` on `server` (a copy of `template`); its URL."""
    engine = sqlalchemy.create_engine(server, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {name}"))
        connection.execute(sqlalchemy.text(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else "")))
    engine.dispose()
    return server.rsplit("/", 1)[0] + f"/{name}"


def fleet_file(folder: Path, gpus: int) -> Path:
    nodes = gpus // 8
    groups = [
        {"model": "H100-80GB", "memory_gib": 80, "nodes": (nodes + 1) // 2, "gpus_per_node": 8, "node_prefix": "h"},
        {"model": "A100-80GB", "memory_gib": 80, "nodes": nodes // 2, "gpus_per_node": 8, "node_prefix": "a"},
    ]
    path = folder / f"fleet-{gpus}.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    return path


def queued_row(rng: random.Random, number: int, now: float) -> tuple:
    gang = rng.random() < 0.1
    mem = rng.choice((60.0, 70.0)) if gang else rng.choice((8.0, 16.0, 24.0, 40.0, 60.0, 70.0))
    kind = "stage-training" if gang else "gate-eval"
    return (f"q{number:07d}", kind, kind, rng.randint(1, 6), 8 if gang else 1, mem, rng.uniform(600, 7200))


def fill(url: str, inventory: Path, queued: int, seed: int = 0) -> None:
    """Every GPU of the fleet running a 76 GiB job (leased far ahead), and `queued` jobs waiting."""
    rng, now = random.Random(seed), time.time()
    store = JobStore(url)
    gpus = load_fleet(inventory)
    store.register_gpus(gpus)
    running = [(f"r{i:07d}", "gate-eval", "gate-eval", 3, 1, 76.0, 86_400.0, gpu.uuid) for i, gpu in enumerate(gpus)]
    with store.engine.begin() as connection:
        execute_many(
            connection,
            f"INSERT INTO jobs ({COLUMNS}, start_s, dispatcher, lease_expires_s, assigned) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, '[\"true\"]', '{}', '{}', 'running', ?, 1, ?, 'filler', ?, ?)",
            [(*row[:7], now - 600, now - 600, now + 86_400, json.dumps([row[7]])) for row in running],
        )
        execute_many(
            connection,
            "INSERT INTO allocations (job_id, gpu_uuid, mem_gib) VALUES (?, ?, ?)",
            [(r[0], r[7], r[5]) for r in running],
        )
        execute_many(
            connection,
            f"INSERT INTO jobs ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, '[\"true\"]', '{{}}', '{{}}', 'queued', ?, 0)",
            [(*queued_row(rng, number, now), now - rng.uniform(0, 900)) for number in range(queued)],
        )
        connection.exec_driver_sql("ANALYZE")
    store.engine.dispose()


def churn(store: JobStore, rng: random.Random, step: int) -> None:
    """Node `step`'s eight filler jobs end and eight jobs are submitted (what others did between cycles)."""
    for index in range(8 * step, 8 * step + 8):
        store.finish(f"r{index:07d}", exit_code=0, dispatcher="filler")
    for index in range(CHURN):
        _, kind, _, priority, gpus, mem, duration = queued_row(rng, 0, 0.0)
        job_id = f"s{step:04d}-{index}"
        store.submit(
            JobSpec(kind=kind, command=["true"], id=job_id, priority=priority, gpus=gpus, mem_gib=mem, duration_s=duration)
        )


def measure(url: str, inventory: Path, scratch: Path, cycles: int, incremental: bool, explain: bool = False):
    """(first cycle s, median of the next `cycles` s, jobs started in those, the statements one cycle ran)."""
    config = parse_config(
        {
            "paths": {"root": str(scratch)},
            "queue": {"fleet": "static", "inventory": str(inventory), "url": url},
            "train": {"stages": {s: {"steps": 1, "trainable": ["*"]} for s in ("identity", "texture", "geometry", "denoise")}},
        }
    )
    store, rng = JobStore(url), random.Random(7)
    dispatcher = Dispatcher(config, store, launcher=NullLauncher(), incremental=incremental)
    gc.collect()
    gc.freeze()  # as `Dispatcher.run` does before its first cycle
    first = dispatcher.cycle().seconds
    times, started, statements = [], 0, []
    for step in range(cycles):
        churn(store, rng, step)
        recording = explain and step == cycles - 1
        if recording:
            sqlalchemy.event.listen(store.engine, "before_cursor_execute", _recorder(statements))
        report = dispatcher.cycle()
        if recording:
            sqlalchemy.event.remove(store.engine, "before_cursor_execute", _recorder.last)
        times.append(report.seconds)
        started += len(report.started)
    gc.unfreeze()
    store.engine.dispose()
    return first, statistics.median(times), started, statements


def _recorder(statements: list):
    def record(connection, cursor, statement, parameters, context, executemany):
        params = parameters[0] if executemany and parameters else parameters
        statements.append((statement, params))

    _recorder.last = record  # type: ignore[attr-defined]
    return record


def explain(url: str, statements: list) -> None:
    """PostgreSQL's plan of each distinct statement (its scans, limits and sorts)."""
    engine, seen = sqlalchemy.create_engine(url), set()
    with engine.connect() as connection:
        raw = connection.connection.dbapi_connection
        for statement, params in statements:
            head = " ".join(statement.split())
            if head in seen or head.split()[0].upper() not in ("SELECT", "UPDATE", "INSERT", "DELETE"):
                continue
            seen.add(head)
            with raw.cursor() as cursor:
                cursor.execute("EXPLAIN " + statement, params or None)
                plan = [row[0].strip() for row in cursor.fetchall()]
            keys = [
                line
                for line in plan
                if any(word in line for word in ("Scan", "Limit", "Sort", "Aggregate", "Update on", "Insert on"))
            ]
            print(f"\n`{head[:160]}`\n" + "\n".join(f"    {line}" for line in keys or plan[:2]))
        raw.rollback()
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", default="1000,10000,100000", help="queue sizes, comma-separated")
    parser.add_argument("--gpus", type=int, default=1000, help="fleet size (whole 8-GPU nodes)")
    parser.add_argument("--cycles", type=int, default=7, help="timed cycles each way (after the first)")
    parser.add_argument("--url", help="a PostgreSQL server URL to use instead of starting one (its databases are made here)")
    parser.add_argument("--explain", action="store_true", help="print the plans of one cycle after at the largest queue")
    args = parser.parse_args()
    sizes = [int(size) for size in args.queued.split(",") if size]
    with (
        tempfile.TemporaryDirectory(prefix="drape-dispatch-bench-") as folder,
        contextlib.nullcontext(args.url) if args.url else postgres() as server,
    ):
        scratch = Path(folder)
        inventory = fleet_file(scratch, args.gpus)
        rows, plans = [], []
        for size in sizes:
            started = time.perf_counter()
            fill(database(server, f"fill_{size}", None), inventory, size)
            print(f"  filled {size:,} queued jobs in {time.perf_counter() - started:.0f} s", file=sys.stderr)
            results = {}
            for name, incremental in (("before", False), ("after", True)):
                url = database(server, f"{name}_{size}", f"fill_{size}")
                results[name] = measure(
                    url, inventory, scratch, args.cycles, incremental, args.explain and size == sizes[-1] and incremental
                )
                if results[name][3]:
                    plans = (url, results[name][3])
            rows.append((size, results["before"], results["after"]))
        title = f"One dispatch cycle, {args.gpus:,} GPUs full, PostgreSQL (medians of {args.cycles} cycles)"
        print(f"\n## {title}\n")
        print("| queued | before: cycle s | after: cycle s | ratio | first cycle before s | after s | started before / after |")
        print("|---|---|---|---|---|---|---|")
        for size, before, after in rows:
            ratio = before[1] / after[1]
            cells = [f"{before[1]:.3f}", f"{after[1]:.3f}", f"{ratio:.1f}×", f"{before[0]:.3f}", f"{after[0]:.3f}"]
            print(f"| {size:,} | " + " | ".join(cells) + f" | {before[2]} / {after[2]} |")
        if plans:
            print(f"\n## The statements of one cycle after, {sizes[-1]:,} queued: PostgreSQL's plans (key lines)")
            explain(*plans)


if __name__ == "__main__":
    main()
