"""Config of per-shopper personalization (`drape shopper personalize / forget`, drape/shoppers/).

A shopper who opts in gets a LoRA adapter on the identity-relevant layers of a promoted model,
trained from a few of their photos; it is kept only when a gate on held-out photos finds that it
holds their identity better than the base model without forgetting garments. Their photos and
everything made from them live under one prefix per shopper for `consent_days`, and
`drape shopper forget` erases all of it on request.
"""

from __future__ import annotations

from pydantic import Field

from drape.config.base import StrictModel, mounted


class ShopperGateConfig(StrictModel):
    """What an adapter must show on the shopper's held-out photos and on the control set's garments."""

    min_identity_gain: float = Field(
        default=0.015,
        ge=0,
        description="the adapter's mean identity similarity on held-out photos must beat the base model's by this",
    )
    max_garment_drop: float = Field(
        default=0.04,
        ge=0,
        description="texture and coherence (means over the control set) may each drop at most this below the base's",
    )
    seeds: int = Field(default=4, gt=0, description="each held-out photo is rendered with this many seeds (the mean is judged)")
    garment_samples: int = Field(default=8, gt=0, description="control samples rendered for the garment checks")


class ShoppersConfig(StrictModel):
    consent_days: int = Field(default=365, gt=0, description="how long a shopper's photos and adapter are kept after consent")
    min_photos: int = Field(default=8, gt=2, description="fewest photos a personalization accepts (training + held out)")
    holdout: int = Field(default=4, gt=0, description="photos held out for the gate when no --holdout folder is given")
    steps: int = Field(default=200, gt=0, description="training steps of one personalization")
    batch_size: int = Field(default=8, gt=0, description="photos per step")
    lr: float = Field(default=1e-3, gt=0, description="the adapter's learning rate")
    rank: int = Field(default=8, gt=0, le=256, description="the adapter's LoRA rank")
    alpha: float | None = Field(default=None, gt=0, description="the update is scaled by alpha / rank; default rank")
    trainable: list[str] = Field(
        default_factory=lambda: ["transformer.transformer_blocks.*.attn.*", "transformer.transformer_blocks.*.ff.*"],
        min_length=1,
        description="glob patterns of the nn.Linear layers adapted: the image stream's attention and MLP, "
        "where the face is rendered (not the garment encoder)",
    )
    face_weight: float = Field(
        default=4.0,
        ge=0,
        description="the loss inside the face box weighs 1 + this: the adapter learns the face, not the garments",
    )
    seed: int = Field(default=0, description="the personalization's seed (adapter initialisation, batches, the gate's noise)")
    gate: ShopperGateConfig = Field(default=ShopperGateConfig(), description="what an adapter must show to be kept")
    mlflow_backend_store_uri: str | None = Field(
        default=None,
        description="the MLflow server's database, which `mlflow gc` needs to delete a shopper's runs for good "
        "when tracking.uri is an http server (credentials from the environment, never here)",
        json_schema_extra=mounted("none", "`drape shopper forget`'s, on the flow's side: a job never opens it"),
    )
    timeout_seconds: float = Field(default=3600, gt=0, description="bound on the personalization job's wait")
