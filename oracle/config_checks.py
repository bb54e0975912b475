"""`checks:` of the config: each check's requirement and options (one field of `ChecksConfig` per check, one row per
field in `oracle.judge.CHECKS`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from oracle.config_base import MAX_TOKENS, MAX_TRIALS, Requirement, Strict


class CheckConfig(Strict):
    """A check's requirement; a plain string in YAML (`fidelity: warn`) sets just this."""

    requirement: Requirement = "required"

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        if isinstance(v, bool):  # YAML 1.1 reads a bare `off` as false
            v = "required" if v else "off"
        return {"requirement": v} if isinstance(v, str) else v

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> dict[str, Any]:
        """As YAML reads it: the requirement alone (`invariance: required`), a boolean (bare `off` is
        YAML for false), or the full object."""
        schema = handler(core_schema)
        full = handler.resolve_ref_schema(schema)
        requirement = full.get("properties", {}).get("requirement", {})
        levels = requirement.get("enum") or ["required", "warn", "off"]
        return {"anyOf": [{"type": "string", "enum": levels, "description": "the requirement alone"},
                          {"type": "boolean", "description": "true: required; false (a bare `off`): off"},
                          dict(full)], "title": full.get("title", cls.__name__)}


class InvarianceConfig(CheckConfig):
    localize: Literal["first", "all", "off"] = Field(
        "first", description="name the first diverging op of failing trials: the first and the shrunk one, "
        "every failing trial, or none")


# Fidelity's tolerances where the config gives none, by engine.dtype: invariant and production kernels
# round differently, by about the dtype's epsilon (2^-23 float32, 2^-10 float16, 2^-7 bfloat16) per op,
# compounded over the layers. bfloat16's were set from a healthy vLLM run on an H200 (max |dlogprob| 0.097).
FIDELITY_DEFAULTS: dict[str, dict[str, float]] = {
    "float32": {"max_logprob_diff": 1e-3, "max_kl": 1e-3, "near_tie": 1e-2},
    "float16": {"max_logprob_diff": 0.05, "max_kl": 0.01, "near_tie": 0.05},
    "bfloat16": {"max_logprob_diff": 0.25, "max_kl": 0.05, "near_tie": 0.25},
}


class FidelityConfig(CheckConfig):
    max_logprob_diff: float = Field(1e-3, gt=0, description="max |logprob(invariant) - logprob(production)|, solo "
                                                            "(default by engine.dtype: float32 1e-3, float16 0.05, "
                                                            "bfloat16 0.25)")
    max_kl: float = Field(1e-3, gt=0, description="max KL(production || invariant) per step, from full logits rows "
                                                  "(default by engine.dtype: float32 1e-3, float16 0.01, bfloat16 0.05)")
    near_tie: float = Field(1e-2, ge=0, description="a token flip is allowed where the top-1/top-2 logit margin is "
                                                    "below this (default by engine.dtype: float32 0.01, float16 0.05, "
                                                    "bfloat16 0.25)")


class DriftConfig(CheckConfig):
    requirement: Literal["report", "required", "warn", "off"] = "report"  # type: ignore[assignment]
    localize: Literal["first", "all", "off"] = Field(
        "off", description="name the first diverging op of drifting production trials (the first one, every one, "
        "or none) and map them by module and op: the report's variance_map")
    max_divergent_fraction: float | None = Field(None, ge=0, le=1, description="gate: fraction of trials")
    max_ulp: int | None = Field(None, ge=0, description="gate: largest logprob ULP distance")


class NegativeControlConfig(CheckConfig):
    requirement: Requirement = "warn"


class PrefillDecodeConfig(CheckConfig):
    requirement: Requirement = "warn"
    steps: int = Field(4, ge=1, le=MAX_TOKENS, description="generated steps per target re-prefilled")


class PrefixCacheConfig(CheckConfig):
    requirement: Requirement = "warn"


class SamplingVariant(Strict):
    """One way of sampling the seeded_sampling check runs (temperature > 0, optional top-p / top-k)."""

    temperature: float = Field(1.0, gt=0, description="temperature (> 0: sampled, not greedy)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus: keep the smallest set of tokens reaching this mass")
    top_k: int = Field(0, ge=0, description="keep the k most likely tokens (0: all)")


def _default_variants() -> list[SamplingVariant]:
    return [SamplingVariant(), SamplingVariant(top_p=0.9), SamplingVariant(top_k=8)]


class SeededSamplingConfig(CheckConfig):
    """Seeded sampling (invariant mode): each request's seed alone decides its tokens and logprob bits.

    A request gets the same outputs alone and in a batch, and requests with different seeds in one
    batch do not share their noise. Off by default: it needs an engine that samples with per-request
    seeds (vLLM 0.32's CPU build stops with "CPU Generator does not use offset"); `seeded_sampling: required`."""

    requirement: Requirement = "off"
    targets: int = Field(2, ge=1, le=MAX_TRIALS, description="targets sampled (the first N), two seeds each")
    variants: list[SamplingVariant] = Field(
        default_factory=_default_variants, min_length=1,
        description="sampling settings checked: temperature, top_p, top_k (default: T=1; top_p 0.9; top_k 8)")


class CrossInstanceConfig(CheckConfig):
    """Two separately started engine instances of one mode give bitwise the same outputs on the same trials.

    Off by default: it starts the mode's engine (or server) a second time."""

    requirement: Requirement = "off"
    mode: Literal["invariant", "production"] = Field("invariant", description="the mode started twice")
    trials: int = Field(4, ge=0, le=MAX_TRIALS,
                        description="schedule trials run again on the second instance (besides every reference)")


class TpParityConfig(CheckConfig):
    """The same prompts at two tensor-parallel sizes (invariant mode's references), reported with the size of
    their difference: another number of ranks splits each reduction differently, which batch invariance
    does not promise to hide. Off by default (it starts invariant mode's engine again); `report` reports
    it, `required` makes a difference fail the run."""

    requirement: Literal["report", "required", "warn", "off"] = "off"  # type: ignore[assignment]
    tensor_parallel_size: int = Field(1, ge=1, le=4096, description="the size compared with the run's own "
                                      "engine.options.tensor_parallel_size")
    localize: Literal["first", "off"] = Field(
        "first", description="where the sizes differ, name the first op where they part for the first differing "
        "target (its request alone captured at both sizes; the run's engine is started once more), or not")


class GoldenConfig(CheckConfig):
    requirement: Requirement = "off"
    file: str | None = Field(None, description="golden file written by `oracle record`")

    @model_validator(mode="after")
    def _file(self) -> GoldenConfig:
        if self.requirement != "off" and not self.file:
            raise ValueError("golden needs a file")
        return self


class ChecksConfig(Strict):
    invariance: InvarianceConfig = Field(default_factory=InvarianceConfig)
    repeatability: CheckConfig = Field(default_factory=CheckConfig)
    fidelity: FidelityConfig = Field(default_factory=FidelityConfig)
    drift: DriftConfig = Field(default_factory=DriftConfig)
    negative_control: NegativeControlConfig = Field(default_factory=NegativeControlConfig)
    prefill_decode: PrefillDecodeConfig = Field(default_factory=PrefillDecodeConfig)
    prefix_cache: PrefixCacheConfig = Field(default_factory=PrefixCacheConfig)
    golden: GoldenConfig = Field(default_factory=GoldenConfig)
    seeded_sampling: SeededSamplingConfig = Field(default_factory=SeededSamplingConfig)
    cross_instance: CrossInstanceConfig = Field(default_factory=CrossInstanceConfig)
    tp_parity: TpParityConfig = Field(default_factory=TpParityConfig)
