"""Which checkpoints the native engine runs, decided from config.json alone (no torch, no weights).

The native decoder is one layout: RMS norm, rotary embeddings (rotate-half, no scaling), grouped
query attention, a SiLU-gated MLP. Four Hugging Face architectures are that layout:

| architecture | differences |
| --- | --- |
| `Qwen3ForCausalLM` | RMS norm on each head's queries and keys (qk-norm) |
| `Qwen2ForCausalLM` | biases on the q, k and v projections; no qk-norm |
| `LlamaForCausalLM` | optional `attention_bias` |
| `MistralForCausalLM` | Llama's layout; sliding window off (`sliding_window: null`) |

Anything else (or these with rope scaling, a sliding window, another activation) is refused
before a run starts, with a pointer to the engines that run any transformers model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from oracle.errors import ModelError

if TYPE_CHECKING:
    from oracle.models.facts import ModelFacts

NATIVE_ARCHITECTURES = {
    "Qwen3ForCausalLM": "qwen3",
    "Qwen2ForCausalLM": "qwen2",
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
}
OTHER_ENGINES = "use engine.kind: transformers (any transformers model) or vllm / openai (a vLLM or SGLang server)"


def rope_theta(raw: dict[str, Any]) -> float:
    """`rope_theta` (transformers 4 form) or `rope_parameters.rope_theta` (transformers 5 form)."""
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(raw.get("rope_theta", 10000.0))


def _rope_type(raw: dict[str, Any]) -> str:
    for key in ("rope_scaling", "rope_parameters"):
        value = raw.get(key)
        if isinstance(value, dict):
            kind = value.get("rope_type") or value.get("type") or "default"
            if kind != "default":
                return str(kind)
    return "default"


def _lacks_dimensions(raw: dict[str, Any], arch: str) -> str | None:
    missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads") if k not in raw]
    return f"{(raw.get('architectures') or [])[0]} config lacks {', '.join(missing)}" if missing else None


def _scaled_rope(raw: dict[str, Any], arch: str) -> str | None:
    kind = _rope_type(raw)
    return f"rope scaling {kind!r} is not supported by the native engine (plain rotary only)" \
        if kind != "default" else None


def _other_activation(raw: dict[str, Any], arch: str) -> str | None:
    act = raw.get("hidden_act", "silu")
    return f"hidden_act {act!r} is not supported by the native engine (silu only)" if act != "silu" else None


def _sliding_window(raw: dict[str, Any], arch: str) -> str | None:
    """A window shorter than the context (Mistral's is on unless `use_sliding_window: false`)."""
    window = raw.get("sliding_window")
    sliding = raw.get("use_sliding_window", arch == "mistral")
    limit = int(raw.get("max_position_embeddings", 0) or 0)
    if sliding and window is not None and int(window) < limit:
        return (f"a sliding window of {window} tokens is not supported by the native engine "
                f"(set sliding_window: null or use_sliding_window: false)")
    return None


def _mlp_bias(raw: dict[str, Any], arch: str) -> str | None:
    return "mlp_bias is not supported by the native engine" if raw.get("mlp_bias") else None


# What keeps a checkpoint of a native architecture off the native decoder, checked in this order.
_LAYOUT_CHECKS: tuple[Callable[[dict[str, Any], str], str | None], ...] = (
    _lacks_dimensions, _scaled_rope, _other_activation, _sliding_window, _mlp_bias,
)


def native_layout_problem(raw: dict[str, Any]) -> str | None:
    """Why the native decoder cannot run this config.json, or None when it can."""
    archs = raw.get("architectures") or []
    arch = next((NATIVE_ARCHITECTURES[a] for a in archs if a in NATIVE_ARCHITECTURES), None)
    if arch is None:
        return f"architectures {archs} are not supported by the native engine (supported: {', '.join(NATIVE_ARCHITECTURES)})"
    for check in _LAYOUT_CHECKS:
        problem = check(raw, arch)
        if problem is not None:
            return problem
    return None


def native_architecture(facts: ModelFacts) -> str:
    """The native layout name ("qwen3", "qwen2", "llama", "mistral"); ModelError naming the file otherwise."""
    raw = facts.config_json()
    problem = native_layout_problem(raw)
    if problem is not None:
        raise ModelError(f"{facts.path}: {problem}; {OTHER_ENGINES}")
    archs = raw.get("architectures") or []
    return next(NATIVE_ARCHITECTURES[a] for a in archs if a in NATIVE_ARCHITECTURES)
