"""The model's facts, read from its config.json once per run: the architecture, the dimensions, the
vocabulary and the context length (no torch, no weights).

`read_model_facts` reads the file once and keeps what each fact needs; the plan builds one `ModelFacts`
and hands it on (prompts, probes, hazards, the size check), so none of the plan's readers opens
config.json again. (An engine is given only the model's folder: the native loader reads the facts once
per engine it builds, and `oracle merge` once for its checks.) A fact
the file does not give is None, never guessed. Each way of using the file keeps its own error, raised when
that use asks for it, so a model that a run never needs a fact of is not refused for lacking it:

| use | asks | error (ModelError naming the file, the field) |
| --- | --- | --- |
| the native engine's architecture, tensor parallelism | `config_json()` | no config.json, not JSON, not an object |
| random or token-id prompts, fillers | `require_vocab_size()` | vocab_size missing, not an integer, out of range |
| the size and memory check | `require_dims()` | a dimension that is not a positive integer |
| the context check, probes, hazards | the fields | none: an unreadable fact is None |
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oracle.errors import ConfigError, ModelError
from oracle.models.layers import AttentionLayout, attention_layout
from oracle.models.size import ModelDims, read_dims

CONFIG_FILE = "config.json"
MAX_CONFIG_BYTES = 16 << 20  # beyond any model's config.json: a wrong file
MAX_VOCAB = 1 << 24  # beyond any model's vocabulary (the largest are about 256k)
# Keys Hugging Face configs use for the context length, most common first.
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


@dataclass(frozen=True)
class ModelFacts:
    """What a run knows of its model from config.json (None: the file does not give it)."""

    model_dir: Path
    architecture: str | None  # the first of `architectures`
    vocab_size: int | None
    hidden_size: int | None
    intermediate_size: int | None
    num_hidden_layers: int | None
    num_attention_heads: int | None
    num_key_value_heads: int | None  # the attention heads where config.json gives no KV heads
    head_dim: int | None  # hidden_size // heads where config.json gives none
    context: int | None  # the context length config.json declares
    gqa_ratio: int | None  # query heads per KV head
    # Why the folder is not a checkpoint as far as config.json tells (`has no config.json`, ...; None: it is).
    checkpoint_problem: str | None = None
    # The parsed file and why each use of it fails (None: it does not), raised by the methods below.
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    read_error: ModelError | None = field(default=None, repr=False)
    vocab_error: ModelError | None = field(default=None, repr=False)
    dims: ModelDims | None = field(default=None, repr=False)
    dims_error: ModelError | None = field(default=None, repr=False)

    @property
    def path(self) -> Path:
        return self.model_dir / CONFIG_FILE

    def config_json(self) -> dict[str, Any]:
        """The parsed config.json; ModelError naming the file when it is missing, not JSON or not an object."""
        if self.read_error is not None:
            raise self.read_error
        return self.raw

    def require_vocab_size(self) -> int:
        """config.json's `vocab_size`: an integer in [1, MAX_VOCAB], else ModelError naming the file."""
        if self.vocab_error is not None:
            raise self.vocab_error
        assert self.vocab_size is not None  # no error: read_model_facts set it
        return self.vocab_size

    def require_dims(self) -> ModelDims:
        """The dimensions of config.json (oracle.models.size); ModelError naming the file and the key for a
        value that is not a positive integer."""
        self.config_json()
        if self.dims_error is not None:
            raise self.dims_error
        assert self.dims is not None  # no error: read_model_facts set it
        return self.dims

    def hazard_facts(self) -> dict[str, Any]:
        """What a hazard's condition may ask of the model: head_dim, heads, KV heads, their ratio (GQA), the
        architecture, sliding_window (0: none), linear_attention; {} when config.json cannot be read."""
        if self.read_error is not None or self.dims is None:
            return {}
        facts: dict[str, Any] = {"head_dim": self.head_dim, "num_attention_heads": self.num_attention_heads,
                                 "num_key_value_heads": self.num_key_value_heads, "architecture": self.architecture}
        if self.gqa_ratio is not None:
            facts["gqa_ratio"] = self.gqa_ratio
        return {**facts, **self.layout.hazard_facts()}

    @property
    def layout(self) -> AttentionLayout:
        """Its attention layers as config.json gives them: a sliding window, linear-attention layers."""
        return attention_layout(self.raw)


def read_model_facts(model_dir: Path) -> ModelFacts:
    """The facts of the model in `model_dir`, its config.json read once (at most MAX_CONFIG_BYTES, a regular
    file). Never raises: each use's error is kept for when it is asked for."""
    from oracle.files import read_regular

    path = model_dir / CONFIG_FILE
    present = path.is_file()
    data: Any = None
    failure: BaseException | None = None
    try:
        data = json.loads(read_regular(path, MAX_CONFIG_BYTES, "model config").decode("utf-8"))
    except (ConfigError, OSError, ValueError, RecursionError) as e:  # ValueError: not UTF-8, not JSON
        failure = e
    raw: dict[str, Any] = data if failure is None and isinstance(data, dict) else {}
    read_error = _read_error(path, present, failure, data)
    vocab, vocab_error = _vocab(path, failure, data)
    dims: ModelDims | None = None
    dims_error: ModelError | None = None
    if read_error is None:
        try:
            dims = read_dims(raw, path)
        except ModelError as e:
            dims_error = e
    heads = dims.get("num_attention_heads") if dims else None
    kv = (dims.get("num_key_value_heads") if dims else None) or heads
    hidden = dims.get("hidden_size") if dims else None
    head_dim = (dims.get("head_dim") if dims else None) or (hidden // heads if hidden and heads else None)
    architectures = raw.get("architectures")
    return ModelFacts(
        model_dir=model_dir,
        architecture=architectures[0] if isinstance(architectures, list) and architectures else None,
        vocab_size=vocab, hidden_size=hidden,
        intermediate_size=dims.get("intermediate_size") if dims else None,
        num_hidden_layers=dims.get("num_hidden_layers") if dims else None,
        num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim, context=_context(raw),
        gqa_ratio=heads // kv if heads and kv else None,
        checkpoint_problem=_checkpoint_problem(present, failure, data), raw=raw, read_error=read_error, vocab_error=vocab_error, dims=dims, dims_error=dims_error,
    )


def _checkpoint_problem(present: bool, failure: BaseException | None, data: Any) -> str | None:
    if not present:
        return f"has no {CONFIG_FILE}"
    if failure is not None:
        return f"has an unreadable {CONFIG_FILE} ({failure})"
    if not isinstance(data, dict):
        return f"has a {CONFIG_FILE} that is not a JSON object"
    return None


def _read_error(path: Path, present: bool, failure: BaseException | None, data: Any) -> ModelError | None:
    if not present:
        return ModelError(f"{path}: no config.json; make a model with `oracle model make PRESET DIR`")
    if isinstance(failure, ConfigError):  # an absurd size
        return ModelError(str(failure))
    if failure is not None:
        return ModelError(f"{path}: not valid JSON ({failure})")
    if not isinstance(data, dict):
        return ModelError(f"{path}: not a JSON object")
    return None


def _vocab(path: Path, failure: BaseException | None, data: Any) -> tuple[int | None, ModelError | None]:
    if isinstance(failure, ConfigError):  # a FIFO or a device in the model's place, or an absurd size
        return None, ModelError(str(failure))
    if failure is not None:
        return None, ModelError(f"{path}: cannot read vocab_size ({reason(failure)})")
    if not isinstance(data, dict) or "vocab_size" not in data:
        return None, ModelError(f"{path}: vocab_size: required field missing")
    vocab = data["vocab_size"]
    if isinstance(vocab, bool) or not isinstance(vocab, int):
        return None, ModelError(f"{path}: vocab_size: must be an integer (got {shown(vocab)})")
    if not 1 <= vocab <= MAX_VOCAB:
        return None, ModelError(f"{path}: vocab_size: must be in [1, {MAX_VOCAB:,}] (got {vocab:,})")
    return vocab, None


def _context(raw: dict[str, Any]) -> int | None:
    for key in CONTEXT_KEYS:
        value = raw.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def shown(value: Any) -> str:
    """A value for an error message: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def reason(e: BaseException) -> str:
    """An exception's first line, at most 200 characters, for an error message."""
    lines = str(e).strip().splitlines()
    return (lines[0] if lines else type(e).__name__)[:200]
