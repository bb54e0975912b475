"""`oracle merge DIR... --report-dir OUT`: the shards of one run -> the report the unsharded run gives.

Every shard folder holds a report.json and its raw results (oracle.shards.results). The merge checks
that they are the whole of one run, or stops with a ConfigError (exit 2) naming the folder: a shard
missing, twice, partial (its run stopped, its results file damaged or short of trials), or of another
run (oracle version, seed, config digest, shard count, schedule or targets differ), or whose solo
references are not bitwise the other shards' (engines that disagree: run every shard on one kind
of machine). It then lays the shards' results side by side as one run's and judges them with the
same functions as `oracle run` (runner.finish_run): checks, verdicts, divergences and coverage are the
unsharded run's, because they are computed from the same outputs.

Shrinking and localization run here, once, for the run's first failing trial, on an invariant
engine the merge starts only when there is such a trial (a passing run's merge needs no engine, no
model and no accelerator). Shards do not shrink: a shard cannot know whether a trial of another
shard failed first, so shrinking in shards would shrink up to N trials to keep one, and the
candidates' trial ids (numbered after the schedule) would collide between shards. Run here, the
shrinker starts from the trial the unsharded run starts from, with the same ids, the same budget
and the same invariant engine, so its candidates, smallest trial and localized op are the
unsharded run's (as a rerun of any trial is: oracle replay relies on the same). The per-target
checks (prefill_decode, prefix_cache) run, and localize, in shard 0.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from oracle.compare import first_divergence
from oracle.config import Config, parse_config
from oracle.engines.contract import Completion, Mode
from oracle.errors import ConfigError
from oracle.execute import ModeResult
from oracle.observer import Observer
from oracle.plan import Plan, merged_plan
from oracle.render.files import ReportWriter
from oracle.report import Report, load_report
from oracle.report_sections import MergedShard, MergedShards, ShardSlice
from oracle.runner import View, finish_run
from oracle.schedule import Trial
from oracle.shards.assign import assign
from oracle.shards.results import ShardResults, load_results


def _load(folder: Path) -> tuple[Report, ShardResults]:
    path = folder / "report.json"
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such shard folder")
    if not path.exists():
        raise ConfigError(f"{path}: missing: the shard did not run, or this is not a shard's folder")
    report = load_report(path)  # bounded, regular files only (oracle.files)
    sh = report.shard
    if not isinstance(sh, ShardSlice):
        raise ConfigError(f"{path}: not a shard's report (`oracle run CONFIG --shard i/N` writes one)")
    if not report.complete:
        raise ConfigError(f"{path}: shard {sh.index}/{sh.count} is partial "
                          f"({report.error or 'not complete'}); run that shard again")
    results = load_results(folder)
    s = results.shard
    if (s.index, s.count, results.seed, results.config_digest) != (sh.index, sh.count, report.seed,
                                                                     report.config_digest):
        raise ConfigError(f"{results.path}: belongs to another run than {path} (shard, seed or config differ)")
    return report, results


def _same_run(folders: Sequence[Path], loaded: Sequence[tuple[Report, ShardResults]]) -> None:
    """Every shard of one run, each once; ConfigError naming the folder otherwise."""
    for folder, (r, s) in zip(folders[1:], loaded[1:], strict=True):
        _same_as_first(folders[0], loaded[0], folder, r, s)
    _each_once(folders, loaded)


def _same_as_first(first: Path, first_loaded: tuple[Report, ShardResults], folder: Path, r: Report,
                   s: ShardResults) -> None:
    """Shard `s` (in `folder`) is of the first shard's run: oracle version, seed, shard count, config, schedule
    and targets."""
    r0, s0 = first_loaded
    for what, a, b in (("oracle version", r0.oracle_version, r.oracle_version), ("seed", r0.seed, r.seed),
                       ("shard count", s0.shard.count, s.shard.count)):
        if a != b:
            raise ConfigError(f"{folder}: shard {s.shard.name} has {what} {b}, {first} has {a}: "
                              "shards of different runs")
    if r.config_digest != r0.config_digest:
        _same_config(first, r0, folder, r, s)
    if s.shard.schedule != s0.shard.schedule or s.targets != s0.targets:
        raise ConfigError(f"{folder}: shard {s.shard.name}'s schedule or targets differ from {first}'s")


def _same_config(first: Path, r0: Report, folder: Path, r: Report, s: ShardResults) -> None:
    """Configs of two digests that differ only where they were read from (shards run from two working folders):
    the same run when the schedule, the targets and the references agree bitwise, which the merge checks next."""
    differ = [f for f in config_differences(r0.config, r.config) if f not in WHERE_FIELDS]
    if not differ and config_differences(r0.config, r.config):
        return
    # Nothing differs but a redacted value: a secret of the two configs differs.
    shown = ", ".join(differ[:5]) + (" ..." if len(differ) > 5 else "") if differ else \
        "a redacted secret (the reports show neither)"
    raise ConfigError(f"{folder}: shard {s.shard.name}'s config differs from {first}'s in {shown} "
                      f"(config digest {r.config_digest[:12]}, {r0.config_digest[:12]}): shards of "
                      "different runs")


def _each_once(folders: Sequence[Path], loaded: Sequence[tuple[Report, ShardResults]]) -> None:
    """No shard twice, none missing."""
    seen: dict[int, Path] = {}
    for folder, (_, s) in zip(folders, loaded, strict=True):
        if s.shard.index in seen:
            raise ConfigError(f"{folder} and {seen[s.shard.index]} are both shard {s.shard.name}")
        seen[s.shard.index] = folder
    count = loaded[0][1].shard.count
    missing = [i for i in range(count) if i not in seen]
    if missing:
        names = ", ".join(f"{i}/{count}" for i in missing[:10]) + (" ..." if len(missing) > 10 else "")
        raise ConfigError(f"shard {names} missing: a merge needs all {count} shards ({len(seen)} given)")


# Config fields that say only where the config was read from: shards of one run made in two working
# folders differ there (and in nothing else, or they are two runs).
WHERE_FIELDS = frozenset({"base_dir"})


def config_differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted names of the fields whose values differ between two (redacted) configs."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [f for k in sorted(set(a) | set(b), key=str)
                for f in config_differences(a.get(k), b.get(k), f"{prefix}{k}.")]
    return [] if a == b else [prefix.rstrip(".") or "<config>"]


def _whole(folder: Path, config: Config, s: ShardResults) -> None:
    """The shard holds the trials the deal gives its index, each run in every mode, and the repeats."""
    expected = assign(s.shard.schedule, s.targets, config.sampling.max_tokens, config.schedule.repeat_trials,
                      s.shard.count)[s.shard.index]
    if list(s.shard.trial_ids) != expected:
        raise ConfigError(f"{folder}: shard {s.shard.name} ran other trials than its slice of the schedule")
    for mode, r in s.modes.items():
        if set(r.trials) != set(expected) or set(r.repeats) != set(s.shard.repeat_ids):
            raise ConfigError(f"{folder}: shard {s.shard.name} is partial: {len(r.trials)} of {len(expected)} "
                              f"{mode} trials")


def _same_references(folders: Sequence[Path], loaded: Sequence[ShardResults]) -> None:
    s0 = loaded[0]
    for folder, s in zip(folders[1:], loaded[1:], strict=True):
        if set(s.modes) != set(s0.modes):
            raise ConfigError(f"{folder}: shard {s.shard.name} ran modes {sorted(s.modes)}, {folders[0]} "
                              f"{sorted(s0.modes)}")
        for mode, r in s.modes.items():
            for t, ref in s0.modes[mode].solo.items():
                other = r.solo.get(t)
                d = None if other is None else first_divergence(ref, other)
                if other is None or d is not None:
                    where = "is missing" if d is None else f"differs at step {d.step} ({d.kind})"
                    raise ConfigError(f"{folder}: shard {s.shard.name}'s {mode} reference of target "
                                      f"{s.targets[t].name} {where} from {folders[0]}'s: the shards ran on engines "
                                      "that disagree; run every shard on one kind of machine and software")


def _combine(mode: Mode, loaded: Sequence[ShardResults]) -> ModeResult:
    """One mode's results as the unsharded run holds them: trials and repeats in schedule order, the
    references and per-target checks from shard 0."""
    by_index = sorted(loaded, key=lambda s: s.shard.index)
    zero = by_index[0].modes[mode]
    owner = {tid: s.modes[mode] for s in by_index for tid in s.shard.trial_ids}
    schedule = by_index[0].shard.schedule
    trials: dict[int, Completion] = {t.trial_id: owner[t.trial_id].trials[t.trial_id] for t in schedule}
    repeats = {t.trial_id: owner[t.trial_id].repeats[t.trial_id] for t in schedule
               if t.trial_id in owner[t.trial_id].repeats}
    timings: dict[str, float] = {}
    for s in by_index:
        for k, v in s.modes[mode].timings.items():
            timings[k] = timings.get(k, 0.0) + v
    return replace(zero, trials=trials, repeats=repeats, seconds=sum(s.modes[mode].seconds for s in by_index),
                   timings=timings)


def unset_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """A report's resolved config with the engine fields that hold their default left out, so that they read
    as not given again (a custom engine refuses a field it takes no argument for only when it was given)."""
    from oracle.config import EngineConfig

    engine = {k: v for k, v in dict(config.get("engine") or {}).items()
              if not (k in EngineConfig.model_fields and not EngineConfig.model_fields[k].is_required()
                      and v == EngineConfig.model_fields[k].get_default(call_default_factory=True))}
    return {**config, "engine": engine}


def _config_of(report: Report, path: Path) -> Config:
    """The shards' config for judging (secrets stay redacted: the checks read none)."""
    return parse_config(unset_defaults(dict(report.config)), source=str(path))


def _wants_engine(config: Config, inv: ModeResult, schedule: Sequence[Trial]) -> bool:
    """A trial failed invariance: it is rechecked (oracle.execute.RECHECKED), and shrunk or localized where the
    config asks."""
    if config.checks.invariance.requirement == "off":
        return False
    return any(first_divergence(inv.solo[t.target], inv.trials[t.trial_id]) is not None for t in schedule)


def _rerun_plan(report: Report, path: Path, schedule: Sequence[Trial], trusted: bool) -> Plan:
    """The shards' plan, rebuilt from the report's config as replay does (one that loads code needs `trusted`);
    ConfigError where it is not the shards' (another secret, tokenizer, prompts file or model here)."""
    from oracle.plan import plan_run
    from oracle.replay import report_config

    config = report_config(report.model_copy(update={"config": unset_defaults(report.config)}), path,
                           trusted=trusted)
    if config.digest() != report.config_digest:  # the secrets an engine needs come from the environment
        raise ConfigError(f"{path}: the config rebuilt from the report has another digest than the shards' "
                          "(a secret set to another value?)")
    plan = plan_run(config, report.seed)
    if plan.trials != tuple(schedule):  # trial ids index the shards' results: they must be the same trials
        raise ConfigError(f"{path}: the schedule planned here differs from the shards' (another tokenizer, "
                          "prompts file or model on this machine?); merge where the shards ran")
    return plan


def _shrink_and_localize(report: Report, path: Path, inv: ModeResult, schedule: Sequence[Trial],
                         observer: Observer, out_dir: Path, trusted: bool) -> ModeResult:
    """The unsharded run's shrink and localization of its first failing trial (oracle.execute.shrink_merged), on
    an invariant engine of our own; `inv` unchanged when no trial failed or neither is enabled."""
    from oracle.execute import shrink_merged
    from oracle.runner import OpLocalizer, engine_builder

    if not _wants_engine(_config_of(report, path), inv, schedule):
        return inv
    plan = _rerun_plan(report, path, schedule, trusted)
    spent: dict[str, float] = {}
    try:
        return shrink_merged(plan, inv, observer, engine_builder(plan), OpLocalizer(out_dir / "repro"), spent)
    finally:
        report.timings.update({f"merge_{k}_s": round(v, 3) for k, v in spent.items()})


def _check_out_dir(out_dir: Path) -> None:
    """ConfigError (exit 2) naming --report-dir where the merged report could not be written, creating nothing
    (a refused merge leaves no empty folder behind)."""
    import os

    from oracle.render.files import check_report_dir

    if out_dir.exists():
        check_report_dir(out_dir, "--report-dir")  # there already: its write test leaves nothing behind
        return
    parent = next((p for p in out_dir.absolute().parents if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ConfigError(f"--report-dir: cannot create the report folder {out_dir} ({parent} is a file)")
    if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"--report-dir: cannot create the report folder {out_dir} ({parent}: permission denied)")


def _replace_earlier_report(writer: ReportWriter, folders: Sequence[Path], e: BaseException) -> None:
    """A merge refused before it judged anything: an earlier merge's report in the writer's folder must not read
    as this merge's, so the writer replaces it by one that says why this merge stopped (exit 2, or 130/143)."""
    import hashlib

    from oracle import __version__
    from oracle.lifecycle.run_guard import light_environment

    if not writer.path.exists():
        return
    sources = [str(f) for f in folders]
    report = Report(oracle_version=__version__, seed=0, config={"merge": sources},
                    config_digest=hashlib.sha256("\0".join(sources).encode()).hexdigest(),
                    environment=light_environment())
    try:
        writer.stopped(report, e)
    except OSError:
        return


@dataclass(frozen=True)
class _Shards:
    """The shards of one run, checked: each one's report and results, and shard 0's config."""

    folders: Sequence[Path]
    loaded: list[tuple[Report, ShardResults]]
    path0: Path  # shard 0's report.json
    config: Config

    @property
    def first(self) -> tuple[Report, ShardResults]:
        return min(self.loaded, key=lambda x: x[1].shard.index)

    def by_index(self) -> list[tuple[Path, Report, ShardResults]]:
        return sorted(((f, r, s) for f, (r, s) in zip(self.folders, self.loaded, strict=True)),
                      key=lambda x: x[2].shard.index)


def _read_shards(folders: Sequence[Path], writer: ReportWriter) -> _Shards:
    """Every shard read and checked to be the whole of one run; a refusal replaces an earlier merge's report."""
    try:
        loaded = [_load(f) for f in folders]
        _same_run(folders, loaded)
        r0, s0 = min(loaded, key=lambda x: x[1].shard.index)
        path0 = folders[[s.shard.index for _, s in loaded].index(s0.shard.index)] / "report.json"
        config = _config_of(r0, path0)
        for folder, (_, s) in zip(folders, loaded, strict=True):
            _whole(folder, config, s)
        _same_references(folders, [s for _, s in loaded])
    except (ConfigError, KeyboardInterrupt) as e:
        _replace_earlier_report(writer, folders, e)
        raise
    return _Shards(folders, loaded, path0, config)


# A shard's timings that its record in the merged report keeps; and those not summed into the merged run's.
_SHARD_TIMINGS = ("total_s", "invariant_engine_start_s", "production_engine_start_s")
_NOT_SUMMED = ("total_s", "plan_s", "judge_s", "write_s")


def _merged_report(shards: _Shards) -> Report:
    """The merged run's report before judging: shard 0's facts, a record per shard, the shards' time summed."""
    r0, s0 = shards.first
    report = Report(oracle_version=r0.oracle_version, seed=r0.seed, config=dict(r0.config),
                    config_digest=r0.config_digest, environment=dict(r0.environment))
    ordered = shards.by_index()
    report.shard = MergedShards(count=s0.shard.count, shards=[
        MergedShard(index=s.shard.index, folder=str(f), trials=len(s.shard.trial_ids),
                    **{k: v for k, v in r.timings.items() if k in _SHARD_TIMINGS}) for f, r, s in ordered])
    report.timings.update(_summed_timings([r for _, r, _ in ordered]))
    return report


def _summed_timings(reports: Sequence[Report]) -> dict[str, float]:
    """The shards' phases summed, the slowest shard's time and the time of all shards together."""
    out = {key: round(sum(r.timings.get(key, 0.0) for r in reports), 3)
           for key in sorted({k for r in reports for k in r.timings if k not in _NOT_SUMMED})}
    out["shards_wall_s"] = max(r.timings.get("total_s", 0.0) for r in reports)
    out["shards_sum_s"] = round(sum(r.timings.get("total_s", 0.0) for r in reports), 3)
    return out


def _judged_plan(shards: _Shards) -> Plan:
    """The plan the merged results are judged by (as `oracle run` judges, oracle.runner.finish_run)."""
    from oracle.models.facts import read_model_facts

    r0, s0 = shards.first
    model = read_model_facts(Path(str(r0.environment.get("model_dir", ""))))  # the known hazards read its facts
    return merged_plan(shards.config, model, s0.targets, s0.shard.schedule, r0.seed)


def merge(folders: Sequence[Path], out_dir: Path, *, observer: Observer | None = None,
          views: Sequence[View] = (), trusted: bool = False) -> Report:
    """Merge the shard folders into `out_dir/report.json` (and the views' formats); ConfigError (exit 2)
    for shards that are not the whole of one run, EngineError kept in the report (exit 3) when the
    shrink or localization engine fails. `trusted`: a config that loads code (a custom engine, preload
    modules) may start the engine that shrinks (--trust-report)."""
    t0 = time.perf_counter()
    observer = observer or Observer()
    if not folders:
        raise ConfigError("merge: give the shard folders")
    resolved = {f.resolve() for f in folders}
    if out_dir.resolve() in resolved:
        raise ConfigError(f"--report-dir: {out_dir} is a shard's folder; merge into another one")
    from oracle.render.files import check_report_dir

    _check_out_dir(out_dir)  # a file, or a folder under a file: exit 2 before any shard is read, nothing made
    writer = ReportWriter(out_dir)  # a refusal writes every format; the merged report, `views`
    shards = _read_shards(folders, writer)
    check_report_dir(out_dir, "--report-dir")  # made only once the shards are known to be one run's
    report = _merged_report(shards)
    s0 = shards.first[1]
    results: dict[Mode, ModeResult] = {m: _combine(m, [s for _, s in shards.loaded]) for m in s0.modes}
    plan = _judged_plan(shards)

    def shrink() -> None:
        if "invariant" in results:
            results["invariant"] = _shrink_and_localize(report, shards.path0, results["invariant"], s0.shard.schedule,
                                                        observer, out_dir, trusted)

    def conclude() -> None:
        report.environment["trials"] = len(s0.shard.schedule)
        report.timings["merge_s"] = round(time.perf_counter() - t0, 3)

    return finish_run(plan, results, report, shrink, conclude, writer, views, t0)
