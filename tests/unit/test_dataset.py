"""ensure_dataset: a dataset the object store lacks is generated only when the config says so; a control
set too damaged or too small to judge is refused naming it, from a dataset root or a folder of shards."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from drape.cli import app
from drape.data.dataset import DatasetMissing, dataset_prefix, ensure_dataset, load_control_dir
from drape.data.manifest import ManifestError
from drape.data.partition import PartitionError
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


# --- control sets too damaged or too small to judge, from a dataset root or a folder of shards ----
def _root_with(tmp_path, directory, edit):
    root = tmp_path / "root"
    shutil.copytree(directory, root)
    manifest = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(edit(manifest) if callable(edit) else edit)
    return root


def _one_sample(manifest):
    manifest["splits"]["control"] = [{**manifest["splits"]["control"][0], "samples": 1}]
    return json.dumps(manifest)


@pytest.mark.parametrize(
    ("edit", "error", "match"),
    [
        ("{not json", ManifestError, r"root/manifest\.json: not JSON"),
        (lambda m: json.dumps({**m, "splits": {"identity": m["splits"]["identity"]}}), ManifestError, "expected a control split"),
        (lambda m: json.dumps({**m, "splits": {**m["splits"], "control": []}}), PartitionError, r"0 sample\(s\).*at least 2"),
        (_one_sample, PartitionError, r"'control' of .*root/manifest\.json holds 1 sample\(s\).*at least 2"),
        (
            lambda m: json.dumps(
                {**m, "splits": {**m["splits"], "control": [{**m["splits"]["control"][0], "path": "../x.tar"}]}}
            ),
            ManifestError,
            r"splits\.control\[0\]\.path",
        ),
    ],
    ids=["not json", "no control split", "empty control", "one sample", "path outside"],
)
def test_a_damaged_or_too_small_control_set_is_refused_naming_it(tiny_dataset, tmp_path, edit, error, match):
    with pytest.raises(error, match=match):
        load_control_dir(_root_with(tmp_path, tiny_dataset[0], edit), judged=True)


def test_a_folder_of_control_shards_too_small_to_judge_is_refused(tmp_path):
    from drape.data.shards import ShardWriter
    from drape.data.synth import generate_split

    folder = tmp_path / "control"
    with ShardWriter(out_dir=folder, root=tmp_path, prefix="control") as writer:
        writer.write(
            next(generate_split(seed=0, split="control", num_samples=1, num_identities=1, num_garments=1, resolution=32))
        )
    result = CliRunner().invoke(app, ["gate", "check", "--control", str(folder), "--outputs", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert f"'control' of the control shards in {folder} holds 1 sample(s) in 1 shard(s)" in " ".join(result.output.split())
    assert "at least 2" in result.output
    arrays, _ = load_control_dir(folder)  # a try-on's inputs or a shopper's photos: one is enough
    assert len(arrays["keys"]) == 1
