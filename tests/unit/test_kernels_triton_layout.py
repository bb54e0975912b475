"""The fused norms sum in rms_norm_kernel's order: the same register layout for the reduction, read off the compiler.

tl.sum adds a row's lanes in a tree that follows the register layout the compiler gives the summed
tensor, and that layout follows the loads' vector width: rms_norm_kernel reads the composition's fp32
copy, the fused kernels read halves and an aligned weight. kernels/triton/fused.py caps its accesses'
contiguity (`load_contiguity`) so that the two layouts agree; this test compiles both for an H100 (Triton's compiler needs no GPU, only its CUDA
backend) and compares the layout of the reduction's operand in the TTGIR, for bf16 and fp16 and row
lengths with and without the divisibility by 16 that Triton specializes on. The interpreter has no
layouts, so only this test and tests/gpu/test_fused_cuda.py see the difference; it fails if the cap is
removed (sizePerThread 8 against 4), or kept at 4 for a row length that is no multiple of 16
(4 against 1: the weight's aligned loads widen the row's). Skipped without triton or its CUDA backend.
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs triton's compiler (not its interpreter)",
)

TORCH_TO_TRITON = {"float32": "fp32", "float64": "fp64", "bfloat16": "bf16", "float16": "fp16"}


def _compile(fn: Any, args: dict[str, Any], constexprs: dict[str, Any], options: dict[str, Any] | None = None) -> Any:
    """fn compiled for an H100 as a launch with `args` (pointers by element type, ints, floats) and the launch
    `options` specializes it; skipped where Triton cannot compile for CUDA."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature: dict[str, str] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for i, name in enumerate(fn.arg_names):
        value = args.get(name)
        if name in constexprs:
            signature[name] = "constexpr"
        elif isinstance(value, str):  # a pointer, by element type; fresh tensors are 16-byte aligned
            signature[name] = "*" + TORCH_TO_TRITON[value]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, int):
            signature[name] = "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32"
    try:
        source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
        return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, **(options or {})})
    except (TypeError, RuntimeError, ImportError) as error:  # another Triton API, or no CUDA backend
        pytest.skip(f"cannot compile for CUDA here: {error}")


def _reduce_layout(fn: Any, args: dict[str, Any], constexprs: dict[str, Any]) -> str:
    """The layout of the one tt.reduce operand in fn's TTGIR, compiled as a launch with `args` specializes it."""
    compiled = _compile(fn, args, constexprs)
    ttgir = compiled.asm["ttgir"]
    operand = re.search(r'"tt\.reduce"\(%[\w.]+\).*?\}\) : \(tensor<\d+xf32, (#\w+)>', ttgir, re.S)
    assert operand is not None, ttgir
    definition = re.search(rf"^{operand.group(1)} = (.*)$", ttgir, re.M)
    assert definition is not None, ttgir
    return definition.group(1)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
# Qwen3-8B's hidden size and head dim, others of that family, and lengths that are no multiple of 16.
@pytest.mark.parametrize("length", [4096, 5120, 4100, 3584, 200, 256, 128, 96, 80, 40])
def test_fused_norms_reduce_in_the_layout_of_rms_norm_kernel(dtype: str, length: int) -> None:
    import triton.language as tl
    from oracle_kernels.triton import fused, reduction
    from oracle_kernels.triton.config import row_tiles

    block = row_tiles(length).block
    composed = _reduce_layout(
        reduction.rms_norm_kernel,
        {"x_ptr": "float32", "w_ptr": "float32", "out_ptr": "float32", "rstd_ptr": "float32", "C": length,
         "stride_x": length, "stride_out": length, "eps": 1e-6},
        {"BLOCK": block, "HAS_WEIGHT": False, "ACC_DTYPE": tl.float32, "FP64": False})
    for residual in (True, False):
        fused_layout = _reduce_layout(
            fused.add_rms_norm_kernel,
            {"x_ptr": dtype, "r_ptr": dtype, "w_ptr": dtype, "out_ptr": dtype, "h_ptr": dtype, "C": length, "eps": 1e-6},
            {"BLOCK": block, "HAS_RESIDUAL": residual, "MAX_CONTIGUOUS": fused.load_contiguity(length)})
        assert fused_layout == composed, (residual, fused_layout, composed)
    if length <= fused.MAX_HEAD_DIM:
        rope_layout = _reduce_layout(
            fused.qk_norm_rope_kernel,
            {"x_ptr": dtype, "w_ptr": dtype, "cos_ptr": dtype, "sin_ptr": dtype, "out_ptr": dtype, "D": length,
             "num_heads": 8, "eps": 1e-6},
            {"BLOCK": block, "HAS_NORM": True, "MAX_CONTIGUOUS": fused.load_contiguity(length)})
        assert rope_layout == composed, (rope_layout, composed)


def _ptx(fn: Any, args: dict[str, Any], constexprs: dict[str, Any], options: dict[str, Any]) -> str:
    """fn's PTX for an H100, compiled as a launch with `args` and the launch `options` specializes it."""
    return str(_compile(fn, args, constexprs, options).asm["ptx"])


def _fmas(ptx: str) -> dict[str, int]:
    """How many fused multiply-adds of each type the PTX holds."""
    found: dict[str, int] = {}
    for kind in re.findall(r"\bfma\.rn(?:\.ftz)?\.(\w+)", ptx):
        found[kind] = found.get(kind, 0) + 1
    return found


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("length", [4096, 4100, 128, 80])
def test_fused_kernels_contract_no_product_the_composition_rounds(dtype: str, length: int) -> None:
    """The fused kernels compile (every global a constexpr) and hold no half-precision FMA: a product rounded to
    the half type and the sum after it stay two roundings, as in the composition's two torch kernels. With FP
    fusion on, the compiler read rope's `round(y * cos) + round(rot * sin)` as one `fma.rn.bf16`
    (an H100 showed the bits differ). Their only FMAs are the RMS reduction's, as many as rms_norm_kernel's."""
    import triton.language as tl
    from oracle_kernels.triton import fused, reduction
    from oracle_kernels.triton.config import POINTWISE_BLOCK, row_tiles

    block = row_tiles(length).block
    composed = _fmas(_ptx(
        reduction.rms_norm_kernel,
        {"x_ptr": "float32", "w_ptr": "float32", "out_ptr": "float32", "rstd_ptr": "float32", "C": length,
         "stride_x": length, "stride_out": length, "eps": 1e-6},
        {"BLOCK": block, "HAS_WEIGHT": False, "ACC_DTYPE": tl.float32, "FP64": False}, {}))
    assert set(composed) == {"f32"}, composed  # the reduction's `tl.fma`, with FP fusion at its default
    norm = _fmas(_ptx(
        fused.add_rms_norm_kernel,
        {"x_ptr": dtype, "r_ptr": dtype, "w_ptr": dtype, "out_ptr": dtype, "h_ptr": dtype, "C": length, "eps": 1e-6},
        {"BLOCK": block, "HAS_RESIDUAL": True, "MAX_CONTIGUOUS": fused.load_contiguity(length)}, fused.NO_FMA))
    assert norm == composed, (norm, composed)
    if length <= fused.MAX_HEAD_DIM:
        rope_args = {"x_ptr": dtype, "w_ptr": dtype, "cos_ptr": dtype, "sin_ptr": dtype, "out_ptr": dtype,
                     "D": length, "num_heads": 8, "eps": 1e-6}
        for has_norm in (True, False):
            rope = _fmas(_ptx(fused.qk_norm_rope_kernel, rope_args,
                              {"BLOCK": block, "HAS_NORM": has_norm, "MAX_CONTIGUOUS": fused.load_contiguity(length)},
                              fused.NO_FMA))
            assert rope == (composed if has_norm else {}), (has_norm, rope, composed)
    silu = _fmas(_ptx(fused.silu_mul_kernel, {"gate_ptr": dtype, "up_ptr": dtype, "out_ptr": dtype, "n": length},
                      {"BLOCK": POINTWISE_BLOCK}, fused.NO_FMA))
    assert silu == {}, silu


def test_the_fused_kernels_fail_this_check_with_fp_fusion_on() -> None:
    """The check above can fail: rope launched with FP fusion on holds a half-precision FMA."""
    from oracle_kernels.triton import fused

    rope = _fmas(_ptx(
        fused.qk_norm_rope_kernel,
        {"x_ptr": "bfloat16", "w_ptr": "bfloat16", "cos_ptr": "bfloat16", "sin_ptr": "bfloat16",
         "out_ptr": "bfloat16", "D": 128, "num_heads": 8, "eps": 1e-6},
        {"BLOCK": 128, "HAS_NORM": False, "MAX_CONTIGUOUS": 4}, {"enable_fp_fusion": True}))
    assert rope.get("bf16", 0) >= 1, rope


def _sass_arithmetic(fn: Any, args: dict[str, Any], constexprs: dict[str, Any], fusion: bool, num_warps: int) -> list[str]:
    """The floating-point instructions (opcodes, in order) of fn's SASS for an H100, FP fusion on or off."""
    try:
        from triton.tools.disasm import get_sass
    except ImportError as error:
        pytest.skip(f"no SASS disassembler here: {error}")
    compiled = _compile(fn, args, constexprs, {"num_warps": num_warps, "enable_fp_fusion": fusion})
    try:
        sass = get_sass(compiled.asm["cubin"])
    except (RuntimeError, OSError) as error:
        pytest.skip(f"cannot disassemble here: {error}")
    return re.findall(r"\b((?:FFMA|FMUL|FADD|DFMA|DMUL|DADD|HFMA2|HMUL2|HADD2|MUFU)\S*)\s", sass)


@pytest.mark.parametrize("length", [5120, 4096, 3584, 200, 128, 80])
def test_the_norms_compile_to_the_same_arithmetic_with_fp_fusion_on_and_off(length: int) -> None:
    """No contraction is left to the compiler in the RMS norms: rms_norm_kernel (launched with FP fusion at its
    default, on) and the fused add + RMS norm (launched with it off) compile to the same floating-point
    instructions either way, down to the SASS, so each computes exactly the operations written, which are the
    same in both (`reduction.row_rstd`). The mean was `sum / C`, an approximate reciprocal and a multiply that
    ptxas fused with `+ eps` where fusion was on (an H100 showed five fused shapes off by it)."""
    import triton.language as tl
    from oracle_kernels.triton import fused, reduction
    from oracle_kernels.triton.config import row_tiles

    tiles = row_tiles(length)
    for dtype, acc, fp64 in (("float32", tl.float32, False), ("float64", tl.float64, True)):
        args = {"x_ptr": dtype, "w_ptr": dtype, "out_ptr": dtype, "rstd_ptr": "float32", "C": length,
                "stride_x": length, "stride_out": length, "eps": 1e-6}
        consts = {"BLOCK": tiles.block, "HAS_WEIGHT": True, "ACC_DTYPE": acc, "FP64": fp64}
        on = _sass_arithmetic(reduction.rms_norm_kernel, args, consts, True, tiles.num_warps)
        assert on == _sass_arithmetic(reduction.rms_norm_kernel, args, consts, False, tiles.num_warps), dtype
    for dtype in ("bfloat16", "float16"):
        args = {"x_ptr": dtype, "r_ptr": dtype, "w_ptr": dtype, "out_ptr": dtype, "h_ptr": dtype, "C": length,
                "eps": 1e-6}
        consts = {"BLOCK": tiles.block, "HAS_RESIDUAL": True, "MAX_CONTIGUOUS": fused.load_contiguity(length)}
        on = _sass_arithmetic(fused.add_rms_norm_kernel, args, consts, True, tiles.num_warps)
        assert on == _sass_arithmetic(fused.add_rms_norm_kernel, args, consts, False, tiles.num_warps), dtype


def test_the_fusion_check_sees_an_approximate_mean_fused_with_eps() -> None:
    """The check above can fail: `sum / C + eps` in fp32 compiles to other instructions with fusion on."""
    import triton
    import triton.language as tl

    @triton.jit
    def approx_mean_kernel(x_ptr, out_ptr, C, eps, BLOCK: tl.constexpr):
        lanes = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + lanes, mask=lanes < C, other=0.0)
        tl.store(out_ptr, tl.sum(x * x, axis=0) / C + eps)

    args = {"x_ptr": "float32", "out_ptr": "float32", "C": 5120, "eps": 1e-6}
    on = _sass_arithmetic(approx_mean_kernel, args, {"BLOCK": 1024}, True, 4)
    assert on != _sass_arithmetic(approx_mean_kernel, args, {"BLOCK": 1024}, False, 4)
