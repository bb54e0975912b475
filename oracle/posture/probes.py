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

The KV probes need targets longer than a config's prompts may be: they get their own targets
(`probe-kv256-above`, ...), seeded random tokens, run solo like every target. Everything is drawn
from the run's seed alone, so a seed gives the same probes everywhere. Probe trials follow the
drawn schedule (ids after it), `probe` naming the stratum and side (`fa3_kv_256:above`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from oracle.config import Config
from oracle.prompts import Target
from oracle.schedule import Filler, Trial

PROBES = ("fa3_packed_query", "fa3_kv_128", "fa3_kv_256", "fa3_kv_512", "chunk_budget", "prefix_block")
FA3_LIMIT = 64  # packed query length x GQA ratio above which FA3 (head_dim 64) changes its configuration
FA3_KV = 128  # the KV length above which that change shows
# Fillers of a budget probe are at most this long, so no one of them is longer than a prompt needs to be.
_FILLER_CAP = 512
_SEED_SALT = 0x9E3779B1  # probe draws use their own stream, so adding probes never moves the drawn schedule


@dataclass(frozen=True)
class Probes:
    targets: tuple[Target, ...]  # targets made for the probes (appended after the run's)
    trials: tuple[Trial, ...]


def applicable(config: Config) -> tuple[str, ...]:
    """The probes that apply to the config's engine: budget edges need chunked prefill, block edges a prefix cache."""
    e = config.engine
    skip = set()
    if not e.enable_chunked_prefill:
        skip.add("chunk_budget")
    if not e.enable_prefix_caching:
        skip.add("prefix_block")
    if config.sampling.max_tokens < 3:
        skip.update(p for p in PROBES if p.startswith("fa3"))  # no decode pass left to share with a prefill
    return tuple(p for p in PROBES if p not in skip)


def selected(config: Config) -> tuple[str, ...]:
    """`schedule.probes` (all: every probe that applies; []: none), in PROBES order, applicable ones only."""
    chosen = config.schedule.probes
    names = applicable(config)
    return names if chosen == "all" else tuple(p for p in names if p in chosen)


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

    def fits(self, n: int) -> bool:
        return self.context is None or n + self.config.sampling.max_tokens <= self.context

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
        if not self.fits(target_len) or query + 1 > self.config.engine.max_num_batched_tokens:
            return
        target = self.target(name, target_len)
        arrival = self.prefill_steps(target_len) + 1  # one decode pass alone, then the filler's prefill joins
        if arrival >= self.config.sampling.max_tokens:
            return
        self.add(probe, side, target, [self.filler(query, arrival)])

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
        self.beside_decode(name, "above", kv + 1, f"probe-kv{kv}-above", query)

    def chunk_budget(self) -> None:
        budget = self.config.engine.max_num_batched_tokens
        target = self.rng.randrange(self.base) if self.base else None
        if target is None:
            return
        t_len = len(self.targets[target].token_ids)
        for side, demand in (("below", budget - 1), ("at", budget), ("above", budget + 1)):
            rest = demand - t_len  # filler prompt tokens that arrive together with the target
            if rest < 1:
                continue
            fillers = []
            while rest > 0:
                n = min(rest, _FILLER_CAP)
                if not self.fits(n):
                    return
                fillers.append(self.filler(n, 0))
                rest -= n
            if len(fillers) + 1 > self.config.engine.max_num_seqs:
                return
            self.add("chunk_budget", side, target, fillers, 0, budget)

    def prefix_block(self) -> None:
        block = self.config.engine.block_size
        need = block + 2
        long_enough = [i for i, t in enumerate(self.targets) if len(t.token_ids) >= need]
        if long_enough:
            target = self.rng.choice(long_enough)
        elif self.fits(need):
            target = self.target(f"probe-prefix-{need}", need)
        else:
            return
        for side, shared in (("below", block - 1), ("at", block), ("above", block + 1)):
            # The filler starts with the target's prompt, arrives first and is still running when the
            # target arrives: its blocks are cached by the time the target's prompt is scheduled.
            self.add("prefix_block", side, target, [self.filler(shared + 1, 0, max_tokens=2, shared_prefix=shared)],
                     arrival=1)


def make_probes(config: Config, targets: Sequence[Target], model_dir: Path, seed: int, first_id: int,
                vocab_size: int) -> Probes:
    """The probe trials of a run (ids from `first_id`) and the targets they need beyond the run's."""
    from oracle.models.context import model_context
    from oracle.posture import model_facts

    names = selected(config)
    if not names:
        return Probes((), ())
    gqa = model_facts(model_dir).get("gqa_ratio")
    b = _Builder(config, targets, seed, first_id, vocab_size, gqa if isinstance(gqa, int) else 1,
                 model_context(model_dir))
    for name in names:
        if name == "fa3_packed_query" and not isinstance(gqa, int):
            continue  # its threshold is a query length x the GQA ratio: unknown ratio, no honest sides
        if name.startswith("fa3"):
            b.fa3(name)
        elif name == "chunk_budget":
            b.chunk_budget()
        else:
            b.prefix_block()
    return Probes(tuple(b.new_targets), tuple(b.trials))


def probe_hits(trial: Trial) -> tuple[str, ...]:
    """Coverage rows a probe trial counts: `probe NAME: SIDE`."""
    if not trial.probe:
        return ()
    name, _, side = trial.probe.partition(":")
    return (f"probe {name}: {side}",)
