"""The live planner's change reads on PostgreSQL, where transactions commit in any order."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy
import yaml

from scheduler.dispatch.dispatcher import Dispatcher
from scheduler.engines.local.launcher import NullLauncher
from scheduler.queue.store import JobSpec, JobStore
from tests.conftest import tiny_config

pytestmark = pytest.mark.slow


def _database(server: str) -> str:
    name = f"live_{uuid.uuid4().hex[:8]}"
    with sqlalchemy.create_engine(server, isolation_level="AUTOCOMMIT").connect() as connection:
        connection.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
    return server.rsplit("/", 1)[0] + f"/{name}"


def test_a_change_committed_after_the_cursor_passed_it_is_still_read(tmp_path, postgres_url):
    """A transaction cancels a queued job and commits only after a younger one (a submit) did and
    after the dispatcher's next cycle read its cursor: a cursor past the newest change seen (a
    sequence, or the largest transaction id) would lie past the cancel and miss it; the oldest
    transaction still running does not, so the cycle after reads it and the planner drops the job.
    ~2 s (and the session's PostgreSQL)."""
    url = _database(postgres_url)
    fleet = {"groups": [{"model": "H100-80GB", "memory_gib": 80, "nodes": 1, "gpus_per_node": 2, "node_prefix": "n"}]}
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(fleet))
    queue = {"fleet": "static", "inventory": str(tmp_path / "fleet.yaml"), "url": url}
    config = tiny_config(tmp_path / "drape", fresh_mlflow=True, queue=queue)
    store = JobStore(url)
    spec = {"kind": "gate-eval", "command": ["true"], "duration_s": 600.0, "gpus": 2, "mem_gib": 70.0}
    first, second = (store.submit(JobSpec(id=name, **spec), now=0.0) for name in ("first", "second"))
    dispatcher = Dispatcher(config, store, launcher=NullLauncher())
    assert dispatcher.cycle(now=10.0).started == [first]  # second waits: both GPUs are taken
    live = dispatcher.live
    assert live is not None and live.planner is not None
    late = sqlalchemy.create_engine(url).connect()
    transaction = late.begin()
    late.execute(sqlalchemy.text("UPDATE jobs SET state = 'cancelled' WHERE id = :id"), {"id": second})
    third = JobStore(url).submit(JobSpec(id="third", **spec), now=15.0)  # a younger transaction, committed first
    dispatcher.cycle(now=20.0)  # it reads the claim, the submit and its cursor while the cancel is uncommitted
    assert set(live.planner.pending) == {second, third} and set(live.planner.running) == {first}
    transaction.commit()
    late.close()
    dispatcher.cycle(now=30.0)
    assert set(live.planner.pending) == {third} and live.rebuilds == 1


def test_a_queue_statement_past_its_bound_is_cancelled_not_waited_on(postgres_url, monkeypatch):
    """Every queue connection to PostgreSQL carries libpq's bounds (scheduler/queue/schema.py): a statement
    running past `statement_timeout` is cancelled by the server, the engine says so, and the
    connection's keepalive and user timeout are what libpq was given. ~1 s."""
    import time

    from scheduler.queue import schema

    monkeypatch.setattr(schema, "PG_STATEMENT_TIMEOUT_MS", 300)
    engine = schema.open_engine(_database(postgres_url))
    with engine.connect() as connection:
        settings = {name: connection.exec_driver_sql(f"SHOW {name}").scalar() for name in ("statement_timeout", "lock_timeout")}
        assert settings == {"statement_timeout": "300ms", "lock_timeout": "300ms"}
        assert connection.connection.dbapi_connection.info.get_parameters()["tcp_user_timeout"] == "30000"
        started = time.monotonic()
        with pytest.raises(sqlalchemy.exc.OperationalError, match="statement timeout"):
            connection.exec_driver_sql("SELECT pg_sleep(30)")
        assert time.monotonic() - started < 10
    engine.dispose()
