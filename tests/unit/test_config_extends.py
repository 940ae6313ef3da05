"""`extends:` in config files (drape/config/reading/extends.py): overlays merge in order under the file's own
keys, and every path, cycle and depth beyond the bounds is refused naming the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from drape.config import ConfigError, load_config, read_config_data
from drape.config.reading.extends import MAX_EXTENDS_DEPTH, MAX_EXTENDS_FILES
from tests.conftest import TINY


def _write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def test_parents_merge_in_order_then_the_file_s_own_keys(tmp_path):
    _write(tmp_path / "a.yaml", {"name": "a", "seed": 1, "train": {"lr": 0.1, "batch_size": 4}})
    _write(tmp_path / "parts" / "b.yaml", {"name": "b", "train": {"lr": 0.2}})
    top = _write(tmp_path / "top.yaml", {"extends": ["a.yaml", "parts/b.yaml"], "seed": 3})
    assert read_config_data(top) == {"name": "b", "seed": 3, "train": {"lr": 0.2, "batch_size": 4}}


def test_one_name_a_chain_and_a_nested_file_extending_its_siblings(tmp_path):
    _write(tmp_path / "base.yaml", {"seed": 5, "name": "base"})
    _write(tmp_path / "models" / "m.yaml", {"extends": "../base.yaml", "name": "m"})  # inside the top file's folder
    top = _write(tmp_path / "top.yaml", {"extends": "models/m.yaml"})
    assert read_config_data(top) == {"seed": 5, "name": "m"}


def test_a_tiny_config_split_in_two_loads_as_the_whole(tmp_path):
    whole = yaml.safe_load(TINY.read_text())
    gates = whole.pop("gates")
    _write(tmp_path / "gates.yaml", {"gates": gates})
    top = _write(tmp_path / "tiny.yaml", {"extends": "gates.yaml", **whole})
    assert load_config(top) == load_config(TINY)


@pytest.mark.parametrize("name", ["../outside.yaml", "/etc/hostname", "sub/../../outside.yaml"])
def test_a_path_outside_the_configs_root_and_the_file_s_folder_is_refused(tmp_path, name):
    _write(tmp_path / "outside.yaml", {"seed": 1})
    top = _write(tmp_path / "inside" / "top.yaml", {"extends": name})
    with pytest.raises(ConfigError, match=r"top\.yaml: extends: .* outside the folders a config may extend from"):
        read_config_data(top)


def test_a_symlink_out_of_the_folder_is_refused(tmp_path):
    _write(tmp_path / "outside.yaml", {"seed": 1})
    (tmp_path / "inside").mkdir()
    (tmp_path / "inside" / "link.yaml").symlink_to(tmp_path / "outside.yaml")
    top = _write(tmp_path / "inside" / "top.yaml", {"extends": "link.yaml"})
    with pytest.raises(ConfigError, match="outside the folders"):
        read_config_data(top)


def test_a_cycle_is_refused_naming_the_chain(tmp_path):
    _write(tmp_path / "a.yaml", {"extends": "b.yaml"})
    _write(tmp_path / "b.yaml", {"extends": "a.yaml"})
    with pytest.raises(ConfigError, match=r"b\.yaml: extends: a cycle: .*a\.yaml → .*b\.yaml → .*a\.yaml"):
        read_config_data(tmp_path / "a.yaml")
    _write(tmp_path / "self.yaml", {"extends": "self.yaml"})
    with pytest.raises(ConfigError, match="a cycle"):
        read_config_data(tmp_path / "self.yaml")


def test_a_diamond_is_no_cycle(tmp_path):
    _write(tmp_path / "base.yaml", {"seed": 1})
    _write(tmp_path / "left.yaml", {"extends": "base.yaml", "name": "left"})
    _write(tmp_path / "right.yaml", {"extends": "base.yaml", "name": "right"})
    top = _write(tmp_path / "top.yaml", {"extends": ["left.yaml", "right.yaml"]})
    assert read_config_data(top) == {"seed": 1, "name": "right"}


def test_depth_and_fan_out_are_bounded(tmp_path):
    for level in range(MAX_EXTENDS_DEPTH + 1):
        _write(tmp_path / f"{level}.yaml", {"extends": f"{level + 1}.yaml"} if level < MAX_EXTENDS_DEPTH else {"seed": 1})
    with pytest.raises(ConfigError, match=f"extends: deeper than {MAX_EXTENDS_DEPTH} files: .*0.yaml → .*1.yaml"):
        read_config_data(tmp_path / "0.yaml")
    assert read_config_data(tmp_path / "1.yaml") == {"seed": 1}  # exactly the bound: fine
    # each level names the next one 4 times: 4^4 reads, each a diamond and none a cycle
    for level in range(4):
        _write(tmp_path / f"fan{level}.yaml", {"extends": [f"fan{level + 1}.yaml"] * 4})
    _write(tmp_path / "fan4.yaml", {"seed": 1})
    with pytest.raises(ConfigError, match=f"more than {MAX_EXTENDS_FILES} files"):
        read_config_data(tmp_path / "fan0.yaml")


@pytest.mark.parametrize("value", [[], [""], 3, {"a": "b.yaml"}, [None]])
def test_extends_must_name_files(tmp_path, value):
    top = _write(tmp_path / "top.yaml", {"extends": value})
    with pytest.raises(ConfigError, match=r"top\.yaml: extends: expected a file name or a list of file names"):
        read_config_data(top)


def test_a_missing_unreadable_or_unbounded_parent_names_itself(tmp_path):
    top = _write(tmp_path / "top.yaml", {"extends": "missing.yaml"})
    with pytest.raises(ConfigError, match=r"missing\.yaml: config file not found"):
        read_config_data(top)
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    _write(top, {"extends": "list.yaml"})
    with pytest.raises(ConfigError, match=r"list\.yaml: expected a YAML mapping at the top level, got list"):
        read_config_data(top)
    bomb = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]  # a billion laughs: 10^7 nodes in a few hundred bytes
    bomb += [f"a{level}: &a{level} [{', '.join([f'*a{level - 1}'] * 10)}]" for level in range(1, 7)]
    (tmp_path / "bomb.yaml").write_text("\n".join(bomb) + "\n")
    _write(top, {"extends": "bomb.yaml"})
    with pytest.raises(ConfigError, match=r"bomb\.yaml: its YAML aliases expand to more than"):
        read_config_data(top)


def test_the_cli_exits_2_naming_the_file_and_the_field(tmp_path):
    from typer.testing import CliRunner

    from drape.cli import app

    _write(tmp_path / "a.yaml", {"extends": "top.yaml"})
    top = _write(tmp_path / "top.yaml", {"extends": "a.yaml"})
    result = CliRunner().invoke(app, ["model", "describe", "--config", str(top)], env={"COLUMNS": "240"})
    assert result.exit_code == 2, result.output
    assert "config error" in result.output and "extends: a cycle" in result.output
