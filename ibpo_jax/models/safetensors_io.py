"""Minimal safetensors reader (lazy, memory-mapped, sliceable) and streaming writer.

Format: 8-byte little-endian header length n, n bytes of JSON {name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {...}}, then the raw little-endian tensor bytes
(offsets relative to the end of the header). Reading maps the file and returns numpy views, so a
caller that indexes a slice reads only those bytes; writing streams one tensor at a time, so a
checkpoint is never held whole in host memory.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable
from typing import NamedTuple

import ml_dtypes
import numpy as np

DTYPES = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
}
_NAMES = {v: k for k, v in DTYPES.items()}


class HFCheckpointError(ValueError):
    """A checkpoint that does not match the model: missing, misshapen or unreadable tensors."""


class TensorInfo(NamedTuple):
    file: str
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in `file`


def read_header(file: str) -> dict[str, TensorInfo]:
    """Name -> TensorInfo of every tensor in one .safetensors file (validated against EOF)."""
    try:
        size = os.path.getsize(file)
        with open(file, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise HFCheckpointError(f"{file}: truncated (no safetensors header)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise HFCheckpointError(f"{file}: truncated (header of {n} bytes, file {size})")
            header = json.loads(f.read(n))
    except FileNotFoundError:
        raise HFCheckpointError(f"checkpoint file {file} is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HFCheckpointError(f"{file}: corrupt safetensors header: {e}") from None
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype_name, shape, (begin, end) = meta["dtype"], tuple(meta["shape"]), \
                meta["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise HFCheckpointError(f"tensor {name} in {file}: header entry {meta!r} lacks a "
                                  "valid dtype / shape / data_offsets") from None
        if dtype_name not in DTYPES:
            raise HFCheckpointError(f"tensor {name} in {file}: unsupported dtype {dtype_name}")
        dtype = DTYPES[dtype_name]
        if end - begin != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
            raise HFCheckpointError(f"tensor {name} in {file}: byte range does not match shape")
        if 8 + n + end > size:
            raise HFCheckpointError(f"tensor {name} in {file}: data runs past the end of the file "
                                  f"(truncated checkpoint)")
        out[name] = TensorInfo(file, dtype, shape, 8 + n + begin)
    return out


def read_checkpoint_index(directory: str) -> dict[str, TensorInfo]:
    """Every tensor of an HF checkpoint directory: `model.safetensors`, or the shards listed by
    `model.safetensors.index.json`."""
    index_file = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index_file):
        try:
            with open(index_file, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
            files = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError,
                AttributeError) as e:
            raise HFCheckpointError(f"{index_file}: not a safetensors index with a 'weight_map' "
                                  f"of tensor -> file ({type(e).__name__}: {e})") from None
        tensors: dict[str, TensorInfo] = {}
        for file in files:
            tensors.update(read_header(os.path.join(directory, file)))
        for name, file in weight_map.items():
            if name not in tensors:
                raise HFCheckpointError(f"tensor {name}: listed in {index_file} under {file} but "
                                      f"absent from that file")
        return tensors
    single = os.path.join(directory, "model.safetensors")
    if not os.path.exists(single):
        raise HFCheckpointError(f"{directory}: neither model.safetensors nor "
                              f"model.safetensors.index.json")
    return read_header(single)


def open_tensor(info: TensorInfo) -> np.ndarray:
    """A read-only memory-mapped view of one tensor (nothing read until indexed)."""
    if not info.shape or 0 in info.shape:
        return np.fromfile(info.file, dtype=info.dtype, count=int(np.prod(info.shape)),
                           offset=info.offset).reshape(info.shape)
    return np.memmap(info.file, dtype=info.dtype, mode="r", offset=info.offset, shape=info.shape)


class PlannedTensor(NamedTuple):
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    produce: Callable[[], np.ndarray]  # called once, when the tensor's bytes are written


def write_file(file: str, tensors: Iterable[PlannedTensor], *, write: bool = True) -> int:
    """Streams `tensors` into one .safetensors file (header first, then each tensor's bytes as
    `produce()` returns them). `write=False` still calls every `produce` (multi-process
    collectives) but writes nothing. Returns the data size in bytes."""
    tensors = list(tensors)
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        nbytes = t.dtype.itemsize * int(np.prod(t.shape, dtype=np.int64))
        header[t.name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                          "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned
    f = open(file, "wb") if write else None
    try:
        if f:
            f.write(struct.pack("<Q", len(blob)) + blob)
        for t in tensors:
            arr = np.asarray(t.produce(), dtype=t.dtype)  # tobytes() writes C order
            if arr.shape != t.shape:
                raise HFCheckpointError(f"tensor {t.name}: produced {arr.shape}, planned {t.shape}")
            if f:
                f.write(arr.tobytes())
    finally:
        if f:
            f.close()
    return offset
