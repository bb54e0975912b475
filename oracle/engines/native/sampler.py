"""Sampling and the per-step outputs of the sampled rows: computed on the device, copied to the host once.

For the R rows of a step that sample a token (logits [R, vocab] float32), one pass on the logits'
device computes every row's token (greedy argmax, or Gumbel-max with the request's own generator over
the temperature-scaled logits truncated to the request's top-k / top-p),
the token's log-probability, the top-2 logits and, for rows that ask for a digest, a fingerprint
of the row's bits; one device-to-host copy brings them back. Full rows are copied only for
requests that ask for `logits: full`.

The digest of a row is the sha256 of its fingerprint: four 64-bit lanes, lane l the sum over i of
word_i * M[l, i] modulo 2**64, with word_i the row's float32 number i read as an int32 and M fixed
odd 64-bit numbers. Identical rows give identical digests; two rows that differ in one float32
differ in every lane (an odd multiplier never sends a nonzero difference below 2**32 to 0 modulo
2**64), so a single flipped bit, a -0.0 for a +0.0 or another NaN payload always changes the digest,
and rows that differ in several floats collide only by chance (2**-256 for random changes).
"""

from __future__ import annotations

import functools
import hashlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from oracle.engines.contract import SamplingParams

FINGERPRINT_LANES = 4
_FINGERPRINT_SEED = 0x5EED_D16E
_ROWS_PER_PASS = 128  # bounds the [rows, vocab] int64 temporary of the fingerprint


def to_device(values: array[int] | array[float], device: torch.device) -> torch.Tensor:
    """`values` (an int64 "q" or float32 "f" array) on `device`. On CUDA through pinned memory and without a
    wait: a copy from pageable memory waits for everything queued on the stream, and the engine queues a step
    while the last one runs."""
    dtype = torch.int64 if values.typecode == "q" else torch.float32
    host = torch.frombuffer(values, dtype=dtype) if len(values) else torch.empty(0, dtype=dtype)
    return _pinned(host, device)


def _pinned(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor on `device`; to CUDA through pinned memory, without a wait."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


@functools.cache
def _multipliers(vocab: int, device: torch.device) -> torch.Tensor:
    """[lanes, vocab] int64, odd, from a fixed seed: the same on every device and in every process."""
    g = torch.Generator().manual_seed(_FINGERPRINT_SEED)
    m = torch.randint(-(2**62), 2**62, (FINGERPRINT_LANES, vocab), generator=g, dtype=torch.int64)
    return (m * 2 + 1).to(device)


def fingerprint(rows: torch.Tensor) -> torch.Tensor:
    """[R, vocab] float32 -> [R, lanes] int64 on the rows' device; see the module docstring."""
    words = rows.contiguous().view(torch.int32)
    mult = _multipliers(rows.shape[-1], rows.device)
    out = torch.empty((rows.shape[0], FINGERPRINT_LANES), dtype=torch.int64, device=rows.device)
    for lo in range(0, rows.shape[0], _ROWS_PER_PASS):
        w = words[lo : lo + _ROWS_PER_PASS].to(torch.int64)  # [r, vocab]
        for lane in range(FINGERPRINT_LANES):
            # Integer sums wrap modulo 2**64 and do not depend on the order of the additions.
            out[lo : lo + _ROWS_PER_PASS, lane] = (w * mult[lane]).sum(dim=-1)
    return out


def digest_of(lanes: np.ndarray) -> str:
    """The sha256 hex digest of one row's fingerprint ([lanes] int64, little-endian bytes)."""
    return hashlib.sha256(np.ascontiguousarray(lanes, dtype="<i8").tobytes()).hexdigest()


@dataclass(frozen=True)
class SampledRows:
    """Host values of one step's sampled rows, in row order."""

    tokens: list[int]
    logprobs: list[float]
    top2: list[tuple[float, float]]
    digests: dict[int, str]  # row -> digest, for rows that asked for one
    full: dict[int, Any]  # row -> float32 numpy row, for rows that asked for `logits: full`


def _gumbel(g: torch.Generator, vocab: int) -> torch.Tensor:
    # The request's own generator draws the row: its noise does not depend on the batch.
    u = torch.rand(vocab, generator=g, dtype=torch.float32).clamp_(1e-10, 1.0)
    return -torch.log(-torch.log(u))  # [vocab]


def _f32(bits: np.ndarray) -> list[float]:
    # int64 columns holding float32 bit patterns -> Python floats (exact: float32 widens losslessly).
    return bits.astype(np.int32).view(np.float32).tolist()  # type: ignore[no-any-return]


def truncate(scaled: torch.Tensor, sampling: Sequence[SamplingParams]) -> torch.Tensor:
    """[S, vocab] temperature-scaled logits with the tokens outside each row's top-k / top-p set to -inf.

    Row by row (sort, softmax and cumulative sum within a row), so a row's set never depends on the
    others. Top-p keeps the smallest prefix of the sorted tokens whose probability reaches `top_p`
    (at least one token); ties in the sort keep vocabulary order (stable sort).
    """
    if all(s.top_k <= 0 and s.top_p >= 1.0 for s in sampling):
        return scaled
    vocab = scaled.shape[-1]
    device = scaled.device
    top_k = to_device(array("q", [s.top_k if 0 < s.top_k < vocab else vocab for s in sampling]), device)  # [S]
    top_p = to_device(array("f", [s.top_p for s in sampling]), device)  # [S] float32
    ordered, order = torch.sort(scaled, dim=-1, descending=True, stable=True)  # [S, vocab]
    rank = torch.arange(vocab, device=device)[None, :]  # [1, vocab]
    probs = torch.softmax(ordered, dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs  # probability of the better-ranked tokens
    drop = (rank >= top_k[:, None]) | ((before >= top_p[:, None]) & (rank > 0))
    ordered = ordered.masked_fill(drop, float("-inf"))
    return torch.empty_like(scaled).scatter_(1, order, ordered)


def draw(
    logits: torch.Tensor, sampling: Sequence[SamplingParams], generators: Sequence[torch.Generator | None]
) -> torch.Tensor | None:
    """[R] int64: the Gumbel-max token of each row of `logits` [R, vocab] float32 that has a generator (over its
    temperature-scaled, top-k / top-p truncated logits, noise from its own generator), -1 for the greedy rows;
    None when every row is greedy."""
    drawn = [i for i, g in enumerate(generators) if g is not None]
    if not drawn:
        return None
    device = logits.device
    gumbel = _pinned(torch.stack([_gumbel(g, logits.shape[-1]) for g in generators if g is not None]), device)
    rows = to_device(array("q", drawn), device)  # gumbel above: [S, vocab]
    temperature = to_device(array("f", [sampling[i].temperature for i in drawn]), device)  # [S] float32
    scaled = truncate(logits[rows] / temperature[:, None], [sampling[i] for i in drawn])  # [S, vocab]
    tokens = torch.full((logits.shape[0],), -1, dtype=torch.int64, device=device)
    tokens[rows] = torch.argmax(scaled + gumbel, dim=-1)
    return tokens


def choose(
    logits: torch.Tensor, sampling: Sequence[SamplingParams], generators: Sequence[torch.Generator | None]
) -> torch.Tensor:
    """[R] int64 tokens of `logits` [R, vocab] float32: argmax where a row's generator is None, else `draw`'s."""
    tokens = torch.argmax(logits, dim=-1)
    drawn = draw(logits, sampling, generators)
    return tokens if drawn is None else torch.where(drawn >= 0, drawn, tokens)


def request_generator(sampling: SamplingParams) -> torch.Generator | None:
    """The request's own CPU generator, seeded from its seed (None when greedy): its noise never depends on
    what shares the batch."""
    if sampling.temperature <= 0:
        return None
    return torch.Generator(device="cpu").manual_seed(sampling.seed)


@dataclass
class PendingRows:
    """A step's sampled rows on their way to the host: the device work and the copy are queued; `result()`
    waits for them (the host does the step's other work meanwhile)."""

    host: torch.Tensor  # [R, 4 (+ lanes)] int64, filled by the queued copy
    copied: torch.cuda.Event | None  # recorded after the copy (CUDA); None where the copy already ran
    device_tokens: torch.Tensor  # [R] int64: the rows' tokens on the device (the next step's inputs)
    full_logits: torch.Tensor | None  # [len(full_rows), vocab] float32 on the host: the `logits: full` rows (queued copy)
    digest_rows: list[int]
    full_rows: list[int]

    def result(self) -> SampledRows:
        """Wait for the copy and read the rows; full rows (`logits: full`) are copied now."""
        if self.copied is not None:
            self.copied.synchronize()
        host = self.host.numpy()
        full: dict[int, Any] = {}
        if self.full_logits is not None:
            copied = self.full_logits.numpy()
            full = {row: copied[j] for j, row in enumerate(self.full_rows)}
        return SampledRows(
            tokens=host[:, 0].tolist(),
            logprobs=_f32(host[:, 1]),
            top2=list(zip(_f32(host[:, 2]), _f32(host[:, 3]), strict=True)),
            digests={i: digest_of(host[i, 4:]) for i in self.digest_rows},
            full=full,
        )


def _columns(
    logits: torch.Tensor, sampling: Sequence[SamplingParams], generators: Sequence[torch.Generator | None],
) -> torch.Tensor:
    """[R, 4] int64: token, logprob, top-1 and top-2 (float32 bits widened with their sign) from torch's ops."""
    vocab = logits.shape[-1]
    tokens = choose(logits, sampling, generators)  # [R]
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None])[:, 0]  # [R]
    top2 = torch.topk(logits, 2, dim=-1).values if vocab > 1 else logits[:, :1].expand(-1, 2)  # [R, 2]
    columns = [tokens[:, None], logprobs.view(torch.int32)[:, None].long(), top2.contiguous().view(torch.int32).long()]
    return torch.cat(columns, dim=1)


def invariant_columns(
    logits: torch.Tensor, sampling: Sequence[SamplingParams], generators: Sequence[torch.Generator | None],
) -> torch.Tensor:
    """`_columns` in one read of each row (oracle_kernels.triton.sampling), bitwise the same where
    torch.log_softmax runs oracle_kernels' log-softmax (invariant mode on CUDA): the kernel takes the argmax of
    the greedy rows and the drawn token of the others, and repeats that log-softmax's arithmetic for the token.
    One exception, where torch is the one that varies: a -0.0/+0.0 tie in the top 2 comes back +0.0 first in
    every row, while torch.topk orders that tie by its own algorithm for the number of rows."""
    from oracle_kernels.triton import sampling as kernel  # imports triton: CUDA only

    return kernel.sampled_rows(logits, draw(logits, sampling, generators))


def queue_rows(
    logits: torch.Tensor, sampling: Sequence[SamplingParams], generators: Sequence[torch.Generator | None],
    before_copy: Callable[[], None] | None = None, invariant: bool = False, fused: bool = True,
) -> PendingRows:
    """Queue the tokens and outputs of every row of `logits` [R, vocab] float32 and their one host copy
    (asynchronous on CUDA, into pinned memory); `.result()` reads them.

    `before_copy` is called once the device work is queued, right before the copy (the profile's event).
    `invariant` (the engine's invariant mode, whose kernels are in force): on CUDA, `invariant_columns`, unless
    `fused` is off (engine option `fused_kernels: false`)."""
    device = logits.device
    fused = fused and invariant and device.type == "cuda"
    columns = [(invariant_columns if fused else _columns)(logits, sampling, generators)]
    digest_rows = [i for i, s in enumerate(sampling) if s.logits == "digest"]
    if digest_rows:
        lanes = torch.zeros((logits.shape[0], FINGERPRINT_LANES), dtype=torch.int64, device=device)
        index = to_device(array("q", digest_rows), device)
        lanes[index] = fingerprint(logits[index])
        columns.append(lanes)
    packed = torch.cat(columns, dim=1) if len(columns) > 1 else columns[0]
    full_rows = [i for i, s in enumerate(sampling) if s.logits == "full"]
    # Gathered now: the logits may be a CUDA graph's output, which the next step overwrites before `result()`.
    full = logits[to_device(array("q", full_rows), device)] if full_rows else None
    if before_copy is not None:
        before_copy()
    copied: torch.cuda.Event | None = None
    if device.type == "cuda":
        # Pinned by torch for a non-blocking copy to the host; the event follows both copies on the logits' stream.
        host = packed.to("cpu", non_blocking=True)
        full = full.to("cpu", non_blocking=True) if full is not None else None
        copied = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(device))
    else:
        host = packed.cpu()
        full = full.cpu() if full is not None else None
    return PendingRows(host, copied, packed[:, 0], full, digest_rows, full_rows)


def sample_rows(
    logits: torch.Tensor, sampling: Sequence[SamplingParams], generators: Sequence[torch.Generator | None],
    before_copy: Callable[[], None] | None = None,
) -> SampledRows:
    """Tokens and outputs of every row of `logits` [R, vocab] float32; one host copy (two with full rows)."""
    return queue_rows(logits, sampling, generators, before_copy).result()
