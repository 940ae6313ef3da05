"""drape.layout: one rule for checkpoint names, artifact kinds, live paths and object keys; a key, name
or path that would leave its root (dot-dot, a symlink, a loop) or carries control characters is refused."""

from datetime import UTC, datetime
from pathlib import Path

import pytest

from drape import ArtifactKind
from drape.layout import (
    LiveLayout,
    UnsafePathError,
    archive_manifest_prefix,
    artifact_kind,
    checkpoint_dirs,
    checkpoint_name,
    checkpoint_step,
    contained,
    dataset_prefix,
    is_sharded_checkpoint,
    new_manifest_key,
    run_key,
    run_key_of,
    safe_key,
    safe_name,
    safe_shopper_id,
)


def test_checkpoint_names_round_trip_whole_and_sharded():
    assert checkpoint_name(40) == "step-0000040" and checkpoint_name(40, sharded=True) == "step-0000040.dcp"
    assert checkpoint_step("runs/r/identity/checkpoints/step-0000040") == 40
    assert checkpoint_step(Path("step-0000040.dcp")) == 40  # the name that once broke archive: int('0000040.dcp')
    assert is_sharded_checkpoint("step-0000040.dcp") and not is_sharded_checkpoint("step-0000040")


@pytest.mark.parametrize("name", ["step-", "step-12a", "step-0000040.tmp", ".step-0000040.tmp", "checkpoint"])
def test_other_names_are_not_checkpoints(name):
    with pytest.raises(ValueError, match="expected step-NNNNNNN or step-NNNNNNN.dcp"):
        checkpoint_step(name)


def test_checkpoints_are_ordered_by_step_whole_after_sharded(tmp_path):
    for name in ("step-0000080", "step-0000040.dcp", "step-0000040", "step-0000120.dcp", ".step-0000160.tmp"):
        (tmp_path / name).mkdir()
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert [p.name for p in checkpoint_dirs(tmp_path)] == ["step-0000040.dcp", "step-0000040", "step-0000080", "step-0000120.dcp"]
    assert checkpoint_dirs(tmp_path / "missing") == []


@pytest.mark.parametrize(
    ("relative", "kind"),
    [
        ("shards/synth-tryon/v1/identity/shard-00000.tar", ArtifactKind.SYNTHETIC_IMAGERY),
        ("runs/r1/identity/checkpoints/step-0000040/model/diffusion_pytorch_model.safetensors", ArtifactKind.CHECKPOINT),
        ("checkpoints/step-0000040.dcp", ArtifactKind.CHECKPOINT),
        ("baselines/texture/checkpoint/manifest.json", ArtifactKind.CHECKPOINT),
        ("superseded-baseline/checkpoint", ArtifactKind.CHECKPOINT),
        ("gate/report.json", ArtifactKind.GATE_REPORT),
        ("baselines/texture/report.json", ArtifactKind.GATE_REPORT),
        ("gate/latents.safetensors", ArtifactKind.LATENT_SNAPSHOT),
        ("gate/outputs", ArtifactKind.VALIDATION_OUTPUT),
        ("gate/grid.png", ArtifactKind.VALIDATION_OUTPUT),
        ("baselines/texture/baseline.json", ArtifactKind.VALIDATION_OUTPUT),
    ],
)
def test_artifact_kind_follows_from_where_a_file_lives(relative, kind):
    assert artifact_kind(relative) == kind


def test_live_paths_and_object_keys():
    live = LiveLayout(Path("/srv/live"))
    paths = live.stage("20261201-000000-abcdef", "texture")
    assert paths.checkpoints == Path("/srv/live/runs/20261201-000000-abcdef/texture/checkpoints")
    assert paths.gate_report == Path("/srv/live/runs/20261201-000000-abcdef/texture/gate/report.json")
    assert live.baseline("texture").staging == Path("/srv/live/baselines/.texture.tmp")
    assert live.restored("r1", "geometry") == Path("/srv/live/restored/r1/geometry")
    assert dataset_prefix("synth-tryon", "v1") == "datasets/synth-tryon/v1"
    assert run_key("r1", "texture", "gate/report.json") == "runs/r1/texture/gate/report.json"
    assert run_key("r1") == "runs/r1"
    assert (
        run_key_of(Path("/srv/live/runs/r1"), "r1", Path("/srv/live/runs/r1/texture/gate/grid.png"))
        == "runs/r1/texture/gate/grid.png"
    )
    assert archive_manifest_prefix("r1", "texture") == "archive/manifests/r1/texture"
    first = new_manifest_key("archive/manifests/r1/texture", datetime(2026, 12, 1, tzinfo=UTC))
    assert first.startswith("archive/manifests/r1/texture-20261201T000000-") and first.endswith(".jsonl")
    assert first != new_manifest_key("archive/manifests/r1/texture", datetime(2026, 12, 1, tzinfo=UTC))


# --- names and paths that would leave their root, or carry control characters ---------------------
@pytest.mark.parametrize("key", ["../x", "a/../../x", "/etc/passwd", "a//b", "a/./b", "a\\b", "a\x00b", ".."])
def test_unsafe_keys_are_refused_with_the_key_named(key):
    with pytest.raises(UnsafePathError, match="refused"):
        safe_key(key, "test key")


def test_contained_refuses_a_symlink_out_of_the_root(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path)
    assert contained(tmp_path / "root", "a/b.tar", "k") == (tmp_path / "root" / "a" / "b.tar").resolve()
    with pytest.raises(UnsafePathError, match="outside"):
        contained(tmp_path / "root", "link/evil.tar", "shard path")
    for name in ("..", ".hidden", "a/b", ""):
        with pytest.raises(UnsafePathError):
            safe_name(name, "run id")


def test_contained_names_a_loop_and_still_allows_links_inside(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    assert contained(tmp_path, "alias/x", "k") == tmp_path.resolve() / "alias" / "x"
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(UnsafePathError, match="'loop/x'.*symlink loop"):
        contained(tmp_path, "loop/x", "k")


@pytest.mark.parametrize("value", ["run1\n", "run1\r", "a\tb", "run\x1b[2J"])
def test_names_with_control_characters_are_refused(value):
    for check in (lambda: safe_name(value, "run id"), lambda: safe_shopper_id(value + "abc")):
        with pytest.raises(UnsafePathError):
            check()


def test_a_checkpoint_name_with_a_trailing_newline_is_not_a_checkpoint():
    assert checkpoint_step("step-0000001") == 1
    with pytest.raises(ValueError):
        checkpoint_step("step-0000001\n")


def test_what_drape_writes_under_a_shopper_id_the_erasing_command_finds(tmp_path):
    """A trailing newline was accepted by `^…$` and written as a folder `forget` could not name."""
    with pytest.raises(UnsafePathError):
        LiveLayout(tmp_path).shopper(safe_shopper_id("shopper-1\n"))
    assert LiveLayout(tmp_path).shopper(safe_shopper_id("shopper-1")).root.name == "shopper-1"
