"""`drape shopper forget`: erase every copy of a shopper's data, prove it, and keep an audit record.

A forget is a journal (``live/privacy/pending/<subject>.json``, named by a hash of the id) that
first copies from the ledger what to look for: the shopper id, the digests of their photos, the
MLflow runs and queue jobs that handled them and the try-on folders written elsewhere. Then each
place (`drape.shoppers.places`: the object store's every version and delete marker, live storage
and the shard cache, MLflow; the queue's records, from the CLI) erases what it holds, and the
journal records it. Then every place is scanned for the id and the digests; only a clean scan
writes the audit record (``privacy/audit/<request>.json``, in live storage and the object store:
what was erased where, when, verified) and removes the journal. The audit record names neither
the shopper nor their photos: it is keyed by a request id, which the caller keeps.

Every step is idempotent: a forget killed anywhere is finished by running it again, which
finds the journal and goes on; a scan that still finds something leaves the journal for the next run.
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from drape.jsonfile import parse_json_object, read_json_object
from drape.layout import LiveLayout, audit_key, safe_shopper_id, shopper_prefix
from drape.shoppers import ShopperError, subject_of
from drape.shoppers.ledger import Ledger, read_ledger
from drape.shoppers.photos import PhotoDigests
from drape.storage.durable import publish_json
from drape.storage.store import ObjectStore, StorageError


@dataclass
class Subject:
    """What a forget erases and scans for; lives only in the journal, deleted when the forget is done."""

    shopper: str
    request: str
    requested_at: str
    digests: dict = field(default_factory=dict)  # PhotoDigests.to_dict()
    outputs: list[str] = field(default_factory=list)
    mlflow_runs: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    erased: dict[str, dict[str, int]] = field(default_factory=dict)  # this pass: place → counts, as each finished
    totals: dict[str, dict[str, int]] = field(default_factory=dict)  # every pass: place → counts
    attempts: int = 0

    @property
    def photo_digests(self) -> PhotoDigests:
        return PhotoDigests.from_dict(self.digests)


class Place(Protocol):
    name: str

    def erase(self, subject: Subject) -> dict[str, int]:
        """Delete what this place holds of the subject; returns counts of what was deleted."""

    def scan(self, subject: Subject) -> list[str]:
        """What this place still holds of the subject (the id, or a photo's digest): empty when clean."""


class ForgetIncomplete(ShopperError):
    """A scan still found the shopper's data; the journal stays and a rerun goes on."""


def _ledger_from_store(store: ObjectStore, shopper: str) -> Ledger | None:
    key = shopper_prefix(shopper) + "shopper.json"
    try:
        return Ledger(**parse_json_object(store, key, "shopper ledger")) if store.exists(key) else None
    except (StorageError, ValueError, TypeError):
        return None  # unreadable: the id alone still finds everything under the prefix


def open_subject(layout: LiveLayout, store: ObjectStore, shopper: str) -> tuple[Subject, Path]:
    """The journal of a forget of `shopper`: the one in progress, or a new one from the ledger."""
    journal = layout.forget_journal(subject_of(safe_shopper_id(shopper)))
    if journal.is_file():
        subject = Subject(**read_json_object(journal, "forget journal"))
    else:
        ledger = read_ledger(layout.shopper(shopper)) or _ledger_from_store(store, shopper)
        now = datetime.now(UTC).isoformat()
        subject = Subject(shopper, uuid.uuid4().hex, now)
        if ledger is not None:
            subject.digests, subject.outputs = ledger.photos, list(ledger.outputs)
            subject.mlflow_runs, subject.jobs = list(ledger.mlflow_runs), list(ledger.jobs)
    subject.attempts += 1
    publish_json(journal, asdict(subject))
    return subject, journal


def forget(layout: LiveLayout, store: ObjectStore, shopper: str, places: list[Place], *, log=print) -> dict:
    """Erase the shopper from every place, verify by scanning, write the audit record; returns it."""
    subject, journal = open_subject(layout, store, shopper)
    for place in places:
        if place.name in subject.erased:
            continue
        counts = place.erase(subject)
        subject.erased[place.name] = counts
        total = subject.totals.setdefault(place.name, {})
        for name, value in counts.items():
            total[name] = total.get(name, 0) + value
        publish_json(journal, asdict(subject))
        log(f"forget: {place.name}: {_counts(subject.erased[place.name])}")
    found = {place.name: place.scan(subject) for place in places}
    remaining = {name: items for name, items in found.items() if items}
    if remaining:
        subject.erased = {}  # the next run erases everywhere again
        publish_json(journal, asdict(subject))
        shown = "; ".join(f"{name}: {len(items)} (e.g. {items[0]})" for name, items in remaining.items())
        raise ForgetIncomplete(f"forget {subject.request}: the scan still finds the shopper's data: {shown}; run it again")
    audit = {
        "request": subject.request,
        "requested_at": subject.requested_at,
        "finished_at": datetime.now(UTC).isoformat(),
        "attempts": subject.attempts,
        "erased": subject.totals,
        "scanned": sorted(found),
        "verified": True,
    }
    publish_json(layout.audit(subject.request), audit)
    store.put_file(layout.audit(subject.request), audit_key(subject.request))
    journal.unlink()
    return audit


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{value} {name}" for name, value in counts.items()) or "nothing"
