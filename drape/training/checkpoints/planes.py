"""Byte-plane compression of safetensors files: lossless, bounded, verified (ZipNN's byte grouping).

A float's bytes are not alike: the byte that carries the exponent takes few values (weights and
AdamW moments sit within a few powers of two), the mantissa bytes are close to random. Compressed
as one stream, zstd finds little (fp32 weights: ~92% of their size); split into *planes* (byte k of
every value together) and compressed plane by plane, the exponent plane shrinks to about a third
and the whole to ~82%. Each 32-bit (16-bit) value is first rotated left by one bit, so the sign
leaves the exponent byte and the exponent fills it (ZipNN's "exponent extraction").

A packed file (``<name>.safetensors.planes``) is the safetensors file's bytes cut into segments
(the header, then each tensor's data in chunks of at most `CHUNK_BYTES`; 4-byte planes for F32,
2 for BF16/F16, 1 for anything else), each plane a zstd frame (or stored as is when zstd does not
shrink it), followed by a JSON index, its length (u64, little-endian) and `MAGIC`. The index names
the format, the raw file's size and sha256 and, per segment, its raw size, value width and the
stored size and codec of each plane. Unpacking gives back the safetensors file byte for byte.

Reading treats the file as untrusted: the index is bounded (`MAX_INDEX_BYTES`), its raw size must
be the one the checkpoint manifest declares (at most `MAX_RAW_BYTES`), each segment at most
`CHUNK_BYTES`, each zstd frame must declare the size the index gives its plane and decompress to
exactly that (a zip bomb or a lying size is refused naming the file), and the result must hash to
the manifest's sha256 before a tensor is handed out.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

FORMAT = "drape-planes-v1"
SUFFIX = ".planes"  # stage.safetensors → stage.safetensors.planes
MAGIC = b"DRPLANE1"
CHUNK_BYTES = 16 << 20  # a segment's raw bytes: what packing and unpacking hold of it at once
MAX_INDEX_BYTES = 16 << 20  # ~40 bytes a segment: a million segments, 16 TiB of tensors
MAX_RAW_BYTES = 1 << 40  # beyond any checkpoint file (a 20 B-parameter model in fp32 is 80 GB)
LEVEL = 1  # zstd's level 1: as small as 3-9 on planes (Huffman-coded literals), several times faster
_WIDTHS = {"F32": 4, "BF16": 2, "F16": 2}  # floats whose exponent gets a plane of its own
_RAW, _ZSTD = 0, 1
_FOOTER = struct.Struct("<Q8s")


class PlanesError(ValueError):
    """A packed file that is damaged, lies about its sizes, or is not the file its manifest names."""


def _zstd():
    import zstandard  # imported when a checkpoint is packed or unpacked, not with drape

    return zstandard


def _segments(raw: memoryview) -> Iterator[tuple[int, int, int]]:
    """(start, end, width) covering `raw`: its safetensors header, then each tensor's bytes in chunks.
    Bytes a header does not explain (or a file that is no safetensors) go as width 1: still lossless."""
    spans: list[tuple[int, int, int]] = []
    try:
        (length,) = struct.unpack_from("<Q", raw, 0)
        header = json.loads(bytes(raw[8 : 8 + min(length, len(raw))]))
        for name, entry in header.items():
            if name != "__metadata__":
                begin, end = entry["data_offsets"]
                spans.append((8 + length + int(begin), 8 + length + int(end), _WIDTHS.get(entry["dtype"], 1)))
    except (struct.error, ValueError, TypeError, KeyError, AttributeError):
        spans = []
    position = 0
    for begin, end, width in sorted(spans):
        if begin < position or end > len(raw) or (end - begin) % width:  # overlapping or odd: bytes as they are
            continue
        if begin > position:
            yield from _chunks(position, begin, 1)
        yield from _chunks(begin, end, width)
        position = end
    yield from _chunks(position, len(raw), 1)


def _chunks(start: int, end: int, width: int) -> Iterator[tuple[int, int, int]]:
    step = CHUNK_BYTES - CHUNK_BYTES % width
    for begin in range(start, end, step):
        yield begin, min(begin + step, end), width


def _split(data: memoryview, width: int) -> list[bytes]:
    """The `width` byte planes of `data`, each value rotated left one bit first (sign out of the exponent byte)."""
    if width == 1:
        return [bytes(data)]
    kind = np.uint32 if width == 4 else np.uint16
    values: Any = np.frombuffer(data, dtype=kind)
    rotated = (values << kind(1)) | (values >> kind(8 * width - 1))
    grid = rotated.view(np.uint8).reshape(-1, width)
    return [grid[:, k].tobytes() for k in range(width)]


def _join(planes: list[bytes], width: int) -> bytes:
    """The bytes `_split` took apart."""
    if width == 1:
        return planes[0]
    kind = np.uint32 if width == 4 else np.uint16
    grid = np.empty((len(planes[0]), width), dtype=np.uint8)
    for k, plane in enumerate(planes):
        grid[:, k] = np.frombuffer(plane, dtype=np.uint8)
    values: Any = grid.view(kind).reshape(-1)
    return ((values >> kind(1)) | (values << kind(8 * width - 1))).tobytes()


def pack_file(raw_path: str | Path, packed_path: str | Path, *, level: int = LEVEL) -> dict:
    """Write `raw_path` (a safetensors file) packed to `packed_path`, read it back and check it
    unpacks to the same bytes; returns the manifest record (``file``, ``format``, ``bytes``,
    ``sha256`` of the raw file). `raw_path` is left as it is: the caller frees it."""
    raw_path, packed_path = Path(raw_path), Path(packed_path)
    compressor = _zstd().ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
    digest, segments = hashlib.sha256(), []
    with open(raw_path, "rb") as source, open(packed_path, "wb") as sink:
        size = raw_path.stat().st_size
        with mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) if size else _empty() as mapped:
            raw = memoryview(mapped)
            for start, end, width in _segments(raw):
                digest.update(raw[start:end])
                planes = []
                for plane in _split(raw[start:end], width):
                    packed = compressor.compress(plane)
                    stored, codec = (packed, _ZSTD) if len(packed) < len(plane) else (plane, _RAW)
                    sink.write(stored)
                    planes.append([len(stored), codec])
                segments.append([end - start, width, planes])
            del raw
        record = {"file": packed_path.name, "format": FORMAT, "bytes": size, "sha256": digest.hexdigest()}
        index = json.dumps({**record, "segments": segments}, separators=(",", ":")).encode()
        sink.write(index + _FOOTER.pack(len(index), MAGIC))
    unpacked = hashlib.sha256()
    for chunk in iter_unpacked(packed_path, record):
        unpacked.update(chunk)
    if unpacked.hexdigest() != record["sha256"]:  # iter_unpacked checks it too: an invariant
        raise PlanesError(f"{packed_path}: read back, it does not unpack to {raw_path}")
    return record


class _empty:
    """An empty file cannot be memory-mapped: an empty buffer in its place."""

    def __enter__(self) -> bytes:
        return b""

    def __exit__(self, *exc: object) -> None:
        return None


def _index(handle, path: Path, record: dict) -> tuple[list, int]:
    """The packed file's index, checked against itself, the file's size and the manifest `record`;
    (segments, where the index starts)."""
    size = path.stat().st_size
    if size < _FOOTER.size:
        raise PlanesError(f"{path}: {size} bytes, too short for a packed safetensors file ({FORMAT})")
    handle.seek(size - _FOOTER.size)
    length, magic = _FOOTER.unpack(handle.read(_FOOTER.size))
    if magic != MAGIC:
        raise PlanesError(f"{path}: not a packed safetensors file (expected {MAGIC!r} at its end, found {magic!r})")
    if length > min(MAX_INDEX_BYTES, size - _FOOTER.size):
        raise PlanesError(f"{path}: its index claims {length:,} bytes, beyond the file or {MAX_INDEX_BYTES:,}")
    start = size - _FOOTER.size - length
    handle.seek(start)
    try:
        index = json.loads(handle.read(length))
    except ValueError as error:
        raise PlanesError(f"{path}: its index is not JSON ({error})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise PlanesError(f"{path}: its index is not a {FORMAT} index")
    declared = record.get("bytes")
    if not isinstance(declared, int) or not 0 <= declared <= MAX_RAW_BYTES:
        raise PlanesError(f"{path}: the manifest declares {declared!r} bytes for it; expected 0 to {MAX_RAW_BYTES:,}")
    if index.get("bytes") != declared or index.get("sha256") != record.get("sha256"):
        raise PlanesError(
            f"{path}: its index says {index.get('bytes')!r} bytes (sha256 {str(index.get('sha256'))[:12]}), "
            f"the manifest {declared!r} ({str(record.get('sha256'))[:12]}): not the file the manifest names"
        )
    segments = index.get("segments")
    _check_segments(segments, path, declared, start)
    assert isinstance(segments, list)
    return segments, start


def _check_segments(segments: object, path: Path, declared: int, data_bytes: int) -> None:
    """Every segment well formed and bounded; raw sizes add up to `declared`, stored ones to `data_bytes`."""
    if not isinstance(segments, list):
        raise PlanesError(f"{path}: its index has no list of segments")
    raw_total = stored_total = 0
    for number, segment in enumerate(segments):
        stored = _stored_bytes(segment)
        if stored is None:
            raise PlanesError(f"{path}: segment {number} of its index is malformed or beyond {CHUNK_BYTES:,} bytes")
        raw_total, stored_total = raw_total + segment[0], stored_total + stored
    if raw_total != declared or stored_total != data_bytes:
        raise PlanesError(
            f"{path}: its segments hold {raw_total:,} raw bytes in {stored_total:,} stored, "
            f"but it declares {declared:,} in {data_bytes:,}: a truncated or lying file"
        )


def _stored_bytes(segment: object) -> int | None:
    """The stored bytes of a well-formed `[raw bytes, width, [[stored, codec], ...]]`; None otherwise."""
    if not (isinstance(segment, list) and len(segment) == 3 and type(segment[0]) is int and type(segment[1]) is int):
        return None
    raw_bytes, width, planes = segment
    if width not in (1, 2, 4) or not 0 < raw_bytes <= CHUNK_BYTES or raw_bytes % width:
        return None
    if not isinstance(planes, list) or len(planes) != width:
        return None
    total = 0
    for plane in planes:
        if not (isinstance(plane, list) and len(plane) == 2 and all(type(v) is int and v >= 0 for v in plane)):
            return None
        if plane[1] not in (_RAW, _ZSTD) or (plane[1] == _RAW and plane[0] != raw_bytes // width):
            return None
        total += plane[0]
    return total


def iter_unpacked(path: str | Path, record: dict) -> Iterator[bytes]:
    """The raw bytes of the packed file `path`, segment by segment (at most `CHUNK_BYTES` each),
    checked against the manifest `record` (``bytes``, ``sha256``): every size bounded as the module
    docstring says; the last chunk is yielded only once the whole file hashed to ``sha256``."""
    path = Path(path)
    decompressor, digest = _zstd().ZstdDecompressor(), hashlib.sha256()
    with open(path, "rb") as handle:
        segments, _ = _index(handle, path, record)
        handle.seek(0)
        pending = b""
        for number, (raw_bytes, width, planes) in enumerate(segments):
            size = raw_bytes // width
            parts = [_plane(handle.read(stored), codec, size, decompressor, path, number) for stored, codec in planes]
            chunk = _join(parts, width)
            digest.update(chunk)
            if pending:
                yield pending
            pending = chunk
    if digest.hexdigest() != record["sha256"]:
        raise PlanesError(
            f"{path}: unpacks to bytes whose sha256 is not the {str(record['sha256'])[:12]} its manifest records: damaged"
        )
    if pending:
        yield pending


def _plane(stored: bytes, codec: int, expected: int, decompressor, path: Path, number: int) -> bytes:
    """One plane of `expected` bytes: as stored, or a zstd frame that must declare and hold exactly that."""
    if codec == _RAW:
        if len(stored) != expected:
            raise PlanesError(f"{path}: segment {number} is truncated")
        return stored
    zstandard = _zstd()
    try:
        declared = zstandard.frame_content_size(stored)
    except zstandard.ZstdError as error:
        raise PlanesError(f"{path}: segment {number} is no zstd frame ({error})") from None
    if declared != expected:
        raise PlanesError(
            f"{path}: segment {number}'s zstd frame declares {declared:,} bytes, its index {expected:,}: refused unread"
        )
    try:
        plane = decompressor.decompress(stored, max_output_size=expected)
    except zstandard.ZstdError as error:
        raise PlanesError(f"{path}: segment {number} does not decompress ({error})") from None
    if len(plane) != expected:
        raise PlanesError(f"{path}: segment {number} decompresses to {len(plane):,} bytes, not {expected:,}")
    return plane


_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}  # fmt: skip


def load_packed(path: str | Path, record: dict) -> dict[str, torch.Tensor]:
    """The tensors of the packed safetensors file `path` (verified against `record`, `iter_unpacked`):
    one buffer of the file's size, tensors viewing it."""
    path = Path(path)
    raw = bytearray()
    for chunk in iter_unpacked(path, record):
        raw += chunk
    return _tensors(raw, path)


def _tensors(raw: bytearray, path: Path) -> dict[str, torch.Tensor]:
    """safetensors' layout, read from bytes already verified: the header, then each tensor's bytes."""
    try:
        (length,) = struct.unpack_from("<Q", raw, 0)
        header = json.loads(bytes(raw[8 : 8 + length]))
        start, tensors = 8 + length, {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            dtype, shape, (begin, end) = _DTYPES[entry["dtype"]], tuple(entry["shape"]), entry["data_offsets"]
            count = int(np.prod(shape, dtype=np.int64)) if shape else 1
            if not 0 <= begin <= end <= len(raw) - start or end - begin != count * dtype.itemsize:
                raise ValueError(f"tensor {name!r}'s offsets do not fit its shape")
            flat = torch.frombuffer(raw, dtype=dtype, count=count, offset=start + begin) if count else torch.empty(0, dtype=dtype)
            tensors[name] = flat.reshape(shape)
    except (struct.error, ValueError, TypeError, KeyError, AttributeError) as error:
        raise PlanesError(f"{path}: unpacks to no readable safetensors file ({error})") from None
    return tensors
