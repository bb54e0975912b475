"""The run configuration: pydantic models, and the only place YAML is read.

Validation errors are rewritten once, here, into a `ConfigError` that names the file, the
field path and the line it sits on.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from oracle.errors import ConfigError

Requirement = Literal["required", "warn", "off"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_range(v: tuple[int, int], name: str) -> tuple[int, int]:
    lo, hi = v
    if lo > hi:
        raise ValueError(f"{name} range [{lo}, {hi}] is empty: min > max")
    return v


class NativeOptions(_Strict):
    """engine.options of the native engine."""

    stop_at_eos: bool = Field(False, description="finish a request at the model's EOS token (off: exactly max_tokens)")


class TransformersOptions(_Strict):
    """engine.options of the transformers engine."""

    attn_implementation: str = Field(
        "eager", description="production mode's attention (eager, sdpa, ...); invariant mode runs its own packed one")


class VllmOptions(_Strict):
    """engine.options of the vllm engine (vLLM's offline engine in a worker process per mode)."""

    invariance: Literal["oracle_kernels", "vllm", "none"] = Field(
        "oracle_kernels", description="what invariant mode means: oracle_kernels, VLLM_BATCH_INVARIANT=1, or none")
    logprobs: int = Field(5, ge=2, description="top-k logprobs per step when full rows are not asked for")
    split_kv: bool | None = Field(None, description="VLLM_CPU_ATTN_SPLIT_KV (vLLM's default when absent)")
    enforce_eager: bool = Field(True, description="no CUDA graphs")
    max_model_len: int | None = Field(None, ge=1, description="vLLM's max_model_len")
    kv_cache_space_gib: int = Field(1, ge=1, description="VLLM_CPU_KVCACHE_SPACE on the CPU")
    seed: int = Field(0, description="vLLM's engine seed")
    audit: bool = Field(True, description="record which kernels the invariant worker's products reached")
    start_timeout_s: float = Field(300.0, gt=0, description="seconds a worker may take to start")
    timeout_s: float = Field(600.0, gt=0, description="seconds one generate call may take")
    log_level: str = Field("WARNING", description="vLLM's logging level in the worker")
    engine_args: dict[str, Any] = Field(default_factory=dict, description="extra vllm.EngineArgs fields")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables of the worker")


class ModeURLs(_Strict):
    """One pre-started server per mode: the invariant-mode server and the production-mode server."""

    invariant: str = Field(description="URL of the server started in invariant mode (e.g. VLLM_BATCH_INVARIANT=1)")
    production: str = Field(description="URL of the server started with default kernels")

    @field_validator("invariant", "production")
    @classmethod
    def _http(cls, v: str) -> str:
        return _http_url(v)


def _http_url(v: str) -> str:
    if not v.startswith(("http://", "https://")):
        raise ValueError(f"{v!r} is not an http:// or https:// URL")
    return v


class OpenAIOptions(_Strict):
    """engine.options of the openai engine (an OpenAI-compatible server: vLLM, SGLang, ...)."""

    base_url: str | ModeURLs | None = Field(
        None, description="pre-started servers {invariant: URL, production: URL}; one URL serves both modes "
                          "(the mode comparison then compares a server with itself)")
    command: list[str] | None = Field(
        None, description="argv that starts a server per mode; {python} {model} {host} {port} substituted, "
                          "{host} required (always 127.0.0.1)")
    env: dict[str, str] = Field(default_factory=dict, description="environment of the started server")
    mode_env: dict[Literal["invariant", "production"], dict[str, str]] = Field(
        default_factory=dict, description="extra environment per mode, e.g. {invariant: {VLLM_BATCH_INVARIANT: '1'}}")
    served_model_name: str | None = Field(None, description="model name in requests (first of /v1/models when absent)")
    concurrency: int = Field(32, ge=1, description="requests in flight at once")
    arrival_step_s: float = Field(0.02, ge=0, description="seconds per schedule arrival step")
    logprobs: int = Field(5, ge=2, description="top-k logprobs per step (>= 2 for the top-2 margin)")
    request_timeout_s: float = Field(120, gt=0, description="seconds one request may take")
    startup_timeout_s: float = Field(300, gt=0, description="seconds a started server may take to answer")
    max_retries: int = Field(4, ge=0, description="retries of a request after a transient error (5xx, connection reset)")
    retry_backoff_s: float = Field(0.5, ge=0, description="first retry delay; doubles per retry, at most 8 s")
    api_key: str | None = Field(None, description="bearer token sent to the server (or env OPENAI_API_KEY)")

    @field_validator("base_url", mode="before")
    @classmethod
    def _url(cls, v: Any) -> Any:
        # Validate the per-mode form directly, so its errors name base_url.invariant / .production.
        if isinstance(v, dict):
            return ModeURLs.model_validate(v)
        return _http_url(v) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _server(self) -> OpenAIOptions:
        if self.base_url is not None and self.command is not None:
            raise ValueError("give base_url or command, not both")
        if self.base_url is None and not self.command:
            raise ValueError("give base_url (running servers) or command (to start one per mode)")
        if self.command is not None and not any("{host}" in c for c in self.command):
            raise ValueError("command must bind the server to {host} (oracle serves on 127.0.0.1 only)")
        return self


ENGINE_OPTIONS: dict[str, type[BaseModel]] = {
    "native": NativeOptions, "transformers": TransformersOptions, "vllm": VllmOptions, "openai": OpenAIOptions,
}


class EngineConfig(_Strict):
    kind: str = Field("native", description="native | vllm | openai | transformers | package.module:Class")
    device: str = Field("cpu", description="torch device for in-process engines: cpu, cuda, cuda:1")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_num_seqs: int = Field(256, ge=1, description="most sequences in one forward pass")
    max_num_batched_tokens: int = Field(2048, ge=1, description="token budget of one forward pass")
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = Field(False, description="reuse KV blocks of shared prompt prefixes")
    block_size: int = Field(16, ge=1, description="KV cache block size (tokens)")
    num_threads: int | None = Field(None, ge=1, description="torch CPU threads during generation (native)")
    preload: list[str] = Field(default_factory=list, description="modules imported in the engine's process first")
    options: dict[str, Any] = Field(
        default_factory=dict, description="per engine: see NativeOptions, TransformersOptions, VllmOptions, "
                                          "OpenAIOptions; a custom engine's keyword arguments (free)")

    _base_dir: str | None = PrivateAttr(None)

    @field_validator("options")
    @classmethod
    def _typed_options(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Validate a built-in engine's options against its model; errors name engine.options.FIELD."""
        model = ENGINE_OPTIONS.get(info.data.get("kind", "native"))
        if model is None:
            return v
        return model.model_validate(v).model_dump(mode="json", exclude_unset=True)

    @property
    def base_dir(self) -> str | None:
        """The config file's folder (set by Config), where custom engines are also imported from."""
        return self._base_dir

    def typed_options(self) -> BaseModel | None:
        """The options as the built-in engine's model (defaults filled in); None for a custom engine."""
        model = ENGINE_OPTIONS.get(self.kind)
        return model.model_validate(self.options) if model is not None else None


class RandomPrompts(_Strict):
    count: int = Field(8, ge=1)
    min_len: int = Field(4, ge=1)
    max_len: int = Field(32, ge=1)
    seed: int = 0

    @model_validator(mode="after")
    def _lengths(self) -> RandomPrompts:
        _check_range((self.min_len, self.max_len), "prompt length")
        return self


class PromptsConfig(_Strict):
    texts: list[str] | None = Field(None, description="literal prompts, tokenized with the model's tokenizer")
    file: str | None = Field(None, description='JSONL file, one {"prompt": ...} or {"prompt_token_ids": [...]} a line')
    random: RandomPrompts | None = Field(None, description="random token sequences")

    @model_validator(mode="after")
    def _exactly_one(self) -> PromptsConfig:
        given = [n for n in ("texts", "file", "random") if getattr(self, n) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of texts, file, random (got {', '.join(given) or 'none'})")
        if self.texts is not None and not self.texts:
            raise ValueError("texts is empty")
        return self


class SamplingConfig(_Strict):
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(0.0, ge=0.0)
    seed: int = 0
    logits: Literal["full", "digest", "none"] = Field("full", description="compare full logits rows, digests, or none")


class ScheduleConfig(_Strict):
    trials: int = Field(50, ge=1, description="trials drawn per run")
    seed: int | None = Field(None, description="schedule seed; random (and printed) when absent")
    batch_size: tuple[int, int] = Field((1, 16), description="[min, max] requests in a trial, target included")
    filler_len: tuple[int, int] = Field((1, 32), description="[min, max] filler prompt length (tokens)")
    filler_max_tokens: tuple[int, int] = Field((1, 16), description="[min, max] tokens a filler generates")
    arrival_step: tuple[int, int] = Field((0, 0), description="[min, max] engine step at which a request arrives")
    max_num_batched_tokens: tuple[int, int] | None = Field(
        None, description="[min, max] token budget per trial (chunked prefill); engine's value when absent")
    repeat_trials: int = Field(10, ge=0, description="trials run twice per mode for repeatability")
    shrink: bool = Field(True, description="shrink a failing invariance trial to a minimal one with hypothesis")
    max_shrink_runs: int = Field(200, ge=0, description="engine runs spent shrinking at most")

    @field_validator("batch_size", "filler_len", "filler_max_tokens", "arrival_step", "max_num_batched_tokens")
    @classmethod
    def _range(cls, v: tuple[int, int] | None, info: Any) -> tuple[int, int] | None:
        if v is None:
            return v
        if v[0] < (1 if info.field_name != "arrival_step" else 0):
            raise ValueError(f"{info.field_name} min must be >= {1 if info.field_name != 'arrival_step' else 0}")
        return _check_range(v, info.field_name)


class CheckConfig(_Strict):
    """A check's requirement; a plain string in YAML (`fidelity: warn`) sets just this."""

    requirement: Requirement = "required"

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        if isinstance(v, bool):  # YAML 1.1 reads a bare `off` as false
            v = "required" if v else "off"
        return {"requirement": v} if isinstance(v, str) else v


class FidelityConfig(CheckConfig):
    max_logprob_diff: float = Field(1e-3, gt=0, description="max |logprob(invariant) - logprob(production)|, solo")
    max_kl: float = Field(1e-3, gt=0, description="max KL(production || invariant) per step, from full logits rows")
    near_tie: float = Field(1e-2, ge=0, description="a token flip is allowed where the top-1/top-2 logit margin is below this")


class DriftConfig(CheckConfig):
    requirement: Literal["report", "required", "warn", "off"] = "report"  # type: ignore[assignment]
    max_divergent_fraction: float | None = Field(None, ge=0, le=1, description="gate: fraction of trials")
    max_ulp: int | None = Field(None, ge=0, description="gate: largest logprob ULP distance")


class NegativeControlConfig(CheckConfig):
    requirement: Requirement = "warn"


class PrefillDecodeConfig(CheckConfig):
    requirement: Requirement = "warn"
    steps: int = Field(4, ge=1, description="generated steps per target re-prefilled")


class PrefixCacheConfig(CheckConfig):
    requirement: Requirement = "warn"


class GoldenConfig(CheckConfig):
    requirement: Requirement = "off"
    file: str | None = Field(None, description="golden file written by `oracle record`")

    @model_validator(mode="after")
    def _file(self) -> GoldenConfig:
        if self.requirement != "off" and not self.file:
            raise ValueError("golden needs a file")
        return self


class ChecksConfig(_Strict):
    invariance: CheckConfig = Field(default_factory=CheckConfig)  # type: ignore[arg-type]
    repeatability: CheckConfig = Field(default_factory=CheckConfig)  # type: ignore[arg-type]
    fidelity: FidelityConfig = Field(default_factory=FidelityConfig)  # type: ignore[arg-type]
    drift: DriftConfig = Field(default_factory=DriftConfig)  # type: ignore[arg-type]
    negative_control: NegativeControlConfig = Field(default_factory=NegativeControlConfig)  # type: ignore[arg-type]
    prefill_decode: PrefillDecodeConfig = Field(default_factory=PrefillDecodeConfig)  # type: ignore[arg-type]
    prefix_cache: PrefixCacheConfig = Field(default_factory=PrefixCacheConfig)  # type: ignore[arg-type]
    golden: GoldenConfig = Field(default_factory=GoldenConfig)  # type: ignore[arg-type]


class Config(_Strict):
    model: str = Field(description="preset:NAME (made into a cache on first use), a checkpoint directory, "
                                   "or a Hugging Face hub id org/name (fetched into the hub cache)")
    model_revision: str | None = Field(None, description="hub ids: branch, tag or commit (default branch when absent)")
    model_seed: int = Field(0, description="weights seed for preset models")
    engine: EngineConfig = Field(default_factory=EngineConfig)  # type: ignore[arg-type]
    prompts: PromptsConfig
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)  # type: ignore[arg-type]
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)  # type: ignore[arg-type]
    checks: ChecksConfig = Field(default_factory=ChecksConfig)  # type: ignore[arg-type]
    report_dir: str = Field("oracle-report", description="report folder, relative to the working directory")
    base_dir: str = Field(".", description="folder relative paths resolve against (the config file's, by default)")

    def model_post_init(self, context: Any, /) -> None:
        self.engine._base_dir = self.base_dir  # custom engines import from the config's folder too

    def digest(self) -> str:
        """sha256 of the resolved config, canonical JSON (sorted keys)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    def resolve_path(self, p: str) -> Path:
        path = Path(p).expanduser()
        return path if path.is_absolute() else Path(self.base_dir) / path


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    """Read a YAML config; raises ConfigError naming the file, field and line on any problem."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    text = path.read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}{where}: malformed YAML: {problem}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    data.setdefault("base_dir", str(path.parent.resolve()))
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
    return parse_config(data, source=str(path), text=text)


def parse_config(data: dict[str, Any], source: str = "<config>", text: str | None = None) -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = [str(x) for x in err["loc"]]
        field = ".".join(loc) or "<root>"
        line = _line_of(text, err["loc"]) if text else None
        where = f"{source}:{line}" if line else source
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif err["type"] == "missing":
            msg = "required field missing"
        more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
        raise ConfigError(f"{where}: {field}: {msg}{more}") from e


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value


def _line_of(text: str, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the deepest YAML node on `loc` that exists in the file."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    line = None
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(key)), None)
            if match is None:
                break
            line = match[0].start_mark.line + 1
            node = match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            break
    return line
