"""A one-kernel repro a kernel engineer can run: `repro/` in the report folder.

Holds the named op's inputs from both calls (`expected.safetensors`: the target alone;
`actual.safetensors`: the failing trial), `op.json` (the op, every non-tensor argument, where the
target's rows are, devices, the localized op) and `repro.py`, which needs only torch and the
engine's package: it loads both sets, runs the op on each and prints the ULP difference of the
target's rows. Tensors are written in the safetensors format with their strides in `op.json`, so
the op sees the same shapes, dtypes and strides it saw in the engine.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from oracle.capture.rows import Snapshot

# Python packages that register an op namespace when imported.
NAMESPACE_IMPORTS = {
    "_vllm_fa3_C": ["vllm.vllm_flash_attn"], "_vllm_fa2_C": ["vllm.vllm_flash_attn"],
    "_C": ["vllm._custom_ops"], "_C_cache_ops": ["vllm._custom_ops"], "_C_cpu": ["vllm._custom_ops"],
    "vllm": ["vllm.model_executor.layers.attention", "vllm.attention.layer"],
    "oracle_kernels": ["oracle_kernels"],
}
_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
           torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
           torch.bool: "BOOL"}


def _encode(value: Any, tensors: dict[str, torch.Tensor], meta: dict[str, Any], path: str) -> Any:
    """A JSON form of an argument; tensors go to `tensors` under `path`, their layout to `meta`."""
    if isinstance(value, torch.Tensor):
        tensors[path] = value.detach().contiguous().cpu()
        meta[path] = {"shape": list(value.shape), "stride": list(value.stride()), "dtype": str(value.dtype),
                      "device": str(value.device)}
        return {"tensor": path}
    if isinstance(value, (list, tuple)):
        return {"list": [_encode(v, tensors, meta, f"{path}.{i}") for i, v in enumerate(value)]}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value)}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value if not isinstance(value, float) or value == value else {"float": repr(value)}
    return {"unsupported": type(value).__name__}


def _write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    header: dict[str, Any] = {}
    offset = 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for t in tensors.values():
            f.write(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def _op_name(func: Any) -> str:
    ns, _, name = str(func._schema.name).partition("::")
    return f"{ns}.{name}.{func._schema.overload_name or 'default'}"


def write_repro(folder: Path, localized: dict[str, Any], expected: Snapshot, actual: Snapshot,
                grids: tuple[int, int], imports: Sequence[str] = ()) -> Path:
    """Write `folder` (replaced whole, via a temporary sibling); returns it."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".repro-", dir=folder.parent))
    sides: dict[str, Any] = {}
    for side, snap, grid in (("expected", expected, grids[0]), ("actual", actual, grids[1])):
        tensors: dict[str, torch.Tensor] = {}
        meta: dict[str, Any] = {}
        args = [_encode(a, tensors, meta, f"arg{i}") for i, a in enumerate(snap.args)]
        kwargs = {k: _encode(v, tensors, meta, f"kw.{k}") for k, v in snap.kwargs.items()}
        _write_safetensors(tmp / f"{side}.safetensors", tensors)
        g = snap.layout.grids[grid]
        sides[side] = {"args": args, "kwargs": kwargs, "tensors": meta, "result": snap.result,
                       "grid": {"shape": list(g.shape), "rows": [list(r) for r in g.rows],
                                "positions": list(g.positions)}}
    ns = str(expected.func._schema.name).partition("::")[0]
    spec = {"op": _op_name(expected.func), "schema": str(expected.func._schema), "threads": expected.threads,
            "imports": list(dict.fromkeys([*NAMESPACE_IMPORTS.get(ns, []), *imports])),
            "localized": localized, **sides}
    (tmp / "op.json").write_text(json.dumps(spec, indent=1) + "\n")
    (tmp / "repro.py").write_text(REPRO_PY)
    (tmp / "README.md").write_text(
        f"# One-op repro: {spec['op']}\n\n{localized.get('module', '')}, pass {localized.get('forward_pass')}, "
        f"step {localized.get('engine_step')}: the target's rows differ between the solo run (expected) and the "
        "trial (actual).\n\n    python repro.py            # runs the op on both inputs, prints the ULP difference\n"
        "    python repro.py --device cpu\n\nNeeds torch and the package that registers the op "
        f"({', '.join(spec['imports']) or 'torch only'}).\n")
    if folder.exists():
        old = folder.with_name(folder.name + ".old")
        os.replace(folder, old)
        _remove(old)
    os.replace(tmp, folder)
    return folder


def _remove(path: Path) -> None:
    for p in sorted(path.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    path.rmdir()


REPRO_PY = r'''"""Run one op on the inputs it got in two runs of an engine and print how the target's rows differ.

Usage: python repro.py [--device DEVICE]. Needs torch and the package named in op.json "imports".
Exit 0 when the rows differ (the repro reproduces), 1 when they are bitwise equal.
"""
import argparse
import importlib
import json
import struct
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


def load(path):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, h in header.items():
        lo, hi = h["data_offsets"]
        raw = bytearray(data[base + lo:base + hi])
        t = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(DTYPES[h["dtype"]]).reshape(h["shape"])
    return out


def decode(v, tensors, meta, device):
    if isinstance(v, dict):
        if "tensor" in v:
            name = v["tensor"]
            m = meta[name]
            dev = device or m["device"]
            t = torch.empty_strided(m["shape"], m["stride"], dtype=tensors[name].dtype, device=dev)
            return t.copy_(tensors[name].to(dev))
        if "list" in v:
            return [decode(x, tensors, meta, device) for x in v["list"]]
        if "dtype" in v:
            return getattr(torch, v["dtype"].split(".")[-1])
        if "device" in v:
            return torch.device(device or v["device"])
        if "float" in v:
            return float(v["float"])
        raise SystemExit(f"repro: cannot rebuild an argument of type {v}")
    return v


def rows_of(t, grid):
    if len(grid["shape"]) == 1:
        return t.index_select(0, torch.tensor([r[0] for r in grid["rows"]], device=t.device))
    dim = 1 if t.shape[1] == grid["shape"][1] else 2
    return torch.stack([t[b].select(dim - 1, s) for b, s in grid["rows"]])


def run(spec, side, op, device):
    s = spec[side]
    tensors = load(HERE / f"{side}.safetensors")
    args = [decode(a, tensors, s["tensors"], device) for a in s["args"]]
    kwargs = {k: decode(v, tensors, s["tensors"], device) for k, v in s["kwargs"].items()}
    out = op(*args, **kwargs)
    where, _, which = s["result"].partition(":")
    if where == "arg":
        name, _, idx = which.partition(".")
        names = [a.name for a in op._schema.arguments]
        t = kwargs[name] if name in kwargs else args[names.index(name)]
        t = t[int(idx)] if idx else t
    else:
        flat = [x for x in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(x, torch.Tensor)]
        t = flat[int(which)]
    return dict(zip(s["grid"]["positions"], rows_of(t, s["grid"]).detach().cpu()))


def ordered(t):
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[t.element_size()]
    bits = t.contiguous().view(ints).to(torch.int64)
    top = 1 << (8 * t.element_size() - 1)
    return torch.where(bits < 0, -(bits + top), bits)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", help="run on this device instead of the recorded one (e.g. cpu)")
    a = ap.parse_args()
    spec = json.loads((HERE / "op.json").read_text())
    for module in spec["imports"]:
        try:
            importlib.import_module(module)
        except ImportError as e:
            print(f"note: import {module} failed: {e}", file=sys.stderr)
    torch.set_num_threads(spec.get("threads") or torch.get_num_threads())  # CPU kernels can block by threads
    ns, name, overload = spec["op"].split(".")
    op = getattr(getattr(getattr(torch.ops, ns), name), overload)
    with torch.no_grad():
        expected = run(spec, "expected", op, a.device)
        actual = run(spec, "actual", op, a.device)
    worst, differing = 0, []
    for pos in spec["localized"]["positions"]:
        e, x = expected.get(pos), actual.get(pos)
        if e is None or x is None:
            continue
        if e.is_floating_point():
            d = int((ordered(e) - ordered(x)).abs().max()) if e.numel() else 0
        else:
            d = int((e != x).sum())
        if d:
            differing.append(pos)
            worst = max(worst, d)
    print(f"{spec['op']} ({spec['localized'].get('module', '')}): {len(differing)} of "
          f"{len(spec['localized']['positions'])} target rows differ, max {worst} ULP")
    return 0 if differing else 1


if __name__ == "__main__":
    sys.exit(main())
'''
