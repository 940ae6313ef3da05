"""VITON-HD and DressCode importers on small trees in those layouts, and `drape data shard`."""

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from drape import STAGES
from drape.cli import app
from drape.data.dataset import MANIFEST, assign_splits, import_dataset, load_split
from drape.data.importers import SourceError, detect_layout, list_pairs

W, H = 48, 64  # the sources' 3:4 portrait aspect, small


def _person(seed: int, face_label: int, garment_label: int, limb_label: int):
    rng = np.random.default_rng(seed)
    photo = np.full((H, W, 3), 235, np.uint8)
    labels = np.zeros((H, W), np.uint8)
    labels[4:16, 18:30] = face_label  # face
    labels[18:44, 12:36] = garment_label  # torso garment
    labels[18:40, 6:12] = limb_label  # one arm
    colour = rng.integers(0, 255, 3)
    photo[labels == garment_label] = colour
    photo[labels == face_label] = (200, 160, 130)
    return Image.fromarray(photo), Image.fromarray(labels, mode="L").convert("P")


def _keypoints_body25(scale=1.0):
    points = [(24, 10), (24, 18), (14, 20), (10, 30), (9, 40), (34, 20), (38, 30), (39, 40)] + [(0, 0)] * 17
    return [v for x, y in points for v in (x * scale, y * scale, 0.9 if x else 0.0)]


def make_viton_hd(root: Path, pairs: int = 14) -> Path:
    for split in ("train", "test"):
        count = pairs if split == "train" else 4
        lines = []
        for i in range(count):
            person, cloth = f"{i:05d}_00.jpg", f"{(i * 7) % count:05d}_00.jpg"
            lines.append(f"{person} {cloth}")
            photo, labels = _person(i, 13, 5, 14)
            for folder in ("image", "cloth", "cloth-mask", "image-parse-v3", "openpose_json", "agnostic-v3.2"):
                (root / split / folder).mkdir(parents=True, exist_ok=True)
            photo.save(root / split / "image" / person)
            labels.save(root / split / "image-parse-v3" / f"{Path(person).stem}.png")
            Image.new("RGB", (W, H), tuple(int(v) for v in np.random.default_rng(i).integers(0, 255, 3))).save(
                root / split / "cloth" / person
            )
            Image.new("L", (W, H), 255).save(root / split / "cloth-mask" / person)
            Image.new("RGB", (W, H), (128, 128, 128)).save(root / split / "agnostic-v3.2" / person)
            (root / split / "openpose_json" / f"{Path(person).stem}_keypoints.json").write_text(
                json.dumps({"version": 1.3, "people": [{"pose_keypoints_2d": _keypoints_body25()}]})
            )
        (root / f"{split}_pairs.txt").write_text("\n".join(lines) + "\n")
    return root


def make_dresscode(root: Path, per_category: int = 6) -> Path:
    labels_by_category = {"upper_body": 4, "lower_body": 6, "dresses": 7}
    for c, (category, garment_label) in enumerate(labels_by_category.items()):
        for folder in ("images", "keypoints", "label_maps"):
            (root / category / folder).mkdir(parents=True, exist_ok=True)
        lines = []
        for i in range(per_category):
            ident = f"{c:02d}{i:04d}"
            photo, labels = _person(100 * c + i, 11, garment_label, 14)
            photo.save(root / category / "images" / f"{ident}_0.jpg")
            Image.new("RGB", (W, H), (20 * i, 40, 200)).save(root / category / "images" / f"{ident}_1.jpg")
            labels.resize((W // 2, H // 2), Image.Resampling.NEAREST).save(root / category / "label_maps" / f"{ident}_4.png")
            flat = _keypoints_body25(0.5)[: 18 * 3]
            (root / category / "keypoints" / f"{ident}_2.json").write_text(
                json.dumps({"keypoints": [[flat[3 * k], flat[3 * k + 1], flat[3 * k + 2], k] for k in range(18)]})
            )
            lines.append(f"{ident}_0.jpg {ident}_1.jpg")
        (root / category / "train_pairs.txt").write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.parametrize("maker, layout, pairs", [(make_viton_hd, "viton-hd", 18), (make_dresscode, "dresscode", 18)])
def test_import_cuts_stage_shards_with_gate_meta(tmp_path, maker, layout, pairs):
    source = maker(tmp_path / "src")
    assert detect_layout(source) == layout
    assert len(list_pairs(source, layout)) == pairs
    manifest = import_dataset(
        source,
        tmp_path / "out",
        name="ext",
        version="v1",
        resolution=32,
        control=4,
        weights={stage: 1 for stage in STAGES},
        max_samples=3,
    )
    counts = {split: sum(s["samples"] for s in shards) for split, shards in manifest["splits"].items()}
    assert counts["control"] == 4 and sum(counts.values()) == pairs and all(counts[s] > 0 for s in STAGES)
    assert manifest["stage_rule"]["control_samples"] == 4 and manifest["source"]["layout"] == layout
    assert (tmp_path / "out" / MANIFEST).is_file()
    control = load_split(tmp_path / "out", manifest, "control")
    assert control["target"].shape == (4, 32, 32, 3) and control["mask"].shape == (4, 32, 32)
    for meta, mask, pose in zip(control["meta"], control["mask"], control["pose"]):
        x0, y0, x1, y1 = meta["face_box"]
        assert 0 <= x0 < x1 <= 32 and 0 <= y0 < y1 <= 16  # the face sits in the top of the letterboxed square
        assert meta["identity_id"].startswith(layout.split("-")[0]) and meta["garment_id"]
        assert mask.any() and pose.any()
        lx0, ly0, lx1, ly1 = meta["logo_box"]
        assert lx0 < lx1 and ly0 < ly1


def test_assignment_is_deterministic_and_follows_weights():
    keys = [f"k{i}" for i in range(4000)]
    first = assign_splits(keys, control=100, weights={"identity": 2, "texture": 1, "geometry": 1, "denoise": 0})
    assert first == assign_splits(
        list(reversed(keys)), control=100, weights={"identity": 2, "texture": 1, "geometry": 1, "denoise": 0}
    )
    counts = {split: list(first.values()).count(split) for split in ("control", *STAGES)}
    assert counts["control"] == 100 and counts["denoise"] == 0
    assert abs(counts["identity"] / 3900 - 0.5) < 0.03 and abs(counts["texture"] / 3900 - 0.25) < 0.03
    with pytest.raises(ValueError, match="leaves nothing to train on"):
        assign_splits(keys[:5], control=5, weights={"identity": 1})


def test_missing_and_broken_source_files_are_named(tmp_path):
    source = make_viton_hd(tmp_path / "src", pairs=6)
    (source / "train" / "openpose_json" / "00002_00_keypoints.json").unlink()
    with pytest.raises(SourceError, match=r"00002_00_keypoints.json: missing"):
        import_dataset(
            source,
            tmp_path / "out",
            name="x",
            version="v1",
            resolution=32,
            control=2,
            weights={s: 1 for s in STAGES},
            max_samples=4,
        )
    source = make_viton_hd(tmp_path / "src2", pairs=6)
    (source / "train" / "image" / "00003_00.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(SourceError, match=r"00003_00.jpg: not a readable image"):
        import_dataset(
            source,
            tmp_path / "out2",
            name="x",
            version="v1",
            resolution=32,
            control=2,
            weights={s: 1 for s in STAGES},
            max_samples=4,
        )
    with pytest.raises(SourceError, match="neither VITON-HD"):
        detect_layout(tmp_path)


def test_cli_shard_publishes_and_refuses_to_overwrite_a_version(tmp_path, config):
    source = make_dresscode(tmp_path / "dresscode", per_category=4)
    config_file = tmp_path / "config.yaml"
    import yaml

    config_file.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    out = tmp_path / "objects"
    args = [
        "data",
        "shard",
        str(source),
        "--out",
        str(out),
        "--config",
        str(config_file),
        "--name",
        "dresscode",
        "--version",
        "v1",
        "--control",
        "3",
        "--shard-max-samples",
        "2",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "datasets/dresscode/v1" / MANIFEST).read_text())
    assert sum(s["samples"] for s in manifest["splits"]["control"]) == 3
    assert all((out / "datasets/dresscode/v1" / s["path"]).is_file() for shards in manifest["splits"].values() for s in shards)
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 2 and "immutable" in again.output
    bad = CliRunner().invoke(app, [*args[:-6], "--version", "v2", "--weights", "shoes=1"])
    assert bad.exit_code == 2 and "unknown stage 'shoes'" in bad.output
