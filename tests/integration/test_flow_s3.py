"""The staged-training flow with its object store on S3 (moto server over HTTP): dataset published
to S3, shards pre-staged from it, artifacts archived to it with tags, verified by reading back."""

from __future__ import annotations

import pytest
import yaml

from drape import STAGES
from drape.retention import read_archive_manifest, verify_archived
from drape.storage import open_store
from tests.conftest import tiny_config
from tests.integration.test_staged_training import assert_live_invariant

pytestmark = pytest.mark.slow


def test_staged_training_on_s3(prefect_harness, s3_bucket, tmp_path):
    from flows.staged_training import staged_training

    bucket, endpoint = s3_bucket
    config = tiny_config(tmp_path / "drape", storage={"object_store_url": f"s3://{bucket}/drape", "endpoint_url": endpoint},
                         train={"stages": {stage: {"steps": 40} for stage in STAGES[1:]}})
    path = tmp_path / "s3.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    summary = staged_training(config_path=str(path), run_name="s3")
    assert [row["verdict"] for row in summary["stages"]] == ["pass"] * 4
    assert summary["object_store"] == f"ObjectStore('s3://{bucket}/drape')"
    store = open_store(config)
    assert store.exists("datasets/synth-tryon/v1/manifest.json")
    records = read_archive_manifest(store)
    assert {r["stage"] for r in records} == set(STAGES) and all(r["url"].startswith("s3://") for r in records)
    verify_archived(store, records)
    checkpoint = next(r for r in records if r["kind"] == "checkpoint")
    assert store.get_tags(checkpoint["key"])["drape-kind"] == "checkpoint"
    assert not (tmp_path / "drape" / "objects").exists()  # nothing went to the local default
    assert_live_invariant(config)
