"""The field's published try-on numbers, each with the protocol it was measured under, and whether
a `drape eval` result was measured the same way.

Numbers compare only under the same protocol (the design's facts on the field's metrics), so a
published figure is shown beside a result only when the run's protocol matches its own on
every part that moves the numbers: the dataset (VITON-HD, or which DressCode categories), the
official test split (paired or unpaired), the resolution, the resize before Inception (the field's
scripts use clean-fid's default, `clean`) and the sample count (VITON-HD's test split: 2,032
pairs). Otherwise the difference is named instead of the figure.

The figures are the papers' (CatVTON: paired SSIM 0.8704, LPIPS 0.0565, FID 5.425, unpaired FID
9.015; Leffa: FID 4.54 paired, 8.52 unpaired; both on VITON-HD at 1024×768). KID is left out: the
papers report it on different scales.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from drape.data.sources import TEST_PAIRED, TEST_UNPAIRED

VITON_HD_TEST_PAIRS = 2032
# the parts of a protocol that must match, in the order they are named
COMPARED = ("dataset", "split", "resolution", "resize", "samples")


@dataclass(frozen=True)
class Published:
    """One paper's figures on one split, with the protocol they were measured under."""

    model: str
    mode: str  # paired | unpaired
    metrics: dict[str, float] = field(hash=False)
    dataset: str = "VITON-HD"
    resolution: tuple[int, int] = (1024, 768)  # height, width
    resize: str = "clean"
    samples: int = VITON_HD_TEST_PAIRS

    @property
    def split(self) -> str:
        return TEST_PAIRED if self.mode == "paired" else TEST_UNPAIRED

    def protocol(self) -> dict:
        """The compared parts of its protocol, as a run's protocol holds them."""
        return {
            "dataset": self.dataset,
            "split": self.split,
            "resolution": list(self.resolution),
            "resize": self.resize,
            "samples": self.samples,
        }


PUBLISHED = (
    Published("CatVTON", "paired", {"ssim": 0.8704, "lpips": 0.0565, "fid": 5.425}),
    Published("Leffa", "paired", {"fid": 4.54}),
    Published("CatVTON", "unpaired", {"fid": 9.015}),
    Published("Leffa", "unpaired", {"fid": 8.52}),
)


def run_protocol(protocol: dict) -> dict:
    """The compared parts of a `drape eval` protocol (`drape.eval.runner.build_protocol`)."""
    return {
        "dataset": protocol.get("source", "unknown"),
        "split": protocol["split"],
        "resolution": list(protocol["resolution"]),
        "resize": protocol["resize"],
        "samples": protocol["samples"],
    }


def differences(protocol: dict, published: Published) -> list[str]:
    """The compared parts (`COMPARED`) on which the run's protocol differs from the published one."""
    ours, theirs = run_protocol(protocol), published.protocol()
    return [part for part in COMPARED if ours[part] != theirs[part]]


def comparable(protocol: dict, mode: str) -> list[Published]:
    """The published figures of `mode` measured under the run's protocol."""
    return [entry for entry in PUBLISHED if entry.mode == mode and not differences(protocol, entry)]


def describe(parts: dict) -> str:
    """'VITON-HD test_unpaired at 1024×768, clean resize, on 2,032 samples' from compared parts."""
    height, width = parts["resolution"]
    return f"{parts['dataset']} {parts['split']} at {height}×{width}, {parts['resize']} resize, on {parts['samples']:,} samples"


def not_comparable(protocol: dict, mode: str) -> list[str]:
    """One line per published protocol of `mode` that the run does not match, naming the
    difference: 'CatVTON, Leffa: published on VITON-HD test_paired at 1024×768, clean resize, on
    2,032 samples; this run: ... : not comparable (dataset, resolution differ)'."""
    groups: dict[str, list[Published]] = {}
    for entry in PUBLISHED:
        if entry.mode == mode and differences(protocol, entry):
            groups.setdefault(json.dumps(entry.protocol(), sort_keys=True), []).append(entry)
    lines = []
    for entries in groups.values():
        names, parts = ", ".join(entry.model for entry in entries), differences(protocol, entries[0])
        lines.append(
            f"{names}: published on {describe(entries[0].protocol())}; this run: {describe(run_protocol(protocol))}: "
            f"not comparable ({', '.join(parts)} differ{'s' if len(parts) == 1 else ''}), published figures not shown"
        )
    return lines
