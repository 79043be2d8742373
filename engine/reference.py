"""The plain-torch model: kog's correctness oracle and its eager / CUDA-graph / torch.compile baselines.

gpt-fast style, one readable file: a static KV cache [layers, 2 (k, v), kv_heads, max_seq, head_dim], one
function for every forward pass, and a decode step with static shapes (token and position are tensors, the
cache is written with index_copy_, attention runs over the whole cache under a mask) so that
torch.compile(mode="reduce-overhead") and CUDA graph capture work on it unchanged.

Numerics follow Hugging Face transformers: matmuls in the model dtype; RMSNorm in float32, cast back before the
weight multiply; RoPE tables computed in float32 and cast to the model dtype (rotate_half convention, Llama 3
frequency scaling as HF `_compute_llama3_parameters`); attention scores softmaxed in float32; GQA with kv head
j serving query heads j*g .. j*g+g-1; Qwen2 q/k/v biases; Qwen3 per-head q/k RMSNorm before RoPE.

Sampling on the host (sample_next, Reference.stream) follows the rules the monokernel implements in-kernel:
temperature <= 0 is greedy; otherwise logits / temperature, then top-k (keep the k largest; 0 = off), then
top-p (keep the smallest prefix of the sorted distribution whose mass reaches p, always at least one token),
then one draw from a torch.Generator seeded with `seed`, so the same seed gives the same tokens.
"""
from __future__ import annotations

import math
import time
from typing import Iterator

import torch
import torch.nn.functional as F

from kog.engine.config import ModelConfig
from kog.engine.weights import Weights


def rope_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim/2], float32, with the config's theta and (Llama 3) scaling."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))
    rs = cfg.rope_scaling
    if not rs or rs.get("rope_type", rs.get("type")) in (None, "default"):
        return inv_freq
    # Llama 3.1 scaling: long wavelengths divided by `factor`, short ones kept, a smooth blend between.
    factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old_ctx = float(rs["original_max_position_embeddings"])
    low_freq_wavelen, high_freq_wavelen = old_ctx / lo, old_ctx / hi
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * inv_freq_llama / factor + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def rope_cos_sin(cfg: ModelConfig, max_seq: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each [max_seq, head_dim] float32; both halves of a row are equal (HF's cat(freqs, freqs)).

    Rotation of x at position p: x * cos[p] + rotate_half(x) * sin[p], rotate_half(x) = cat(-x2, x1).
    """
    inv_freq = rope_inv_freq(cfg)
    t = torch.arange(max_seq, dtype=torch.float32)
    freqs = t[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(device), emb.sin().to(device)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF RMSNorm: normalise in float32, cast back to x's dtype, then multiply by the weight."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear in x's dtype: a weight (or bias) of another dtype is cast for this one product."""
    if w.dtype != x.dtype:
        w = w.to(x.dtype)
    if b is not None and b.dtype != x.dtype:
        b = b.to(x.dtype)
    return F.linear(x, w, b)


def sample_next(logits: torch.Tensor, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                generator: torch.Generator | None = None) -> int:
    """One token id from logits [V] under greedy / temperature / top-k / top-p rules (module docstring)."""
    if temperature <= 0:
        return int(torch.argmax(logits))
    lg = logits.float() / temperature
    if top_k and 0 < top_k < lg.numel():
        kth = torch.topk(lg, top_k).values[-1]
        lg = lg.masked_fill(lg < kth, float("-inf"))
    if top_p < 1.0:
        sorted_lg, idx = torch.sort(lg, descending=True)
        probs = torch.softmax(sorted_lg, -1)
        mass_before = torch.cumsum(probs, -1) - probs          # mass of the strictly better tokens
        drop = mass_before >= top_p
        drop[0] = False
        lg = lg.scatter(0, idx[drop], float("-inf"))
    probs = torch.softmax(lg, -1)
    return int(torch.multinomial(probs, 1, generator=generator))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Reference(torch.nn.Module):
    """Batch-1 model with a static KV cache of `max_seq` positions.

    prefill(tokens) -> logits [V] of the last position (fills cache positions 0..T-1);
    decode_step(token, pos) -> logits [V] for one token at position `pos` (tensors of shape [1] for
    compile/graph use; ints are accepted too). forward_tokens(tokens, start_pos) -> logits of every position.
    """

    def __init__(self, cfg: ModelConfig, weights: Weights, max_seq: int | None = None,
                 compute_dtype: torch.dtype | None = None, cache_dtype: torch.dtype | None = None):
        """compute_dtype (default: the weights'): the activations' dtype; a wider one than the weights' runs
        every matmul on the weights upcast one matrix at a time (no second copy of the model), e.g. float32
        over bf16 weights: the model's math without per-op bf16 rounding. cache_dtype (default: compute_dtype):
        the KV cache's; the monokernel prefills in float32 into its bf16 cache."""
        super().__init__()
        self.cfg, self.w = cfg, weights
        self.max_seq = int(max_seq or min(cfg.max_position_embeddings, 4096))
        dev, dt = weights.device, (compute_dtype or weights.dtype)
        self.device, self.dtype = dev, dt
        cos, sin = rope_cos_sin(cfg, self.max_seq, dev)
        self.cos, self.sin = cos.to(dt), sin.to(dt)      # HF casts the table to the activations' dtype
        self.cache = torch.zeros(cfg.num_layers, 2, cfg.num_kv_heads, self.max_seq, cfg.head_dim,
                                 dtype=cache_dtype or dt, device=dev)
        self.positions = torch.arange(self.max_seq, device=dev)
        # Plain attributes (not registered parameters), as gpt-fast: the compiled step treats them as constants.
        self.layers = [weights.layer(i) for i in range(cfg.num_layers)]
        self.embed, self.final_norm, self.lm_head = weights["embed"], weights["norm"], weights["lm_head"]
        self.scale = cfg.head_dim ** -0.5

    def reset(self) -> None:
        self.cache.zero_()

    # ---- one forward pass over T tokens at positions `pos` ----------------------------------------------
    def _attention(self, q, layer: int, pos: torch.Tensor, kv_len: int) -> torch.Tensor:
        """q [T, nh, hd] (already rotated) against cache positions [0, kv_len) -> [T, nh*hd]."""
        c = self.cfg
        T, nkv, hd = q.shape[0], c.num_kv_heads, c.head_dim
        g = c.num_heads // nkv
        k = self.cache[layer, 0, :, :kv_len].to(q.dtype)           # [nkv, S, hd] (no copy when same dtype)
        v = self.cache[layer, 1, :, :kv_len].to(q.dtype)
        # Query head h = j*g + i reads kv head j: group the g query heads of each kv head as rows.
        qg = q.view(T, nkv, g, hd).permute(1, 2, 0, 3).reshape(nkv, g * T, hd)
        scores = torch.matmul(qg, k.transpose(1, 2)).float() * self.scale    # [nkv, g*T, S]
        kpos = self.positions[:kv_len]
        allowed = kpos[None, :] <= pos[:, None]                    # causal: [T, S]
        if c.sliding_window is not None:
            allowed = allowed & (kpos[None, :] > pos[:, None] - c.sliding_window)
        allowed = allowed.repeat(g, 1)                             # rows ordered (i, t) like qg
        scores = scores.masked_fill(~allowed, float("-inf"))
        p = torch.softmax(scores, dim=-1).to(q.dtype)
        o = torch.matmul(p, v)                                     # [nkv, g*T, hd]
        return o.view(nkv, g, T, hd).permute(2, 0, 1, 3).reshape(T, c.num_heads * hd)

    def attention_block(self, L: dict, h: torch.Tensor, i: int, pos: torch.Tensor, kv_len: int, cos, sin) -> torch.Tensor:
        """Layer i's attention on the normed input h [T, H]: QKV (+ bias), q/k norm, RoPE, the KV-cache write,
        attention over [0, kv_len). Returns [T, heads * head_dim], before the O projection. (The TP
        reference runs it on each rank's shard config and weights.)"""
        c = self.cfg
        T, nh, nkv, hd, eps = h.shape[0], c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps
        qkv = linear(h, L["wqkv"], L.get("bqkv"))
        q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        q, k, v = q.view(T, nh, hd), k.view(T, nkv, hd), v.view(T, nkv, hd)
        if c.qk_norm:
            q, k = rms_norm(q, L["q_norm"].to(q.dtype), eps), rms_norm(k, L["k_norm"].to(q.dtype), eps)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        ct = self.cache.dtype
        self.cache[i, 0].index_copy_(1, pos, k.transpose(0, 1).to(ct))
        self.cache[i, 1].index_copy_(1, pos, v.transpose(0, 1).to(ct))
        return self._attention(q, i, pos, kv_len)

    def _forward(self, tokens: torch.Tensor, pos: torch.Tensor, kv_len: int) -> torch.Tensor:
        """tokens [T] at positions pos [T]; attends to cache positions [0, kv_len). Returns logits [T, V]."""
        eps = self.cfg.rms_norm_eps
        cos, sin = self.cos[pos][:, None, :], self.sin[pos][:, None, :]    # [T, 1, hd]
        dt = self.dtype
        x = self.embed[tokens].to(dt)                                       # [T, H]
        for i, L in enumerate(self.layers):
            h = rms_norm(x, L["attn_norm"].to(dt), eps)
            x = x + linear(self.attention_block(L, h, i, pos, kv_len, cos, sin), L["wo"])
            h = rms_norm(x, L["ffn_norm"].to(dt), eps)
            x = x + linear(F.silu(linear(h, L["w_gate"])) * linear(h, L["w_up"]), L["w_down"])
        return linear(rms_norm(x, self.final_norm.to(dt), eps), self.lm_head)

    # ---- public API ---------------------------------------------------------------------------------------
    def _as_tokens(self, tokens) -> torch.Tensor:
        """Token ids as a long tensor; ConfigError for an id outside the embedding's rows (the vocabulary: a
        tensor-parallel shard's config slices vocab_size, its embedding keeps every row)."""
        from kog.engine.tokenizer import check_token_ids
        rows = self.embed.shape[0]
        if not torch.is_tensor(tokens):
            tokens = torch.tensor(check_token_ids(list(tokens), rows), dtype=torch.long)
        elif tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= rows):
            check_token_ids(tokens.view(-1).tolist(), rows)
        return tokens.to(self.device, torch.long).view(-1)

    @torch.no_grad()
    def forward_tokens(self, tokens, start_pos: int = 0) -> torch.Tensor:
        """Logits [T, V] of every position of `tokens`, placed at start_pos.. (the cache before start_pos
        must hold the earlier tokens)."""
        t = self._as_tokens(tokens)
        T = t.shape[0]
        if start_pos < 0:
            raise ValueError(f"start_pos {start_pos} is negative")
        if start_pos + T > self.max_seq:
            raise ValueError(f"sequence of {start_pos + T} tokens exceeds the cache's max_seq {self.max_seq}")
        pos = torch.arange(start_pos, start_pos + T, device=self.device)
        return self._forward(t, pos, start_pos + T)

    def prefill(self, tokens, start_pos: int = 0) -> torch.Tensor:
        """Logits [V] of the last prompt position."""
        return self.forward_tokens(tokens, start_pos)[-1]

    def decode_step(self, token, pos) -> torch.Tensor:
        """Logits [V] of one token at position `pos`. Static shapes: attends over the whole cache under a
        mask, so one compiled graph / captured CUDA graph serves every position."""
        if not torch.is_tensor(token):
            token = torch.tensor([int(token)], device=self.device)
        if not torch.is_tensor(pos):
            pos = torch.tensor([int(pos)], device=self.device)
        with torch.no_grad():
            return self._forward(token.view(1), pos.view(1), self.max_seq)[0]

    @torch.no_grad()
    def greedy(self, prompt_ids, n: int) -> list[int]:
        """n greedy tokens after the prompt (prefill then decode steps); no timing, for tests and gates."""
        prompt = list(prompt_ids)
        logits = self.prefill(prompt)
        out = []
        pos = len(prompt)
        for _ in range(n):
            nxt = int(torch.argmax(logits))
            out.append(nxt)
            if len(out) == n:
                break
            logits = self.decode_step(nxt, pos)
            pos += 1
        return out

    def stream(self, prompt_ids, n: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
               seed: int = 0, stop_ids=()) -> Iterator[int]:
        """n new token ids after the prompt, each yielded as it is sampled (sample_next, a generator seeded with
        `seed`); a stop id ends the stream after it is yielded. Afterwards self.last_stream holds ttft_s
        (prefill end -> first token), decode_s (prefill end -> last token) and tokens, as
        Monokernel.stream leaves them."""
        prompt, stops = [int(t) for t in prompt_ids], {int(t) for t in stop_ids}
        gen = torch.Generator(device=self.device)
        gen.manual_seed(int(seed))
        self.last_stream = None
        self.reset()
        # prefill and decode_step run without autograd themselves: a `with no_grad()` around a yield would
        # leak into the consumer's code between tokens
        logits = self.prefill(prompt)
        t0, ttft, pos, count = time.perf_counter(), None, len(prompt), 0
        while True:
            tok = sample_next(logits, temperature, top_k, top_p, gen)
            count += 1
            ttft = time.perf_counter() - t0 if ttft is None else ttft
            yield tok
            if count >= n or tok in stops:
                break
            logits = self.decode_step(tok, pos)
            pos += 1
        self.last_stream = dict(ttft_s=ttft, decode_s=time.perf_counter() - t0, tokens=count)

    @torch.no_grad()
    def teacher_forced_logits(self, prompt_ids, forced_ids) -> torch.Tensor:
        """[n, V] float32 logits: the prompt is prefilled except its last token; then decode steps feed the
        last prompt token, forced_ids[0], ..., forced_ids[n-2]; row j is the prediction for forced_ids[j]."""
        prompt, forced = list(prompt_ids), list(forced_ids)
        n = len(forced)
        if len(prompt) > 1:
            self.prefill(prompt[:-1])
        feed = [prompt[-1]] + forced[:-1]
        rows = []
        for j, tok in enumerate(feed[:n]):
            rows.append(self.decode_step(tok, len(prompt) - 1 + j).float())
        return torch.stack(rows)
