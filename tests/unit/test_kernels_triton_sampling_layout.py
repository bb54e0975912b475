"""The sampling kernel sums the exponentials in softmax_kernel's order: the same register layout, read off the compiler.

kernels/triton/sampling.py repeats reduction.softmax_kernel's pass 1 so that a token's log-probability has
the bits torch.log_softmax gives in invariant mode. The loop is the same source; the tree of the final
tl.sum follows the register layout the compiler gives the summed tensor, which follows the loads. This test
compiles both kernels for an H100 (Triton's compiler needs no GPU, only its CUDA backend) and compares the
layout of the operand of the one floating-point sum (`tt.reduce` over `arith.addf`) in the TTGIR, for
vocabularies with and without the divisibility by 16 that Triton specializes on. The interpreter has no
layouts; tests/gpu/test_sampling_cuda.py checks the bits on a GPU. Skipped without triton or its CUDA backend.
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

_SUM = re.compile(r'"tt\.reduce"\(%[\w.]+\)[^\n]*\n[^\n]*\n\s*%[\w.]+ = arith\.addf [^\n]*\n.*?\}\) : '
                  r'\(tensor<\d+xf32, (#\w+)>', re.S)


def _sum_layout(fn: Any, signature: dict[str, str], constexprs: dict[str, Any], length: int) -> str:
    """The layout of the float sum's operand in fn's TTGIR, compiled as a launch over rows of `length` specializes it."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # Fresh tensors are 16-byte aligned; C and the row stride are `length`, divisible by 16 or not.
    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, kind) in enumerate(signature.items())
             if kind.startswith("*") or (kind == "i32" and length % 16 == 0)}
    try:
        source = ASTSource(fn=fn, signature={**signature, **dict.fromkeys(constexprs, "constexpr")},
                           constexprs=constexprs, attrs=attrs)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
    except (TypeError, RuntimeError, ImportError) as error:  # another Triton API, or no CUDA backend
        pytest.skip(f"cannot compile for CUDA here: {error}")
    ttgir = compiled.asm["ttgir"]
    sums = _SUM.findall(ttgir)
    assert len(sums) == 1, ttgir
    definition = re.search(rf"^{sums[0]} = (.*)$", ttgir, re.M)
    assert definition is not None, ttgir
    return definition.group(1)


# The seed workload's vocabulary (Qwen3), one less, Llama 2's, and short ones below one block.
@pytest.mark.parametrize("vocab", [151936, 151935, 32000, 1537, 100, 17])
@pytest.mark.parametrize("has_drawn", [False, True])
def test_the_sampling_kernel_sums_in_the_layout_of_softmax_kernel(vocab: int, has_drawn: bool) -> None:
    import triton.language as tl
    from oracle_kernels.triton import reduction, sampling
    from oracle_kernels.triton.config import row_tiles

    block = row_tiles(vocab).block
    softmax = _sum_layout(
        reduction.softmax_kernel,
        {"x_ptr": "*fp32", "out_ptr": "*fp32", "C": "i32", "stride_x": "i32", "stride_out": "i32"},
        {"BLOCK": block, "LOG": True, "ACC_DTYPE": tl.float32}, vocab)
    ours = _sum_layout(
        sampling.sampled_rows_kernel,
        {"x_ptr": "*fp32", "drawn_ptr": "*i64", "out_ptr": "*i64", "C": "i32", "stride_x": "i32"},
        {"BLOCK": block, "HAS_DRAWN": has_drawn}, vocab)
    assert ours == softmax
