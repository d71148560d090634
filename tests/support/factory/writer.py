"""Seeded tensor values and a streaming safetensors writer.

Values come in chunks along axis 0, each chunk from its own generator seeded by
(seed, crc32(name), chunk index), so a tensor's bytes depend only on the seed, its name and its
shape -- not on the layout, the dtype or the order of writing -- and a real-shape checkpoint
(a 262144 x 8960 per-layer table) is written without ever holding a whole tensor in memory.

Dtypes: "float32", "bfloat16" (round to nearest even, by MLX), and "q4": MLX affine 4-bit with
group size 64 and bfloat16 scales/biases (8 bits for "router" tensors), as an mlx-community
4-bit conversion stores it; tensors that cannot be quantized stay bfloat16.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .params import Param

GROUP_SIZE = 64
_CHUNK_ELEMENTS = 1 << 22
_ST_CODES = {"float32": ("F32", 4), "bfloat16": ("BF16", 2), "uint32": ("U32", 4), "int64": ("I64", 8)}


def float_chunks(p: Param, seed: int) -> Iterator[np.ndarray]:
    """The values of `p` as float32 (int64 for a permutation), in chunks along axis 0."""
    shape = p.source_shape
    name_key = zlib.crc32(p.seed_name.encode("utf-8"))
    kind = p.init[0]
    if kind == "permutation":
        rng = np.random.default_rng([seed, name_key, 0])
        yield rng.permutation(shape[0]).astype(np.int64)
        return
    if len(shape) == 0:
        row_shape: tuple[int, ...] = ()
        n_rows, rows_per_chunk = 1, 1
    else:
        row_shape, n_rows = shape[1:], shape[0]
        rows_per_chunk = max(1, _CHUNK_ELEMENTS // max(1, int(np.prod(row_shape))))
    for c, start in enumerate(range(0, n_rows, rows_per_chunk)):
        rows = min(rows_per_chunk, n_rows - start)
        rng = np.random.default_rng([seed, name_key, c])
        size = (rows, *row_shape) if shape else ()
        if kind == "normal":
            values = rng.standard_normal(size, dtype=np.float32) * np.float32(p.init[1])
        elif kind == "uniform":
            lo, hi = p.init[1], p.init[2]
            values = rng.random(size, dtype=np.float32) * np.float32(hi - lo) + np.float32(lo)
        else:
            raise ValueError(f"unknown initialiser {p.init}")
        values = np.asarray(values, dtype=np.float32)
        if p.part is not None:
            index, count = p.part
            values = np.ascontiguousarray(np.split(values, count, axis=-2)[index])
        if p.perm is not None:  # axis 0 stays first, so each chunk of rows transposes alone
            values = np.ascontiguousarray(values.transpose(p.perm))
        yield values


def _bf16_bytes(values: np.ndarray) -> bytes:
    import mlx.core as mx

    return np.asarray(mx.array(values).astype(mx.bfloat16).view(mx.uint16)).tobytes()


@dataclass
class DiskTensor:
    name: str
    dtype: str  # a key of _ST_CODES
    shape: tuple[int, ...]
    chunks: Callable[[], Iterator[bytes]]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * _ST_CODES[self.dtype][1]


def quant_bits(p: Param) -> int | None:
    """Bits a 4-bit conversion gives `p`, or None when it stays unquantized."""
    if p.role not in ("linear", "embedding", "router") or len(p.shape) < 2:
        return None
    if p.shape[-1] % GROUP_SIZE:
        return None
    return 8 if p.role == "router" else 4


class _QuantStream:
    """Quantizes `p` chunk by chunk; the packed weight streams out first, then the scales and
    biases (1/8 to 1/16 of its size) that were kept while it streamed."""

    def __init__(self, p: Param, seed: int, bits: int):
        self.p, self.seed, self.bits = p, seed, bits
        self.scales: list[bytes] = []
        self.biases: list[bytes] = []

    def weight(self) -> Iterator[bytes]:
        import mlx.core as mx

        for values in float_chunks(self.p, self.seed):
            wq, s, b = mx.quantize(mx.array(values).astype(mx.bfloat16), group_size=GROUP_SIZE, bits=self.bits)
            self.scales.append(np.asarray(s.view(mx.uint16)).tobytes())
            self.biases.append(np.asarray(b.view(mx.uint16)).tobytes())
            yield np.asarray(wq).tobytes()

    def stored(self, which: str) -> Callable[[], Iterator[bytes]]:
        return lambda: iter(getattr(self, which))


def _lazy_chunks(p: Param, seed: int, encode: Callable[[np.ndarray], bytes]) -> Callable[[], Iterator[bytes]]:
    """The tensor's bytes, chunk by chunk, generated only when the writer asks."""
    return lambda: (encode(c) for c in float_chunks(p, seed))


def disk_tensors(params: list[Param], dtype: str, seed: int) -> tuple[list[DiskTensor], dict]:
    """On-disk tensors for `params` in `dtype`, and the per-path quantization entries
    (module path -> {group_size, bits}) for tensors quantized at other than 4 bits."""
    if dtype not in ("float32", "bfloat16", "q4"):
        raise ValueError(f"unknown dtype {dtype!r}; use float32, bfloat16 or q4")
    out: list[DiskTensor] = []
    per_path: dict = {}
    for p in sorted(params, key=lambda q: q.name):
        if p.init[0] == "permutation":
            out.append(DiskTensor(p.name, "int64", p.shape, _lazy_chunks(p, seed, np.ndarray.tobytes)))
            continue
        bits = quant_bits(p) if dtype == "q4" else None
        if bits is None:
            if dtype == "float32":
                out.append(DiskTensor(p.name, "float32", p.shape, _lazy_chunks(p, seed, np.ndarray.tobytes)))
            else:
                out.append(DiskTensor(p.name, "bfloat16", p.shape, _lazy_chunks(p, seed, _bf16_bytes)))
            continue
        stem = p.name.removesuffix(".weight")
        q = _QuantStream(p, seed, bits)
        lead, last = p.shape[:-1], p.shape[-1]
        out.append(DiskTensor(f"{stem}.weight", "uint32", (*lead, last * bits // 32), q.weight))
        out.append(DiskTensor(f"{stem}.scales", "bfloat16", (*lead, last // GROUP_SIZE), q.stored("scales")))
        out.append(DiskTensor(f"{stem}.biases", "bfloat16", (*lead, last // GROUP_SIZE), q.stored("biases")))
        if bits != 4:
            per_path[stem] = {"group_size": GROUP_SIZE, "bits": bits}
    return out, per_path


def write_safetensors(path: Path, tensors: list[DiskTensor], metadata: dict[str, str]) -> None:
    """Write `tensors` in list order; the header lists them sorted by name with their offsets."""
    header: dict = {}
    offset = 0
    for t in tensors:
        header[t.name] = {
            "dtype": _ST_CODES[t.dtype][0],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    ordered = {"__metadata__": metadata, **{k: header[k] for k in sorted(header)}}
    blob = json.dumps(ordered, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for t in tensors:
            written = 0
            for chunk in t.chunks():
                f.write(chunk)
                written += len(chunk)
            if written != t.nbytes:
                raise AssertionError(f"{t.name}: wrote {written} bytes, expected {t.nbytes}")


def write_weights(
    out: Path, tensors: list[DiskTensor], metadata: dict[str, str], max_shard_bytes: int | None = None
) -> list[str]:
    """`model.safetensors`, or with `max_shard_bytes` the hub's sharded form:
    `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json`. Returns the file names."""
    if not max_shard_bytes:
        write_safetensors(out / "model.safetensors", tensors, metadata)
        return ["model.safetensors"]
    shards: list[list[DiskTensor]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    n = len(shards)
    names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    weight_map = {}
    for name, shard in zip(names, shards):
        write_safetensors(out / name, shard, metadata)
        weight_map.update({t.name: name for t in shard})
    index = {
        "metadata": {"total_size": sum(t.nbytes for t in tensors)},
        "weight_map": {k: weight_map[k] for k in sorted(weight_map)},
    }
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return names
