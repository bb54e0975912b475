"""Whether a probe side formed, as the engine's own pass evidence shows it (never the probe's intent).

A probe (oracle.posture.probes) plans one trial per side of a threshold; whether the side formed is read from
the target's per-pass evidence (`StepEvidence`: sequences and tokens per pass, the longest query, the target's
KV length, chunked prompts, cached tokens). Each probe is a row: its sides and the rule that reads a trial's
evidence into a `Side` (formed or not, and what the evidence showed). A quantity the engine does not report
(None) shows nothing: the side is not formed, and the text says which quantity was missing.

`shared_pass` has one side (`above`): its other side is the target's solo reference, which every run holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oracle.engines.contract import StepEvidence
from oracle.posture.hazards import ProbeSpec
from oracle.schedule import Trial

# Sides of a probe that are over its threshold: a trial of one of them that formed crossed it.
CROSSING_SIDES = ("at", "above")
FA3_KV = 128  # the KV length above which FA3's (head_dim 64) change of configuration shows


@dataclass(frozen=True)
class Side:
    """A probe trial's side as its evidence shows it: formed or not, and what the evidence showed (`trial 5:
    the target's prefill took 3 passes under a budget of 10: chunked`)."""

    formed: bool
    shown: str


Evidence = Sequence[StepEvidence]
Rule = Callable[[Trial, str, Evidence], Side]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith("s") else "s")


def _short_budget(trial: Trial, side: str, ev: Evidence) -> Side:
    prefill = [e for e in ev if e.is_prefill]
    chunked = len(prefill) > 1 or any(e.chunked for e in prefill)
    shown = (f"trial {trial.trial_id}: the target's prefill took {_plural(len(prefill), 'pass')} under a budget of "
             f"{trial.max_num_batched_tokens}: {'chunked' if chunked else 'not chunked'}")
    return Side(chunked if side == "above" else not chunked, shown)


def _shared_prefix(trial: Trial, side: str, ev: Evidence) -> Side:
    most = max((e.num_seqs for e in ev), default=0)
    if most < trial.batch_size:
        return Side(False, f"trial {trial.trial_id}: at most {most} of the {trial.batch_size} sequences sharing "
                    "the prefix were in one pass with the target")
    return Side(True, f"trial {trial.trial_id}: all {trial.batch_size} sequences sharing the prefix were in one "
                "pass with the target")


def _shared_pass(trial: Trial, side: str, ev: Evidence) -> Side:
    most = max((e.num_seqs for e in ev), default=0)
    if most < 2:
        return Side(False, f"trial {trial.trial_id}: the target ran alone in every pass")
    return Side(True, f"trial {trial.trial_id}: the target shared a pass of {most} sequences")


def _threshold(trial: Trial) -> int | None:
    """N of a trial of `pass_tokens=N:side`."""
    at = trial.probe.partition(":")[0].partition("=")[2]
    return int(at) if at.isdigit() else None


def _pass_tokens(trial: Trial, side: str, ev: Evidence) -> Side:
    """below: the largest pass holds exactly N tokens (at the threshold, not over); above: a pass holds more."""
    n = _threshold(trial)
    most = max((e.num_tokens for e in ev), default=0)
    if n is None:
        return Side(False, f"trial {trial.trial_id}: no threshold in its probe {trial.probe!r}")
    shown = f"trial {trial.trial_id}: the target's largest pass held {most} tokens (threshold {n})"
    return Side(most > n if side == "above" else most == n, shown)


def _whole_pass(trial: Trial, side: str, ev: Evidence) -> Side:
    """The trial's sequences all in one pass, every prompt whole: the pass the plan sized (`pass_bytes`, and
    `chunk_budget` below and at the budget)."""
    first = next((e for e in ev if e.is_prefill), None)
    if first is None:
        return Side(False, f"trial {trial.trial_id}: the target has no prefill pass in its evidence")
    if first.has_chunked is None:
        return Side(False, f"trial {trial.trial_id}: the engine does not report whether a prompt in the pass was "
                    "chunked")
    whole = first.num_seqs == trial.batch_size and not first.has_chunked
    what = "held all" if whole else "did not hold all"
    return Side(whole, f"trial {trial.trial_id}: the target's prefill pass of {first.num_tokens} tokens and "
                f"{first.num_seqs} sequences {what} {trial.batch_size} prompts whole")


def _chunk_budget(trial: Trial, side: str, ev: Evidence) -> Side:
    """below, at: one pass of budget - 1 and budget tokens, whole; above: a pass filled to the budget with a
    prompt chunked (the demand was budget + 1)."""
    if side != "above":
        return _whole_pass(trial, side, ev)
    budget = trial.max_num_batched_tokens
    full = [e for e in ev if e.is_prefill and e.num_tokens == budget]
    if any(e.has_chunked is None for e in full):
        return Side(False, f"trial {trial.trial_id}: the engine does not report whether a prompt in the pass was "
                    "chunked")
    if any(e.has_chunked or e.chunked for e in full):
        return Side(True, f"trial {trial.trial_id}: a pass filled to the budget of {budget} tokens with a prompt "
                    "chunked")
    most = max((e.num_tokens for e in ev if e.is_prefill), default=0)
    return Side(False, f"trial {trial.trial_id}: no pass of the budget's {budget} tokens chunked a prompt (the "
                f"target's largest prefill pass held {most})")


def _prefix_block(trial: Trial, side: str, ev: Evidence) -> Side:
    """below: the target's prefill started from no cached token; at, above: from cached blocks."""
    first = next((e for e in ev if e.is_prefill), None)
    if first is None:
        return Side(False, f"trial {trial.trial_id}: the target has no prefill pass in its evidence")
    cached = first.num_cached_tokens
    shown = f"trial {trial.trial_id}: the target's prefill started from {cached} cached tokens"
    return Side(cached == 0 if side == "below" else cached > 0, shown)


def _beside_decode(trial: Trial, ev: Evidence) -> tuple[list[StepEvidence], str]:
    """The target's decode passes beside the filler's whole prefill (the pass's longest query is the filler's
    prompt), or why none shows."""
    query = trial.fillers[0].length if trial.fillers else 0
    decode = [e for e in ev if not e.is_prefill and e.num_seqs >= 2]
    if any(e.max_query_len is None or e.kv_len is None for e in decode):
        return [], f"trial {trial.trial_id}: the engine does not report the pass's longest query and KV length"
    beside = [e for e in decode if e.max_query_len == query]
    if not beside:
        return [], f"trial {trial.trial_id}: no decode pass of the target held the filler's prefill of {query} tokens"
    return beside, ""


def _fa3(trial: Trial, side: str, ev: Evidence) -> Side:
    """fa3_packed_query: beside a prefill of the planned query, at a KV length over 128 (both sides);
    fa3_kv_B: the target's KV length at that pass at most B (below) or over it (above)."""
    beside, why = _beside_decode(trial, ev)
    if not beside:
        return Side(False, why)
    name = trial.probe.partition(":")[0]
    kv = max(e.kv_len or 0 for e in beside)
    shown = (f"trial {trial.trial_id}: the target decoded at KV length {kv} beside a prefill of "
             f"{beside[0].max_query_len} tokens")
    if name == "fa3_packed_query":
        return Side(kv > FA3_KV, shown)
    bound = int(name.rsplit("_", 1)[1])
    return Side(kv > bound if side == "above" else kv <= bound, shown)


@dataclass(frozen=True)
class ProbeRow:
    """What is known of a probe's evidence: the sides it plans, and the rule that reads whether one formed."""

    sides: tuple[str, ...]
    rule: Rule


ROWS: dict[str, ProbeRow] = {
    "fa3_packed_query": ProbeRow(("below", "above"), _fa3),
    "fa3_kv_128": ProbeRow(("below", "above"), _fa3),
    "fa3_kv_256": ProbeRow(("below", "above"), _fa3),
    "fa3_kv_512": ProbeRow(("below", "above"), _fa3),
    "chunk_budget": ProbeRow(("below", "at", "above"), _chunk_budget),
    "prefix_block": ProbeRow(("below", "at", "above"), _prefix_block),
    "shared_pass": ProbeRow(("above",), _shared_pass),
    "shared_prefix": ProbeRow(("below", "at"), _shared_prefix),
    "short_budget": ProbeRow(("below", "above"), _short_budget),
    "pass_tokens": ProbeRow(("below", "above"), _pass_tokens),
    "pass_bytes": ProbeRow(("below", "above"), _whole_pass),
}


def sides_of(label: str) -> tuple[str, ...]:
    """The sides probe `label` (`pass_tokens=48`) plans."""
    row = ROWS.get(label.partition("=")[0])
    return row.sides if row is not None else ("above",)


def side_of(trial: Trial, evidence: Evidence) -> Side | None:
    """The side of a probe trial that ran, as its target's per-pass evidence shows it; None for no probe's trial."""
    name, _, side = trial.probe.partition(":")
    row = ROWS.get(name.partition("=")[0])
    return row.rule(trial, side, evidence) if row is not None and side else None


def unformed_side(trial: Trial, evidence: Evidence) -> str | None:
    """Why a probe trial that ran did not form its side (what its evidence showed); None when it formed, or
    when the trial is no probe's."""
    found = side_of(trial, evidence)
    return found.shown if found is not None and not found.formed else None


def unformed_by_evidence(trials: Mapping[int, Trial], results: Mapping[int, Any], labels: Sequence[str],
                         ids: Sequence[int]) -> list[tuple[str, str]]:
    """(`probe:side`, what the evidence showed) for each trial of `ids` of one of the probes `labels` that ran
    without forming its side."""
    out = []
    for tid in ids:
        trial = trials[tid]
        if tid in results and trial.probe.partition(":")[0] in labels:
            why = unformed_side(trial, results[tid].evidence)
            if why is not None:
                out.append((trial.probe, why))
    return out


def crossed(spec: ProbeSpec, trial: Trial, evidence: Evidence) -> bool:
    """Whether a trial that ran crossed `spec`'s threshold: a probe trial of it on a side over the threshold
    whose evidence shows that side formed, or (pass_tokens, shared_pass) any trial whose per-pass evidence
    shows a pass over it."""
    name, _, side = trial.probe.partition(":")
    if name == spec.label and side in CROSSING_SIDES:
        return unformed_side(trial, evidence) is None
    if spec.name == "shared_pass":
        return any(e.num_seqs >= 2 for e in evidence)
    if spec.name == "pass_tokens" and spec.at is not None:
        return any(e.num_tokens > spec.at for e in evidence)
    return False
