"""Hazard probes: named schedule strata that put trials on each side of a known threshold.

A random schedule crosses a kernel's threshold only when its ranges happen to straddle it. A probe
crosses it on purpose, with one trial per side, read from the engine's config and the model:

- `fa3_packed_query`: a prefill packed beside the target's decode with a query length x GQA ratio of
  64 (below) and just over 64 (above), the target's KV length over 128 (FA3 with head_dim 64,
  vLLM #51902);
- `fa3_kv_128`, `fa3_kv_256`, `fa3_kv_512`: the same co-scheduled prefill (query x GQA over 64)
  beside a target whose KV length stays at or below the boundary (below) or is over it (above);
- `chunk_budget`: prompts arriving together that ask for max_num_batched_tokens - 1, exactly it,
  and + 1 tokens in one pass (the last one chunked); only with chunked prefill on;
- `prefix_block`: a filler that arrives first sharing block_size - 1, block_size and block_size + 1
  of the target's prompt tokens; only with prefix caching on.

- `shared_pass`: the target beside one filler arriving with it, decoding together (hazards of "any batch");
- `shared_prefix` (`{shared_prefix: N}`; named: N = 256, vLLM's cascade-attention threshold): 8 requests whose
  prompts share the target's first N - 1 (below) or N (at) tokens, batched together after one of them has
  prefilled (and, with a prefix cache, cached) the prefix (cascade / shared-prefix attention, vLLM PR #32561);
- `short_budget`: the config's longest target beside one short filler, under a per-trial token budget below
  the target's prompt length (above: its prefill is chunked) and one that holds both prompts (below: one
  prefill pass); chunked prefill on (vLLM PR #55612).
- `pass_tokens=N` (a hazard's threshold probe): prompts arriving together that fill one forward pass with
  N tokens (below) and N + 1 (above); `pass_bytes=B`: the same with N the tokens whose hidden state
  (hidden_size x the dtype's bytes) holds B bytes.

Whether a side formed is read from the trial's pass evidence, never from the plan (oracle.posture.formed): a
side that did not form never counts as crossed, and the report names it with what the evidence showed.

Probes ignore the config's random ranges (a filler may be longer, a batch larger, a target longer than
any the config draws): they go as far as the engine's limits allow (its token budget, max_num_seqs,
the model's context), and a side those limits rule out is reported (`Probes.unformed`) with the limit.

The KV probes need targets longer than a config's prompts may be: they get their own targets
(`probe-kv256-above`, ...), seeded random tokens, run solo like every target. Everything is drawn
from the run's seed alone, so a seed gives the same probes everywhere. Probe trials follow the
drawn schedule (ids after it), `probe` naming the stratum and side (`fa3_kv_256:above`).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from oracle.config import Config
from oracle.posture.formed import FA3_KV
from oracle.posture.hazards import NAMED_PROBES, ProbeSpec
from oracle.prompts import Target
from oracle.schedule import Filler, Trial

if TYPE_CHECKING:
    from oracle.models.facts import ModelFacts

PROBES = NAMED_PROBES  # the probes a config may name (schedule.probes)
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
FA3_LIMIT = 64  # packed query length x GQA ratio above which FA3 (head_dim 64) changes its configuration
# Fillers of a budget probe are at most this long, so no one of them is longer than a prompt needs to be.
_FILLER_CAP = 512
# vLLM's cascade attention (use_cascade_attention) needs a common prefix of 256 tokens and 8 requests.
CASCADE_PREFIX = 256
CASCADE_SEQS = 8
_PREFIX_TAIL = 8  # the target's own tokens after the shared prefix; each filler's are half of them
_SEED_SALT = 0x9E3779B1  # probe draws use their own stream, so adding probes never moves the drawn schedule


@dataclass(frozen=True)
class Probes:
    targets: tuple[Target, ...]  # targets made for the probes (appended after the run's)
    trials: tuple[Trial, ...]
    unformed: tuple[tuple[str, str], ...] = ()  # (`probe:side`, the limit that ruled it out)


def applicable(config: Config) -> tuple[str, ...]:
    """The probes that apply to the config's engine: budget edges need chunked prefill, block edges a prefix cache."""
    e = config.engine
    skip: set[str] = set()
    if not e.enable_chunked_prefill:
        skip.update(("chunk_budget", "short_budget"))
    if not e.enable_prefix_caching:
        skip.add("prefix_block")
    if config.sampling.max_tokens < 3:
        skip.update(p for p in PROBES if p.startswith("fa3"))  # no decode pass left to share with a prefill
    return tuple(p for p in PROBES if p not in skip)


def selected(config: Config, specs: Sequence[ProbeSpec] = ()) -> tuple[ProbeSpec, ...]:
    """The probes a run adds: `schedule.probes` (all: every probe that applies; a list: those that apply;
    auto: none of its own), then those of the known hazards (`specs`), each once; none at all with `none`."""
    chosen = config.schedule.probes
    if chosen == "none":
        return ()
    names = applicable(config)
    own = names if chosen == "all" else tuple(p for p in names if p in chosen) if isinstance(chosen, list) else ()
    out = [ProbeSpec(p) for p in own]
    for spec in specs:
        if spec not in out:
            out.append(spec)
    return tuple(out)


def inapplicable(config: Config, spec: ProbeSpec) -> str | None:
    """Why a hazard's probe cannot run on this engine at all (the setting that rules it out), or None."""
    if spec.at is not None or spec.name in applicable(config):
        return None
    e = config.engine
    if spec.name == "chunk_budget" and not e.enable_chunked_prefill:
        return "engine.enable_chunked_prefill is off: no pass is cut at the budget"
    if spec.name == "short_budget" and not e.enable_chunked_prefill:
        return "engine.enable_chunked_prefill is off: no prompt is split across passes"
    if spec.name == "prefix_block" and not e.enable_prefix_caching:
        return "engine.enable_prefix_caching is off: no block is cached"
    return f"sampling.max_tokens {config.sampling.max_tokens} < 3: no decode pass is left to share with a prefill"


def _token_ids(rng: random.Random, n: int, vocab_size: int) -> tuple[int, ...]:
    return tuple(rng.randrange(vocab_size) for _ in range(n))


class _Builder:
    def __init__(self, config: Config, targets: Sequence[Target], seed: int, first_id: int, vocab_size: int,
                 gqa: int, context: int | None) -> None:
        self.config = config
        self.targets = list(targets)
        self.base = len(targets)
        self.rng = random.Random(seed ^ _SEED_SALT)
        self.next_id = first_id
        self.vocab_size = vocab_size
        self.gqa = max(1, gqa)
        self.context = context
        self.new_targets: list[Target] = []
        self.trials: list[Trial] = []
        self.unformed: list[tuple[str, str]] = []

    def fits(self, n: int) -> bool:
        return self.context is None or n + self.config.sampling.max_tokens <= self.context

    def cannot(self, probe: str, side: str, limit: str) -> None:
        self.unformed.append((f"{probe}:{side}", limit))

    def too_long(self, n: int) -> str:
        return (f"{n} prompt tokens + sampling.max_tokens {self.config.sampling.max_tokens} exceed the model's "
                f"context of {self.context}")

    def target(self, name: str, length: int) -> int:
        """The index of the probe target `name` of `length` tokens, made once."""
        for i, t in enumerate(self.new_targets):
            if t.name == name:
                return self.base + i
        self.new_targets.append(Target(name, _token_ids(self.rng, length, self.vocab_size)))
        return self.base + len(self.new_targets) - 1

    def filler(self, length: int, arrival: int, max_tokens: int = 1, shared_prefix: int = 0) -> Filler:
        return Filler(seed=self.rng.randrange(2**31), length=length, max_tokens=max_tokens, arrival_step=arrival,
                      shared_prefix=shared_prefix)

    def add(self, probe: str, side: str, target: int, fillers: Sequence[Filler], arrival: int = 0,
            budget: int | None = None) -> None:
        position = self.rng.randrange(len(fillers) + 1)
        self.trials.append(Trial(self.next_id, target, position, arrival, tuple(fillers), budget,
                                 probe=f"{probe}:{side}"))
        self.next_id += 1

    def prefill_steps(self, n: int) -> int:
        """Passes the target's prompt of n tokens takes alone (chunked by the engine's budget)."""
        budget = self.config.engine.max_num_batched_tokens
        return -(-n // budget) if self.config.engine.enable_chunked_prefill else 1

    def beside_decode(self, probe: str, side: str, target_len: int, name: str, query: int) -> None:
        """The target (alone first, prefilled) decoding when a filler's prefill of `query` tokens arrives."""
        budget = self.config.engine.max_num_batched_tokens
        if not self.fits(target_len):
            return self.cannot(probe, side, self.too_long(target_len))
        if query + 1 > budget:
            return self.cannot(probe, side, f"engine.max_num_batched_tokens {budget} < {query + 1} (the filler's "
                               "prefill beside the target's decode)")
        arrival = self.prefill_steps(target_len) + 1  # one decode pass alone, then the filler's prefill joins
        if arrival >= self.config.sampling.max_tokens:
            return self.cannot(probe, side, f"sampling.max_tokens {self.config.sampling.max_tokens}: the target "
                               f"is done before a prefill can join its decode (step {arrival})")
        target = self.target(name, target_len)
        self.add(probe, side, target, [self.filler(query, arrival)])
        return None

    def fa3(self, name: str) -> None:
        q_at = FA3_LIMIT // self.gqa  # the longest query whose x GQA stays within the limit
        if name == "fa3_packed_query":
            n = FA3_KV + 1
            self.beside_decode(name, "below", n, f"probe-kv{FA3_KV}-above", q_at)
            self.beside_decode(name, "above", n, f"probe-kv{FA3_KV}-above", q_at + 1)
            return
        kv = int(name.rsplit("_", 1)[1])
        below = kv - self.config.sampling.max_tokens  # prompt + every generated token stays <= kv
        query = 2 * (q_at + 1)  # well over the limit: the KV side alone decides
        if below >= 1:
            self.beside_decode(name, "below", below, f"probe-kv{kv}-below", query)
        else:
            self.cannot(name, "below", f"sampling.max_tokens {self.config.sampling.max_tokens} >= {kv}: every "
                        "target's KV length passes the boundary")
        self.beside_decode(name, "above", kv + 1, f"probe-kv{kv}-above", query)

    def chunk_budget(self) -> None:
        budget = self.config.engine.max_num_batched_tokens
        if not self.base:
            return self.cannot("chunk_budget", "at", "no target of the config's prompts")
        target = self.rng.randrange(self.base)
        t_len = len(self.targets[target].token_ids)
        for side, demand in (("below", budget - 1), ("at", budget), ("above", budget + 1)):
            self.fill_pass("chunk_budget", side, target, demand - t_len, budget)
        return None

    def fill_pass(self, probe: str, side: str, target: int, rest: int, budget: int | None) -> None:
        """The target and fillers of `rest` prompt tokens in all, arriving together (one pass when the budget holds them)."""
        if rest < 1:
            return self.cannot(probe, side, f"the target's prompt alone holds {len(self.targets[target].token_ids)} "
                               f"tokens: no filler can make the pass {rest + len(self.targets[target].token_ids)}")
        fillers = []
        while rest > 0:
            n = min(rest, _FILLER_CAP)
            if not self.fits(n):
                return self.cannot(probe, side, self.too_long(n))
            fillers.append(self.filler(n, 0))
            rest -= n
        seqs = self.config.engine.max_num_seqs
        if len(fillers) + 1 > seqs:
            return self.cannot(probe, side, f"engine.max_num_seqs {seqs} < {len(fillers) + 1} sequences "
                               f"(fillers of at most {_FILLER_CAP} tokens)")
        self.add(probe, side, target, fillers, 0, budget)
        return None

    def pass_tokens(self, label: str, n: int) -> None:
        """One forward pass of `n` prompt tokens (below) and of n + 1 (above): the run's shortest target and
        fillers arriving together, the engine's whole budget for the trial."""
        budget = self.config.engine.max_num_batched_tokens
        if n + 1 > budget:
            for side in ("below", "above"):
                self.cannot(label, side, f"engine.max_num_batched_tokens {budget} < {n + 1}: no pass holds the "
                            "threshold's tokens")
            return
        if not self.base:
            return self.cannot(label, "above", "no target of the config's prompts")
        target = min(range(self.base), key=lambda i: (len(self.targets[i].token_ids), i))
        t_len = len(self.targets[target].token_ids)
        for side, demand in (("below", n), ("above", n + 1)):
            self.fill_pass(label, side, target, demand - t_len, None)
        return None

    def shared_pass(self) -> None:
        """The target beside one filler that arrives with it and decodes as long: every pass is shared."""
        seqs = self.config.engine.max_num_seqs
        if not self.base:
            return self.cannot("shared_pass", "above", "no target of the config's prompts")
        if seqs < 2:
            return self.cannot("shared_pass", "above", f"engine.max_num_seqs {seqs}: no pass holds two sequences")
        target = self.rng.randrange(self.base)
        length = len(self.targets[target].token_ids)
        self.add("shared_pass", "above", target,
                 [self.filler(length, 0, max_tokens=self.config.sampling.max_tokens)], 0)
        return None

    def shared_prefix(self, label: str, n: int) -> None:
        """CASCADE_SEQS requests sharing the target's first n - 1 (below) or n (at) prompt tokens, in one batch.

        One filler (the leader) arrives first and prefills the prefix alone; the target and the other fillers
        arrive once it is done (its blocks cached where the engine caches), so every pass after holds them all."""
        seqs = self.config.engine.max_num_seqs
        if seqs < CASCADE_SEQS:
            for side in ("below", "at"):
                self.cannot(label, side, f"engine.max_num_seqs {seqs} < {CASCADE_SEQS} requests sharing the prefix")
            return
        t_len = n + _PREFIX_TAIL
        if not self.fits(t_len):
            for side in ("below", "at"):
                self.cannot(label, side, self.too_long(t_len))
            return
        budget = self.config.engine.max_num_batched_tokens
        if not self.config.engine.enable_chunked_prefill and t_len > budget:
            for side in ("below", "at"):
                self.cannot(label, side, f"engine.max_num_batched_tokens {budget} < {t_len} prompt tokens, "
                            "chunked prefill off")
            return
        # The leader decodes until the others have prefilled (whole passes of the budget) and decoded.
        leader_tokens = -(-(CASCADE_SEQS - 1) * t_len // budget) + 1 + self.config.sampling.max_tokens
        if not self.fits(t_len + leader_tokens - self.config.sampling.max_tokens):
            for side in ("below", "at"):
                self.cannot(label, side, self.too_long(t_len + leader_tokens - self.config.sampling.max_tokens))
            return
        target = self.target(f"probe-shared-prefix-{n}", t_len)
        tail = _PREFIX_TAIL // 2
        for side, shared in (("below", n - 1), ("at", n)):
            arrival = self.prefill_steps(shared + tail)  # the leader's prefill, alone
            leader = self.filler(shared + tail, 0, max_tokens=leader_tokens, shared_prefix=shared)
            rest = [self.filler(shared + tail, arrival, max_tokens=self.config.sampling.max_tokens,
                                shared_prefix=shared) for _ in range(CASCADE_SEQS - 2)]
            self.add(label, side, target, [leader, *rest], arrival=arrival)

    def short_budget(self) -> None:
        """The longest target and one short filler arriving together, under a budget below the target's prompt
        (above: its prefill is chunked) and under one that holds both prompts (below: one prefill pass)."""
        if not self.base:
            return self.cannot("short_budget", "above", "no target of the config's prompts")
        target = max(range(self.base), key=lambda i: (len(self.targets[i].token_ids), -i))
        t_len = len(self.targets[target].token_ids)
        engine_budget = self.config.engine.max_num_batched_tokens
        filler_len = max(1, min(t_len // 4, 16))
        whole = t_len + filler_len
        filler = self.filler(filler_len, 0, max_tokens=self.config.sampling.max_tokens)
        if whole > engine_budget:
            self.cannot("short_budget", "below", f"engine.max_num_batched_tokens {engine_budget} < {whole} (the "
                        "target's prompt and the filler's in one pass)")
        else:
            self.add("short_budget", "below", target, [filler], 0, whole)
        if t_len < 2:
            return self.cannot("short_budget", "above", f"the longest target's prompt holds {t_len} token: no "
                               "budget below it")
        self.add("short_budget", "above", target, [filler], 0, min(engine_budget, (t_len + 1) // 2))
        return None

    def prefix_block(self) -> None:
        block = self.config.engine.block_size
        need = block + 2
        long_enough = [i for i, t in enumerate(self.targets) if len(t.token_ids) >= need]
        if long_enough:
            target = self.rng.choice(long_enough)
        elif self.fits(need):
            target = self.target(f"probe-prefix-{need}", need)
        else:
            for side in ("below", "at", "above"):
                self.cannot("prefix_block", side, self.too_long(need))
            return
        for side, shared in (("below", block - 1), ("at", block), ("above", block + 1)):
            # The filler starts with the target's prompt, arrives first and is still running when the
            # target arrives: its blocks are cached by the time the target's prompt is scheduled.
            self.add("prefix_block", side, target, [self.filler(shared + 1, 0, max_tokens=2, shared_prefix=shared)],
                     arrival=1)


def _pass_tokens(b: _Builder, spec: ProbeSpec, model: ModelFacts) -> None:
    if spec.at is not None:
        b.pass_tokens(spec.label, spec.at)


def _pass_bytes(b: _Builder, spec: ProbeSpec, model: ModelFacts) -> None:
    """`pass_tokens` at the tokens whose hidden state holds `spec.at` bytes."""
    if spec.at is None:
        return
    per_token = _token_bytes(model, b.config.engine.dtype)
    if per_token is None:
        b.cannot(spec.label, "above", "the model's hidden_size is not in config.json")
    else:
        b.pass_tokens(spec.label, spec.at // per_token)


# How each probe puts its trials in the builder, by name.
_FORMS: dict[str, Callable[[_Builder, ProbeSpec, ModelFacts], None]] = {
    **{name: lambda b, spec, model: b.fa3(spec.name) for name in NAMED_PROBES if name.startswith("fa3")},
    "chunk_budget": lambda b, spec, model: b.chunk_budget(),
    "prefix_block": lambda b, spec, model: b.prefix_block(),
    "shared_pass": lambda b, spec, model: b.shared_pass(),
    "shared_prefix": lambda b, spec, model: b.shared_prefix(spec.label, spec.at or CASCADE_PREFIX),
    "short_budget": lambda b, spec, model: b.short_budget(),
    "pass_tokens": _pass_tokens,
    "pass_bytes": _pass_bytes,
}


def _unformable(config: Config, spec: ProbeSpec, gqa: int | None) -> str | None:
    """Why `spec` forms no trial on this engine and model (the setting or fact that rules it out), or None."""
    why = inapplicable(config, spec)
    if why is None and spec.name == "fa3_packed_query" and gqa is None:
        # its threshold is a query length x the GQA ratio: unknown ratio, no honest sides
        return "the model's GQA ratio is not in config.json (num_attention_heads, num_key_value_heads)"
    return why


def make_probes(config: Config, targets: Sequence[Target], model: ModelFacts, seed: int, first_id: int,
                vocab_size: int, specs: Sequence[ProbeSpec] = ()) -> Probes:
    """The probe trials of a run (ids from `first_id`) and the targets they need beyond the run's.

    `specs`: the probes of the known hazards the run's posture matches (oracle.posture.hazards); they run
    besides `schedule.probes` unless that says `none`, and one that cannot run on this engine is reported."""
    chosen = selected(config, specs)
    if not chosen:
        return Probes((), ())
    gqa = model.gqa_ratio
    b = _Builder(config, targets, seed, first_id, vocab_size, gqa if gqa is not None else 1, model.context)
    for spec in chosen:
        why = _unformable(config, spec, gqa)
        form = _FORMS.get(spec.name)
        if why is not None:
            b.cannot(spec.label, "above", why)
        elif form is not None:
            form(b, spec, model)
    return Probes(tuple(b.new_targets), tuple(b.trials), tuple(b.unformed))


def _token_bytes(model: ModelFacts, dtype: str) -> int | None:
    """Bytes of one token's hidden state (hidden_size x the dtype's size): what an all-reduce of a pass moves."""
    hidden = model.hidden_size
    return hidden * _DTYPE_BYTES.get(dtype, 2) if hidden is not None else None


def probe_hits(trial: Trial) -> tuple[str, ...]:
    """Coverage rows a probe trial counts: `probe NAME: SIDE`."""
    if not trial.probe:
        return ()
    name, _, side = trial.probe.partition(":")
    return (f"probe {name}: {side}",)
