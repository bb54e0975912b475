"""vLLM's scheduler, tapped: what each scheduled request did in each forward pass, and the pass's context.

`SchedulerTap` wraps `scheduler.schedule`; each call's share per request (`Scheduled`) is the evidence of what
shared the pass. While a capture names a target, every scheduled pass also gets a `PassContext`: plain data
that places the target's rows in the pass (`oracle.engines.vllm_capture.pass_layout`). It is kept here for the
worker's own process and rides on the scheduler's output as `ORACLE_PASS` to every rank vLLM runs the pass in
(the output is pickled to them whole, this attribute with it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ORACLE_PASS = "oracle_pass"  # the attribute of vLLM's SchedulerOutput that carries the PassContext


@dataclass
class Scheduled:
    """One request's share of one forward pass, read from the scheduler right after it scheduled."""

    num_seqs: int
    num_tokens: int
    is_prefill: bool
    completes: bool  # the pass reaches the end of the known tokens, so it samples a token
    num_computed_before: int
    num_output_tokens: int
    num_new_tokens: int = 0


@dataclass(frozen=True)
class PassContext:
    """What places a target's rows in one pass, without the scheduler: the pass's requests (vLLM's ids) and their
    shares, each one's token ids so far, the target's id, the engine step, the KV block size."""

    step: int
    target: str
    now: dict[str, Scheduled]
    tokens: dict[str, tuple[int, ...]]
    block_size: int | None
    enforce_eager: bool


class SchedulerTap:
    """Wraps `scheduler.schedule` to keep, per call, what each scheduled request did in that pass.

    Read inside the call because the scheduler advances `num_computed_tokens` there and frees
    finished requests in `update_from_output`, after which they are gone. `describe`, when set, makes each
    pass's `PassContext` (None: the pass is not captured).
    """

    def __init__(self, scheduler: Any) -> None:
        self._scheduler = scheduler
        self._schedule = scheduler.schedule
        self.passes: list[dict[str, Scheduled]] = []
        self.describe: Callable[[dict[str, Scheduled]], PassContext | None] | None = None
        self.context: PassContext | None = None  # the last scheduled pass's
        scheduler.schedule = self._tapped

    def _tapped(self, *args: Any, **kwargs: Any) -> Any:
        out = self._schedule(*args, **kwargs)
        counts: dict[str, int] = out.num_scheduled_tokens
        total = int(out.total_num_scheduled_tokens)
        one: dict[str, Scheduled] = {}
        for rid, n in counts.items():
            req = self._scheduler.requests[rid]
            after = int(req.num_computed_tokens)  # already advanced by this pass
            one[rid] = Scheduled(
                num_seqs=len(counts), num_tokens=total, is_prefill=after - n < req.num_prompt_tokens,
                completes=after >= req.num_tokens, num_computed_before=after - n,
                num_output_tokens=int(req.num_output_tokens), num_new_tokens=int(n),
            )
        if total:
            self.passes.append(one)
        self.context = self.describe(one) if (self.describe is not None and total) else None
        setattr(out, ORACLE_PASS, self.context)
        return out

    def tokens_of(self, rids: Any) -> dict[str, tuple[int, ...]]:
        """The token ids so far (prompt and output) of each of `rids` the scheduler still holds."""
        out: dict[str, tuple[int, ...]] = {}
        for rid in rids:
            request = self._scheduler.requests.get(rid)
            out[rid] = tuple(getattr(request, "all_token_ids", ()) or ())
        return out

    def take(self) -> list[dict[str, Scheduled]]:
        passes, self.passes = self.passes, []
        return passes
