"""Qwen3 and Llama decoders in plain torch over a flattened token layout.

Every tensor that flows between layers is `[num_tokens, hidden]`: the tokens of all sequences
in the step laid end to end, as vLLM does. Attention is the one op that needs sequence
boundaries; it goes through `oracle_kernels.paged_attention`, so that batch-invariant kernels
can replace it without touching the model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType

import oracle_kernels
import torch
import torch.nn.functional as F
from oracle_kernels import fused as chains

# Where the decoder's fused chains run (`Decoder.fused`): invariant mode on these devices and dtypes, where
# oracle_kernels' fused kernels give the composition's bits (kernels/triton/fused.py).
FUSED_DEVICE_TYPES = frozenset({"cuda"})
FUSED_DTYPES = frozenset({torch.bfloat16, torch.float16})


def fused_path_applies(mode: str, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a run in `mode` on `device` in `dtype` takes the fused chains: invariant mode, CUDA, bf16/fp16.

    Production mode never does: its kernels are torch's, and its captures must reproduce its trials."""
    return mode == "invariant" and device.type in FUSED_DEVICE_TYPES and dtype in FUSED_DTYPES


@dataclass(frozen=True)
class ModelConfig:
    """The fields of an HF `config.json` that the decoder needs."""

    architecture: str  # "qwen3" | "qwen2" | "llama" | "mistral" (oracle.models.architectures)
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    eos_token_id: int | None = None


@dataclass(frozen=True)
class StepInputs:
    """The flattened inputs of one forward pass.

    input_ids, positions, slot_mapping: [T]; block_tables: [B, max_blocks]; seq_lens: [B];
    query_start_loc: [B + 1]; logits_indices: [R] rows of the hidden state to project to logits.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    logits_indices: torch.Tensor
    num_kv_splits: int


class Scopes:
    """The module path the forward pass is in, by HF names (`model.layers.1.mlp.down_proj`).

    `with scopes("name"):` pushes a full path onto `path`; per-op capture (oracle.localize) reads
    `path[-1]` to name the module an op ran in. Costs a list append and pop per scope.
    """

    def __init__(self) -> None:
        self.path: list[str] = []

    def __call__(self, name: str) -> Scopes:
        self.path.append(name)
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.path.pop()


class Decoder:
    """Weights plus the forward pass. Holds no per-request state: the KV cache is passed in."""

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor]) -> None:
        self.config = config
        self.w = weights
        c = config
        # [D/2] rotary frequencies, computed in float32 as HF does.
        self.inv_freq = 1.0 / (
            c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32, device=self.device) / c.head_dim)
        )
        self.lm_head = weights["lm_head.weight"] if not c.tie_word_embeddings else weights["model.embed_tokens.weight"]
        self.scopes = Scopes()
        # Tensor parallel: the all-reduce after each row-parallel layer, fused with the residual add
        # (`oracle.engines.native.parallel.all_reduce`); None in one process.
        self.reduce: Callable[[torch.Tensor, torch.Tensor, str], torch.Tensor] | None = None
        # The elementwise chains (residual add + norm, q/k norm + rope, silu * up) as oracle_kernels' fused ops,
        # bitwise the composition where `fused_path_applies`; the engine turns it on per call (`fusing`), never
        # under per-op capture, which must see the composition's ops by module. Off by default.
        self.fused = False

    @contextlib.contextmanager
    def fusing(self, on: bool) -> Iterator[None]:
        """`fused` set to `on` for the body, restored after (a decoder may serve several engines)."""
        before, self.fused = self.fused, on
        try:
            yield
        finally:
            self.fused = before

    @property
    def device(self) -> torch.device:
        return self.w["model.embed_tokens.weight"].device

    @property
    def dtype(self) -> torch.dtype:
        return self.w["model.embed_tokens.weight"].dtype

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # HF computes the norm in float32 and casts back before scaling by the weight.
        return chains.rms_norm_composed(x, weight, self.config.rms_norm_eps)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [T, H, D]; cos, sin: [T, 1, D]. Rotate-half layout, as in HF Llama/Qwen.
        return chains.rope_composed(x, cos, sin)

    def _add_norm(self, h: torch.Tensor, pending: torch.Tensor | None, weight: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """(h + pending, its norm): the fused path adds the last block's output here; pending is None otherwise."""
        if not self.fused:
            return h, self._rms_norm(h, weight)
        if pending is None:
            return h, chains.rms_norm(h, weight, self.config.rms_norm_eps)
        out, h = chains.add_rms_norm(pending, h, weight, self.config.rms_norm_eps)
        return h, out

    def _qk_rope(self, q: torch.Tensor, k: torch.Tensor, p: str, cos: torch.Tensor, sin: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, Hq, D], k [T, Hkv, D] after qwen3's per-head q_norm / k_norm (none elsewhere) and rope."""
        w, scope, eps = self.w, self.scopes, self.config.rms_norm_eps
        qwen3 = self.config.architecture == "qwen3"
        if self.fused:
            with scope(p + "self_attn.q_norm") if qwen3 else contextlib.nullcontext():
                q = chains.qk_norm_rope(q, w[p + "self_attn.q_norm.weight"] if qwen3 else None, cos, sin, eps)
            with scope(p + "self_attn.k_norm") if qwen3 else contextlib.nullcontext():
                k = chains.qk_norm_rope(k, w[p + "self_attn.k_norm.weight"] if qwen3 else None, cos, sin, eps)
            return q, k
        if qwen3:
            with scope(p + "self_attn.q_norm"):
                q = self._rms_norm(q, w[p + "self_attn.q_norm.weight"])
            with scope(p + "self_attn.k_norm"):
                k = self._rms_norm(k, w[p + "self_attn.k_norm.weight"])
        return self._rope(q, cos, sin), self._rope(k, cos, sin)

    def _residual(self, h: torch.Tensor, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(h, pending) after a block whose output is `out`: added now, or left to the next fused norm.

        Tensor parallel adds it in the all-reduce (`reduce`), before this."""
        if self.reduce is not None:
            return h, None
        if self.fused:
            return h, out
        return h + out, None

    def _silu_mul(self, gate: torch.Tensor, up: torch.Tensor, p: str) -> torch.Tensor:
        with self.scopes(p + "mlp.act_fn"):
            if self.fused:
                return chains.silu_mul(gate, up)
            act = F.silu(gate)
        return act * up

    def _write_kv(self, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                  k: torch.Tensor, v: torch.Tensor) -> None:
        # This step's keys and values into their paged slots: k, v [T, Hkv, D]; slot_mapping [T].
        c = self.config
        k_cache.view(-1, c.num_kv_heads, c.head_dim)[slot_mapping] = k
        v_cache.view(-1, c.num_kv_heads, c.head_dim)[slot_mapping] = v

    def _rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # [T, D/2] angles by elementwise product (exact, no reduction), then [T, 1, D].
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype)[:, None, :], emb.sin().to(self.dtype)[:, None, :]

    def forward(
        self, inputs: StepInputs, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """Run all layers; returns float32 logits [R, vocab] for `inputs.logits_indices`."""
        c = self.config
        w = self.w
        scope = self.scopes
        num_tokens = inputs.input_ids.shape[0]
        with scope("model.embed_tokens"):
            h = F.embedding(inputs.input_ids, w["model.embed_tokens.weight"])  # [T, hidden]
        with scope("model.rotary_emb"):
            cos, sin = self._rope_tables(inputs.positions)
        scale = c.head_dim**-0.5
        pending: torch.Tensor | None = None  # fused path: a block's output, added into h by the next norm
        for i in range(c.num_layers):
            p = f"model.layers.{i}."
            with scope(p[:-1]):  # the decoder layer: its residual adds
                with scope(p + "input_layernorm"):
                    h, x = self._add_norm(h, pending, w[p + "input_layernorm.weight"])
                with scope(p + "self_attn"):
                    with scope(p + "self_attn.q_proj"):
                        q = F.linear(x, w[p + "self_attn.q_proj.weight"], w.get(p + "self_attn.q_proj.bias"))
                    with scope(p + "self_attn.k_proj"):
                        k = F.linear(x, w[p + "self_attn.k_proj.weight"], w.get(p + "self_attn.k_proj.bias"))
                    with scope(p + "self_attn.v_proj"):
                        v = F.linear(x, w[p + "self_attn.v_proj.weight"], w.get(p + "self_attn.v_proj.bias"))
                    q = q.view(num_tokens, c.num_heads, c.head_dim)  # [T, Hq, D]
                    k = k.view(num_tokens, c.num_kv_heads, c.head_dim)  # [T, Hkv, D]
                    v = v.view(num_tokens, c.num_kv_heads, c.head_dim)
                    q, k = self._qk_rope(q, k, p, cos, sin)
                    k_cache, v_cache = kv_caches[i]  # [num_blocks, block_size, Hkv, D]
                    self._write_kv(k_cache, v_cache, inputs.slot_mapping, k, v)
                    with scope(p + "self_attn.attn"):
                        attn = oracle_kernels.paged_attention(
                            q, k_cache, v_cache, inputs.block_tables, inputs.seq_lens, inputs.query_start_loc,
                            scale, inputs.num_kv_splits,
                        )  # [T, Hq, D]
                    with scope(p + "self_attn.o_proj"):
                        o = F.linear(attn.reshape(num_tokens, c.num_heads * c.head_dim), w[p + "self_attn.o_proj.weight"],
                                     w.get(p + "self_attn.o_proj.bias"))
                        if self.reduce is not None:  # this rank's partial, summed over the ranks, plus h
                            h = self.reduce(o, h, p + "self_attn.o_proj")
                h, pending = self._residual(h, o)
                with scope(p + "post_attention_layernorm"):
                    h, x = self._add_norm(h, pending, w[p + "post_attention_layernorm.weight"])
                with scope(p + "mlp"):
                    with scope(p + "mlp.gate_proj"):
                        gate = F.linear(x, w[p + "mlp.gate_proj.weight"])
                    with scope(p + "mlp.up_proj"):
                        up = F.linear(x, w[p + "mlp.up_proj.weight"])
                    gated = self._silu_mul(gate, up, p)
                    with scope(p + "mlp.down_proj"):
                        down = F.linear(gated, w[p + "mlp.down_proj.weight"])
                        if self.reduce is not None:
                            h = self.reduce(down, h, p + "mlp.down_proj")
                h, pending = self._residual(h, down)
        h = h[inputs.logits_indices]  # [R, hidden]
        if pending is not None:
            pending = pending[inputs.logits_indices]
        with scope("model.norm"):
            _, h = self._add_norm(h, pending, w["model.norm.weight"])
        with scope("lm_head"):
            return F.linear(h, self.lm_head).to(torch.float32)  # [R, vocab]
