"""Made checkpoints load in Hugging Face transformers unchanged: no missing or unexpected keys,
the same weights bit for bit, the same tokenization, and greedy generation that runs."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

from oracle.models import build_state_dict, get_preset, make_config_dict, make_model
from oracle.models.layout import tensor_layout

pytestmark = pytest.mark.slow

TEXTS = [
    "The weather over the hills turned grey by noon.",
    "  two spaces, a tab\tand a newline\n",
    "Unicode: naïve café, 日本語, 🙂.",
    "<|im_start|>user\nWhat is a token?<|im_end|>\n",
]
# Words transformers logs when a checkpoint and a model class disagree.
KEY_WARNINGS = ("missing", "unexpected", "newly initialized", "not used", "mismatch")


@pytest.fixture(scope="module")
def transformers() -> Iterator[ModuleType]:
    """transformers, kept off the network: HF_HUB_OFFLINE is set for this module, then restored."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        module = pytest.importorskip("transformers")
        # The hub reads the variable once at import; if it was imported earlier, set it directly.
        constants = pytest.importorskip("huggingface_hub.constants")
        mp.setattr(constants, "HF_HUB_OFFLINE", True)
        yield module


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    return {name: make_model(name, root / name, seed=0) for name in ("tiny-qwen3", "tiny-llama")}


def load_with_key_warnings(
    transformers: ModuleType,
    model_dir: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[object, dict[str, object], list[str]]:
    """from_pretrained, plus its loading info and the warnings it logged about keys."""
    # transformers' logger does not propagate to the root logger that caplog listens on.
    monkeypatch.setattr(logging.getLogger("transformers"), "propagate", True)
    with caplog.at_level(logging.WARNING):
        model, info = transformers.AutoModelForCausalLM.from_pretrained(model_dir, output_loading_info=True)
    warnings = [
        r.getMessage() for r in caplog.records if any(w in r.getMessage().lower() for w in KEY_WARNINGS)
    ]
    return model, {k: v for k, v in info.items() if v}, warnings


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-llama"])
def test_model_loads_with_no_missing_or_unexpected_keys(
    transformers: ModuleType,
    made: dict[str, Path],
    preset: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, info, warnings = load_with_key_warnings(transformers, made[preset], caplog, monkeypatch)
    assert info == {}
    assert warnings == []
    expected_class = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}[
        get_preset(preset).architecture
    ]
    assert type(model).__name__ == expected_class
    assert model.dtype == torch.float32  # type: ignore[attr-defined]


def test_a_damaged_checkpoint_would_be_caught(
    transformers: ModuleType,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check above can fail: drop one tensor and rename another, and both are reported."""
    model_dir = make_model("tiny-llama", tmp_path / "damaged")
    weights = build_state_dict(get_preset("tiny-llama"))
    weights["model.final_norm.weight"] = weights.pop("model.norm.weight")
    save_file(weights, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    _, info, warnings = load_with_key_warnings(transformers, model_dir, caplog, monkeypatch)
    assert info["missing_keys"] == {"model.norm.weight"}
    assert info["unexpected_keys"] == {"model.final_norm.weight"}
    assert warnings != []


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-llama"])
def test_loaded_parameters_equal_the_seeded_weights_bitwise(
    transformers: ModuleType, made: dict[str, Path], preset: str
) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(made[preset])
    params = dict(model.named_parameters(remove_duplicate=False))
    for name, tensor in build_state_dict(get_preset(preset), seed=0).items():
        assert torch.equal(params[name].detach(), tensor), name
    if get_preset(preset).tie_word_embeddings:
        assert torch.equal(params["lm_head.weight"], params["model.embed_tokens.weight"])


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-llama"])
def test_greedy_generation_is_repeatable_and_varied(
    transformers: ModuleType, made: dict[str, Path], preset: str
) -> None:
    model = transformers.AutoModelForCausalLM.from_pretrained(made[preset])
    tokenizer = transformers.AutoTokenizer.from_pretrained(made[preset])
    inputs = tokenizer("Cooking for a crowd starts with a calm plan.", return_tensors="pt")
    runs = [
        model.generate(**inputs, max_new_tokens=16, do_sample=False, eos_token_id=None)[0].tolist()
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    generated = runs[0][inputs["input_ids"].shape[1] :]
    assert len(generated) == 16
    assert all(0 <= t < get_preset(preset).vocab_size for t in generated)
    # A random model that collapsed onto one or two tokens would be useless as a test subject.
    assert len(set(generated)) >= 4


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-llama"])
def test_auto_tokenizer_encodes_like_the_tokenizers_file(
    transformers: ModuleType, made: dict[str, Path], preset: str
) -> None:
    hf = transformers.AutoTokenizer.from_pretrained(made[preset])
    raw = Tokenizer.from_file(str(made[preset] / "tokenizer.json"))
    config = json.loads((made[preset] / "config.json").read_text())
    for text in TEXTS:
        ids = hf(text)["input_ids"]
        assert ids == raw.encode(text).ids, text
        assert hf.decode(ids) == text
    assert len(hf) == config["vocab_size"]
    assert hf.eos_token_id == config["eos_token_id"]
    assert hf.pad_token_id == config["bos_token_id"]
    prompt = hf.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("preset", ["small-qwen3", "qwen3-8b-shape"])
def test_large_configs_load_and_match_the_weight_layout(
    transformers: ModuleType, tmp_path: Path, preset: str
) -> None:
    """Config only (no weights written): AutoConfig reads it, and a model built from it on the meta
    device has exactly the tensor names and shapes make_model would write."""
    p = get_preset(preset)
    (tmp_path / "config.json").write_text(json.dumps(make_config_dict(p)))
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    assert (config.model_type, config.hidden_size, config.num_hidden_layers) == (
        p.architecture,
        p.hidden_size,
        p.num_hidden_layers,
    )
    assert (config.num_key_value_heads, config.head_dim, config.vocab_size) == (
        p.num_key_value_heads,
        p.head_dim,
        p.vocab_size,
    )
    rope = getattr(config, "rope_parameters", None) or {"rope_theta": config.rope_theta}
    assert rope["rope_theta"] == p.rope_theta
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    if p.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    assert shapes == {spec.name: spec.shape for spec in tensor_layout(p)}
