"""Trust boundaries, third pass: each class of issue 51 with several variants, refused, named and harmless.

Classes here: symlinks in the shard cache (1), degenerate splits (2), URLs with credentials (3),
waits without bounds (5), absurd and non-finite numbers (6), YAML bombs (7), identifiers with
control characters (8), files named in errors (9), size mismatches at inference (10), and
children left behind on SIGTERM (11; `drape serve` itself: tests/integration/test_serve_signals.py).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from drape.config import ConfigError, deep_merge, load_config, parse_config
from drape.data.cache import CacheError, ShardCache
from drape.data.dataset import publish_dataset
from drape.data.partition import PartitionError, partition_shards
from drape.jsonfile import JsonFileError, read_json_object
from drape.layout import UnsafePathError, checkpoint_step, contained, safe_name, safe_shopper_id
from drape.ops.alerts import AlertError, post_to_slack
from drape.storage.store import ObjectStore
from tests.conftest import TINY, silent_endpoint, tiny_config

SENTINEL = "s3cr3t-SENTINEL-77aa"
PREFIX = "datasets/synth-tryon/v1"


def _config(**overrides):
    return parse_config(deep_merge(yaml.safe_load(TINY.read_text()), overrides), "tiny.yaml")


# --- 1. symlinks in the shard cache ------------------------------------------------------------
@pytest.fixture
def cache_parts(tiny_dataset, tmp_path):
    directory, manifest, _ = tiny_dataset
    store = ObjectStore(f"file://{tmp_path / 'objects'}")
    publish_dataset(directory, store, PREFIX)
    cache = ShardCache(tmp_path / "cache", store, PREFIX, manifest, budget_bytes=1 << 30)
    shard = manifest["splits"]["identity"][0]
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    return cache, shard, victim


@pytest.mark.parametrize("sidecar", ["part", "lock"])
def test_a_planted_sidecar_symlink_is_refused_and_never_written_through(cache_parts, sidecar):
    cache, shard, victim = cache_parts
    local = cache.dataset_dir / shard["path"]
    local.parent.mkdir(parents=True)
    link = local.with_name(f".{local.name}.{sidecar}")
    link.symlink_to(victim)
    with pytest.raises(CacheError, match=rf"\.{sidecar} is a symlink"):
        cache.fetch(shard)
    assert victim.read_text() == "precious"


def test_a_planted_marker_symlink_is_replaced_not_written_through(cache_parts):
    cache, shard, victim = cache_parts
    local = cache.dataset_dir / shard["path"]
    local.parent.mkdir(parents=True)
    (local.with_name(f".{local.name}.ok")).symlink_to(victim)
    assert cache.fetch(shard) == local and cache.is_local(shard)
    assert victim.read_text() == "precious" and not local.with_name(f".{local.name}.ok").is_symlink()


@pytest.mark.parametrize("where", ["dataset", "split", "pins"])
def test_a_cache_directory_symlinked_outside_the_root_is_refused(cache_parts, tmp_path, where):
    cache, shard, _ = cache_parts
    outside = tmp_path / "outside"
    outside.mkdir()
    link = {"dataset": cache.dataset_dir, "split": cache.dataset_dir / "identity", "pins": cache.root / ".pins"}[where]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError, match="outside"):
        if where == "pins":
            with cache.pin(["identity"]):
                pass
        else:
            cache.prestage("identity")
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("loop", ["shard", "split"])
def test_a_symlink_loop_is_refused_with_the_path_named(cache_parts, loop):
    cache, shard, _ = cache_parts
    split = cache.dataset_dir / "identity"
    if loop == "split":
        cache.dataset_dir.mkdir(parents=True)
        split.symlink_to("identity")
    else:
        split.mkdir(parents=True)
        (split / "a").symlink_to("b")
        (split / "b").symlink_to("a")
        (split / Path(shard["path"]).name).symlink_to("a")
    with pytest.raises(UnsafePathError, match="symlink loop") as error:
        cache.fetch(shard)
    assert shard["path"] in str(error.value)


def test_contained_names_a_loop_and_still_allows_links_inside(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    assert contained(tmp_path, "alias/x", "k") == tmp_path.resolve() / "alias" / "x"
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(UnsafePathError, match="'loop/x'.*symlink loop"):
        contained(tmp_path, "loop/x", "k")


# --- 2. degenerate splits ----------------------------------------------------------------------
def _with_split(manifest: dict, split: str, shards: list[dict]) -> dict:
    return {**manifest, "splits": {**manifest["splits"], split: shards}}


@pytest.mark.parametrize(
    ("split", "shards", "match"),
    [
        ("control", [], r"'control'.* 0 sample\(s\) in 0 shard.*at least 2"),
        ("control", "one", r"'control'.* 1 sample\(s\).*at least 2"),
        ("identity", [], r"'identity'.* 0 sample\(s\).*at least 1"),
        ("identity", "empty", r"'identity'.* 0 sample\(s\) in 2 shard.*at least 1"),
    ],
)
def test_an_empty_or_too_small_split_is_refused_with_its_minimum(tiny_dataset, tmp_path, split, shards, match):
    _, manifest, _ = tiny_dataset
    original = manifest["splits"][split]
    if shards == "one":
        shards = [{**original[0], "samples": 1}]
    elif shards == "empty":
        shards = [{**s, "samples": 0} for s in original[:2]]
    cache = ShardCache(
        tmp_path / "c", ObjectStore(f"file://{tmp_path}/o"), PREFIX, _with_split(manifest, split, shards), budget_bytes=1 << 30
    )
    with pytest.raises(PartitionError, match=match):
        cache.prestage(split)
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").rglob("*.tar"))


def test_a_data_partition_without_samples_is_refused_by_number():
    shards = [{"path": f"s{i}.tar", "samples": n} for i, n in enumerate([4, 0, 4, 0])]
    with pytest.raises(PartitionError, match="partition 1 of 2 holds no sample"):
        partition_shards(shards, 2)
    assert [len(p) for p in partition_shards(shards, 1)] == [4]


# --- 3. URLs with credentials ------------------------------------------------------------------
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


@pytest.mark.parametrize(
    "webhook",
    [
        f"https://u:{SENTINEL}@hooks.slack.com/services/T/B/X",
        f"http://:{SENTINEL}@127.0.0.1:9/hook",
        f"https://hooks.slack.com/services/T/B/X?token={SENTINEL}",
    ],
)
def test_a_webhook_with_credentials_is_refused_without_quoting_it(webhook):
    with pytest.raises(AlertError, match="carries credentials") as error:
        post_to_slack(webhook, {"text": "x"}, attempts=1)
    assert SENTINEL not in str(error.value)


# --- 5. waits without bounds -------------------------------------------------------------------
def test_a_silent_endpoint_is_a_storage_error_naming_it_and_the_bound(monkeypatch):

    from drape.storage.store import StorageError

    endpoint = silent_endpoint(monkeypatch)
    store = ObjectStore("s3://silent/x", endpoint_url=endpoint, connect_timeout=0.5, read_timeout=0.5, retry_attempts=1)
    for call in (lambda: store.exists("a/b"), lambda: store.list("a"), lambda: store.put_bytes(b"x", "a/b")):
        started = time.monotonic()
        with pytest.raises(StorageError, match=rf"endpoint {endpoint} did not answer.*read_timeout_seconds 0.5"):
            call()
        assert time.monotonic() - started < 10


def test_a_silent_tracking_server_fails_within_mlflows_bounds_which_drape_sets(tmp_path, monkeypatch):
    import socket
    import threading

    from mlflow.exceptions import MlflowException

    from drape.ops.tracking import MLFLOW_HTTP_BOUNDS, Tracker

    for name in MLFLOW_HTTP_BOUNDS:
        monkeypatch.delenv(name, raising=False)
    server, held = socket.socket(), []
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    threading.Thread(target=lambda: [held.append(server.accept()) for _ in iter(int, 1)], daemon=True).start()
    endpoint = f"http://127.0.0.1:{server.getsockname()[1]}"
    config = tiny_config(tmp_path, tracking={"uri": endpoint})
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the operator's setting wins over drape's default
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    started = time.monotonic()
    with pytest.raises(MlflowException, match=endpoint):
        Tracker(config)
    assert time.monotonic() - started < 10
    for name in MLFLOW_HTTP_BOUNDS:
        monkeypatch.delenv(name)
    Tracker(tiny_config(tmp_path / "local"))  # unset, drape's bounds apply (MLflow's own: 120 s, 7 retries)
    assert {name: os.environ[name] for name in MLFLOW_HTTP_BOUNDS} == {
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    }


# --- 6. absurd and non-finite numbers ----------------------------------------------------------
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
    ("args", "said"),
    [
        (["cost", "fleet", "--hours", "inf"], "--hours: expected a finite number"),
        (["cost", "fleet", "--hours", "1e300"], "--hours: 1e+300 is beyond"),
        (["queue", "submit", "--kind", "stage-training", "--mem-gib", "1e30", "--", "true"], "--mem-gib: 1e+30 is beyond"),
        (["queue", "submit", "--kind", "stage-training", "--mem-gib", "8", "--duration", "nan", "--", "true"], "finite"),
    ],
)
def test_absurd_or_non_finite_cli_flags_are_usage_errors_naming_the_flag(tmp_path, monkeypatch, args, said):
    from typer.testing import CliRunner

    from drape.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, args, terminal_width=200)
    assert result.exit_code == 2 and said in " ".join(result.output.split()), result.output
    assert not (tmp_path / ".drape").exists()  # refused before anything was opened or queued


def test_a_checkpoint_whose_model_config_is_absurd_is_refused_before_it_is_built(tmp_path):
    from drape.storage.checksum import sha256_file
    from drape.training.checkpoint import CheckpointError, load_model, save_checkpoint
    from drape.training.model import build_model

    path = save_checkpoint(
        tmp_path / "step-1",
        model=build_model(tiny_config(tmp_path / "d")),
        optimizer=None,
        trainable_names=[],
        ema=None,
        manifest={"step": 1},
    )
    for key, value, said in (
        ("num_layers", 10**6, "at most 4096"),
        ("attention_head_dim", 2**40, "at most 65536"),
        ("patch_size", math.nan, "finite"),
        ("num_attention_heads", -3, "never negative"),
    ):
        copy = shutil.copytree(path, tmp_path / key)
        config_file = copy / "model" / "config.json"
        config_file.write_text(json.dumps({**json.loads(config_file.read_text()), key: value}))
        manifest = json.loads((copy / "manifest.json").read_text())  # an attacker rewrites the hash too
        manifest["files"]["model/config.json"] = sha256_file(config_file)
        (copy / "manifest.json").write_text(json.dumps(manifest))
        started = time.monotonic()
        with pytest.raises(CheckpointError, match=rf"config\.json: {key}: .*{said}"):
            load_model(copy)
        assert time.monotonic() - started < 5


# --- 7. YAML bombs -----------------------------------------------------------------------------
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
    from drape.config.loading import read_yaml

    path = tmp_path / "anchors.yaml"
    path.write_text("common: &common {lr: 0.001, steps: 5}\nidentity: *common\ntexture: *common\n")
    assert read_yaml(path) == {name: {"lr": 0.001, "steps": 5} for name in ("common", "identity", "texture")}


# --- 8. identifiers with control characters ----------------------------------------------------
@pytest.mark.parametrize("value", ["run1\n", "run1\r", "a\tb", "run\x1b[2J"])
def test_names_with_control_characters_are_refused(value):
    for check in (lambda: safe_name(value, "run id"), lambda: safe_shopper_id(value + "abc")):
        with pytest.raises(UnsafePathError):
            check()


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


def test_a_checkpoint_name_with_a_trailing_newline_is_not_a_checkpoint():
    assert checkpoint_step("step-0000001") == 1
    with pytest.raises(ValueError):
        checkpoint_step("step-0000001\n")


def test_what_drape_writes_under_a_shopper_id_the_erasing_command_finds(tmp_path):
    """A trailing newline was accepted by `^…$` and written as a folder `forget` could not name."""
    from drape.layout import LiveLayout

    with pytest.raises(UnsafePathError):
        LiveLayout(tmp_path).shopper(safe_shopper_id("shopper-1\n"))
    assert LiveLayout(tmp_path).shopper(safe_shopper_id("shopper-1")).root.name == "shopper-1"


# --- 9. files named in errors ------------------------------------------------------------------
@pytest.mark.parametrize("payload", [b"", b'{"step": 1,', b"\xff\xfe", b"[1, 2]"])
def test_a_json_file_that_is_damaged_is_named_with_the_position(tmp_path, payload):
    path = tmp_path / "run-1" / "manifest.json"
    path.parent.mkdir()
    path.write_bytes(payload)
    with pytest.raises(JsonFileError, match=rf"{path}: (not JSON|expected a JSON object).*manifest is damaged"):
        read_json_object(path, "checkpoint manifest")


@pytest.mark.parametrize("payload", ['{"step": 1,', ""])
def test_a_checkpoint_manifest_that_is_not_json_names_the_file(tmp_path, payload):
    from drape.training.checkpoint import read_manifest

    (tmp_path / "step-0000001").mkdir()
    (tmp_path / "step-0000001" / "manifest.json").write_text(payload)
    with pytest.raises(ValueError, match=r"step-0000001/manifest\.json: not JSON .*line 1 column"):
        read_manifest(tmp_path / "step-0000001")


def test_a_stage_result_in_the_store_that_is_not_json_names_the_object(tmp_path):
    from drape.jsonfile import parse_json_object

    store = ObjectStore(f"file://{tmp_path}/objects")
    store.put_bytes(b"{truncated", "runs/r/identity/result.json")
    with pytest.raises(JsonFileError, match=r"runs/r/identity/result\.json: not JSON .*line 1 column 2"):
        parse_json_object(store, "runs/r/identity/result.json", "stage job result")


# --- 10. size mismatches at inference ----------------------------------------------------------
@pytest.mark.parametrize(("height", "width"), [(64, 64), (32, 64), (16, 32)])
def test_inputs_of_another_size_are_refused_naming_sample_size_and_expected(tmp_path, height, width):
    import numpy as np

    from drape.inference.source import InferenceInputError, check_input_sizes

    arrays = {"target": np.zeros((2, height, width, 3), np.uint8), "keys": ["person-7", "person-8"], "meta": [{}, {}]}
    with pytest.raises(InferenceInputError, match=rf"inputs: sample person-7: its target image is {width}×{height}.*32×32"):
        check_input_sizes(arrays, "--inputs inputs", 32, 32)
    check_input_sizes({**arrays, "target": np.zeros((2, 32, 32, 3), np.uint8)}, "--inputs inputs", 32, 32)


# --- 11. children stopped on SIGTERM and SIGINT ------------------------------------------------
CHILD = textwrap.dedent(
    """
    import subprocess, sys
    from drape.ops.process import stop_children_on_termination
    stop_children_on_termination()
    child = subprocess.Popen(["sleep", "60"]) if sys.argv[1] == "popen" else None
    try:
        print("started", flush=True)
        if child is None:
            subprocess.run(["sleep", "60"])  # as `drape cost scaling` runs torchrun, `shopper forget` mlflow gc
        child.wait()
    finally:
        if child is not None and child.poll() is None:  # as bench's workers are closed
            child.kill()
            child.wait()
    """
)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
@pytest.mark.parametrize("how", ["run", "popen"])
def test_a_signal_stops_a_commands_children_as_ctrl_c_does(signum, how):
    from tests.integration.test_serve_signals import alive, descendants

    parent = subprocess.Popen(
        [sys.executable, "-c", CHILD, how],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        # as from a terminal: a suite started in the background (`make test &`) ignores SIGINT, and
        # a Python started so never installs its KeyboardInterrupt handler
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert parent.stdout is not None
        parent.stdout.readline()
        deadline = time.monotonic() + 20
        while not (children := descendants(parent.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert children
        time.sleep(0.3)  # past the fork: a signal inside Popen() itself is Python's own race, not drape's
        parent.send_signal(signum)
        assert parent.wait(timeout=10) != 0
        assert not [pid for pid in children if alive(pid)]
    finally:
        parent.kill()
