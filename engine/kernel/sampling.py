"""In-kernel sampling: pieces the monokernel's LM-head tiles and its last CTA run.

Greedy and temperature sampling are fully distributed with the Gumbel-max trick: a token drawn from
softmax(logits / T) is argmax(logits / T + G) with G_i = -log(-log(U_i)) i.i.d., so every vocab tile
adds seeded noise (Philox via tl.rand, keyed by seed, step and token id) and keeps its own max; the
cross-CTA reduction is one argmax over the CTAs' partial (value, index) pairs.

Top-k / top-p need a global threshold. The last CTA finds it by bisection over the logits the tiles
wrote (count >= k; softmax mass >= p), then draws Gumbel-max among the logits above it. That costs
about 2*ITERS passes over the vocabulary on one CTA (tens of microseconds): it is only paid when
top_k or top_p is on. `sample_kernel` runs exactly these helpers on a logits vector, for tests.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

SAMPLE_GREEDY, SAMPLE_GUMBEL, SAMPLE_FILTERED = 0, 1, 2


@triton.jit
def gumbel_scores(logits, idx, step, seed, inv_temp, V, SAMPLE: tl.constexpr):
    """Per-token score whose argmax is the sample: logits (greedy) or logits/T + Gumbel noise."""
    if SAMPLE == 0:
        s = logits
    else:
        u = tl.rand(seed, tl.cast(step, tl.int64) * V + idx)
        u = tl.minimum(tl.maximum(u, 1e-20), 1.0 - 1e-7)
        s = logits * inv_temp - tl.log(-tl.log(u))
    return s


@triton.jit
def tile_best(scores, idx, mask):
    """(max score, its token id) of one tile; ties go to the lowest id."""
    s = tl.where(mask, scores, float("-inf"))
    best = tl.max(s, axis=0)
    bi = tl.min(tl.where(s == best, idx, 2147483647), axis=0)
    return best, bi


@triton.jit
def filtered_sample(lbuf, V, M, top_k, top_p, seed, step, BV: tl.constexpr, ITERS: tl.constexpr):
    """Top-k / top-p sample from scaled logits lbuf[0:V] (already divided by T) whose max is M."""
    rv = tl.arange(0, BV)
    z = 0.0
    for v0 in range(0, V, BV):
        x = tl.load(lbuf + v0 + rv, mask=v0 + rv < V, other=float("-inf"), cache_modifier=".cg")
        z += tl.sum(tl.exp(x - M), axis=0)
    # thresholds: largest tau keeping >= top_k tokens / >= top_p of the mass (bisection in [M-60, M])
    lo_k = M - 60.0
    hi_k = M
    lo_p = M - 60.0
    hi_p = M
    for _ in range(ITERS):
        mid_k = 0.5 * (lo_k + hi_k)
        mid_p = 0.5 * (lo_p + hi_p)
        cnt = 0
        mass = 0.0
        for v0 in range(0, V, BV):
            x = tl.load(lbuf + v0 + rv, mask=v0 + rv < V, other=float("-inf"), cache_modifier=".cg")
            cnt += tl.sum((x >= mid_k).to(tl.int32), axis=0)
            mass += tl.sum(tl.where(x >= mid_p, tl.exp(x - M), 0.0), axis=0)
        ok_k = cnt >= top_k
        ok_p = mass >= top_p * z
        lo_k = tl.where(ok_k, mid_k, lo_k)
        hi_k = tl.where(ok_k, hi_k, mid_k)
        lo_p = tl.where(ok_p, mid_p, lo_p)
        hi_p = tl.where(ok_p, hi_p, mid_p)
    tau = M - 60.0
    if top_k > 0:
        tau = tl.maximum(tau, lo_k)
    if top_p < 1.0:
        tau = tl.maximum(tau, lo_p)
    tau = tl.minimum(tau, M)     # the top token always stays
    best = float("-inf")
    best_i = 0
    for v0 in range(0, V, BV):
        x = tl.load(lbuf + v0 + rv, mask=v0 + rv < V, other=float("-inf"), cache_modifier=".cg")
        u = tl.rand(seed, tl.cast(step, tl.int64) * V + v0 + rv)
        u = tl.minimum(tl.maximum(u, 1e-20), 1.0 - 1e-7)
        s = tl.where(x >= tau, x - tl.log(-tl.log(u)), float("-inf"))
        b, bi = tile_best(s, v0 + rv, v0 + rv < V)
        take = b > best
        best = tl.where(take, b, best)
        best_i = tl.where(take, bi, best_i)
    return best_i


@triton.jit
def _sample_kernel(logits_ptr, scratch_ptr, out_ptr, V, n_samples, seed, inv_temp, top_k, top_p,
                   SAMPLE: tl.constexpr, BN: tl.constexpr, BV: tl.constexpr, ITERS: tl.constexpr):
    # Runs the monokernel's sampling path on one logits vector, n_samples times (steps 0..n-1).
    rn = tl.arange(0, BN)
    for step in range(n_samples):
        best = float("-inf")
        best_i = 0
        for r0 in range(0, V, BN):
            idx = r0 + rn
            m = idx < V
            lg = tl.load(logits_ptr + idx, mask=m, other=float("-inf"))
            if SAMPLE == 2:
                tl.store(scratch_ptr + idx, lg * inv_temp, mask=m)
                sc = lg * inv_temp
            else:
                sc = gumbel_scores(lg, idx, step, seed, inv_temp, V, SAMPLE)
            b, bi = tile_best(sc, idx, m)
            take = b > best
            best = tl.where(take, b, best)
            best_i = tl.where(take, bi, best_i)
        if SAMPLE == 2:
            tl.debug_barrier()
            best_i = filtered_sample(scratch_ptr, V, best, top_k, top_p, seed, step, BV, ITERS)
        tl.store(out_ptr + step, best_i)


def sample_mode(temperature: float, top_k: int, top_p: float) -> int:
    if temperature <= 0.0:
        return SAMPLE_GREEDY
    if top_k > 0 or top_p < 1.0:
        return SAMPLE_FILTERED
    return SAMPLE_GUMBEL


def sample_tokens(logits: torch.Tensor, n: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                  seed: int = 0, iters: int = 24) -> torch.Tensor:
    """Draw n tokens (steps 0..n-1) from one logits vector with the monokernel's sampling code."""
    V = logits.numel()
    logits = logits.float().contiguous()
    out = torch.empty(n, dtype=torch.int32, device=logits.device)
    scratch = torch.empty(V, dtype=torch.float32, device=logits.device)
    mode = sample_mode(temperature, top_k, top_p)
    inv_t = 1.0 / temperature if temperature > 0 else 1.0
    _sample_kernel[(1,)](logits, scratch, out, V, n, seed, inv_t, top_k, float(top_p),
                         SAMPLE=mode, BN=64, BV=256, ITERS=iters)
    return out
