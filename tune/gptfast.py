"""The strongest plain-PyTorch decode step a user would write, the gpt-fast way: the `torch-compile` baseline.

One module, static shapes: q/k/v fused into one matrix and gate/up into another (one GEMV each per layer),
scaled_dot_product_attention with grouped-query heads over a static KV cache sized for the run, greedy argmax
inside the graph, the whole step under torch.compile(mode="reduce-overhead", fullgraph=True) (CUDA graphs)
with inductor's own settings (gpt-fast's coordinate-descent tuning ran this step slower and tripled its compile
time: docs/baselines.md). Numerics: matmuls in the model dtype, torch's RMSNorm, RoPE rotate-half with the
checkpoint's tables.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kog.engine.config import ModelConfig
from kog.engine.reference import rope_cos_sin, rotate_half
from kog.engine.weights import Weights


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """torch's own RMSNorm (float32 inside, as the anchor step and gpt-fast's RMSNorm)."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


class FusedDecoder(torch.nn.Module):
    """Batch-1 decode with fused weights and a static KV cache of `max_seq` positions: step(token, pos) ->
    the greedy next token, token and pos being [1] tensors on the device (static shapes for CUDA graphs).
    A module with the caches as buffers, as gpt-fast: the compiled step then mutates them in place inside
    its CUDA graph (tensors of a plain object would be graph inputs, and a mutated input stops the graphs)."""

    def __init__(self, cfg: ModelConfig, weights: Weights, max_seq: int):
        super().__init__()
        self.cfg, self.max_seq = cfg, int(max_seq)
        dev, dt = weights.device, weights.dtype
        self.layers = []
        for i in range(cfg.num_layers):
            L = weights.layer(i)
            # each layer's own cache tensors, as gpt-fast's KVCache modules and the shared anchor's step
            shape = (1, cfg.num_kv_heads, self.max_seq, cfg.head_dim)
            k, v = torch.zeros(shape, dtype=dt, device=dev), torch.zeros(shape, dtype=dt, device=dev)
            self.register_buffer(f"k_cache_{i}", k, persistent=False)
            self.register_buffer(f"v_cache_{i}", v, persistent=False)
            self.layers.append({
                "attn_norm": L["attn_norm"], "wqkv": L["wqkv"], "bqkv": L.get("bqkv"), "wo": L["wo"],
                "q_norm": L.get("q_norm"), "k_norm": L.get("k_norm"), "ffn_norm": L["ffn_norm"],
                "w13": torch.cat([L["w_gate"], L["w_up"]]), "w2": L["w_down"], "k": k, "v": v})
        self.embed, self.norm, self.lm_head = weights["embed"], weights["norm"], weights["lm_head"]
        cos, sin = rope_cos_sin(cfg, self.max_seq, dev)
        self.cos, self.sin = cos.to(dt), sin.to(dt)
        self.register_buffer("positions", torch.arange(self.max_seq, device=dev), persistent=False)

    def reset(self) -> None:
        for L in self.layers:
            L["k"].zero_()
            L["v"].zero_()

    def _mask(self, pos: torch.Tensor) -> torch.Tensor:
        """[1, 1, T, max_seq] True where a query at `pos` may attend (causal; a sliding window if any)."""
        allowed = self.positions[None, :] <= pos[:, None]
        if self.cfg.sliding_window is not None:
            allowed = allowed & (self.positions[None, :] > pos[:, None] - self.cfg.sliding_window)
        return allowed[None, None]

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits [T, V] of tokens [T] at positions pos [T] (their k / v go into the cache)."""
        c = self.cfg
        T, nh, nkv, hd, eps = tokens.shape[0], c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps
        cos, sin = self.cos[pos][None, :, None, :], self.sin[pos][None, :, None, :]
        mask = self._mask(pos)
        x = self.embed[tokens]
        for L in self.layers:
            qkv = F.linear(rms_norm(x, L["attn_norm"], eps), L["wqkv"], L["bqkv"])
            q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
            q, k, v = q.view(1, T, nh, hd), k.view(1, T, nkv, hd), v.view(1, T, nkv, hd)
            if c.qk_norm:
                q, k = rms_norm(q, L["q_norm"], eps), rms_norm(k, L["k_norm"], eps)
            q = (q * cos + rotate_half(q) * sin).transpose(1, 2)
            k = (k * cos + rotate_half(k) * sin).transpose(1, 2)
            L["k"].index_copy_(2, pos, k)
            L["v"].index_copy_(2, pos, v.transpose(1, 2))
            o = F.scaled_dot_product_attention(q, L["k"], L["v"], attn_mask=mask,
                                               enable_gqa=nkv != nh)
            x = x + F.linear(o.transpose(1, 2).reshape(T, nh * hd), L["wo"])
            gate, up = F.linear(rms_norm(x, L["ffn_norm"], eps), L["w13"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, L["w2"])
        return F.linear(rms_norm(x, self.norm, eps), self.lm_head)

    def step(self, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The greedy next token [1] after `token` at `pos` (one decode step, argmax in the graph)."""
        return torch.argmax(self.forward(token, pos)[-1]).view(1)
