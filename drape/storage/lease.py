"""Run leases: one live process drives a run at a time, however many were started (issue 68).

Two flows of one run (two `drape run --resume RUN`, two Prefect flow runs with the same `resume`,
on one host or on two nodes that share only the object store) would train, gate and archive the
same stages twice. So a run is driven under a lease: one object in the store
(``runs/<run>/lease.json``) naming its holder (host, boot, pid namespace, pid and the pid's start
time, flow run, a random token) and when it expires. The holder renews it from a heartbeat
thread every third of its lifetime; the second start is refused (`RunHeld`, the CLI's exit 2)
with the holder and the expiry in the message.

A lease is taken when it is free, expired, or its holder is provably dead: the same host and
boot and pid namespace, and its pid gone or started at another time. So a run killed on this host
resumes at once; one whose node was lost resumes once its lease expires (`storage.run_lease_seconds`,
60 s by default); a clean end (finished, failed gate, abort, a failed flow) releases it.

Every write is conditional: on S3 ``If-None-Match: *`` to create and ``If-Match: <ETag>`` to renew,
take over or delete (S3 and moto both refuse with 412 when the object changed); on a file:// store
the same compare-and-set under an flock beside the object. Each take is then read back, and the
run is only ours when the token read back is ours.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from drape.layout import run_key
from drape.storage.network import StorageError
from drape.storage.store import ObjectStore

Clock = Callable[[], float]


class RunHeld(RuntimeError):
    """Another live process holds the run's lease; names the run, the holder and the expiry."""


class LeaseLost(RuntimeError):
    """This process's lease on a run was taken over (it expired unrenewed): it must stop driving the run."""


def lease_key(run_id: str) -> str:
    return run_key(run_id, relative="lease.json")


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def _process_start(pid: int) -> str:
    """The pid's start time in clock ticks since boot ('' when gone): tells a reused pid from the holder."""
    stat = _read_text(f"/proc/{pid}/stat")
    return stat.rsplit(")", 1)[-1].split()[19] if stat else ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


@dataclass(frozen=True)
class Holder:
    host: str
    boot: str
    pid_namespace: str
    pid: int
    pid_started: str
    flow_run: str
    token: str

    @classmethod
    def here(cls, flow_run_id: str | None) -> Holder:
        pid = os.getpid()
        boot = _read_text("/proc/sys/kernel/random/boot_id")
        return cls(socket.gethostname(), boot, _pid_namespace(), pid, _process_start(pid), flow_run_id or "", uuid.uuid4().hex)

    def describe(self) -> str:
        flow = f", flow run {self.flow_run}" if self.flow_run else ""
        return f"pid {self.pid} on {self.host}{flow}"

    def is_this_process(self, other: Holder) -> bool:
        return (self.host, self.boot, self.pid_namespace, self.pid) == (other.host, other.boot, other.pid_namespace, other.pid)

    def provably_dead(self, here: Holder) -> bool:
        """True only when this process can see the holder's process table: same host, boot and pid
        namespace, and the holder's pid is gone or belongs to a process started later."""
        if not (self.boot and self.pid_namespace) or (self.host, self.boot, self.pid_namespace) != (
            here.host,
            here.boot,
            here.pid_namespace,
        ):
            return False
        return _process_start(self.pid) != self.pid_started


def _holder(record: dict) -> Holder:
    try:
        fields = record["holder"]
        return Holder(**{name: type_(fields[name]) for name, type_ in _HOLDER_TYPES.items()})
    except (KeyError, TypeError, ValueError):
        return Holder("?", "", "", -1, "", "", "")  # a damaged record: never provably dead, taken when expired


_HOLDER_TYPES = {
    "host": str,
    "boot": str,
    "pid_namespace": str,
    "pid": int,
    "pid_started": str,
    "flow_run": str,
    "token": str,
}


def _expiry(record: dict) -> float:
    value = record.get("expires_at")
    return float(value) if isinstance(value, int | float) and value == value else 0.0  # NaN or missing: expired


def _when(seconds: float, now: float | None = None) -> str:
    """A time for people: UTC, and how far from `now`."""
    stamp = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return stamp if now is None else f"{stamp} (in {max(seconds - now, 0):.0f} s)"


class _Backend:
    """Compare-and-set on one object: `read` gives (record, tag); `write` and `delete` succeed only
    when the object's tag still is `expected` (None: the object must not exist)."""

    def __init__(self, store: ObjectStore, key: str):
        self.store, self.key = store, key
        self.path = store.path(key)

    def read(self) -> tuple[dict, str] | None:
        if self.store.is_s3:
            return self._read_s3()
        path = Path(self.path)
        try:
            payload = path.read_bytes()
        except FileNotFoundError:
            return None
        return _parse(payload), hashlib.sha256(payload).hexdigest()

    def _read_s3(self) -> tuple[dict, str] | None:
        bucket, inner, _ = self.store.fs.split_path(self.path)
        try:
            answer = self.store.fs.call_s3("get_object", Bucket=bucket, Key=inner)
        except FileNotFoundError:
            return None
        return _parse(_body(self.store, answer)), answer["ETag"]

    def write(self, payload: bytes, expected: str | None) -> bool:
        if self.store.is_s3:
            condition = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected}
            return self._s3_conditional("put_object", Body=payload, **condition)
        with self._locked(create=expected is None):
            if self._tag() != expected:
                return False
            temporary = f"{self.path}.tmp-{uuid.uuid4().hex[:8]}"
            Path(temporary).write_bytes(payload)
            os.replace(temporary, self.path)
            return True

    def delete(self, expected: str) -> bool:
        if self.store.is_s3:
            return self._s3_conditional("delete_object", IfMatch=expected)
        with self._locked():
            if self._tag() != expected:
                return False
            Path(self.path).unlink()
            return True

    def _tag(self) -> str | None:
        found = self.read()
        return None if found is None else found[1]

    def _s3_conditional(self, operation: str, **arguments) -> bool:
        bucket, inner, _ = self.store.fs.split_path(self.path)
        try:
            self.store.fs.call_s3(operation, Bucket=bucket, Key=inner, **arguments)
        except (OSError, ValueError) as error:  # s3fs turns 412/409 into OSError/ValueError; others re-raise
            if _precondition_failed(error):
                return False
            raise
        finally:
            self.store.fs.invalidate_cache(self.path)
        return True

    @contextlib.contextmanager
    def _locked(self, create: bool = False) -> Iterator[None]:
        """An flock beside the object (named so store listings skip it); a renewal never recreates
        a run folder someone removed."""
        if not self.store.is_local:
            raise StorageError(f"{self.store!r}: run leases need an s3:// or file:// object store")
        if create:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        with open(f"{self.path}.tmp-lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def _body(store: ObjectStore, answer: dict) -> bytes:
    from fsspec.asyn import sync

    async def read() -> bytes:
        async with answer["Body"] as body:
            return await body.read()

    return sync(store.fs.loop, read)


def _precondition_failed(error: BaseException) -> bool:
    chain: BaseException | None = error
    while chain is not None:
        text = f"{type(chain).__name__} {chain}"
        if "PreconditionFailed" in text or "412" in text or "ConditionalRequestConflict" in text:
            return True
        chain = chain.__cause__ or chain.__context__
    return False


def _parse(payload: bytes) -> dict:
    try:
        record = json.loads(payload[: 64 << 10]) if len(payload) <= 64 << 10 else None
    except (ValueError, UnicodeDecodeError):
        record = None
    return record if isinstance(record, dict) else {}  # damaged: no holder, expired


class RunLease:
    """A lease this process holds on a run, renewed by a daemon thread until `release`."""

    def __init__(self, store: ObjectStore, run_id: str, holder: Holder, seconds: float, clock: Clock = time.time):
        self.run_id, self.holder, self.seconds, self.clock = run_id, holder, seconds, clock
        self.backend = _Backend(store, lease_key(run_id))
        self.tag: str | None = None
        self.expires_at = 0.0
        self.lost: str | None = None
        self._said_expired = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def record(self, now: float) -> bytes:
        return json.dumps(
            {"run_id": self.run_id, "holder": asdict(self.holder), "renewed_at": now, "expires_at": now + self.seconds},
            sort_keys=True,
        ).encode()

    def put(self, expected: str | None) -> bool:
        """Write the record if the object still is `expected`; then read it back: ours only if the token is."""
        now = self.clock()
        if not self.backend.write(self.record(now), expected):
            return False
        found = self.backend.read()
        if found is None or _holder(found[0]).token != self.holder.token:
            return False
        self.tag, self.expires_at = found[1], _expiry(found[0])
        return True

    def renew(self) -> bool:
        """One heartbeat; False (and `lost` says why) once another process took the lease."""
        if self.lost:
            return False
        try:
            if self.put(self.tag):
                return True
        except FileNotFoundError:
            pass  # the run's folder is gone: lost, below
        except Exception as error:  # noqa: BLE001 - the store down a moment, whatever its client raises: next beat
            if self.clock() > self.expires_at and not self._said_expired:
                self._said_expired = True
                print(f"drape: run {self.run_id}: its lease expired unrenewed ({error})", file=sys.stderr)
            return True
        found = self.backend.read()
        other = _holder(found[0]).describe() if found else "nobody (deleted)"
        self.lost = f"run {self.run_id}: its lease was taken over by {other}; this process stops driving it"
        print(f"drape: {self.lost}", file=sys.stderr)
        return False

    def check(self) -> None:
        """Raise LeaseLost once the lease went to another process."""
        if self.lost:
            raise LeaseLost(self.lost)

    def start_heartbeat(self) -> None:
        def beat() -> None:
            while not self._stop.wait(self.seconds / 3) and self.renew():
                pass

        self._thread = threading.Thread(target=beat, name=f"lease-{self.run_id}", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop renewing and delete the lease if it still is ours (a takeover's lease stays)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.seconds)
        if self.tag is not None and not self.lost:
            with contextlib.suppress(StorageError, OSError):
                self.backend.delete(self.tag)


def acquire(
    store: ObjectStore, run_id: str, *, seconds: float, flow_run_id: str | None = None, clock: Clock = time.time
) -> RunLease:
    """Take `run_id`'s lease (free, expired, or its holder provably dead, or this same flow run in
    this process: a Prefect retry) and start its heartbeat; raises RunHeld naming the holder."""
    lease = RunLease(store, run_id, Holder.here(flow_run_id), seconds, clock)
    for _ in range(3):  # another process may write between our read and our conditional write
        found = lease.backend.read()
        if found is None:
            if lease.put(None):
                break
            continue
        record, tag = found
        why = _takeover(record, lease.holder, clock())
        if why is None:
            raise _held(run_id, record, clock())
        if lease.put(tag):
            print(f"drape: run {run_id}: took its lease over from {_holder(record).describe()} ({why})")
            break
    else:
        found = lease.backend.read()
        raise _held(run_id, found[0] if found else {}, clock())
    lease.start_heartbeat()
    return lease


def refusal(store: ObjectStore, run_id: str, clock: Clock = time.time) -> RunHeld | None:
    """The RunHeld a start of `run_id` would meet now (another live process drives it), else None: a
    front end's check before it starts anything; `acquire` still decides."""
    found = _Backend(store, lease_key(run_id)).read()
    if found is None or _takeover(found[0], Holder.here(None), clock()) is not None:
        return None
    return _held(run_id, found[0], clock())


def _takeover(record: dict, here: Holder, now: float) -> str | None:
    """Why the lease in `record` may be taken by `here`, or None when its holder may still be alive."""
    holder, expires_at = _holder(record), _expiry(record)
    if expires_at <= now:
        return f"it expired at {_when(expires_at)}" if expires_at else "its record is damaged"
    if holder.is_this_process(here) and holder.flow_run and holder.flow_run == here.flow_run:
        return "a retry of the same flow run in the same process"
    if not holder.is_this_process(here) and holder.provably_dead(here):
        return f"its process {holder.pid} on this host is gone"
    return None


def _held(run_id: str, record: dict, now: float) -> RunHeld:
    holder, expires_at = _holder(record), _expiry(record)
    return RunHeld(
        f"run {run_id} is already being driven by {holder.describe()}; its lease runs until {_when(expires_at, now)} "
        "and is renewed while that process lives. Wait for it to end, or resume the run once that process is gone "
        "(at once on the same host; from another host after the lease expires)"
    )
