"""Tensor-parallel sharding of a model over G GPUs of one host (the Megatron way), and its pure-torch oracle.

Each rank r of G holds, per layer (canonical names of kog.engine.weights, per-rank shapes):

    wqkv   [(q + 2*kv)/G, H]  column split by KV-head groups: rank r gets KV heads r*nkv/G .. (r+1)*nkv/G - 1
                              and exactly the query heads they serve (GQA: kv head j serves query heads
                              j*g .. j*g+g-1, so those are a contiguous block of q rows); its q, k, v row blocks
                              are concatenated in that order, like the unsharded wqkv
    bqkv   [(q + 2*kv)/G]     split the same way (Qwen2)
    q_norm, k_norm [hd]       replicated (Qwen3: per-head norms act inside one head)
    wo     [H, q/G]           row split (a K slice): rank r's product is a partial sum of the hidden vector
    w_gate, w_up [I/G, H]     column split
    w_down [H, I/G]           row split (partial sums)
    attn_norm, ffn_norm, norm [H], embed [V, H]   replicated
    lm_head [Vp/G, H]         vocab parallel: rank r owns tokens r*Vp/G .. (r+1)*Vp/G - 1

After O and after down every rank needs the sum of the G partials (the all-reduce): x += sum_r partial_r.
The sum is taken in fixed rank order 0, 1, .., G-1 on every rank, in float32, so all ranks hold bitwise the
same residual stream (and the same sampled token) without a broadcast. Sampling is vocab parallel: each rank
picks its local best (score, global token id), then every rank takes the max of the G candidates, ties to the
lowest id -- exactly torch.argmax's choice over the full vocabulary, and the Gumbel-max sampler of
kog.engine.kernel.sampling keys its noise by the global token id, so seeded sampling shards the same way.

Vocabulary padding (pad_vocab=True, off by default): when G does not divide V, the LM head is padded with zero
rows to Vp = the next multiple of G * vocab_multiple; the padded tokens' logits are forced to -inf (the kernel
masks global id >= V), so they can never be sampled. Without pad_vocab, G must divide V.

TPReference runs decode on the G shards *simulated on one device* (the all-reduce is the rank-ordered sum
above); it reuses kog.engine.reference (RMSNorm, RoPE, attention, the static KV cache: one Reference per rank
over that rank's shard config) so the sharding math is testable on CPU against the unsharded Reference.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kog.engine.config import ConfigError, ModelConfig
from kog.engine.reference import Reference, rms_norm
from kog.engine.weights import Weights, expected_shapes

REPLICATED = ("attn_norm", "ffn_norm", "q_norm", "k_norm")


@dataclass(frozen=True)
class TPShape:
    """How a model splits over G ranks: the per-rank sizes every part of TP (sharding, plan, kernel) uses."""
    G: int
    vocab_size: int          # real V
    vocab_padded: int        # Vp (== V unless pad_vocab)
    kv_heads_per_rank: int
    heads_per_rank: int
    intermediate_per_rank: int

    @property
    def vocab_per_rank(self) -> int:
        return self.vocab_padded // self.G

    def vocab_range(self, rank: int) -> tuple[int, int]:
        """Global token ids [lo, hi) of rank's LM-head rows (hi may exceed V on the last rank when padded)."""
        return rank * self.vocab_per_rank, (rank + 1) * self.vocab_per_rank


def tp_shape(cfg: ModelConfig, G: int, pad_vocab: bool = False, vocab_multiple: int = 64) -> TPShape:
    """Validate a TP degree for cfg; ConfigError (one line, naming the field) when G does not split it."""
    if not isinstance(G, int) or G < 1:
        raise ConfigError(f"tensor-parallel degree G must be a positive integer, got {G!r}")
    if cfg.num_kv_heads % G:
        raise ConfigError(f"config field 'num_key_value_heads': {cfg.num_kv_heads} KV heads do not split over "
                          f"G={G} ranks (G must divide it; replicating KV heads is not supported)")
    if cfg.intermediate_size % G:
        raise ConfigError(f"config field 'intermediate_size': {cfg.intermediate_size} does not split over G={G} ranks")
    V = cfg.vocab_size
    if V % G and not pad_vocab:
        vp = -(-V // (G * vocab_multiple)) * G * vocab_multiple
        raise ConfigError(f"config field 'vocab_size': {V} does not split over G={G} ranks (pad_vocab=True pads "
                          f"the LM head to {vp} rows whose logits are -inf)")
    Vp = V if V % G == 0 else -(-V // (G * vocab_multiple)) * G * vocab_multiple
    return TPShape(G=G, vocab_size=V, vocab_padded=Vp, kv_heads_per_rank=cfg.num_kv_heads // G,
                   heads_per_rank=cfg.num_heads // G, intermediate_per_rank=cfg.intermediate_size // G)


def check_lm_tiles(bn_lm: int, shard: ModelConfig) -> None:
    """ConfigError unless bn_lm divides a rank's vocabulary: its LM tiles must be whole (one GPU may end on a
    ragged tile, kog.engine.engine_config.lm_tiles; the ranks' vocabulary exchange has no such tile)."""
    if shard.vocab_size % bn_lm:
        raise ConfigError(f"engine config: bn_lm {bn_lm} does not divide a rank's {shard.vocab_size} vocabulary "
                          f"rows (tensor parallelism needs whole LM tiles; pad_vocab pads the vocabulary)")


def shard_config(cfg: ModelConfig, G: int, pad_vocab: bool = False) -> ModelConfig:
    """The shapes one rank computes with, as a ModelConfig (heads, intermediate and vocab divided by G).

    It is what the planner (kog.engine.plan.make_plan) and a rank's Reference take. Its embedding is NOT the
    rank's embedding (embed stays [V, H], replicated), so the shard is never tied: tie_word_embeddings=False.
    """
    s = tp_shape(cfg, G, pad_vocab)
    return cfg.replace(num_heads=s.heads_per_rank, num_kv_heads=s.kv_heads_per_rank,
                       intermediate_size=s.intermediate_per_rank, vocab_size=s.vocab_per_rank,
                       tie_word_embeddings=False, name=f"{cfg.name}-tp{G}").validate()


def qkv_rows(cfg: ModelConfig, G: int, rank: int) -> torch.Tensor:
    """Row indices of the unsharded wqkv (and bqkv) that rank owns: its q block, k block, v block."""
    qs, kvs = cfg.q_size // G, cfg.kv_size // G
    q = torch.arange(rank * qs, (rank + 1) * qs)
    k = cfg.q_size + torch.arange(rank * kvs, (rank + 1) * kvs)
    v = cfg.q_size + cfg.kv_size + torch.arange(rank * kvs, (rank + 1) * kvs)
    return torch.cat([q, k, v])


def shard_weights(cfg: ModelConfig, w: Weights, G: int, rank: int, pad_vocab: bool = False) -> Weights:
    """Rank's shard, in the canonical names (per-rank shapes in the module docstring). Slices are copies
    (contiguous: each rank's tensors are what it would hold in its own memory)."""
    s = tp_shape(cfg, G, pad_vocab)
    if not 0 <= rank < G:
        raise ConfigError(f"rank {rank} is not in 0..{G - 1}")
    qs, I_r = cfg.q_size // G, s.intermediate_per_rank
    rows = qkv_rows(cfg, G, rank)
    out = Weights()
    out["embed"] = w["embed"]                         # replicated (every rank embeds the sampled token)
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        for name in REPLICATED:
            if p + name in w:
                out[p + name] = w[p + name]
        out[p + "wqkv"] = w[p + "wqkv"][rows].contiguous()
        if cfg.attention_bias:
            out[p + "bqkv"] = w[p + "bqkv"][rows].contiguous()
        out[p + "wo"] = w[p + "wo"][:, rank * qs:(rank + 1) * qs].contiguous()
        out[p + "w_gate"] = w[p + "w_gate"][rank * I_r:(rank + 1) * I_r].contiguous()
        out[p + "w_up"] = w[p + "w_up"][rank * I_r:(rank + 1) * I_r].contiguous()
        out[p + "w_down"] = w[p + "w_down"][:, rank * I_r:(rank + 1) * I_r].contiguous()
    out["norm"] = w["norm"]
    lo, hi = s.vocab_range(rank)
    lm = w["lm_head"][lo:min(hi, s.vocab_size)]
    if hi > s.vocab_size:   # padded rows: zero weights; their logits are masked to -inf, never sampled
        lm = torch.cat([lm, lm.new_zeros(hi - max(lo, s.vocab_size), lm.shape[1])])
    out["lm_head"] = lm.contiguous()
    return out


def shard_shapes(cfg: ModelConfig, G: int, pad_vocab: bool = False) -> dict[str, tuple[int, ...]]:
    """Canonical name -> per-rank shape (the same on every rank): the unsharded layout of the shard config,
    except the embedding, which every rank keeps whole (it looks up any token id)."""
    out = expected_shapes(shard_config(cfg, G, pad_vocab))
    out["embed"] = (cfg.vocab_size, cfg.hidden_size)
    return out


def check_shard(cfg: ModelConfig, shard: Weights, G: int, pad_vocab: bool = False) -> None:
    """ConfigError naming the first tensor of a rank's shard that is missing or misshapen."""
    for name, shape in shard_shapes(cfg, G, pad_vocab).items():
        t = shard.get(name)
        if t is None:
            raise ConfigError(f"TP shard: missing tensor {name}")
        if tuple(t.shape) != shape:
            raise ConfigError(f"TP shard: tensor {name}: expected {list(shape)}, got {list(t.shape)}")


def all_reduce_partials(partials: list[torch.Tensor]) -> torch.Tensor:
    """The exchange's sum: float32, rank order 0..G-1 (every rank does exactly this, so all agree bitwise)."""
    acc = partials[0].float()
    for p in partials[1:]:
        acc = acc + p.float()
    return acc


def vocab_parallel_pick(scores: list[torch.Tensor], shape: TPShape) -> torch.Tensor:
    """Token ids [T] from per-rank scores [T, Vp/G]: each rank's local best (score, global id), then the max
    over ranks, ties to the lowest id (= torch.argmax over the whole vocabulary). Padded ids never win."""
    vals, ids = [], []
    for r, s in enumerate(scores):
        lo, _ = shape.vocab_range(r)
        s = s.float().masked_fill(torch.arange(lo, lo + s.shape[-1], device=s.device) >= shape.vocab_size,
                                  float("-inf"))
        v, i = s.max(dim=-1)          # torch returns the first maximal index
        vals.append(v)
        ids.append(i + lo)
    v, i = torch.stack(vals, -1), torch.stack(ids, -1)            # [T, G]
    best = v.max(dim=-1, keepdim=True).values
    return torch.where(v == best, i, torch.iinfo(i.dtype).max).min(dim=-1).values


class TPReference:
    """Decode on G shards simulated on one device; same public API shape as Reference (prefill, decode_step,
    greedy, forward_tokens). Each rank is a Reference over its shard config (its own KV cache of nkv/G heads);
    the all-reduce after O and after down is all_reduce_partials; the LM head is vocab parallel.

    Numerics: a rank's matmul output (partial) is in the model dtype, like the unsharded model's; the sum of
    the partials and the residual add run in float32 and are rounded once to the model dtype. In float32 this
    equals the unsharded Reference to rounding (tests); in bf16 the rounding points differ from HF's by design.
    """

    def __init__(self, cfg: ModelConfig, weights: Weights, G: int, max_seq: int | None = None,
                 pad_vocab: bool = False):
        self.cfg, self.G = cfg, G
        self.shape = tp_shape(cfg, G, pad_vocab)
        self.shard_cfg = shard_config(cfg, G, pad_vocab)
        self.shards = [shard_weights(cfg, weights, G, r, pad_vocab) for r in range(G)]
        for s in self.shards:
            check_shard(cfg, s, G, pad_vocab)
        self.ranks = [Reference(self.shard_cfg, s, max_seq) for s in self.shards]
        self.max_seq = self.ranks[0].max_seq
        self.device, self.dtype = weights.device, weights.dtype
        self.embed, self.final_norm = weights["embed"], weights["norm"]

    def reset(self) -> None:
        for r in self.ranks:
            r.reset()

    def _residual_add(self, x: torch.Tensor, partials: list[torch.Tensor]) -> torch.Tensor:
        return (x.float() + all_reduce_partials(partials)).to(x.dtype)

    def _rank_attention_partial(self, ref: Reference, L: dict, h, i: int, pos, kv_len, cos, sin) -> torch.Tensor:
        """One rank's attention block for layer i: its QKV slice, RoPE, its KV-cache heads, attention, and
        its O K-slice -> a partial hidden vector [T, H]."""
        # ref holds the shard config (nh/G, nkv/G heads) and this rank's KV cache
        return F.linear(ref.attention_block(L, h, i, pos, kv_len, cos, sin), L["wo"])

    @torch.no_grad()
    def _forward_shards(self, tokens: torch.Tensor, pos: torch.Tensor, kv_len: int) -> list[torch.Tensor]:
        """Per-rank LM-head outputs [T, Vp/G] (padded rows masked to -inf)."""
        eps = self.cfg.rms_norm_eps
        r0 = self.ranks[0]
        cos, sin = r0.cos[pos][:, None, :], r0.sin[pos][:, None, :]
        x = self.embed[tokens]
        for i in range(self.cfg.num_layers):
            h = rms_norm(x, self.ranks[0].layers[i]["attn_norm"], eps)     # replicated: same on every rank
            x = self._residual_add(x, [self._rank_attention_partial(ref, ref.layers[i], h, i, pos, kv_len, cos, sin)
                                       for ref in self.ranks])
            h = rms_norm(x, self.ranks[0].layers[i]["ffn_norm"], eps)
            parts = []
            for ref in self.ranks:
                L = ref.layers[i]
                parts.append(F.linear(F.silu(F.linear(h, L["w_gate"])) * F.linear(h, L["w_up"]), L["w_down"]))
            x = self._residual_add(x, parts)
        hn = rms_norm(x, self.final_norm, eps)
        out = []
        for r, ref in enumerate(self.ranks):
            lo, _ = self.shape.vocab_range(r)
            lg = F.linear(hn, ref.lm_head)
            ids = torch.arange(lo, lo + lg.shape[-1], device=lg.device)
            out.append(lg.masked_fill(ids >= self.shape.vocab_size, float("-inf")))
        return out

    def gather_logits(self, shards: list[torch.Tensor]) -> torch.Tensor:
        """[T, V] full logits from the per-rank outputs (for checks; the engine never gathers them)."""
        return torch.cat(shards, dim=-1)[..., :self.shape.vocab_size]

    def forward_tokens(self, tokens, start_pos: int = 0) -> torch.Tensor:
        t = self.ranks[0]._as_tokens(tokens)
        T = t.shape[0]
        if start_pos + T > self.max_seq:
            raise ValueError(f"sequence of {start_pos + T} tokens exceeds the cache's max_seq {self.max_seq}")
        pos = torch.arange(start_pos, start_pos + T, device=self.device)
        return self.gather_logits(self._forward_shards(t, pos, start_pos + T))

    def prefill(self, tokens, start_pos: int = 0) -> torch.Tensor:
        return self.forward_tokens(tokens, start_pos)[-1]

    def decode_step_shards(self, token: int, pos: int) -> list[torch.Tensor]:
        """Per-rank logits [Vp/G] of one decode step (what each GPU holds after its LM-head tiles)."""
        t = torch.tensor([int(token)], device=self.device)
        p = torch.tensor([int(pos)], device=self.device)
        return [s[0] for s in self._forward_shards(t, p, self.max_seq)]

    def decode_step(self, token: int, pos: int) -> torch.Tensor:
        return self.gather_logits(self.decode_step_shards(token, pos))

    @torch.no_grad()
    def greedy(self, prompt_ids, n: int) -> list[int]:
        """n greedy tokens, each picked vocab-parallel (local best per rank, then the cross-rank max)."""
        prompt = list(prompt_ids)
        t = self.ranks[0]._as_tokens(prompt)
        pos = torch.arange(len(prompt), device=self.device)
        shards = [s[-1:] for s in self._forward_shards(t, pos, len(prompt))]
        out: list[int] = []
        p = len(prompt)
        while True:
            nxt = int(vocab_parallel_pick(shards, self.shape)[0])
            out.append(nxt)
            if len(out) == n:
                return out
            shards = [s[None] for s in self.decode_step_shards(nxt, p)]
            p += 1
