"""ModelFacts: config.json read once into typed facts; each use of the file keeps its own error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracle.errors import ModelError
from oracle.models.facts import read_model_facts


def _model(tmp_path: Path, config: object) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_the_facts_of_a_grouped_query_model(tmp_path: Path) -> None:
    facts = read_model_facts(_model(tmp_path, {
        "architectures": ["LlamaForCausalLM"], "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "n_positions": 512}))
    assert (facts.architecture, facts.vocab_size, facts.hidden_size, facts.intermediate_size,
            facts.num_hidden_layers, facts.num_attention_heads, facts.num_key_value_heads, facts.head_dim,
            facts.context, facts.gqa_ratio) == ("LlamaForCausalLM", 128, 64, 96, 2, 8, 2, 8, 512, 4)
    assert facts.require_vocab_size() == 128 and facts.require_dims().get("hidden_size") == 64
    assert facts.checkpoint_problem is None and facts.path == tmp_path / "config.json"


def test_a_missing_config_json_fails_each_use_with_its_own_message(tmp_path: Path) -> None:
    facts = read_model_facts(tmp_path)
    assert facts.checkpoint_problem == "has no config.json"
    with pytest.raises(ModelError, match=r"config.json: no config.json; make a model with `oracle model make"):
        facts.config_json()
    with pytest.raises(ModelError, match=r"config.json: model config not found"):
        facts.require_vocab_size()
    with pytest.raises(ModelError, match="no config.json"):
        facts.require_dims()
    assert facts.context is None and facts.hazard_facts() == {} and facts.hidden_size is None


def test_a_config_json_that_is_not_an_object(tmp_path: Path) -> None:
    facts = read_model_facts(_model(tmp_path, [1, 2]))
    assert facts.checkpoint_problem == "has a config.json that is not a JSON object"
    with pytest.raises(ModelError, match="config.json: not a JSON object"):
        facts.config_json()
    with pytest.raises(ModelError, match="config.json: vocab_size: required field missing"):
        facts.require_vocab_size()


def test_a_bad_dimension_is_raised_only_where_dimensions_are_needed(tmp_path: Path) -> None:
    facts = read_model_facts(_model(tmp_path, {"vocab_size": 32, "hidden_size": -1, "max_position_embeddings": 64}))
    assert facts.require_vocab_size() == 32 and facts.context == 64  # prompts and the context check still run
    with pytest.raises(ModelError, match=r"config.json: hidden_size: must be a positive integer \(got -1\)"):
        facts.require_dims()
    assert facts.hidden_size is None and facts.hazard_facts() == {}


def test_a_vocab_size_out_of_range_names_the_field(tmp_path: Path) -> None:
    facts = read_model_facts(_model(tmp_path, {"vocab_size": True}))
    with pytest.raises(ModelError, match=r"vocab_size: must be an integer \(got True\)"):
        facts.require_vocab_size()
    assert facts.vocab_size is None and facts.config_json() == {"vocab_size": True}
