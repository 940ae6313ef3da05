"""Latent datasets: a pixel dataset's VAE latents, encoded once (`drape data encode`).

A latent model (`model.kind: latent-*`) otherwise encodes the target, agnostic person, pose map and
garment of every row with its frozen VAE at every step of every stage. Encoded once, a derived
dataset version holds them, and training reads them as they are::

    datasets/<name>/<version>/<stage>/shard-NNNNN.tar   <key>.<field>_latent.npy (float16) + <key>.json
    datasets/<name>/<version>/control/shard-NNNNN.tar   the source's control shards as they are (pixels:
                                                       the gates sample from them and judge pixels)
    datasets/<name>/<version>/manifest.json             kind "latents"; source {name, version,
                                                       manifest_hash}; vae {digest, ...}

A config trains on it with `data.version` naming the latent version and `data.latents_of` the
pixel version it is encoded from (`model.vae.path` must be set: latents are only as fixed as the
VAE). `ensure_dataset` encodes it when the store lacks it; a latent version whose manifest names
another VAE, or a source whose manifest changed, is refused. The encoder streams: one source shard
at a time is downloaded, encoded in batches (on the GPU when there is one) and freed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from drape import layout
from drape.config import PipelineConfig
from drape.data.manifest import dataset_prefix, manifest_hash, publish_dataset, read_manifest
from drape.data.reader import ShardIndex, to_model_inputs
from drape.data.shards import LATENT_FIELDS, MODEL_FIELDS, ShardWriter, verify_shard
from drape.data.sources import TEST_PAIRED, TEST_UNPAIRED
from drape.storage.checksum import sha256_bytes, sha256_file

Progress = Callable[[str, int], None]
PIXEL_SPLITS = ("control", TEST_PAIRED, TEST_UNPAIRED)  # copied as they are: the gates and `drape eval` judge pixels
LATENTS = "latents"


class LatentDatasetError(ValueError):
    """A latent dataset that does not match the config that reads it (another VAE, another source)."""


@lru_cache(maxsize=8)
def _directory_digest(path: str, stamp: tuple) -> str:
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file() and (p.suffix in (".json", ".safetensors")))
    return sha256_bytes(json.dumps([(str(p.relative_to(root)), sha256_file(p)) for p in files]).encode())


def vae_digest(config: PipelineConfig) -> str:
    """The sha256 of the VAE's files (config.json and weights): which VAE a latent dataset was encoded by."""
    path = config.model.vae.path
    if path is None or not Path(path).is_dir():
        raise LatentDatasetError(
            f"model.vae.path {path!r}: expected a diffusers AutoencoderKL directory (config.json + safetensors)"
        )
    files = sorted(Path(path).rglob("*"))
    return _directory_digest(str(Path(path).resolve()), tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files))


def source_config(config: PipelineConfig) -> PipelineConfig:
    """The config of the pixel version a latent version is encoded from."""
    assert config.data.latents_of is not None
    return config.model_copy(
        update={"data": config.data.model_copy(update={"version": config.data.latents_of, "latents_of": None})}
    )


def check_latent_manifest(config: PipelineConfig, manifest: dict, where: str, source_hash: str | None = None) -> dict:
    """`manifest` if it is a latent dataset encoded by this config's VAE (from `source_hash` when
    given); LatentDatasetError naming what differs otherwise."""
    if manifest.get("kind") != LATENTS:
        raise LatentDatasetError(f"{where}: not a latent dataset (data.latents_of is set; `drape data encode` writes one)")
    recorded = manifest.get("vae", {}).get("digest")
    if recorded != vae_digest(config):
        raise LatentDatasetError(
            f"{where}: encoded by VAE {str(recorded)[:12]}, model.vae.path is VAE {vae_digest(config)[:12]}; "
            "encode to a new data.version"
        )
    source = manifest.get("source", {})
    if source.get("version") != config.data.latents_of:
        raise LatentDatasetError(
            f"{where}: encoded from version {source.get('version')!r}, data.latents_of is {config.data.latents_of!r}"
        )
    if source_hash is not None and source.get("manifest_hash") != source_hash:
        raise LatentDatasetError(
            f"{where}: encoded from another {config.data.latents_of!r} than the store holds (its manifest changed)"
        )
    return manifest


def _encode_shard(model, index: ShardIndex, writer: ShardWriter, batch_size: int, device: torch.device) -> int:
    for start in range(0, len(index), batch_size):
        arrays = index.take(range(start, min(start + batch_size, len(index))), (*MODEL_FIELDS, "meta"))
        inputs = {name: tensor.to(device) for name, tensor in to_model_inputs(arrays).items()}
        latents = {name: value.float().cpu().numpy() for name, value in model.latent_fields(inputs).items()}
        for row, key in enumerate(arrays["keys"]):
            writer.write_latents(key, {name: latents[name][row] for name in LATENT_FIELDS}, arrays["meta"][row])
    return len(index)


def encode_dataset(
    config: PipelineConfig,
    source: dict,
    fetch: Callable[[dict], Path],
    out_dir: str | Path,
    *,
    batch_size: int = 16,
    device: torch.device | None = None,
    progress: Progress | None = None,
) -> dict:
    """Write the latent dataset of the pixel dataset `source` (its manifest) into `out_dir`; returns
    its manifest. `fetch(shard)` gives a verified local path of a source shard; a shard is freed
    (when `fetch` downloaded it) as soon as it is encoded."""
    from drape.training.recipes.model import build_model

    out_dir, device = Path(out_dir), device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model: Any = build_model(config).to(device).eval()  # type: ignore[arg-type]  # the VAE from model.vae.path; the denoiser is unused
    splits: dict[str, list[dict]] = {}
    for split, shards in source["splits"].items():
        if split in PIXEL_SPLITS:  # the gates' and evaluation's inputs stay pixels, byte for byte (the same control set id)
            for shard in shards:
                target = layout.contained(out_dir, shard["path"], "control shard path")
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(fetch(shard), target)
            splits[split] = [dict(shard) for shard in shards]
            continue
        data = config.data
        with ShardWriter(
            out_dir=out_dir / split, root=out_dir, max_samples=data.shard_max_samples, max_bytes=data.shard_max_bytes
        ) as writer:
            for shard in shards:
                index = ShardIndex([fetch(shard)])
                try:
                    count = _encode_shard(model, index, writer, batch_size, device)
                finally:
                    index.close()
                if progress:
                    progress(split, count)
            splits[split] = [info.to_dict() for info in writer.close()]
    manifest = {
        "name": config.data.name,
        "version": config.data.version,
        "created": datetime.now(UTC).isoformat(),
        "kind": LATENTS,
        "source": {"name": source["name"], "version": source["version"], "manifest_hash": manifest_hash(source)},
        "vae": {"digest": vae_digest(config), "path": Path(str(config.model.vae.path)).name, **_vae_facts(model)},
        "stage_rule": source.get("stage_rule", {}),
        "splits": splits,
        "control_set": source["control_set"],
    }
    (out_dir / layout.DATASET_MANIFEST).write_text(json.dumps(manifest, indent=2))
    return manifest


def _vae_facts(model) -> dict:
    c = model.vae.config
    return {"latent_channels": c.latent_channels, "downsample": model.downsample, "scaling_factor": c.scaling_factor}


def ensure_latent_dataset(
    config: PipelineConfig, store, progress: Progress | None = None, *, ensure_source: Callable[..., dict]
) -> dict:
    """The config's latent dataset (`data.version`, encoded from `data.latents_of`), encoding and
    publishing it first when the store lacks it; checked against the config's VAE, and against the
    source when the store still holds it (a team may drop the pixels once they are encoded).
    `ensure_source(config, store, progress)` gives the pixel version's manifest
    (`drape.data.dataset.ensure_dataset`, passed in: datasets sit above this module)."""

    prefix, source_prefix = dataset_prefix(config), dataset_prefix(source_config(config))
    manifest = read_manifest(store, prefix)
    if manifest is None:
        source = ensure_source(source_config(config), store, progress)
        if source.get("kind") == LATENTS:
            raise LatentDatasetError(f"data.latents_of {config.data.latents_of!r} is a latent version; name a pixel version")
        with tempfile.TemporaryDirectory(prefix="drape-encode-") as scratch:
            fetched = Path(scratch) / "source"

            def fetch(shard: dict) -> Path:
                local = layout.contained(fetched, shard["path"], "source shard path")
                store.get_file(f"{source_prefix}/{shard['path']}", local, sha256=shard["sha256"])
                verify_shard(local, sha256=shard["sha256"], size=shard["bytes"])
                return local

            encode_dataset(config, source, _freeing(fetch), Path(scratch) / "latents", progress=progress)
            publish_dataset(Path(scratch) / "latents", store, prefix)
        manifest = read_manifest(store, prefix)
        if manifest is None:
            raise LatentDatasetError(f"{store.key_url(prefix)}: published, but its manifest cannot be read back")
    held = read_manifest(store, source_prefix)
    return check_latent_manifest(config, manifest, store.key_url(prefix), manifest_hash(held) if held else None)


def _freeing(fetch: Callable[[dict], Path]) -> Callable[[dict], Path]:
    """`fetch`, deleting the previous shard it fetched first: one source shard on disk at a time."""
    previous: list[Path] = []

    def fetch_one(shard: dict) -> Path:
        while previous:
            previous.pop().unlink(missing_ok=True)
        path = fetch(shard)
        previous.append(path)
        return path

    return fetch_one
