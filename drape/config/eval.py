"""Config of `drape eval` (the field's metrics on a dataset's official test split) and of the
gates' optional FID/KID check against the stage baseline.

Feature networks come from local files only (nothing downloads at run time): `inception_path`
is the TorchScript Inception-v3 that StyleGAN2-ADA and clean-fid use for FID/KID, and
`lpips_backbone_path` torchvision's AlexNet weights, under LPIPS's linear heads (which
torchmetrics ships in its wheel). `fid_resize` is how images reach Inception's 299×299: `clean`
as clean-fid does by default (and the field's published numbers were measured), `legacy` as
the network's own bilinear resize; the two give different FIDs on the same images.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from drape.config.base import StrictModel, mounted

INCEPTION_SOURCE = (
    "https://api.ngc.nvidia.com/v2/models/nvidia/research/stylegan3/versions/1/files/metrics/inception-2015-12-05.pkl "
    "(its TorchScript form inception-2015-12-05.pt, as clean-fid and StyleGAN2-ADA fetch it)"
)
LPIPS_BACKBONE_SOURCE = "https://download.pytorch.org/models/alexnet-owt-7be5be79.pth (torchvision AlexNet, ImageNet)"


class FidGateConfig(StrictModel):
    """A gate check that fails a stage whose FID or KID on the control set is worse than its
    baseline's by more than a margin, at a bootstrap bound (resampled control sets)."""

    enabled: bool = Field(default=False, description="add the FID/KID check to every gate that has a baseline")
    max_fid_increase: float = Field(default=2.0, ge=0, le=1000, description="FID may rise at most this much over the baseline's")
    max_kid_increase: float = Field(default=0.002, ge=0, le=10, description="KID may rise at most this much over the baseline's")
    resamples: int = Field(default=50, ge=10, le=2000, description="bootstrap resamples of the control set")
    quantile: float = Field(
        default=0.05,
        gt=0,
        lt=0.5,
        description="fail when this lower quantile of the bootstrap increase is above the margin (a confident regression)",
    )


class EvalConfig(StrictModel):
    """`drape eval`: the protocol (resolution, samples, seed, guidance come from here and the
    sampler's config) and where the feature networks' weights lie."""

    inception_path: str | None = Field(
        default=None,
        description=f"TorchScript Inception-v3 for FID/KID; from {INCEPTION_SOURCE}",
        json_schema_extra=mounted("file"),
    )
    lpips_backbone_path: str | None = Field(
        default=None, description=f"AlexNet weights for LPIPS; from {LPIPS_BACKBONE_SOURCE}", json_schema_extra=mounted("file")
    )
    fid_resize: Literal["clean", "legacy"] = Field(
        default="clean",
        description=(
            "how images reach Inception's 299×299 for FID/KID: clean (clean-fid's default and the field's scripts: "
            "PIL bicubic on each channel as float32, then the network) or legacy (the network resizes inside, bilinear)"
        ),
    )
    batch_size: int | None = Field(default=None, gt=0, le=4096, description="samples per batch (default gates.batch_size)")
    num_samples: int | None = Field(default=None, gt=0, description="evaluate the first N samples of the split (default all)")
    seed: int | None = Field(default=None, description="sampling seed (default gates.sample_seed: the gates' noise)")
    kid_subset_size: int = Field(default=1000, gt=1, le=100_000, description="KID subset size (capped at the sample count)")
    kid_subsets: int = Field(default=100, gt=0, le=10_000, description="KID subsets averaged (torchmetrics' subsets)")
    fid_gate: FidGateConfig = Field(
        default_factory=lambda: FidGateConfig(), description="the gates' optional FID/KID check against the baseline"
    )

    @model_validator(mode="after")
    def _gate_needs_inception(self) -> EvalConfig:
        if self.fid_gate.enabled and not self.inception_path:
            raise ValueError("eval.fid_gate.enabled needs eval.inception_path (the Inception weights, a local file)")
        return self
