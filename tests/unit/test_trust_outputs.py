"""Issue 51, class 2: constant outputs are refused by name with the measure and its bound, and a
control set too small to judge is refused by name with its minimum, on every way in."""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from drape.cli import app
from drape.data.dataset import load_control_dir
from drape.data.manifest import ManifestError
from drape.data.partition import PartitionError
from drape.gates.degenerate import MAX_ONE_COLOUR, MIN_LUMA_SPAN, MIN_STD, constant_outputs, constant_problem
from drape.gates.run import read_outputs
from tests.conftest import TINY

RNG = np.random.default_rng(51)


def _mostly_one_colour() -> np.ndarray:
    image = np.zeros((64, 48, 3), np.uint8)
    image[:4, :22] = RNG.integers(0, 256, (4, 22, 3))  # 2.9% of the frame has content
    return image


CONSTANT = {
    "all black": (lambda: np.zeros((64, 48, 3), np.uint8), rf"pixel std 0\.00 levels, at least {MIN_STD:g}"),
    "one colour": (lambda: np.full((64, 48, 3), (200, 30, 30), np.uint8), "pixel std .* levels, at least"),
    "noise under the bound": (
        lambda: np.clip(128 + RNG.normal(0, 0.8, (64, 48, 3)), 0, 255).round().astype(np.uint8),
        "pixel std 0.[0-9]+ levels",
    ),
    "a tiny range": (
        lambda: RNG.integers(124, 132, (64, 48, 3), dtype=np.uint8),
        rf"luma spans [0-9.]+ levels .*at least {MIN_LUMA_SPAN:g}",
    ),
    "one colour on 97% of the frame": (
        _mostly_one_colour,
        rf"9[0-9.]+% of its pixels are one colour rgb\(0, 0, 0\), at most {MAX_ONE_COLOUR:.0%}",
    ),
}


@pytest.mark.parametrize("variant", list(CONSTANT))
def test_constant_outputs_are_named_with_the_measure_and_the_bound(variant):
    make, message = CONSTANT[variant]
    problem = constant_problem(make(), "outputs/control-00003.png")
    assert problem is not None and problem.startswith("outputs/control-00003.png: "), problem
    assert __import__("re").search(message, problem), problem


def _low_contrast() -> np.ndarray:
    """A foggy photograph: a soft gradient and a figure, all within 95..140."""
    rows, cols = np.mgrid[0:64, 0:48]
    luma = 100 + 25 * rows / 63 + 5 * np.sin(cols / 4)
    luma[20:50, 16:32] += 10
    return np.repeat(luma[..., None], 3, axis=2).round().astype(np.uint8)


def _studio_shot() -> np.ndarray:
    """A figure on a flat white backdrop covering 85% of the frame."""
    image = np.full((64, 48, 3), 255, np.uint8)
    image[10:36, 10:28] = RNG.integers(0, 200, (26, 18, 3))
    return image


@pytest.mark.parametrize("make", [_low_contrast, _studio_shot], ids=["low contrast", "studio backdrop"])
def test_legitimate_low_contrast_and_flat_backdrop_outputs_pass(make):
    assert constant_problem(make(), "x.png") is None


def test_the_synthetic_control_targets_are_never_constant(tiny_dataset):
    control, _ = load_control_dir(tiny_dataset[0])
    assert constant_outputs(control["target"], control["keys"], "outputs") == []


def test_a_report_names_three_constant_outputs_and_counts_the_rest():
    outputs = np.zeros((5, 16, 16, 3), np.uint8)
    lines = constant_outputs(outputs, [f"k{i}" for i in range(5)], "run/outputs")
    assert [line.split(":")[0] for line in lines[:3]] == [f"constant output run/outputs/k{i}.png" for i in range(3)]
    assert lines[3] == "5 of 5 outputs are constant in all (2 more not listed)"


def _write(directory, keys, images):
    directory.mkdir(parents=True, exist_ok=True)
    for key, image in zip(keys, images):
        Image.fromarray(image).save(directory / f"{key}.png")


def test_gate_check_fails_constant_outputs_by_name_and_refuses_a_constant_baseline(tiny_dataset, tmp_path):
    directory = tiny_dataset[0]
    control, _ = load_control_dir(directory)
    keys, outputs = control["keys"], control["target"].copy()
    outputs[1], outputs[4] = 0, 77  # two collapsed outputs among good ones
    _write(tmp_path / "out", keys, outputs)
    args = ["gate", "check", "--control", str(directory), "--config", str(TINY), "--outputs", str(tmp_path / "out")]
    result = CliRunner().invoke(app, [*args, "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 1, result.output
    provenance = json.loads((tmp_path / "r.json").read_text())["provenance"]
    assert [line.split(":")[0] for line in provenance] == [f"constant output {tmp_path}/out/{keys[i]}.png" for i in (1, 4)]
    assert all("at least 2 expected" in line for line in provenance)
    _write(tmp_path / "base", keys, control["target"])
    Image.fromarray(np.full_like(control["target"][2], 9)).save(tmp_path / "base" / f"{keys[2]}.png")
    baseline = CliRunner().invoke(app, [*args, "--baseline-outputs", str(tmp_path / "base")])
    assert baseline.exit_code == 2 and f"{keys[2]}.png: pixel std 0.00" in baseline.output, baseline.output
    with pytest.raises(ValueError, match="a reference set of outputs may not hold a constant image"):
        read_outputs(tmp_path / "base", keys, reference=True)


# --- degenerate control sets, from a dataset root or a folder of shards ------------------------
def _root_with(tmp_path, directory, edit):
    root = tmp_path / "root"
    shutil.copytree(directory, root)
    manifest = json.loads((root / "manifest.json").read_text())
    (root / "manifest.json").write_text(edit(manifest) if callable(edit) else edit)
    return root


def _one_sample(manifest):
    manifest["splits"]["control"] = [{**manifest["splits"]["control"][0], "samples": 1}]
    return json.dumps(manifest)


@pytest.mark.parametrize(
    ("edit", "error", "match"),
    [
        ("{not json", ManifestError, r"root/manifest\.json: not JSON"),
        (lambda m: json.dumps({**m, "splits": {"identity": m["splits"]["identity"]}}), ManifestError, "expected a control split"),
        (lambda m: json.dumps({**m, "splits": {**m["splits"], "control": []}}), PartitionError, r"0 sample\(s\).*at least 2"),
        (_one_sample, PartitionError, r"'control' of .*root/manifest\.json holds 1 sample\(s\).*at least 2"),
        (
            lambda m: json.dumps(
                {**m, "splits": {**m["splits"], "control": [{**m["splits"]["control"][0], "path": "../x.tar"}]}}
            ),
            ManifestError,
            r"splits\.control\[0\]\.path",
        ),
    ],
    ids=["not json", "no control split", "empty control", "one sample", "path outside"],
)
def test_a_damaged_or_too_small_control_set_is_refused_naming_it(tiny_dataset, tmp_path, edit, error, match):
    with pytest.raises(error, match=match):
        load_control_dir(_root_with(tmp_path, tiny_dataset[0], edit), judged=True)


def test_a_folder_of_control_shards_too_small_to_judge_is_refused(tmp_path):
    from drape.data.shards import ShardWriter
    from drape.data.synth import generate_split

    folder = tmp_path / "control"
    with ShardWriter(out_dir=folder, root=tmp_path, prefix="control") as writer:
        writer.write(
            next(generate_split(seed=0, split="control", num_samples=1, num_identities=1, num_garments=1, resolution=32))
        )
    result = CliRunner().invoke(app, ["gate", "check", "--control", str(folder), "--outputs", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert f"'control' of the control shards in {folder} holds 1 sample(s) in 1 shard(s)" in " ".join(result.output.split())
    assert "at least 2" in result.output
    arrays, _ = load_control_dir(folder)  # a try-on's inputs or a shopper's photos: one is enough
    assert len(arrays["keys"]) == 1


def _huge_png(path, side: int = 30000) -> None:
    """A 1-bit side×side PNG of ~100 KiB: decoded as RGB it would take side² × 3 bytes."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    packer, row = zlib.compressobj(9), b"\0" * (1 + (side + 7) // 8)
    data = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b""))


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_a_huge_output_is_refused_from_its_header_naming_it(tmp_path):
    _huge_png(tmp_path / "k0.png", 12000)  # 144 Mpx: under PIL's bomb guard, 432 MB decoded
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"k0\.png: 12000×12000 px; expected 16×16"):
        read_outputs(tmp_path, ["k0"], (16, 16))  # the control set's size: refused before decoding
    assert time.monotonic() - started < 0.5
    _huge_png(tmp_path / "k1.png")  # 900 Mpx
    assert (tmp_path / "k1.png").stat().st_size < 1 << 20
    with pytest.raises(ValueError, match=r"k1\.png: not a readable PNG \(Image size \(900000000 pixels\) exceeds limit"):
        read_outputs(tmp_path, ["k1"])  # PIL's bomb guard, named
