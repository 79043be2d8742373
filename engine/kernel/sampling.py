"""In-kernel sampling: pieces the monokernel's LM-head tiles and its token end run.

Greedy and temperature sampling are fully distributed with the Gumbel-max trick: a token drawn from
softmax(logits / T) is argmax(logits / T + G) with G_i = -log(-log(U_i)) i.i.d., so every vocab tile
adds seeded noise (Philox via tl.rand, keyed by seed, step and token id) and keeps its own max; the
cross-CTA reduction is one argmax over the CTAs' partial (value, index) pairs.

Top-k / top-p keep the tokens whose scaled logit x is >= a threshold; every CTA works with the others
(`filtered_pick`) over an even slice of the vocabulary each, meeting through integer atomics (their sums do not
depend on the order the CTAs come in, so every CTA reads the same sums and a seed gives the same tokens):

- round 0: each CTA publishes its LM tiles' max scaled logit and best Gumbel score and meets the others: the
  grid's max M and the temperature draw over the whole vocabulary (the best score) are known;
- top-k: a multi-way search for the largest threshold keeping >= k tokens. A round has SAMPLE_CANDS candidates
  ascending from a bound known to pass (lo) towards one known to fail (hi): lo itself, the next float above lo,
  then an even spread. Every CTA counts over its slice the tokens >= each candidate, the least value >= each
  and the greatest value below each. The last passing candidate's least value becomes lo (a token's value), the
  next candidate hi. Found when no token value lies strictly between lo and hi (ties at the boundary stay),
  lo's next float fails, one token is left between the bounds, lo keeps exactly k, or after SAMPLE_ROUNDS
  rounds (lo: a superset by less than the candidates' spacing). Each CTA then draws Gumbel-max among its
  slice's tokens >= lo, and the token's last CTA reduces the CTAs' draws as the greedy path does;
- top-p tests draws instead of searching for the threshold. The nucleus is an upper set: a token of value v is
  in it iff the kept mass strictly above v is < top_p of the kept mass (all of it, or the top-k set's, as
  kog.engine.reference.sample_next renormalises after top-k). The first draw is round 0's when it is kept
  (otherwise a round draws among the kept tokens first). Each round every CTA sums over its slice the kept
  mass, the mass above the draw and the best Gumbel score above it; an accepted draw is the token, a
  rejected one (every token at or below its value is outside the nucleus too) gives way to the best score
  above it. The same scores serve every round: the best score within a set of tokens is a draw from the
  set's softmax independently of the scores outside it and of the set's own best value, so the accepted
  token follows the nucleus's renormalised distribution exactly. A draw is rejected with probability under
  1 - top_p at first, so top-p 0.9 mostly takes one round; after SAMPLE_P_ROUNDS (tiny top_p on a flat
  distribution) the last draw stands, from a superset of the nucleus.

Tokens more than FLOOR below the max (probability < e^-60) are never kept. Every meeting is a bounded wait
(sync.spin_until, E_SAMPLE). `sample_tokens` runs the same code on a logits vector for tests, with a grid of
several CTAs simulated by one program (it posts every CTA's part of a round, then meets itself that often).
"""
from __future__ import annotations

from collections import namedtuple

import torch
import triton
import triton.language as tl

from kog.engine.kernel.names import (E_SAMPLE, SAMPLE_CANDS, SAMPLE_P_BOUNDS, SAMPLE_P_ROUNDS, SAMPLE_P_ROW,
                                     SAMPLE_PICK, SAMPLE_ROUNDS, SAMPLE_ROW, SAMPLE_SEARCH, SAMPLE_WORDS)
from kog.engine.kernel.sync import spin_until
from kog.engine.kernel.vendor import prefetch_l1

SAMPLE_GREEDY, SAMPLE_GUMBEL, SAMPLE_FILTERED = 0, 1, 2

FLOOR = tl.constexpr(60.0)
MASS_ONE = tl.constexpr(1099511627776.0)    # 2**40: softmax mass (each token's <= 1) in fixed point
KEY_TOP = tl.constexpr(2147483648)          # 2**31: float order keys travel offset by it, as non-negative int64

# the search's memory: the LM tiles' scaled logits [V] and their Gumbel scores [V] (scaled logit + the seeded
# noise, as temperature sampling's), each CTA's LM-tile max [grid], the rounds' int64 sums (layout.py's
# SAMPLE_* offsets), the arrival words (sync + S_SAMPLE)
Filter = namedtuple("Filter", "logits scores maxima search arrivals")


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
def post_draw(f, score, token):
    """Round 0: add a CTA's best (Gumbel score, token) to the grid's, before it meets the others."""
    tl.atomic_max(f.search + SAMPLE_PICK, _draw_key(score, token), sem="relaxed", scope="gpu")


# ---- top-k / top-p over the whole grid ------------------------------------------------------------------------

@triton.jit(noinline=True)
def filtered_pick(f, c_lo, c_hi, nprog, V, top_k, top_p, sy, VENDOR: tl.constexpr, BV: tl.constexpr):
    """(score, token) of the draw among the tokens of slices c_lo..c_hi-1 that pass top-k / top-p, once this
    CTA's LM-tile max is in f.maxima and its best score posted (post_draw). The kernel passes its own CTA
    (c_hi = c_lo + 1); the test kernel a whole simulated grid. Returns after nprog CTAs met at every round.

    A call, not inlined: inlined, its rounds made ptxas lay out the whole kernel's GEMV chunk loops
    differently (their reductions' shared stores as branches), and the weight stream slowed (docs/engine-notes.md)."""
    _meet(f.arrivals, 0, c_hi - c_lo, nprog, sy, VENDOR)
    M = _grid_max(f.maxima, nprog)
    per = (V + nprog - 1) // nprog
    tau = M - FLOOR
    if (top_k > 0) & (top_k < V):
        tau = _top_k_threshold(f, c_lo, c_hi, nprog, per, V, M, tau, top_k, sy, VENDOR, BV)
    if top_p < 1.0:
        s, t = _nucleus_draw(f, c_lo, c_hi, nprog, per, V, M, tau, top_p, sy, VENDOR, 8 * BV)
    else:
        s, t = _draw(f, c_lo, c_hi, per, V, tau, 8 * BV, VENDOR)
    return s, t


@triton.jit
def _top_k_threshold(f, c_lo, c_hi, nprog, per, V, M, floor, top_k, sy, VENDOR: tl.constexpr, BV: tl.constexpr):
    """The largest threshold keeping >= top_k tokens: the multi-way search (module docstring), arrival words
    1..SAMPLE_ROUNDS."""
    NC: tl.constexpr = SAMPLE_CANDS
    lo = floor
    hi = _next_up(M)
    cnt_hi = tl.full([], 0, tl.int64)
    below_hi = M         # the greatest token value below hi
    found = 0
    for r in range(0, SAMPLE_ROUNDS):
        if found == 0:
            cands = _candidates(lo, hi, NC)
            row = f.search + r * SAMPLE_ROW
            for c in range(c_lo, c_hi):
                v_hi = tl.minimum(c * per + per, V)
                cnt, least, below = _slice_stats(f.logits, c * per, v_hi, cands, NC, BV, VENDOR)
                _post(row, cnt, least, below, NC)
            _meet(f.arrivals, 1 + r, c_hi - c_lo, nprog, sy, VENDOR)
            cnt, least, below = _round_sums(row, NC)
            lo, hi, cnt_hi, below_hi, done = _narrow(cnt >= top_k, cnt, least, below, cands, hi, cnt_hi, below_hi,
                                                     top_k, NC)
            found = tl.where(done, 1, 0)
    return lo


@triton.jit
def _nucleus_draw(f, c_lo, c_hi, nprog, per, V, M, tau, top_p, sy, VENDOR: tl.constexpr, BV: tl.constexpr):
    """(score, token) drawn from top-p's nucleus within the tokens >= tau: round 0's draw when kept, tested and
    replaced until one is accepted (module docstring), arrival words from 1 + SAMPLE_ROUNDS (after top-k's)."""
    NB: tl.constexpr = SAMPLE_P_BOUNDS
    j = tl.arange(0, NB)
    s, t = _draw_of(tl.load(f.search + SAMPLE_PICK, cache_modifier=".cg"))
    x = tl.load(f.logits + t, mask=t >= 0, other=float("-inf"), cache_modifier=".cg")
    t = tl.where(x >= tau, t, -1)         # not kept (below top-k's threshold): draw among the kept tokens first
    bounds = _bounds(t, x, tau, M, NB)
    done = 0
    for r in range(0, SAMPLE_P_ROUNDS):
        if done == 0:
            row = f.search + SAMPLE_PICK + SAMPLE_P_ROW + r * SAMPLE_P_ROW
            for c in range(c_lo, c_hi):
                v_hi = tl.minimum(c * per + per, V)
                kept, above, best, best_i = _nucleus_stats(f, c * per, v_hi, tau, bounds, M, NB, BV, VENDOR)
                tl.atomic_add(row, (kept * MASS_ONE).to(tl.int64), sem="relaxed", scope="gpu")
                tl.atomic_add(row + 1 + j, (above * MASS_ONE).to(tl.int64), sem="relaxed", scope="gpu")
                tl.atomic_max(row + 1 + NB + j, _draw_key(best, best_i), sem="relaxed", scope="gpu")
            _meet(f.arrivals, 1 + SAMPLE_ROUNDS + r, c_hi - c_lo, nprog, sy, VENDOR)
            need = tl.load(row, cache_modifier=".cg").to(tl.float64) * top_p
            outside = tl.load(row + 1 + j, cache_modifier=".cg").to(tl.float64) >= need
            reject = (t < 0) | (tl.max(tl.where(j == 0, outside, False), axis=0) != 0)
            if reject:      # every token at or below the highest bound J with that much mass above is out
                J = tl.max(tl.where(outside, j, 0), axis=0)
                s, t = _draw_of(tl.max(tl.where(j == J, tl.load(row + 1 + NB + j, cache_modifier=".cg"), 0),
                                       axis=0))
                x = tl.load(f.logits + t, mask=t >= 0, other=float("-inf"), cache_modifier=".cg")
                bounds = _bounds(t, x, tau, M, NB)
            done = tl.where(reject & (t >= 0) & (r < SAMPLE_P_ROUNDS - 1), 0, 1)
    return s, t


@triton.jit
def _bounds(t, x, tau, M, NB: tl.constexpr):
    """A round's NB ascending bounds: the draw's value (-inf without a draw: every kept token is above it), then
    an even spread from it (or tau) towards the max M, whose masses above let a rejection rule out more than
    the tokens up to the draw's value."""
    j = tl.arange(0, NB)
    base = tl.where(t >= 0, x, tau)
    spread = base + (M - base) * (j.to(tl.float32) / NB)
    return tl.where(j == 0, tl.where(t >= 0, x, float("-inf")), spread)


@triton.jit
def _nucleus_stats(f, v_lo, v_hi, tau, bounds, M, NB: tl.constexpr, BV: tl.constexpr, VENDOR: tl.constexpr):
    """Over f's slice v_lo..v_hi-1: the kept tokens' (x >= tau) mass exp(x - M), and per bound the mass of the
    kept tokens above it and their best (Gumbel score, token) ((-inf, 0) if none)."""
    prefetch_l1(f.logits, v_lo, v_hi, VENDOR)
    prefetch_l1(f.scores, v_lo, v_hi, VENDOR)
    rv = tl.arange(0, BV)
    kept = tl.zeros([BV], dtype=tl.float32)
    above = tl.zeros([NB, BV], dtype=tl.float32)
    best = tl.full([NB, BV], float("-inf"), tl.float32)
    best_i = tl.zeros([NB, BV], dtype=tl.int32)
    for v0 in range(v_lo, v_hi, BV):
        idx = v0 + rv
        x = tl.load(f.logits + idx, mask=idx < v_hi, other=float("-inf"))
        s = tl.load(f.scores + idx, mask=idx < v_hi, other=float("-inf"))
        e = tl.where(x >= tau, tl.exp(x - M), 0.0)
        kept += e
        up = (x[None, :] > bounds[:, None]) & (x >= tau)[None, :]
        above += tl.where(up, e[None, :], 0.0)
        take = up & (s[None, :] > best)
        best = tl.where(take, s[None, :], best)
        best_i = tl.where(take, idx[None, :], best_i)
    b = tl.max(best, axis=1)
    bi = tl.min(tl.where(best == b[:, None], best_i, 2147483647), axis=1)
    return tl.sum(kept, axis=0), tl.sum(above, axis=1), b, bi


@triton.jit
def _draw_key(score, token):
    """(score, token) as an int64 that orders as the score, ties to the lower token; 0: none (score -inf or
    NaN)."""
    hi = (_order_key(score.to(tl.int32, bitcast=True)).to(tl.int64) + KEY_TOP) << 31
    return tl.where(score > float("-inf"), hi + (2147483647 - token).to(tl.int64), 0)


@triton.jit
def _draw_of(key):
    """_draw_key's inverse: (score, token), (-inf, -1) for none."""
    bits = _order_key(((key >> 31) - KEY_TOP).to(tl.int32))
    token = (2147483647 - (key & 2147483647)).to(tl.int32)
    return tl.where(key > 0, bits.to(tl.float32, bitcast=True), float("-inf")), tl.where(key > 0, token, -1)


@triton.jit
def _narrow(passes, cnt, least, below, cands, hi, cnt_hi, below_hi, k, NC: tl.constexpr):
    """(lo, hi, tokens >= hi, the greatest value below hi, found) after a round: the last passing candidate J
    (lo itself always passes) gives lo, as the least token value >= it (the same tokens pass), and the next
    candidate hi. Found: no token value lies between lo and hi (every token in [lo, hi) equals lo), lo's next
    float fails (J = 0: lo is the threshold), one token is left in [lo, hi), or lo keeps exactly k."""
    j = tl.arange(0, NC)
    J = tl.max(tl.where(passes | (j == 0), j, 0), axis=0)
    cnt_lo = tl.sum(tl.where(j == J, cnt, 0), axis=0)
    cnt_up = tl.where(J == NC - 1, cnt_hi, tl.sum(tl.where(j == J + 1, cnt, 0), axis=0))
    below_up = tl.where(J == NC - 1, below_hi, tl.max(tl.where(j == J + 1, below, float("-inf")), axis=0))
    hi = tl.where(J == NC - 1, hi, tl.min(tl.where(j == J + 1, cands, float("inf")), axis=0))
    lo = tl.min(tl.where(j == J, least, float("inf")), axis=0)
    found = (J == 0) | (cnt_lo - cnt_up <= 1) | (cnt_lo == k) | (below_up == lo)
    return lo, hi, cnt_up, below_up, found


@triton.jit
def filtered_reset(f):
    """The token's last CTA, once every CTA has drawn: zero the search's sums and arrival words for the next
    token (which starts only after the release that follows)."""
    w = tl.arange(0, 256)
    for o in range(0, SAMPLE_SEARCH, 256):
        tl.store(f.search + o + w, tl.zeros([256], dtype=tl.int64), mask=o + w < SAMPLE_SEARCH)
    a = tl.arange(0, SAMPLE_WORDS)
    tl.store(f.arrivals + a, tl.zeros([SAMPLE_WORDS], dtype=tl.int32))


@triton.jit
def _meet(arrivals, r, n_here, nprog, sy, VENDOR: tl.constexpr):
    """Arrive (n_here CTAs: what this program posted) at round r and wait until all nprog have: every thread's
    stores and sums happen-before the release increment; the acquiring poll that sees nprog makes every
    CTA's visible here."""
    tl.debug_barrier()
    tl.atomic_add(arrivals + r, n_here, sem="release", scope="gpu")
    spin_until(arrivals + r, nprog, sy, E_SAMPLE, -1, VENDOR)


@triton.jit
def _grid_max(maxima, nprog):
    g = tl.arange(0, 256)
    m = float("-inf")
    for g0 in range(0, nprog, 256):
        m = tl.maximum(m, tl.max(tl.load(maxima + g0 + g, mask=g0 + g < nprog, other=float("-inf"),
                                         cache_modifier=".cg"), axis=0))
    return m


@triton.jit
def _next_up(x):
    """The smallest float above x."""
    b = x.to(tl.int32, bitcast=True)
    b = tl.where(x > 0, b + 1, tl.where(x < 0, b - 1, 1))
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _order_key(b):
    """An int32 that orders as the float whose bits are b does (negative: magnitude bits flipped); its own
    inverse."""
    return tl.where(b < 0, b ^ 2147483647, b)


@triton.jit
def _candidates(lo, hi, NC: tl.constexpr):
    """NC ascending thresholds: lo, the next float above it, then NC - 2 spread evenly from lo towards hi
    (exclusive)."""
    j = tl.arange(0, NC)
    up = _next_up(lo)
    spread = lo + (hi - lo) * ((j - 2).to(tl.float32) / (NC - 2))
    return tl.where(j == 0, lo, tl.where(j == 1, up, tl.maximum(spread, up)))


@triton.jit
def _slice_stats(lbuf, v_lo, v_hi, cands, NC: tl.constexpr, BV: tl.constexpr, VENDOR: tl.constexpr):
    """Over lbuf[v_lo:v_hi], per candidate: tokens >= it, the least value >= it, the greatest value below it,
    accumulated per (candidate, lane) and reduced once. Those [NC, BV] accumulators take registers from the
    rest of the kernel, so BV is small; the slice is first prefetched into L1 (every round misses it: the
    meeting's acquire invalidated L1), so the chunks' loads do not each wait on L2."""
    prefetch_l1(lbuf, v_lo, v_hi, VENDOR)
    rv = tl.arange(0, BV)
    cnt = tl.zeros([NC, BV], dtype=tl.int32)
    least = tl.full([NC, BV], float("inf"), tl.float32)
    below = tl.full([NC, BV], float("-inf"), tl.float32)
    for v0 in range(v_lo, v_hi, BV):
        x = tl.load(lbuf + v0 + rv, mask=v0 + rv < v_hi, other=float("-inf"))
        ge = x[None, :] >= cands[:, None]
        cnt += ge.to(tl.int32)
        least = tl.minimum(least, tl.where(ge, x[None, :], float("inf")))
        below = tl.maximum(below, tl.where(ge, float("-inf"), x[None, :]))
    return tl.sum(cnt, axis=1), tl.min(least, axis=1), tl.max(below, axis=1)


@triton.jit
def _post(row, cnt, least, below, NC: tl.constexpr):
    """Add one slice's statistics to the round's sums (order-independent integer atomics)."""
    j = tl.arange(0, NC)
    tl.atomic_add(row + j, cnt.to(tl.int64), sem="relaxed", scope="gpu")
    key = KEY_TOP - _order_key(least.to(tl.int32, bitcast=True)).to(tl.int64)
    tl.atomic_max(row + NC + j, tl.where(least < float("inf"), key, 0), sem="relaxed", scope="gpu")
    key = KEY_TOP + _order_key(below.to(tl.int32, bitcast=True)).to(tl.int64)
    tl.atomic_max(row + 2 * NC + j, tl.where(below > float("-inf"), key, 0), sem="relaxed", scope="gpu")


@triton.jit
def _round_sums(row, NC: tl.constexpr):
    """A top-k round's sums once every CTA met: counts, least values (+inf: none), greatest values below (-inf:
    none)."""
    j = tl.arange(0, NC)
    cnt = tl.load(row + j, cache_modifier=".cg")
    key = tl.load(row + NC + j, cache_modifier=".cg")
    bits = _order_key(tl.where(key > 0, KEY_TOP - key, 0).to(tl.int32))
    least = tl.where(key > 0, bits.to(tl.float32, bitcast=True), float("inf"))
    key = tl.load(row + 2 * NC + j, cache_modifier=".cg")
    bits = _order_key(tl.where(key > 0, key - KEY_TOP, 0).to(tl.int32))
    return cnt, least, tl.where(key > 0, bits.to(tl.float32, bitcast=True), float("-inf"))


@triton.jit
def _draw(f, c_lo, c_hi, per, V, tau, BV: tl.constexpr, VENDOR: tl.constexpr):
    """Gumbel-max among the tokens >= tau of slices c_lo..c_hi-1 (their scores came with the LM tiles):
    (score, token), (-inf, some token) if none. Each lane keeps its best (ties: its first), reduced once."""
    rv = tl.arange(0, BV)
    v_lo = c_lo * per
    v_hi = tl.minimum(c_hi * per, V)
    prefetch_l1(f.logits, v_lo, v_hi, VENDOR)
    prefetch_l1(f.scores, v_lo, v_hi, VENDOR)
    best = tl.full([BV], float("-inf"), tl.float32)
    best_i = tl.zeros([BV], dtype=tl.int32)
    for v0 in range(v_lo, v_hi, BV):
        idx = v0 + rv
        x = tl.load(f.logits + idx, mask=idx < v_hi, other=float("-inf"))
        s = tl.load(f.scores + idx, mask=idx < v_hi, other=float("-inf"))
        take = (x >= tau) & (s > best)
        best = tl.where(take, s, best)
        best_i = tl.where(take, idx, best_i)
    return tile_best(best, best_i, rv >= 0)


# ---- the test entry ---------------------------------------------------------------------------------------------

@triton.jit
def _sample_kernel(logits_ptr, f, sy, out_ptr, rounds_ptr, V, n_samples, ctas, nprog, seed, inv_temp, top_k, top_p,
                   SAMPLE: tl.constexpr, BN: tl.constexpr, BV: tl.constexpr):
    # The monokernel's sampling on one logits vector, n_samples times (steps 0..n-1): tiles of BN tokens dealt
    # round-robin to `ctas` simulated CTAs (their LM tiles), the search over their even slices.
    rn = tl.arange(0, BN)
    g = tl.arange(0, 64)
    for step in range(n_samples):
        best = float("-inf")
        best_i = 0
        if SAMPLE == 2:
            tl.store(f.maxima + g, tl.full([64], float("-inf"), tl.float32), mask=g < ctas)
        for r0 in range(0, V, BN):
            idx = r0 + rn
            m = idx < V
            lg = tl.load(logits_ptr + idx, mask=m, other=float("-inf"))
            if SAMPLE == 2:
                sc = lg * inv_temp
                tl.store(f.logits + idx, sc, mask=m)
                gs = gumbel_scores(lg, idx, step, seed, inv_temp, V, 1)
                tl.store(f.scores + idx, gs, mask=m)
                b, bi = tile_best(gs, idx, m)
                post_draw(f, b, bi)
                c = (r0 // BN) % ctas
                top = tl.max(tl.where(m, sc, float("-inf")), axis=0)
                tl.store(f.maxima + c, tl.maximum(tl.load(f.maxima + c), top))
            else:
                sc = gumbel_scores(lg, idx, step, seed, inv_temp, V, SAMPLE)
                b, bi = tile_best(sc, idx, m)
                take = b > best
                best = tl.where(take, b, best)
                best_i = tl.where(take, bi, best_i)
        if SAMPLE == 2:
            best, best_i = filtered_pick(f, 0, ctas, nprog, V, top_k, top_p, sy, 0, BV)
            a = tl.arange(0, SAMPLE_WORDS)
            tl.store(rounds_ptr + step, tl.sum((tl.load(f.arrivals + a) > 0).to(tl.int32), axis=0) - 1)
            filtered_reset(f)
        tl.store(out_ptr + step, best_i)


def sample_mode(temperature: float, top_k: int, top_p: float) -> int:
    if temperature <= 0.0:
        return SAMPLE_GREEDY
    if top_k > 0 or top_p < 1.0:
        return SAMPLE_FILTERED
    return SAMPLE_GUMBEL


def sample_tokens(logits: torch.Tensor, n: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                  seed: int = 0, ctas: int = 3, rounds: torch.Tensor | None = None, absent: int = 0) -> torch.Tensor:
    """Draw n tokens (steps 0..n-1) from one logits vector with the monokernel's sampling code, the vocabulary
    spread over `ctas` simulated CTAs (<= 64). `rounds` (int32 [n]), if given, receives each draw's search
    rounds. `absent` more CTAs make up the grid but never arrive: the search's first meeting times out
    (SamplingTimeout)."""
    from kog.engine import layout as LY
    V = logits.numel()
    dev = logits.device
    logits = logits.float().contiguous()
    out = torch.empty(n, dtype=torch.int32, device=dev)
    rounds = rounds if rounds is not None else torch.zeros(n, dtype=torch.int32, device=dev)
    f = Filter(torch.empty(V, dtype=torch.float32, device=dev), torch.empty(V, dtype=torch.float32, device=dev),
               torch.empty(64, dtype=torch.float32, device=dev),
               torch.zeros(LY.SAMPLE_SEARCH, dtype=torch.int64, device=dev),
               torch.zeros(LY.SAMPLE_WORDS, dtype=torch.int32, device=dev))
    # the simulated CTAs arrive in program order, so a wait that is met never waits: the bound only ends the
    # `absent` CTAs' meeting
    sy = LY.SyncArgs(torch.zeros(8, dtype=torch.int32, device=dev), torch.zeros(8, dtype=torch.int32, device=dev),
                     int(ABSENT_WAIT_S * 1e9))
    mode = sample_mode(temperature, top_k, top_p)
    inv_t = 1.0 / temperature if temperature > 0 else 1.0
    _sample_kernel[(1,)](logits, f, sy, out, rounds, V, n, ctas, ctas + absent, seed, inv_t, top_k, float(top_p),
                         SAMPLE=mode, BN=16, BV=64)
    if int(sy.err[0]):
        raise SamplingTimeout(sy.err[:5].tolist())
    return out


ABSENT_WAIT_S = 0.2       # sample_tokens' wait bound (seconds)


class SamplingTimeout(RuntimeError):
    """A bounded wait of sample_tokens' kernel gave up; .record is the kernel's [1, what, task, target, value]."""

    def __init__(self, record: list[int]):
        super().__init__(f"a wait timed out: {record}")
        self.record = record
