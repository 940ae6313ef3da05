"""drape: the staged, gated, storage-aware training system around a virtual try-on model."""

__version__ = "0.1.0"

STAGES: tuple[str, ...] = ("identity", "texture", "geometry", "denoise")
ARTIFACT_KINDS: tuple[str, ...] = (
    "checkpoint",
    "latent_snapshot",
    "validation_output",
    "synthetic_imagery",
    "gate_report",
)
REGISTERED_MODEL = "drape-tryon"
