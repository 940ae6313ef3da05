"""The queue's tables (SQLAlchemy Core, SQLite or PostgreSQL) and what a job submission carries.

jobs              one row per job: spec, state, placement, lease, exit
gpus              the fleet inventory the ledger allocates from
allocations       GiB each running job holds on each GPU (the ledger)
allocation_log    every claim and release, append-only (replayed by the tests)
measurements      measured peak memory and duration per job shape (memory profiles), and whether
                  the job shared a GPU while it ran (its duration then holds the slowdown)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    inspect,
    text,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DatabaseError, OperationalError

from drape import JOB_KINDS
from scheduler.policy import JobRequest, RunningJob
from scheduler.policy.state import CHECKPOINT_EVERY_S, whole_wait
from scheduler.queue.disk import name_full_disks
from scheduler.queue.versions import install_version_triggers

STATES = ("queued", "running", "succeeded", "failed", "cancelled")
KINDS = JOB_KINDS
MAX_JOB_SECONDS = 10 * 366 * 86400.0  # a job's expected or recorded run time (and `ran_seconds`): ten years
MAX_CHECKPOINT_EVERY_S = 7 * 24 * 3600.0  # a job checkpointing less often than weekly is not preemptible in practice

metadata = MetaData()
jobs_table = Table(
    "jobs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("kind", String(32), nullable=False),
    Column("stage", String(32)),
    Column("shape", String(256), nullable=False),
    Column("priority", Integer, nullable=False),
    Column("gpus", Integer, nullable=False),
    Column("mem_gib", Float, nullable=False),
    Column("duration_s", Float, nullable=False),
    Column("command", Text, nullable=False),
    Column("env", Text, nullable=False, default="{}"),
    Column("labels", Text, nullable=False, default="{}"),
    Column("state", String(16), nullable=False, index=True),
    Column("submit_s", Float, nullable=False),
    Column("start_s", Float),
    Column("finish_s", Float),
    Column("dispatcher", String(64)),
    Column("lease_expires_s", Float),
    Column("assigned", Text),
    Column("handle", String(256)),
    Column("attempts", Integer, nullable=False, default=0),
    Column("exit_code", Integer),
    Column("message", Text),
    # when its state last changed: a change sequence (SQLite) or transaction id (PostgreSQL), set by
    # a trigger (`scheduler/queue/versions.py`); a dispatcher reads only the rows changed since its last cycle
    Column("version", BigInteger),
    Index("jobs_version", "version"),
    Index("jobs_state_lease", "state", "lease_expires_s"),  # the expired leases (`stale`)
    Index("jobs_state_dispatcher", "state", "dispatcher"),  # a dispatcher's running jobs (`heartbeat`)
)
gpus_table = Table(
    "gpus",
    metadata,
    Column("uuid", String(128), primary_key=True),
    Column("node", String(128), nullable=False),
    Column("model", String(64), nullable=False),
    Column("total_gib", Float, nullable=False),
)
allocations_table = Table(
    "allocations",
    metadata,
    Column("job_id", String(64), primary_key=True),
    Column("gpu_uuid", String(128), primary_key=True),
    Column("mem_gib", Float, nullable=False),
    Index("allocations_gpu", "gpu_uuid"),  # a claim's GPUs (`claims.locked_ledger`)
)
allocation_log = Table(
    "allocation_log",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(64), nullable=False),
    Column("gpu_uuid", String(128), nullable=False),
    Column("mem_gib", Float, nullable=False),
    Column("event", String(8), nullable=False),  # claim | release
    Column("dispatcher", String(64)),
    Column("at_s", Float, nullable=False),
    Index("allocation_log_gpu_at", "gpu_uuid", "at_s"),  # who held a GPU since when (`claims.shared_since`)
)
dispatchers_table = Table(  # each dispatcher's last cycle: a waiting flow tells "no dispatcher" from "no GPU"
    "dispatchers",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("seen_s", Float, nullable=False),
)
measurements_table = Table(
    "measurements",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("shape", String(256), nullable=False, index=True),
    Column("peak_gib", Float, nullable=False),
    Column("duration_s", Float, nullable=False),
    Column("recorded_s", Float, nullable=False),
    Column("shared", Integer),  # 1: another job held one of its GPUs while it ran; NULL: recorded before this was
)


class QueueError(RuntimeError):
    """A queue operation that cannot be done; names the job and the reason."""


@dataclass
class JobSpec:
    """A job to submit; `mem_gib` is per GPU, `duration_s` the expected run time."""

    kind: str
    command: list[str]
    mem_gib: float
    duration_s: float
    gpus: int = 1
    priority: int = 3
    stage: str | None = None
    shape: str = ""
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    id: str | None = None
    gpu_models: list[str] = field(default_factory=list)  # the GPU models it may run on (a part of the name each); empty: any
    exclusive: bool = False  # runs alone on its GPU: never co-located, never preempted
    share: float = 1.0  # the part of a GPU's compute it declares it uses; under 1 it is co-located by declaration
    preemptible: bool = True  # it resumes from its checkpoints: a gang job waiting past the bound may stop it
    checkpoint_every_s: float = CHECKPOINT_EVERY_S  # how often it checkpoints (s): what a stop loses at most

    def __post_init__(self) -> None:
        if any(not isinstance(m, str) or not m.strip() or "|" in m for m in self.gpu_models):
            raise QueueError(f"job gpu_models must be non-empty names without '|', got {self.gpu_models}")
        if not isinstance(self.share, (int, float)) or not 0 < self.share <= 1:
            raise QueueError(f"job share must be a number in (0, 1] (the part of a GPU's compute it uses), got {self.share!r}")
        if self.exclusive and self.share < 1:
            raise QueueError(f"an exclusive job runs alone; it cannot declare a share of {self.share}")
        every = self.checkpoint_every_s
        if not isinstance(every, (int, float)) or not math.isfinite(every) or not 1 <= every <= MAX_CHECKPOINT_EVERY_S:
            raise QueueError(
                f"job checkpoint_every_s must be a number of seconds in [1, {MAX_CHECKPOINT_EVERY_S:g}], got {every!r}"
            )

    def stored_labels(self) -> dict[str, str]:
        """The labels as stored: the scheduling fields travel among them (`scheduling_of` reads them back)."""
        extra = {
            "gpu_models": "|".join(self.gpu_models) if self.gpu_models else None,
            "exclusive": "true" if self.exclusive else None,
            "share": f"{self.share:g}" if self.share < 1 else None,
            "preemptible": None if self.preemptible else "false",
            "checkpoint_every_s": f"{self.checkpoint_every_s:g}" if self.checkpoint_every_s != CHECKPOINT_EVERY_S else None,
        }
        return {**self.labels, **{key: value for key, value in extra.items() if value is not None}}


@dataclass(frozen=True)
class Scheduling:
    """What a job's stored labels say about where it may run (see `JobSpec`)."""

    models: tuple[str, ...] = ()
    exclusive: bool = False
    share: float = 1.0
    preempted: int = 0
    prefer_node: str = ""  # the node whose shard cache holds its data (where the previous stage trained)
    preemptible: bool = True
    checkpoint_every_s: float = CHECKPOINT_EVERY_S
    requeued_s: float | None = None  # when it was last preempted back to the queue
    waited_s: float = 0.0  # what it waited before its last requeue (`JobRequest.waited_s`)


SCHEDULING_KEYS = (
    "gpu_models",
    "exclusive",
    "share",
    "preempted",
    "prefer_node",
    "preemptible",
    "checkpoint_every_s",
    "requeued_s",
    "waited_s",
)
UNCONSTRAINED = Scheduling()  # shared: most jobs carry no scheduling fields


def scheduling_of(labels: str | None) -> Scheduling:
    """The scheduling fields in a job's stored labels (JSON); most jobs carry none, and then no JSON is parsed."""
    if not labels or not any(key in labels for key in SCHEDULING_KEYS):
        return UNCONSTRAINED
    found = json.loads(labels)
    try:
        share = min(max(float(found.get("share", 1.0)), 1e-3), 1.0)
        preempted = max(int(found.get("preempted", 0)), 0)
        every = float(found.get("checkpoint_every_s", CHECKPOINT_EVERY_S))
        every = min(max(every, 1.0), MAX_CHECKPOINT_EVERY_S) if math.isfinite(every) else CHECKPOINT_EVERY_S
    except (TypeError, ValueError):  # labels are input: a bad value schedules as if absent
        share, preempted, every = 1.0, 0, CHECKPOINT_EVERY_S
    requeued = _requeued_s(found.get("requeued_s"))
    waited = _requeued_s(found.get("waited_s")) or 0.0  # the same bounds: a finite, non-negative number of seconds
    return Scheduling(
        tuple(m for m in str(found.get("gpu_models", "")).split("|") if m),
        str(found.get("exclusive", "")).lower() == "true",
        share,
        preempted,
        str(found.get("prefer_node", ""))[:253],  # a node name (DNS-1123 subdomain at most)
        str(found.get("preemptible", "true")).lower() != "false",
        every,
        requeued,
        waited,
    )


def _requeued_s(value: object) -> float | None:
    """A stored requeue time (s since the epoch), or None when absent or not a finite, non-negative number."""
    try:
        when = float(str(value)) if value is not None else None
    except ValueError:
        return None
    return when if when is not None and math.isfinite(when) and when >= 0 else None


def ran_seconds(labels: dict) -> float:
    """The seconds a job ran before its current start, over the runs it was stopped in (`ran_s`, which
    preemption adds to: `JobStore.preempt`); 0 when absent or not a finite, non-negative number."""
    return min(_requeued_s(labels.get("ran_s")) or 0.0, MAX_JOB_SECONDS)


def sqlite_immediate(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None  # let SQLAlchemy's BEGIN below through
        dbapi_connection.execute("PRAGMA journal_mode=WAL")
        dbapi_connection.execute("PRAGMA busy_timeout=60000")

    @event.listens_for(engine, "begin")
    def _begin(connection):
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def open_engine(url: str) -> Engine:
    """An engine on the queue database at `url`, its tables created; errors name the URL without its password."""
    is_sqlite = url.startswith("sqlite")
    if is_sqlite:
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise QueueError(f"queue.url {url}: cannot create the folder for the database ({error})") from None
    shown = make_url(url).render_as_string(hide_password=True)
    try:
        # a bound on every connect: SQLite's lock wait, PostgreSQL's connect (libpq waits forever by default)
        bound = {"timeout": 60} if is_sqlite else postgres_bounds() if url.startswith("postgresql") else {}
        engine = create_engine(url, connect_args=bound, pool_pre_ping=True)
    except ModuleNotFoundError as error:
        raise QueueError(
            f"queue.url {shown}: its database driver {error.name!r} is not installed; for PostgreSQL: "
            "pip install 'psycopg[binary]' (or psycopg2-binary with a postgresql+psycopg2:// URL)"
        ) from None
    if is_sqlite:
        sqlite_immediate(engine)
    name_full_disks(engine, shown, QueueError)
    try:
        metadata.create_all(engine)
        _upgrade(engine)
    except OperationalError as error:
        raise QueueError(f"queue database {shown} unreachable or unusable: {error.orig}") from error  # outage.py reads it
    return engine


PG_STATEMENT_TIMEOUT_MS = 120_000  # the server cancels a statement (or a lock wait) that runs longer
PG_TCP_USER_TIMEOUT_MS = 30_000  # what the client sent unacknowledged this long: the connection is dead


def postgres_bounds() -> dict:
    """libpq's bounds on a PostgreSQL connection: the connect, each statement and lock wait (server
    side), and a peer gone mid-query (TCP keepalives and the user timeout: without them a query on a
    connection whose host vanished waits for the kernel's retransmissions, ~15 min). A server that
    stays up and answers nothing at all is the one case left: libpq has no read timeout."""
    statement = f"-c statement_timeout={PG_STATEMENT_TIMEOUT_MS} -c lock_timeout={PG_STATEMENT_TIMEOUT_MS}"
    keepalive = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}
    return {"connect_timeout": 10, "options": statement, "tcp_user_timeout": PG_TCP_USER_TIMEOUT_MS, **keepalive}


def _upgrade(engine: Engine) -> None:
    """What a database created by an earlier drape lacks (`create_all` adds tables, not columns or
    the indexes of tables that exist): `measurements.shared`, `jobs.version` and its triggers, the
    indexes the dispatch cycle's queries use.
    Idempotent, and safe when another process upgrades at the same moment."""
    schema = inspect(engine)
    if "shared" not in {column["name"] for column in schema.get_columns("measurements")}:
        try:
            with engine.begin() as connection:
                connection.execute(text("ALTER TABLE measurements ADD COLUMN shared INTEGER"))
        except DatabaseError:  # another process added it first
            if "shared" not in {column["name"] for column in inspect(engine).get_columns("measurements")}:
                raise
    if "version" not in {column["name"] for column in schema.get_columns("jobs")}:
        try:
            with engine.begin() as connection:
                connection.execute(text("ALTER TABLE jobs ADD COLUMN version BIGINT"))
        except DatabaseError:  # another process added it first
            if "version" not in {column["name"] for column in inspect(engine).get_columns("jobs")}:
                raise
    for table, name, columns in UPGRADE_INDEXES:
        if name not in {index["name"] for index in schema.get_indexes(table)}:
            with engine.begin() as connection:  # SQLite and PostgreSQL (9.5+) both know IF NOT EXISTS
                connection.execute(text(f"CREATE INDEX IF NOT EXISTS {name} ON {table} ({columns})"))
    install_version_triggers(engine)


UPGRADE_INDEXES = (  # (table, index, columns) an earlier drape's database may lack
    ("allocation_log", "allocation_log_gpu_at", "gpu_uuid, at_s"),
    ("jobs", "jobs_version", "version"),
    ("jobs", "jobs_state_lease", "state, lease_expires_s"),
    ("jobs", "jobs_state_dispatcher", "state, dispatcher"),
    ("allocations", "allocations_gpu", "gpu_uuid"),
)


REQUEST_COLUMNS = ("id", "priority", "submit_s", "gpus", "mem_gib", "duration_s", "labels")  # `job_request`'s row


def job_request(row) -> JobRequest:
    """A queued job's row (id, priority, submit_s, gpus, mem_gib, duration_s, labels) as the policy sees it.
    Read by position: a dispatch cycle converts every queued job, and a row's attribute access costs
    more than the rest of the conversion."""
    job_id, priority, submit_s, gpus, mem_gib, duration_s, labels = row
    how = scheduling_of(labels)
    return JobRequest(
        job_id,
        priority,
        submit_s,
        gpus,
        mem_gib,
        duration_s,
        how.models,
        how.exclusive,
        how.share,
        how.preempted,
        how.prefer_node,
        how.preemptible and not how.exclusive,
        how.checkpoint_every_s,
        how.requeued_s,
        how.waited_s,
    )


def running_job(row) -> RunningJob:
    """A running job's row (`JobStore.running`'s columns) as the policy sees it (what it may preempt)."""
    how, gpus = scheduling_of(row.labels), tuple(json.loads(row.assigned or "[]"))
    end = (row.start_s or 0) + row.duration_s
    return RunningJob(
        row.id,
        gpus,
        row.mem_gib,
        end,
        row.priority,
        len(gpus) == 1 and not how.exclusive,
        how.preempted,
        how.models,
        how.share,
        preemptible=how.preemptible and not how.exclusive,
        checkpoint_every_s=how.checkpoint_every_s,
        started_s=row.start_s or 0.0,
        waited_s=whole_wait(row.submit_s, how.requeued_s, how.waited_s, row.start_s or row.submit_s),
    )


def marks(connection, count: int) -> str:
    """`count` parameter marks in the driver's style, comma-separated (for an IN list in raw SQL)."""
    return ", ".join(["?" if connection.dialect.paramstyle == "qmark" else "%s"] * count)


def execute_many(connection, sql: str, rows: list[tuple]) -> None:
    """`sql` once per row (executemany), handed to the driver as it is: SQLAlchemy's per-row
    parameter processing costs more than the database's work at thousands of rows a claim. `sql`
    marks parameters with ``?`` (SQLite's style; psycopg's ``%s`` is substituted)."""
    if connection.dialect.paramstyle != "qmark":
        sql = sql.replace("?", "%s")
    connection.exec_driver_sql(sql, rows)
