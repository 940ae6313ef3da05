"""Pairs files as untrusted input: an unpaired file that is a paired one is refused (or imported
by name and marked), a byte-order mark, NUL, control or invisible character or non-UTF-8 byte is
named with the file, line and column, and an unpaired pair never reaches a training split."""

from __future__ import annotations

from pathlib import Path

import pytest

from drape import STAGES
from drape.data.dataset import import_dataset, write_dataset
from drape.data.importers import load_pair
from drape.data.sources import SourceError, list_pairs, split_counts
from drape.eval.published import not_comparable
from drape.eval.session import dataset_source
from tests.unit.test_importers import make_dresscode, make_viton_hd

VITON_TEST = [f"{10000 + i:05d}_00" for i in range(4)]  # make_viton_hd's test persons (test=4)


def _paired_viton(root: Path) -> Path:
    source = make_viton_hd(root, pairs=6, test=4)
    (source / "test_pairs.txt").write_text("".join(f"{stem}.jpg {stem}.jpg\n" for stem in VITON_TEST))
    return source


def test_a_paired_viton_test_pairs_file_is_refused_as_unpaired(tmp_path):
    source = _paired_viton(tmp_path / "src")
    with pytest.raises(SourceError) as error:
        list_pairs(source, "viton-hd")
    message = str(error.value)
    assert message.startswith(f"{source / 'test_pairs.txt'}: every one of its 4 lines pairs a person with their own garment")
    assert "(line 1: 10000_00.jpg 10000_00.jpg)" in message and "--allow-paired-as-unpaired" in message


def test_a_paired_dresscode_unpaired_file_is_refused(tmp_path):
    source = make_dresscode(tmp_path / "src", per_category=2, test=2)
    paired = (source / "lower_body" / "test_pairs_paired.txt").read_text()
    (source / "lower_body" / "test_pairs_unpaired.txt").write_text(paired)
    with pytest.raises(SourceError, match=r"lower_body/test_pairs_unpaired.txt: every one of its 2 lines .*own garment"):
        list_pairs(source, "dresscode")


def test_one_own_garment_line_is_not_a_paired_file(tmp_path):
    source = make_viton_hd(tmp_path / "src", pairs=6, test=4)
    lines = (source / "test_pairs.txt").read_text().splitlines()
    lines[0] = f"{VITON_TEST[0]}.jpg {VITON_TEST[0]}.jpg"
    (source / "test_pairs.txt").write_text("\n".join(lines) + "\n")
    assert split_counts(list_pairs(source, "viton-hd"))["test_unpaired"] == 4


def test_allowed_by_name_it_is_imported_marked_and_never_compared(tmp_path):
    source = _paired_viton(tmp_path / "src")
    manifest = import_dataset(
        source,
        tmp_path / "out",
        name="ext",
        version="v1",
        resolution=32,
        control=2,
        weights=dict.fromkeys(STAGES, 1),
        max_samples=8,
        allow_paired_as_unpaired=True,
    )
    assert manifest["source"]["paired_as_unpaired"] == ["test_pairs.txt"]
    named = dataset_source(manifest)
    assert named == "VITON-HD [unpaired split from paired files: test_pairs.txt]"
    protocol = {"source": named, "split": "test_unpaired", "resolution": [1024, 768], "resize": "clean", "samples": 2032}
    (line,) = not_comparable(protocol, "unpaired")
    assert line.endswith("not comparable (dataset differs), published figures not shown")


@pytest.mark.parametrize(
    "content, where, what",
    [
        (b"\xef\xbb\xbf{a} {b}\n", 1, r"a byte-order mark \(U\+FEFF\) at column 1"),
        (b"{a} {b}\n{b}\x00 {a}\n", 2, r"a NUL byte at column 13"),
        (b"{a} {b}\n{b} {a}\x07\n", 2, r"the control character U\+0007 at column 26"),
        (b"{a} \xe2\x80\x8b{b}\n", 1, r"the invisible character U\+200B at column 14"),
        (b"{a} {b}\n{b} \xff{a}\n", 2, r"byte 0xff at column 14 is not UTF-8"),
    ],
)
@pytest.mark.parametrize("layout", ["viton-hd", "dresscode"])
def test_bad_bytes_in_a_pairs_file_are_named_with_the_line(tmp_path, layout, content, where, what):
    if layout == "viton-hd":
        source, pairs_file, names = make_viton_hd(tmp_path / "src", pairs=4, test=2), "test_pairs.txt", VITON_TEST[:2]
        a, b = (f"{stem}.jpg" for stem in names)
    else:
        source, pairs_file = make_dresscode(tmp_path / "src", per_category=1, test=2), "upper_body/test_pairs_unpaired.txt"
        a, b = "009000_0.jpg", "009001_1.jpg"
    (source / pairs_file).write_bytes(content.replace(b"{a}", a.encode()).replace(b"{b}", b.encode()))
    with pytest.raises(SourceError, match=rf"{pairs_file}:{where}: {what}"):
        list_pairs(source, layout)


def test_crlf_line_ends_are_plain_text(tmp_path):
    source = make_viton_hd(tmp_path / "src", pairs=4, test=2)
    (source / "test_pairs.txt").write_bytes(b"10000_00.jpg 10001_00.jpg\r\n10001_00.jpg 10000_00.jpg\r\n")
    assert split_counts(list_pairs(source, "viton-hd")) == {"train": 4, "test_paired": 2, "test_unpaired": 2}


def test_an_unpaired_sample_never_goes_to_a_training_split(tmp_path):
    source = make_viton_hd(tmp_path / "src", pairs=4, test=2)
    pair = next(p for p in list_pairs(source, "viton-hd") if p["split"] == "test_unpaired")
    sample = load_pair(source, "viton-hd", pair, 32)
    assert sample.meta["paired"] is False
    for split in (*STAGES, "control", "test_paired"):
        with pytest.raises(ValueError, match=rf"an unpaired pair \(no ground truth\) sent to {split}"):
            write_dataset(tmp_path / split, [(split, sample)], name="x", version="v", source={}, stage_rule={}, max_samples=4)
