"""Where a rank's batches are decoded: worker processes (`WorkerPool`), or a thread (`ThreadSource`).

Both take `make(step, allocate)` (a `StepBatches`: the step's draw, read and decode into the
arrays `allocate` gives) and the steps in order, keep at most `depth` steps decoding or decoded
ahead of the consumer, and hand them back in step order through `get(step, timeout)`. Neither
hangs: a worker that dies is an error at the next poll (every 0.2 s), and no batch within
`timeout` is an error naming the step.

The pool is a few lines of multiprocessing rather than a torch DataLoader because the trainer
must be able to stop it at any moment, also while a worker is stuck in a read (a DataLoader
iterator cannot be stopped from another thread while one of its workers is stuck), and must see a
dead worker within a poll from any thread (a DataLoader sees it at once only in the main thread,
through a SIGCHLD handler that raises wherever the main thread happens to be).

A batch is handed over as one file in a directory of the pool's own in shared memory
(``/dev/shm``, `data.loader.handoff_dir`): the worker writes each decoded row straight to its
place in a temporary file (`HandoffFile`, one `pwrite` per row: no stacked copy of the batch),
renames it, and the trainer maps it without a copy and unlinks it. Against pickling 13 MB of
pixels through a pipe that is four times cheaper for the trainer (measured: 7 vs 35 ms of its
CPU per 1024 px sample); unlike torch's fd passing it does not need the worker alive once the
file is published. The directory goes with the pool, with anything a dead
worker left.
"""

from __future__ import annotations

import gc
import mmap
import multiprocessing
import os
import queue
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

POLL_SECONDS = 0.2
Allocate = Callable[[dict[str, tuple[tuple[int, ...], Any]]], dict[str, np.ndarray]]
Make = Callable[[int, Allocate], dict[str, np.ndarray]]  # make(step, allocate): the step's batch


class DecodeError(RuntimeError):
    """No batch for a step: the worker's error, a dead worker or a timeout; the message names the step."""


def _shared_memory() -> str | None:
    """/dev/shm where there is one (RAM), else the temporary directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _describe_exit(process: BaseProcess) -> str:
    code = process.exitcode
    if code is not None and code < 0:
        return f"was killed by {signal.Signals(-code).name} (out of memory, or killed by hand?)"
    return f"exited with status {code}"


class _FileColumn:
    """One array of a batch file, written a row at a time (`column[row] = values`, one `pwrite`)."""

    def __init__(self, descriptor: int, offset: int, shape: tuple[int, ...], dtype: Any):
        self.descriptor, self.offset, self.shape, self.dtype = descriptor, offset, shape, np.dtype(dtype)
        self.row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * self.dtype.itemsize

    def __setitem__(self, row: int, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=self.dtype)
        if values.shape != self.shape[1:]:
            raise ValueError(f"a row of shape {values.shape} in a column of rows {self.shape[1:]}")
        data, at = values.data.cast("B"), self.offset + row * self.row_bytes
        while data:
            written = os.pwrite(self.descriptor, data, at)
            data, at = data[written:], at + written


class HandoffFile:
    """One step's batch, written row by row into the file that hands it over: `allocate` creates
    it, each decoded row goes straight to its place with one `pwrite` (no stacking copy), and
    `publish` renames it. Measured at 1024 px: a row written with `pwrite` costs half what writing
    it through a mapping of the file does (page faults), and a full /dev/shm is then a plain
    `OSError` (ENOSPC) rather than a SIGBUS."""

    def __init__(self, directory: Path, step: int):
        self.directory, self.step = directory, step
        self.temporary = directory / f"{step}.tmp"
        self.layout: list[tuple[str, tuple[int, ...], str, int]] = []
        self.columns: dict[str, _FileColumn] = {}
        self.descriptor: int | None = None
        self.size = 0

    def _full(self, error: OSError) -> OSError:
        return OSError(
            f"cannot hand over the batch of step {self.step} ({self.size / 2**20:.0f} MiB) in {self.directory}: "
            f"{error.strerror}; give the container a larger /dev/shm or set data.loader.handoff_dir"
        )

    def allocate(self, specs: dict[str, tuple[tuple[int, ...], Any]]) -> dict[str, Any]:
        """Columns {name: (shape, dtype)} laid out one after another in the file, written by row."""
        if self.descriptor is not None:
            raise RuntimeError(f"the batch file of step {self.step} is allocated once")
        self.descriptor = os.open(self.temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        for name, (shape, dtype) in specs.items():
            self.layout.append((name, tuple(shape), np.dtype(dtype).str, self.size))
            self.columns[name] = _FileColumn(self.descriptor, self.size, tuple(shape), dtype)
            self.size += int(np.prod(shape)) * np.dtype(dtype).itemsize
        return self.columns

    def publish(self, arrays: dict[str, Any]) -> tuple[str, list, dict[str, np.ndarray]]:
        """The batch `make` returned: its allocated columns are in the file already; the file is
        renamed to its final name. Returns (name, layout, the other arrays): those are small (the
        generator's state) and travel with the message."""
        if self.descriptor is None:
            self.allocate({})
        inline = {}
        try:
            for name, values in arrays.items():
                if name in self.columns and values is not self.columns[name]:
                    for row, value in enumerate(values):
                        self.columns[name][row] = value
                elif name not in self.columns:
                    inline[name] = np.ascontiguousarray(values)
        except OSError as error:
            raise self._full(error) from None
        finally:
            os.close(self.descriptor)  # type: ignore[arg-type]
            self.descriptor = None
        os.replace(self.temporary, self.directory / f"{self.step}.batch")
        return f"{self.step}.batch", self.layout, inline

    def discard(self) -> None:
        if self.descriptor is not None:
            os.close(self.descriptor)
            self.descriptor = None
        self.temporary.unlink(missing_ok=True)


def _views(mapped: np.ndarray | None, layout: list) -> dict[str, np.ndarray]:
    if mapped is None:
        return {name: np.zeros(shape, dtype) for name, shape, dtype, _ in layout}
    return {
        name: mapped[offset : offset + int(np.prod(shape)) * np.dtype(dtype).itemsize].view(dtype).reshape(shape)
        for name, shape, dtype, offset in layout
    }


def allocate_in_memory(specs: dict[str, tuple[tuple[int, ...], Any]]) -> dict[str, np.ndarray]:
    """`HandoffFile.allocate` for a batch that stays in this process (the decode thread)."""
    return {name: np.empty(shape, dtype) for name, (shape, dtype) in specs.items()}


def _read(directory: Path, name: str, layout: list) -> dict[str, np.ndarray]:
    """The arrays of a handed-over batch, mapped (copy-on-write, no copy made); the file is unlinked."""
    path = directory / name
    total = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for _, shape, dtype, _ in layout)
    mapped = None
    if total:
        descriptor = os.open(path, os.O_RDONLY)
        try:  # a private mapping: the trainer may write to its batch without touching the file
            mapped = np.frombuffer(mmap.mmap(descriptor, total, flags=mmap.MAP_PRIVATE), dtype=np.uint8)
        finally:
            os.close(descriptor)
    path.unlink()
    return _views(mapped, layout)


def _work(make: Make, directory: Path, tasks, results: Connection, parent: int) -> None:
    """A worker: decode the steps it is sent until told to stop (None) or its parent is gone."""
    torch.set_num_threads(1)  # one core per worker: `workers` is how many cores decoding takes
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; it stops us
    while True:
        try:
            step = tasks.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:
                return
            continue
        if step is None:
            return
        batch = HandoffFile(directory, step)
        try:
            results.send((step, batch.publish(make(step, batch.allocate)), None))
        except Exception as error:  # noqa: BLE001 - sent to the trainer, which raises it
            batch.discard()
            results.send((step, None, str(error)))


class WorkerPool:
    """`workers` processes decoding `make(step)` for `steps`, at most `depth` steps ahead."""

    def __init__(
        self, make: Make, steps: range, *, workers: int, depth: int, start_method: str = "fork", handoff_dir: str | None = None
    ):
        context: Any = multiprocessing.get_context(start_method)
        self.steps, self.depth = steps, max(depth, 1)
        self.directory = Path(tempfile.mkdtemp(prefix=f"drape-batches-{os.getpid()}-", dir=handoff_dir or _shared_memory()))
        self.tasks = context.Queue()
        self.ready: dict[int, Any] = {}
        self.sent = steps.start
        # one result pipe per worker: a worker killed mid-send breaks only its own pipe (EOF, not a hang)
        self.results: dict[Connection, BaseProcess] = {}
        gc.freeze()  # the children's collections leave the parent's objects (and their pages) alone
        for i in range(workers):
            receiver, sender = context.Pipe(duplex=False)
            process = context.Process(
                target=_work, args=(make, self.directory, self.tasks, sender, os.getpid()), daemon=True, name=f"decode-{i}"
            )
            process.start()
            sender.close()  # the worker holds the only write end: its death is EOF here
            self.results[receiver] = process
        gc.unfreeze()
        self.processes = list(self.results.values())
        self._send_ahead(steps.start)

    def _send_ahead(self, consumer: int) -> None:
        while self.sent < self.steps.stop and self.sent < consumer + self.depth:
            self.tasks.put(self.sent)
            self.sent += 1

    def get(self, step: int, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        self._send_ahead(step)
        while step not in self.ready:
            readable = cast(list[Connection], wait(list(self.results), timeout=POLL_SECONDS))
            if not readable:
                self._check_workers(step)
                if time.monotonic() > deadline:
                    raise DecodeError(f"step {step}: no batch after {timeout:g} s")
            for receiver in readable:
                try:
                    done, item, error = receiver.recv()
                except (EOFError, OSError):  # the worker is gone
                    worker = self.results[receiver]
                    worker.join(timeout=1)
                    self._check_workers(step)
                    raise DecodeError(f"step {step}: decoding worker {worker.name} closed its pipe") from None
                if error is not None:
                    raise DecodeError(error)
                name, layout, inline = item
                self.ready[done] = _read(self.directory, name, layout) | inline
        self._send_ahead(step + 1)
        return self.ready.pop(step)

    def _check_workers(self, step: int) -> None:
        dead = [p for p in self.processes if not p.is_alive()]
        if dead:
            raise DecodeError(f"step {step}: decoding worker {dead[0].name} (pid {dead[0].pid}) {_describe_exit(dead[0])}")

    def close(self) -> None:
        """Stop the workers: asked first, terminated after 2 s (one stuck in a read), killed after 5."""
        for _ in self.processes:
            self.tasks.put(None)
        deadline = time.monotonic() + 2
        for process in self.processes:
            process.join(timeout=max(deadline - time.monotonic(), 0))
        for process in self.processes:
            if process.is_alive():
                process.terminate()
                process.join(timeout=3)
            if process.is_alive():
                process.kill()
                process.join(timeout=2)
        self.tasks.cancel_join_thread()  # what is still queued is dropped, not waited for
        self.tasks.close()
        for receiver in self.results:
            receiver.close()
        self.ready.clear()
        shutil.rmtree(self.directory, ignore_errors=True)


class _Failed:
    def __init__(self, error: BaseException):
        self.error = error


class ThreadSource:
    """`make(step)` for `steps` in a thread of this process, at most `depth` steps ahead (workers = 0).

    A read stuck forever keeps its thread (a thread cannot be stopped), but the trainer still
    gets its error after the timeout."""

    def __init__(self, make: Make, steps: range, *, depth: int):
        self.queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._fill, args=(make, steps), name="decode-thread", daemon=True)
        self.thread.start()

    def _fill(self, make: Make, steps: range) -> None:
        for step in steps:
            try:
                item: Any = (step, make(step, allocate_in_memory))
            except BaseException as error:  # noqa: BLE001 - raised by get(), not lost in the thread
                item = _Failed(error)
            while not self._stop.is_set():
                try:
                    self.queue.put(item, timeout=POLL_SECONDS)
                    break
                except queue.Full:
                    continue
            if self._stop.is_set() or isinstance(item, _Failed):
                return

    def get(self, step: int, timeout: float) -> Any:
        try:
            item = self.queue.get(timeout=timeout)
        except queue.Empty:
            raise DecodeError(f"step {step}: no batch after {timeout:g} s") from None
        if isinstance(item, _Failed):
            raise DecodeError(str(item.error)) from item.error
        done, value = item
        assert done == step, f"the decode thread gave step {done} for step {step}"
        return value

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=2)
