"""Isolated runs that take turns with the reference (`inference.interleave`).

A shared machine's speed drifts over seconds by more than the differences worth measuring, so two
runs one after another disagree: on a 2-core VM here the reference measured twice, one run after
the other, put its denoise median 17-31% apart (four benchmarks); in turns, 0.5-2.8%. Every
variant still runs in its own process (its own compile cache, allocator and hooks), but the
reference's process stays up and the two take turns: a request of one, then of the other, the
order swapped each round, never both at once (the idle one blocks on its pipe). Drift then falls
on both alike, and a variant's speed-up is taken against the reference's requests in its turns.

The protocol is `drape.inference.worker --serve`: one JSON line per command and per reply; every
wait for a reply is bounded by `inference.timeout_seconds`.
"""

from __future__ import annotations

import json
import math
import os
import select
import subprocess
import sys
import time
from pathlib import Path

from drape.jsonfile import read_json_object

TURN = 1  # requests per turn: one, so drift within a round falls on both alike


class WorkerError(RuntimeError):
    """A worker that died, said something unreadable or did not answer in time; names the variant."""


class Worker:
    """One variant's process, answering commands in turn."""

    def __init__(self, job: dict, directory: Path, timeout_s: float):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "result.json").unlink(missing_ok=True)
        self.name, self.directory, self.timeout_s = job["variant"]["name"], directory, timeout_s
        job_file = directory / "job.json"
        job_file.write_text(json.dumps(job))
        self.log = open(directory / "worker.log", "wb")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "drape.inference.worker", str(job_file), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            text=True,
        )

    def _tail(self) -> str:
        self.log.flush()
        lines = (self.directory / "worker.log").read_text(errors="replace").strip().splitlines()[-3:]
        return " | ".join(lines)[:400]

    def receive(self) -> dict:
        assert self.process.stdout is not None
        deadline = time.monotonic() + self.timeout_s
        while True:
            ready, _, _ = select.select([self.process.stdout], [], [], max(deadline - time.monotonic(), 0))
            if not ready:
                raise WorkerError(f"{self.name}: no answer within inference.timeout_seconds ({self.timeout_s:.0f} s)")
            line = self.process.stdout.readline()
            if not line:
                code = self.process.wait(timeout=30)
                raise WorkerError(f"{self.name}: worker exited {code}: {self._tail()}")
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                raise WorkerError(f"{self.name}: unreadable reply {line[:120]!r}") from None

    def ask(self, command: dict) -> dict:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            raise WorkerError(f"{self.name}: worker is gone: {self._tail()}") from None
        return self.receive()

    def finish(self) -> dict:
        """Ask for the rest (outputs, attention, concurrency, memory) and return result.json."""
        self.ask({"finish": True})
        self.process.wait(timeout=self.timeout_s)
        return read_json_object(self.directory / "result.json", "worker result")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        self.log.close()


def take_turns(reference: Worker, other: Worker, runs: int) -> tuple[dict, dict[str, list[float]]]:
    """`runs` timed requests of `other` in turns with as many of the reference; returns (other's
    result, the reference's timings in those turns)."""
    hello = other.receive()
    if not hello.get("ready"):
        return hello, {}
    paired: dict[str, list[float]] = {"denoise_s": [], "total_s": []}
    for round_ in range(math.ceil(runs / TURN)):
        for worker in (reference, other) if round_ % 2 == 0 else (other, reference):
            part = worker.ask({"run": TURN})
            if worker is reference:
                for key in paired:
                    paired[key] += part[key]
    return other.finish(), paired
