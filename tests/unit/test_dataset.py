"""ensure_dataset: a dataset the object store lacks is generated only when the config says so."""

from __future__ import annotations

import pytest

from drape.data.dataset import DatasetMissing, dataset_prefix, ensure_dataset
from drape.layout import DATASET_MANIFEST
from drape.storage.store import open_store
from tests.conftest import tiny_config

SMALL = {"synthetic": {"samples_per_stage": {"identity": 4, "texture": 4, "geometry": 4, "denoise": 4}}, "control_samples": 2}


def _config(root, **data):
    return tiny_config(root / "drape", data={**SMALL, **data})


def test_a_missing_dataset_under_source_store_names_the_store_and_the_command(tmp_path):
    config = _config(tmp_path, source="store")
    store = open_store(config)
    clean_url = store.url
    store.url = clean_url.replace("file://", "file://drape:hunter2@")  # the store refuses such a URL; the message must too
    with pytest.raises(DatasetMissing) as raised:
        ensure_dataset(config, store)
    message = str(raised.value)
    assert f"{clean_url}/{dataset_prefix(config)}" in message and "hunter2" not in message
    assert f"drape data shard <VITON-HD or DressCode root> --out {clean_url} --name synth-tryon --version v1" in message
    assert "data.source: synthetic" in message
    assert isinstance(raised.value, FileNotFoundError)  # what the CLI and the prestage flow already report
    assert not store.exists(dataset_prefix(config))  # nothing published in its place


def test_source_synthetic_generates_it_and_a_misspelt_name_under_store_does_not(tmp_path):
    synthetic = _config(tmp_path, source="synthetic")
    store = open_store(synthetic)
    manifest = ensure_dataset(synthetic, store)
    assert manifest["source"]["generator"] == "drape.data.synth"
    assert store.exists(f"{dataset_prefix(synthetic)}/{DATASET_MANIFEST}")
    assert ensure_dataset(_config(tmp_path, source="store"), store) == manifest  # there now: read, whatever the source
    typo = _config(tmp_path, source="store", name="synth-tyron")
    with pytest.raises(DatasetMissing, match="data.name 'synth-tyron'"):
        ensure_dataset(typo, store)
    assert not store.exists(dataset_prefix(typo))


def test_store_is_the_default_and_the_shipped_demo_configs_generate():
    from pathlib import Path

    from drape.config import DataConfig, load_config

    configs = Path(__file__).resolve().parents[2] / "configs"
    assert DataConfig().source == "store"
    assert load_config(configs / "h100.yaml").data.source == "store"
    for name in ("demo.yaml", "rehearsal.yaml"):
        assert load_config(configs / name).data.source == "synthetic", name
