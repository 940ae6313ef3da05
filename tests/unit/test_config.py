"""Config loading: good files load, bad ones fail naming the file, the field and the reason (credentials
in a URL, never echoed; absurd or non-finite numbers; control characters; YAML bombs)."""

import json
import math
import time
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from drape import STAGES
from drape.config import EXAMPLE_SITE, SITE_FIELDS, ConfigError, deep_merge, load_config, parse_config, read_config_data
from tests.conftest import SENTINEL, TINY, tiny_config

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["demo.yaml", "h100.yaml", "rehearsal.yaml", "fitdit.yaml"])
def test_shipped_configs_load(name):
    config = load_config(REPO / "configs" / name)
    assert set(config.train.stages) == set(STAGES)
    for stage in STAGES:
        assert all(value is not None for value in config.gates.thresholds(stage).values())


def test_h100_is_the_production_shape():
    config = load_config(REPO / "configs" / "h100.yaml")
    assert config.train.precision == "bf16"
    assert sum(stage.steps for stage in config.train.stages.values()) == 50_000
    assert all(500 <= stage.finetune_steps <= 600 for stage in config.train.stages.values())
    assert config.data.height >= 512 and config.data.width >= 512
    assert all(config.train.gpus_for(stage) == 8 for stage in STAGES) and config.queue.max_attempts > 1


def test_rehearsal_makes_the_production_choices_at_cpu_size():
    config, fitdit = load_config(REPO / "configs" / "rehearsal.yaml"), load_config(REPO / "configs" / "fitdit.yaml")
    assert config.train.gpus == 2 and config.train.data_partitions == 2 and config.train.device == "cpu"
    for field in ("parallelism", "async_checkpoint"):  # the sharded path: FSDP ranks, DCP checkpoints in the background
        assert getattr(config.train, field) == getattr(fitdit.train, field), field
    assert config.storage.object_store_url.startswith("s3://") and config.queue.url.startswith("postgresql")
    assert config.tracking.uri.startswith("http") and not config.queue.dispatch_in_process


def test_stage_jobs_must_split_the_batch_and_the_partitions(config):
    data = config.model_dump(mode="json")
    data["train"] |= {"gpus": 3, "batch_size": 16}
    with pytest.raises(ConfigError, match="train.batch_size 16 does not split over identity's 3 GPUs"):
        parse_config(data, "x.yaml")
    data["train"] |= {"gpus": 2, "data_partitions": 3}
    with pytest.raises(ConfigError, match="train.data_partitions 3 is not a multiple of identity's 2 GPUs"):
        parse_config(data, "x.yaml")
    data["train"] |= {"gpus": 1, "data_partitions": 2}
    data["train"]["stages"]["texture"]["gpus"] = 2
    assert parse_config(data, "x.yaml").train.gpus_for("texture") == 2


def test_a_stage_job_asks_for_its_gpus_runs_under_torchrun_and_names_its_paths(config):
    import json

    from scheduler.jobs.training import train_job_spec

    two = config.model_copy(update={"train": config.train.model_copy(update={"gpus": 2})})
    spec = train_job_spec(two, stage="texture", mode="full", run_id="r1", command=["python", "-m", "drape.train"])
    assert spec.gpus == 2 and spec.labels["launch"] == "torchrun" and spec.labels["run"] == "r1"
    assert json.loads(spec.labels["mounts"]) == [str(Path(config.paths.root).resolve())]
    assert json.loads(spec.labels["models"]) == []  # no VAE path, no ONNX embedder: nothing to mount read-only
    assert spec.shape.endswith("/2gpu")


def _write(tmp_path, text):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


def test_bad_value_names_file_field_and_reason(tmp_path):
    demo = (REPO / "configs" / "demo.yaml").read_text().replace("steps: 250", "steps: -5", 1)
    path = _write(tmp_path, demo)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert str(path) in message
    assert "train.stages.texture.steps" in message
    assert "greater than 0" in message and "-5" in message


def test_unknown_key_is_an_error(tmp_path):
    path = _write(tmp_path, (REPO / "configs" / "demo.yaml").read_text() + "\ntrian: {}\n")
    with pytest.raises(ConfigError, match=r"trian: Extra inputs are not permitted"):
        load_config(path)


def test_missing_stage_is_an_error(tmp_path):
    text = "train:\n  stages:\n    identity: {steps: 1, trainable: ['*']}\n"
    with pytest.raises(ConfigError, match=r"train: Value error, stages must configure every stage; missing \['texture'"):
        load_config(_write(tmp_path, text))


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_write(tmp_path, "train: [unclosed"))
    with pytest.raises(ConfigError, match="expected a YAML mapping"):
        load_config(_write(tmp_path, "- a\n- b\n"))


def test_patch_size_must_divide_resolution(tmp_path):
    text = (REPO / "configs" / "demo.yaml").read_text().replace("resolution: 64", "resolution: 66")
    with pytest.raises(ConfigError, match="model.patch_size 4 must divide data.resolution height 66"):
        load_config(_write(tmp_path, text))


def test_onnx_embedder_needs_a_path_and_webhook_is_never_inline(config):
    from drape.config import AlertsConfig, IdentityGateConfig

    with pytest.raises(ValueError, match="needs onnx_model_path"):
        IdentityGateConfig(embedder="onnx")
    with pytest.raises(ValueError, match="names an environment variable"):
        AlertsConfig(slack_webhook_env="https://hooks.slack.com/services/T000/B000/XXX")


def test_per_stage_thresholds(config):
    data = config.model_dump(mode="json")
    data["gates"]["coherence"].update(min_score={"identity": 0.1, "texture": 0.2}, min_score_vs_baseline=None)
    parsed = parse_config(data)
    assert parsed.gates.thresholds("identity")["coherence"] == 0.1
    assert parsed.gates.thresholds("denoise")["coherence"] is None  # not configured: blocks promotion
    assert parsed.gates.thresholds("identity", vs_baseline=True)["coherence"] == 0.1  # no separate one: min_score


def test_coherence_against_a_baseline_has_its_own_threshold(config):
    from drape.config import GatesConfig

    gates = GatesConfig.model_validate(
        {"coherence": {"min_score": {"identity": 0.18, "texture": 0.3}, "min_score_vs_baseline": 0.45}}
    )
    assert gates.thresholds("texture")["coherence"] == 0.3
    assert gates.thresholds("texture", vs_baseline=True)["coherence"] == 0.45


def test_the_synthetic_generator_s_fields_moved_under_data_synthetic(tmp_path):
    text = (REPO / "configs" / "demo.yaml").read_text()
    assert load_config(_write(tmp_path, text)).data.synthetic.num_identities == 24
    flat = text.replace("  synthetic:                        # what the generator draws (drape.data.synth)\n", "").replace(
        "\n    num_", "\n  num_"
    )
    flat = flat.replace("\n    samples_per_stage", "\n  samples_per_stage")
    with pytest.raises(ConfigError) as error:
        load_config(_write(tmp_path, flat))
    message = str(error.value)
    assert message.startswith(f"{tmp_path / 'bad.yaml'}: data: ")
    for name in ("num_identities", "num_garments", "samples_per_stage"):
        assert f"data.{name} moved to data.synthetic.{name}" in message
    with pytest.raises(ConfigError, match=r"data\.synthetic: Value error, samples_per_stage needs a positive count"):
        load_config(_write(tmp_path, text.replace("identity: 192,", "identity: 0,")))


def _models_in(annotation):
    """The pydantic models an annotation holds (itself, or inside Optional, list, dict, …)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for argument in typing.get_args(annotation):
        yield from _models_in(argument)


def test_every_config_field_is_described():
    """Every field of every model reachable from PipelineConfig says what it is (the config reference
    prints it: docs/reference/config.md)."""
    from drape.config import PipelineConfig

    undescribed, seen, todo = [], {PipelineConfig}, [(PipelineConfig, "")]
    while todo:
        model, path = todo.pop()
        for name, field in model.model_fields.items():
            key = f"{path}{field.alias or name}"
            if not (field.description or "").strip():
                undescribed.append(f"{key} ({model.__module__}.{model.__name__}.{name})")
            for nested in _models_in(field.annotation):
                if nested not in seen:
                    seen.add(nested)
                    todo.append((nested, f"{key}."))
    assert len(seen) > 30  # the walk reached the nested sections
    assert not undescribed, "config fields without a description: " + ", ".join(sorted(undescribed))


PRODUCTION = ("h100", "slurm", "fitdit")
SHARED = ("seed", "data", "train", "gates", "retention", "alerts", "storage", "paths", "cost", "eval", "shoppers")


def _production(name: str) -> dict:
    return load_config(REPO / "configs" / f"{name}.yaml", site=EXAMPLE_SITE).model_dump(mode="json", by_alias=True)


def _without(dump: dict, fields: tuple[str, ...]) -> dict:
    """`dump` without the dotted `fields` (what an overlay overrides on purpose)."""
    dump = json.loads(json.dumps(dump))
    for field in fields:
        *sections, name = field.split(".")
        inner = dump
        for section in sections:
            inner = inner.get(section, {})
        inner.pop(name, None)
    return dump


# what each recipe and cluster overrides on purpose; everything else of the shared sections is the base's
RECIPE_FIELDS = (
    "data.version",
    "train.parallelism",
    "train.lr",
    "train.lora",
    "train.cfg_dropout",
    *(f"train.stages.{stage}.trainable" for stage in STAGES),
)


def test_production_configs_share_the_base_where_they_should():
    h100, slurm, fitdit = (_production(name) for name in PRODUCTION)
    for section in SHARED:
        assert h100[section] == slurm[section], f"h100 and slurm differ in {section}: the same run on another cluster"
    for name, dump in (("slurm", slurm), ("fitdit", fitdit)):
        for section in ("gates", "retention", "alerts", "storage", "paths", "cost", "seed"):
            assert dump[section] == h100[section], (
                f"{name} and h100 differ in {section}: it belongs in configs/base/production.yaml"
            )
    assert _without(fitdit["data"], ("version",)) == _without(h100["data"], ("version",))
    assert _without({"train": fitdit["train"]}, RECIPE_FIELDS) == _without({"train": h100["train"]}, RECIPE_FIELDS)
    for name, dump in (("h100", h100), ("slurm", slurm), ("fitdit", fitdit)):  # and agree with the queue's durability
        queue = dump["queue"]
        assert (queue["enabled"], queue["dispatch_in_process"], queue["max_attempts"], queue["lease_seconds"]) == (
            True,
            False,
            3,
            120,
        ), name
    assert h100["queue"] == fitdit["queue"] and h100["model"] == _production("slurm")["model"]


def _tracked_production_files() -> list[Path]:
    """Every file a production config is made of, its `extends:` chain followed."""
    files, todo = [], [REPO / "configs" / f"{name}.yaml" for name in PRODUCTION]
    while todo:
        path = todo.pop().resolve()
        if path not in files:
            files.append(path)
            named = yaml.safe_load(path.read_text()).get("extends") or []
            todo += [path.parent / name for name in ([named] if isinstance(named, str) else named)]
    return files


def _set_fields(data: object, at: str = "") -> list[tuple[str, object]]:
    if isinstance(data, dict):
        return [found for key, value in data.items() for found in _set_fields(value, f"{at}.{key}" if at else str(key))]
    return [(at, data)]


def test_tracked_production_configs_hold_no_site_values():
    files = _tracked_production_files()
    assert {path.relative_to(REPO / "configs").as_posix() for path in files} >= {
        "h100.yaml",
        "base/production.yaml",
        "models/catvton.yaml",
        "clusters/slurm.yaml",
    }
    for path in files:
        data = yaml.safe_load(path.read_text())
        declared = data.pop("site", {})
        assert set(declared) <= set(SITE_FIELDS), path
        for field, value in _set_fields(data):
            assert not any(field == site or field.startswith(f"{site}.") for site in SITE_FIELDS), (
                f"{path}: {field} is a site value"
            )
            for text in value if isinstance(value, list) else [value]:
                if not isinstance(text, str):
                    continue
                assert "://" not in text, f"{path}: {field}: {text!r} is an endpoint: a site value"
                # absolute paths are the recipes' weights, where the job template mounts /models
                assert not text.startswith("/") or field in ("model.denoiser.path", "model.vae.path"), f"{path}: {field}"


def test_every_site_value_a_production_config_takes_is_declared_by_the_base_or_its_cluster():
    from drape.config.reading.site import declared_site_fields

    for name in PRODUCTION:
        declared = declared_site_fields(read_config_data(REPO / "configs" / f"{name}.yaml"), name)
        required = {field for field, need in declared.items() if need == "required"}
        assert {"paths.root", "storage.object_store_url", "tracking.uri", "queue.url", "data.cache.dir"} <= required, name
        assert ("queue.kubernetes.image" in required) == (name != "slurm") and ("queue.inventory" in required) == (
            name == "slurm"
        )


# --- credentials: no URL field may carry one, and no error echoes it ------------------------------
@pytest.mark.parametrize(
    ("section", "field", "url"),
    [
        ("queue", "url", f"postgresql://drape:{SENTINEL}@db:5432/queue"),
        ("tracking", "uri", f"http://user:{SENTINEL}@mlflow:5000"),
        ("metrics", "pushgateway_url", f"http://u:{SENTINEL}@pushgateway:9091"),
        ("queue", "prometheus_url", f"http://prom:9090/?token={SENTINEL}"),
        ("storage", "object_store_url", f"s3://AKIA:{SENTINEL}@bucket/drape"),
    ],
)
def test_no_config_url_may_carry_a_password_and_the_error_never_echoes_it(section, field, url):
    data = deep_merge(yaml.safe_load(TINY.read_text()), {section: {field: url}})
    with pytest.raises(ConfigError) as error:
        parse_config(data, "tiny.yaml")
    assert f"{section}.{field} must not carry credentials" in str(error.value)
    assert SENTINEL not in str(error.value)


def test_a_user_name_alone_is_not_a_secret(tmp_path):
    config = tiny_config(tmp_path, queue={"url": "postgresql://drape@db:5432/queue"})
    assert config.queue.url == "postgresql://drape@db:5432/queue"


def _config(**overrides):
    return parse_config(deep_merge(yaml.safe_load(TINY.read_text()), overrides), "tiny.yaml")


@pytest.mark.parametrize(
    "override",
    [
        {"inference": {"model": f"https://u:{SENTINEL}@registry/model"}},
        {"paths": {"root": f"s3://AKIA:{SENTINEL}@bucket/root"}},
        {"data": {"cache": {"dir": f"s3://u:{SENTINEL}@bucket/cache"}}},
        {"queue": {"kubernetes": {"image": f"https://u:{SENTINEL}@ghcr.io/x/drape:1.0"}}},
        {"model": {"vae": {"path": f"https://host/vae?token={SENTINEL}"}}},
    ],
)
def test_a_url_with_credentials_in_any_field_is_refused_at_load_redacted(override):
    with pytest.raises(ConfigError, match="must not carry credentials") as error:
        _config(**override)
    assert SENTINEL not in str(error.value)


# --- absurd and non-finite numbers, control characters --------------------------------------------
@pytest.mark.parametrize("threshold", [-1.0, 0.0, 1.5, math.nan])
def test_thresholds_outside_zero_one_are_refused(tmp_path, threshold):
    with pytest.raises(ConfigError, match="min_similarity"):
        tiny_config(tmp_path, gates={"identity": {"min_similarity": threshold}})


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"storage": {"read_timeout_seconds": math.inf}}, "read_timeout_seconds"),
        ({"storage": {"connect_timeout_seconds": 1e300}}, "connect_timeout_seconds"),
        ({"data": {"cache": {"budget_bytes": 10**30}}}, "budget_bytes"),
        ({"cost": {"horizon_months": math.inf}}, "horizon_months"),
        ({"train": {"lr": math.nan}}, "lr"),
        ({"queue": {"poll_seconds": 1e12}}, "poll_seconds"),
        ({"model": {"num_layers": 10**9}}, "num_layers"),
        ({"data": {"synthetic": {"num_identities": 10**15}}}, "num_identities"),
        ({"inference": {"gpu_memory_gib": 1e9}}, "gpu_memory_gib"),
        ({"cost": {"gpu_prices": {"H100-80GB": {"on_demand": 1e9, "reserved": 1.0, "burst": 1.0}}}}, "on_demand"),
    ],
)
def test_absurd_or_non_finite_config_numbers_are_refused_naming_the_field(override, field):
    with pytest.raises(ConfigError, match=field):
        _config(**override)


@pytest.mark.parametrize(
    "override",
    [
        {"name": "demo\n"},
        {"data": {"name": "synth-tryon\n"}},
        {"tracking": {"experiment": "drape\x1b[31m"}},
        {"queue": {"kubernetes": {"namespace": "drape\r"}}},
    ],
)
def test_config_names_with_control_characters_are_refused(override):
    with pytest.raises(ConfigError, match="control characters"):
        _config(**override)


# --- YAML bombs -----------------------------------------------------------------------------------
def _laughs(depth: int, key: str) -> str:
    rows = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    rows += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, depth)]
    return "\n".join([*rows, f"{key}: *l{depth - 1}", ""])


@pytest.mark.parametrize(
    ("text", "match"),
    [
        (_laughs(9, "train"), "expand to more than"),
        (_laughs(9, "name"), "expand to more than"),
        (_laughs(6, "train"), "expand to more than"),  # ~600,000 nodes: still far beyond a config
        ("a: &a [*a]\n", "recursive"),
        ("name: demo\n# " + "x" * (2 << 20) + "\n", "more than a config may hold"),
    ],
)
def test_a_yaml_bomb_is_refused_at_once(tmp_path, text, match):
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    started = time.monotonic()
    with pytest.raises(ConfigError, match=match):
        load_config(path)
    assert time.monotonic() - started < 2


def test_ordinary_anchors_still_load(tmp_path):
    from drape.config.reading.loading import read_yaml

    path = tmp_path / "anchors.yaml"
    path.write_text("common: &common {lr: 0.001, steps: 5}\nidentity: *common\ntexture: *common\n")
    assert read_yaml(path) == {name: {"lr": 0.001, "steps": 5} for name in ("common", "identity", "texture")}
