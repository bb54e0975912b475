"""Seeded random weights for a preset, tensor by tensor.

Each tensor has its own generator, seeded from (seed, tensor name), so a tensor's values do not
depend on which tensors were made before it: an engine can build one layer, or stream a 16 GB
checkpoint, and get the same bits as the file. Values are drawn in float32 on the CPU (CPU and
CUDA generators give different streams) and then cast to the preset's dtype.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator

import torch

from oracle.models.layout import TensorSpec, tensor_layout
from oracle.models.presets import ModelPreset

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}

# Scales, chosen by generating greedily from every preset (12 prompts x 32 tokens) and keeping
# what gave varied text (65-80% distinct tokens, rarely stuck in a loop) with clear but not
# overwhelming winners (median top-1/top-2 logit gap ~1, under 1% of steps within 0.01):
# - every linear has std 1/sqrt(fan_in), so each block adds an update of rms ~1;
# - logits have std ~LOGIT_STD: lm_head (or the tied embedding) has std LOGIT_STD/sqrt(hidden);
# - an untied embedding has rms EMBED_RMS, comparable to the block updates, so the current token
#   still steers the next one;
# - RMS norm weights are 1 plus NORM_NOISE_STD noise, except the final norm, whose weights also
#   get random signs. With tied embeddings the last hidden state still contains the current
#   token's embedding e, and a final norm of all-positive weights scores that token at ~|e|^2
#   above the rest, so the model repeats its input forever (90% of steps did). Random signs
#   make that self-score zero on average.
LOGIT_STD = 4.0
EMBED_RMS = 1.0
NORM_NOISE_STD = 0.1


def tensor_seed(seed: int, name: str) -> int:
    """A 63-bit generator seed for one tensor, stable across processes and platforms."""
    digest = hashlib.sha256(f"oracle-model:{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _random_part_std(preset: ModelPreset, spec: TensorSpec) -> float:
    if spec.role in ("norm", "final_norm"):
        return NORM_NOISE_STD
    if spec.role == "linear":
        return 1.0 / math.sqrt(spec.shape[1])
    if spec.role == "lm_head" or preset.tie_word_embeddings:
        # A tied embedding is the lm_head too, so it sets the logit scale.
        return LOGIT_STD / math.sqrt(preset.hidden_size)
    return EMBED_RMS


def make_tensor(preset: ModelPreset, spec: TensorSpec, seed: int) -> torch.Tensor:
    """One tensor of the checkpoint, in the preset's dtype, on the CPU."""
    generator = torch.Generator(device="cpu").manual_seed(tensor_seed(seed, spec.name))
    values = torch.randn(spec.shape, generator=generator, dtype=torch.float32)
    values.mul_(_random_part_std(preset, spec))
    if spec.role in ("norm", "final_norm"):
        values.add_(1.0)
    if spec.role == "final_norm":
        signs = torch.randint(0, 2, spec.shape, generator=generator, dtype=torch.float32).mul_(2).sub_(1)
        values.mul_(signs)
    return values.to(TORCH_DTYPES[preset.torch_dtype])


def iter_weights(preset: ModelPreset, seed: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor) pairs in file order, made one at a time."""
    for spec in tensor_layout(preset):
        yield spec.name, make_tensor(preset, spec, seed)


def build_state_dict(preset: ModelPreset, seed: int = 0) -> dict[str, torch.Tensor]:
    """All weights in memory, bitwise equal to what make_model writes for the same seed.

    A tied lm_head is not an entry, as in the file: tie it to model.embed_tokens.weight.
    """
    return dict(iter_weights(preset, seed))
