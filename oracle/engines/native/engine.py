"""The native reference engine: our decoder, a paged KV cache and the continuous-batching scheduler.

`production` mode runs torch's default ops and picks the decode attention's KV split count
from the batch size, as split-KV kernels do to fill a device; `invariant` mode runs the whole
step inside `oracle_kernels.batch_invariant()`, so every reduction has a fixed order.

Per step the host builds the inputs (one host-to-device copy), the device runs the forward pass
and samples every row (oracle/engines/native/sampler.py), and one device-to-host copy brings the
tokens back. On CUDA, decode steps replay CUDA graphs (oracle/engines/native/graphs.py, engine
option `cuda_graphs`, on by default there); prefill steps run eagerly.

Steps overlap (engine option `overlap_steps`, on by default): the host schedules step N+1 and
launches it before it reads step N's tokens, so the device does not wait for the host's Python
between two steps (the host still waits where a pass reads something back: an eager invariant
attention pass reads its layout on the host, a new CUDA graph is captured after a sync). A token
sampled at step N stands in the sequence as `PENDING_TOKEN` until it lands; step N+1 takes it
from step N's sampled rows on the device (`_Landing.fill`), so its inputs are the same numbers as
a step-at-a-time run's, and so are its outputs. A step whose batch holds a
sequence that may stop at a token (`stop_at_eos`) lands before the scheduler records it, as does
every step under per-op capture and at tensor parallel > 1.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import oracle_kernels
import torch

from oracle.config import EngineConfig
from oracle.engine_options import NativeOptions
from oracle.engines.contract import Completion, Mode, Request, RunSpec, StepEvidence
from oracle.engines.native.graphs import DecodeGraphs
from oracle.engines.native.loader import DTYPES, load_decoder
from oracle.engines.native.model import Decoder, StepInputs, fused_path_applies
from oracle.engines.native.parallel import Reducer
from oracle.engines.native.profile import StepProfile
from oracle.engines.native.sampler import PendingRows, SampledRows, queue_rows, request_generator, to_device
from oracle.engines.native.scheduler import BlockAllocator, ScheduledSeq, Scheduler
from oracle.engines.native.scheduler import Sequence as Seq
from oracle.errors import ConfigError

if TYPE_CHECKING:
    from oracle.capture.rows import RowCapture
    from oracle.capture.rules import LocalizedOp
    from oracle.engines.native.ranks import RankGroup


PENDING_TOKEN = -1  # in Sequence.tokens: sampled on the device at the step in flight, not yet on the host


def num_kv_splits_for(num_seqs: int, max_splits: int = 8, target_parallelism: int = 16) -> int:
    """Split-KV heuristic of the production path: fewer sequences -> more KV chunks per sequence."""
    return max(1, min(max_splits, target_parallelism // max(1, num_seqs)))


class _ForwardClock:
    """Time of one forward pass for the bench: CUDA events around it (no extra sync), or the host clock."""

    def __init__(self, device: torch.device) -> None:
        self._events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
        if device.type == "cuda":
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            self._events[0].record()
        self._t0 = time.perf_counter()
        self._t1 = self._t0

    def stop(self) -> None:
        if self._events is not None:
            self._events[1].record()
        self._t1 = time.perf_counter()

    def seconds(self) -> float:
        """After the device finished the pass (the step's host copy waits for it)."""
        if self._events is not None:
            self._events[1].synchronize()
            return self._events[0].elapsed_time(self._events[1]) / 1000.0
        return self._t1 - self._t0


def pass_evidence(step: int, batch: list[ScheduledSeq], num_tokens: int) -> list[StepEvidence]:
    """What each sequence of the pass saw of it: its own place and the pass's shape."""
    chunked = [item.is_prefill and (item.seq.num_prefill_passes > 0 or not item.completes) for item in batch]
    kv_lens = [item.seq.num_computed_tokens + item.num_new_tokens for item in batch]
    prefill_tokens = sum(item.num_new_tokens for item in batch if item.is_prefill)
    shape: dict[str, Any] = {
        "engine_step": step, "num_seqs": len(batch), "num_tokens": num_tokens,
        "num_prefill_tokens": prefill_tokens, "num_decode_tokens": num_tokens - prefill_tokens,
        "max_query_len": max(item.num_new_tokens for item in batch), "max_kv_len": max(kv_lens),
        "has_chunked": any(chunked),
        "has_cache_hit": any(item.is_prefill and item.seq.num_cached_tokens > 0 for item in batch),
    }
    return [
        _evidence_of(shape, is_prefill=item.is_prefill, chunked=chunked[i], num_cached_tokens=item.seq.num_cached_tokens,
                     token_index=len(item.seq.tokens) - item.seq.prompt_len if item.completes else None,
                     seq_position=i, kv_len=kv_lens[i])
        for i, item in enumerate(batch)
    ]


def _evidence_of(shape: dict[str, Any], **own: Any) -> StepEvidence:
    """`StepEvidence(**shape, **own)` without the frozen dataclass's field-by-field `__init__` (a decode step
    makes one per sequence, a thousand at a time): the instance's fields set in one dict. Every field is
    given (`tests/unit/test_native_engine_host.py` checks it equals the constructor's)."""
    evidence: StepEvidence = object.__new__(StepEvidence)
    fields = evidence.__dict__
    fields.update(shape)
    fields.update(own)
    return evidence


class _Landing:
    """A step whose sampled rows are on their way to the host: what its rows' sequences wait for."""

    def __init__(self, pending: PendingRows, done: list[Seq], clock: _ForwardClock | None) -> None:
        self.pending = pending
        self.done = done  # the sequences of the sampled rows, in row order
        self.clock = clock
        self.slots: list[int] | None = None  # where each row's PENDING_TOKEN stands in its sequence's tokens
        self.row_of: dict[int, int] = {}  # sequence index -> row, for `fill`

    def stand_in(self) -> dict[int, int]:
        """The scheduler's record of this step before its tokens land: PENDING_TOKEN in each sampled
        sequence's next place (filled in by `land`)."""
        self.slots = [len(seq.tokens) for seq in self.done]
        self.row_of = {seq.index: row for row, seq in enumerate(self.done)}
        return dict.fromkeys((seq.index for seq in self.done), PENDING_TOKEN)

    def fill(self, ids: torch.Tensor, dst: list[int], rows: list[int]) -> None:
        """ids[dst[j]] = the token sampled in row rows[j], on the device (queued after this step's sampling)."""
        if not dst:
            return
        index = to_device(array("q", [*dst, *rows]), ids.device)
        ids.index_copy_(0, index[: len(dst)], self.pending.device_tokens.index_select(0, index[len(dst):]))


class NativeEngine:
    """Implements `oracle.engines.contract.Engine` in this process, with the optional capabilities
    StopsAtEos, ResetsPrefixCache, Capturable and TimesForwardPasses.

    Configured by `config` (its engine fields and `NativeOptions`; the defaults are the config's own
    when None). A `Decoder` in place of a checkpoint folder is used as it is (the bench's random one).
    """

    def __init__(self, model: Path | Decoder, mode: Mode, config: EngineConfig | None = None, *,
                 reducer: Reducer | None = None) -> None:
        config = config or EngineConfig.of("native")
        options = config.options_as(NativeOptions)
        self.mode = mode
        self.device = torch.device(config.device)
        self.localize_seconds: dict[str, float] = {}  # TimesItsLocalize: the last localize call's parts
        # Decode steps through CUDA graphs: on by default on CUDA, never elsewhere.
        if options.cuda_graphs and self.device.type != "cuda":
            raise ConfigError(f"engine.options.cuda_graphs: needs a CUDA device, not {self.device.type!r}")
        self.cuda_graphs = self.device.type == "cuda" if options.cuda_graphs is None else options.cuda_graphs
        self.decoder = model if isinstance(model, Decoder) else load_decoder(model, DTYPES[config.dtype], self.device)
        # The fused chains (kernels/fused.py, the sampler's one-read kernel) where they give the composed bits:
        # the option, and whether this mode, device and dtype have a fused decoder (decided once here).
        self.fused_kernels = options.fused_kernels
        self.overlap_steps = options.overlap_steps
        self._fused_decoder = self.fused_kernels and fused_path_applies(self.mode, self.device, self.decoder.dtype)
        self.tensor_parallel_size = options.tensor_parallel_size
        # Ranks 1..N-1 of a sharded model (oracle.engines.native.ranks); None in one process.
        self.ranks: RankGroup | None = None
        self.rank_reports: list[dict[str, Any]] = []  # each rank's account of its kernels, rank order
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.enable_chunked_prefill = config.enable_chunked_prefill
        self.block_size = config.block_size
        self.stop_at_eos = options.stop_at_eos
        eos = self.decoder.config.eos_token_id
        self.eos_token_ids: tuple[int, ...] = (eos,) if eos is not None else ()
        self.enable_prefix_caching = config.enable_prefix_caching
        self.num_threads = config.num_threads
        self._kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._num_blocks = 0
        self._allocator = BlockAllocator(0, self.block_size)
        # Per-op capture (oracle.capture): called with each pass's step, batch and inputs; wraps its forward.
        self.pass_hook: Callable[[int, list[ScheduledSeq], StepInputs], contextlib.AbstractContextManager[None]] | None = None
        self._graphs: DecodeGraphs | None = None
        self.forward_seconds = 0.0  # time inside forward passes, summed while `timed` is on (bench)
        self.timed = False
        self.profile: StepProfile | None = None  # per-phase step times while set (oracle.bench_profile)
        self._forward_kind = "prefill"  # what the last `_forward` ran (profile.FORWARD_KINDS)
        if self.tensor_parallel_size > 1:  # last: the ranks' kernel audit runs this engine
            from oracle.engines.native.sharded import start_ranks

            self.ranks = start_ranks(self, model, config, reducer or Reducer())

    def describe(self) -> dict[str, Any]:
        c = self.decoder.config
        return {
            "engine": "native",
            "engine_version": "oracle",
            "device": str(self.device),
            "dtype": str(self.decoder.dtype).removeprefix("torch."),
            "architecture": c.architecture,
            "invariance_mechanism": "oracle_kernels (torch.library overrides + fixed-split attention)"
            if self.mode == "invariant" else "none (torch default kernels, batch-sized split-KV decode)",
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "enable_chunked_prefill": self.enable_chunked_prefill,
            "enable_prefix_caching": self.enable_prefix_caching,
            "num_threads": self.num_threads or torch.get_num_threads(),
            "cuda_graphs": self.cuda_graphs,
            "fused_kernels": self._fused_decoder,
            # Whether steps overlap: never at tensor parallel > 1, nor where every sequence may stop at EOS.
            "overlap_steps": self.overlap_steps and self.ranks is None and not (self.stop_at_eos and self.eos_token_ids),
            # On CUDA: which bf16/fp16 products cuBLASLt without split-K took (bitwise the Triton kernel's).
            **({"matmul_paths": oracle_kernels.matmul_paths()}
               if self.mode == "invariant" and self.device.type == "cuda" else {}),
            **({"tensor_parallel_size": self.tensor_parallel_size, "all_reduce": "gloo",
                "all_reduce_order": self.ranks.reducer.describe(),
                "rank_devices": [str(self.device)] * self.tensor_parallel_size, "ranks": self.rank_reports}
               if self.ranks is not None else {}),
        }

    def close(self) -> None:
        if self.ranks is not None:
            self.ranks.close()
            self.ranks = None
        self._kv = []
        self._graphs = None
        self._num_blocks = 0

    def _kernels(self) -> contextlib.AbstractContextManager[None]:
        return oracle_kernels.batch_invariant() if self.mode == "invariant" else contextlib.nullcontext()

    @contextlib.contextmanager
    def _threads(self) -> Iterator[None]:
        """torch's intra-op thread count for the call, restored after. One thread is fastest for tiny models."""
        before = torch.get_num_threads()
        if self.num_threads:
            torch.set_num_threads(self.num_threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    def capture(self, run: RunSpec, rows: RowCapture) -> Completion:
        """Run `run` with `rows` capturing each pass that holds the target (oracle.capture); every pass runs
        eagerly meanwhile. Where the target's rows sit in a pass is `native.capture.native_layout`'s."""
        from oracle.engines.native.capture import native_layout

        decoder = self.decoder
        rows.module_path = lambda: decoder.scopes.path[-1] if decoder.scopes.path else ""
        counter = itertools.count()

        @contextlib.contextmanager
        def hook(step: int, batch: list[ScheduledSeq], inputs: StepInputs) -> Iterator[None]:
            layout = native_layout(next(counter), step, batch, inputs, run.target_index, self.block_size)
            if layout is None:
                yield
                return
            with rows.forward_pass(layout, (inputs.input_ids, inputs.positions)):
                yield

        self.reset_prefix_cache()
        if run.warm_with:
            self.generate(list(run.warm_with))
        self.pass_hook = hook
        try:
            out = self.generate(list(run.requests), run.max_num_batched_tokens)
        finally:
            self.pass_hook = None
        return out[run.target_index]

    def localize(self, expected: RunSpec, actual: RunSpec, repro_dir: Path | None = None) -> LocalizedOp | None:
        """LocalizesInWorker: both runs captured (in every rank at tensor parallel > 1, compared rank by rank:
        `native.sharded.localize_sharded`), the op named and confirmed alone. TimesItsLocalize: where one process
        captured, `localize_seconds` says where the call's time went."""
        self.localize_seconds = {}
        if self.ranks is not None:
            from oracle.engines.native.sharded import localize_sharded

            return localize_sharded(self, expected, actual, repro_dir)
        from oracle.capture import localize_with
        from oracle.timings import PhaseClock

        clock = PhaseClock()
        self.localize_seconds = clock.seconds  # filled as the call goes
        return localize_with(self.capture, expected, actual, repro_dir=repro_dir, clock=clock)

    def capture_ranks(self, run: RunSpec, snapshot_at: Any = None) -> list[dict[str, Any]]:
        """CapturesRanks: `run` captured in every rank (one in this process without ranks)."""
        from oracle.engines.native.sharded import capture_ranks

        return capture_ranks(self, run, snapshot_at)

    def reset_prefix_cache(self) -> None:
        """Forget every cached block (the next requests run cold)."""
        self._allocator = BlockAllocator(self._num_blocks, self.block_size, self.enable_prefix_caching)

    def _ensure_kv(self, num_blocks: int) -> None:
        if num_blocks <= self._num_blocks:
            return
        # A bigger pool starts empty; with prefix caching keep twice what is asked so cached blocks survive.
        num_blocks *= 2 if self.enable_prefix_caching else 1
        c = self.decoder.config
        # One block more than the allocator hands out: the junk block that graph padding rows write.
        shape = (num_blocks + 1, self.block_size, c.num_kv_heads, c.head_dim)
        self._graphs = None  # graphs hold the old cache's addresses
        self._kv = [
            (torch.zeros(shape, dtype=self.decoder.dtype, device=self.device),
             torch.zeros(shape, dtype=self.decoder.dtype, device=self.device))
            for _ in range(c.num_layers)
        ]
        self._num_blocks = num_blocks
        self.reset_prefix_cache()

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        eos = self.decoder.config.eos_token_id if self.stop_at_eos else None
        seqs = [
            Seq(index=i, prompt_len=len(r.prompt_token_ids), tokens=list(r.prompt_token_ids),
                max_tokens=r.sampling.max_tokens, arrival_step=r.arrival_step, stop_token_id=eos)
            for i, r in enumerate(requests)
        ]
        per_seq = [-(-(s.prompt_len + s.max_tokens) // self.block_size) for s in seqs]
        self._ensure_kv(sum(per_seq))
        if not self.enable_prefix_caching:
            self.reset_prefix_cache()
        scheduler = Scheduler(seqs, self._allocator, self.max_num_seqs,
                              max_num_batched_tokens or self.max_num_batched_tokens, self.enable_chunked_prefill)
        outs = [Completion(r.request_id, [], [], logits=[] if r.sampling.logits == "full" else None,
                           logits_digests=[] if r.sampling.logits == "digest" else None, top2=[])
                for r in requests]
        generators = [self._generator(r) for r in requests]
        # The decoder's fused chains where they give the composition's bits; never under per-op capture (pass_hook).
        fused = self._fused_decoder and self.pass_hook is None
        overlap = self.overlap_steps and self.pass_hook is None and self.ranks is None
        landing: _Landing | None = None  # the step in flight: its tokens not yet on the host
        with torch.no_grad(), self._threads(), self._kernels(), self.decoder.fusing(fused):
            step = 0
            profile = self.profile
            if profile is not None:
                profile.drop_unread()
            while not scheduler.is_done():
                if profile is not None:
                    profile.start()
                batch = scheduler.schedule(step)
                if profile is not None:
                    profile.phase("schedule")
                if batch:
                    launched = self._launch(step, batch, requests, generators, landing)
                    if landing is not None:  # the step before lands while the device runs this one
                        self._land(landing, outs)
                    num_tokens = sum(item.num_new_tokens for item in batch)
                    self._evidence(step, batch, num_tokens, outs)
                    if profile is not None:
                        profile.phase("evidence")
                    if overlap and not any(item.seq.stop_token_id is not None for item in batch):
                        scheduler.update(batch, launched.stand_in())
                        landing = launched
                    else:
                        scheduler.update(batch, self._land(launched, outs))
                        landing = None
                    if profile is not None:
                        profile.phase("record")
                elif landing is not None:
                    self._land(landing, outs)
                    landing = None
                step += 1
            if landing is not None:
                self._land(landing, outs)
        return outs

    def _generator(self, r: Request) -> torch.Generator | None:
        return request_generator(r.sampling)

    def _launch(
        self, step: int, batch: list[ScheduledSeq], requests: Sequence[Request],
        generators: list[torch.Generator | None], landing: _Landing | None,
    ) -> _Landing:
        """Queue the pass and its sampling on the device (tokens still in flight in `landing` come from its rows
        there) and the sampled rows' copy to the host."""
        clock = _ForwardClock(self.device) if self.timed else None
        profile = self.profile
        began = profile.forward_begin() if profile is not None else None
        logits = self._forward(step, batch, landing)  # [R, vocab] float32, R = sequences that sample; queued
        if clock is not None:
            clock.stop()
        if profile is not None:
            profile.forward_end(self._forward_kind, began, len(batch), sum(item.num_new_tokens for item in batch))
            profile.phase("launch")
        done = [item.seq for item in batch if item.completes]
        pending = queue_rows(logits, [requests[s.index].sampling for s in done], [generators[s.index] for s in done],
                             before_copy=profile.sampled if profile is not None else None,
                             invariant=self.mode == "invariant", fused=self.fused_kernels)
        if profile is not None:
            profile.phase("sample")
        return _Landing(pending, done, clock)

    def _land(self, landing: _Landing, outs: list[Completion]) -> dict[int, int]:
        """Wait for a step's rows, record them and put its tokens in place of their stand-ins; its tokens by
        sequence index."""
        rows = landing.pending.result()
        profile = self.profile
        if profile is not None:
            profile.phase("wait")
            profile.read_device_times()
        if landing.clock is not None:
            self.forward_seconds += landing.clock.seconds()
        indices = [seq.index for seq in landing.done]
        self._record(rows, indices, outs)
        if landing.slots is not None:
            for seq, slot, token in zip(landing.done, landing.slots, rows.tokens, strict=True):
                seq.tokens[slot] = token
        if profile is not None:
            profile.phase("record")
        return dict(zip(indices, rows.tokens, strict=True))

    def _evidence(self, step: int, batch: list[ScheduledSeq], num_tokens: int, outs: list[Completion]) -> None:
        """Append each scheduled sequence's evidence of this pass (before the scheduler records it)."""
        for item, ev in zip(batch, pass_evidence(step, batch, num_tokens), strict=True):
            outs[item.seq.index].evidence.append(ev)

    def _forward(self, step: int, batch: list[ScheduledSeq], landing: _Landing | None = None) -> torch.Tensor:
        """The pass's logits: a CUDA graph replay for a decode step that fits a bucket, else eager. A token of
        a sequence that is still PENDING_TOKEN is taken from `landing`'s rows on the device.

        Under per-op capture (oracle.capture) every pass runs eagerly, inside the capture's context.
        """
        decode = all(item.num_new_tokens == 1 and item.completes for item in batch)
        self._forward_kind = "decode_eager" if decode else "prefill"
        if self.ranks is not None:
            return self._sharded_forward(step, batch)
        if self.pass_hook is not None:
            inputs = self._prepare(batch, landing)
            with self.pass_hook(step, batch, inputs):
                return self.decoder.forward(inputs, self._kv)
        if self.cuda_graphs and decode:
            graphs = self._decode_graphs()
            if graphs.bucket_for(len(batch)) is not None:
                self._forward_kind = "decode_graph"
                bs = self.block_size
                ids, positions, slots, tables = [], [], [], []
                dst: list[int] = []
                rows: list[int] = []
                for i, item in enumerate(batch):  # one pass over the batch: a decode step holds up to max_num_seqs
                    seq = item.seq
                    p = seq.num_computed_tokens
                    token = seq.tokens[p]
                    if token == PENDING_TOKEN:
                        assert landing is not None
                        dst.append(i)
                        rows.append(landing.row_of[seq.index])
                        token = 0
                    ids.append(token)
                    positions.append(p)
                    slots.append(seq.block_table[p // bs] * bs + p % bs)
                    tables.append(seq.block_table)
                fill = (lambda ids_t: landing.fill(ids_t, dst, rows)) if dst and landing is not None else None
                return graphs.run(ids=ids, positions=positions, slots=slots, seq_lens=[p + 1 for p in positions],
                                  tables=tables, fill=fill)
        return self.decoder.forward(self._prepare(batch, landing), self._kv)

    def _sharded_forward(self, step: int, batch: list[ScheduledSeq]) -> torch.Tensor:
        """Every rank runs the pass (rank 0's layout of the target goes with it under capture); rank 0's logits."""
        assert self.ranks is not None
        inputs = self._prepare(batch)
        layout = self.rank_layout(step, batch, inputs) if self.rank_layout and self.pass_hook else None
        with self.ranks.forward_pass(inputs, self.block_size, self._num_blocks, self.decoder.scopes, layout):
            if self.pass_hook is not None:
                with self.pass_hook(step, batch, inputs):
                    return self.decoder.forward(inputs, self._kv)
            return self.decoder.forward(inputs, self._kv)

    # Under per-rank capture (oracle.engines.native.sharded): the target's layout of a pass, sent to the ranks.
    rank_layout: Callable[[int, list[ScheduledSeq], StepInputs], Any] | None = None

    def _decode_graphs(self) -> DecodeGraphs:
        if self._graphs is None:
            self._graphs = DecodeGraphs(self.decoder, self._kv, junk_block=self._num_blocks,
                                        block_size=self.block_size, max_num_seqs=self.max_num_seqs,
                                        num_kv_splits=num_kv_splits_for)
        return self._graphs

    def _prepare(self, batch: list[ScheduledSeq], landing: _Landing | None = None) -> StepInputs:
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        qsl = [0]
        seq_lens: list[int] = []
        logits_idx: list[int] = []
        dst: list[int] = []
        rows: list[int] = []
        bs = self.block_size
        for item in batch:
            seq = item.seq
            start = seq.num_computed_tokens
            end = start + item.num_new_tokens
            ids += seq.tokens[start:end]
            if seq.tokens[end - 1] == PENDING_TOKEN:  # a token in flight is the last one a sequence has
                assert landing is not None
                dst.append(len(ids) - 1)
                rows.append(landing.row_of[seq.index])
                ids[-1] = 0
            positions += range(start, end)
            slots += [seq.block_table[p // bs] * bs + p % bs for p in range(start, end)]
            qsl.append(qsl[-1] + item.num_new_tokens)
            seq_lens.append(end)
            if item.completes:
                logits_idx.append(qsl[-1] - 1)
        width = max(len(item.seq.block_table) for item in batch)
        tables = [item.seq.block_table + [0] * (width - len(item.seq.block_table)) for item in batch]
        # One host-to-device copy: every index list end to end, split on the device.
        lengths = [len(ids), len(positions), len(slots), len(tables) * width, len(seq_lens), len(qsl), len(logits_idx)]
        flat = to_device(
            array("q", [*ids, *positions, *slots, *(b for row in tables for b in row), *seq_lens, *qsl, *logits_idx]),
            self.device)
        ids_t, pos_t, slots_t, tables_t, lens_t, qsl_t, idx_t = torch.split(flat, lengths)
        if landing is not None:
            landing.fill(ids_t, dst, rows)
        return StepInputs(
            input_ids=ids_t, positions=pos_t, slot_mapping=slots_t,
            block_tables=tables_t.view(len(tables), width).to(torch.int32), seq_lens=lens_t.to(torch.int32),
            query_start_loc=qsl_t.to(torch.int32), logits_indices=idx_t,
            num_kv_splits=num_kv_splits_for(len(batch)),
        )

    def _record(self, rows: SampledRows, done: list[int], outs: list[Completion]) -> None:
        """Append each sampled row to its sequence's completion (`done`: the rows' sequence indices)."""
        for row, index in enumerate(done):
            out = outs[index]
            out.token_ids.append(rows.tokens[row])
            out.logprobs.append(rows.logprobs[row])
            assert out.top2 is not None
            out.top2.append(rows.top2[row])
            if out.logits is not None:
                out.logits.append(rows.full[row])
            elif out.logits_digests is not None:
                out.logits_digests.append(rows.digests[row])
