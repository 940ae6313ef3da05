"""The `drape` command: its public surface (commands, flags, flow parameters) and its errors."""

import inspect

from typer.testing import CliRunner

from drape.cli import app

runner = CliRunner()

# Public surface: changing any of these breaks users' scripts and deployments. Update on purpose.
EXPECTED_COMMANDS = {
    "demo": ["run_name"],
    "run": ["config", "mode", "run_name"],
    "train": ["config", "stage", "init", "out"],
    "data synth": ["config", "out"],
}
EXPECTED_FLOW_PARAMETERS = ["config_path", "mode", "run_name"]


def _commands(group, prefix=""):
    import typer.main

    click_group = typer.main.get_command(group)
    found = {}

    def walk(command, name):
        if hasattr(command, "commands"):
            for child_name, child in command.commands.items():
                walk(child, f"{name} {child_name}".strip())
        else:
            found[name] = sorted(p.name for p in command.params)

    walk(click_group, prefix)
    return found


def test_cli_surface_is_unchanged():
    assert _commands(app) == {name: sorted(params) for name, params in EXPECTED_COMMANDS.items()}


def test_flow_parameters_are_unchanged():
    from flows.staged_training import staged_training

    assert list(inspect.signature(staged_training.fn).parameters) == EXPECTED_FLOW_PARAMETERS


def test_bad_config_exits_2_naming_file_and_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  batch_size: -1\n  stages: {}\n")
    result = runner.invoke(app, ["run", "--config", str(bad)])
    assert result.exit_code == 2
    assert str(bad) in result.output and "train.batch_size" in result.output


def test_bad_mode_exits_2(tmp_path):
    result = runner.invoke(app, ["run", "--config", "configs/demo.yaml", "--mode", "sideways"])
    assert result.exit_code == 2 and "--mode must be" in result.output


def test_data_synth_writes_shards_and_manifest(tmp_path):
    import json

    from tests.conftest import TINY

    out = tmp_path / "shards"
    result = runner.invoke(app, ["data", "synth", "--config", str(TINY), "--out", str(out)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["splits"]) == {"identity", "texture", "geometry", "denoise", "control"}
    assert all((out / shard["path"]).is_file() for shards in manifest["splits"].values() for shard in shards)
    assert manifest["control_set"].startswith("control-")
