"""Pre-staging vs demand-paged reads from S3, side by side in one run.

Setup: a moto S3 server behind a proxy that adds `--latency-ms` per request and caps the
bandwidth of all responses together at `--bandwidth-mbps` MB/s (a remote region). A dataset of
four stages × `--shards` tar shards of `--shard-mb` MiB is published to it. A consumer stands
in for the GPU: per shard it reads the local file and then computes for `--batches` batches of
`--compute-ms` each. Modes, each on a fresh shard cache:

- demand-paged: each shard fetched when the consumer reaches it (no pre-staging, no read-ahead);
- drape: the first stage pre-staged before training starts (in "total", not in "train wall"), stage k+1 pre-staged while stage k
  trains (awaited before it starts), and a read-ahead of `--read-ahead` shards inside a stage.

Each mode runs at every shard volume of `--volumes` (multipliers of `--shard-mb`), to show the
stage gap does not grow with the volume. Printed per run: data-wait (time the consumer blocked
on data) as a share of training wall time, the largest stage-to-stage gap (last batch of stage
k to first batch of stage k+1, minus the consumer's own work), throughput, and the ratios.

    .venv/bin/python benchmarks/prestage.py            # ~2 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import io
import os
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from drape import STAGES  # noqa: E402
from drape.data.cache import ShardCache  # noqa: E402
from drape.storage.checksum import sha256_file  # noqa: E402
from drape.storage.store import ObjectStore  # noqa: E402
from tests.integration.fault_proxy import FaultProxy  # noqa: E402

MIB = 2**20


def start_moto() -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
            return process, endpoint
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("moto_server did not start")


def make_dataset(scratch: Path, store: ObjectStore, prefix: str, shards: int, shard_bytes: int) -> dict:
    """Four stages of `shards` tar shards, each holding 8 members of random bytes; published."""
    splits = {}
    for stage in STAGES:
        entries = []
        for index in range(shards):
            path = scratch / stage / f"shard-{index:05d}.tar"
            path.parent.mkdir(parents=True, exist_ok=True)
            with tarfile.open(path, "w") as tar:
                for member in range(8):
                    payload = os.urandom(shard_bytes // 8)
                    info = tarfile.TarInfo(f"s{index:05d}{member:02d}.bin")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
            entry = {"path": f"{stage}/{path.name}", "samples": 8, "bytes": path.stat().st_size, "sha256": sha256_file(path)}
            store.put_file(path, f"{prefix}/{entry['path']}")
            path.unlink()
            entries.append(entry)
        splits[stage] = entries
    return {"name": "bench", "version": prefix.rsplit("/", 1)[-1], "splits": splits}


def consume(path: Path, batches: int, compute: float) -> None:
    with open(path, "rb") as handle:  # the trainer reads the local shard...
        while handle.read(8 * MIB):
            pass
    for _ in range(batches):  # ...and the GPU computes on its batches
        time.sleep(compute)


def run_mode(mode: str, cache: ShardCache, batches: int, compute: float, read_ahead: int) -> dict:
    cache.read_wait_seconds = 0.0
    waits, gaps, stage_times = 0.0, [], []
    started = time.perf_counter()
    pending = None
    if mode == "drape":
        cache.prestage(STAGES[0])  # before training starts (counted in the wall time)
    train_started = time.perf_counter()
    last_step_end = None
    for index, stage in enumerate(STAGES):
        if mode == "drape":
            if pending is not None:
                waited = time.perf_counter()
                pending.join()  # normally finished long ago
                waits += time.perf_counter() - waited
            if index + 1 < len(STAGES):
                keep = [stage]
                pending = threading.Thread(target=cache.prestage, args=(STAGES[index + 1],), kwargs={"keep": keep})
                pending.start()
        before = cache.read_wait_seconds
        first = True
        for path in cache.iter_local_shards(stage, read_ahead=read_ahead if mode == "drape" else 0):
            if first and last_step_end is not None:
                gaps.append(time.perf_counter() - last_step_end)
            first = False
            consume(path, batches, compute)
            last_step_end = time.perf_counter()
        waits += cache.read_wait_seconds - before
        stage_times.append(time.perf_counter() - train_started)
    wall = time.perf_counter() - train_started
    shards = sum(len(cache.shards(s)) for s in STAGES)
    return {
        "mode": mode,
        "wall": wall,
        "total": time.perf_counter() - started,
        "wait": waits,
        "wait_fraction": waits / wall,
        "max_gap": max(gaps) if gaps else 0.0,
        "batches_per_s": shards * batches / wall,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=6, help="shards per stage")
    parser.add_argument("--shard-mb", type=float, default=8.0)
    parser.add_argument("--volumes", default="1,3", help="shard-size multipliers to run")
    parser.add_argument("--batches", type=int, default=5, help="batches per shard")
    parser.add_argument("--compute-ms", type=float, default=80.0, help="consumer compute per batch")
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--bandwidth-mbps", type=float, default=100.0, help="MB/s, all connections together")
    parser.add_argument("--read-ahead", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    import boto3

    moto, endpoint = start_moto()
    proxy = FaultProxy(endpoint, latency_seconds=args.latency_ms / 1000, bandwidth_bytes_per_second=args.bandwidth_mbps * 1e6)
    rows = []
    try:
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        direct = ObjectStore("s3://bench/drape", endpoint_url=endpoint)
        slow = ObjectStore("s3://bench/drape", endpoint_url=proxy.url)
        for volume in [float(v) for v in args.volumes.split(",")]:
            shard_bytes = int(args.shard_mb * volume * MIB)
            with tempfile.TemporaryDirectory(prefix="drape-bench-") as scratch:
                prefix = f"datasets/bench/x{volume:g}"
                manifest = make_dataset(Path(scratch) / "src", direct, prefix, args.shards, shard_bytes)
                for mode in ("demand-paged", "drape"):
                    cache = ShardCache(
                        Path(scratch) / f"cache-{mode}",
                        slow,
                        prefix,
                        manifest,
                        budget_bytes=64 * 2**30,
                        concurrency=args.concurrency,
                        read_ahead=args.read_ahead,
                    )
                    result = run_mode(mode, cache, args.batches, args.compute_ms / 1000, args.read_ahead)
                    rows.append({**result, "volume_mb": 4 * args.shards * shard_bytes / MIB, "shard_mb": shard_bytes / MIB})
                    print(
                        f"  {mode:12s} {rows[-1]['volume_mb']:6.0f} MiB: wall {result['wall']:.1f} s, wait "
                        f"{100 * result['wait_fraction']:.2f}%",
                        file=sys.stderr,
                    )
    finally:
        proxy.close()
        moto.terminate()
    compute = 4 * args.shards * args.batches * args.compute_ms / 1000
    print(
        f"\nS3 via proxy: +{args.latency_ms:.0f} ms/request, {args.bandwidth_mbps:.0f} MB/s cap; consumer "
        f"{args.batches} batches × {args.compute_ms:.0f} ms per shard ({compute:.1f} s of compute per run)\n"
    )
    header = (
        f"| {'mode':12s} |   volume |   shard | total s | train wall s | data-wait s | data-wait % "
        "| max stage gap s | batches/s |"
    )
    print(header)
    print("|" + "|".join("-" * (len(cell)) for cell in header.split("|")[1:-1]) + "|")
    for row in rows:
        print(
            f"| {row['mode']:12s} | {row['volume_mb']:4.0f} MiB | {row['shard_mb']:3.0f} MiB | {row['total']:7.2f} "
            f"| {row['wall']:12.2f} | "
            f"{row['wait']:11.2f} | {100 * row['wait_fraction']:10.2f}% | {row['max_gap']:15.3f} | {row['batches_per_s']:9.1f} |"
        )
    print()
    for volume in sorted({row["volume_mb"] for row in rows}):
        demand = next(r for r in rows if r["volume_mb"] == volume and r["mode"] == "demand-paged")
        drape = next(r for r in rows if r["volume_mb"] == volume and r["mode"] == "drape")
        print(
            f"{volume:.0f} MiB: throughput drape / demand-paged = {drape['batches_per_s'] / demand['batches_per_s']:.2f}×; "
            f"data-wait {100 * demand['wait_fraction']:.1f}% → {100 * drape['wait_fraction']:.2f}% "
            f"(goal < 1%); stage gap {demand['max_gap']:.2f} s → {drape['max_gap']:.3f} s (goal < 5 s)"
        )
    drape_rows = [r for r in rows if r["mode"] == "drape"]
    print(f"median drape data-wait {100 * statistics.median(r['wait_fraction'] for r in drape_rows):.2f}% of wall time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
