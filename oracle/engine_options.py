"""The typed `engine.options` of the built-in engine kinds, and the options model of a kind by its name.

Below both the config (which validates `engine.options` against the kind's model) and the engine rows
(`oracle.engines.kinds`, whose rows carry the model): it imports neither, so each of them imports it.
A built-in kind's model is `OPTIONS[kind]`; a kind installed through the `oracle.engines` entry point
declares its own in its row (`EngineKind.options`), read here without building the row.
"""

from __future__ import annotations

import importlib.metadata
import ipaddress
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from oracle.strict_numbers import refuse_bools

ENTRY_POINT_GROUP = "oracle.engines"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    _no_bools = field_validator("*", mode="before")(classmethod(refuse_bools))  # `concurrency: true` is no count


class NativeOptions(_Strict):
    """engine.options of the native engine."""

    stop_at_eos: bool = Field(False, description="finish a request at the model's EOS token (off: exactly max_tokens)")
    cuda_graphs: bool | None = Field(
        None, description="decode steps replay CUDA graphs (CUDA devices only); null: on where engine.device is CUDA")
    fused_kernels: bool = Field(
        True, description="invariant mode on CUDA in bf16/fp16 runs the decoder's norm, rotary, activation and "
                          "sampling chains as one Triton kernel each, bitwise the composed ops "
                          "(tests/gpu/test_fused_cuda.py and test_sampling_cuda.py); false: the composed ops")
    overlap_steps: bool = Field(
        True, description="the host schedules and launches step N+1 before step N's tokens reach it (they go from "
                          "step N's rows to step N+1's inputs on the device; the same inputs, the same outputs); off "
                          "where a sequence may stop at a token, under per-op capture and at tensor parallel > 1; "
                          "false: one step at a time")
    tensor_parallel_size: int = Field(
        1, ge=1, description="ranks the model is sharded over (CPU, one process each, all-reduce over gloo); must "
                             "divide the model's attention heads, kv heads and intermediate size")


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
    start_together: bool = Field(
        False, description="on a GPU, both modes' engines start at once, each with a KV cache sized from the config "
                           "(max_num_seqs sequences of max_model_len tokens, within 40% of the GPU less the weights) "
                           "instead of one measured from the free memory, which the other start would change; off: "
                           "production's engine starts once invariant's is up (oracle.engines.vllm_memory)")
    start_timeout_s: float = Field(300.0, gt=0, description="seconds a worker may take to start")
    timeout_s: float = Field(600.0, gt=0, description="seconds one generate call may take")
    log_level: str = Field("WARNING", description="vLLM's logging level in the worker")

    def mode_env(self, mode: str) -> dict[str, str]:
        """What a mode adds to the worker's environment: vLLM's own invariant mode is turned on by a variable."""
        return {"VLLM_BATCH_INVARIANT": "1"} if mode == "invariant" and self.invariance == "vllm" else {}
    engine_args: dict[str, Any] = Field(default_factory=dict, description="extra vllm.EngineArgs fields")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables of the worker")
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM's tensor-parallel ranks (one process each)")
    pipeline_parallel_size: int = Field(1, ge=1, description="vLLM's pipeline stages (one process each)")


class ModeURLs(_Strict):
    """One pre-started server per mode: the invariant-mode server and the production-mode server."""

    invariant: str | list[str] = Field(
        description="URL of the server started in invariant mode (e.g. VLLM_BATCH_INVARIANT=1); a list of URLs: "
                    "separately started servers of the mode, the first for the run, the second for cross_instance")
    production: str | list[str] = Field(description="URL of the server started with default kernels (or a list)")

    @field_validator("invariant", "production")
    @classmethod
    def _http(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list):
            if not v:
                raise ValueError("the list of URLs is empty")
            return [_http_url(u) for u in v]
        return _http_url(v)


def _field_error(field: str, message: str, value: Any) -> ValidationError:
    """A validation error at `field` of the model being validated, for checks across its fields (a
    model validator's own errors name no field)."""
    return ValidationError.from_exception_data(
        "options", [InitErrorDetails(type=PydanticCustomError("value_error", message), loc=(field,), input=value)])


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
    prefix_cache_reset: Literal["off", "cache_salt", "flush_cache", "reset_prefix_cache"] = Field(
        "off", description="how a trial starts from a cold server prefix cache (the prefix_cache check needs "
                           "one): cache_salt (vLLM: a fresh cache_salt per trial), flush_cache (SGLang: POST "
                           "/flush_cache), reset_prefix_cache (vLLM with VLLM_SERVER_DEV_MODE=1); off: never "
                           "reset, prefix_cache skipped. Hits are read from usage.prompt_tokens_details."
                           "cached_tokens (vLLM --enable-prompt-tokens-details, SGLang --enable-cache-report)")

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
            raise _field_error("base_url", "give base_url or command, not both", self.base_url)
        if self.base_url is None and not self.command:
            raise _field_error("base_url", "give base_url (running servers) or command (to start one per mode)", None)
        problem = _non_loopback(self.command or [])
        if problem is not None:
            raise _field_error("command", problem, self.command)
        return self


def _non_loopback(command: list[str]) -> str | None:
    """Why `command` could start a server that listens beyond 127.0.0.1, or None: it must bind {host} and
    name no other address.

    A server on 0.0.0.0 would expose an unauthenticated model server to the runner's network for the
    run. oracle cannot rewrite an arbitrary server's flags (each spells its bind option its own way,
    and env vars or config files can set it too), so it refuses instead: here any IP literal that is
    not loopback (0.0.0.0, ::, a LAN address), as an argument or the value of `--flag=VALUE`; and
    once the server answers, the openai engine checks what it really bound.
    """
    if command and not any("{host}" in c for c in command):
        return "must bind the server to {host} (oracle starts servers on 127.0.0.1 only)"
    for item in command:
        value = item.rpartition("=")[2] if item.startswith("-") else item
        try:
            address = ipaddress.ip_address(value.strip("[]"))
        except ValueError:
            continue
        if not address.is_loopback:
            return f"{item!r} binds {address}, not loopback; oracle starts servers on 127.0.0.1 only: pass {{host}} instead"
    return None


# The built-in kinds' options, by kind: their rows (`oracle.engines.kinds.BUILTIN`) carry the same model.
OPTIONS: dict[str, type[BaseModel]] = {
    "native": NativeOptions, "transformers": TransformersOptions, "vllm": VllmOptions, "openai": OpenAIOptions}


def entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """The installed `oracle.engines` entry points by name (the first one of a name wins, as importlib orders them)."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep)
    return found


def options_model(kind: str) -> type[BaseModel] | None:
    """The typed options of `kind`: a built-in kind's, or the `options` of the row an installed entry point
    declares. None: free keyword arguments (a `module:Class`, an entry point naming a class) or a kind not
    known here (or one whose entry point cannot be loaded), which building its row names as such."""
    if kind in OPTIONS:
        return OPTIONS[kind]
    ep = None if ":" in kind else entry_points().get(kind)
    if ep is None:
        return None
    try:
        target = ep.load()
    except Exception:  # noqa: BLE001 - an installed package may raise anything while importing; the row says so
        return None
    model = None if isinstance(target, type) else getattr(target, "options", None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None
