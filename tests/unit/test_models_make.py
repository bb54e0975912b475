"""make_model and ensure_model: byte-identical per seed, HF names and shapes, atomic, cached."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer

from oracle.errors import ConfigError, ModelError
from oracle.models import build_state_dict, ensure_model, get_preset, make_model
from oracle.models import make as make_module
from oracle.models.cache import cached_model_dir, default_cache_dir

FILES = [
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "oracle_model.json",
    "tokenizer.json",
    "tokenizer_config.json",
]


def digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def expected_shapes(preset_name: str) -> dict[str, tuple[int, ...]]:
    """Shapes of Hugging Face's Qwen3/Llama modules, written out from the preset's dims."""
    p = get_preset(preset_name)
    h, heads, kv, d, ff, v = (
        p.hidden_size,
        p.num_attention_heads,
        p.num_key_value_heads,
        p.head_dim,
        p.intermediate_size,
        p.vocab_size,
    )
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    for i in range(p.num_hidden_layers):
        pre = f"model.layers.{i}."
        shapes |= {
            pre + "self_attn.q_proj.weight": (heads * d, h),
            pre + "self_attn.k_proj.weight": (kv * d, h),
            pre + "self_attn.v_proj.weight": (kv * d, h),
            pre + "self_attn.o_proj.weight": (h, heads * d),
            pre + "mlp.gate_proj.weight": (ff, h),
            pre + "mlp.up_proj.weight": (ff, h),
            pre + "mlp.down_proj.weight": (h, ff),
            pre + "input_layernorm.weight": (h,),
            pre + "post_attention_layernorm.weight": (h,),
        }
        if p.architecture == "qwen3":
            shapes |= {pre + "self_attn.q_norm.weight": (d,), pre + "self_attn.k_norm.weight": (d,)}
    if not p.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    return shapes


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int, str], Path]:
    """tiny-qwen3 and tiny-llama, seed 0 twice (copies a and b) and seed 1 once."""
    root = tmp_path_factory.mktemp("models")
    out = {}
    for preset in ("tiny-qwen3", "tiny-llama"):
        for seed, copy in ((0, "a"), (0, "b"), (1, "a")):
            out[(preset, seed, copy)] = make_model(preset, root / f"{preset}-{seed}-{copy}", seed=seed)
    return out


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-llama"])
def test_same_seed_gives_byte_identical_files(made: dict[tuple[str, int, str], Path], preset: str) -> None:
    a, b = made[(preset, 0, "a")], made[(preset, 0, "b")]
    assert sorted(p.name for p in a.iterdir()) == FILES
    assert digests(a) == digests(b)


def test_same_seed_is_byte_identical_in_a_fresh_process(
    made: dict[tuple[str, int, str], Path], tmp_path: Path
) -> None:
    # A new interpreter has a new hash seed and a fresh tokenizers thread pool.
    code = "import sys; from pathlib import Path; from oracle.models import make_model; make_model('tiny-qwen3', Path(sys.argv[1]))"
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "m")], check=True)
    assert digests(tmp_path / "m") == digests(made[("tiny-qwen3", 0, "a")])


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-llama"])
def test_another_seed_changes_every_weight_but_not_config_or_tokenizer(
    made: dict[tuple[str, int, str], Path], preset: str
) -> None:
    seed0, seed1 = digests(made[(preset, 0, "a")]), digests(made[(preset, 1, "a")])
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        assert seed0[name] == seed1[name], name
    assert seed0["model.safetensors"] != seed1["model.safetensors"]
    w0 = build_state_dict(get_preset(preset), 0)
    w1 = build_state_dict(get_preset(preset), 1)
    for name in w0:
        assert not torch.equal(w0[name], w1[name]), name


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-llama"])
def test_safetensors_holds_hf_names_and_shapes_in_the_preset_dtype(
    made: dict[tuple[str, int, str], Path], preset: str
) -> None:
    with safe_open(made[(preset, 0, "a")] / "model.safetensors", framework="pt") as f:
        shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}  # noqa: SIM118
        dtypes = {f.get_slice(name).get_dtype() for name in f.keys()}  # noqa: SIM118
        metadata = f.metadata()
    assert shapes == expected_shapes(preset)
    assert dtypes == {"F32"}
    assert metadata["format"] == "pt"


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-llama"])
def test_file_weights_equal_the_in_memory_state_dict_bitwise(
    made: dict[tuple[str, int, str], Path], preset: str
) -> None:
    in_memory = build_state_dict(get_preset(preset), seed=1)
    with safe_open(made[(preset, 1, "a")] / "model.safetensors", framework="pt") as f:
        assert sorted(f.keys()) == sorted(in_memory)
        for name, tensor in in_memory.items():
            assert torch.equal(f.get_tensor(name), tensor), name


def test_bfloat16_preset_is_written_as_bf16_and_reads_back_bitwise(tmp_path: Path) -> None:
    preset = dataclasses.replace(get_preset("tiny-llama"), name="tiny-llama-bf16", torch_dtype="bfloat16")
    out = make_model(preset, tmp_path / "bf16", seed=3)
    in_memory = build_state_dict(preset, seed=3)
    with safe_open(out / "model.safetensors", framework="pt") as f:
        for name, tensor in in_memory.items():
            loaded = f.get_tensor(name)
            assert loaded.dtype == torch.bfloat16
            assert torch.equal(loaded.view(torch.int16), tensor.view(torch.int16)), name
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"


def test_qwen3_config_json_has_every_key_transformers_writes(made: dict[tuple[str, int, str], Path]) -> None:
    config = json.loads((made[("tiny-qwen3", 0, "a")] / "config.json").read_text())
    assert config == {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 509,
        "eos_token_id": 511,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": 64,
        "initializer_range": 0.02,
        "intermediate_size": 128,
        "max_position_embeddings": 4096,
        "max_window_layers": 2,
        "model_type": "qwen3",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 512,
    }


def test_llama_config_json_is_untied_with_llama_keys(made: dict[tuple[str, int, str], Path]) -> None:
    config = json.loads((made[("tiny-llama", 0, "a")] / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["model_type"] == "llama"
    assert config["tie_word_embeddings"] is False
    assert (config["mlp_bias"], config["attention_bias"], config["pretraining_tp"]) == (False, False, 1)
    assert "use_sliding_window" not in config and "max_window_layers" not in config
    assert list(config) == sorted(config)


def test_generation_config_is_greedy_with_the_tokenizer_ids(made: dict[tuple[str, int, str], Path]) -> None:
    model_dir = made[("tiny-qwen3", 0, "a")]
    generation = json.loads((model_dir / "generation_config.json").read_text())
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert generation["do_sample"] is False
    assert generation["eos_token_id"] == tokenizer.token_to_id("<|im_end|>")
    assert generation["bos_token_id"] == generation["pad_token_id"] == tokenizer.token_to_id("<|endoftext|>")


def test_written_tokenizer_round_trips_and_matches_the_config(made: dict[tuple[str, int, str], Path]) -> None:
    model_dir = made[("tiny-llama", 0, "a")]
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    config = json.loads((model_dir / "config.json").read_text())
    text = "Bread is worth making by hand, at least once. Ünïcödé too!"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
    assert tokenizer.get_vocab_size() == config["vocab_size"]


def test_unknown_preset_raises_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no-such-model"):
        make_model("no-such-model", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_refuses_a_non_empty_directory_unless_overwrite(tmp_path: Path) -> None:
    target = tmp_path / "m"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(ModelError, match="not empty"):
        make_model("tiny-qwen3", target)
    assert (target / "notes.txt").read_text() == "mine"
    make_model("tiny-qwen3", target, overwrite=True)
    assert sorted(p.name for p in target.iterdir()) == FILES
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no staging or retired dirs left


def test_an_empty_existing_directory_is_filled(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    assert sorted(p.name for p in make_model("tiny-qwen3", tmp_path / "m").iterdir()) == FILES


def test_a_failed_write_leaves_no_directory_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(make_module, "write_safetensors", fail)
    with pytest.raises(OSError, match="disk full"):
        make_model("tiny-qwen3", tmp_path / "m")
    assert list(tmp_path.iterdir()) == []


def test_progress_reports_every_byte(tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    make_model("tiny-llama", tmp_path / "m", progress=lambda done, total: seen.append((done, total)))
    total = get_preset("tiny-llama").num_bytes
    assert seen[-1] == (total, total)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


def test_ensure_model_makes_once_then_reuses(tmp_path: Path) -> None:
    first = ensure_model("tiny-qwen3", cache_dir=tmp_path, seed=5)
    assert first == tmp_path / "tiny-qwen3-seed5"
    mtimes = {p.name: p.stat().st_mtime_ns for p in first.iterdir()}
    again = ensure_model("tiny-qwen3", cache_dir=tmp_path, seed=5)
    assert again == first
    assert {p.name: p.stat().st_mtime_ns for p in again.iterdir()} == mtimes
    assert torch.equal(
        safe_open(again / "model.safetensors", framework="pt").get_tensor("model.norm.weight"),
        build_state_dict(get_preset("tiny-qwen3"), 5)["model.norm.weight"],
    )


def test_ensure_model_remakes_a_stale_or_damaged_cache_entry(tmp_path: Path) -> None:
    model_dir = ensure_model("tiny-qwen3", cache_dir=tmp_path)
    good = digests(model_dir)
    marker = json.loads((model_dir / "oracle_model.json").read_text())
    marker["format_version"] = 0
    (model_dir / "oracle_model.json").write_text(json.dumps(marker))
    assert digests(ensure_model("tiny-qwen3", cache_dir=tmp_path)) == good
    (model_dir / "model.safetensors").unlink()
    assert digests(ensure_model("tiny-qwen3", cache_dir=tmp_path)) == good
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-qwen3-seed0"]


def test_ensure_model_survives_processes_racing_for_the_same_entry(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from oracle.models import ensure_model; "
        "print(ensure_model('tiny-llama', cache_dir=Path(sys.argv[1]), seed=2))"
    )
    racers = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [r.communicate()[0].strip() for r in racers]
    assert [r.returncode for r in racers] == [0, 0, 0]
    assert set(outputs) == {str(tmp_path / "tiny-llama-seed2")}
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-llama-seed2"]
    assert sorted(p.name for p in (tmp_path / "tiny-llama-seed2").iterdir()) == FILES


def test_cache_location_follows_oracle_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORACLE_CACHE_DIR", str(tmp_path / "c"))
    assert default_cache_dir() == tmp_path / "c"
    assert cached_model_dir("tiny-llama", seed=7) == tmp_path / "c" / "tiny-llama-seed7"
    monkeypatch.delenv("ORACLE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert default_cache_dir() == tmp_path / "x" / "oracle" / "models"


@pytest.mark.parametrize("seed", [1.5, "3", True])
def test_non_integer_seed_is_a_config_error(tmp_path: Path, seed: object) -> None:
    with pytest.raises(ConfigError, match="seed"):
        make_model("tiny-qwen3", tmp_path / "m", seed=seed)  # type: ignore[arg-type]


def test_ensure_model_says_when_it_makes_the_model_and_only_then(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    first = ensure_model("tiny-qwen3", cache_dir=tmp_path)
    err = capsys.readouterr().err
    assert f"oracle: making the tiny-qwen3 model (seed 0) on first use, into {first}" in err
    assert ensure_model("tiny-qwen3", cache_dir=tmp_path) == first
    assert capsys.readouterr().err == ""  # cached: nothing to say
