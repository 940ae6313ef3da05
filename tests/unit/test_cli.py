"""The `drape` command: its public surface (commands, flags, flow parameters) and its errors."""

import inspect

import pytest
from typer.testing import CliRunner

from drape.cli import app
from tests.conftest import SENTINEL

runner = CliRunner()

# Public surface: changing any of these breaks users' scripts and deployments. Update on purpose.
EXPECTED_COMMANDS = {
    "demo": ["run_name"],
    "serve": ["port", "home"],
    "run": ["config", "mode", "resume", "run_name"],
    "train": ["config", "stage", "init", "out"],
    "data synth": ["config", "out"],
    "data shard": [
        "source",
        "out",
        "config",
        "name",
        "version",
        "control",
        "weights",
        "shard_max_bytes",
        "shard_max_samples",
        "allow_paired_as_unpaired",
    ],
    "data encode": ["config", "batch_size"],
    "data prestage": ["stage", "config", "keep"],
    "gate check": ["control", "outputs", "baseline_outputs", "config", "stage", "report"],
    "gate calibrate": [
        "config",
        "samples",
        "control",
        "outputs",
        "baseline_outputs",
        "stage",
        "false_alarm",
        "redraws",
        "nuisance",
        "suite",
        "drift_margin",
        "warp_margin",
        "text_margin",
        "write",
    ],
    "queue submit": [
        "kind",
        "mem_gib",
        "duration",
        "gpus",
        "priority",
        "stage",
        "gpu_model",
        "exclusive",
        "share",
        "preemptible",
        "checkpoint_every",
        "config",
    ],
    "queue list": ["config", "state", "limit"],
    "queue cancel": ["job_id", "config"],
    "queue dispatch": ["config", "once", "metrics_port"],
    "queue profile": ["config"],
    "queue simulate": ["trace", "fleet", "policy", "config"],
    "queue sbatch": ["config", "stage", "nodes", "python"],
    "queue trace": ["out", "since_hours", "config"],
    "queue kueue": ["fleet", "local_queue", "cluster_queue", "config"],
    "queue render": ["gpus", "nodes", "mem_gib", "shared", "sharing", "dra", "config"],
    "model describe": ["config"],
    "tryon": ["config", "inputs", "model", "out", "seed", "shopper", "variant"],
    "eval": ["config", "mode", "split", "version"],
    "shopper photos": ["config", "count", "first", "identity", "out"],
    "shopper personalize": ["base", "config", "consent_days", "holdout", "photos", "shopper"],
    "shopper list": ["config"],
    "shopper forget": ["config", "expired", "shopper"],
    "bench inference": ["config", "inputs", "model", "queue", "runs", "variant"],
    "model export": ["checkpoint", "format", "out"],
    "model fit-vae": ["out", "config", "steps", "samples"],
    "storage apply-lifecycle": ["config"],
    "storage report": ["config"],
    "storage sweep": ["allow_unregistered", "config", "dry_run"],
    "storage restore": ["run_id", "stage", "config", "out"],
    "cost report": ["as_json", "config", "plan", "run_id"],
    "cost compare": ["config", "plan", "run_id"],
    "cost fleet": ["config", "window_hours"],
    "cost scaling": ["config", "ranks", "repeats", "stage", "steps"],
    "cost estimate": ["config", "efficiency", "like", "like_config", "model", "step_seconds"],
}
EXPECTED_ROOT_OPTIONS = ["install_completion", "show_completion", "site"]  # drape --site FILE <command>
EXPECTED_FLOW_PARAMETERS = {
    "staged_training": ["config_path", "mode", "run_name", "resume"],
    "prestage_dataset": ["config_path", "stages"],
    "retention_sweep": ["config_path", "dry_run"],
    "queue_dispatcher": ["config_path", "max_minutes", "metrics_port"],
}


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
    import typer.main

    assert _commands(app) == {name: sorted(params) for name, params in EXPECTED_COMMANDS.items()}
    assert sorted(p.name for p in typer.main.get_command(app).params) == EXPECTED_ROOT_OPTIONS


def test_production_configs_take_the_site_file_from_site_or_drape_site(tmp_path):
    from pathlib import Path

    from drape.config import EXAMPLE_SITE

    h100 = str(Path(__file__).resolve().parents[2] / "configs" / "h100.yaml")
    unset = {"DRAPE_SITE": None, "COLUMNS": "240"}  # restored after each invocation
    result = runner.invoke(app, ["model", "describe", "--config", h100], env=unset)
    assert result.exit_code == 2 and "site: this config takes its site values" in result.output, result.output
    assert "configs/site.example.yaml" in result.output and "DRAPE_SITE" in result.output
    result = runner.invoke(app, ["--site", str(EXAMPLE_SITE), "model", "describe", "--config", h100], env=unset)
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["model", "describe", "--config", h100], env={**unset, "DRAPE_SITE": str(EXAMPLE_SITE)})
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["--site", str(tmp_path / "absent.yaml"), "model", "describe", "--config", h100], env=unset)
    assert result.exit_code == 2 and "absent.yaml: site file not found" in result.output, result.output


def test_flow_parameters_are_unchanged():
    import importlib

    for name, parameters in EXPECTED_FLOW_PARAMETERS.items():
        flow = getattr(importlib.import_module(f"flows.{name}"), name)
        assert list(inspect.signature(flow.fn).parameters) == parameters, name


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


def test_data_synth_publishes_to_the_store_whatever_data_source_says(tmp_path):
    """Generating the synthetic dataset is what the command is for: data.source: store (the
    default) refuses to generate a missing dataset for a run, not for `drape data synth`."""
    import yaml

    from drape.config import load_config
    from drape.data.dataset import dataset_prefix, ensure_dataset
    from drape.storage.store import open_store
    from tests.conftest import TINY

    data = yaml.safe_load(TINY.read_text())
    data["paths"] = {"root": str(tmp_path / "drape")}
    sizes = dict.fromkeys(data["data"]["synthetic"]["samples_per_stage"], 4)
    data["data"] |= {"source": "store", "synthetic": {"samples_per_stage": sizes}, "control_samples": 2}
    path = tmp_path / "store.yaml"
    path.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["data", "synth", "--config", str(path)])
    assert result.exit_code == 0, result.output
    config = load_config(path)
    assert config.data.source == "store"
    assert ensure_dataset(config, open_store(config))["source"]["generator"] == "drape.data.synth"
    assert dataset_prefix(config) in result.output


def _write_outputs(folder, control, images):
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    for key, image in zip(control["keys"], images):
        Image.fromarray(image).save(folder / f"{key}.png")


def test_gate_check_exit_codes(tiny_dataset, tmp_path):
    import json

    import numpy as np

    from drape.data.dataset import load_control_dir
    from tests.conftest import TINY

    directory, manifest, _ = tiny_dataset
    control, control_set = load_control_dir(directory)
    assert control_set == manifest["control_set"]
    _write_outputs(tmp_path / "good", control, control["target"])
    _write_outputs(tmp_path / "grey", control, np.full_like(control["target"], 128))
    args = ["gate", "check", "--control", str(directory), "--config", str(TINY)]
    good = runner.invoke(app, [*args, "--outputs", str(tmp_path / "good"), "--report", str(tmp_path / "r.json")])
    assert good.exit_code == 0, good.output
    assert json.loads((tmp_path / "r.json").read_text())["verdict"] == "pass"
    grey = runner.invoke(app, [*args, "--outputs", str(tmp_path / "grey")])
    assert grey.exit_code == 1 and "identity: lower bound" in grey.output
    (tmp_path / "good" / f"{control['keys'][0]}.png").unlink()
    missing = runner.invoke(app, [*args, "--outputs", str(tmp_path / "good")])
    assert missing.exit_code == 2 and control["keys"][0] in missing.output
    nowhere = runner.invoke(app, ["gate", "check", "--control", str(tmp_path), "--outputs", str(tmp_path / "grey")])
    assert nowhere.exit_code == 2 and "expected a dataset root" in nowhere.output


def test_gate_check_on_a_folder_of_shards(tiny_dataset, tmp_path):
    from drape.data.dataset import load_control_dir

    directory, manifest, _ = tiny_dataset
    from_folder, control_set = load_control_dir(directory / "control")
    assert control_set == manifest["control_set"] and len(from_folder["keys"]) == 6


def test_gate_calibrate_prints_the_gate_thresholds_a_config_takes(tiny_dataset, tmp_path):
    import re

    from drape.data.dataset import load_control_dir
    from tests.conftest import TINY

    directory, _, _ = tiny_dataset
    control, _ = load_control_dir(directory)
    _write_outputs(tmp_path / "trained", control, control["target"])
    args = [
        "gate",
        "calibrate",
        "--control",
        str(directory),
        "--config",
        str(TINY),
        "--outputs",
        str(tmp_path / "trained"),
        "--redraws",
        "40",
    ]
    result = runner.invoke(app, [*args, "--baseline-outputs", str(tmp_path / "trained"), "--stage", "texture"])
    assert result.exit_code == 0, result.output
    assert "gate level" in result.output and "min_score_vs_baseline:" in result.output
    value = float(re.search(r"gates\.identity\.min_similarity: ([0-9.]+)", result.output).group(1))
    assert 0.5 < value < 1.0  # a perfect model's outputs, JPEG'd: the threshold sits just under them
    assert runner.invoke(app, [*args, "--stage", "polish"]).exit_code == 2
    (tmp_path / "trained" / f"{control['keys'][0]}.png").unlink()
    missing = runner.invoke(app, args)
    assert missing.exit_code == 2 and control["keys"][0] in missing.output


def test_the_trainer_command_line_is_unchanged():
    """`python -m drape.train`: what queue jobs, torchrun and operators call (--job: additions only)."""
    from drape.training.jobs.stage_job import _parser

    options = {option for action in _parser()._actions for option in action.option_strings}
    assert options == {
        "-h",
        "--help",
        "--job",
        "--store-endpoint",
        "--config",
        "--stage",
        "--out",
        "--init",
        "--mode",
        "--result",
        "--mlflow-run",
        "--run-id",
    }


def test_errors_are_shown_as_written_not_read_as_markup(tmp_path):
    """Config errors name fields like `train.stages.polish.[key]`; rich must not take `[key]` for a style."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  stages:\n    polish: {steps: 1, trainable: ['*']}\n")
    result = runner.invoke(app, ["run", "--config", str(bad)])
    assert result.exit_code == 2 and "train.stages.polish.[key]" in result.output and "got 'polish'" in result.output


def test_gate_calibrate_on_the_nuisance_suite_measures_the_regressions_too():
    from tests.conftest import TINY

    args = ["gate", "calibrate", "--config", str(TINY), "--samples", "4", "--redraws", "20", "--nuisance"]
    result = runner.invoke(app, [*args, "--suite", "wide"], env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    assert "jpeg q60" in result.output and "regression: look-alike letters" in result.output
    assert "denoise + resampled 0.8 + shift 1 px" in result.output  # the wide harmless suite's kinds too
    wrong = runner.invoke(app, [*args, "--suite", "narrow"])
    assert wrong.exit_code == 2 and "--suite" in wrong.output and "expected 'standard' or 'wide'" in wrong.output


def test_queue_profile_of_the_production_config_prints_estimates_without_its_database():
    from tests.conftest import TESTS

    result = runner.invoke(
        app, ["queue", "profile", "--config", str(TESTS.parent / "configs" / "h100.yaml")], env={"COLUMNS": "240"}
    )
    assert result.exit_code == 0, result.output
    assert "unreachable" in result.output and "estimates only" in result.output  # the scheduler's database is not here
    assert "1024×768 px" in result.output and "(LoRA)" in result.output and "finetune" in result.output
    assert "personalization" in result.output  # a shopper's adapter has its own profile


# --- errors: one redacted line; absurd flags are usage errors -------------------------------------
def test_cli_errors_are_one_redacted_line(tmp_path, monkeypatch):
    result = CliRunner().invoke(app, ["data", "shard", "synthetic", "--out", f"s3://AKIA:{SENTINEL}@bucket/x"])
    assert result.exit_code == 1 and SENTINEL not in result.output and "must not carry credentials" in result.output
    control = tmp_path / "outputs"
    control.mkdir()
    (control / "junk.png").write_text("not a png")
    from drape.gates.run import read_outputs

    with pytest.raises(ValueError, match="not a readable PNG"):
        read_outputs(control, ["junk"])


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["cost", "fleet", "--hours", "inf"], "--hours: expected a finite number"),
        (["cost", "fleet", "--hours", "1e300"], "--hours: 1e+300 is beyond"),
        (["queue", "submit", "--kind", "stage-training", "--mem-gib", "1e30", "--", "true"], "--mem-gib: 1e+30 is beyond"),
        (["queue", "submit", "--kind", "stage-training", "--mem-gib", "8", "--duration", "nan", "--", "true"], "finite"),
    ],
)
def test_absurd_or_non_finite_cli_flags_are_usage_errors_naming_the_flag(tmp_path, monkeypatch, args, said):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args, terminal_width=200)
    assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
    assert not (tmp_path / ".drape").exists()  # refused before anything was opened or queued
