"""What a model's config.json says of its attention layers: a sliding window, and layers that are not full
attention (linear attention such as Gated DeltaNet, Mamba), read from the parsed file; no torch.

Two uses: the known hazards' `model.sliding_window` and `model.linear_attention` facts, and the
`prefill_decode` check, which is not applicable where prefill and decode differ by construction (a window
that decode slides and prefill masks, a recurrent state that prefill computes in chunks and decode step by
step; vLLM PR #55138).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PREFILL_DECODE_REF = "https://github.com/vllm-project/vllm/pull/55138"
_FULL = ("full_attention", "attention", "global_attention", "global")
_LINEAR = ("linear", "mamba", "delta", "gdn", "ssm", "recurrent")  # a layer kind with a recurrent state


@dataclass(frozen=True)
class AttentionLayout:
    sliding_window: int | None  # tokens a windowed layer attends over; None: no layer has a window
    other_layers: tuple[str, ...]  # layer kinds besides full attention (`linear_attention`, `mamba`, ...)

    @property
    def linear_attention(self) -> bool:
        return any(any(word in kind for word in _LINEAR) for kind in self.other_layers)

    def hazard_facts(self) -> dict[str, Any]:
        return {"sliding_window": self.sliding_window or 0, "linear_attention": self.linear_attention}

    def prefill_decode_differs(self) -> str | None:
        """Why prefill and decode of this model are expected to differ by construction, or None."""
        if self.linear_attention:
            kinds = ", ".join(k for k in self.other_layers if any(w in k for w in _LINEAR))
            return (f"the model has {kinds} layers, whose state prefill computes in chunks and decode token by "
                    f"token: they differ by construction ({PREFILL_DECODE_REF})")
        if self.sliding_window is not None:
            return (f"the model attends over a sliding window of {self.sliding_window} tokens, which prefill masks "
                    f"and decode slides: they differ by construction ({PREFILL_DECODE_REF})")
        return None


def _window(cfg: dict[str, Any]) -> int | None:
    value = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False or isinstance(value, bool) or not isinstance(value, int):
        return None  # Qwen2/Qwen3 configs name a window they do not use
    return value if value > 0 else None


def _kinds(cfg: dict[str, Any]) -> set[str]:
    out: set[str] = set()
    for key in ("layer_types", "layers_block_type"):
        value = cfg.get(key)
        if isinstance(value, list):
            out.update(str(k).lower() for k in value if str(k).lower() not in _FULL)
    pattern = cfg.get("hybrid_override_pattern")  # Nemotron-H: M mamba, * attention, - MLP
    if isinstance(pattern, str) and "M" in pattern:
        out.add("mamba")
    return out


def attention_layout(raw: dict[str, Any]) -> AttentionLayout:
    """The layout config.json gives (a multimodal model's `text_config` too); unknown keys are no layers."""
    configs = [raw] + ([raw["text_config"]] if isinstance(raw.get("text_config"), dict) else [])
    windows = [w for c in configs if (w := _window(c)) is not None]
    kinds = set().union(*(_kinds(c) for c in configs))
    return AttentionLayout(min(windows) if windows else None, tuple(sorted(kinds)))
