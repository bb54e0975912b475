"""The trained byte-level BPE: exact vocab size, lossless round trips, fixed special ids."""

from __future__ import annotations

import os

import pytest

from oracle.models import build_tokenizer, get_preset
from oracle.models.tokenizer import (
    PLACEHOLDER_TEMPLATE,
    SPECIAL_TOKENS,
    corpus_text,
    special_token_ids,
    tokenizer_json,
)

TEXTS = [
    "The weather over the hills turned grey by noon.",
    "  leading spaces, trailing spaces  \n\nand\ttabs\r\n",
    "Unicode: naïve café, Straße, 日本語, emoji 🙂🚂, math ∑x² ≤ 3.",
    "numbers 0 1 12 123 1234567890 3.14159 -2e-9",
    "code: def f(x):\n    return x ** 2  # square",
    "",
]


@pytest.mark.parametrize("vocab_size", [512, 4096])
@pytest.mark.parametrize("text", TEXTS)
def test_encode_then_decode_gives_the_text_back(vocab_size: int, text: str) -> None:
    tokenizer = build_tokenizer(vocab_size)
    ids = tokenizer.encode(text).ids
    assert all(0 <= i < vocab_size for i in ids)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-llama", "small-qwen3"])
def test_vocab_size_equals_the_config_vocab(preset: str) -> None:
    vocab_size = get_preset(preset).vocab_size
    tokenizer = build_tokenizer(vocab_size)
    assert tokenizer.get_vocab_size() == vocab_size
    assert sorted(tokenizer.get_vocab().values()) == list(range(vocab_size))


def test_special_tokens_are_the_last_three_ids_and_encode_as_one_token() -> None:
    tokenizer = build_tokenizer(512)
    ids = special_token_ids(512)
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [509, 510, 511]
    assert (ids.endoftext, ids.im_start, ids.im_end) == (509, 510, 511)
    encoded = tokenizer.encode("<|im_start|>user\nhi<|im_end|>").ids
    assert encoded[0] == 510 and encoded[-1] == 511


def test_small_vocab_is_fully_trained_without_placeholders() -> None:
    vocab = build_tokenizer(4096).get_vocab()
    assert not any(token.startswith("<|placeholder_") for token in vocab)


def test_a_vocab_larger_than_the_corpus_yields_is_padded_with_unreachable_placeholders() -> None:
    tokenizer = build_tokenizer(20_000)
    assert tokenizer.get_vocab_size() == 20_000
    first = tokenizer.token_to_id(PLACEHOLDER_TEMPLATE.format(0))
    last_regular = 20_000 - len(SPECIAL_TOKENS) - 1
    assert first is not None and 4_000 < first < last_regular
    assert str(tokenizer.id_to_token(last_regular)).startswith("<|placeholder_")
    # Placeholders never come out of encoding, but decode to their text when a model emits them.
    text = PLACEHOLDER_TEMPLATE.format(0)
    assert first not in tokenizer.encode(text).ids
    assert tokenizer.decode([first]) == text


def test_learned_merges_come_first_and_catch_common_words() -> None:
    tokenizer = build_tokenizer(4096)
    for word in [" the", " weather", " computer", " bread"]:
        assert len(tokenizer.encode(word).ids) == 1, word


def test_training_leaves_the_environment_as_it_found_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    tokenizer_json.cache_clear()
    from oracle.models import tokenizer as module

    module._trained_bpe_json.cache_clear()
    build_tokenizer(600)
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"
    assert "RAYON_NUM_THREADS" not in os.environ


def test_corpus_is_shipped_and_substantial() -> None:
    text = corpus_text()
    assert len(text.encode("utf-8")) > 30_000
    assert "<|" not in text  # no clash with special or placeholder tokens
