"""Byte-plane checkpoint compression (drape/training/checkpoints/planes.py, stored.py): a packed file
unpacks to the safetensors file byte for byte (every dtype, tensors split across segments); it is
smaller on AdamW-shaped fp32 values; a zip bomb, a lying size, a damaged plane or a truncated file is
refused naming the file; a compressed stage checkpoint loads, resumes and exports as a plain one,
and a pack that does not read back publishes nothing."""

import hashlib
import json
import struct

import pytest
import torch
import zstandard
from safetensors.torch import save_file

from drape.training.checkpoints import planes
from drape.training.checkpoints.checkpoint import (
    STAGE_FILE,
    export_weights,
    load_model,
    load_training_state,
    model_tensor_names,
    read_manifest,
    read_model_tensors,
    save_checkpoint,
    verify_checkpoint,
)
from drape.training.checkpoints.planes import SUFFIX, PlanesError, iter_unpacked, load_packed, pack_file
from drape.training.checkpoints.stored import PACKED, read_file
from tests.unit.test_stage_checkpoints import _trained


def _adamw_state(count: int = 20_000, steps: int = 3) -> dict[str, torch.Tensor]:
    """A linear layer's weights after `steps` AdamW steps on random gradients, and its moments."""
    generator = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(count // 100, 100)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-3)
    for _ in range(steps):
        for parameter in layer.parameters():
            parameter.grad = torch.randn(parameter.shape, generator=generator) * 1e-3
        optimizer.step()
    state = optimizer.state[layer.weight]
    return {"weight": layer.weight.detach().clone(), "exp_avg": state["exp_avg"], "exp_avg_sq": state["exp_avg_sq"]}


def _every_dtype() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    values = torch.randn(3001, generator=generator)
    return {
        "f32": values * 1e-3,
        "bf16": values.bfloat16(),
        "f16": values.half(),
        "f64": values.double(),
        "i64": torch.arange(7),
        "bool": values > 0,
        "u8": torch.randint(0, 255, (33,), dtype=torch.uint8, generator=generator),
        "scalar": torch.tensor(3.5),
        "empty": torch.empty(0, 4),
        "odd": torch.tensor([float("nan"), float("inf"), -0.0]),  # bit patterns, not numbers, are kept
    }


def _packed(tmp_path, tensors, name="x.safetensors"):
    raw = tmp_path / name
    save_file(tensors, str(raw), metadata={"made_by": "test"})
    return raw, pack_file(raw, tmp_path / f"{name}{SUFFIX}")


def test_a_packed_file_unpacks_to_the_safetensors_file_byte_for_byte(tmp_path, monkeypatch):
    monkeypatch.setattr(planes, "CHUNK_BYTES", 4096)  # tensors across many segments, ends that are not whole chunks
    tensors = _every_dtype()
    raw, record = _packed(tmp_path, tensors)
    assert record == {
        "file": "x.safetensors.planes",
        "format": planes.FORMAT,
        "bytes": raw.stat().st_size,
        "sha256": hashlib.sha256(raw.read_bytes()).hexdigest(),
    }
    assert b"".join(iter_unpacked(tmp_path / record["file"], record)) == raw.read_bytes()
    loaded = load_packed(tmp_path / record["file"], record)
    assert loaded.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert loaded[name].dtype == tensor.dtype and loaded[name].shape == tensor.shape, name
        assert loaded[name].contiguous().view(-1).view(torch.uint8).tolist() == tensor.view(-1).view(torch.uint8).tolist()


def test_bytes_that_are_no_safetensors_file_still_pack_losslessly(tmp_path):
    raw = tmp_path / "odd.safetensors"
    raw.write_bytes(b"\xff" * 9 + bytes(range(256)) * 3)
    record = pack_file(raw, tmp_path / "odd.planes")
    assert b"".join(iter_unpacked(tmp_path / "odd.planes", record)) == raw.read_bytes()


def test_adamw_weights_and_moments_pack_smaller_than_zstd_on_the_plain_file(tmp_path):
    raw, record = _packed(tmp_path, _adamw_state())
    plain = len(zstandard.ZstdCompressor(level=planes.LEVEL).compress(raw.read_bytes()))
    packed = (tmp_path / record["file"]).stat().st_size
    assert packed < 0.88 * raw.stat().st_size and packed < 0.93 * plain, (packed, plain, raw.stat().st_size)


def _write(path, blobs: list[bytes], segments: list, record: dict) -> None:
    """A packed file by hand: `blobs` in order, then an index naming `segments` and `record`'s size and hash."""
    index = json.dumps({**record, "segments": segments}).encode()
    path.write_bytes(b"".join(blobs) + index + struct.pack("<Q8s", len(index), planes.MAGIC))


def test_a_zip_bomb_is_refused_before_it_is_decompressed(tmp_path):
    payload = b"\0" * 64
    record = {"file": "b.planes", "format": planes.FORMAT, "bytes": 64, "sha256": hashlib.sha256(payload).hexdigest()}
    bomb = zstandard.ZstdCompressor().compress(b"\0" * (256 << 20))  # 256 MiB in a few KiB, for a 64-byte plane
    _write(tmp_path / "b.planes", [bomb], [[64, 1, [[len(bomb), 1]]]], record)
    with pytest.raises(PlanesError, match=r"b\.planes: segment 0's zstd frame declares 268,435,456 bytes, its index 64"):
        load_packed(tmp_path / "b.planes", record)
    streamed = zstandard.ZstdCompressor().compressobj()  # a frame that does not declare its size
    unsized = streamed.compress(b"\0" * (1 << 20)) + streamed.flush()
    _write(tmp_path / "u.planes", [unsized], [[64, 1, [[len(unsized), 1]]]], record)
    with pytest.raises(PlanesError, match=r"u\.planes: segment 0's zstd frame declares -1 bytes"):
        load_packed(tmp_path / "u.planes", record)


def test_a_lying_size_is_refused_naming_the_file(tmp_path):
    raw, record = _packed(tmp_path, _every_dtype())
    packed = tmp_path / record["file"]
    with pytest.raises(PlanesError, match="x.safetensors.planes: its index says .* the manifest .*not the file"):
        load_packed(packed, {**record, "bytes": record["bytes"] + 1})
    with pytest.raises(PlanesError, match="the manifest declares 1099511627777 bytes for it; expected 0 to"):
        load_packed(packed, {**record, "bytes": planes.MAX_RAW_BYTES + 1})
    payload = b"\1" * 64  # an index whose segments add up to more than it declares
    small = {"file": "s.planes", "format": planes.FORMAT, "bytes": 32, "sha256": hashlib.sha256(payload[:32]).hexdigest()}
    _write(tmp_path / "s.planes", [payload], [[64, 1, [[64, 0]]]], small)
    with pytest.raises(PlanesError, match="s.planes: its segments hold 64 raw bytes in 64 stored, but it declares 32"):
        load_packed(tmp_path / "s.planes", small)
    _write(tmp_path / "c.planes", [payload], [[1 << 30, 1, [[64, 1]]]], small)
    with pytest.raises(PlanesError, match="c.planes: segment 0 of its index is malformed or beyond"):
        load_packed(tmp_path / "c.planes", small)


@pytest.mark.parametrize("where", ["exponent", "mantissa", "truncated", "footer"])
def test_a_damaged_packed_file_is_refused_naming_it(tmp_path, where):
    raw, record = _packed(tmp_path, _adamw_state(count=4000))
    packed = tmp_path / record["file"]
    data = bytearray(packed.read_bytes())
    (length,) = struct.unpack_from("<Q", data, len(data) - 16)
    segments = json.loads(bytes(data[len(data) - 16 - length : len(data) - 16]))["segments"]
    offsets, position = {}, 0
    for _raw_bytes, width, stored in segments:
        for k, (size, codec) in enumerate(stored):
            if width == 4:
                offsets.setdefault("exponent" if k == 3 else "mantissa", (position, codec))
            position += size
    if where == "truncated":
        del data[10:20]
    elif where == "footer":
        data[-1] ^= 0xFF
    else:
        offset, codec = offsets[where]
        assert codec == (1 if where == "exponent" else 0)  # the exponent plane compressed, the low mantissa byte stored
        data[offset + 40] ^= 0x10
    packed.write_bytes(bytes(data))
    with pytest.raises(PlanesError, match=r"x\.safetensors\.planes: "):
        load_packed(packed, record)


def _stage(config, tmp_path, *, compress: bool):
    model, names = _trained(config)
    parameters = dict(model.named_parameters())
    optimizer = torch.optim.AdamW([parameters[n] for n in names], lr=1e-3)
    generator = torch.Generator().manual_seed(2)  # the same state in both formats
    for parameter in optimizer.param_groups[0]["params"]:
        parameter.grad = torch.randn(parameter.shape, generator=generator) * 1e-3
    optimizer.step()
    ema = {n: parameters[n].detach() * 0.5 for n in names}
    path = save_checkpoint(
        tmp_path / ("packed" if compress else "plain") / "step-0000001",
        model=model, optimizer=optimizer, trainable_names=names, ema=ema,
        manifest={"stage": "texture", "step": 1}, bases=tmp_path / "bases", compress=compress,
    )  # fmt: skip
    return model, names, optimizer, ema, path


def test_a_compressed_stage_checkpoint_loads_resumes_and_exports_bit_for_bit(config, tmp_path):
    model, names, optimizer, ema, path = _stage(config, tmp_path, compress=True)
    _, _, _, _, plain = _stage(config, tmp_path, compress=False)
    manifest = read_manifest(path)
    packed = ("ema.safetensors", "optimizer.safetensors", STAGE_FILE)
    assert sorted(manifest[PACKED]) == sorted(packed) and PACKED not in read_manifest(plain)
    assert sorted(p.name for p in path.glob("*.safetensors*")) == sorted(f"{name}{SUFFIX}" for name in packed)
    for name in packed:  # each packed file is the plain checkpoint's file, byte for byte
        assert manifest[PACKED][name]["sha256"] == hashlib.sha256((plain / name).read_bytes()).hexdigest()
        assert manifest["files"][f"{name}{SUFFIX}"] == hashlib.sha256((path / f"{name}{SUFFIX}").read_bytes()).hexdigest()
    for prefer_ema in (False, True):
        loaded, reference = load_model(path, prefer_ema=prefer_ema).state_dict(), load_model(plain, prefer_ema=prefer_ema)
        for name, tensor in reference.state_dict().items():
            assert torch.equal(loaded[name], tensor), name
    fresh = torch.optim.AdamW([torch.nn.Parameter(torch.zeros_like(p)) for p in optimizer.param_groups[0]["params"]])
    restored_ema = load_training_state(path, fresh, names)
    assert restored_ema is not None and all(torch.equal(restored_ema[n], ema[n]) for n in names)
    for before, after in zip(optimizer.state.values(), fresh.state.values(), strict=True):
        assert all(torch.equal(before[field], after[field]) for field in ("step", "exp_avg", "exp_avg_sq"))
    assert sorted(model_tensor_names(path)) == sorted(model.state_dict())
    assert torch.equal(read_model_tensors(path, [names[0]])[names[0]], model.state_dict()[names[0]])
    exported = export_weights(path, tmp_path / "exported")
    assert sorted(read_manifest(exported)[PACKED]) == ["ema.safetensors", STAGE_FILE]
    assert torch.equal(load_model(exported, prefer_ema=True).state_dict()[names[0]], ema[names[0]])


def test_a_packed_file_whose_manifest_record_lies_is_refused_on_load(config, tmp_path):
    _, names, _, _, path = _stage(config, tmp_path, compress=True)
    manifest = read_manifest(path)
    manifest[PACKED][STAGE_FILE]["sha256"] = "0" * 64
    with pytest.raises(PlanesError, match="stage.safetensors.planes: its index says"):
        read_file(path, STAGE_FILE, manifest)
    assert verify_checkpoint(path)  # the files themselves are whole: only the record was wrong


def test_a_pack_that_does_not_read_back_publishes_nothing(config, tmp_path, monkeypatch):
    def garbled(path, record):
        yield b"not the file"

    monkeypatch.setattr(planes, "iter_unpacked", garbled)
    with pytest.raises(PlanesError, match="read back, it does not unpack to"):
        _stage(config, tmp_path, compress=True)
    assert not (tmp_path / "packed" / "step-0000001").exists()
