"""The prestage-dataset flow and `drape data prestage` fill the node's shard cache, verified."""

import yaml
from typer.testing import CliRunner

from drape.cli import app
from drape.data.cache import ShardCache
from drape.data.dataset import dataset_prefix, ensure_dataset
from drape.storage.store import open_store
from tests.conftest import tiny_config


def test_flow_and_cli_prestage(tmp_path, prefect_harness):
    from flows.prestage_dataset import prestage_dataset

    config = tiny_config(tmp_path / "drape")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    store = open_store(config)
    manifest = ensure_dataset(config, store)
    results = prestage_dataset(config_path=str(path), stages=["identity", "texture"])
    assert [r["stage"] for r in results] == ["identity", "texture"]
    cache = ShardCache.from_config(config, store, dataset_prefix(config), manifest)
    assert all(cache.is_local(s) for split in ("identity", "texture") for s in manifest["splits"][split])

    result = CliRunner().invoke(app, ["data", "prestage", "--stage", "geometry", "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert "geometry:" in result.output and all(cache.is_local(s) for s in manifest["splits"]["geometry"])
    tight = tmp_path / "tight.yaml"
    tight.write_text(
        yaml.safe_dump(
            config.model_copy(
                update={
                    "data": config.data.model_copy(update={"cache": config.data.cache.model_copy(update={"budget_bytes": 2**20})})
                }
            ).model_dump(mode="json")
        )
    )
    refused = CliRunner().invoke(
        app, ["data", "prestage", "--stage", "denoise", "--config", str(tight), "--keep", "control,identity,texture,geometry"]
    )
    assert refused.exit_code == 1 and "cannot hold what must stay" in refused.output
