"""The report's sections that a feature fills: the engines' posture and the hazards it matched (in
`environment`), the guided search, the example database and the shard.

report.json writes a section that was not used as `{}` (as it always has): `Report` holds it as None,
writes None as `{}` and reads a `{}` back as None. Two sections have two shapes, told apart by a key: the
shard (one shard's `ShardSlice`, or a merged run's `MergedShards`, which holds `shards`) and the search
(run to its end, or `SearchStopped`, which holds `stopped`). The shapes and their fields are what
report.json has always held, so reports written before these models read back, and write back, the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    GetPydanticSchema,
    PlainSerializer,
    Tag,
    TypeAdapter,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    with_config,
)
from typing_extensions import TypedDict  # pydantic reads TypedDicts of typing_extensions below Python 3.12

UNKNOWN = "unknown"


def _absent(value: Any) -> bool:
    return value is None


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Unused(_Section):
    """`{}`: the feature was not used in this run."""


# A known hazard's status upstream (oracle/posture/hazards.yaml).
HazardStatus = Literal["open", "fixed", "mitigated"]

# A posture setting as engines report it: text, a flag or a number; "unknown" where it could not be read.
Setting = str | bool | int | float | None


class ModePosture(_Section):
    """One mode's engine posture (oracle.posture.FIELDS): the resolved settings that decide whether invariance
    can hold; "unknown" where the engine could not say."""

    engine: Setting = Field(default=UNKNOWN, description="the engine (native, vllm, transformers, ...)")
    engine_version: Setting = Field(default=UNKNOWN, description="its installed version")
    device: Setting = Field(default=UNKNOWN, description="cpu, cuda, ...")
    dtype: Setting = Field(default=UNKNOWN, description="the weights' and activations' dtype")
    invariance_mechanism: Setting = Field(default=UNKNOWN, description="what makes the mode batch-invariant "
                                          "(oracle_kernels, vllm, ...); none in production")
    attention_backend: Setting = Field(default=UNKNOWN, description="the attention kernel in use")
    cuda_graphs: Setting = Field(default=UNKNOWN, description="off, decode, full, ...")
    compile_mode: Setting = Field(default=UNKNOWN, description="torch.compile's mode, none when eager")
    async_scheduling: Setting = Field(default=UNKNOWN, description="the engine schedules a step while the last runs")
    chunked_prefill: Setting = Field(default=UNKNOWN, description="long prompts split across engine steps")
    prefix_caching: Setting = Field(default=UNKNOWN, description="KV blocks of a shared prefix reused")
    spec_decoding: Setting = Field(default=UNKNOWN, description="speculative decoding, none when off")
    tensor_parallel: int | str = Field(default=UNKNOWN, description="tensor-parallel ranks")
    pipeline_parallel: int | str = Field(default=UNKNOWN, description="pipeline-parallel stages")
    sequence_parallel: Setting = Field(default=UNKNOWN, description="activations sharded across ranks")
    all_reduce: Setting = Field(default=UNKNOWN, description="the all-reduce between ranks (none for one rank)")
    rank_devices: list[str] | str = Field(default=UNKNOWN, description="one device per rank")
    sampler: Setting = Field(default=UNKNOWN, description="the top-k/top-p sampler's implementation")
    kv_cache_dtype: Setting = Field(default=UNKNOWN, description="the KV cache's dtype")
    quantization: Setting = Field(default=UNKNOWN, description="the weights' quantization, none when off")
    linear_kernel: Setting = Field(default=UNKNOWN, description="the matmul kernel of the linear layers")
    env: dict[str, Setting] | str = Field(default=UNKNOWN, description="environment variables that decide "
                                          "kernels, reductions or scheduling (oracle.posture.POSTURE_ENV)")


# How invariant mode covers one class of ops (oracle.op_coverage.OP_CLASSES): `covered` by the mode's mechanism (ours
# or the engine's own), `uncovered` (it runs a kernel known to follow the batch that nothing pins), `unclaimed`
# (the engine's default kernel, not known to follow the batch: the trials are all that speak for it).
CoverageStatus = Literal["covered", "uncovered", "unclaimed"]


class OpCoverage(_Section):
    """What runs one class of ops in invariant mode, as the engine's processes read it (oracle.op_coverage)."""

    status: CoverageStatus = Field(description="covered (by the mode's mechanism), uncovered (a kernel known to "
                                   "follow the batch, nothing pins it), unclaimed (the engine's default kernel, not "
                                   "known to follow the batch)")
    by: str = Field(description="what runs it, as read from the engine: a kernel set, a backend, a setting")
    why: str = Field(default="", description="for uncovered ops: how its result can follow the batch")


def _empty(value: Any) -> bool:
    return not value


EvidenceClass = Literal["verified", "failed", "not verified"]


class ProbeSideEvidence(_Section):
    """One side of a hazard's probe, as the pass evidence of its trials shows it (oracle.posture.formed)."""

    side: str = Field(description="below, at or above the threshold")
    formed: list[int] = Field(default_factory=list, description="trials whose pass evidence shows the side formed")
    shown: str = Field(default="", description="what the evidence showed (the first formed trial's, else the "
                       "first that ran)")
    not_formed: str = Field(default="", description="why the side did not form: the limit that ruled it out (the "
                            "token budget, max_num_seqs, the model's context), what the evidence showed instead, "
                            "or that the probe was left out; empty when it formed")


class ProbeEvidence(_Section):
    """One probe of a matched hazard: verified (every side formed), failed (a divergence in its trials) or not
    verified (a side did not form)."""

    probe: str = Field(description="the probe, `pass_tokens=48`")
    evidence: EvidenceClass = Field(description="verified, failed or not verified")
    sides: list[ProbeSideEvidence] = Field(default_factory=list, description="each side the probe plans")
    divergent: list[int] = Field(default_factory=list, description="its trials with an invariant-mode divergence")


class HazardEvidence(_Section):
    """A matched hazard's evidence class: `verified` (its threshold crossed on both sides, as the engine's pass
    evidence shows), `failed` (a divergence at the crossing) or `not verified` (a side did not form, and why)."""

    id: str = Field(description="the hazard's id (`environment.hazards`)")
    evidence: EvidenceClass = Field(description="verified, failed or not verified")
    why: str = Field(default="", description="what the class rests on, in a line")
    divergent: list[int] = Field(default_factory=list, description="trials of its probes, or that crossed its "
                                 "threshold, with an invariant-mode divergence")
    probes: list[ProbeEvidence] = Field(default_factory=list, description="each probe the hazard names")


class PostureRecord(_Section):
    """`environment.posture`: each mode's posture and digests over them (oracle.posture.report_posture)."""

    modes: dict[str, ModePosture] = Field(description="mode (invariant, production) -> its posture")
    digest: str = Field(description="sha256 (16 hex digits) over every mode's posture: equal digests, the same "
                        "settings")
    digests: dict[str, str] = Field(default_factory=dict, description="mode -> the digest of its posture alone "
                                    "(a golden file pins the invariant one)")
    coverage: dict[str, dict[str, OpCoverage]] = Field(
        default_factory=dict, exclude_if=_empty,
        description="mode -> op class (matmul, norm, attention, sampler, all_reduce) -> what runs it in that mode, "
                    "where the engine reports it; outside the digests, since it follows from the settings")
    hazards: list[HazardEvidence] = Field(
        default_factory=list, exclude_if=_empty,
        description="per known hazard the invariant posture matched (`environment.hazards`): verified, failed or "
                    "not verified, with the pass evidence of each probe side; outside the digests, absent without "
                    "a matched hazard")


class HazardRecord(_Section):
    """One known hazard the invariant posture matched (`environment.hazards`; oracle.posture.hazards)."""

    id: str = Field(description="the hazard's id in its hazards file")
    title: str = Field(description="what goes wrong, in a line")
    match: Literal["matches", "possible"] = Field(description="matches (every condition is met), possible (a "
                                                  "condition's setting was not reported by the engine)")
    unknown: list[str] = Field(default_factory=list, description="the conditions whose setting was unknown")
    references: list[str] = Field(default_factory=list, description="issues, papers or files that show it")
    status: HazardStatus = Field(default="open", description="upstream's status")
    threshold: str = Field(default="", description="where the hazard starts, in words")
    probes: list[str] = Field(default_factory=list, description="the probes that cross its threshold "
                              "(`fa3_kv_256`, `pass_tokens=48`)")
    source: str = Field(default="hazards.yaml", description="the file that declared it: the shipped table or "
                        "the config's `hazards`")

    def cite(self) -> str:
        """`id (reference, ...)`: how a divergence's evidence names it."""
        return f"{self.id} ({', '.join(self.references)})"


@with_config(ConfigDict(extra="allow"))
class Environment(TypedDict, total=False):
    """Where the run ran: versions, the machine, the model folder, the engines' `describe()` per mode (free-form
    keys), and the two typed sections below."""

    posture: Annotated[PostureRecord, Field(description="each mode's resolved engine settings and their digest")]
    hazards: Annotated[list[HazardRecord], Field(description="known hazards the invariant posture matches or may "
                                                 "match")]


def _in_given_order(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """Validate, keeping the keys in the order given (a TypedDict puts its declared keys first), so a report
    read and written again keeps its bytes."""
    out = handler(value)
    return {key: out[key] for key in value if key in out} if isinstance(value, dict) else out


# `Report.environment`: a dict for its readers and writers, checked and described as `Environment`.
EnvironmentDict = Annotated[dict[str, Any], GetPydanticSchema(lambda _, handler: handler(Environment)),
                            WrapValidator(_in_given_order)]


class SearchRecord(_Section):
    """The guided search (schedule.search), run to its end (oracle.search.SearchOutcome.summary)."""

    asked: int = Field(ge=0, description="search trials schedule.search.trials asked for")
    run: int = Field(ge=0, description="search trials run")
    hypothesis_seed: int = Field(ge=0, description="hypothesis' seed, derived from the run's seed")
    failing_trials: list[int] = Field(default_factory=list, description="search trials that diverged")
    best: dict[str, int | float] = Field(default_factory=dict, description="target -> the best value any "
                                         "search trial reached (the quantities it climbed)")
    trial_ids: list[int] = Field(default_factory=list, description="the search trials, in the order run")


class SearchStopped(_Section):
    """A guided search stopped before it finished (an engine error or a signal): what it asked and ran."""

    asked: int = Field(ge=0, description="search trials schedule.search.trials asked for")
    run: int = Field(ge=0, description="search trials run before it stopped")
    stopped: Literal[True] = Field(description="the search did not finish")


class ExampleDbRecord(_Section):
    """The example database (--db, --oracle-db): failing trials of earlier runs replayed first, this run's saved."""

    path: str = Field(description="the database's folder")
    key: str = Field(description="the config's key in it (the engine, model and what decides a trial's outcome)")
    replayed: list[int] = Field(default_factory=list, description="trial ids of the stored trials replayed first")
    saved: int = Field(default=0, ge=0, description="failing trials saved (counted on disk)")
    deleted: int = Field(default=0, ge=0, description="replayed trials that passed, forgotten")
    warnings: list[str] | None = Field(default=None, exclude_if=_absent,
                                       description="stored trials dropped or trials not saved, and why")


class ShardSlice(_Section):
    """One shard's report (`oracle run --shard i/N`): its checks cover its trials only, and it exits 0 once
    complete; `oracle merge` gives the run's verdict."""

    index: int = Field(ge=0, description="this shard, 0-based")
    count: int = Field(ge=1, description="the shards of the run")
    schedule_size: int = Field(ge=0, description="trials in the whole run's schedule")
    trials: list[int] = Field(default_factory=list, description="this shard's trial ids")


class MergedShard(_Section):
    """One shard as a merged report records it."""

    index: int = Field(ge=0, description="the shard, 0-based")
    folder: str = Field(description="its report folder")
    trials: int = Field(ge=0, description="trials it ran")
    invariant_engine_start_s: float | None = Field(default=None, exclude_if=_absent,
                                                   description="its invariant engine's start")
    production_engine_start_s: float | None = Field(default=None, exclude_if=_absent,
                                                    description="its production engine's start")
    total_s: float | None = Field(default=None, exclude_if=_absent, description="its run, start to end")


class MergedShards(_Section):
    """A merged report (`oracle merge`): the shards it joined."""

    count: int = Field(ge=1, description="the shards of the run")
    shards: list[MergedShard] = Field(description="each shard, by index")


def _empty_as_none(value: Any) -> Any:
    return None if value == {} else value


def _none_as_empty(value: BaseModel | None) -> BaseModel:
    """What a section is written as: its model, or `Unused` (`{}`) for None."""
    return Unused() if value is None else value


def _shape(key: str, with_key: str, without: str) -> Discriminator:
    """Which shape a section is: `with_key` where it holds `key`, else `without`; a malformed section is then
    refused naming the field of the shape it meant (`shard.merged.count`), not every shape's."""

    def tag(value: Any) -> str:
        fields = value if isinstance(value, dict) else getattr(value, "__dict__", {})
        return with_key if key in fields else without

    return Discriminator(tag)


# The sections as `Report` holds them: None when unused, written `{}`, a loaded `{}` read as None.
SearchSection = Annotated[
    Annotated[Annotated[SearchRecord, Tag("done")] | Annotated[SearchStopped, Tag("stopped")],
              _shape("stopped", with_key="stopped", without="done")] | None,
    BeforeValidator(_empty_as_none),
    PlainSerializer(_none_as_empty, return_type=SearchRecord | SearchStopped | Unused)]
ExampleDbSection = Annotated[ExampleDbRecord | None, BeforeValidator(_empty_as_none),
                             PlainSerializer(_none_as_empty, return_type=ExampleDbRecord | Unused)]
ShardSection = Annotated[
    Annotated[Annotated[ShardSlice, Tag("slice")] | Annotated[MergedShards, Tag("merged")],
              _shape("shards", with_key="merged", without="slice")] | None,
    BeforeValidator(_empty_as_none),
    PlainSerializer(_none_as_empty, return_type=ShardSlice | MergedShards | Unused)]


_ENVIRONMENT = TypeAdapter(EnvironmentDict)


def environment_json(environment: Mapping[str, Any]) -> dict[str, Any]:
    """`environment` as report.json writes it (the typed sections as JSON), to compare with a golden file's."""
    return _ENVIRONMENT.dump_python(dict(environment), mode="json")  # type: ignore[no-any-return]
