"""A one-kernel repro a kernel engineer can run: `repro/` in the report folder.

Holds the named op's inputs from both calls (`expected.safetensors`: the target alone;
`actual.safetensors`: the failing trial), `op.json` (the op, every non-tensor argument, where the
target's rows are (for a KV-cache write: its own slots), devices, the state the op ran in inside the
engine (`oracle.capture.state`: oracle_kernels on or off, threads, matmul flags, kernel-selecting
environment variables), the localized op) and `repro.py`, which needs only torch and the engine's
package: it puts that state back, loads both sets, runs the op on each and prints the ULP difference
of the target's rows. Exit 0: they differ (the difference reproduces); 1: they agree; 2: it could
not run (one line says why). Tensors are written in the safetensors format with their strides in
`op.json`, so the op sees the same shapes, dtypes and strides it saw in the engine. An opaque handle
among the arguments is rebuilt by its recipe (`oracle.capture.handles`) from tensors the repro
carries, after checking here that the rebuilt one gives the op's bits; an argument nothing can
rebuild makes the folder say `standalone: false` and why, and repro.py exit 2 saying so.
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

from oracle.capture.copies import clone_inputs, named_args
from oracle.capture.handles import recipe_for, suspect_handles
from oracle.capture.rows import Snapshot
from oracle.capture.target_rows import kv_slots

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


def _custom_op_module(func: Any) -> list[str]:
    """The Python module that defined a `torch.library.custom_op` (importing it registers the op), if any."""
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:
        return []
    opdef = OPDEFS.get(str(func._schema.name))
    module = getattr(getattr(opdef, "_init_fn", None), "__module__", None)
    return [module] if isinstance(module, str) and module != "__main__" else []


def _rebuilt_handle(snap: Snapshot) -> tuple[dict[str, torch.Tensor] | None, str]:
    """What the op's opaque handle is rebuilt from (checked: the rebuilt handle gives the op's bits), or why not."""
    from oracle.capture.state import OpState, applied

    recipe = recipe_for(snap.func)
    if recipe is None:
        return None, ""
    try:
        with applied(snap.state or OpState.now()), torch.no_grad():
            tensors = recipe.read(named_args(snap.func, snap.args, snap.kwargs))
            handle = recipe.build(tensors)
            kept = _result_with(snap, recipe.arg, None)
            rebuilt = _result_with(snap, recipe.arg, handle)
    except Exception as err:  # noqa: BLE001 - said in the repro folder, never raised: the repro is optional
        return None, f"its {recipe.arg} (a handle of the engine's process) could not be rebuilt: {type(err).__name__}: {err}"
    if kept is None or rebuilt is None or not torch.equal(_raw(kept), _raw(rebuilt)):
        return None, f"its {recipe.arg}, rebuilt from what it was read back as, does not give the engine's bits"
    return tensors, ""


def _result_with(snap: Snapshot, arg: str, handle: torch.Tensor | None) -> torch.Tensor | None:
    """The op's result on a fresh copy of its inputs, its argument `arg` replaced by `handle` when one is given."""
    from oracle.capture.confirm import result_tensor

    args, kwargs = clone_inputs(snap.func, snap.args, snap.kwargs)
    if handle is not None and arg in kwargs:
        kwargs[arg] = handle
    elif handle is not None:
        names = list(named_args(snap.func, args, kwargs))
        args = tuple(handle if n == arg else a for n, a in zip(names, args, strict=False))
    out = snap.func(*args, **kwargs)
    return result_tensor(snap, args, kwargs, out)


def _raw(t: torch.Tensor) -> torch.Tensor:
    """A float tensor as its bytes, so equality is bitwise; others as they are."""
    return t.view(torch.uint8) if t.is_floating_point() else t


def write_repro(folder: Path, localized: dict[str, Any], expected: Snapshot, actual: Snapshot,
                grids: tuple[int, int], imports: Sequence[str] = (), kind: str = "out") -> Path:
    """Write `folder` (replaced whole, via a temporary sibling); returns it.

    `kind` "kv_write": the target's rows are its own slots of the written cache (recorded per side).
    When an argument cannot be rebuilt in another process (an opaque handle no recipe covers, an object
    of an unsupported type), op.json says `standalone: false` and why, and repro.py exits 2 saying so.
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".repro-", dir=folder.parent))
    sides: dict[str, Any] = {}
    why: list[str] = []
    for side, snap, grid in (("expected", expected, grids[0]), ("actual", actual, grids[1])):
        sides[side], reasons = _write_side(tmp / f"{side}.safetensors", snap, grid, kind)
        why += reasons
    ns = str(expected.func._schema.name).partition("::")[0]
    state = expected.state.to_json() if expected.state is not None else {"threads": expected.threads}
    why = list(dict.fromkeys(why))
    spec = {"op": _op_name(expected.func), "schema": str(expected.func._schema), "threads": expected.threads,
            "state": state, "kind": kind, "standalone": not why, "why_not_standalone": "; ".join(why),
            "imports": list(dict.fromkeys([*NAMESPACE_IMPORTS.get(ns, []), *_custom_op_module(expected.func),
                                           *imports])),
            "localized": localized, **sides}
    (tmp / "op.json").write_text(json.dumps(spec, indent=1) + "\n")
    (tmp / "repro.py").write_text(REPRO_PY)
    (tmp / "README.md").write_text(_readme(spec, why))
    if folder.exists():
        old = folder.with_name(folder.name + ".old")
        os.replace(folder, old)
        _remove(old)
    os.replace(tmp, folder)
    return folder


def _write_side(path: Path, snap: Snapshot, grid: int, kind: str) -> tuple[dict[str, Any], list[str]]:
    """One call's arguments as op.json holds them, its tensors written to `path`; and why it cannot run
    standalone, if it cannot."""
    tensors: dict[str, torch.Tensor] = {}
    meta: dict[str, Any] = {}
    args = [_encode(a, tensors, meta, f"arg{i}") for i, a in enumerate(snap.args)]
    kwargs = {k: _encode(v, tensors, meta, f"kw.{k}") for k, v in snap.kwargs.items()}
    why = _place_handle(snap, args, kwargs, tensors, meta)
    why += [f"its argument {name} looks like a handle of the engine's process, which no recipe rebuilds"
            for name in suspect_handles(snap.func, snap.args, snap.kwargs)]
    why += [f"its argument {where} is a {value}, which the repro cannot rebuild"
            for where, value in _unsupported(args, kwargs)]
    _write_safetensors(path, tensors)
    return {"args": args, "kwargs": kwargs, "tensors": meta, "result": snap.result,
            "grid": _grid_json(snap, grid, kind)}, why


def _place_handle(snap: Snapshot, args: list[Any], kwargs: dict[str, Any], tensors: dict[str, torch.Tensor],
                  meta: dict[str, Any]) -> list[str]:
    """Put the recipe for the op's opaque handle where the handle was among the encoded arguments (or say it
    is unsupported); why it could not be rebuilt, if it could not."""
    recipe = recipe_for(snap.func)
    if recipe is None:
        return []
    built, reason = _rebuilt_handle(snap)
    spec = ({"handle": recipe.recipe, "from": {n: _encode(t, tensors, meta, f"handle.{n}") for n, t in built.items()}}
            if built is not None else {"unsupported": f"handle ({reason})"})
    names = [a.name for a in snap.func._schema.arguments]
    if recipe.arg in kwargs:
        kwargs[recipe.arg] = spec
    elif recipe.arg in names and names.index(recipe.arg) < len(args):
        args[names.index(recipe.arg)] = spec
    return [reason] if reason else []


def _grid_json(snap: Snapshot, grid: int, kind: str) -> dict[str, Any]:
    """Where the target's rows are in the result: its grid; for a KV-cache write, its own slots of the cache."""
    g = snap.layout.grids[grid]
    out: dict[str, Any] = {"shape": list(g.shape), "rows": [list(r) for r in g.rows], "positions": list(g.positions)}
    if kind == "kv_write":
        slots = kv_slots(snap.args, snap.kwargs, g)
        out["slots"] = [int(x) for x in slots.tolist()] if slots is not None else []
        out["block_size"] = snap.layout.block_size
    return out


def _readme(spec: dict[str, Any], why: list[str]) -> str:
    localized, state = spec["localized"], spec["state"]
    mode = "oracle_kernels' batch-invariant overrides on" if state.get("oracle_kernels") else "torch's default kernels"
    standalone = ("" if not why else "\n**This op cannot run standalone**: " + "; ".join(why)
                  + ". repro.py says so and exits 2.\n")
    return (
        f"# One-op repro: {spec['op']}\n\n{localized.get('module', '')}, pass {localized.get('forward_pass')}, "
        f"step {localized.get('engine_step')}: the target's rows differ between the solo run (expected) and the "
        f"trial (actual). Confirmation: {localized.get('confirmation')} ({localized.get('confirm_note')}).\n"
        f"{standalone}\n"
        "    python repro.py            # runs the op on both inputs, prints the ULP difference\n"
        "    python repro.py --device cpu\n\n"
        f"Runs as the engine ran it: {mode}, {state.get('threads')} threads (op.json `state`). Exit 0: the "
        "target's rows differ (the difference reproduces); 1: they are bitwise equal; 2: the repro could not run "
        "(the reason on one line).\n\nNeeds torch and the package that registers the op "
        f"({', '.join(spec['imports']) or 'torch only'}).\n")


def _unsupported(args: list[Any], kwargs: dict[str, Any]) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []

    def walk(v: Any, path: str) -> None:
        if isinstance(v, dict):
            if "unsupported" in v and not str(v["unsupported"]).startswith("handle"):
                found.append((path, str(v["unsupported"])))
            for k, x in v.items():
                walk(x, f"{path}.{k}" if k != "list" else path)
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, f"{path}[{i}]")

    walk(args, "args")
    walk(kwargs, "kwargs")
    return found


def _remove(path: Path) -> None:
    for p in sorted(path.rglob("*"), reverse=True):
        p.rmdir() if p.is_dir() else p.unlink()
    path.rmdir()


REPRO_PY = r'''"""Run one op on the inputs it got in two runs of an engine and print how the target's rows differ.

Usage: python repro.py [--device DEVICE]. Needs torch and the packages named in op.json "imports".
It runs the op as the engine ran it (op.json "state": oracle_kernels' overrides on or off, threads,
matmul precision; the recorded environment variables are set before anything is imported).
Exit 0: the target's rows differ (the difference reproduces); 1: they are bitwise equal;
2: the repro could not run (one line on stderr says why).
"""
import argparse
import contextlib
import importlib
import json
import os
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


class CannotRun(Exception):
    pass


def load(path, torch, dtypes):
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, h in header.items():
        lo, hi = h["data_offsets"]
        raw = bytearray(data[base + lo:base + hi])
        t = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        out[name] = t.view(dtypes[h["dtype"]]).reshape(h["shape"])
    return out


def onednn_mm_handler(torch, tensors):
    # vLLM's CPU GEMM handle, built as vLLM builds it at load: the [N, K] weight passed as its [K, N] view.
    if not hasattr(torch.ops._C, "create_onednn_mm_handler"):
        raise CannotRun("this vLLM build has no _C.create_onednn_mm_handler to rebuild the oneDNN handle")
    return torch.tensor(torch.ops._C.create_onednn_mm_handler(tensors["weight"].t(), 32), dtype=torch.int64)


BUILDS = {"onednn_mm_handler": onednn_mm_handler}


def decode(v, tensors, meta, device, torch):
    if isinstance(v, dict):
        if "tensor" in v:
            name = v["tensor"]
            m = meta[name]
            dev = device or m["device"]
            t = torch.empty_strided(m["shape"], m["stride"], dtype=tensors[name].dtype, device=dev)
            return t.copy_(tensors[name].to(dev))
        if "list" in v:
            return [decode(x, tensors, meta, device, torch) for x in v["list"]]
        if "dtype" in v:
            return getattr(torch, v["dtype"].split(".")[-1])
        if "device" in v:
            return torch.device(device or v["device"])
        if "float" in v:
            return float(v["float"])
        if "handle" in v:
            built = {k: decode(x, tensors, meta, device, torch) for k, x in v["from"].items()}
            return BUILDS[v["handle"]](torch, built)
        raise CannotRun(f"an argument cannot be rebuilt here: {v}")
    return v


def rows_of(t, grid, torch):
    if "slots" in grid:  # a KV-cache write: the target's own slots of the cache
        bs = grid.get("block_size")
        flat = t.flatten(0, 1) if t.dim() == 4 and (bs is None or t.shape[1] == bs) else t
        return flat.index_select(0, torch.tensor(grid["slots"], device=t.device, dtype=torch.long))
    if len(grid["shape"]) == 1:
        if t.shape[0] != grid["shape"][0]:
            raise CannotRun(f"the result has {t.shape[0]} rows, the pass had {grid['shape'][0]}")
        return t.index_select(0, torch.tensor([r[0] for r in grid["rows"]], device=t.device))
    dim = 1 if t.shape[1] == grid["shape"][1] else 2
    return torch.stack([t[b].select(dim - 1, s) for b, s in grid["rows"]])


def run(spec, side, op, device, torch, dtypes):
    s = spec[side]
    tensors = load(HERE / f"{side}.safetensors", torch, dtypes)
    args = [decode(a, tensors, s["tensors"], device, torch) for a in s["args"]]
    kwargs = {k: decode(v, tensors, s["tensors"], device, torch) for k, v in s["kwargs"].items()}
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
    return dict(zip(s["grid"]["positions"], rows_of(t, s["grid"], torch).detach().cpu()))


def ordered(t, torch):
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[t.element_size()]
    bits = t.contiguous().view(ints).to(torch.int64)
    top = 1 << (8 * t.element_size() - 1)
    return torch.where(bits < 0, -(bits + top), bits)


def vllm_batch_invariant():
    # vLLM's own batch-invariant mode, as its GPU worker turns it on at start (its overrides are process-wide).
    for name in ("vllm.model_executor.determinism.batch_invariant", "vllm.model_executor.layers.batch_invariant"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        module.init_batch_invariance()
        return
    raise CannotRun("the op ran under vLLM's batch-invariant mode (VLLM_BATCH_INVARIANT=1), which this vLLM cannot turn on")


@contextlib.contextmanager
def engine_state(state, torch):
    # The kernel mode the op ran under in the engine: oracle_kernels' overrides on or off.
    threads = torch.get_num_threads()
    torch.set_num_threads(state.get("threads") or threads)
    if "float32_matmul_precision" in state:
        torch.set_float32_matmul_precision(state["float32_matmul_precision"])
    if state.get("deterministic_algorithms"):
        torch.use_deterministic_algorithms(True)
    if (state.get("env") or {}).get("VLLM_BATCH_INVARIANT", "0").lower() in ("1", "true"):
        vllm_batch_invariant()
    if state.get("oracle_kernels"):
        try:
            import oracle_kernels
        except ImportError as e:
            raise CannotRun(f"the op ran under oracle_kernels' batch-invariant kernels, which do not import: {e}")
        with oracle_kernels.batch_invariant():
            yield
    else:
        yield


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", help="run on this device instead of the recorded one (e.g. cpu)")
    a = ap.parse_args()
    spec = json.loads((HERE / "op.json").read_text())
    if not spec.get("standalone", True):
        raise CannotRun(f"{spec['op']} cannot run standalone: {spec.get('why_not_standalone')}")
    state = spec.get("state") or {"threads": spec.get("threads")}
    for k, v in (state.get("env") or {}).items():  # read by kernels at import: set before anything loads
        os.environ[k] = v
    try:
        import torch
    except ImportError as e:
        raise CannotRun(f"torch does not import: {e}")
    dtypes = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}
    for module in spec["imports"]:
        try:
            importlib.import_module(module)
        except ImportError as e:
            print(f"note: import {module} failed: {e}", file=sys.stderr)
    ns, name, overload = spec["op"].split(".")
    try:
        op = getattr(getattr(getattr(torch.ops, ns), name), overload)
    except (AttributeError, RuntimeError) as e:
        raise CannotRun(f"the op {spec['op']} is not registered (imports: {', '.join(spec['imports']) or 'none'}): {e}")
    with torch.no_grad(), engine_state(state, torch):
        expected = run(spec, "expected", op, a.device, torch, dtypes)
        actual = run(spec, "actual", op, a.device, torch, dtypes)
    worst, differing, compared = 0, [], 0
    for pos in spec["localized"]["positions"]:
        e, x = expected.get(pos), actual.get(pos)
        if e is None or x is None:
            continue
        compared += 1
        if e.shape != x.shape:
            d = 1
        elif e.is_floating_point():
            d = int((ordered(e, torch) - ordered(x, torch)).abs().max()) if e.numel() else 0
        else:
            d = int((e != x).sum())
        if d:
            differing.append(pos)
            worst = max(worst, d)
    if not compared:
        raise CannotRun("the op's result holds none of the target's differing rows")
    mode = "oracle_kernels on" if state.get("oracle_kernels") else "default kernels"
    print(f"{spec['op']} ({spec['localized'].get('module', '')}; {mode}, {state.get('threads')} threads): "
          f"{len(differing)} of {compared} target rows differ, max {worst} ULP")
    return 0 if differing else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CannotRun as e:
        print(f"repro: could not run: {e}", file=sys.stderr)
        sys.exit(2)
    except Exception as e:  # the op raised on its inputs, or the folder is damaged: never a traceback as a verdict
        print(f"repro: could not run: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", file=sys.stderr)
        sys.exit(2)
'''
