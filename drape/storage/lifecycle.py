"""S3 lifecycle rules generated from the retention policy, so S3 itself enforces the lifetimes.

One rule per (artifact kind, outcome) with a lifetime, selecting objects under the archive
prefix by the tags drape sets at upload (`drape-kind`, `drape-outcome`). Failed candidates and
aborted runs get the short `failed_lifetime_days`; kinds kept forever get no rule; objects
tagged `baseline` get no rule, so a current baseline never expires; once the retention sweep
retags them `superseded_baseline` (copying each onto itself, so its creation date is the retag)
they expire `baseline_grace_days` later. On a versioned bucket an expired or re-copied object
leaves a noncurrent version behind; one more rule expires those under the prefix after
`NONCURRENT_DAYS`. With `shopper_days`, a rule expires everything under ``shoppers/`` (opted-in
shoppers' photos and adapters, drape/shoppers/) that many days after it was written, and its
noncurrent versions after `NONCURRENT_DAYS`: the consent's lifetime, enforced by S3 even when no
`drape shopper forget` runs.
"""

from __future__ import annotations

from drape import ARTIFACT_KINDS, OUTCOMES, Outcome
from drape.config import RetentionConfig
from drape.layout import RUNS_PREFIX, SHOPPERS
from drape.storage.network import bounded_on
from drape.storage.retention import TAG_KIND, TAG_OUTCOME, resolve
from drape.storage.store import ObjectStore, StorageError

ARCHIVED_OUTCOMES = tuple(o for o in OUTCOMES if o != Outcome.BASELINE)
NONCURRENT_DAYS = 1


def shopper_rule(prefix: str, days: int) -> dict:
    return {
        "ID": "drape-shoppers-consent",
        "Status": "Enabled",
        "Filter": {"Prefix": prefix},
        "Expiration": {"Days": days},
        "NoncurrentVersionExpiration": {"NoncurrentDays": NONCURRENT_DAYS},
    }


def lifecycle_rules(policy: RetentionConfig, prefix: str) -> list[dict]:
    """The bucket lifecycle rules (boto3 shape) that expire archived objects per the policy."""
    rules = []
    for kind in ARTIFACT_KINDS:
        for outcome in ARCHIVED_OUTCOMES:
            days, _ = resolve(policy, kind, outcome)  # superseded baselines: S3 counts from the object's creation
            if days is None:
                continue
            tags = [{"Key": TAG_KIND, "Value": kind}, {"Key": TAG_OUTCOME, "Value": outcome}]
            rules.append(
                {
                    "ID": f"drape-{kind}-{outcome}",
                    "Status": "Enabled",
                    "Filter": {"And": {"Prefix": prefix, "Tags": tags}},
                    "Expiration": {"Days": days},
                }
            )
    rules.append(
        {
            "ID": "drape-noncurrent-versions",
            "Status": "Enabled",
            "Filter": {"Prefix": prefix},
            "NoncurrentVersionExpiration": {"NoncurrentDays": NONCURRENT_DAYS},
        }
    )
    return rules


def apply_lifecycle(
    store: ObjectStore, policy: RetentionConfig, prefix: str = RUNS_PREFIX, *, shopper_days: int | None = None
) -> list[dict]:
    """Write the rules to the store's bucket and return them as S3 reads them back."""
    if not store.is_s3:
        raise StorageError(
            f"{store!r}: lifecycle rules need an s3:// object store; on other stores the retention sweep enforces the lifetimes"
        )
    bucket, _, base = store.base.partition("/")
    full_prefix = f"{base}/{prefix}" if base else prefix
    rules = lifecycle_rules(policy, full_prefix)
    if shopper_days:
        rules.append(shopper_rule(f"{base}/{SHOPPERS}/" if base else f"{SHOPPERS}/", shopper_days))
    # through s3fs's own client: the configured endpoint and the AWS credential chain
    with bounded_on(store):  # a timeout or stall: an error naming the endpoint
        store.fs.call_s3("put_bucket_lifecycle_configuration", Bucket=bucket, LifecycleConfiguration={"Rules": rules})
        return store.fs.call_s3("get_bucket_lifecycle_configuration", Bucket=bucket)["Rules"]
