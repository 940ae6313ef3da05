"""``shopper.json``: what drape holds of one shopper and until when.

It records the consent and its expiry (`shoppers.consent_days`), the digests of the photos, the
adapter and the model it was trained on, the MLflow runs and queue jobs that handled their data
and any try-on folder written outside the shopper's own directory, so `drape shopper forget`
knows every place to erase and what to scan for. Written to a temporary name and renamed; a
copy is kept under the shopper's prefix in the object store for jobs that run elsewhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from drape.jsonfile import read_json_object
from drape.layout import ShopperPaths, safe_shopper_id
from drape.shoppers import ShopperError
from drape.shoppers.photos import PhotoDigests
from drape.storage.durable import publish_json


@dataclass
class Ledger:
    shopper: str
    consented_at: str
    expires_at: str
    photos: dict = field(default_factory=dict)  # PhotoDigests.to_dict()
    adapter: dict | None = None  # the kept adapter: sha256 of its manifest, bytes, base model
    outputs: list[str] = field(default_factory=list)  # try-on folders outside the shopper's directory
    mlflow_runs: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)

    @classmethod
    def new(cls, shopper: str, consent_days: int, now: datetime | None = None) -> Ledger:
        now = now or datetime.now(UTC)
        return cls(safe_shopper_id(shopper), now.isoformat(), (now + timedelta(days=consent_days)).isoformat())

    @property
    def expired(self) -> bool:
        return datetime.fromisoformat(self.expires_at) <= datetime.now(UTC)

    def digests(self) -> PhotoDigests:
        return PhotoDigests.from_dict(self.photos)

    def remember(self, listing: str, value: str) -> None:
        values = getattr(self, listing)
        if value not in values:
            values.append(value)


def read_ledger(paths: ShopperPaths) -> Ledger | None:
    """The shopper's ledger, None when there is none; a corrupt one is a ShopperError naming it."""
    if not paths.ledger.is_file():
        return None
    try:
        payload = read_json_object(paths.ledger, "shopper ledger")
        ledger = Ledger(**payload)
        safe_shopper_id(ledger.shopper)
    except (ValueError, TypeError) as error:
        raise ShopperError(f"{paths.ledger}: not a shopper ledger ({error})") from None
    if paths.root.name != ledger.shopper:
        raise ShopperError(f"{paths.ledger}: names shopper {ledger.shopper!r}, not {paths.root.name!r}")
    return ledger


def write_ledger(paths: ShopperPaths, ledger: Ledger) -> None:
    publish_json(paths.ledger, asdict(ledger))


def require_ledger(paths: ShopperPaths) -> Ledger:
    ledger = read_ledger(paths)
    if ledger is None:
        raise ShopperError(
            f"shopper {paths.root.name!r}: not enrolled (no {paths.ledger}); run `drape shopper personalize` first"
        )
    return ledger


def list_shoppers(root: Path) -> list[Ledger]:
    """Every enrolled shopper's ledger under ``<live>/shoppers``."""
    found = []
    for directory in sorted(root.iterdir()) if root.is_dir() else []:
        ledger = read_ledger(ShopperPaths(directory)) if not directory.name.startswith(".") else None
        if ledger is not None:
            found.append(ledger)
    return found
