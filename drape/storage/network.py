"""An object store's network failures as one error that names the endpoint (redacted) and the bound.

botocore bounds every request with a connect and a read timeout (storage.connect_timeout_seconds,
storage.read_timeout_seconds) and retries it; what surfaces when the bound is hit depends on where
the wait was: before the headers it is botocore's ReadTimeoutError, but a body that stalls
mid-stream surfaces through aiobotocore and fsspec as an FSTimeoutError with no message, and on a
ranged read s3fs trips over that error and raises an IndexError whose context holds it. A store
that goes down between a response's headers and its body surfaces as aiohttp's ClientPayloadError
("Response payload is not completed"), which no botocore retry sees on a body s3fs reads. Each is
recognised by its chain of causes and turned into a StorageError, for the calls of an ObjectStore
and for the reads of a file object it opened alike; a refused or dropped connection is tried again
within the store's budget.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")

_NETWORK_ERRORS = {"ConnectTimeoutError", "ReadTimeoutError", "EndpointConnectionError", "ConnectionClosedError"}
# a body that ended short, or a connection the store closed before answering
_DROPPED_MID_RESPONSE = {"ClientPayloadError", "ServerDisconnectedError"}
# refused or dropped: not a silent endpoint
_RESTARTING = {"EndpointConnectionError", "ConnectionClosedError"} | _DROPPED_MID_RESPONSE


class StorageError(RuntimeError):
    """An object-store operation that failed; names the object and what was expected."""


def redact_url(url: str) -> str:
    """The URL without credentials or query string, safe to log."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}" if parts.scheme else url


def network_failure(error: BaseException) -> str | None:
    """The name of the timeout or dropped connection behind `error` (itself, its cause or its
    context), or None when it is not one."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name, module = type(current).__name__, type(current).__module__
        if module.startswith(("botocore", "aiobotocore")) and (name in _NETWORK_ERRORS or name == "AioReadTimeoutError"):
            return name
        if isinstance(current, TimeoutError):  # fsspec's FSTimeoutError, asyncio's and aiohttp's timeouts
            return name
        if module.startswith("aiohttp") and name in _DROPPED_MID_RESPONSE:
            return name
        current = current.__cause__ or current.__context__
    return None


# botocore's standard retry mode waits rand(0, 1) × min(2 ** attempt, 20) s before each retry of a
# throttled request, and up to 5 s more when the store sends x-amz-retry-after (timeouts wait less)
BACKOFF_CAP_SECONDS, RETRY_AFTER_EXTRA_SECONDS = 20.0, 5.0


def worst_wait(attempts: int, connect_timeout: float, read_timeout: float) -> float:
    """The longest one request can take, all `attempts` timing out and backing off in full."""
    backoff = sum(min(2.0**attempt, BACKOFF_CAP_SECONDS) + RETRY_AFTER_EXTRA_SECONDS for attempt in range(attempts - 1))
    return attempts * (connect_timeout + read_timeout) + backoff


def attempts_within(max_wait: float, attempts: int, connect_timeout: float, read_timeout: float) -> int:
    """The most attempts (at most `attempts`, at least 1) whose `worst_wait` fits `max_wait`:
    storage.max_wait_seconds bounds connect, read and retries together."""
    while attempts > 1 and worst_wait(attempts, connect_timeout, read_timeout) > max_wait:
        attempts -= 1
    return attempts


def endpoint_error(store: Any, failure: str) -> StorageError:
    """The StorageError for `store` (an ObjectStore) when its endpoint did not answer in time."""
    where = redact_url(store.endpoint) if store.endpoint else "of the AWS region" if store.is_s3 else redact_url(store.url)
    what = "refused or dropped the connection" if failure in _RESTARTING else "did not answer in time, or stalled mid-response"
    error = StorageError(
        f"{store!r}: the endpoint {where} {what} ({failure}), within storage.max_wait_seconds {store.max_wait:g} "
        f"(connect_timeout_seconds {store.connect_timeout:g} / read_timeout_seconds {store.read_timeout:g}, "
        f"{store.retry_attempts} attempt(s)); is storage.endpoint_url right and the endpoint up?"
    )
    error.failure = failure  # type: ignore[attr-defined]
    return error


@contextmanager
def bounded_on(store: Any) -> Iterator[None]:
    """Inside it, a network failure (`network_failure`: after its bounded retries) is a StorageError
    naming `store`'s endpoint and the settings that bound the wait (`endpoint_error`)."""
    try:
        yield
    except Exception as error:
        if failure := network_failure(error):
            raise endpoint_error(store, failure) from None
        raise


def bounded(method: Callable[..., T]) -> Callable[..., T]:
    """`method` of an ObjectStore run `bounded_on` the store, within one deadline: the store's
    `max_wait` from the outermost bounded call (nested calls share it). An endpoint that refuses or
    drops connections (an object store restarting) is tried again, backing off, until the deadline;
    one that accepts and stays silent is not (botocore's attempts already spent the budget)."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        return within_deadline(self, functools.partial(method, self, *args, **kwargs))

    return call


_DEADLINE = threading.local()
logger = logging.getLogger("drape.storage")


def within_deadline(store: Any, attempt: Callable[[], T]) -> T:
    """`attempt()` tried until it succeeds or `_until_deadline` gives up, within the store's
    `max_wait` from the outermost such call on this thread (nested calls share it)."""
    outer = getattr(_DEADLINE, "at", None) is None
    if outer:
        _DEADLINE.at = time.monotonic() + store.max_wait
    try:
        return _until_deadline(store, attempt)
    finally:
        if outer:
            _DEADLINE.at = None


def _until_deadline(store: Any, attempt: Callable[[], T]) -> T:
    pause = 0.5
    while True:
        try:
            with bounded_on(store):
                return attempt()
        except StorageError as error:
            left = _DEADLINE.at - time.monotonic()
            if getattr(error, "failure", None) not in _RESTARTING or left < pause + store.connect_timeout:
                raise
            logger.warning(
                "%r: the endpoint refused or dropped the connection; trying again for up to %.0f s more "
                "(storage.max_wait_seconds)",
                store,
                left,
            )
            time.sleep(pause)
            pause = min(pause * 2, 8.0)


class BoundedReader:
    """A file object opened on a store whose reads and seeks fail as `bounded` methods do: a body
    that stalls mid-stream is a StorageError naming the endpoint, never a bare timeout or IndexError;
    one the store dropped is read again within the store's budget (fsspec moves the file's position
    only once a ranged read has returned, so a read tried again starts where the failed one did)."""

    def __init__(self, handle: Any, store: Any):
        self._handle, self._store = handle, store

    def _call(self, name: str, *args):
        return within_deadline(self._store, functools.partial(getattr(self._handle, name), *args))

    def read(self, size: int = -1) -> bytes:
        return self._call("read", size)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._call("seek", offset, whence)

    def tell(self) -> int:
        return self._handle.tell()

    def close(self) -> None:
        self._handle.close()

    def __getattr__(self, name: str):
        return getattr(self._handle, name)

    def __enter__(self) -> BoundedReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
