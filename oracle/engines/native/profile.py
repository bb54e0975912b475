"""Where a native engine's step time goes: per-phase host and device time, CUDA-graph coverage.

`StepProfile` is handed to an engine (`engine.profile = StepProfile(device)`); while it is set, each
step records the host time of its phases and, on CUDA, the device time of its forward pass and of its
sampling (CUDA events, read once the step's one host copy has waited for them). Phases, in step order:

    schedule   the scheduler picks the batch (Python)
    launch     the step's inputs built and copied, and the forward pass launched (or a graph replayed)
    sample     the sampling launched and its one device-to-host copy queued (on the CPU: run)
    evidence   the per-sequence evidence of the pass (Python, while the device computes and samples)
    wait       the host waits for a step's copy (CUDA: the device's pass and sampling still running); with
               overlapping steps, the step before's, once this one is queued behind it
    record     tokens appended to the completions and the scheduler updated (Python)

Forward passes are of three kinds: `prefill` (the batch holds prefill tokens, eager), `decode_graph`
(a decode step replayed from a CUDA graph) and `decode_eager` (a decode step run eagerly: graphs off,
a batch larger than every bucket, or per-op capture). Nothing here changes what the engine computes.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch

FORWARD_KINDS = ("prefill", "decode_graph", "decode_eager")
PHASES = ("schedule", "launch", "sample", "evidence", "wait", "record")


@dataclass
class _Pending:
    """A step's CUDA events, read after the step's host copy."""

    kind: str
    events: tuple[torch.cuda.Event, torch.cuda.Event, torch.cuda.Event]


@dataclass
class StepProfile:
    """Sums over the steps run while it is attached to an engine."""

    device: torch.device
    host_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    forward_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(FORWARD_KINDS, 0.0))
    steps: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FORWARD_KINDS, 0))
    sampling_s: float = 0.0  # device time of sampling (CUDA); on the CPU it is in host_s["sample"]
    eager_decode_sizes: Counter[int] = field(default_factory=Counter)  # batch size -> eager decode steps
    graph_decode_sizes: Counter[int] = field(default_factory=Counter)  # batch size -> replayed decode steps
    captures: int = 0  # CUDA graphs captured while profiling (a warm round leaves none to capture)
    tokens: int = 0  # tokens computed (prefill and decode)
    wall_s: float = 0.0  # the steps' host wall time, summed
    _pending: list[_Pending] = field(default_factory=list)  # steps launched, not yet read (two while steps overlap)
    _t: float = 0.0

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"

    # --- called by the engine, in step order ---

    def start(self) -> None:
        self._t = time.perf_counter()

    def drop_unread(self) -> None:
        """Forget steps launched and never read (a generate call that raised): the next call's steps start afresh."""
        self._pending.clear()

    def phase(self, name: str) -> None:
        now = time.perf_counter()
        self.host_s[name] += now - self._t
        self.wall_s += now - self._t
        self._t = now

    def forward_begin(self) -> torch.cuda.Event | None:
        if not self.on_cuda:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def forward_end(self, kind: str, begin: torch.cuda.Event | None, num_seqs: int, num_tokens: int) -> None:
        self.steps[kind] += 1
        self.tokens += num_tokens
        if kind == "decode_graph":
            self.graph_decode_sizes[num_seqs] += 1
        elif kind == "decode_eager":
            self.eager_decode_sizes[num_seqs] += 1
        if begin is None:  # CPU: the pass ran synchronously inside the launch phase
            self.forward_s[kind] += time.perf_counter() - self._t
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        self._pending.append(_Pending(kind, (begin, end, end)))

    def sampled(self) -> None:
        """Called right before the sampler's host copy: the end of the last launched step's sampling kernels."""
        if not self._pending:
            return
        done = torch.cuda.Event(enable_timing=True)
        done.record()
        last = self._pending[-1]
        last.events = (last.events[0], last.events[1], done)

    def read_device_times(self) -> None:
        """After a step's host copy (its events are done): the oldest unread step's forward and sampling times."""
        if not self._pending:
            return
        pending = self._pending.pop(0)
        begin, end, done = pending.events
        done.synchronize()
        self.forward_s[pending.kind] += begin.elapsed_time(end) / 1000.0
        self.sampling_s += end.elapsed_time(done) / 1000.0

    # --- results ---

    def as_dict(self) -> dict[str, Any]:
        decode_steps = self.steps["decode_graph"] + self.steps["decode_eager"]
        forward = sum(self.forward_s.values())
        return {
            "device": str(self.device),
            "wall_s": round(self.wall_s, 4),
            "host_s": {k: round(v, 4) for k, v in self.host_s.items()},
            "forward_s": {k: round(v, 4) for k, v in self.forward_s.items()},
            "forward_total_s": round(forward, 4),
            "forward_clock": "device (CUDA events)" if self.on_cuda else "host",
            "sampling_device_s": round(self.sampling_s, 4) if self.on_cuda else None,
            "steps": dict(self.steps),
            "tokens": self.tokens,
            "decode_graph_coverage": round(self.steps["decode_graph"] / decode_steps, 4) if decode_steps else None,
            "eager_decode_batch_sizes": dict(sorted(self.eager_decode_sizes.items())),
            "graph_decode_batch_sizes": len(self.graph_decode_sizes),
            "captures_while_profiling": self.captures,
            "python_per_step_ms": round(1000 * (self.host_s["schedule"] + self.host_s["evidence"]
                                                + self.host_s["record"]) / max(1, sum(self.steps.values())), 4),
        }
