"""Calls into an engine as the execution makes them: `generate` (inputs and outputs checked, the phase told to
the watchdog), `fresh` (from a cold prefix cache), `keep_rows` (what a stored result keeps of its rows), and the
`Localizer` an execution hands its divergences to."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from oracle.compare import Divergence, row_digest
from oracle.engines.contract import (
    Completion,
    Engine,
    Request,
    ResetsPrefixCache,
    RunSpec,
    capabilities,
    output_problem,
    request_problem,
    run_generate,
)
from oracle.errors import ConfigError, EngineError, OracleError, engine_error
from oracle.lifecycle.watchdog import GuardedEngine
from oracle.plan import phase_of


def generate(engine: Engine, requests: Sequence[Request], max_num_batched_tokens: int | None = None,
             phase: str | None = None) -> list[Completion]:
    """engine.generate with every failure turned into EngineError (exit 3).

    Every request is checked first (`oracle.engines.contract.request_problem`: an empty prompt is a
    ConfigError, exit 2). Every completion is checked against its request (`oracle.engines.contract.output_problem`): a NaN or
    infinite logprob or logits value, or fewer tokens than asked, is an engine error naming the mode,
    the request and the step. Outputs that are not numbers cannot be judged, so no check may read
    them: two NaN runs would be bitwise equal, and a NaN difference is "within" every tolerance.
    `phase`: what the call is for, named in a hang's message with its first request (else read from the ids
    the plan gives a trial's and a reference's requests).
    """
    _check_requests(requests)
    if isinstance(engine, GuardedEngine):  # a hang's message names the phase of the run it stopped in
        ids = [r.request_id for r in requests]
        engine.phase = phase_of(ids) if phase is None or not ids else f"{phase} (request {ids[0]})"
    try:
        out = run_generate(engine, requests, max_num_batched_tokens)
    except OracleError:
        raise
    except Exception as e:  # noqa: BLE001 - any engine failure becomes exit 3 with a partial report
        raise engine_error(e) from e
    _check_outputs(engine, requests, out)
    return out


def _check_requests(requests: Sequence[Request]) -> None:
    """Checked here, once for every engine: a request the config made (exit 2)."""
    for r in requests:
        problem = request_problem(r)
        if problem is not None:
            raise ConfigError(f"request {r.request_id}: {problem}")


def _check_outputs(engine: Engine, requests: Sequence[Request], out: Any) -> None:
    """One Completion per request, each a number the judge can read (exit 3 otherwise)."""
    if not isinstance(out, list):
        raise EngineError(f"engine generate() returned {type(out).__name__}, not a list of Completions")
    if len(out) != len(requests):
        raise EngineError(f"engine returned {len(out)} completions for {len(requests)} requests")
    caps = capabilities(engine)
    for r, c in zip(requests, out, strict=True):
        problem = output_problem(r, c, caps.stop_at_eos, caps.eos_token_ids)
        if problem is not None:
            raise EngineError(f"{engine.mode} engine, request {r.request_id}: {problem}; "
                              "the model or server is broken (NaN/Inf weights, a truncated answer)")


def keep_rows(c: Completion, steps: Iterable[int | None] = ()) -> Completion:
    """`c` holding its logits rows only at `steps` (None elsewhere) and every row's sha256 in `logits_digests`.

    What a stored result needs: the judge compares rows where both are kept and digests elsewhere,
    and a divergence reads the rows at its first differing step, which the caller keeps. A trial's
    full rows are 608 KB a step at a 152k vocabulary; kept whole, 1,000 trials held ~10 GB. Kept rows
    are copied, so they do not pin the engine's [R, vocab] array of the whole step. Completions
    without rows are returned as they are.
    """
    if c.logits is None:
        return c
    keep = {i for i in steps if i is not None}
    digests = [row_digest(row) if row is not None else c.logits_digests[i]  # type: ignore[index]
               for i, row in enumerate(c.logits)]
    rows = [np.array(row, dtype=np.float32) if i in keep and row is not None else None
            for i, row in enumerate(c.logits)]
    return replace(c, logits=rows, logits_digests=digests)


def _step(d: Divergence | None) -> int | None:
    return None if d is None else d.step


def fresh(engine: Engine, requests: Sequence[Request], max_num_batched_tokens: int | None = None,
          phase: str | None = None) -> list[Completion]:
    """generate() from a cold prefix cache (where the engine has one it can reset)."""
    if capabilities(engine).reset_prefix_cache and isinstance(engine, ResetsPrefixCache):
        engine.reset_prefix_cache()
    return generate(engine, requests, max_num_batched_tokens, phase)


class Localizer(Protocol):
    """Names the first op at which the target's rows differ between two runs (oracle.localize)."""

    def can_localize(self, engine: Engine) -> bool: ...

    def localize(self, engine: Engine, expected: RunSpec, actual: RunSpec) -> Any: ...
