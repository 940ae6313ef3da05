"""Published figures beside a result only under the same protocol (`drape.eval.published`), and
what `drape eval` prints otherwise."""

from __future__ import annotations

import pytest

from drape.cli.eval import _print_result
from drape.eval.published import PUBLISHED, comparable, differences, not_comparable
from drape.eval.session import dataset_source


def _protocol(**changes) -> dict:
    """A run's protocol (as `build_protocol` writes it) that matches the published paired one."""
    protocol = {
        "model": "v7",
        "dataset": "viton-hd/v1",
        "source": "VITON-HD",
        "split": "test_paired",
        "mode": "paired",
        "samples": 2032,
        "resolution": [1024, 768],
        "resize": "clean",
        "seed": 0,
        "sampler": "ddpm, 50 steps",
        "guidance_scale": 1.0,
        "guidance_conditions": [],
        "inception": "inception-2015-12-05.pt",
        "lpips": "alex (alexnet-owt-7be5be79.pth)",
        "kid_subsets": 100,
        "kid_subset_size": 1000,
    }
    return {**protocol, **changes}


def test_the_published_figures_are_the_papers():
    figures = {(entry.model, entry.mode): entry.metrics for entry in PUBLISHED}
    assert figures[("CatVTON", "paired")] == {"ssim": 0.8704, "lpips": 0.0565, "fid": 5.425}
    assert figures[("CatVTON", "unpaired")] == {"fid": 9.015}
    assert figures[("Leffa", "paired")] == {"fid": 4.54} and figures[("Leffa", "unpaired")] == {"fid": 8.52}
    assert {(entry.dataset, tuple(entry.resolution), entry.resize, entry.samples) for entry in PUBLISHED} == {
        ("VITON-HD", (1024, 768), "clean", 2032)
    }


@pytest.mark.parametrize("mode, split", [("paired", "test_paired"), ("unpaired", "test_unpaired")])
def test_the_same_protocol_is_comparable(mode, split):
    protocol = _protocol(split=split, mode=mode)
    assert [entry.model for entry in comparable(protocol, mode)] == ["CatVTON", "Leffa"]
    assert not_comparable(protocol, mode) == []


@pytest.mark.parametrize(
    "part, change",
    [
        ("dataset", {"source": "DressCode (upper_body, lower_body, dresses)"}),
        ("dataset", {"source": "synthetic"}),
        ("split", {"split": "control"}),
        ("split", {"split": "test_unpaired"}),
        ("resolution", {"resolution": [512, 384]}),
        ("resize", {"resize": "legacy"}),
        ("samples", {"samples": 2000}),
    ],
)
def test_each_difference_is_named_and_hides_the_figures(part, change):
    protocol = _protocol(**change)
    assert differences(protocol, PUBLISHED[0]) == [part]
    assert comparable(protocol, "paired") == []
    (line,) = not_comparable(protocol, "paired")
    assert line.startswith("CatVTON, Leffa: published on VITON-HD test_paired at 1024×768, clean resize, on 2,032 samples;")
    assert line.endswith(f"not comparable ({part} differs), published figures not shown")


def test_a_small_legacy_run_names_every_difference():
    protocol = _protocol(source="synthetic", split="control", resolution=[64, 48], resize="legacy", samples=16)
    (line,) = not_comparable(protocol, "paired")
    assert "this run: synthetic control at 64×48, legacy resize, on 16 samples" in line
    assert "not comparable (dataset, split, resolution, resize, samples differ)" in line


def test_eval_prints_published_figures_only_under_their_protocol(capsys):
    result = {"protocol": _protocol(), "metrics": {"ssim": 0.81, "lpips": 0.09, "fid": 7.5, "kid": 0.004, "kid_std": 0.001}}
    _print_result(result, "paired")
    shown = " ".join(capsys.readouterr().out.split())
    assert "CatVTON (published, same protocol)" in shown and "Leffa (published, same protocol)" in shown
    assert "5.425" in shown and "0.8704" in shown and "4.54" in shown and "not comparable" not in shown
    _print_result({**result, "protocol": _protocol(resolution=[64, 48], resize="legacy", samples=16)}, "paired")
    shown = " ".join(capsys.readouterr().out.split())
    assert "5.425" not in shown and "0.8704" not in shown and "4.54" not in shown and "published, same protocol" not in shown
    assert "this run: VITON-HD test_paired at 64×48, legacy resize, on 16 samples: not comparable" in shown
    assert "(resolution, resize, samples differ)" in shown


@pytest.mark.parametrize(
    "source, named",
    [
        ({"layout": "viton-hd", "pairs": 22}, "VITON-HD"),
        ({"layout": "dresscode", "categories": ["upper_body", "dresses"]}, "DressCode (upper_body, dresses)"),
        ({"layout": "dresscode"}, "DressCode (categories not recorded)"),
        ({"layout": "dresscode", "categories": [3, None]}, "DressCode (categories not recorded)"),
        ({"generator": "drape.data.synth", "seed": 0}, "synthetic"),
        ({"name": "viton", "version": "v1", "manifest_hash": "ab"}, "unknown"),
        ("junk", "unknown"),
    ],
)
def test_the_dataset_source_is_named_from_the_manifest(source, named):
    assert dataset_source({"source": source}) == named
