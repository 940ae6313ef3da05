"""`drape.ops.outage.within_budget`: a service's outage waited out within its budget, said and counted."""

from __future__ import annotations

import logging

import pytest

from drape.ops import metrics
from drape.ops.outage import ServiceUnavailable, refused_or_dropped, within_budget


class Clock:
    """A clock the sleeps move forward: the budget's arithmetic without waiting."""

    def __init__(self):
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _counted(outcome: str) -> float:
    return metrics.SERVICE_OUTAGES.labels(service="probe", outcome=outcome)._value.get()


def _flaky(failures: int, error: Exception):
    calls = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= failures:
            raise error
        return "answer"

    return call, calls


def test_a_refused_call_is_called_again_until_it_answers_and_the_outage_is_said(caplog):
    clock, before = Clock(), _counted("recovered")
    call, calls = _flaky(3, ConnectionRefusedError("[Errno 111] Connection refused"))
    caplog.set_level(logging.WARNING, logger="drape.outage")
    answer = within_budget(
        call,
        service="probe",
        shown="http://probe:1",
        budget=10,
        field="probe.max_wait_seconds",
        clock=lambda: clock.now,
        sleep=clock.sleep,
    )
    assert answer == "answer" and len(calls) == 4
    assert "probe at http://probe:1 unreachable" in caplog.text and "answered again after" in caplog.text
    assert _counted("recovered") == before + 1


def test_an_outage_longer_than_the_budget_is_the_callers_error_naming_the_service_and_field():
    clock, before = Clock(), _counted("exhausted")
    call, calls = _flaky(10_000, ConnectionResetError("Connection reset by peer"))
    with pytest.raises(KeyError, match=r"probe at http://probe:1 unreachable for \d+ s, longer than probe.max_wait_seconds 5 s"):
        within_budget(
            call,
            service="probe",
            shown="http://probe:1",
            budget=5,
            field="probe.max_wait_seconds",
            error_type=KeyError,
            clock=lambda: clock.now,
            sleep=clock.sleep,
        )
    assert clock.now <= 5 and 3 < len(calls) < 20
    assert _counted("exhausted") == before + 1


def test_an_error_in_what_was_asked_is_raised_at_once():
    call, calls = _flaky(1, ValueError("no such run"))
    with pytest.raises(ValueError, match="no such run"):
        within_budget(call, service="probe", shown="x", budget=60, field="f", sleep=lambda _: pytest.fail("slept"))
    assert len(calls) == 1


@pytest.mark.parametrize(
    "text, transient",
    [
        ("HTTPConnectionPool: Max retries exceeded (Caused by NewConnectionError: [Errno 111] Connection refused)", True),
        ("('Connection aborted.', RemoteDisconnected('Remote end closed connection without response'))", True),
        ("server closed the connection unexpectedly", True),
        ("API request failed with error code 503 != 200: Service Unavailable", True),
        ("Read timed out. (read timeout=18)", False),  # the service's own bounds spent the wait already
        ("RESOURCE_DOES_NOT_EXIST: Run 'abc' not found", False),
    ],
)
def test_which_errors_mean_the_service_is_not_there_right_now(text, transient):
    assert refused_or_dropped(RuntimeError(text)) is transient


def test_the_error_shows_no_secret():
    def call():
        raise ConnectionRefusedError("Connection refused to http://drape:hunter2@db:5432")

    with pytest.raises(ServiceUnavailable) as raised:
        within_budget(call, service="probe", shown="db:5432", budget=0.1, field="f", sleep=lambda _: None)
    assert "hunter2" not in str(raised.value)


def test_a_dispatchers_loop_names_an_unreachable_queue_database_and_says_when_it_is_back(capsys):
    from sqlalchemy.exc import OperationalError

    from scheduler.queue.outage import DatabaseWatch, unreachable
    from scheduler.queue.schema import QueueError

    before = metrics.SERVICE_OUTAGES.labels(service="queue_database", outcome="recovered")._value.get()
    watch = DatabaseWatch("postgresql+psycopg://drape:hunter2@db:5432/queue")
    refused = OperationalError("SELECT 1", {}, Exception('connection to server at "db", port 5432 failed: Connection refused'))
    assert unreachable(refused) and not unreachable(OperationalError("SELECT", {}, Exception("syntax error at or near")))
    said = watch.failed(refused)
    assert isinstance(said, QueueError) and "the queue database postgresql+psycopg://drape:***@db:5432/queue unreachable" in str(
        said
    )
    other = ValueError("a bug")
    assert watch.failed(other) is other  # not an outage: the loop shows it as it is
    watch.answered("queue: dispatcher d1")
    assert "queue: dispatcher d1: the queue database" in capsys.readouterr().out
    assert metrics.SERVICE_OUTAGES.labels(service="queue_database", outcome="recovered")._value.get() == before + 1
    watch.answered("queue: dispatcher d1")  # said once per outage
    assert capsys.readouterr().out == ""
