"""plan, called directly: a config becomes targets and a schedule of distinct, replayable trials, before (and
without) any engine. The schedule's own draw is tested in test_schedule.py; this is what `plan_run` adds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oracle.config import Config, parse_config
from oracle.plan import draw_seed, kv_tokens, phase_of, plan_run, solo_request, trial_requests
from oracle.schedule import filler_tokens, renumber


def _config(model: Path | str, kind: str = "fake_engine:FakeEngine", **schedule: Any) -> Config:
    return parse_config({
        "model": str(model),
        "engine": {"kind": kind},
        "prompts": {"random": {"count": 4, "min_len": 3, "max_len": 9, "seed": 11}},
        "sampling": {"max_tokens": 5},
        "schedule": {"trials": 40, "seed": 3, "batch_size": [1, 17], "filler_len": [2, 12],
                     "filler_max_tokens": [1, 6], "arrival_step": [0, 3], "max_num_batched_tokens": [16, 128],
                     **schedule},
    })


def _refuse(*args: Any, **kwargs: Any) -> None:
    raise AssertionError("planning started an engine")


@pytest.fixture
def no_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any engine start fails the test: planning must not build one."""
    import oracle.engines
    from oracle.engines.native import NativeEngine
    from oracle.lifecycle import watchdog

    monkeypatch.setattr(oracle.engines, "construct_engine", _refuse)
    monkeypatch.setattr(watchdog, "build_engine", _refuse)
    monkeypatch.setattr(watchdog, "start_engine", _refuse)
    monkeypatch.setattr(NativeEngine, "__init__", _refuse)
    from fake_engine import FakeEngine

    monkeypatch.setattr(FakeEngine, "__init__", _refuse)


def test_a_plan_is_n_distinct_trials_ids_in_order(fake_model: Path, no_engines: None) -> None:
    plan = plan_run(_config(fake_model))
    assert len(plan.trials) == 40
    assert [t.trial_id for t in plan.trials] == list(range(40))
    assert len({t.key for t in plan.trials}) == 40
    assert all(t.origin == "schedule" and t.parent is None and t.probe == "" for t in plan.trials)
    assert plan.replayed == () and plan.shard is None


def test_the_seed_decides_the_plan(fake_model: Path, no_engines: None) -> None:
    config = _config(fake_model)
    first = plan_run(config)
    assert first.seed == 3  # schedule.seed, when the run is given none
    assert plan_run(config).trials == first.trials
    assert plan_run(config, seed=3).trials == first.trials
    other = plan_run(config, seed=4)
    assert other.seed == 4 and other.trials != first.trials
    assert other.targets == first.targets  # the prompts have their own seed (prompts.random.seed)
    unseeded = _config(fake_model, seed=None)
    drawn = plan_run(unseeded)
    assert 0 <= drawn.seed < 2**32
    assert plan_run(unseeded, seed=drawn.seed).trials == drawn.trials  # the printed seed replays the run


def test_draw_seed_prefers_the_run_then_the_config() -> None:
    config = parse_config({"model": "preset:tiny-qwen3", "prompts": {"random": {"count": 1}}, "schedule": {"seed": 9}})
    assert draw_seed(config, 5) == 5 and draw_seed(config, 0) == 0
    assert draw_seed(config, None) == 9


def test_targets_come_from_the_prompts_within_the_vocabulary(fake_model: Path, no_engines: None) -> None:
    plan = plan_run(_config(fake_model))
    assert plan.vocab_size == 97  # the fake checkpoint's config.json
    assert [t.name for t in plan.targets] == ["random-0", "random-1", "random-2", "random-3"]
    assert all(3 <= len(t.token_ids) <= 9 for t in plan.targets)
    assert all(0 <= tok < 97 for t in plan.targets for tok in t.token_ids)
    assert plan.model_dir == fake_model


def test_the_schedule_covers_the_config_ranges(fake_model: Path, no_engines: None) -> None:
    plan = plan_run(_config(fake_model))
    trials = plan.trials
    assert {t.target for t in trials} == {0, 1, 2, 3}  # every target in turn
    sizes = {t.batch_size for t in trials}
    assert {1, 2, 15, 16, 17} <= sizes and max(sizes) == 17  # boundary sizes, and never beyond the range
    batched = [t for t in trials if t.batch_size > 2]
    assert any(t.position == 0 for t in batched) and any(t.position == t.batch_size - 1 for t in batched)
    assert any(0 < t.position < t.batch_size - 1 for t in batched)
    for t in trials:
        assert 0 <= t.position < t.batch_size and 0 <= t.target_arrival_step <= 3
        assert t.max_num_batched_tokens is not None and 16 <= t.max_num_batched_tokens <= 128
        for f in t.fillers:
            assert 1 <= f.max_tokens <= 6 and 0 <= f.arrival_step <= 3
            assert f.shared_prefix <= f.length
            assert 2 <= f.length <= max(12, len(plan.targets[t.target].token_ids))
    assert any(f.shared_prefix for t in trials for f in t.fillers)  # prefix-cache hits inside a trial
    budgets = sorted(t.max_num_batched_tokens or 0 for t in trials)
    assert budgets[0] < 32 and budgets[-1] > 96  # small and large budgets (chunked prompts and not)


def test_trial_requests_put_the_target_at_its_position(fake_model: Path, no_engines: None) -> None:
    plan = plan_run(_config(fake_model))
    trial = next(t for t in plan.trials if t.batch_size >= 4 and 0 < t.position < t.batch_size - 1)
    requests, at = trial_requests(plan, trial)
    target = plan.targets[trial.target]
    assert at == trial.position and len(requests) == trial.batch_size
    assert requests[at].request_id == f"trial{trial.trial_id}-{target.name}"
    assert requests[at].prompt_token_ids == target.token_ids
    assert requests[at].arrival_step == trial.target_arrival_step
    assert requests[at].sampling.max_tokens == 5 and requests[at].sampling.logits == "full"
    fillers = requests[:at] + requests[at + 1:]
    for j, (r, f) in enumerate(zip(fillers, trial.fillers, strict=True)):
        assert r.request_id == f"trial{trial.trial_id}-filler{j}"
        assert r.prompt_token_ids == filler_tokens(f, plan.vocab_size, target.token_ids)
        assert r.arrival_step == f.arrival_step and r.sampling.max_tokens == f.max_tokens
        assert r.sampling.logits == "none" and r.sampling.seed == f.seed
    assert trial_requests(plan, trial) == (requests, at)  # a trial is data: the same requests every time


def test_requests_name_their_phase(fake_model: Path, no_engines: None) -> None:
    plan = plan_run(_config(fake_model))
    solo = solo_request(plan, 2)
    assert solo.request_id == "solo-random-2" and solo.prompt_token_ids == plan.targets[2].token_ids
    assert solo.arrival_step == 0 and solo.sampling.max_tokens == 5
    candidate = renumber(plan.trials[7], 52, 7)
    requests, at = trial_requests(plan, candidate)
    assert requests[at].request_id.startswith("shrink52-")
    assert phase_of([solo.request_id]) == "references (request solo-random-2)"
    assert phase_of([r.request_id for r in trial_requests(plan, plan.trials[7])[0]]) == "trial 7"
    assert phase_of([r.request_id for r in requests]) == "shrinking (trial 52)"
    assert phase_of([]) == "generate call with no requests"
    assert phase_of(["trialx-1"]) == "run of request trialx-1"


def test_kv_tokens_is_the_largest_call_in_whole_blocks(fake_model: Path, no_engines: None) -> None:
    config = _config(fake_model)
    plan = plan_run(config)
    block, new = config.engine.block_size, config.sampling.max_tokens
    largest = max(
        -(-(len(plan.targets[t.target].token_ids) + new) // block) * block
        + sum(-(-(f.length + f.max_tokens) // block) * block for f in t.fillers)
        for t in plan.trials)
    assert kv_tokens(config, plan.targets, plan.trials) == largest
    assert kv_tokens(config, plan.targets, ()) == block  # the solo references alone: prompts of <= 9 + 5 tokens
    assert kv_tokens(config, (), ()) == 0


def test_probes_come_after_the_drawn_trials(fake_model: Path, no_engines: None) -> None:
    drawn = plan_run(_config(fake_model, probes=[]))
    probed = plan_run(_config(fake_model, probes=["chunk_budget"]))
    n = len(drawn.trials)
    assert probed.trials[:n] == drawn.trials  # the probes never move the drawn schedule
    extra = probed.trials[n:]
    assert extra and all(t.probe.startswith("chunk_budget:") for t in extra)
    assert [t.trial_id for t in extra] == list(range(n, n + len(extra)))
    assert probed.targets[: len(drawn.targets)] == drawn.targets


def test_a_native_plan_loads_no_model_and_builds_no_engine(tiny_qwen3: Path, no_engines: None) -> None:
    """The native engine's checks (architecture, size) read config.json: no torch engine is constructed."""
    plan = plan_run(_config(tiny_qwen3, kind="native"))
    assert len(plan.trials) == 40 and plan.model_dir == tiny_qwen3


def test_a_plan_fails_on_its_config_before_any_engine(fake_model: Path, no_engines: None) -> None:
    from oracle.errors import ConfigError

    with pytest.raises(ConfigError, match="engine.kind"):
        plan_run(_config(fake_model, kind="no_such_module:Engine"))


def test_a_plan_reads_the_models_config_json_once(tiny_qwen3: Path, no_engines: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The architecture, size, prompts, context, hazard and probe checks all read the one ModelFacts the plan
    built: config.json is opened once, whichever way it is opened."""
    import builtins
    import io
    import os

    from oracle.models.presets import PRESETS

    config_json = str(tiny_qwen3 / "config.json")
    opened: list[str] = []

    def counting(real: Any) -> Any:
        def open_(file: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(file, str | os.PathLike) and os.fspath(file) == config_json:
                opened.append(config_json)
            return real(file, *args, **kwargs)
        return open_

    monkeypatch.setattr(os, "open", counting(os.open))
    monkeypatch.setattr(io, "open", counting(io.open))
    monkeypatch.setattr(builtins, "open", counting(builtins.open))
    plan = plan_run(_config(tiny_qwen3, kind="native", probes=["chunk_budget"]))
    assert opened == [config_json]
    preset = PRESETS["tiny-qwen3"]
    assert (plan.model.vocab_size, plan.model.hidden_size, plan.model.num_hidden_layers) == (
        preset.vocab_size, preset.hidden_size, preset.num_hidden_layers)
    assert plan.model.architecture == "Qwen3ForCausalLM" and plan.vocab_size == preset.vocab_size
