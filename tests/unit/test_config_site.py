"""Site values (drape/config/reading/site.py): a production config takes the site values it declares from the
site file (DRAPE_SITE or `drape --site`), never from a tracked file; anything else is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from drape.config import EXAMPLE_SITE, SITE_ENV, SITE_FIELDS, ConfigError, PipelineConfig, load_config
from drape.config.reading.site import read_site
from tests.conftest import TINY

REPO = Path(__file__).resolve().parents[2]


def _config_taking(tmp_path: Path, site: dict) -> Path:
    """The tiny config with a `site:` directive."""
    data = yaml.safe_load(TINY.read_text())
    path = tmp_path / "takes-site.yaml"
    path.write_text(yaml.safe_dump({**data, "site": site}))
    return path


def _site(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_declared_fields_come_from_the_site_file_and_the_others_stay(tmp_path):
    config = _config_taking(tmp_path, {"storage.object_store_url": "required", "queue.slurm.partition": "optional"})
    site = _site(tmp_path, {"storage": {"object_store_url": "s3://bucket/x"}, "queue": {"inventory": "fleet.yaml"}})
    loaded = load_config(config, site=site)
    assert loaded.storage.object_store_url == "s3://bucket/x"
    assert loaded.queue.slurm.partition is None  # optional and unset: the config's value
    assert loaded.queue.inventory is None  # set by the site but not declared here: another config's


def test_the_environment_names_the_site_file(tmp_path, monkeypatch):
    config = _config_taking(tmp_path, {"queue.url": "required"})
    monkeypatch.setenv(SITE_ENV, str(_site(tmp_path, {"queue": {"url": "postgresql://drape@db:5432/q"}})))
    assert load_config(config).queue.url == "postgresql://drape@db:5432/q"


def test_no_site_file_for_a_config_that_takes_one_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.delenv(SITE_ENV, raising=False)
    config = _config_taking(tmp_path, {"paths.root": "required", "queue.url": "required"})
    with pytest.raises(
        ConfigError, match=r"takes-site\.yaml: site: .*\(paths\.root, queue\.url\).*copy configs/site\.example\.yaml.*DRAPE_SITE"
    ):
        load_config(config)


def test_a_required_value_the_site_lacks_names_both_files(tmp_path):
    config = _config_taking(tmp_path, {"paths.root": "required", "tracking.uri": "required"})
    site = _site(tmp_path, {"paths": {"root": "/data"}})
    with pytest.raises(ConfigError, match=r"takes-site\.yaml: site: the site file .*site\.yaml does not set tracking\.uri"):
        load_config(config, site=site)


@pytest.mark.parametrize(
    ("site", "field"),
    [
        ({"train": {"lr": 1.0}}, "train"),
        ({"storage": {"bucket": "x"}}, "storage.bucket"),
        ({"paths": {"rot": "/x"}}, "paths.rot"),
    ],
)
def test_a_site_file_holds_site_values_only(tmp_path, site, field):
    with pytest.raises(ConfigError, match=rf"site\.yaml: {field}: not a site value"):
        read_site(_site(tmp_path, site))


def test_a_config_declares_only_site_values_required_or_optional(tmp_path):
    site = _site(tmp_path, {})
    with pytest.raises(ConfigError, match=r"site: 'train\.lr' is not a site value"):
        load_config(_config_taking(tmp_path, {"train.lr": "required"}), site=site)
    with pytest.raises(ConfigError, match=r"site\.paths\.root: expected required or optional, got 'maybe'"):
        load_config(_config_taking(tmp_path, {"paths.root": "maybe"}), site=site)


def test_a_bad_site_value_fails_naming_the_config_and_the_site_file(tmp_path):
    config = _config_taking(tmp_path, {"queue.kubernetes.image": "required"})
    site = _site(tmp_path, {"queue": {"kubernetes": {"image": "ghcr.io/me/drape:latest"}}})
    with pytest.raises(ConfigError, match=r"takes-site\.yaml \(site values from .*site\.yaml\): queue\.kubernetes.*pinned"):
        load_config(config, site=site)


def test_a_config_that_takes_no_site_values_reads_no_site_file(tmp_path):
    assert load_config(REPO / "configs" / "demo.yaml", site=tmp_path / "absent.yaml").name == "demo"


def test_the_example_site_sets_every_site_value_a_production_config_requires():
    values = read_site(EXAMPLE_SITE)
    assert set(values) <= set(SITE_FIELDS)
    for name in ("h100", "slurm", "fitdit"):
        assert isinstance(load_config(REPO / "configs" / f"{name}.yaml", site=EXAMPLE_SITE), PipelineConfig)


def test_every_site_field_is_a_field_of_the_pipeline_config():
    for field in SITE_FIELDS:
        model = PipelineConfig
        *sections, name = field.split(".")
        for section in sections:
            model = model.model_fields[section].annotation  # type: ignore[assignment]
        assert name in model.model_fields, field
