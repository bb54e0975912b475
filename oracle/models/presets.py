"""Named model shapes that `oracle model make` turns into seeded random checkpoints.

A preset fixes every dimension of the checkpoint; the seed fixes the weights. The tokenizer
depends on `vocab_size` only, so two presets with the same vocab share a tokenizer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from oracle.errors import ConfigError
from oracle.models.layout import tensor_layout

Architecture = Literal["qwen3", "llama"]
TorchDtype = Literal["float32", "bfloat16", "float16"]

ARCHITECTURES: tuple[Architecture, ...] = ("qwen3", "llama")
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}

# The tokenizer needs all 256 byte tokens plus its three special tokens.
MIN_VOCAB_SIZE = 256 + 3


@dataclass(frozen=True)
class ModelPreset:
    """The shape of a decoder-only transformer, in Hugging Face config terms."""

    name: str
    architecture: Architecture
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    tie_word_embeddings: bool
    torch_dtype: TorchDtype
    description: str = ""

    def __post_init__(self) -> None:
        # A user can build a preset by hand and pass it to make_model, so this is user input.
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(
                f"preset {self.name!r}: architecture {self.architecture!r} is not one of {', '.join(ARCHITECTURES)}"
            )
        if self.torch_dtype not in DTYPE_BYTES:
            raise ConfigError(
                f"preset {self.name!r}: torch_dtype {self.torch_dtype!r} is not one of {', '.join(DTYPE_BYTES)}"
            )
        for field_name in (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            if getattr(self, field_name) <= 0:
                raise ConfigError(f"preset {self.name!r}: {field_name} must be positive")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ConfigError(
                f"preset {self.name!r}: num_attention_heads ({self.num_attention_heads}) must be a multiple "
                f"of num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2 != 0:
            raise ConfigError(f"preset {self.name!r}: head_dim must be even for rotary embeddings")
        if self.vocab_size < MIN_VOCAB_SIZE:
            raise ConfigError(f"preset {self.name!r}: vocab_size must be at least {MIN_VOCAB_SIZE}")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ConfigError(f"preset {self.name!r}: rope_theta and rms_norm_eps must be positive")

    @property
    def num_parameters(self) -> int:
        """Parameters stored in the checkpoint (a tied lm_head is not stored twice)."""
        return sum(spec.numel for spec in tensor_layout(self))

    @property
    def num_bytes(self) -> int:
        """Bytes of tensor data in model.safetensors (the header adds a few KB)."""
        return self.num_parameters * DTYPE_BYTES[self.torch_dtype]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            name="tiny-qwen3",
            architecture="qwen3",
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=512,
            max_position_embeddings=4096,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            torch_dtype="float32",
            description="Qwen3, 0.1M parameters: a CPU check in seconds",
        ),
        ModelPreset(
            name="tiny-llama",
            architecture="llama",
            hidden_size=64,
            intermediate_size=176,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            vocab_size=512,
            max_position_embeddings=4096,
            rope_theta=500_000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            torch_dtype="float32",
            description="Llama, untied embeddings, 0.1M parameters: a CPU check in seconds",
        ),
        ModelPreset(
            name="small-qwen3",
            architecture="qwen3",
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=4,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=64,
            vocab_size=4096,
            max_position_embeddings=8192,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            torch_dtype="float32",
            description="Qwen3, 55M parameters: big enough that CPU matmul kernels change with the batch",
        ),
        ModelPreset(
            name="qwen3-8b-shape",
            architecture="qwen3",
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            vocab_size=151936,
            max_position_embeddings=40960,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            torch_dtype="bfloat16",
            description="Qwen3-8B's exact shapes with random weights (16 GB): GPU benchmarks",
        ),
    )
}


def get_preset(name: str) -> ModelPreset:
    """The preset called `name`; ConfigError listing the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model preset {name!r}; known presets: {', '.join(PRESETS)}") from None
