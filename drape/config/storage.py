"""Config of the object store and of retention: lifetimes, storage classes and how long live copies stay."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from drape import ARTIFACT_KINDS, ArtifactKind, Outcome
from drape.config.base import OutcomeName, StrictModel, mounted


class StorageConfig(StrictModel):
    """Where artifacts go. Credentials never live here: S3 uses the standard AWS chain."""

    object_store_url: str | None = Field(
        default=None, description="fsspec URL; default file://<root>/objects", json_schema_extra=mounted("store")
    )
    endpoint_url: str | None = Field(default=None, description="S3-compatible endpoint (MinIO, Ceph, a test server)")
    region: str | None = Field(default=None, description="the S3 region; unset: the AWS chain's (AWS_REGION, profile)")
    multipart_chunk_bytes: int = Field(default=64 * 2**20, ge=5 * 2**20, description="S3 multipart part size")
    retry_attempts: int = Field(
        default=8,
        ge=1,
        description="S3 attempts per request at most (500, 503 SlowDown, resets, timeouts); fewer where all of them "
        "would not fit max_wait_seconds",
    )
    connect_timeout_seconds: float = Field(default=5.0, gt=0, description="seconds to open a connection to the endpoint")
    read_timeout_seconds: float = Field(default=10.0, gt=0, description="seconds an open connection may stay silent")
    max_wait_seconds: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="the longest one S3 request may take, connect, read and retries together: an endpoint that "
        "accepts and never answers is a clear error after at most this long (the attempts are cut to fit it)",
    )

    run_lease_seconds: float = Field(
        default=60.0,
        ge=3,
        le=3600,
        description="how long a run's lease (runs/<run>/lease.json) outlives its last renewal: the process driving a "
        "run renews it every third of this; a second start of the run is refused until it expires, or at once when "
        "its holder's process is gone from this host",
    )

    @model_validator(mode="after")
    def _one_attempt_fits(self) -> StorageConfig:
        if self.connect_timeout_seconds + self.read_timeout_seconds > self.max_wait_seconds:
            raise ValueError(
                f"storage.max_wait_seconds {self.max_wait_seconds:g} is shorter than one attempt "
                f"(connect_timeout_seconds {self.connect_timeout_seconds:g} + read_timeout_seconds "
                f"{self.read_timeout_seconds:g}); raise it or lower the timeouts"
            )
        return self

    prices_per_gb_month: dict[str, float] = Field(
        default_factory=lambda: {
            "live": 0.08,
            "STANDARD": 0.023,
            "STANDARD_IA": 0.0125,
            "GLACIER_IR": 0.004,
            "GLACIER": 0.0036,
            "DEEP_ARCHIVE": 0.00099,
        },
        description="USD per GB-month by storage class ('live': the nodes' disks), for the storage report",
    )


STORAGE_CLASSES = ("STANDARD", "STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING", "GLACIER_IR", "GLACIER", "DEEP_ARCHIVE")


LiveUntil = Literal["stage_end", "run_end", "baseline"]
# the pipeline reads a baseline's checkpoint (the next stage starts from it) and its outputs (the
# coherence reference) from live storage, so for these kinds a baseline stays live while it is one
BASELINE_LIVE_KINDS = (ArtifactKind.CHECKPOINT, ArtifactKind.VALIDATION_OUTPUT)


class OutcomeRule(StrictModel):
    """Overrides for one outcome of one kind; unset fields fall back to the kind's rule."""

    lifetime_days: int | None = Field(default=None, gt=0, description="days archived for this outcome; unset: the kind's")
    storage_class: Literal[STORAGE_CLASSES] | None = Field(  # type: ignore[valid-type]
        default=None, description="the S3 storage class for this outcome; unset: the kind's"
    )
    live_until: LiveUntil | None = Field(
        default=None, description="how long the live copy stays for this outcome; unset: the kind's"
    )


class RetentionRule(StrictModel):
    live_until: LiveUntil = Field(
        default="stage_end",
        description=(
            "how long the live copy stays once its archived copy is verified: 'stage_end' (freed by the stage's "
            "archive step), 'run_end' (freed when the run ends: passed, gate failed or aborted), 'baseline' (a "
            "baseline's copy stays in live baselines/<stage>/ until superseded; other outcomes: stage_end)"
        ),
    )
    lifetime_days: int | None = Field(default=None, gt=0, description="None: keep forever")
    storage_class: Literal[STORAGE_CLASSES] = Field(  # type: ignore[valid-type]
        default="STANDARD", description="the S3 storage class archived copies are written in"
    )
    outcomes: dict[OutcomeName, OutcomeRule] = Field(
        default_factory=dict,
        description="per outcome (passed, failed, baseline, aborted), overrides of this rule; unset fields fall back to it",
    )


class RetentionConfig(StrictModel):
    """Object-store lifetimes and classes, and how long the live copy stays, per artifact kind and outcome.

    How an artifact's rule is resolved from these (`drape.storage.retention.resolve` and
    `live_until`): a current baseline never expires; a superseded one lives `baseline_grace_days`
    from when it was superseded; failed candidates and aborted runs live `failed_lifetime_days`; a
    per-outcome override of the kind's rule wins over all of these except the baseline's.
    """

    rules: dict[str, RetentionRule] = Field(
        default_factory=lambda: {kind.value: RetentionRule() for kind in ARTIFACT_KINDS},
        description="per artifact kind (checkpoint, latent_snapshot, validation_output, synthetic_imagery, gate_report, "
        "adapter), its lifetime, storage class and live rule; a kind not listed: kept forever in STANDARD",
    )
    failed_lifetime_days: int = Field(
        default=7, gt=0, description="days a failed candidate's or an aborted run's artifacts stay archived"
    )
    baseline_grace_days: int = Field(default=30, gt=0, description="how long a superseded baseline stays archived")
    live_budget_bytes: int | None = Field(default=None, gt=0, description="live storage budget; over it, an alert fires")

    @model_validator(mode="after")
    def _known_kinds(self) -> RetentionConfig:
        unknown = sorted(set(self.rules) - set(ARTIFACT_KINDS))
        if unknown:
            raise ValueError(f"unknown artifact kinds {unknown}; expected some of {list(ARTIFACT_KINDS)}")
        for kind in BASELINE_LIVE_KINDS:
            override = self.rules.get(kind, RetentionRule()).outcomes.get(Outcome.BASELINE)
            if override is not None and override.live_until not in (None, "baseline"):
                raise ValueError(
                    f"rules.{kind}.outcomes.baseline.live_until must be 'baseline': the pipeline reads the "
                    f"current baseline's {kind} from live storage"
                )
        return self
