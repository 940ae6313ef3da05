"""The official splits of VITON-HD and DressCode, read from their pairs files (no image is opened).

Each dataset ships its own split, and published numbers are only comparable on it, so drape keeps
it rather than pooling and re-splitting:

- ``train``: the training pairs (each person wearing the listed garment). Only these feed the stages.
- ``test_paired``: each test person with the garment they wear (ground truth exists). They form
  the evaluation set of paired metrics (SSIM, LPIPS, FID, KID), and the gates' control set is cut
  from them.
- ``test_unpaired``: a test person with another garment. There is no ground truth: evaluation only
  (unpaired FID, KID), never a training target and never a control sample.

VITON-HD lists ``train_pairs.txt`` (paired) and ``test_pairs.txt`` (unpaired); its paired test set is
each test person with the cloth of the same name, as the field evaluates it. DressCode lists, per
category, ``train_pairs.txt``, ``test_pairs_paired.txt`` and ``test_pairs_unpaired.txt``.

Every name in a pairs file is untrusted: a pairs file must be plain UTF-8 text (a byte-order
mark, a NUL, another control or invisible character, or bytes that are not UTF-8 are refused with
the file, line and column: each makes a name that prints like the right one and is not), an
absolute name or one with a ``..`` part is refused with the pairs file and line, and every file
opened later must resolve (symlinks followed) inside the source root (`contained_file`). A person
in both training and test is refused (`check_person_disjoint`): the control set would then hold a
face the model trained on. An unpaired file whose every line pairs a person with their own garment
(`check_unpaired`: a paired file in its place) is refused unless asked for by name
(``--allow-paired-as-unpaired``); its pairs then carry ``paired_file`` and the dataset's manifest
says so, and `drape eval` does not compare their numbers with published unpaired ones.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

LAYOUTS = ("viton-hd", "dresscode")
DRESSCODE_CATEGORIES = ("upper_body", "lower_body", "dresses")
TRAIN, TEST_PAIRED, TEST_UNPAIRED = "train", "test_paired", "test_unpaired"
OFFICIAL_SPLITS = (TRAIN, TEST_PAIRED, TEST_UNPAIRED)
# DressCode's pairs files per official split
DRESSCODE_PAIRS = {TRAIN: "train_pairs.txt", TEST_PAIRED: "test_pairs_paired.txt", TEST_UNPAIRED: "test_pairs_unpaired.txt"}


class SourceError(ValueError):
    """A source tree that does not match the layout; names the file and what was expected."""


def detect_layout(root: str | Path) -> str:
    """'viton-hd' or 'dresscode', from the folders under `root`."""
    root = Path(root)
    if not root.is_dir():
        raise SourceError(f"{root}: not a directory (expected a VITON-HD or DressCode dataset root)")
    if any((root / split / "image").is_dir() for split in ("train", "test")):
        return "viton-hd"
    if any((root / category / "images").is_dir() for category in DRESSCODE_CATEGORIES):
        return "dresscode"
    raise SourceError(
        f"{root}: neither VITON-HD (train|test/image/...) nor DressCode ({'|'.join(DRESSCODE_CATEGORIES)}/images/...) layout"
    )


def contained_file(root: str | Path, relative: str | Path) -> Path:
    """`root/relative` if it resolves (symlinks followed) inside `root`; SourceError naming it otherwise."""
    root = Path(root)
    path = root / relative
    resolved, base = path.resolve(), root.resolve()
    if not resolved.is_relative_to(base):
        raise SourceError(f"{path}: resolves to {resolved}, outside the source root {base}; refused")
    return path


def _safe_name(name: str, where: str) -> str:
    parts = PurePosixPath(name.replace("\\", "/"))
    if parts.is_absolute() or name.startswith(("/", "\\")) or ".." in parts.parts or ":" in name:
        raise SourceError(f"{where}: {name!r} is not a file name inside the dataset (absolute, or with '..'); refused")
    return name


def _character_name(character: str) -> str:
    names = {"\x00": "a NUL byte", "\ufeff": "a byte-order mark (U+FEFF)"}
    return names.get(
        character, f"the {'control' if unicodedata.category(character) == 'Cc' else 'invisible'} character U+{ord(character):04X}"
    )


def _pairs_lines(path: Path) -> list[str]:
    """The lines of a pairs file as UTF-8 text; SourceError naming the file, line and column of a
    byte-order mark, a NUL, another control or invisible format character, or bytes that are not
    UTF-8 (each would make a name that looks right and is not: '﻿00001_00.jpg: missing')."""
    lines = []
    for number, raw in enumerate(path.read_bytes().split(b"\n"), 1):
        try:
            line = raw.removesuffix(b"\r").decode("utf-8")
        except UnicodeDecodeError as error:
            raise SourceError(
                f"{path}:{number}: byte 0x{raw[error.start]:02x} at column {error.start + 1} is not UTF-8; "
                "expected '<person image> <garment image>' as UTF-8 text"
            ) from None
        bad = next((c for c in line if c != "\t" and unicodedata.category(c) in ("Cc", "Cf")), None)
        if bad is not None:
            raise SourceError(
                f"{path}:{number}: {_character_name(bad)} at column {line.index(bad) + 1}; "
                "expected '<person image> <garment image>' in plain UTF-8 text (save it without a BOM)"
            )
        lines.append(line)
    return lines


def read_pairs(path: Path) -> list[tuple[str, str]]:
    """The (person, garment) names of a pairs file: plain UTF-8 (`_pairs_lines`), each name checked
    by `_safe_name`."""
    if not path.is_file():
        raise SourceError(f"{path}: missing (a pairs file lists '<person image> <garment image>' per line)")
    pairs = []
    for number, line in enumerate(_pairs_lines(path), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 2:
            raise SourceError(f"{path}:{number}: expected '<person image> <garment image>', got {line!r}")
        pairs.append((_safe_name(fields[0], f"{path}:{number}"), _safe_name(fields[1], f"{path}:{number}")))
    return pairs


def wears_own_garment(layout: str, person: str, cloth: str) -> bool:
    """Whether a pair is a person with the garment they wear: VITON-HD, the same file stem
    (00001_00.jpg, 00001_00.jpg); DressCode, the same id (013563_0.jpg, 013563_1.jpg)."""
    person_stem, cloth_stem = PurePosixPath(person).stem, PurePosixPath(cloth).stem
    if layout == "dresscode":
        return person_stem.rsplit("_", 1)[0] == cloth_stem.rsplit("_", 1)[0]
    return person_stem == cloth_stem


def check_unpaired(path: Path, pairs: list[tuple[str, str]], layout: str, *, allow_paired: bool = False) -> bool:
    """True when every line of an unpaired pairs file pairs a person with their own garment (a paired
    file in the unpaired file's place): SourceError naming it unless `allow_paired`. Unpaired FID and
    KID measured on such pairs would be paired numbers under the unpaired name."""
    if not pairs or not all(wears_own_garment(layout, person, cloth) for person, cloth in pairs):
        return False
    if not allow_paired:
        person, cloth = pairs[0]
        raise SourceError(
            f"{path}: every one of its {len(pairs)} lines pairs a person with their own garment (line 1: {person} {cloth}), "
            "but it is read as the unpaired test split (each person with another garment); unpaired FID/KID on it would "
            "be paired numbers. Use the dataset's unpaired file, or pass --allow-paired-as-unpaired to import it as it is"
        )
    return True


def _pair(source: str, split: str, person: str, cloth: str, **extra: str) -> dict:
    stem, cloth_stem = PurePosixPath(person).stem, PurePosixPath(cloth).stem
    scope = f"{extra['category']}-" if "category" in extra else ""
    return {
        "split": split,
        "person": person,
        "cloth": cloth,
        "identity": f"{source}-{stem}",
        "key": f"{source}-{scope}{split.replace('_', '-')}-{stem}-{cloth_stem}",
        **extra,
    }


def _viton_pairs(root: Path, allow_paired: bool) -> list[dict]:
    """train_pairs.txt → train; test_pairs.txt → unpaired, and each of its persons with their own cloth → paired."""
    pairs = [_pair("viton", TRAIN, a, b, folder="train") for a, b in read_pairs(root / "train_pairs.txt")]
    unpaired = read_pairs(root / "test_pairs.txt")
    paired_file = check_unpaired(root / "test_pairs.txt", unpaired, "viton-hd", allow_paired=allow_paired)
    persons = dict.fromkeys(person for person, _ in unpaired)
    pairs += [_pair("viton", TEST_PAIRED, person, person, folder="test") for person in persons]
    extra = {"paired_file": "test_pairs.txt"} if paired_file else {}
    pairs += [_pair("viton", TEST_UNPAIRED, a, b, folder="test", **extra) for a, b in unpaired]
    return pairs


def _dresscode_pairs(root: Path, allow_paired: bool) -> list[dict]:
    pairs: list[dict] = []
    categories = [c for c in DRESSCODE_CATEGORIES if (root / c / "images").is_dir()]
    for category in categories:
        for split, name in DRESSCODE_PAIRS.items():
            listed = read_pairs(root / category / name)
            paired_file = split == TEST_UNPAIRED and check_unpaired(
                root / category / name, listed, "dresscode", allow_paired=allow_paired
            )
            extra = {"paired_file": f"{category}/{name}"} if paired_file else {}
            pairs += [_pair("dresscode", split, a, b, category=category, folder=category, **extra) for a, b in listed]
    return pairs


def list_pairs(root: str | Path, layout: str, *, allow_paired_as_unpaired: bool = False) -> list[dict]:
    """Every pair of the official splits: {split, person, cloth, identity, key, folder[, category]
    [, paired_file]}.

    Person-disjointness of training and test is checked (`check_person_disjoint`); so is that an
    unpaired pairs file is not a paired one (`check_unpaired`): unless `allow_paired_as_unpaired`,
    which marks its pairs with `paired_file` (the file's name) instead."""
    root = Path(root)
    if layout == "viton-hd":
        pairs = _viton_pairs(root, allow_paired_as_unpaired)
    elif layout == "dresscode":
        pairs = _dresscode_pairs(root, allow_paired_as_unpaired)
    else:
        raise SourceError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    unique = list({pair["key"]: pair for pair in pairs}.values())
    check_person_disjoint(unique, root)
    return unique


def check_person_disjoint(pairs: Iterable[dict], root: str | Path) -> None:
    """SourceError naming the persons (up to five) that appear in training and in test."""
    pairs = list(pairs)
    trained = {pair["identity"] for pair in pairs if pair["split"] == TRAIN}
    tested = {pair["identity"] for pair in pairs if pair["split"] != TRAIN}
    shared = sorted(trained & tested)
    if shared:
        raise SourceError(
            f"{root}: {len(shared)} person(s) in both the training and the test pairs ({', '.join(shared[:5])}); "
            "the control and evaluation sets must hold no person the model trains on"
        )


def split_counts(pairs: Iterable[dict]) -> dict[str, int]:
    """Pairs per official split."""
    counts = dict.fromkeys(OFFICIAL_SPLITS, 0)
    for pair in pairs:
        counts[pair["split"]] += 1
    return counts
