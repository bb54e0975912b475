"""The fused decoder kernels (kernels/triton/fused.py) under Triton's CPU interpreter, bitwise against the composition.

Not collected on its own: test_kernels_triton_interpret.py runs it in a child pytest with
TRITON_INTERPRET=1 (see triton_interpreter_cases.py for why). The composition is the one invariant
mode runs on CUDA: the existing Triton kernels (rms_norm_kernel on the fp32 copy, unary_kernel's silu),
interpreted too, and torch's elementwise ops for the rest. Each case compares bitwise, in bf16 and fp16,
with odd row counts and row lengths that are not powers of two.

What the interpreter cannot check: it runs the kernels as numpy, so there is no register layout (the
order of tl.sum's tree on a GPU) and no FMA contraction. A fused kernel that contracted a product into a
sum, or whose loads gave its reduction another layout than rms_norm_kernel's, passes here; those are
tests/gpu/test_fused_cuda.py's to catch. What it does check: the formulas, the order of the additions and
every rounding to the half dtype. The interpreter truncates fp32 -> bf16 casts; this file patches the cast
to round to nearest even, as the GPU and torch do, so that bf16 compares bitwise too.
"""

from __future__ import annotations

import os

import pytest
import torch

if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 (run through test_kernels_triton_interpret.py)", allow_module_level=True)
pytest.importorskip("triton")

import numpy as np  # noqa: E402
import triton.language as tl  # noqa: E402
from oracle_kernels.fused import rms_norm_composed, rope_composed  # noqa: E402
from oracle_kernels.triton import fused, pointwise, reduction  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

_interpreter_cast = interpreter.InterpreterBuilder.cast_impl


def _cast_rounding_to_nearest(self, src, dst_type):  # type: ignore[no-untyped-def]
    """fp32 -> bf16 rounded to nearest even (the interpreter truncates), through torch's conversion."""
    if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
        values = torch.from_numpy(np.ascontiguousarray(src.data, dtype=np.float32))
        bits = values.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        return interpreter.TensorHandle(bits, tl.bfloat16)
    return _interpreter_cast(self, src, dst_type)


interpreter.InterpreterBuilder.cast_impl = _cast_rounding_to_nearest

HALVES = [torch.bfloat16, torch.float16]
EPS = 1e-6


def _randn(*shape: int, dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def _composed_norm(h: torch.Tensor, weight: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """weight * rms_norm(h.float()).to(dtype), the norm by the interpreted rms_norm_kernel."""
    y = reduction.rms_norm(h.float(), (h.shape[-1],), None, EPS, block=block)[0]
    return weight * y.to(h.dtype)


def test_the_interpreter_now_rounds_bf16_to_nearest() -> None:
    # 1 + (2^-8 + 2^-10) lies nearer 1 + 2^-7 than 1 in bf16: truncation would give 1.
    r = torch.ones(1, 16, dtype=torch.bfloat16)
    x = torch.full((1, 16), 2**-8 + 2**-10, dtype=torch.bfloat16)
    _, h = fused.add_rms_norm(x, r, torch.ones(16, dtype=torch.bfloat16), EPS)
    assert torch.equal(h, r + x) and h[0, 0].item() == 1 + 2**-7


# (rows, length, block): one tile; several tiles with a partial last one; lengths that are no power of two.
NORM_SHAPES = [(7, 40, None), (13, 200, 64), (3, 72, None), (1, 96, 32)]


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize(("rows", "length", "block"), NORM_SHAPES)
@pytest.mark.parametrize("residual", [True, False], ids=["residual", "no_residual"])
def test_add_rms_norm_is_the_composition_bitwise(
    dtype: torch.dtype, rows: int, length: int, block: int | None, residual: bool
) -> None:
    x = _randn(rows, length, dtype=dtype, seed=1, scale=3.0)
    res = _randn(rows, length, dtype=dtype, seed=2, scale=3.0) if residual else None
    weight = _randn(length, dtype=dtype, seed=3) + 1
    out, h = fused.add_rms_norm(x, res, weight, EPS, block=block)
    expected_h = res + x if res is not None else x
    assert torch.equal(h, expected_h)
    assert torch.equal(out, _composed_norm(expected_h, weight, block))
    # Each row alone gives its bits in the batch.
    for i in (0, rows - 1):
        alone, _ = fused.add_rms_norm(x[i : i + 1], res[i : i + 1] if res is not None else None, weight, EPS, block)
        assert torch.equal(alone, out[i : i + 1])


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("head_dim", [16, 24, 40])
@pytest.mark.parametrize("norm", [True, False], ids=["qk_norm", "rope_only"])
def test_qk_norm_rope_is_the_composition_bitwise(dtype: torch.dtype, head_dim: int, norm: bool) -> None:
    tokens, heads = 5, 3
    x = _randn(tokens, heads, head_dim, dtype=dtype, seed=4, scale=3.0)
    weight = _randn(head_dim, dtype=dtype, seed=5) + 1 if norm else None
    positions = torch.tensor([0, 1, 7, 100, 4095], dtype=torch.float32)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    emb = torch.cat([positions[:, None] * inv_freq[None, :]] * 2, dim=-1)
    cos, sin = emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]  # [T, 1, D]
    normed = _composed_norm(x, weight) if weight is not None else x
    assert torch.equal(fused.qk_norm_rope(x, weight, cos, sin, EPS), rope_composed(normed, cos, sin))


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_silu_mul_is_the_composition_bitwise(dtype: torch.dtype) -> None:
    n = 3 * 1024 + 7  # blocks of 1024 and a partial one
    gate, up = _randn(n, dtype=dtype, seed=6, scale=4.0), _randn(n, dtype=dtype, seed=7, scale=2.0)
    assert torch.equal(fused.silu_mul(gate, up), pointwise.silu(gate) * up)
    # Strided operands: made contiguous first.
    g, u = gate[:3073].view(7, 439)[:, :5], up[:3073].view(7, 439)[:, :5]
    assert torch.equal(fused.silu_mul(g, u), (pointwise.silu(gate) * up)[:3073].view(7, 439)[:, :5])


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_the_cases_tell_a_missing_rounding(dtype: torch.dtype) -> None:
    """The data above is able to fail: each chain computed with one rounding fewer gives other bits."""
    x = _randn(13, 200, dtype=dtype, seed=1, scale=3.0)
    weight = _randn(200, dtype=dtype, seed=3) + 1
    y = reduction.rms_norm(x.float(), (200,), None, EPS)[0]
    assert not torch.equal((weight.float() * y).to(dtype), rms_norm_composed(x, weight, EPS))
    q = _randn(5, 3, 40, dtype=dtype, seed=4, scale=3.0)
    cos, sin = _randn(5, 1, 40, dtype=dtype, seed=8), _randn(5, 1, 40, dtype=dtype, seed=9)
    rotated = torch.cat((-q[..., 20:], q[..., :20]), dim=-1)
    assert not torch.equal((q.float() * cos.float() + rotated.float() * sin.float()).to(dtype),
                           rope_composed(q, cos, sin))
    gate, up = _randn(4096, dtype=dtype, seed=6, scale=4.0), _randn(4096, dtype=dtype, seed=7, scale=2.0)
    assert not torch.equal((torch.nn.functional.silu(gate.float()) * up.float()).to(dtype), pointwise.silu(gate) * up)


def test_the_composition_is_what_the_ops_run_by_default() -> None:
    """The ops' default (the composition of kernels/fused.py) is what these cases compare against."""
    x, r = _randn(3, 40, dtype=torch.bfloat16, seed=10), _randn(3, 40, dtype=torch.bfloat16, seed=11)
    w = _randn(40, dtype=torch.bfloat16, seed=12)
    out, h = torch.ops.oracle_kernels.add_rms_norm.default(x, r, w, EPS)
    assert torch.equal(h, r + x) and torch.equal(out, rms_norm_composed(r + x, w, EPS))
