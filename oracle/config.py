"""The run configuration: pydantic models, and the only door YAML comes in by (`load_config`).

Validation errors are rewritten once, here, into a `ConfigError` that names the file, the
field path and the line it sits on. The file's text (safe YAML, strings, file:line) is oracle.config_text's,
`checks:` is oracle.config_checks's, and the bounds and the strict base model are oracle.config_base's.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from oracle.config_base import (
    MAX_ARRIVAL_STEP,
    MAX_BATCH,
    MAX_BUDGET,
    MAX_SEED,
    MAX_TIMEOUT_S,
    MAX_TRIALS,
    Strict,
)
from oracle.config_base import MAX_CONFIG_BYTES as MAX_CONFIG_BYTES
from oracle.config_base import MAX_SET_DEPTH as MAX_SET_DEPTH
from oracle.config_base import MAX_TOKENS as MAX_TOKENS
from oracle.config_checks import FIDELITY_DEFAULTS as FIDELITY_DEFAULTS
from oracle.config_checks import ChecksConfig as ChecksConfig
from oracle.config_text import check_strings, load_yaml, set_dotted, shown_input, where
from oracle.engine_options import NativeOptions, options_model
from oracle.errors import ConfigError

OptionsT = TypeVar("OptionsT", bound=BaseModel)


def _check_range(v: tuple[int, int], name: str) -> tuple[int, int]:
    lo, hi = v
    if lo > hi:
        raise ValueError(f"{name} range [{lo}, {hi}] is empty: min > max")
    return v


class EngineConfig(Strict):
    kind: str = Field("native", description="native | vllm | openai | transformers | package.module:Class")
    device: str = Field("cpu", description="torch device for in-process engines: cpu, cuda, cuda:1")
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    max_num_seqs: int = Field(256, ge=1, le=MAX_BATCH, description="most sequences in one forward pass")
    max_num_batched_tokens: int = Field(2048, ge=1, le=MAX_BUDGET, description="token budget of one forward pass")
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = Field(False, description="reuse KV blocks of shared prompt prefixes")
    block_size: int = Field(16, ge=1, le=4096, description="KV cache block size (tokens)")
    num_threads: int | None = Field(None, ge=1, le=4096, description="torch CPU threads during generation (native)")
    preload: list[str] = Field(default_factory=list, description="modules imported in the engine's process first")
    options: dict[str, Any] = Field(
        default_factory=dict, description="per engine: see NativeOptions, TransformersOptions, VllmOptions, "
                                          "OpenAIOptions; a custom engine's keyword arguments (free)")
    timeout_s: float | None = Field(
        600.0, gt=0, le=MAX_TIMEOUT_S,
        description="watchdog: seconds one engine call (generate, close) may take before the run stops with "
                    "exit 3; null: no limit")

    _base_dir: str | None = PrivateAttr(None)

    @field_validator("options")
    @classmethod
    def _typed_options(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Validate a built-in engine's options against its model; errors name engine.options.FIELD."""
        model = options_model(info.data.get("kind", "native"))
        if model is None:
            return v
        return model.model_validate(v).model_dump(mode="json", exclude_unset=True)

    @property
    def base_dir(self) -> str | None:
        """The config file's folder (set by Config), where custom engines are also imported from."""
        return self._base_dir

    def typed_options(self) -> BaseModel | None:
        """The options as the built-in engine's model (defaults filled in); None for a custom engine."""
        model = options_model(self.kind)
        return self.options_as(model) if model is not None else None

    def options_as(self, model: type[OptionsT]) -> OptionsT:
        """engine.options as `model`, a built-in engine's options (NativeOptions, ...) with its defaults
        filled in: what that engine reads. `options` keeps only what was given (the report's config and
        its digest do not move with a default). Validated when the config was read; an EngineConfig built
        in Python with a wrong option is a ConfigError naming engine.options.FIELD."""
        try:
            return model.model_validate(self.options)
        except ValidationError as e:
            raise ConfigError(_validation_message(e, ("engine", "options"))) from e

    @classmethod
    def of(cls, kind: str = "native", **values: Any) -> EngineConfig:
        """An EngineConfig from keyword arguments as a Python caller writes them: the engine fields by name,
        every other one an option of `kind` (`EngineConfig.of("openai", base_url=URL, concurrency=4)`). A
        subclass of a built-in engine used as `module:Class` rebuilds its config so from the keyword
        arguments it is given. ConfigError naming engine.FIELD or engine.options.FIELD when one is wrong."""
        fields = {k: v for k, v in values.items() if k in cls.model_fields and k not in ("kind", "options")}
        options = {k: v for k, v in values.items() if k not in fields}
        try:
            return cls.model_validate({"kind": kind, **fields, "options": options})
        except ValidationError as e:
            raise ConfigError(_validation_message(e, ("engine",))) from e


class RandomPrompts(Strict):
    count: int = Field(8, ge=1, le=100_000)
    min_len: int = Field(4, ge=1, le=MAX_TOKENS)
    max_len: int = Field(32, ge=1, le=MAX_TOKENS)
    seed: int = Field(0, ge=0, le=MAX_SEED)

    @model_validator(mode="after")
    def _lengths(self) -> RandomPrompts:
        _check_range((self.min_len, self.max_len), "prompt length")
        return self


class PromptsConfig(Strict):
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


class SamplingConfig(Strict):
    max_tokens: int = Field(16, ge=1, le=MAX_TOKENS)
    temperature: float = Field(0.0, ge=0.0)
    seed: int = Field(0, ge=0, le=MAX_SEED)
    logits: Literal["full", "digest", "none"] = Field("full", description="compare full logits rows, digests, or none")


class SearchConfig(Strict):
    """The guided search after the schedule (oracle.search): hypothesis draws more trials, steered toward
    larger packed passes, KV lengths, sequences per pass and target positions, and toward larger ULP once
    a difference appears. Invariant mode only; derandomized from the run's seed."""

    trials: int = Field(0, ge=0, le=MAX_TRIALS, description="search trials run after the schedule (0: no search)")


class ConfidenceConfig(Strict):
    """What a pass must rule out: a break that shows in `rate` of batched trials, at `level`
    (oracle.checks.strength). The schedule draws enough trials for ceil(ln(1-level)/ln(1-rate)) batched ones
    (59 for 5% at 95%); a run that forms fewer leaves invariance vacuous."""

    rate: float = Field(0.05, gt=0, lt=1, description="the rate of a break in batched trials the pass rules out")
    level: float = Field(0.95, gt=0, lt=1, description="the confidence it is ruled out at")

    @property
    def batched_trials(self) -> int:
        """The batched trials whose 0 divergences rule out `rate` at `level`: (1-rate)^N <= 1-level."""
        return math.ceil(math.log(1.0 - self.level) / math.log(1.0 - self.rate))


def _absent(value: Any) -> bool:
    return value is None


ProbeName = Literal["fa3_packed_query", "fa3_kv_128", "fa3_kv_256", "fa3_kv_512", "chunk_budget", "prefix_block",
                    "shared_pass", "shared_prefix", "short_budget"]


class ScheduleConfig(Strict):
    trials: int = Field(50, ge=1, le=MAX_TRIALS, description="trials drawn per run")
    seed: int | None = Field(None, ge=0, le=MAX_SEED, description="schedule seed; random (and printed) when absent")
    batch_size: tuple[int, int] = Field((1, 16), description="[min, max] requests in a trial, target included")
    filler_len: tuple[int, int] = Field((1, 32), description="[min, max] filler prompt length (tokens)")
    filler_max_tokens: tuple[int, int] = Field((1, 16), description="[min, max] tokens a filler generates")
    arrival_step: tuple[int, int] = Field((0, 0), description="[min, max] engine step at which a request arrives")
    max_num_batched_tokens: tuple[int, int] | None = Field(
        None, description="[min, max] token budget per trial (chunked prefill); engine's value when absent")
    confidence: ConfidenceConfig | None = Field(
        None, exclude_if=_absent, description="{rate: 0.05, level: 0.95}: draw enough trials that a pass rules out "
        "a break in `rate` of batched trials at `level` (59 batched trials for 5% at 95%); invariance is vacuous "
        "when the run forms fewer. Absent: the trials asked, and every pass states its bound at 95%")
    repeat_trials: int = Field(10, ge=0, le=MAX_TRIALS, description="trials run twice per mode for repeatability")
    shrink: bool = Field(True, description="shrink the first failing invariance trial to the smallest one that still fails")
    max_shrink_runs: int = Field(200, ge=0, le=MAX_TRIALS, description="engine runs spent shrinking at most")
    search: SearchConfig = Field(default_factory=SearchConfig,
                                 description="guided search after the schedule: {trials: N}")
    probes: list[ProbeName] | Literal["auto", "all", "none"] = Field(
        "auto",
        description="hazard probes added to the schedule (oracle.posture.probes). auto (default): the probes of "
                    "every known hazard the posture matches or may match; a list (fa3_packed_query, fa3_kv_128, "
                    "fa3_kv_256, fa3_kv_512, chunk_budget, prefix_block, shared_pass, shared_prefix, short_budget): "
                    "those besides; all: every "
                    "probe that applies to the engine besides; none: no probe at all (a matched hazard then goes "
                    "untested, and invariance cannot pass)")

    @field_validator("batch_size", "filler_len", "filler_max_tokens", "arrival_step", "max_num_batched_tokens")
    @classmethod
    def _range(cls, v: tuple[int, int] | None, info: Any) -> tuple[int, int] | None:
        if v is None:
            return v
        if v[0] < (1 if info.field_name != "arrival_step" else 0):
            raise ValueError(f"{info.field_name} min must be >= {1 if info.field_name != 'arrival_step' else 0}")
        if v[1] > _RANGE_MAX[info.field_name]:
            raise ValueError(f"{info.field_name} max must be <= {_RANGE_MAX[info.field_name]:,} (got {v[1]:,})")
        return _check_range(v, info.field_name)


_RANGE_MAX = {"batch_size": MAX_BATCH, "filler_len": MAX_TOKENS, "filler_max_tokens": MAX_TOKENS,
              "arrival_step": MAX_ARRIVAL_STEP, "max_num_batched_tokens": MAX_BUDGET}


def _fidelity_defaults(engine: Any) -> dict[str, float] | None:
    """The fidelity tolerances of the engine's dtype, where they are not float32's (the fields' own defaults)."""
    dtype = engine.get("dtype") if isinstance(engine, dict) else getattr(engine, "dtype", None)
    return FIDELITY_DEFAULTS.get(dtype) if isinstance(dtype, str) and dtype != "float32" else None


def _fidelity_section(fidelity: Any) -> dict[str, Any] | None:
    """`checks.fidelity` as a mapping (a bare requirement or bool made one, absent an empty one); None for a
    FidelityConfig already, or a wrong type that validation names."""
    if isinstance(fidelity, bool):
        return {"requirement": "required" if fidelity else "off"}
    if isinstance(fidelity, str):
        return {"requirement": fidelity}
    if fidelity is None:
        return {}
    return fidelity if isinstance(fidelity, dict) else None


class Config(Strict):
    model: str = Field(description="preset:NAME (made into a cache on first use), a checkpoint directory, "
                                   "or a Hugging Face hub id org/name (fetched into the hub cache)")
    model_revision: str | None = Field(None, description="hub ids: branch, tag or commit (default branch when absent)")
    model_seed: int = Field(0, ge=0, le=MAX_SEED, description="weights seed for preset models")
    engine: EngineConfig = Field(default_factory=EngineConfig)
    prompts: PromptsConfig
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    checks: ChecksConfig = Field(default_factory=ChecksConfig)
    report_dir: str = Field("oracle-report", description="report folder, relative to the working directory")
    hazards: str | None = Field(None, description="a YAML file of your own known hazards (the format of "
                                "oracle/posture/hazards.yaml, docs/hazards.md), added to the built-in ones")
    base_dir: str = Field(".", description="folder relative paths resolve against (the config file's, by default)")
    # Where the config came from (file name and text), for errors found after loading: `error()`.
    _source: str = PrivateAttr("<config>")
    _text: str | None = PrivateAttr(None)
    _flags: dict[str, str] = PrivateAttr(default_factory=dict)  # dotted field -> the flag that set it

    @model_validator(mode="before")
    @classmethod
    def _fidelity_by_dtype(cls, data: Any) -> Any:
        """Fidelity's tolerances the config leaves out take engine.dtype's defaults (FIDELITY_DEFAULTS)."""
        if not isinstance(data, dict):
            return data
        checks = data.get("checks")
        defaults = _fidelity_defaults(data.get("engine"))
        if defaults is None or (checks is not None and not isinstance(checks, dict)):
            return data
        fidelity = _fidelity_section((checks or {}).get("fidelity"))
        if fidelity is None:
            return data  # a FidelityConfig already, or a wrong type that validation names
        return {**data, "checks": {**(checks or {}), "fidelity": {**defaults, **fidelity}}}

    def error(self, loc: tuple[str | int, ...], message: str) -> ConfigError:
        """A ConfigError `file:line: field: message` for a problem found after validation; `FLAG: field:
        message` where a command-line flag set the field or a field the message names (a conflict)."""
        field = ".".join(str(x) for x in loc)
        blamed = [f for dotted, f in self._flags.items()
                  if field == dotted or field.startswith(dotted + ".") or re.search(rf"\b{re.escape(dotted)}\b", message)]
        if blamed:
            return ConfigError(f"{', '.join(blamed)}: {field}: {message}")
        return ConfigError(f"{where(self._source, self._text, loc)}: {'.'.join(str(x) for x in loc)}: {message}")

    def model_post_init(self, context: Any, /) -> None:
        self.engine._base_dir = self.base_dir  # custom engines import from the config's folder too
        from oracle.redaction import remember

        found: set[str] = set()
        self.redacted(found)
        remember(found)  # so an error line that quotes one (a server's command line) is scrubbed too

    def redacted(self, secrets: set[str] | None = None) -> dict[str, Any]:
        """The resolved config as written to a report: secrets replaced by `<redacted: set, N chars>`
        (oracle.redaction); the values found are added to `secrets`."""
        from oracle.redaction import redact_tree

        return redact_tree(self.model_dump(mode="json"), secrets)

    def digest(self) -> str:
        """sha256 of the resolved config, canonical JSON (sorted keys).

        Of the real config, secrets included: the digest names what ran, and two configs that differ
        only in a secret (another server's key) are different runs. The report holds only the redacted
        config; the digest is one-way, though a guess at a weak secret could be tested against it by
        rebuilding the config around the guess (use tokens, not passwords, for servers)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()

    def resolve_path(self, p: str) -> Path:
        path = Path(p).expanduser()
        return path if path.is_absolute() else Path(self.base_dir) / path


def load_config(path: str | Path, overrides: dict[str, Any] | None = None,
                flags: dict[str, str] | None = None) -> Config:
    """Read a YAML config; raises ConfigError naming the file, field and line on any problem.

    `overrides` (dotted field -> value) replace the file's values; `flags` names the command-line
    option each came from (`{"schedule.trials": "--trials"}`), so an error in one blames the option.
    """
    from oracle.files import read_regular

    path = Path(path)
    raw = read_regular(path, MAX_CONFIG_BYTES, "config file")  # a FIFO, a device, a huge file: exit 2 at once
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})") from e
    data = load_yaml(text, str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    data.setdefault("base_dir", str(path.parent.resolve()))
    for dotted, value in (overrides or {}).items():
        set_dotted(data, dotted, value)
    return parse_config(data, source=str(path), text=text, flags=flags)


def config_handoff(config: Config) -> bytes:
    """The resolved config as JSON for another process (`oracle run`'s child): its values, overrides applied,
    and where they came from (file, text, flags), so that errors found there still name file:line or the flag.
    Secrets included: it travels through a pipe, never a file."""
    return json.dumps({"data": config.model_dump(mode="json"), "source": config._source, "text": config._text,
                       "flags": config._flags}).encode()


def config_from_handoff(blob: bytes) -> Config:
    """The config `config_handoff` wrote, validated again with the config's models (no YAML, no overrides)."""
    try:
        sent = json.loads(blob)
        data, source, text, flags = sent["data"], sent["source"], sent["text"], sent["flags"]
    except (ValueError, TypeError, KeyError) as e:
        raise ConfigError("the run's parent process passed no config (it ended before sending it)") from e
    return parse_config(data, source=source, text=text, flags=flags)


def parse_config(data: dict[str, Any], source: str = "<config>", text: str | None = None,
                 flags: dict[str, str] | None = None) -> Config:
    check_strings(data, source, text)
    try:
        config = Config.model_validate(data)
    except ValidationError as e:
        raise _validation_error(e, source, text, flags or {}, data) from e
    config._source, config._text, config._flags = source, text, dict(flags or {})
    _cross_check(config)
    return config


def _validation_error(e: ValidationError, source: str, text: str | None, flags: dict[str, str],
                      data: Any = None) -> ConfigError:
    """The first problem, blamed on the flag that set its field, else on the file and line; an unknown field
    names the nearest known one."""
    err = e.errors()[0]
    field = ".".join(str(x) for x in err["loc"]) or "<root>"
    msg = error_text(err)
    if err["type"] == "extra_forbidden":
        msg += did_you_mean(Config, tuple(err["loc"]), data)
    # The flag whose field is the error's, below it (a wrong value inside it) or above it (`--set foo.bar=1`:
    # the section `foo` is unknown).
    flag = next(((f, dotted) for dotted, f in flags.items()
                 if field == dotted or field.startswith(dotted + ".") or dotted.startswith(field + ".")), None)
    if flag is not None:
        at = "" if flag[1] == field else f"{field}: "
        return ConfigError(f"{flag[0]}: {at}{msg} (got {shown_input(err.get('input'))})")
    more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    return ConfigError(f"{where(source, text, err['loc'])}: {field}: {msg}{more}")


def error_text(err: Any) -> str:
    """A pydantic error's message as the config's errors (and a hazards file's) word it."""
    if err["type"] == "extra_forbidden":
        return "unknown field"
    if err["type"] == "missing":
        return "required field missing"
    return str(err["msg"]).removeprefix("Value error, ")


def did_you_mean(root: type[BaseModel], loc: tuple[Any, ...], data: Any) -> str:
    """`; did you mean max_num_seqs?` for an unknown field at `loc` under `root`: the nearest known field of the
    model it sits in (difflib), empty where none is near or the model is not known (a custom engine's options)."""
    import difflib

    model: type[BaseModel] | None = root
    node = data
    for key in loc[:-1]:
        if isinstance(key, int):  # a list's item: the model stays the item's
            node = node[key] if isinstance(node, list) and 0 <= key < len(node) else None
            continue
        field = model.model_fields.get(str(key)) if model is not None else None
        if field is None:
            return ""
        if model is EngineConfig and key == "options":  # typed by the engine's kind
            model = options_model(str(node.get("kind", "native")) if isinstance(node, dict) else "native")
        else:
            model = _model_in(field.annotation)
        node = node.get(key) if isinstance(node, dict) else None
    if model is None or not loc:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field's annotation holds (`ScheduleConfig`, `SearchConfig | None`, `list[X]`)."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _validation_message(e: ValidationError, under: tuple[str, ...] = ()) -> str:
    """`FIELD: message` of a validation error's first problem, the field's path starting with `under`."""
    err = e.errors()[0]
    field = ".".join([*under, *(str(x) for x in err["loc"])])
    more = f" (and {len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    return f"{field}: {error_text(err)}{more}"


def _cross_check(config: Config) -> None:
    """Checks between fields, each blamed on the field a user would change."""
    s, e = config.schedule, config.engine
    if s.batch_size[1] > e.max_num_seqs:
        raise config.error(("schedule", "batch_size"), f"max {s.batch_size[1]} is above engine.max_num_seqs "
                           f"({e.max_num_seqs}): a trial would not fit one forward pass")
    options = e.typed_options()
    if isinstance(options, NativeOptions) and options.cuda_graphs and not e.device.startswith("cuda"):
        raise config.error(("engine", "options", "cuda_graphs"), f"needs a CUDA device, not engine.device {e.device!r}")
    model = options_model(e.kind)
    if config.checks.tp_parity.requirement != "off" and model is not None \
            and "tensor_parallel_size" not in model.model_fields:
        raise config.error(("checks", "tp_parity"), f"engine kind {e.kind!r} has no engine.options."
                           "tensor_parallel_size: tp_parity compares two tensor-parallel sizes of one engine")


def nesting_depth(value: Any) -> int:
    """Levels of lists and mappings in `value` (0 for a scalar), counted without recursion."""
    depth, level = 0, [(value, 0)]
    while level:
        node, d = level.pop()
        if isinstance(node, (list, dict)):
            depth = max(depth, d + 1)
            level.extend((v, d + 1) for v in (node.values() if isinstance(node, dict) else node))
    return depth


