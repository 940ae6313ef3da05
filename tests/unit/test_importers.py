"""VITON-HD and DressCode importers on small trees in those layouts, and `drape data shard`."""

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw
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


def _write_viton_person(root: Path, folder: str, stem: str, seed: int) -> None:
    """One person as VITON-HD ships them, with its optional DensePose and agnostic mask."""
    photo, labels = _person(seed, 13, 5, 14)
    for sub in ("image", "cloth", "cloth-mask", "image-parse-v3", "openpose_json", "agnostic-v3.2", "agnostic-mask"):
        (root / folder / sub).mkdir(parents=True, exist_ok=True)
    (root / folder / "image-densepose").mkdir(exist_ok=True)
    region = np.isin(np.asarray(labels), (5, 14))
    Image.fromarray((region * 255).astype(np.uint8)).save(root / folder / "agnostic-mask" / f"{stem}_mask.png")
    Image.fromarray(np.asarray(photo)[::-1].copy()).save(root / folder / "image-densepose" / f"{stem}.jpg")
    photo.save(root / folder / "image" / f"{stem}.jpg")
    labels.save(root / folder / "image-parse-v3" / f"{stem}.png")
    colour = tuple(int(v) for v in np.random.default_rng(seed).integers(0, 255, 3))
    Image.new("RGB", (W, H), colour).save(root / folder / "cloth" / f"{stem}.jpg")
    Image.new("L", (W, H), 255).save(root / folder / "cloth-mask" / f"{stem}.jpg")
    Image.new("RGB", (W, H), (128, 128, 128)).save(root / folder / "agnostic-v3.2" / f"{stem}.jpg")
    (root / folder / "openpose_json" / f"{stem}_keypoints.json").write_text(
        json.dumps({"version": 1.3, "people": [{"pose_keypoints_2d": _keypoints_body25()}]})
    )


def make_viton_hd(root: Path, pairs: int = 14, test: int = 4) -> Path:
    """VITON-HD as it ships: train_pairs.txt (each person with their own cloth), test_pairs.txt
    (unpaired: each test person with another test person's cloth), persons disjoint."""
    train = [f"{i:05d}_00" for i in range(pairs)]
    tested = [f"{10000 + i:05d}_00" for i in range(test)]
    for i, stem in enumerate(train):
        _write_viton_person(root, "train", stem, i)
    for i, stem in enumerate(tested):
        _write_viton_person(root, "test", stem, 1000 + i)
    (root / "train_pairs.txt").write_text("".join(f"{s}.jpg {s}.jpg\n" for s in train))
    unpaired = [f"{s}.jpg {tested[(i + 1) % test]}.jpg\n" for i, s in enumerate(tested)]
    (root / "test_pairs.txt").write_text("".join(unpaired))
    return root


def _write_dresscode_person(root: Path, category: str, ident: str, seed: int, garment_label: int) -> None:
    for folder in ("images", "keypoints", "label_maps", "skeletons"):
        (root / category / folder).mkdir(parents=True, exist_ok=True)
    photo, labels = _person(seed, 11, garment_label, 14)
    photo.save(root / category / "images" / f"{ident}_0.jpg")
    Image.new("RGB", (W, H), (seed % 250, 40, 200)).save(root / category / "images" / f"{ident}_1.jpg")
    labels.resize((W // 2, H // 2), Image.Resampling.NEAREST).save(root / category / "label_maps" / f"{ident}_4.png")
    skeleton = Image.new("RGB", (W, H), (0, 0, 0))
    ImageDraw.Draw(skeleton).line([(24, 10), (24, 40)], fill=(255, 0, 0), width=3)
    skeleton.save(root / category / "skeletons" / f"{ident}_5.jpg")
    flat = _keypoints_body25(0.5)[: 18 * 3]
    (root / category / "keypoints" / f"{ident}_2.json").write_text(
        json.dumps({"keypoints": [[flat[3 * k], flat[3 * k + 1], flat[3 * k + 2], k] for k in range(18)]})
    )


def make_dresscode(root: Path, per_category: int = 6, test: int = 2) -> Path:
    """DressCode as it ships: per category train_pairs.txt, test_pairs_paired.txt and
    test_pairs_unpaired.txt ('<id>_0.jpg <id>_1.jpg'), training and test persons disjoint."""
    labels_by_category = {"upper_body": 4, "lower_body": 6, "dresses": 7}
    for c, (category, garment_label) in enumerate(labels_by_category.items()):
        train = [f"{c:02d}{i:04d}" for i in range(per_category)]
        tested = [f"{c:02d}{9000 + i:04d}" for i in range(test)]
        for i, ident in enumerate(train + tested):
            _write_dresscode_person(root, category, ident, 100 * c + i, garment_label)
        (root / category / "train_pairs.txt").write_text("".join(f"{i}_0.jpg {i}_1.jpg\n" for i in train))
        (root / category / "test_pairs_paired.txt").write_text("".join(f"{i}_0.jpg {i}_1.jpg\n" for i in tested))
        unpaired = [f"{ident}_0.jpg {tested[(k + 1) % test]}_1.jpg\n" for k, ident in enumerate(tested)]
        (root / category / "test_pairs_unpaired.txt").write_text("".join(unpaired))
    return root


# pairs listed: VITON-HD 14 train + 4 paired + 4 unpaired test; DressCode 3 × (6 train + 2 + 2)
@pytest.mark.parametrize("maker, layout, pairs", [(make_viton_hd, "viton-hd", 22), (make_dresscode, "dresscode", 30)])
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
    listed = manifest["source"]["official_splits"]
    assert sum(listed.values()) == pairs and counts["test_paired"] == listed["test_paired"]
    assert counts["control"] == 4 and sum(counts[s] for s in STAGES) == listed["train"] and all(counts[s] > 0 for s in STAGES)
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
    source = make_dresscode(tmp_path / "dresscode", per_category=6)
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
