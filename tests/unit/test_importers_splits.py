"""The official splits of VITON-HD and DressCode on trees in their real layouts: counts per split,
no test person in training, unpaired pairs never a target, and every name kept inside the root."""

import os
from pathlib import Path

import numpy as np
import pytest

from drape import STAGES
from drape.data.dataset import import_dataset, load_split
from drape.data.reader import ShardIndex
from drape.data.sources import SourceError, list_pairs, split_counts
from tests.unit.test_importers import make_dresscode, make_viton_hd

TRAINING = (*STAGES,)


def _import(source: Path, out: Path, control: int) -> dict:
    return import_dataset(
        source,
        out,
        name="ext",
        version="v1",
        resolution=(32, 24),
        control=control,
        weights=dict.fromkeys(STAGES, 1),
        max_samples=8,
    )


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> dict:
    """Both sources imported once (about 2 s)."""
    root = tmp_path_factory.mktemp("splits")
    viton, dresscode = make_viton_hd(root / "viton", pairs=14, test=4), make_dresscode(root / "dresscode", 6, test=2)
    return {
        "viton-hd": (viton, root / "viton-out", _import(viton, root / "viton-out", control=3)),
        "dresscode": (dresscode, root / "dresscode-out", _import(dresscode, root / "dresscode-out", control=4)),
    }


def _metas(out: Path, manifest: dict, splits) -> list[dict]:
    return [meta for split in splits if split in manifest["splits"] for meta in load_split(out, manifest, split)["meta"]]


def test_viton_hd_official_split_counts(imported):
    source, out, manifest = imported["viton-hd"]
    assert split_counts(list_pairs(source, "viton-hd")) == {"train": 14, "test_paired": 4, "test_unpaired": 4}
    counts = {split: sum(s["samples"] for s in shards) for split, shards in manifest["splits"].items()}
    assert sum(counts[s] for s in STAGES) == 14
    assert (counts["control"], counts["test_paired"], counts["test_unpaired"]) == (3, 4, 4)


def test_dresscode_official_split_counts_per_category(imported):
    source, out, manifest = imported["dresscode"]
    pairs = list_pairs(source, "dresscode")
    for category in ("upper_body", "lower_body", "dresses"):
        assert split_counts(p for p in pairs if p["category"] == category) == {"train": 6, "test_paired": 2, "test_unpaired": 2}
    counts = {split: sum(s["samples"] for s in shards) for split, shards in manifest["splits"].items()}
    assert sum(counts[s] for s in STAGES) == 18
    assert (counts["control"], counts["test_paired"], counts["test_unpaired"]) == (4, 6, 6)
    assert all("shipped_pose" in meta["conditioning"] for meta in _metas(out, manifest, ["control"]))
    assert manifest["source"]["categories"] == ["upper_body", "lower_body", "dresses"]  # named in eval's protocol


@pytest.mark.parametrize("layout", ["viton-hd", "dresscode"])
def test_no_test_person_trains_and_unpaired_is_never_a_target(imported, layout):
    _, out, manifest = imported[layout]
    trained = _metas(out, manifest, TRAINING)
    control, paired, unpaired = (_metas(out, manifest, [split]) for split in ("control", "test_paired", "test_unpaired"))
    assert {m["identity_id"] for m in trained}.isdisjoint({m["identity_id"] for m in control + paired + unpaired})
    assert all(m["split"] == "train" and m["paired"] for m in trained)
    assert all(m["split"] == "test_paired" and m["paired"] for m in control + paired)
    assert all(m["split"] == "test_unpaired" and not m["paired"] for m in unpaired)
    assert {m["key"] for m in control} <= {m["key"] for m in paired}
    assert {m["key"] for m in unpaired}.isdisjoint({m["key"] for m in trained + control})
    # a paired test pair is the person with the garment they wear; an unpaired one another garment
    assert all(m["garment_id"].split("-")[-1].split("_")[0] == m["identity_id"].split("-")[-1].split("_")[0] for m in paired)
    assert all(m["garment_id"].split("-")[-1].split("_")[0] != m["identity_id"].split("-")[-1].split("_")[0] for m in unpaired)
    assert load_split(out, manifest, "test_unpaired")["target"].shape[1:] == (32, 24, 3)  # 3:4 kept


def test_a_person_in_training_and_test_is_refused(tmp_path):
    source = make_viton_hd(tmp_path / "src", pairs=4, test=2)
    with (source / "train_pairs.txt").open("a") as pairs:
        pairs.write("10001_00.jpg 10001_00.jpg\n")  # a test person listed for training too
    with pytest.raises(SourceError, match=r"1 person\(s\) in both the training and the test pairs \(viton-10001_00\)"):
        list_pairs(source, "viton-hd")


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "sub/../../x.jpg"])
def test_names_outside_the_root_are_refused_with_the_line(tmp_path, name):
    source = make_dresscode(tmp_path / "src", per_category=1, test=2)
    (source / "dresses" / "test_pairs_unpaired.txt").write_text(f"020000_0.jpg {name}\n")
    with pytest.raises(SourceError, match=r"test_pairs_unpaired.txt:1: .* refused"):
        list_pairs(source, "dresscode")


def test_a_symlink_out_of_the_root_is_refused(tmp_path):
    source = make_viton_hd(tmp_path / "src", pairs=8, test=2)
    outside = tmp_path / "secret.jpg"
    (source / "train" / "image" / "00003_00.jpg").rename(outside)
    os.symlink(outside, source / "train" / "image" / "00003_00.jpg")
    with pytest.raises(SourceError, match=r"00003_00.jpg: resolves to .*secret.jpg, outside the source root"):
        _import(source, tmp_path / "out", control=2)


def test_a_missing_official_pairs_file_is_named(tmp_path):
    source = make_dresscode(tmp_path / "src", per_category=1, test=2)
    (source / "lower_body" / "test_pairs_paired.txt").unlink()
    with pytest.raises(SourceError, match=r"lower_body/test_pairs_paired.txt: missing"):
        list_pairs(source, "dresscode")


@pytest.mark.parametrize(
    "layout, carried",
    [("viton-hd", ("parse", "densepose", "agnostic_mask")), ("dresscode", ("parse", "skeleton"))],
)
def test_the_shipped_conditioning_is_carried_as_fields(imported, layout, carried):
    _, out, manifest = imported[layout]
    index = ShardIndex([out / shard["path"] for shard in manifest["splits"]["test_paired"]])
    try:
        assert set(index.conditions) == set(carried) and "parse" not in index.fields  # read when asked for
        sample = index.sample(0, ("parse", *carried[1:], "mask"))
    finally:
        index.close()
    face, garment = (13, 5) if layout == "viton-hd" else (11, 4)
    assert sample["parse"].shape == (32, 24) and {face, garment} <= set(np.unique(sample["parse"]).tolist())
    assert all(sample[name].shape[:2] == (32, 24) for name in carried)
    if layout == "viton-hd":  # the mask is the one VITON-HD ships
        assert np.array_equal(sample["mask"] > 127, sample["agnostic_mask"] > 127)
