"""A task's GEMV: BN rows of one weight matrix times the input vector, one K step at a time.

Two ways to get the weights, one entry point (`gemv`):
  ring    (EngineConfig.weight_ring, the sm_90 default): the chunks come from the CTA's shared-memory ring,
          requested several chunks ahead across tasks (kernel/ring.py). Per K step: top the ring up, wait for
          the input's counters, wait for the chunk, multiply.
  direct  (AMD, older NVIDIA, tensor parallelism): each K step's weight tile is loaded from global memory
          BEFORE the wait for the matching input, so the HBM stream does not stop at a dependency.

The input is the layer's activation vector (float32), RMS-normed where the matrix consumes a norm (qkv,
gate_up, the LM head): with one K step spanning K the vector is normalized first, exactly as HF does; over
several steps the 1/rms scale is applied to the dot products instead (same math, other rounding).

The ring keeps the input in registers across a CTA's tasks of a phase when one chunk spans it (`XCache`):
normed (qkv, gate_up, the LM head) or raw (O, XRAW) as float pairs, or down's input as model-dtype words (XW,
the rounding HF itself applies there). A CTA runs ~60 LM tasks a token on the same input: the cache saves the
input's reload from L2 and its sum of squares across the CTA for all but the first.
"""
from collections import namedtuple

import triton
import triton.language as tl

from kog.engine.kernel.names import WOFF_COLS
from kog.engine.kernel.numerics import rnd
from kog.engine.kernel.ring import RingCursor, pack_pairs, ring_fill, ring_tile, ring_wait, unpack_words
from kog.engine.kernel.sync import timed_wait_rows

# the input of a GEMV: its vector, the RMSNorm weight (when normed), the first counter of its buffer, rows per
# counter, and the key of the cache (the vector's offset and the token) under which the ring may keep it
GemvInput = namedtuple("GemvInput", "x g wait R key")
# inputs kept in registers by the ring path: float pairs (l, h) under `key`, model-dtype words d under `dkey`
XCache = namedtuple("XCache", "l h key d dkey")


@triton.jit
def gemv(inp, layer, tile, t1, task, eps, wc, rc, xc, rs, mw, pa, sy, cta, S, C):
    """(acc, acc2, waited, wc, rc, xc): the task's BN rows of the matrix S describes (GemvSpec) times its input
    (acc2: gate_up's up rows), the ns it waited (traced runs), and the updated wait cache, ring cursor and
    input cache. The 1/rms scale of a normed input is applied."""
    if C.RING > 0:
        acc, acc2, waited, wc, rc, xc = _gemv_ring(inp, t1, task, eps, wc, rc, xc, rs, mw.w, pa, sy, cta, S, C)
    else:
        DT: tl.constexpr = mw.w.dtype.element_ty
        wo = mw.woff + layer * WOFF_COLS
        off = tl.load(wo + S.WCOL).to(tl.int64) * 64 + tile * (S.BN * S.K)
        acc2 = tl.zeros([S.BN], dtype=tl.float32)
        if S.GU:
            off2 = tl.load(wo + S.WCOL + 1).to(tl.int64) * 64 + tile * (S.BN * S.K)
            acc, acc2, waited, wc = _gemv_direct(mw.w, off, off2, inp, t1, task, eps, wc, pa, sy, S.K, S.BN, S.BK,
                                                 S.NORM, True, 0, 0, C)
        elif S.RANKS == 1:
            acc, _, waited, wc = _gemv_direct(mw.w, off, off, inp, t1, task, eps, wc, pa, sy, S.K, S.BN, S.BK,
                                              S.NORM, False, 0, 0, C)
        else:
            # EngineConfig.tp_compat: the row as S.RANKS tensor-parallel ranks reduce it, each rank's K slice
            # reduced alone and rounded, the slices added in rank order in float32 (the exchange's sum)
            acc = tl.zeros([S.BN], dtype=tl.float32)
            waited = tl.zeros([], dtype=tl.int64)
            for r in tl.static_range(S.RANKS):
                part, _, wt, wc = _gemv_direct(mw.w, off, off, inp, t1, task, eps, wc, pa, sy, S.K // S.RANKS,
                                               S.BN, S.BK, False, False, S.K, r * (S.K // S.RANKS), C)
                acc += rnd(part, DT)
                waited += wt
    return acc, acc2, waited, wc, rc, xc


@triton.jit
def rounded_sum(acc, DT: tl.constexpr, RANKS: tl.constexpr):
    """A row-parallel GEMV's result (O, down) in the model dtype where HF rounds it (a sum of rank slices is
    already a sum of rounded parts)."""
    if RANKS == 1:
        acc = rnd(acc, DT)
    return acc


# ---- direct: weight tiles from global memory ---------------------------------------------------------------

@triton.jit
def _load_tile(ptrs, kk, K: tl.constexpr, EVEN: tl.constexpr):
    """A weight tile, read once per token: evict_first, so the stream does not push the small data every task
    re-reads (task rows, counter targets, the input) out of L1 and L2."""
    if EVEN:
        w = tl.load(ptrs, eviction_policy="evict_first")
    else:
        w = tl.load(ptrs, mask=kk[None, :] < K, other=0.0, eviction_policy="evict_first")
    return w


@triton.jit
def _input_block(x_ptr, g_ptr, kk, eps, K: tl.constexpr, EVEN: tl.constexpr, NORM: tl.constexpr,
                 WHOLE: tl.constexpr, DT: tl.constexpr):
    """(x, x times the norm weight) of the input at kk. WHOLE (one block spans K): normalized first, as HF
    does. Plain cached loads: the acquire that made the data visible also invalidated this SM's L1."""
    if EVEN:
        x = tl.load(x_ptr + kk)
    else:
        x = tl.load(x_ptr + kk, mask=kk < K, other=0.0)
    xg = x
    if NORM:
        if EVEN:
            g = tl.load(g_ptr + kk)
        else:
            g = tl.load(g_ptr + kk, mask=kk < K, other=0.0)
        if WHOLE:
            r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / K + eps)
            xg = rnd(rnd(x * r, DT) * g, DT)
        else:
            xg = x * g
    return x, xg


@triton.jit
def _gemv_direct(w, off, off2, inp, t1, task, eps, wc, pa, sy, K: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, NORM: tl.constexpr, GU: tl.constexpr, KS: tl.constexpr, KB: tl.constexpr, C):
    """Rows [off, off + BN * K) of the packed weights (GU: and the up rows at off2) times the input, BK columns
    a step. KS > 0: the K-slice [KB, KB + K) of rows KS long (a tensor-parallel rank's slice)."""
    DT: tl.constexpr = w.dtype.element_ty
    EVEN: tl.constexpr = K % BK == 0
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    if KS == 0:
        wa = w + off + (rn * K).to(tl.int64)[:, None]
        wb = w + off2 + (rn * K).to(tl.int64)[:, None]
    else:
        wa = w + off + KB + (rn * KS).to(tl.int64)[:, None]
        wb = wa
    x0 = inp.x + KB
    acc = tl.zeros([BN], dtype=tl.float32)
    acc2 = tl.zeros([BN], dtype=tl.float32)
    ss = 0.0
    waited = tl.zeros([], dtype=tl.int64)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        ta = _load_tile(wa + kk[None, :], kk, K, EVEN)
        if GU:
            tb = _load_tile(wb + kk[None, :], kk, K, EVEN)
        if C.WAIT:
            wc, waited = timed_wait_rows(wc, pa, inp.wait, inp.R, KB + k0, KB + tl.minimum(k0 + BK, K), t1, sy,
                                         task, waited, C.TRACE, C.VENDOR)
        x, xg = _input_block(x0, inp.g, kk, eps, K, EVEN, NORM, K <= BK, DT)
        if NORM and K > BK:
            ss += tl.sum(x * x, axis=0)
        acc += tl.sum(ta.to(tl.float32) * xg[None, :], axis=1)
        if GU:
            acc2 += tl.sum(tb.to(tl.float32) * xg[None, :], axis=1)
    if NORM and K > BK:
        r = 1.0 / tl.sqrt(ss / K + eps)
        acc = acc * r
        acc2 = acc2 * r
    return acc, acc2, waited, wc


# ---- ring: weight chunks from shared memory ------------------------------------------------------------------

@triton.jit
def _x_pairs(inp, eps, k0, ne, K: tl.constexpr, BKC: tl.constexpr, NORM: tl.constexpr, DT: tl.constexpr,
             SSV: tl.constexpr):
    """x[k0 + 2j] and x[k0 + 2j + 1] (j < BKC / 2, columns >= ne read 0) to meet a ring chunk's word pairs,
    times the RMSNorm weight when NORM: normalized first, exactly as HF, when one chunk spans K (K <= BKC);
    else x * g, and ss = this chunk's sum of squares (the caller scales the dot product); SSV: ss per pair, not
    reduced (the caller sums the steps' vectors and reduces once)."""
    rj = tl.arange(0, BKC // 2)
    ok = 2 * rj < ne
    xl = tl.load(inp.x + k0 + 2 * rj, mask=ok, other=0.0)
    xh = tl.load(inp.x + k0 + 2 * rj + 1, mask=ok, other=0.0)
    ss = 0.0
    if NORM:
        gl = tl.load(inp.g + k0 + 2 * rj, mask=ok, other=0.0)
        gh = tl.load(inp.g + k0 + 2 * rj + 1, mask=ok, other=0.0)
        # one reduction for both halves: each is a shuffle chain, a shared-memory round and a CTA barrier
        if K <= BKC:
            r = 1.0 / tl.sqrt(tl.sum(xl * xl + xh * xh, axis=0) / K + eps)
            xl = rnd(rnd(xl * r, DT) * gl, DT)
            xh = rnd(rnd(xh * r, DT) * gh, DT)
        else:
            if SSV:
                ss = xl * xl + xh * xh
            else:
                ss = tl.sum(xl * xl + xh * xh, axis=0)
            xl = xl * gl
            xh = xh * gh
    elif SSV:
        ss = tl.zeros([BKC // 2], dtype=tl.float32)
    return xl, xh, ss


@triton.jit
def _ring_input(inp, k0, t1, task, eps, wc, waited, pa, sy, K: tl.constexpr, BKC: tl.constexpr,
                NORM: tl.constexpr, DT: tl.constexpr, SSV: tl.constexpr, C):
    """The input of the K step at k0 (nothing, all masked, when k0 >= K): wait for its rows' counters, then
    load its x pairs. Returns (xl, xh, ss, wc, waited)."""
    ne = tl.minimum(BKC, K - k0)
    if C.WAIT:
        if k0 < K:
            wc, waited = timed_wait_rows(wc, pa, inp.wait, inp.R, k0, k0 + ne, t1, sy, task, waited, C.TRACE,
                                         C.VENDOR)
    xl, xh, s2 = _x_pairs(inp, eps, k0, ne, K, BKC, NORM, DT, SSV)
    return xl, xh, s2, wc, waited


@triton.jit
def _gemv_ring(inp, t1, task, eps, wc, rc, xc, rs, w, pa, sy, cta, S, C):
    """gemv's ring path (see the module docstring). An RMS-normed input over several K steps: step k + 1's
    input is waited for and loaded before step k's chunk wait and math, so its L2 latency is not paid between
    two chunks, and the sum of squares is kept per thread and reduced once, not once a step."""
    DT: tl.constexpr = w.dtype.element_ty
    K: tl.constexpr = S.K
    BN: tl.constexpr = S.BN
    BKC: tl.constexpr = S.BK
    # the next step's input one step ahead only for an RMS-normed input: a held plain input cost registers and
    # speed where down spans several steps
    MULTI: tl.constexpr = (K > BKC) and S.NORM
    CACHED: tl.constexpr = (K <= BKC) and (S.NORM or S.XRAW)
    XWC: tl.constexpr = S.XW and (K <= BKC) and (not CACHED) and (DT != tl.float32)    # (words: 16-bit dtypes)
    xc_l = xc.l
    xc_h = xc.h
    xc_key = xc.key
    xd = xc.d
    xd_key = xc.dkey
    acc = tl.zeros([BN], dtype=tl.float32)
    acc2 = tl.zeros([BN], dtype=tl.float32)
    accg = tl.zeros([2 * BN], dtype=tl.float32)     # GU: gate rows then up rows, split after the K loop
    ssv = tl.zeros([BKC // 2], dtype=tl.float32)
    waited = tl.zeros([], dtype=tl.int64)
    if MULTI:    # step 0's input; each step then fetches the next one's (the copies are asked for first)
        rc = ring_fill(rs, rc, w, pa, cta, C)
        xn_l, xn_h, sn, wc, waited = _ring_input(inp, 0, t1, task, eps, wc, waited, pa, sy, K, BKC, S.NORM, DT,
                                                 True, C)
    cn = rc.cn
    for k0 in range(0, K, BKC):
        ne = tl.minimum(BKC, K - k0)
        rc = ring_fill(rs, RingCursor(cn, rc.pn), w, pa, cta, C)
        if MULTI:
            xl = xn_l
            xh = xn_h
            ssv += sn
            xn_l, xn_h, sn, wc, waited = _ring_input(inp, k0 + BKC, t1, task, eps, wc, waited, pa, sy, K, BKC,
                                                     S.NORM, DT, True, C)
        elif CACHED:
            if inp.key == xc_key:      # this token's input, as an earlier task of this CTA loaded (and normed) it
                xl = xc_l
                xh = xc_h
            else:
                xl, xh, s2, wc, waited = _ring_input(inp, k0, t1, task, eps, wc, waited, pa, sy, K, BKC, S.NORM, DT,
                                                     False, C)
                xc_l = xl
                xc_h = xh
                xc_key = inp.key
        elif XWC:
            if inp.key == xd_key:      # this token's input of this layer, as an earlier down task loaded it
                xl, xh = unpack_words(xd, DT)
            else:
                xl, xh, s2, wc, waited = _ring_input(inp, k0, t1, task, eps, wc, waited, pa, sy, K, BKC, S.NORM, DT,
                                                     False, C)
                xd = pack_pairs(xl, xh, DT)
                xd_key = inp.key
                # the first task computes with the words too, so every down task of the token sees one input
                xl, xh = unpack_words(xd, DT)
        else:
            xl, xh, s2, wc, waited = _ring_input(inp, k0, t1, task, eps, wc, waited, pa, sy, K, BKC, S.NORM, DT,
                                                 False, C)
        dep = ring_wait(rs, cn, sy, task, C)
        if S.GU:   # the gate and up rows of the chunk as ONE [2 BN, BKC / 2] tile: one row reduction, not two
            lo, hi = ring_tile(rs, cn, pa, cta, ne, dep, 2 * BN, BKC, DT, C)
            accg += tl.sum(lo * xl[None, :] + hi * xh[None, :], axis=1)
        else:
            lo, hi = ring_tile(rs, cn, pa, cta, ne, dep, BN, BKC, DT, C)
            acc += tl.sum(lo * xl[None, :] + hi * xh[None, :], axis=1)
        cn += 1
    if S.GU:
        acc, acc2 = tl.split(tl.trans(tl.reshape(accg, [2, BN])))
    if S.NORM:
        if MULTI:
            r = 1.0 / tl.sqrt(tl.sum(ssv, axis=0) / K + eps)
            acc = acc * r
            acc2 = acc2 * r
    return acc, acc2, waited, wc, RingCursor(cn, rc.pn), XCache(xc_l, xc_h, xc_key, xd, xd_key)
