"""enable / disable / batch_invariant, covered_ops and audit: the switch and what it reaches."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import oracle_kernels
import pytest
import torch
import torch.nn.functional as F

# fp32, K=1000, N=512: MKL's gemm takes a different path for M=1, M<4 and M>=4, so without our
# kernels row 0 of a batch differs from its solo result for most M in 1..64.
_G = torch.Generator().manual_seed(0)
X = torch.randn(64, 1000, generator=_G)
W = torch.randn(512, 1000, generator=_G)
BIAS = torch.randn(512, generator=_G)


def _batch_sizes_where_row_zero_differs() -> list[int]:
    solo = X[:1] @ W.t()
    return [m for m in range(1, 65) if not torch.equal((X[:m] @ W.t())[:1], solo)]


@pytest.fixture(autouse=True)
def kernels_off() -> Iterator[None]:
    """Every test starts and ends with torch's own kernels, whatever it did."""
    oracle_kernels.disable()
    yield
    oracle_kernels.disable()


def test_without_the_kernels_torch_mm_varies_with_the_batch() -> None:
    # The negative control: if torch were invariant here, the invariance tests could not fail.
    assert len(_batch_sizes_where_row_zero_differs()) > 10


def test_with_the_kernels_mm_does_not_vary() -> None:
    with oracle_kernels.batch_invariant():
        assert _batch_sizes_where_row_zero_differs() == []


def test_disable_restores_torchs_kernels_bitwise() -> None:
    before = X[:7] @ W.t()
    oracle_kernels.enable()
    during = X[:7] @ W.t()
    oracle_kernels.disable()
    after = X[:7] @ W.t()
    assert torch.equal(before, after)
    assert not torch.equal(before, during)  # the kernels really were in place


def test_enable_twice_and_disable_twice_are_harmless() -> None:
    oracle_kernels.enable()
    oracle_kernels.enable()
    assert oracle_kernels.is_enabled()
    assert _batch_sizes_where_row_zero_differs() == []
    oracle_kernels.disable()
    oracle_kernels.disable()
    assert not oracle_kernels.is_enabled()
    assert _batch_sizes_where_row_zero_differs() != []


def test_batch_invariant_restores_the_previous_state() -> None:
    with oracle_kernels.batch_invariant():
        assert oracle_kernels.is_enabled()
        with oracle_kernels.batch_invariant():
            assert oracle_kernels.is_enabled()
        assert oracle_kernels.is_enabled()  # the inner block must not turn off the outer one
    assert not oracle_kernels.is_enabled()

    oracle_kernels.enable()
    with oracle_kernels.batch_invariant():
        pass
    assert oracle_kernels.is_enabled()  # it was on before the block


def test_batch_invariant_restores_when_the_body_raises() -> None:
    with pytest.raises(ZeroDivisionError), oracle_kernels.batch_invariant():
        assert oracle_kernels.is_enabled()
        _ = 1 / 0
    assert not oracle_kernels.is_enabled()
    assert _batch_sizes_where_row_zero_differs() != []


def test_importing_registers_nothing() -> None:
    code = (
        "import torch; g = torch.Generator().manual_seed(0); x = torch.randn(8, 1000, generator=g); "
        "w = torch.randn(1000, 512, generator=g); "
        "before = torch._C._dispatch_dump('aten::mm'); import oracle_kernels; "
        "assert torch._C._dispatch_dump('aten::mm') == before; assert not oracle_kernels.is_enabled(); "
        "oracle_kernels.enable(); assert torch._C._dispatch_dump('aten::mm') != before"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_covered_ops() -> None:
    covered = oracle_kernels.covered_ops()
    assert covered == sorted(covered)
    for op in ("aten::mm", "aten::addmm", "aten::bmm", "aten::_softmax", "aten::_log_softmax", "aten::mean.dim",
               "aten::sum.dim_IntList", "oracle_kernels::paged_attention"):
        assert op in covered
    assert oracle_kernels.covered_ops(torch.device("cpu")) == covered
    assert oracle_kernels.covered_ops("meta") == []  # no backend registers for that device


def test_every_listed_op_exists() -> None:
    # A misspelt name in the audit's table would silently never match.
    for name in oracle_kernels.BATCH_VARIANT_OPS | set(oracle_kernels.covered_ops()):
        namespace, _, op = name.partition("::")
        packet, _, overload = op.partition(".")
        assert getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default") is not None, name


def test_audit_lists_an_uncovered_op() -> None:
    result = oracle_kernels.audit(torch.mm, X, W.t())
    assert result.uncovered == ("aten::mm",)
    assert result.covered == ()
    assert not result.ok


def test_audit_ignores_ops_that_cannot_vary() -> None:
    x = torch.randn(4, 6)
    result = oracle_kernels.audit(lambda: torch.cat([x * 2 + 1, x[:, :3].repeat(1, 2)]).view(-1).amax())
    assert result.uncovered == () and result.covered == ()


def test_audit_with_the_kernels_on_lists_covered_ops() -> None:
    def block(x: torch.Tensor) -> torch.Tensor:
        h = F.rms_norm(x, (x.shape[-1],), eps=1e-6)
        return torch.softmax(F.linear(F.silu(h), W, W[:, 0]), dim=-1)

    with oracle_kernels.batch_invariant():
        result = oracle_kernels.audit(block, X[:4])
    assert result.ok
    assert {"aten::addmm", "aten::mean.dim", "aten::silu", "aten::_softmax"} <= set(result.covered)


def test_audit_flags_elementwise_ops_with_batch_variant_rounding() -> None:
    x = torch.randn(4, 6)
    result = oracle_kernels.audit(lambda: (F.gelu(x, approximate="tanh"), x.pow(1.5), x.pow(2), F.gelu(x)))
    assert result.uncovered == ("aten::gelu", "aten::pow.Tensor_Scalar")
    result = oracle_kernels.audit(lambda: (F.gelu(x), x.pow(2), torch.exp(x), torch.add(x, x, alpha=2)))
    assert result.uncovered == ()


@pytest.mark.parametrize("inference", [False, True], ids=["no_grad", "inference_mode"])
def test_linear_and_matmul_reach_the_kernels(inference: bool) -> None:
    x3 = torch.randn(2, 5, 1000)
    cases = {
        "linear 2-D": (lambda: F.linear(X[:3], W, BIAS), "aten::addmm"),
        "linear 3-D": (lambda: F.linear(x3, W, BIAS), "aten::addmm"),
        "linear 3-D strided bias": (lambda: F.linear(x3, W, W[:, 0]), "aten::mm"),  # mm + add
        "linear 3-D no bias": (lambda: F.linear(x3, W), "aten::mm"),
        "linear 3-D strided": (lambda: F.linear(x3.transpose(0, 1), W, BIAS), "aten::bmm"),
        "matmul 3-D @ 2-D": (lambda: torch.matmul(x3, W.t()), "aten::mm"),
        "matmul 3-D @ 3-D": (lambda: torch.matmul(x3, x3.transpose(1, 2)), "aten::bmm"),
        "matmul 4-D @ 4-D": (lambda: torch.matmul(x3[None], x3[None].transpose(2, 3)), "aten::bmm"),
    }
    mode = torch.inference_mode() if inference else torch.no_grad()
    with mode, oracle_kernels.batch_invariant():
        for name, (fn, op) in cases.items():
            result = oracle_kernels.audit(fn)
            assert op in result.covered, name
            assert result.ok, (name, result.uncovered)


def test_rms_norm_reaches_the_covered_mean() -> None:
    x = torch.randn(3, 4, 64, dtype=torch.bfloat16)
    for mode in (torch.no_grad(), torch.inference_mode()):
        with mode, oracle_kernels.batch_invariant():
            result = oracle_kernels.audit(F.rms_norm, x, (64,), torch.ones(64, dtype=torch.bfloat16), 1e-6)
        assert "aten::mean.dim" in result.covered and result.ok


def test_autograd_runs_through_the_kernels() -> None:
    w = W[:8].clone().requires_grad_(True)
    with oracle_kernels.batch_invariant():
        loss = torch.log_softmax(X[:5] @ w.t(), dim=-1).sum()
        loss.backward()
    assert w.grad is not None and w.grad.shape == w.shape and torch.isfinite(w.grad).all()
