"""The engine contract: what every adapter (native, vLLM, servers, transformers, a user's own) implements.

An engine is built for one mode. It takes a list of requests, each with the engine step (or, for
servers, the delay in seconds) at which it arrives, and returns one `Completion` per request with
the evidence of what shared its forward passes.

`Engine` is what every engine provides: `mode`, `generate`, `describe`, `close`. Everything else is
an optional capability, declared by implementing its protocol below (`StopsAtEos`,
`ResetsPrefixCache`, `Capturable`, `LocalizesInWorker`, `LaysOutPasses`, `DeclaresOpPackages`,
`TimesForwardPasses`); an engine class may also say `needs_weights = False` (`class_needs_weights`).
The types the capture capabilities pass are declared here too, so that the contract imports nothing
of oracle but `oracle.localized_op`: `PassRecorder` (what `oracle.capture.rows.RowCapture` offers an
engine's capture), `PassLayout` and `Grid` (where the target's tokens sit in a pass); the answer,
`LocalizedOp`, is `oracle.localized_op`'s (the report holds it too, without loading the engines),
re-exported here.
`capabilities(engine)` reads them into one frozen `Capabilities`, with every field off for an engine
that declares none, so an engine with the four required members runs every check that needs
nothing more. Ask `capabilities(engine)` whether an engine can do something, never `isinstance`
against a capability protocol alone: a wrapper (the watchdog's `GuardedEngine`) implements every
capability's method and states its engine's through its own `capabilities`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from oracle.localized_op import LocalizedOp, position_ranges

if TYPE_CHECKING:
    from pathlib import Path

__all__ = ["MODES", "REQUIRED", "Capabilities", "Capturable", "Completion", "DeclaresOpPackages", "Engine", "Grid",
           "LaysOutPasses", "LocalizedOp", "LocalizesInWorker", "Mode", "PassLayout", "PassRecorder", "Request",
           "ResetsPrefixCache", "RunSpec", "SamplingParams", "StepEvidence", "StopsAtEos", "TimesForwardPasses",
           "capabilities", "class_needs_weights", "missing_members", "output_problem", "position_ranges",
           "request_problem", "run_generate"]

Mode = Literal["production", "invariant"]
MODES: tuple[Mode, ...] = ("production", "invariant")


@dataclass(frozen=True)
class SamplingParams:
    """Greedy when temperature == 0; otherwise seeded sampling (the seed is per request: its noise must not
    depend on the batch, nor be shared with another request). `top_k` 0 and `top_p` 1.0 keep every token."""

    max_tokens: int = 16
    temperature: float = 0.0
    seed: int = 0
    logits: Literal["full", "digest", "none"] = "digest"
    top_p: float = 1.0
    top_k: int = 0


@dataclass(frozen=True)
class Request:
    """One request of a trial: a prompt as token ids, when it arrives, and how to sample."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams
    arrival_step: int = 0
    arrival_delay_s: float = 0.0


@dataclass(frozen=True)
class StepEvidence:
    """What one forward pass that computed a token of this request looked like.

    `num_seqs` and `num_tokens` count every sequence and token in that forward pass (the request
    itself included; `num_tokens` is the pass's packed query length); `is_prefill` is true for
    passes that processed prompt tokens of this request, and `chunked` when its prompt needed more
    than one pass. `token_index` is the index of the generated token this pass sampled (None for a
    prefill chunk that sampled nothing). The fields after it describe the whole pass, as far as the
    engine can tell (None where it cannot): what split-KV and varlen kernels pick their
    configuration from.
    """

    engine_step: int
    num_seqs: int
    num_tokens: int
    is_prefill: bool
    chunked: bool = False
    num_cached_tokens: int = 0
    token_index: int | None = None  # which generated token this pass sampled, if any
    seq_position: int | None = None  # this request's index among the pass's sequences
    num_prefill_tokens: int | None = None  # prompt tokens in the pass, all sequences
    num_decode_tokens: int | None = None  # decode tokens in the pass, all sequences
    max_query_len: int | None = None  # the longest query of any sequence in the pass
    kv_len: int | None = None  # this request's KV length after the pass
    max_kv_len: int | None = None  # the longest KV length of any sequence in the pass
    has_chunked: bool | None = None  # some sequence in the pass was a chunk of a longer prompt
    has_cache_hit: bool | None = None  # some sequence in the pass started from cached prefix blocks


@dataclass
class Completion:
    """The outputs of one request, compared bitwise across runs.

    `logprobs[i]` is the float32 log-probability of `token_ids[i]`; `logits[i]` is the float32
    logits row of step i (vocab-sized) when full rows were asked for; `logits_digests[i]` a
    sha256 of that row's bytes otherwise (the native engine hashes a fingerprint of the row's bits
    made on the device, oracle/engines/native/sampler.py: compare digests of one engine only). `top2[i]` is (top-1 logit, top-2 logit) of step i.
    In a stored result (oracle.execute.keep_rows) a trial keeps only the rows a divergence reads: the
    others are None, and `logits_digests[i]` is then the sha256 of row i's float32 bytes.
    """

    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    logits: list[Any] | None = None
    logits_digests: list[str] | None = None
    top2: list[tuple[float, float]] | None = None
    evidence: list[StepEvidence] = field(default_factory=list)

    @property
    def max_batch(self) -> int:
        """The most sequences this request ever shared a forward pass with (itself included)."""
        return max((e.num_seqs for e in self.evidence), default=0)


@runtime_checkable
class Engine(Protocol):
    """What the runner needs from every engine. `mode` is fixed at construction."""

    mode: Mode

    def generate(self, requests: Sequence[Request], max_num_batched_tokens: int | None = None) -> list[Completion]:
        """Run all requests (arriving as given) to completion; one Completion per request, in order.

        Each completion holds exactly `sampling.max_tokens` tokens (EOS does not stop a request),
        unless the engine declares `StopsAtEos` with `stop_at_eos` true; every logprob is finite.
        `oracle.execute.generate` checks this (`output_problem`): anything else is an engine error.
        It checks the requests before the call too (`request_problem`), so no engine checks them again.

        `max_num_batched_tokens`, when given, is this call's token budget per forward pass (a
        trial's chunked-prefill budget); an engine that cannot change it per call raises
        `oracle.errors.ConfigError`.
        """
        ...

    def describe(self) -> dict[str, Any]:
        """Engine name, version and the invariance mechanism, for the report's environment."""
        ...

    def close(self) -> None:
        """Release the model and any worker process or server."""
        ...


# The members every engine has; a `module:Class` engine lacking one is a config error (`missing_members`).
REQUIRED = ("mode", "generate", "describe", "close")


@dataclass(frozen=True)
class RunSpec:
    """One run to capture per op (localization): requests, the target's index among them, the per-pass
    token budget. `warm_with` runs first (uncaptured) after the prefix cache is reset: a warm-cache run.
    """

    requests: tuple[Request, ...]
    target_index: int
    max_num_batched_tokens: int | None = None
    warm_with: tuple[Request, ...] = ()

    @property
    def budget(self) -> int | None:
        """Deprecated: `max_num_batched_tokens` (its name until 0.x; kept for one release, see CHANGELOG.md)."""
        import warnings

        warnings.warn("RunSpec.budget is deprecated: read RunSpec.max_num_batched_tokens", DeprecationWarning,
                      stacklevel=2)
        return self.max_num_batched_tokens


# --- what the capture capabilities pass: where the target sits, the recorder ---------------------


@dataclass(frozen=True)
class Grid:
    """A token layout of a pass and where the target's tokens sit in it.

    `shape` is `(T,)` for a flattened layout (rows along dim 0) or `(B, S)` for a batch of
    sequences; `rows[i]` indexes into it (a 1- or 2-tuple) and holds token `positions[i]`.
    """

    shape: tuple[int, ...]
    rows: tuple[tuple[int, ...], ...]
    positions: tuple[int, ...]


@dataclass(frozen=True)
class PassLayout:
    """One forward pass as the capture sees it.

    `grids` are tried in order (the first that fits a tensor's shape wins); `seq_index` is the
    target's sequence among the pass's (its block-table row), `kv_len` the number of positions it
    attends to, `block_size` the KV cache's, when the engine knows them (for `kv_read`).
    """

    forward_pass: int
    engine_step: int | None
    grids: tuple[Grid, ...]
    evidence: dict[str, Any]
    seq_index: int | None = None
    kv_len: int | None = None
    block_size: int | None = None


class PassRecorder(Protocol):
    """What an engine's `capture` is handed (`oracle.capture.rows.RowCapture`): it opens each forward pass that
    holds the target with `forward_pass(layout, inputs)` (`inputs`: the pass's token-aligned tensors), and says
    which module is running through `module_path`. `bypass` names ops (`namespace.name`) to observe at the
    Python call, `enter` the namespaces of wrapper ops whose insides are captured."""

    module_path: Callable[[], str]
    bypass: tuple[str, ...]
    enter: tuple[str, ...]

    def forward_pass(self, layout: PassLayout, inputs: Sequence[Any]) -> AbstractContextManager[None]:
        """Capture one pass laid out as `layout`, its rows starting at `inputs`."""
        ...


# --- optional capabilities: each a protocol an engine implements, or not -------------------------


@runtime_checkable
class StopsAtEos(Protocol):
    """`stop_at_eos` true: a request finishes at one of `eos_token_ids`, so a completion may hold fewer
    than `max_tokens` tokens: at least one, the last of them an EOS id (a short output ending in any
    other token is a truncated one, an engine error). Read once, when the engine is wrapped (native:
    the `engine.options.stop_at_eos` option and the model's eos_token_id)."""

    stop_at_eos: bool
    eos_token_ids: Sequence[int]


@runtime_checkable
class ResetsPrefixCache(Protocol):
    """An engine with a prefix cache that can be emptied. Every reference and trial starts from a cold
    cache through it (`oracle.execute.fresh`), and the prefix_cache check needs it; without it those
    runs start from whatever the engine kept, and the check is skipped with a note."""

    def reset_prefix_cache(self) -> None:
        """Forget every cached KV block: the next requests run cold."""
        ...


@runtime_checkable
class Capturable(Protocol):
    """An engine whose model runs in this process and can be captured per op (native, transformers):
    localization (`oracle.localize`, `oracle.capture`) runs both sides of a divergence through it."""

    def capture(self, run: RunSpec, rows: PassRecorder) -> Completion:
        """Reset the prefix cache, run `run.warm_with` uncaptured, then `run.requests` (with `run.max_num_batched_tokens`)
        with `rows` active on every forward pass that holds the target; the target's Completion.
        Runs every pass eagerly (no CUDA graphs), on the calling thread."""
        ...


@runtime_checkable
class LocalizesInWorker(Protocol):
    """An engine whose model runs in another process (vLLM's worker): it localizes there, both runs
    captured, the op confirmed alone and `repro_dir` written in that process."""

    def localize(self, expected: RunSpec, actual: RunSpec, repro_dir: Path | None = None) -> LocalizedOp | None:
        """The first op where the target's rows of `actual` depart from `expected`'s, or None."""
        ...


@runtime_checkable
class CapturesRanks(Protocol):
    """Captures a run in every tensor-parallel rank (native, vLLM), for comparing two sizes (`oracle.capture.sizes`)."""

    def capture_ranks(self, run: RunSpec, snapshot_at: Any = None) -> list[dict[str, Any]]:
        ...  # rank order: each rank's `calls`, `passes`, `completion`, `snapshot` (`Snapshot.plain()` of `snapshot_at`)


@runtime_checkable
class LaysOutPasses(Protocol):
    """A Hugging Face engine whose forward passes are not `[B, S]` rows of one request each (packed
    passes): `oracle.engines.hf_capture` asks it where the target's tokens sit, from inside its own
    capture, on its own thread."""

    def localize_layout(self, forward_pass: int, kwargs: dict[str, Any], target_index: int) -> PassLayout | None:
        """Where the target's tokens are in forward pass `forward_pass` called with `kwargs`; None: not in it."""
        ...


@runtime_checkable
class DeclaresOpPackages(Protocol):
    """Modules that register the engine's custom ops (`torch.library`): a localized op's `repro/`
    imports them before it runs the op alone."""

    op_packages: Sequence[str]


@runtime_checkable
class TimesForwardPasses(Protocol):
    """Time spent inside forward passes, for `oracle bench`: while `timed` is true every pass adds its
    seconds (device time where the device keeps it) to `forward_seconds`."""

    timed: bool
    forward_seconds: float


@runtime_checkable
class TimesItsStart(Protocol):
    """Where its start went: `start_seconds` maps parts of it (`import_vllm`, `vllm_engine`, ...) to seconds,
    read once after the engine is built; the report's timings hold each as `{mode}_engine_start_{part}_s`, beside
    the whole start (`{mode}_engine_start_s`), which the parts need not add up to."""

    start_seconds: Mapping[str, float]


@runtime_checkable
class TimesItsLocalize(Protocol):
    """Where its last `localize` call went: `localize_seconds` maps parts of it (`capture`, `rule`, `confirm`,
    `repro`, `eager_twin_start`, ...) to seconds, read after each call; the report's timings hold their sums over a
    mode's localizations as `{mode}_localize_{part}_s`, beside the whole (`{mode}_localize_s`)."""

    localize_seconds: Mapping[str, float]


def start_parts(engine: object) -> dict[str, float]:
    """TimesItsStart's `start_seconds` of `engine`, its names and finite non-negative seconds only (empty for an
    engine without it, or one whose answer is not such a mapping)."""
    return _seconds(engine, "start_seconds")


def localize_parts(engine: object) -> dict[str, float]:
    """TimesItsLocalize's `localize_seconds` of `engine`, as `start_parts` reads `start_seconds`."""
    return _seconds(engine, "localize_seconds")


def _seconds(engine: object, name: str) -> dict[str, float]:
    parts = getattr(engine, name, None)
    if not isinstance(parts, Mapping):
        return {}
    return {str(k): float(v) for k, v in parts.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0}


# What localize says of an engine whose Capabilities do not localize: what to add (docs/engines.md).
CAPTURE_HOW = ("declares no way to capture its ops: give its class capture(run, rows) (Capturable, a model in "
               "this process) or localize(expected, actual, repro_dir) (LocalizesInWorker, a model in a worker), "
               "from oracle.engines.contract; the native, transformers and vllm engines have one")


@dataclass(frozen=True)
class Capabilities:
    """What an engine can do beyond `Engine`, as `capabilities(engine)` reads it; each field says whether it
    implements the protocol of that name (off, or empty, when it does not)."""

    stop_at_eos: bool = False  # StopsAtEos, with stop_at_eos true
    eos_token_ids: tuple[int, ...] = ()  # StopsAtEos: what a short output must end with
    reset_prefix_cache: bool = False  # ResetsPrefixCache
    capture: bool = False  # Capturable
    localize: bool = False  # LocalizesInWorker
    capture_ranks: bool = False  # CapturesRanks
    localize_layout: bool = False  # LaysOutPasses
    op_packages: tuple[str, ...] = ()  # DeclaresOpPackages
    forward_timing: bool = False  # TimesForwardPasses
    start_timing: bool = False  # TimesItsStart
    localize_timing: bool = False  # TimesItsLocalize

    @property
    def localizes(self) -> bool:
        """Its ops can be localized: it captures itself, or localizes in its worker."""
        return self.capture or self.localize


@runtime_checkable
class _StatesCapabilities(Protocol):
    capabilities: Capabilities


def capabilities(engine: object) -> Capabilities:
    """The optional capabilities `engine` implements (see the protocols above).

    An object that states its own `capabilities: Capabilities` (a wrapper: `GuardedEngine` states its
    engine's) is taken at its word; any other is read from the protocols it implements.
    """
    if isinstance(engine, _StatesCapabilities) and isinstance(engine.capabilities, Capabilities):
        return engine.capabilities
    packages = engine.op_packages if isinstance(engine, DeclaresOpPackages) else ()
    return Capabilities(
        stop_at_eos=isinstance(engine, StopsAtEos) and engine.stop_at_eos is True,
        eos_token_ids=tuple(int(t) for t in engine.eos_token_ids) if isinstance(engine, StopsAtEos) else (),
        reset_prefix_cache=isinstance(engine, ResetsPrefixCache),
        capture=isinstance(engine, Capturable),
        localize=isinstance(engine, LocalizesInWorker),
        capture_ranks=isinstance(engine, CapturesRanks),
        localize_layout=isinstance(engine, LaysOutPasses),
        op_packages=(packages,) if isinstance(packages, str) else tuple(str(p) for p in packages),
        forward_timing=isinstance(engine, TimesForwardPasses),
        start_timing=isinstance(engine, TimesItsStart),
        localize_timing=isinstance(engine, TimesItsLocalize),
    )


def missing_members(engine: object) -> list[str]:
    """The members of `Engine` that `engine` lacks (methods must be callable): empty for an engine."""
    return [name for name in REQUIRED
            if not hasattr(engine, name) or (name != "mode" and not callable(getattr(engine, name)))]


@runtime_checkable
class _SaysNeedsWeights(Protocol):
    needs_weights: bool


def class_needs_weights(engine_class: object) -> bool:
    """Whether an engine class reads the checkpoint's weights: true unless it says `needs_weights = False`
    (a client of a server reads config.json and the tokenizer only, so a hub id is fetched without them)."""
    return not isinstance(engine_class, _SaysNeedsWeights) or bool(engine_class.needs_weights)


def _nonfinite(values: Any) -> tuple[int, float] | None:
    """(index, value) of the first NaN or +Inf in a float32 row, or None. -Inf is allowed: a masked logit."""
    import numpy as np

    row = np.asarray(values, dtype=np.float32).reshape(-1)
    bad = np.flatnonzero(np.isnan(row) | np.isposinf(row))
    return (int(bad[0]), float(row[bad[0]])) if bad.size else None


def run_generate(engine: Engine, requests: Sequence[Request], max_num_batched_tokens: int | None
                 ) -> list[Completion]:
    """`engine.generate`, given the per-pass token budget only when one is set: an engine written to the
    contract's minimum may take the requests alone. What it returns is checked by the caller."""
    if max_num_batched_tokens:
        return engine.generate(requests, max_num_batched_tokens)
    return engine.generate(requests)


def request_problem(request: Request) -> str | None:
    """What makes `request` one no engine can run, or None. Checked once, before any engine sees it.

    An empty prompt has no position to predict the first token from (every engine would fail on it
    in its own way, or not at all).
    """
    if not request.prompt_token_ids:
        return "empty prompt"
    return None


def output_problem(request: Request, c: Any, stop_at_eos: bool = False, eos_token_ids: Sequence[int] = ()) -> str | None:
    """What makes `c` an impossible output for `request`, or None when it is a well-formed Completion.

    A broken model (NaN or Inf weights) or a lying server must never compare equal by accident, so
    these are engine faults, not data: a non-Completion; token ids that are not ints; more tokens
    than `max_tokens`, or fewer unless the engine stops at EOS and the last is one of `eos_token_ids`;
    per-step lists of other lengths; a sampled-token logprob that is NaN or +-Inf (a sampled token has
    a finite probability); a top-1 that is not finite or a top-2 that is NaN or +Inf; a logits row with
    a NaN or +Inf.
    """
    if not isinstance(c, Completion):
        return f"returned {type(c).__name__}, not a Completion"
    if not isinstance(c.token_ids, list) or not isinstance(c.logprobs, list):
        return "token_ids and logprobs must be lists"
    expected = _Expected(request.sampling.max_tokens, stop_at_eos, tuple(eos_token_ids))
    return next((problem for check in _CONTENT_CHECKS if (problem := check(c, expected)) is not None), None)


@dataclass(frozen=True)
class _Expected:
    """What a well-formed completion of one request holds: `max_tokens` tokens, or fewer ending in an EOS id."""

    max_tokens: int
    stop_at_eos: bool
    eos_token_ids: tuple[int, ...]


def _token_count(c: Completion, want: _Expected) -> str | None:
    n = len(c.token_ids)
    if n > want.max_tokens or (n < want.max_tokens and not want.stop_at_eos):
        return (f"{n} tokens for max_tokens {want.max_tokens} (a request generates exactly max_tokens: "
                "EOS is ignored, so a short output is a truncated one)")
    return None


def _short_without_eos(c: Completion, want: _Expected) -> str | None:
    """An engine that stops at EOS may return fewer tokens, the last of them an EOS id."""
    n = len(c.token_ids)
    if n == want.max_tokens or (n and c.token_ids[-1] in want.eos_token_ids):
        return None
    ends = f"ends in token {c.token_ids[-1]!r}" if n else "is empty"
    eos = ", ".join(map(str, want.eos_token_ids)) or "the engine declares none"
    return (f"{n} tokens for max_tokens {want.max_tokens}: the engine stops at EOS, but the output {ends}, not an "
            f"EOS token ({eos}): a truncated one")


def _token_ids(c: Completion, want: _Expected) -> str | None:
    bad_id = next((t for t in c.token_ids if type(t) is not int or t < 0), None)
    return f"token id {bad_id!r} is not a non-negative int" if bad_id is not None else None


def _step_lengths(c: Completion, want: _Expected) -> str | None:
    """Every per-step list holds one entry per token."""
    n = len(c.token_ids)
    lengths = ((name, len(values)) for name in ("logprobs", "logits", "logits_digests", "top2")
               if (values := getattr(c, name)) is not None)
    return next((f"{length} {name} for {n} tokens" for name, length in lengths if length != n), None)


def _logprobs(c: Completion, want: _Expected) -> str | None:
    """A sampled token has a finite probability: its logprob is a finite number."""
    for i, lp in enumerate(c.logprobs):
        if not isinstance(lp, (int, float)) or isinstance(lp, bool) or not math.isfinite(lp):
            return f"step {i}: the sampled token's logprob is {lp!r}, not a finite number"
    return None


def _top2(c: Completion, want: _Expected) -> str | None:
    """The top-1 logit is finite; the top-2 may be -Inf (a masked logit), never NaN or +Inf."""
    for i, pair in enumerate(c.top2 or ()):
        top1, top2 = (float(v) for v in pair)
        if not math.isfinite(top1) or math.isnan(top2) or top2 == math.inf:
            return f"step {i}: top-2 logits ({top1!r}, {top2!r}) are not finite"
    return None


def _logits_rows(c: Completion, want: _Expected) -> str | None:
    for i, row in enumerate(c.logits or ()):
        if row is None:
            return f"step {i}: no logits row"
        found = _nonfinite(row)
        if found is not None:
            return f"step {i}: logits row holds {found[1]!r} at token {found[0]}"
    return None


# The checks of a Completion's contents, in order: each may assume the ones before it passed.
_CONTENT_CHECKS: tuple[Callable[[Completion, _Expected], str | None], ...] = (
    _token_count, _short_without_eos, _token_ids, _step_lengths, _logprobs, _top2, _logits_rows)
