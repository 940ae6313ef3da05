"""Latent datasets (drape/data/encode.py): a pixel dataset's VAE latents, encoded once, read as they are."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from drape.config import ConfigError
from drape.data.dataset import dataset_prefix, ensure_dataset, load_split, to_model_inputs
from drape.data.encode import LatentDatasetError, source_config
from drape.data.partition import split_data
from drape.data.reader import ShardIndex
from drape.data.shards import LATENT_FIELDS, ShardError, ShardWriter
from drape.storage.store import open_store
from drape.training.loop.trainer import train_stage
from drape.training.recipes.model import build_model
from tests.conftest import tiny_config

LATENT_DIT = {"kind": "latent-dit", "patch_size": 2, "garment_patch_size": 4, "vae": {"latent_channels": 4}}


@pytest.fixture(scope="module")
def vae_dir(tmp_path_factory):
    """A fixed (random, saved) AutoencoderKL: what model.vae.path names."""
    from diffusers import AutoencoderKL

    from drape.config.training import VaeConfig
    from drape.training.recipes.latent import vae_config

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("vae") / "vae"
    AutoencoderKL.from_config(vae_config(VaeConfig(latent_channels=4), 32)).save_pretrained(path, safe_serialization=True)
    return path


def _config(root, vae_dir, **data):
    small = {
        "synthetic": {"samples_per_stage": {"identity": 20, "texture": 12, "geometry": 12, "denoise": 12}},
        "control_samples": 6,
    }
    return tiny_config(
        root,
        data={**small, "shard_max_samples": 8, "version": "v1-latents", "latents_of": "v1", **data},
        model={**LATENT_DIT, "vae": {**LATENT_DIT["vae"], "path": str(vae_dir)}},
    )


@pytest.fixture(scope="module")
def encoded(tmp_path_factory, vae_dir):
    """The latent dataset of a small synthetic one, encoded through a file:// store: (config, store, manifest)."""
    config = _config(tmp_path_factory.mktemp("latents") / "drape", vae_dir)
    store = open_store(config)
    return config, store, ensure_dataset(config, store)


def _local(store, config, manifest, where):
    prefix = dataset_prefix(config)
    for shards in manifest["splits"].values():
        for shard in shards:
            store.get_file(f"{prefix}/{shard['path']}", where / shard["path"], sha256=shard["sha256"])
    return where


def test_latents_are_the_vae_encoding_of_each_sample_and_the_control_set_stays_pixels(encoded, tmp_path):
    config, store, manifest = encoded
    source = ensure_dataset(source_config(config), store)  # already there: the encoder made it first
    assert manifest["kind"] == "latents" and manifest["source"]["version"] == "v1"
    assert manifest["splits"]["control"] == source["splits"]["control"] and manifest["control_set"] == source["control_set"]
    assert sum(s["samples"] for s in manifest["splits"]["texture"]) == sum(s["samples"] for s in source["splits"]["texture"])

    latent_dir = _local(store, config, manifest, tmp_path / "latent")
    pixel_dir = _local(store, source_config(config), source, tmp_path / "pixel")
    cached = load_split(latent_dir, manifest, "texture")
    pixels = load_split(pixel_dir, source, "texture")
    assert cached["keys"] == pixels["keys"] and cached["target_latent"].dtype == np.float16
    model = build_model(config).eval()
    fresh = model.latent_fields(to_model_inputs(pixels))
    for name in LATENT_FIELDS:
        torch.testing.assert_close(torch.as_tensor(cached[name]).float(), fresh[name], atol=2e-3, rtol=2e-3)
    assert cached["target_latent"].shape[1:] == (4, 16, 16) and cached["mask_latent"].shape[1:] == (1, 16, 16)
    # what training reads of each: the model takes the cached fields as they are
    clean, condition = model.prepare(to_model_inputs(cached))
    assert clean.shape == fresh["target_latent"].shape and set(condition) == {"agnostic", "mask", "pose", "garment"}


def test_training_on_cached_latents_follows_training_that_encodes_every_batch(encoded, tmp_path):
    config, store, manifest = encoded
    source = ensure_dataset(source_config(config), store)
    latent = split_data(_local(store, config, manifest, tmp_path / "latent"), manifest, "identity")
    pixels = split_data(_local(store, source_config(config), source, tmp_path / "pixel"), source, "identity")
    assert latent.partitions[0].kind == "latents" and pixels.partitions[0].kind == "pixels"
    data = config.model_dump(mode="json")
    data["train"]["stages"]["identity"]["steps"] = 4
    cfg = type(config).model_validate(data)
    cached = train_stage(cfg, stage="identity", data=latent, out_dir=tmp_path / "cached", init_checkpoint=None)
    encoding = train_stage(cfg, stage="identity", data=pixels, out_dir=tmp_path / "encoding", init_checkpoint=None)
    assert cached.final_loss == pytest.approx(encoding.final_loss, rel=2e-2)  # the same batches, float16-rounded latents


def test_a_latent_dataset_encoded_by_another_vae_is_refused(encoded, tmp_path):
    from diffusers import AutoencoderKL

    config, store, _ = encoded
    other = tmp_path / "other-vae"
    AutoencoderKL.from_pretrained(config.model.vae.path).save_pretrained(other, safe_serialization=True)
    (other / "config.json").write_text(
        (other / "config.json").read_text().replace('"scaling_factor": 1.0', '"scaling_factor": 0.5')
    )
    changed = config.model_copy(
        update={"model": config.model.model_copy(update={"vae": config.model.vae.model_copy(update={"path": str(other)})})}
    )
    with pytest.raises(LatentDatasetError, match="encoded by VAE"):
        ensure_dataset(changed, store)


def test_a_latent_version_needs_a_latent_model_and_a_fixed_vae(tmp_path, vae_dir):
    with pytest.raises(ConfigError, match="pixel space"):
        tiny_config(tmp_path, data={"version": "v2", "latents_of": "v1"})
    with pytest.raises(ConfigError, match="model.vae.path"):
        tiny_config(tmp_path, data={"version": "v2", "latents_of": "v1"}, model=LATENT_DIT)
    with pytest.raises(ValueError, match="pixel space"):
        build_model(tiny_config(tmp_path)).latent_fields({})


def test_a_shard_holds_one_kind_of_sample(tmp_path):
    latents = {name: np.zeros((4, 2, 2), dtype=np.float16) for name in LATENT_FIELDS}
    with ShardWriter(out_dir=tmp_path / "a", root=tmp_path) as writer:
        writer.write_latents("k0", latents, {"id": 0})
    index = ShardIndex(sorted((tmp_path / "a").glob("*.tar")))
    assert index.kind == "latents" and index.model_fields == LATENT_FIELDS
    assert index.sample(0)["pose_latent"].dtype == np.float16
    with pytest.raises(ValueError, match="lacks"):
        ShardWriter(out_dir=tmp_path / "b", root=tmp_path).write_latents("k1", {"target_latent": latents["target_latent"]}, {})
    import io
    import tarfile

    with tarfile.open(tmp_path / "half.tar", "w") as tar:  # a sample with one latent member only
        payload = io.BytesIO()
        np.save(payload, latents["target_latent"])
        info = tarfile.TarInfo("k2.target_latent.npy")
        info.size = len(payload.getvalue())
        tar.addfile(info, io.BytesIO(payload.getvalue()))
        meta = tarfile.TarInfo("k2.json")
        meta.size = 2
        tar.addfile(meta, io.BytesIO(b"{}"))
    with pytest.raises(ShardError, match="lacks .* of a latents sample"):
        ShardIndex([tmp_path / "half.tar"])


def test_drape_data_encode_prints_the_latent_version_and_bytes_per_sample(encoded, tmp_path):
    import yaml
    from typer.testing import CliRunner

    from drape.cli import app

    config, _, manifest = encoded
    path = tmp_path / "latents.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", by_alias=True)))
    result = CliRunner().invoke(app, ["data", "encode", "--config", str(path)])  # already encoded: checked and shown
    assert result.exit_code == 0, result.output
    assert manifest["vae"]["digest"][:12] in result.output and "bytes per sample" in result.output
    pixels = tmp_path / "pixels.yaml"
    pixels.write_text(yaml.safe_dump(source_config(config).model_dump(mode="json", by_alias=True)))
    refused = CliRunner().invoke(app, ["data", "encode", "--config", str(pixels)])
    assert refused.exit_code == 2 and "data.latents_of is not set" in refused.output
