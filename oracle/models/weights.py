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

# Why these scales: with every linear at std 1/sqrt(fan_in), each block adds an update of rms ~1
# to the residual stream, which dwarfs an embedding of rms EMBED_RMS. So the last hidden state is
# shaped by attention and MLP rather than by the current token, and a tied model does not just
# predict its input token again (the usual failure of random models). After the final norm the
# logits have std ~LOGIT_STD: greedy picks have clear winners most steps, with some near-ties
# left for batch-variant kernels to flip.
EMBED_RMS = 0.1
LOGIT_STD = 4.0
NORM_NOISE_STD = 0.1


def tensor_seed(seed: int, name: str) -> int:
    """A 63-bit generator seed for one tensor, stable across processes and platforms."""
    digest = hashlib.sha256(f"oracle-model:{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def init_std(preset: ModelPreset, spec: TensorSpec) -> float:
    """The standard deviation of the random part of a tensor."""
    if spec.role == "norm":
        return NORM_NOISE_STD
    if spec.role == "linear":
        return 1.0 / math.sqrt(spec.shape[1])
    if spec.role == "lm_head":
        return LOGIT_STD / math.sqrt(preset.hidden_size)
    # The embedding doubles as lm_head when tied, so it then sets the logit scale too.
    if preset.tie_word_embeddings:
        return LOGIT_STD / math.sqrt(preset.hidden_size)
    return EMBED_RMS


def make_tensor(preset: ModelPreset, spec: TensorSpec, seed: int) -> torch.Tensor:
    """One tensor of the checkpoint, in the preset's dtype, on the CPU."""
    generator = torch.Generator(device="cpu").manual_seed(tensor_seed(seed, spec.name))
    values = torch.randn(spec.shape, generator=generator, dtype=torch.float32)
    values.mul_(init_std(preset, spec))
    if spec.role == "norm":
        values.add_(1.0)
    return values.to(TORCH_DTYPES[preset.torch_dtype])


def iter_weights(preset: ModelPreset, seed: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, tensor) pairs in file order, made one at a time."""
    for spec in tensor_layout(preset):
        yield spec.name, make_tensor(preset, spec, seed)


def build_state_dict(preset: ModelPreset, seed: int = 0) -> dict[str, torch.Tensor]:
    """All weights in memory, bitwise equal to what make_model writes for the same seed.

    A tied lm_head is not a separate entry, as in the file; load with strict=False or tie it.
    """
    return dict(iter_weights(preset, seed))
