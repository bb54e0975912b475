"""A byte-level BPE tokenizer trained on the shipped corpus, sized to a preset's vocab exactly.

Layout of the ids, for a vocab of V:
  [0, 256)            the 256 byte tokens (so every string encodes, and decodes back unchanged)
  [256, N)            merges learned from corpus.txt, as many as fit (the corpus yields ~4,000)
  [N, V - 3)          placeholders `<|placeholder_K|>`, only when the corpus runs out of merges;
                      they are ordinary vocab entries that no merge reaches, so encoding never
                      produces them, but a model can generate them and they decode to their text
  V-3, V-2, V-1       <|endoftext|>, <|im_start|>, <|im_end|>
The tokenizer depends on the vocab size only, never on the seed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from oracle.models.presets import ModelPreset

SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PLACEHOLDER_TEMPLATE = "<|placeholder_{}|>"

# ChatML, the format Qwen models use, so that chat endpoints (vllm serve) work on these models.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class SpecialTokenIds:
    endoftext: int
    im_start: int
    im_end: int


def special_token_ids(vocab_size: int) -> SpecialTokenIds:
    """Where the special tokens sit: the last three ids of the vocab."""
    return SpecialTokenIds(endoftext=vocab_size - 3, im_start=vocab_size - 2, im_end=vocab_size - 1)


def corpus_text() -> str:
    """The training text shipped with the package (original prose written for oracle)."""
    return resources.files("oracle.models").joinpath("corpus.txt").read_text(encoding="utf-8")


@contextmanager
def _single_threaded_tokenizers() -> Iterator[None]:
    """Train without rayon threads, restoring the environment after.

    Training was measured deterministic across thread counts; this keeps merge ties from ever
    depending on thread timing. TOKENIZERS_PARALLELISM is read on every call, whereas
    RAYON_NUM_THREADS only counts if the thread pool has not started yet.
    """
    saved = {key: os.environ.get(key) for key in ("TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS")}
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["RAYON_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@lru_cache(maxsize=8)
def _trained_bpe_json(max_tokens: int) -> str:
    """A BPE of at most `max_tokens` tokens (bytes + merges) trained on the corpus, as JSON."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=max_tokens,
        min_frequency=0,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    with _single_threaded_tokenizers():
        tokenizer.train_from_iterator([corpus_text()], trainer=trainer)
    return tokenizer.to_str()


@lru_cache(maxsize=8)
def tokenizer_json(vocab_size: int) -> str:
    """The contents of tokenizer.json for a vocab of exactly `vocab_size` ids."""
    num_regular = vocab_size - len(SPECIAL_TOKENS)
    data: dict[str, Any] = json.loads(_trained_bpe_json(num_regular))
    vocab: dict[str, int] = data["model"]["vocab"]
    placeholders = (PLACEHOLDER_TEMPLATE.format(k) for k in range(num_regular))
    while len(vocab) < num_regular:
        token = next(placeholders)
        if token not in vocab:
            vocab[token] = len(vocab)
    tokenizer = Tokenizer.from_str(json.dumps(data))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    ids = special_token_ids(vocab_size)
    actual = tuple(tokenizer.token_to_id(t) for t in SPECIAL_TOKENS)
    if actual != (ids.endoftext, ids.im_start, ids.im_end) or tokenizer.get_vocab_size() != vocab_size:
        raise RuntimeError(
            f"tokenizer layout is off: special ids {actual}, size {tokenizer.get_vocab_size()}"
        )
    return str(tokenizer.to_str(pretty=True)) + "\n"


def build_tokenizer(vocab_size: int) -> Tokenizer:
    """A fresh Tokenizer with exactly `vocab_size` ids (callers may mutate it)."""
    return Tokenizer.from_str(tokenizer_json(vocab_size))


def make_tokenizer_config_dict(preset: ModelPreset) -> dict[str, Any]:
    """The contents of tokenizer_config.json.

    `PreTrainedTokenizerFast` rather than `Qwen2Tokenizer`: transformers 5 rebuilds a
    Qwen2Tokenizer's pre-tokenizer from its own defaults, while the generic class uses
    tokenizer.json as written.
    """
    ids = special_token_ids(preset.vocab_size)
    added = {
        str(token_id): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for token, token_id in zip(SPECIAL_TOKENS, (ids.endoftext, ids.im_start, ids.im_end), strict=True)
    }
    return {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": preset.max_position_embeddings,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
