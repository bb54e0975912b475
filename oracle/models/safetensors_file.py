"""A streaming writer for the safetensors format.

The format is an 8-byte little-endian header length, a JSON header giving every tensor's dtype,
shape and byte range, then the raw bytes. The header depends only on shapes, so it is written
first and tensors follow one at a time: a 16 GB checkpoint needs one tensor in memory, not all.
The header is compact JSON padded with spaces to a multiple of 8 bytes, as the reference
implementation pads it; `safetensors.safe_open` reads the result.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO, TypeGuard

import torch

from oracle.models.layout import TensorSpec

SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
}


def _header(specs: Sequence[TensorSpec], dtype: torch.dtype, metadata: dict[str, str]) -> bytes:
    itemsize = torch.empty((), dtype=dtype).element_size()
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    for spec in specs:
        end = offset + spec.numel * itemsize
        header[spec.name] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": list(spec.shape),
            "data_offsets": [offset, end],
        }
        offset = end
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    return raw + b" " * (-len(raw) % 8)


def _write_tensor(f: BinaryIO, tensor: torch.Tensor) -> None:
    # Raw bytes in the machine's order; safetensors is little-endian, checked by the caller.
    f.write(tensor.contiguous().view(torch.uint8).reshape(-1).numpy().data)


def write_safetensors(
    path: Path,
    specs: Sequence[TensorSpec],
    tensors: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype,
    metadata: dict[str, str],
) -> None:
    """Write `tensors` (matching `specs` in order, name, shape and dtype) to `path`."""
    if sys.byteorder != "little":
        raise RuntimeError("writing safetensors needs a little-endian machine")
    header = _header(specs, dtype, metadata)
    spec_iter = iter(specs)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for name, tensor in tensors:
            spec = next(spec_iter, None)
            if (
                spec is None
                or spec.name != name
                or tuple(tensor.shape) != spec.shape
                or tensor.dtype != dtype
            ):
                raise ValueError(
                    f"tensor {name} {tuple(tensor.shape)} {tensor.dtype} does not match the header"
                )
            _write_tensor(f, tensor)
        if next(spec_iter, None) is not None:
            raise ValueError("fewer tensors than the header lists")


# Reading: a file's header checked against its size before any tensor is read, so a truncated or
# corrupt file is one line naming it (and the tensor), not a library error or a huge allocation.
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
            "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
MAX_HEADER_BYTES = 100 << 20


def read_header(path: Path) -> dict[str, dict[str, Any]]:
    """The tensors a safetensors file holds (name -> dtype, shape, data_offsets), each checked
    against the file's size. Raises ModelError naming the file, and the tensor where one is at fault."""
    header, data_size = _raw_header(path)
    return {name: _tensor_entry(f"{path}: tensor {name}", info, data_size)
            for name, info in header.items() if name != "__metadata__"}


def _raw_header(path: Path) -> tuple[dict[str, Any], int]:
    """The header's JSON object and the bytes of data after it; ModelError for a file too short for either."""
    from oracle.errors import ModelError

    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelError(f"{path}: not a safetensors file ({size} bytes: truncated)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise ModelError(f"{path}: not a safetensors file or truncated (header of {n} bytes, file of {size})")
            raw = f.read(n)
    except OSError as e:
        raise ModelError(f"{path}: cannot read ({e.strerror or e})") from e
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ModelError(f"{path}: corrupt safetensors header ({e})") from e
    if not isinstance(header, dict):
        raise ModelError(f"{path}: corrupt safetensors header (not a JSON object)")
    return header, size - 8 - n


def _is_shape(shape: Any) -> TypeGuard[list[int]]:
    return isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)


def _is_offsets(offsets: Any) -> TypeGuard[list[int]]:
    return (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
            and 0 <= offsets[0] <= offsets[1])


def _tensor_entry(where: str, info: Any, data_size: int) -> dict[str, Any]:
    """One tensor's header entry, its byte range checked against its dtype and shape and the data's size."""
    from oracle.errors import ModelError

    if not isinstance(info, dict):
        raise ModelError(f"{where}: corrupt header entry")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in ITEMSIZE:
        raise ModelError(f"{where}: unknown dtype {dtype!r}")
    if not _is_shape(shape):
        raise ModelError(f"{where}: corrupt shape {shape!r}")
    if not _is_offsets(offsets):
        raise ModelError(f"{where}: corrupt data_offsets {offsets!r}")
    expected = math.prod(shape) * ITEMSIZE[dtype]
    if offsets[1] - offsets[0] != expected:
        raise ModelError(f"{where}: {offsets[1] - offsets[0]} bytes for shape {shape} {dtype} "
                         f"(expected {expected})")
    if offsets[1] > data_size:
        raise ModelError(f"{where}: bytes [{offsets[0]}, {offsets[1]}) beyond the end of the data "
                         f"({data_size} bytes): the file is truncated")
    return {"dtype": dtype, "shape": tuple(shape), "data_offsets": tuple(offsets)}
