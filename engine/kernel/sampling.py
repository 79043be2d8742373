"""In-kernel sampling: pieces the monokernel's LM-head tiles and its token end run.

Greedy and temperature sampling are fully distributed with the Gumbel-max trick: a token drawn from
softmax(logits / T) is argmax(logits / T + G) with G_i = -log(-log(U_i)) i.i.d., so every vocab tile
adds seeded noise (Philox via tl.rand, keyed by seed, step and token id) and keeps its own max; the
cross-CTA reduction is one argmax over the CTAs' partial (value, index) pairs.

Top-k / top-p need a global threshold tau (keep the tokens whose scaled logit x >= tau), found by every CTA
together (`filtered_pick`), over an even slice of the vocabulary each:

- round 0: each CTA publishes its LM tiles' max and meets the others: the grid's max M is known and every
  tile's scaled logits are out;
- then a multi-way search per threshold, top-k's first (the largest tau keeping >= k tokens), then top-p's
  within it (the largest tau keeping >= top_p of the top-k set's mass, as kog.engine.reference.sample_next
  renormalises after top-k). A round has SAMPLE_CANDS candidates ascending from a bound known to pass
  (lo) towards one known to fail (hi): lo itself, the next float above lo, then an even spread. Every CTA
  counts over its slice the tokens >= each candidate, their softmax mass, the least value >= each and the
  greatest value below each, adds them to the round's sums (integer atomics: the sums do not depend on the
  order the CTAs come in, so every CTA reads the same sums, narrows to the same bounds, and a seed gives the
  same tokens) and meets the others. The last passing candidate's least value becomes lo (a token's value),
  the next candidate hi. The threshold is found when no token value lies strictly between lo and hi (the
  greatest value below hi is lo; lo is the answer: ties at the boundary stay), lo's next float fails, one
  token is left between the bounds, top-k keeps exactly k, or after SAMPLE_ROUNDS rounds (lo, a superset
  by less than the candidates' spacing). Logits are rounded to the model dtype, so a couple of rounds
  usually end it;
- each CTA draws Gumbel-max among its slice's tokens >= tau; the token's last CTA reduces the (value, id)
  pairs as the greedy path does, and zeroes the search's sums and arrival words for the next token.

Tokens more than FLOOR below the max (probability < e^-60) are never kept. Every meeting is a bounded wait
(sync.spin_until, E_SAMPLE). `sample_tokens` runs the same code on a logits vector for tests, with a grid of
several CTAs simulated by one program (it posts every CTA's part of a round, then meets itself that often).
"""
from __future__ import annotations

from collections import namedtuple

import torch
import triton
import triton.language as tl

from kog.engine.kernel.names import E_SAMPLE, SAMPLE_CANDS, SAMPLE_ROUNDS, SAMPLE_ROW, SAMPLE_WORDS
from kog.engine.kernel.sync import spin_until
from kog.engine.kernel.vendor import prefetch_l1

SAMPLE_GREEDY, SAMPLE_GUMBEL, SAMPLE_FILTERED = 0, 1, 2

FLOOR = tl.constexpr(60.0)
MASS_ONE = tl.constexpr(1099511627776.0)    # 2**40: softmax mass (each token's <= 1) in fixed point
KEY_TOP = tl.constexpr(2147483648)          # 2**31: least values travel as KEY_TOP - order key (0: none)

# the search's memory: the LM tiles' scaled logits [V] and their Gumbel scores [V] (scaled logit + the seeded
# noise, as temperature sampling's), each CTA's LM-tile max [grid], per round SAMPLE_ROW int64 sums, the
# arrival words (sync + S_SAMPLE)
Filter = namedtuple("Filter", "logits scores maxima sums arrivals")


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


# ---- top-k / top-p over the whole grid ------------------------------------------------------------------------

@triton.jit(noinline=True)
def filtered_pick(f, c_lo, c_hi, nprog, V, top_k, top_p, sy, VENDOR: tl.constexpr, BV: tl.constexpr):
    """(score, token) of the Gumbel-max draw among the tokens of slices c_lo..c_hi-1 that pass top-k / top-p,
    once this CTA's LM-tile max is in f.maxima. The kernel passes its own CTA (c_hi = c_lo + 1); the test
    kernel a whole simulated grid. Returns after nprog CTAs met at every round.

    A call, not inlined: inlined, its rounds made ptxas lay out the whole kernel's GEMV chunk loops
    differently (their reductions' shared stores as branches), and the weight stream slowed (docs/engine-notes.md)."""
    NC: tl.constexpr = SAMPLE_CANDS
    j = tl.arange(0, NC)
    _meet(f.arrivals, 0, c_hi - c_lo, nprog, sy, VENDOR)
    M = _grid_max(f.maxima, nprog)
    per = (V + nprog - 1) // nprog
    floor = M - FLOOR
    p_on = top_p < 1.0
    phase = tl.where((top_k > 0) & (top_k < V), 0, tl.where(p_on, 1, 2))   # 0: top-k, 1: top-p, 2: found
    lo = floor
    hi = _next_up(M)
    a = _spread_start(phase, floor, M, V, top_p)
    cnt_hi = tl.full([], 0, tl.int64)
    below_hi = M         # the greatest token value below hi
    z = tl.full([], 0, tl.int64)
    first = 1
    rp = 0
    for r in range(0, 2 * SAMPLE_ROUNDS):
        if phase < 2:
            cands = _candidates(lo, a, hi, NC)
            row = f.sums + r * SAMPLE_ROW
            for c in range(c_lo, c_hi):
                v_hi = tl.minimum(c * per + per, V)
                cnt, mass, least, below = _slice_stats(f.logits, c * per, v_hi, cands, M, NC, BV, VENDOR)
                _post(row, cnt, mass, least, below, NC)
            _meet(f.arrivals, r + 1, c_hi - c_lo, nprog, sy, VENDOR)
            cnt, mass, least, below = _round_sums(row, NC)
            if first != 0:      # top-p's share is of the mass at or above its first round's lo
                z = tl.sum(tl.where(j == 0, mass, 0), axis=0)
            passes = tl.where(phase == 0, cnt >= top_k, mass.to(tl.float64) >= z.to(tl.float64) * top_p)
            k = tl.where(phase == 0, top_k, -1)
            lo, hi, cnt_hi, below_hi, found = _narrow(passes, cnt, least, below, cands, hi, cnt_hi, below_hi, k,
                                                      NC)
            a = lo
            first = 0
            rp += 1
            found = found | (rp == SAMPLE_ROUNDS)
            if found:
                if (phase == 0) & p_on:       # top-p next, within the top-k set
                    phase = 1
                    hi = _next_up(M)
                    cnt_hi = tl.full([], 0, tl.int64)
                    below_hi = M
                    a = _spread_start(phase, lo, M, V, top_p)
                    first = 1
                    rp = 0
                else:
                    phase = 2
    return _draw(f, c_lo, c_hi, per, V, lo, 8 * BV, VENDOR)    # every search found: lo is the threshold


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
    w = tl.arange(0, SAMPLE_ROW)
    for r in range(0, 2 * SAMPLE_ROUNDS):
        tl.store(f.sums + r * SAMPLE_ROW + w, tl.zeros([SAMPLE_ROW], dtype=tl.int64))
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
def _spread_start(phase, lo, M, V, top_p):
    """Where a search's first round starts its even spread. top-p: tokens below M - log(V / (1 - p)) hold
    less than 1 - p of a mass >= 1 (the max token's), so tau is above that (a unit lower, for rounding);
    top-k: from lo."""
    bound = M - tl.log(V / (1.0 - tl.minimum(top_p, 0.99999994))) - 1.0
    return tl.where(phase == 1, tl.maximum(lo, bound), lo)


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
def _candidates(lo, a, hi, NC: tl.constexpr):
    """NC ascending thresholds: lo, the next float above it, then NC - 2 spread evenly from a (>= lo) towards
    hi (exclusive)."""
    j = tl.arange(0, NC)
    up = _next_up(lo)
    spread = a + (hi - a) * ((j - 2).to(tl.float32) / (NC - 2))
    return tl.where(j == 0, lo, tl.where(j == 1, up, tl.maximum(spread, up)))


@triton.jit
def _slice_stats(lbuf, v_lo, v_hi, cands, M, NC: tl.constexpr, BV: tl.constexpr, VENDOR: tl.constexpr):
    """Over lbuf[v_lo:v_hi], per candidate: tokens >= it, their mass exp(x - M), the least value >= it, the
    greatest value below it, accumulated per (candidate, lane) and reduced once. Those [NC, BV] accumulators
    take registers from the rest of the kernel, so BV is small; the slice is first prefetched into L1 (every
    round misses it: the meeting's acquire invalidated L1), so the chunks' loads do not each wait on L2."""
    prefetch_l1(lbuf, v_lo, v_hi, VENDOR)
    rv = tl.arange(0, BV)
    cnt = tl.zeros([NC, BV], dtype=tl.int32)
    mass = tl.zeros([NC, BV], dtype=tl.float32)
    least = tl.full([NC, BV], float("inf"), tl.float32)
    below = tl.full([NC, BV], float("-inf"), tl.float32)
    for v0 in range(v_lo, v_hi, BV):
        x = tl.load(lbuf + v0 + rv, mask=v0 + rv < v_hi, other=float("-inf"))
        ge = x[None, :] >= cands[:, None]
        cnt += ge.to(tl.int32)
        mass += tl.where(ge, tl.exp(x - M)[None, :], 0.0)
        least = tl.minimum(least, tl.where(ge, x[None, :], float("inf")))
        below = tl.maximum(below, tl.where(ge, float("-inf"), x[None, :]))
    return tl.sum(cnt, axis=1), tl.sum(mass, axis=1), tl.min(least, axis=1), tl.max(below, axis=1)


@triton.jit
def _post(row, cnt, mass, least, below, NC: tl.constexpr):
    """Add one slice's statistics to the round's sums (order-independent integer atomics)."""
    j = tl.arange(0, NC)
    tl.atomic_add(row + j, cnt.to(tl.int64), sem="relaxed", scope="gpu")
    tl.atomic_add(row + NC + j, (mass * MASS_ONE).to(tl.int64), sem="relaxed", scope="gpu")
    key = KEY_TOP - _order_key(least.to(tl.int32, bitcast=True)).to(tl.int64)
    tl.atomic_max(row + 2 * NC + j, tl.where(least < float("inf"), key, 0), sem="relaxed", scope="gpu")
    key = KEY_TOP + _order_key(below.to(tl.int32, bitcast=True)).to(tl.int64)
    tl.atomic_max(row + 3 * NC + j, tl.where(below > float("-inf"), key, 0), sem="relaxed", scope="gpu")


@triton.jit
def _round_sums(row, NC: tl.constexpr):
    """The round's sums once every CTA met: counts, masses (fixed point), least values (+inf: none), greatest
    values below (-inf: none)."""
    j = tl.arange(0, NC)
    cnt = tl.load(row + j, cache_modifier=".cg")
    mass = tl.load(row + NC + j, cache_modifier=".cg")
    key = tl.load(row + 2 * NC + j, cache_modifier=".cg")
    bits = _order_key(tl.where(key > 0, KEY_TOP - key, 0).to(tl.int32))
    least = tl.where(key > 0, bits.to(tl.float32, bitcast=True), float("inf"))
    key = tl.load(row + 3 * NC + j, cache_modifier=".cg")
    bits = _order_key(tl.where(key > 0, key - KEY_TOP, 0).to(tl.int32))
    return cnt, mass, least, tl.where(key > 0, bits.to(tl.float32, bitcast=True), float("-inf"))


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
                tl.store(f.scores + idx, gumbel_scores(lg, idx, step, seed, inv_temp, V, 1), mask=m)
                b, bi = tile_best(sc, idx, m)
                c = (r0 // BN) % ctas
                tl.store(f.maxima + c, tl.maximum(tl.load(f.maxima + c), b))
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
               torch.zeros(2 * LY.SAMPLE_ROUNDS * LY.SAMPLE_ROW, dtype=torch.int64, device=dev),
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
