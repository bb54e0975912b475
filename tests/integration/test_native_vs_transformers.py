"""The native engine agrees with Hugging Face transformers on the same checkpoint (float32, alone)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oracle.engines.contract import Request, SamplingParams
from oracle.engines.native import NativeEngine

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@pytest.mark.parametrize("preset", ["tiny-qwen3", "tiny-llama"])
@pytest.mark.parametrize("mode", ["production", "invariant"])
def test_greedy_tokens_and_logits_match_hf(preset: str, mode: str, model_cache: Path) -> None:
    from oracle.models import ensure_model

    model_dir = ensure_model(preset, cache_dir=model_cache)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32)
    hf.eval()
    prompt = [5, 77, 301, 12, 9, 400, 33, 250, 18]
    n = 12
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, pad_token_id=0,
                          eos_token_id=None)
    hf_tokens = out.sequences[0, len(prompt):].tolist()
    hf_logits = torch.stack(out.logits, 1)[0].float().numpy()  # [n, vocab]
    engine = NativeEngine(model_dir, mode)  # type: ignore[arg-type]
    ours = engine.generate([Request("r", tuple(prompt), SamplingParams(max_tokens=n, logits="full"))])[0]
    assert ours.token_ids == hf_tokens
    assert ours.logits is not None
    np.testing.assert_allclose(np.stack(ours.logits), hf_logits, atol=1e-5, rtol=0)
