"""Refusals that name the field or file and what was expected, never advise an unsafe retry, and end
without a traceback (issue 68): NaN on the CLI, a pickle where tensors were expected, JSON and YAML
nested or sized past any drape writes."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from drape.config.reading.loading import YamlBoundError, read_yaml
from drape.eval.features import load_lpips
from drape.jsonfile import MAX_JSON_DEPTH, JsonFileError, parse_json, read_json
from drape.torchfile import TorchFileError, load_tensors
from drape.training.jobs.stage_job import main as train_main


class _Payload:  # any class: unpickling it would run code of the file's choosing
    pass


@pytest.mark.parametrize("value, said", [("nan", "a finite number"), ("inf", "a finite number"), ("2000", "in [0.1, 1024]")])
def test_a_number_flag_says_what_was_expected_with_exit_2(value, said):
    from drape.cli import app

    result = CliRunner().invoke(app, ["queue", "render", "--mem-gib", value])
    output = " ".join(result.output.replace("│", " ").split())  # the message as read, out of its box
    assert result.exit_code == 2 and "--mem-gib" in output and said in output, output
    assert "less than or equal" not in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_a_pickle_in_lpips_backbone_path_is_refused_naming_field_and_file_never_advising_to_unpickle(tmp_path, how):
    path = tmp_path / "alexnet.pth"
    if how == "pickle":
        path.write_bytes(pickle.dumps({"features.0.weight": _Payload()}))
    else:
        torch.save({"features.0.weight": _Payload()}, path)
    with pytest.raises(TorchFileError) as refused:
        load_lpips(str(path))
    message = str(refused.value)
    assert f"eval.lpips_backbone_path {path}" in message and "a pickle of Python objects" in message
    assert "weights_only" not in message and "trust" not in message


def test_a_torch_file_of_tensors_loads_and_garbage_is_named(tmp_path):
    good, garbage = tmp_path / "good.pt", tmp_path / "bad.pt"
    torch.save({"w": torch.ones(2)}, good)
    garbage.write_bytes(b"not a torch file")
    assert torch.equal(load_tensors(good, "x")["w"], torch.ones(2))
    with pytest.raises(TorchFileError, match="field.x .*bad.pt: not a file of tensors only"):
        load_tensors(garbage, f"field.x {garbage}")


def test_json_nested_past_the_bound_names_the_file_not_a_recursion_error(tmp_path):
    deep = tmp_path / "job.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)  # past the interpreter's recursion limit
    with pytest.raises(JsonFileError, match=rf"{deep}: nested deeper than .*\({MAX_JSON_DEPTH} levels\)"):
        read_json(deep)
    shallow = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)  # parses, yet deeper than drape writes
    with pytest.raises(JsonFileError, match="nested deeper"):
        parse_json(shallow, "s3://bucket/x.json")
    assert parse_json("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, "ok") is not None


def test_drape_train_with_a_deeply_nested_job_file_exits_2_naming_it(tmp_path, capsys):
    deep = tmp_path / "job.json"
    deep.write_text(json.dumps({"schema": 1, "x": 0}).replace("0}", "[" * 100_000 + "]" * 100_000 + "}"))
    with pytest.raises(SystemExit) as ended:
        train_main(["--job", str(deep)])
    assert ended.value.code == 2
    said = capsys.readouterr().err
    assert f"cannot read the job file {deep}" in said and "nested deeper" in said and "Traceback" not in said


def test_yaml_nested_past_the_bound_names_the_file(tmp_path):
    for depth in (100_000, 70):
        path = Path(tmp_path / f"deep-{depth}.yaml")
        path.write_text("a: " + "[" * depth + "]" * depth)
        with pytest.raises(YamlBoundError, match=rf"{path}: nested deeper than a config may be"):
            read_yaml(path)
    fine = tmp_path / "fine.yaml"
    fine.write_text("a: " + "[" * 10 + "1" + "]" * 10)
    assert read_yaml(fine) is not None


def test_a_config_nested_past_the_bound_fails_at_load_as_a_config_error(tmp_path):
    from drape.config import ConfigError, load_config

    path = tmp_path / "deep.yaml"
    path.write_text("name: x\ntrain: " + "[" * 100_000 + "]" * 100_000)
    with pytest.raises((ConfigError, YamlBoundError), match=f"{path}: nested deeper"):
        load_config(path)
