"""The gate reads opaque RGB outputs only: any transparency is refused, the file named (a constant
output fails `drape gate check` by name; what makes one constant: tests/unit/test_degenerate.py); a huge
output is refused from its header."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from drape.cli import app
from drape.data.dataset import load_control_dir
from drape.gates.run import read_outputs
from tests.conftest import TINY


def _noise(mode: str = "RGB") -> Image.Image:
    pixels = np.random.default_rng(0).integers(0, 256, (16, 16, 4), dtype=np.uint8)
    pixels[..., 3] = 255
    return Image.fromarray(pixels[..., : len(mode)], mode)


def _half_transparent() -> Image.Image:
    pixels = np.asarray(_noise("RGBA")).copy()
    pixels[8:, :, 3] = 128
    return Image.fromarray(pixels, "RGBA")


def _transparent_palette() -> Image.Image:
    image = _noise().convert("P")
    image.info["transparency"] = 0
    return image


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Image.fromarray(np.zeros((16, 16, 4), np.uint8), "RGBA"), "100% of its pixels are transparent"),
        (_half_transparent, "50% of its pixels are transparent"),
        (_transparent_palette, "of its pixels are transparent"),
    ],
)
def test_transparent_and_constant_outputs_are_refused_naming_the_file(tmp_path, make, message):
    make().save(tmp_path / "control-00000.png")
    with pytest.raises(ValueError, match=message) as error:
        read_outputs(tmp_path, ["control-00000"])
    assert "control-00000.png" in str(error.value)


def test_an_opaque_rgba_output_is_read_as_its_rgb(tmp_path):
    image = _noise("RGBA")
    image.save(tmp_path / "control-00000.png")
    (array,) = read_outputs(tmp_path, ["control-00000"])
    assert (array == np.asarray(image)[..., :3]).all()


# --- constant outputs fail `drape gate check` by name; huge outputs are refused from their header ---
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
