"""A streaming writer for the safetensors format.

The format is an 8-byte little-endian header length, a JSON header giving every tensor's dtype,
shape and byte range, then the raw bytes. The header depends only on shapes, so it is written
first and tensors follow one at a time: a 16 GB checkpoint needs one tensor in memory, not all.
The header is compact JSON padded with spaces to a multiple of 8 bytes, as the reference
implementation pads it; `safetensors.safe_open` reads the result.
"""

from __future__ import annotations

import json
import struct
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

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
