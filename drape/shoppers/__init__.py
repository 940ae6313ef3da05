"""Per-shopper personalization: opt-in, gated, and erasable on request.

One conditional model serves every garment, so drape never fine-tunes per SKU; the one place a
per-subject fine-tune pays is the shopper who opts in: a LoRA adapter on the identity-relevant
layers, trained once from a few of their photos and reused for all of their try-ons.

- `photos`: a shopper's photos (shards in the control format), their hashes, the synthetic set.
- `ledger`: ``shopper.json``, what drape holds of a shopper and until when.
- `adapter`: the LoRA fit, and base + adapter for rendering.
- `gate`: the personalization gate (held-out photos: identity must beat the base; the control
  set's garments must not drop).
- `likeness`: the face measure the gate compares base and adapter with (a measure of improvement,
  not a threshold).
- `personalize`: the job (`python -m drape.shoppers.personalize JOB.json`).
- `forget` and `places`: erase every copy, verify, write an audit record.

A shopper's data lives under ``shoppers/<id>/`` (live storage and the object store), never in
datasets, runs or baselines.
"""

from __future__ import annotations

import hashlib


class ShopperError(ValueError):
    """A shopper request that cannot be served; the message names what and what was expected."""


def subject_of(shopper_id: str) -> str:
    """A stable name for a shopper's forget journal and queue labels that is not their id."""
    return hashlib.sha256(f"drape-shopper:{shopper_id}".encode()).hexdigest()[:32]
