"""A fake engine for unit tests of the harness: outputs are a pure function of the prompt,
except where a planted fault makes them depend on the batch.

Every request shares each step with all requests that have arrived and not finished, so the
evidence is real for the fake's own schedule.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from oracle.engines.contract import Completion, Mode, Request, StepEvidence


def _value(prompt: tuple[int, ...], step: int) -> tuple[int, float]:
    h = hashlib.sha256(repr((prompt, step)).encode()).digest()
    return h[0] % 97, -float(h[1] + 1) / 64.0


class FakeEngine:
    def __init__(self, model: Path, mode: Mode, *, diverge_from_batch: int | None = None,
                 diverge_mode: str = "invariant", diverge_step: int = 0, diverge_not_first: bool = False,
                 fail_after_calls: int | None = None, always_alone: bool = False, flip_token: bool = False,
                 sleep_s: float = 0.0, diverge_from_tokens: int | None = None,
                 nondeterministic_from_call: int | None = None, fault_after_calls: int | None = None,
                 fault: str = "", close_raises: bool = False, announce: bool = False,
                 alone_from_call: int | None = None, misfire_every: int | None = None,
                 sampler_from_batch: int | None = None) -> None:
        self.mode = mode
        self.diverge_from_batch = diverge_from_batch
        self.diverge_mode = diverge_mode
        self.diverge_step = diverge_step
        self.diverge_not_first = diverge_not_first
        self.fail_after_calls = fail_after_calls
        self.always_alone = always_alone
        self.alone_from_call = alone_from_call  # from this call on, every request runs alone (no batch forms)
        # Every this-many-th call misfires, whatever the batch, a little differently each time (run-to-run).
        self.misfire_every = misfire_every
        # From this batch size on, another token is sampled from the same logits (a sampler fault): the
        # completions then carry logits digests, a function of the prompt and step alone.
        self.sampler_from_batch = sampler_from_batch
        self.flip_token = flip_token
        self.sleep_s = sleep_s
        # Diverge when the call's prompts hold this many tokens together (a fault keyed on the pass size).
        self.diverge_from_tokens = diverge_from_tokens
        # From this call on, every call perturbs every output a little differently (run-to-run noise).
        self.nondeterministic_from_call = nondeterministic_from_call
        # After `fault_after_calls` calls, generate() does `fault`: hang | sys_exit | os_exit.
        self.fault_after_calls = fault_after_calls
        self.fault = fault
        self.close_raises = close_raises
        self.announce = announce  # print each call to stdout, so a test can wait for the run to be under way
        self.calls = 0

    def describe(self) -> dict[str, Any]:
        return {"engine": "fake", "invariance_mechanism": "none (fake)"}

    def close(self) -> None:
        if self.close_raises:
            raise RuntimeError("planted close failure")

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        self.calls += 1
        if self.announce:
            print(f"fake engine: {self.mode} call {self.calls}", flush=True)
        if self.fault_after_calls is not None and self.calls > self.fault_after_calls:
            if self.fault == "hang":
                threading.Event().wait()
            elif self.fault == "sys_exit":
                sys.exit(0)
            elif self.fault == "os_exit":
                os._exit(0)
        if self.sleep_s:
            time.sleep(self.sleep_s)
        if self.fail_after_calls is not None and self.calls > self.fail_after_calls:
            raise RuntimeError("planted engine failure")
        alone = self.always_alone or (self.alone_from_call is not None and self.calls >= self.alone_from_call)
        batch = 1 if alone else len(requests)
        tokens = sum(len(r.prompt_token_ids) for r in requests)
        noise = self.mode == self.diverge_mode and (
            (self.nondeterministic_from_call is not None and self.calls >= self.nondeterministic_from_call)
            or (self.misfire_every is not None and self.calls % self.misfire_every == 0))
        sampler = (self.sampler_from_batch is not None and self.mode == self.diverge_mode
                   and batch >= self.sampler_from_batch)
        out = []
        for pos, r in enumerate(requests):
            c = Completion(r.request_id, [], [], top2=[],
                           logits_digests=[] if self.sampler_from_batch is not None else None)
            for step in range(r.sampling.max_tokens):
                token, lp = _value(r.prompt_token_ids, step)
                planted = (
                    self.mode == self.diverge_mode and step >= self.diverge_step
                    and not (self.diverge_not_first and pos == 0)
                    and ((self.diverge_from_batch is not None and batch >= self.diverge_from_batch)
                         or (self.diverge_from_tokens is not None and tokens >= self.diverge_from_tokens))
                )
                if noise:
                    lp = lp + self.calls * 2.0**-18
                if planted:
                    lp = lp + 2.0**-20  # a few ULPs away
                    if self.flip_token:
                        token = (token + 1) % 97
                if c.logits_digests is not None:  # the logits: the prompt's and step's, whatever is sampled
                    c.logits_digests.append(hashlib.sha256(repr(("logits", r.prompt_token_ids, step)).encode()
                                                           ).hexdigest())
                if sampler and step >= self.diverge_step:
                    token, lp = (token + 1) % 97, lp - 0.5  # another token from the same row
                c.token_ids.append(token)
                c.logprobs.append(lp)
                c.top2.append((1.0, 0.5))  # type: ignore[union-attr]
                c.evidence.append(StepEvidence(step, batch, batch, step == 0, token_index=step))
            out.append(c)
        return out
