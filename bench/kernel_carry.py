"""EXPERIMENT (not the engine; A/B it with `python3 bench/engine_check.py --alt bench/kernel_carry.py`): each
task's first weight chunk is loaded during the task before it and carried in registers as 32-bit words, x read
contiguously and split into even/odd elements. Never measured on a GPU in this form (see ENGINE_NOTES.md).
Ignores PFB (blocked prefetch) and has no TP path.

The monokernel: ONE persistent Triton launch that runs whole decode steps, sampling included.

Each CTA walks its task list (plan.py) once per token. Task bodies:
  qkv     rows of Wqkv (attn RMSNorm folded into the columns) . h[l]  * rstd(h[l]) (+ bias)
  attn    one KV head: q/k norm (Qwen3), RoPE, write k/v into the cache, online-softmax attention
  o       hmid[l] = h[l] + rows of Wo . attn[l]
  gate_up act[l] = silu(Wg' . hmid) * (Wu' . hmid) * rstd  (ffn RMSNorm folded)
  down    h[l+1] = hmid[l] + rows of Wdown . act[l]
  lm      logits = rows of Wlm' . h[L] * rstd (final norm folded) -> Gumbel-max / greedy tile best
  barrier (grid mode only) a global barrier
A CTA that finishes its token bumps `done`; the last one reduces the CTAs' best (value, token), writes the
token and the next embedding row, and releases `tok` so the next token's first layer may start.

Sync (MODE): targeted (1): a producer stores its tile, syncs the CTA, then increments its readiness counter
with release semantics; a consumer issues its weight loads FIRST, then waits (acquire) only on the counters
covering the rows it is about to read, so the HBM stream keeps flowing across phase boundaries.
grid (0): no counters; a global barrier after every phase (the conventional monokernel).

Every spin is bounded by max_spin polls; a timeout writes err = [1, counter, task, target, value] and
raises `abort`, which ends every other spin at once: the kernel finishes (with garbage) and the host raises.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kog.engine.sampling import filtered_sample, gumbel_scores, tile_best
from kog.engine.vendor import global_time_ns, poll_acquire, sm_id

# task types: keep in sync with plan.py
T_QKV: tl.constexpr = tl.constexpr(0)
T_ATTN: tl.constexpr = tl.constexpr(1)
T_O: tl.constexpr = tl.constexpr(2)
T_GU: tl.constexpr = tl.constexpr(3)
T_DOWN: tl.constexpr = tl.constexpr(4)
T_LM: tl.constexpr = tl.constexpr(5)
T_BAR: tl.constexpr = tl.constexpr(6)

# scalar sync words (int32) in `sync_ptr`
S_ABORT: tl.constexpr = tl.constexpr(0)
S_TOK: tl.constexpr = tl.constexpr(1)       # tokens whose embedding is ready (next token may start)
S_DONE: tl.constexpr = tl.constexpr(2)      # CTAs finished with the current token (monotonic)
S_BAR: tl.constexpr = tl.constexpr(3)       # grid-barrier arrivals (monotonic)
S_STOP: tl.constexpr = tl.constexpr(4)      # EOS seen
S_NTOK: tl.constexpr = tl.constexpr(5)      # tokens produced
S_SLOT: tl.constexpr = tl.constexpr(16)     # start-up rendezvous of the topology mapping
S_ARR: tl.constexpr = tl.constexpr(1024)    # per-KV-head arrivals of attention splits (monotonic)


@triton.jit
def _spin_until(ptr, target, sync_ptr, err_ptr, max_spin, what, task, VENDOR: tl.constexpr,
                SYS: tl.constexpr = False):
    """Wait (bounded) until *ptr >= target with acquire semantics. On timeout: record and abort everyone.

    Every poll is an acquire load (vendor.poll_acquire; SYS for words peer GPUs bump): the one that sees
    the target synchronizes with the producers' release increments, so the data they published (and no
    stale L1 copy of it) is what this CTA reads next."""
    if target > 0:
        v = poll_acquire(ptr, VENDOR, SYS)
        n = 0
        ab = 0
        while (v < target) & (n < max_spin) & (ab == 0):
            v = poll_acquire(ptr, VENDOR, SYS)
            n += 1
            if n % 64 == 0:
                ab = tl.load(sync_ptr + S_ABORT, volatile=True)
        if v < target:
            if ab == 0:
                if tl.atomic_cas(sync_ptr + S_ABORT, 0, 1) == 0:
                    tl.store(err_ptr + 0, 1)
                    tl.store(err_ptr + 1, what)
                    tl.store(err_ptr + 2, task)
                    tl.store(err_ptr + 3, target)
                    tl.store(err_ptr + 4, v)


@triton.jit
def _wait_rows(cnt_ptr, tgt_ptr, base, R, r0, r1, t1, rb, rm, sync_ptr, err_ptr, max_spin, task,
               VENDOR: tl.constexpr):
    """Wait until rows [r0, r1) of a buffer are ready for token t1-1 (counters base + r // R).

    (rb, rm) caches what this CTA already knows: counters base rb + 0..rm are ready for this token, so a
    CTA's second and later tasks of a phase skip the wait (and its L2 round trip) entirely."""
    c0 = r0 // R
    c1 = (r1 - 1) // R
    if base != rb:
        rb = base
        rm = -1
    for c in range(c0, c1 + 1):
        if c > rm:
            tgt = tl.load(tgt_ptr + base + c) * t1
            _spin_until(cnt_ptr + base + c, tgt, sync_ptr, err_ptr, max_spin, base + c, task, VENDOR)
            if c == rm + 1:
                rm = c
    return rb, rm


@triton.jit
def _flush(cnt_ptr, pend_idx, pend_n):
    """Publish finished tiles: every thread's stores happen-before one release increment of pend_n."""
    if (pend_n > 0) & (pend_idx >= 0):
        tl.debug_barrier()
        tl.atomic_add(cnt_ptr + pend_idx, pend_n, sem="release", scope="gpu")


@triton.jit
def _rnd(x, DT: tl.constexpr):
    """Round to the model dtype and back: activations are rounded where HF keeps bf16/fp16 tensors, so the
    kernel computes the reference's function, not a more precise neighbour of it."""
    return x.to(DT).to(tl.float32)


@triton.jit
def _timed_wait(cnt_ptr, tgt_ptr, cbase, R, r0, r1, t1, rb, rm, sync_ptr, err_ptr, max_spin, task, waited,
                TRACE: tl.constexpr, VENDOR: tl.constexpr):
    """_wait_rows, adding the time it blocked to `waited` in an instrumented run."""
    if TRACE:
        w0 = global_time_ns(VENDOR)
    rb, rm = _wait_rows(cnt_ptr, tgt_ptr, cbase, R, r0, r1, t1, rb, rm, sync_ptr, err_ptr, max_spin, task, VENDOR)
    if TRACE:
        waited += global_time_ns(VENDOR) - w0
    return rb, rm, waited


# ---- the weight stream ----------------------------------------------------------------------------------
# Every GEMV task streams its rows in chunks held as two [BNC, HB] halves (HB = BK/2): columns [k0, k0+HB)
# and [k0+HB, k0+BK) of its rows, or for gate_up the gate rows' and the up rows' columns [k0, k0+HB).
# A task's FIRST chunk is loaded while the task before it runs (`_first_chunk`, issued at the top of the
# previous task and carried in registers), so every CTA has weights in flight through its waits, epilogues,
# barriers and the token hand-off: the HBM stream no longer drains at each task boundary.

@triton.jit
def _unpack(v, DT: tl.constexpr, E: tl.constexpr):
    """fp32 values of the E elements packed in each 32-bit word v (E = 2 for 16-bit weights)."""
    if E == 1:
        e = v.to(tl.float32, bitcast=True)
        o = e
    elif DT == tl.bfloat16:                 # a bf16 is the top half of an fp32: shifts, no conversion
        e = (v << 16).to(tl.float32, bitcast=True)
        o = (v & -65536).to(tl.float32, bitcast=True)
    else:
        e = (v & 65535).to(tl.int16).to(DT, bitcast=True).to(tl.float32)
        o = (v >> 16).to(tl.int16).to(DT, bitcast=True).to(tl.float32)
    return e, o


@triton.jit
def _xpair(x_ptr, g_ptr, xo, K: tl.constexpr, r, NORM: tl.constexpr, DT: tl.constexpr, E: tl.constexpr):
    """The input elements that meet the even (xe) and odd (xodd) halves of the weight words at element
    offsets xo (RMS-normed as HF does when NORM, with 1/rms = r)."""
    m = xo < K
    if E == 2:
        # contiguous [HW, 2] loads (vectorized), split into the even and odd elements in registers
        x2p = xo[:, None] + tl.arange(0, 2)[None, :]
        x2 = tl.load(x_ptr + x2p, mask=m[:, None], other=0.0)
        if NORM:
            x2 = _rnd(_rnd(x2 * r, DT) * tl.load(g_ptr + x2p, mask=m[:, None], other=0.0), DT)
        xe, xodd = tl.split(x2)
    else:
        xe = tl.load(x_ptr + xo, mask=m, other=0.0)
        if NORM:
            xe = _rnd(_rnd(xe * r, DT) * tl.load(g_ptr + xo, mask=m, other=0.0), DT)
        xodd = xe
    return xe, xodd


@triton.jit
def _dotw(v, xe, xodd, DT: tl.constexpr, E: tl.constexpr):
    """Row sums of (weight words v) . x: [BNC]."""
    e, o = _unpack(v, DT, E)
    if E == 2:
        p = e * xe[None, :] + o * xodd[None, :]
    else:
        p = e * xe[None, :]
    return tl.sum(p, axis=1)


@triton.jit
def _first_chunk(w_ptr, tasks_ptr, tn, ok, H: tl.constexpr, I: tl.constexpr, QS: tl.constexpr,
                 BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_DOWN: tl.constexpr,
                 BN_LM: tl.constexpr, BNC: tl.constexpr, HB: tl.constexpr, EVEN: tl.constexpr):
    """Issue the loads of task tn's first chunk (nothing when not ok or not a GEMV task): (lo, hi) as
    [BNC, HB/E] 32-bit words. Words, not bf16 elements: a loaded word can be carried to the next task in
    its register as is, where 16-bit elements get repacked (which waits for the load) on the way."""
    DT: tl.constexpr = w_ptr.dtype.element_ty
    E: tl.constexpr = 32 // DT.primitive_bitwidth
    HW: tl.constexpr = HB // E
    w32 = w_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    trow = tasks_ptr + tn * 8
    typ = tl.load(trow, mask=ok, other=6)
    off = tl.load(trow + 4, mask=ok, other=0).to(tl.int64) * (64 // E)
    K = tl.where(typ == 2, QS, tl.where(typ == 4, I, H))
    bn = tl.where(typ == 0, BN_QKV, tl.where(typ == 2, BN_O, tl.where(typ == 3, BN_GU,
                  tl.where(typ == 4, BN_DOWN, BN_LM))))
    gu = typ == 3
    hoff = tl.where(gu, (I * H) // E, HW)
    use = ok & (typ != 1) & (typ != 6)
    rn = tl.arange(0, BNC)
    c = tl.arange(0, HW)
    p = w32 + off + (rn.to(tl.int64) * (K // E))[:, None] + c[None, :]
    m = use & (rn < bn)[:, None]
    if EVEN:
        lo = tl.load(p, mask=m, other=0)
        hi = tl.load(p + hoff, mask=m, other=0)
    else:
        lo = tl.load(p, mask=m & (c * E < K)[None, :], other=0)
        hi = tl.load(p + hoff, mask=m & (c * E + tl.where(gu, 0, HB) < K)[None, :], other=0)
    return lo, hi


@triton.jit
def _gemv(w_ptr, w_off, lo, hi, x_ptr, g_ptr, eps, cnt_ptr, tgt_ptr, cbase, R, t1, rb, rm, sync_ptr, err_ptr,
          max_spin, task, K: tl.constexpr, BN: tl.constexpr, BNC: tl.constexpr, BK: tl.constexpr,
          NORM: tl.constexpr, GU: tl.constexpr, UPO: tl.constexpr, WAIT: tl.constexpr, TRACE: tl.constexpr,
          VENDOR: tl.constexpr):
    """(acc_a, acc_b)[BNC] = rows of W . x, the first chunk (lo, hi) already in registers.

    Plain GEMV: acc_a = W . x. gate_up (GU): acc_a = Wgate . x, acc_b = Wup . x (up rows UPO elements
    after the gate rows). NORM: x is RMS-normed exactly as HF does (weight * (x * rstd).to(dtype)), which
    needs all of x before the first chunk. Otherwise each chunk waits only for the rows of x it reads."""
    DT: tl.constexpr = w_ptr.dtype.element_ty
    E: tl.constexpr = 32 // DT.primitive_bitwidth
    HB: tl.constexpr = BK // 2
    HW: tl.constexpr = HB // E
    STEP: tl.constexpr = HB if GU else BK
    HOFF: tl.constexpr = (UPO if GU else HB) // E
    EVEN: tl.constexpr = K % STEP == 0
    w32 = w_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
    rn = tl.arange(0, BNC)
    c = tl.arange(0, HW)
    rmask = (rn < BN)[:, None]
    rowp = w32 + w_off // E + (rn * (K // E)).to(tl.int64)[:, None] + c[None, :]
    acc_a = tl.zeros([BNC], dtype=tl.float32)
    acc_b = tl.zeros([BNC], dtype=tl.float32)
    waited = tl.zeros([], dtype=tl.int64)
    r = 1.0
    if NORM:
        if WAIT:
            rb, rm, waited = _timed_wait(cnt_ptr, tgt_ptr, cbase, R, 0, K, t1, rb, rm, sync_ptr, err_ptr,
                                         max_spin, task, waited, TRACE, VENDOR)
        ce = tl.arange(0, HB)
        ss = 0.0
        for k0 in tl.static_range(0, K, HB):
            xs = tl.load(x_ptr + k0 + ce, mask=k0 + ce < K, other=0.0)
            ss += tl.sum(xs * xs, axis=0)
        r = 1.0 / tl.sqrt(ss / K + eps)
    for k0 in tl.static_range(0, K, STEP):
        if k0 > 0:
            if EVEN:
                lo = tl.load(rowp + k0 // E, mask=rmask, other=0)
                hi = tl.load(rowp + HOFF + k0 // E, mask=rmask, other=0)
            else:
                lo = tl.load(rowp + k0 // E, mask=rmask & (k0 + c * E < K)[None, :], other=0)
                hi = tl.load(rowp + HOFF + k0 // E,
                             mask=rmask & (k0 + c * E + (HB if not GU else 0) < K)[None, :], other=0)
        if not NORM:
            if WAIT:
                rb, rm, waited = _timed_wait(cnt_ptr, tgt_ptr, cbase, R, k0, min(k0 + STEP, K), t1, rb, rm,
                                             sync_ptr, err_ptr, max_spin, task, waited, TRACE, VENDOR)
        xe, xodd = _xpair(x_ptr, g_ptr, k0 + c * E, K, r, NORM, DT, E)
        if GU:
            acc_a += _dotw(lo, xe, xodd, DT, E)
            acc_b += _dotw(hi, xe, xodd, DT, E)
        else:
            he, hodd = _xpair(x_ptr, g_ptr, k0 + HB + c * E, K, r, NORM, DT, E)
            acc_a += _dotw(lo, xe, xodd, DT, E) + _dotw(hi, he, hodd, DT, E)
    return acc_a, acc_b, waited, rb, rm


@triton.jit
def _prefetch_l2(w_ptr, tasks_ptr, tj, BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr,
                 BN_DOWN: tl.constexpr, BN_LM: tl.constexpr, H: tl.constexpr, I: tl.constexpr, QS: tl.constexpr,
                 NLP: tl.constexpr, VENDOR: tl.constexpr):
    """Pull task tj's weight tile into L2 ahead of time (NVIDIA prefetch.global.L2, one per 128-byte line):
    the weights of the next tasks stream while this one computes, and cost no registers."""
    if VENDOR == 1:
        typ = tl.load(tasks_ptr + tj * 8)
        off = tl.load(tasks_ptr + tj * 8 + 4).to(tl.int64) * 64
        n = tl.where(typ == 0, BN_QKV * H, tl.where(typ == 2, BN_O * QS, tl.where(typ == 3, BN_GU * H,
                     tl.where(typ == 4, BN_DOWN * I, tl.where(typ == 5, BN_LM * H, 0)))))
        nl = n // 64
        if nl > 0:
            ln = tl.minimum(tl.arange(0, NLP), nl - 1).to(tl.int64) * 64
            tl.inline_asm_elementwise("prefetch.global.L2 [$1];\nmov.u32 $0, 0;", "=r,l", [w_ptr + off + ln],
                                      dtype=tl.int32, is_pure=False, pack=1)
            if typ == 3:   # gate_up: the up tile lies I*H elements after the gate tile
                tl.inline_asm_elementwise("prefetch.global.L2 [$1];\nmov.u32 $0, 0;", "=r,l",
                                          [w_ptr + off + I * H + ln], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _cache_block(kbase, vbase, p0, pos, HD: tl.constexpr, BT: tl.constexpr):
    """K and V of cache positions [p0, p0 + BT) below pos: history written by earlier tokens, so it can be
    loaded before this token's q/k/v exist."""
    d = tl.arange(0, HD)
    t = tl.arange(0, BT)
    pm = (p0 + t) < pos
    kb = tl.load(kbase + (p0 + t)[:, None] * HD + d[None, :], mask=pm[:, None], other=0.0)
    vb = tl.load(vbase + (p0 + t)[:, None] * HD + d[None, :], mask=pm[:, None], other=0.0)
    return kb, vb


@triton.jit
def _attn_block(qb, kb, vb, p0, pos, m_i, l_i, acc, sm_scale, BT: tl.constexpr):
    """Online-softmax update with one block of cached positions [p0, p0 + BT) (those < pos count).
    Scores are rounded to the model dtype before scaling, as HF's bf16 q @ k^T then .float() * scale."""
    t = tl.arange(0, BT)
    s = tl.dot(qb, tl.trans(kb)).to(kb.dtype).to(tl.float32) * sm_scale      # [GP, BT]
    s = tl.where(((p0 + t) < pos)[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.where(m_new == float("-inf"), 1.0, tl.exp(m_i - m_new))
    p = tl.where(s == float("-inf"), 0.0, tl.exp(s - m_new[:, None]))
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb)
    return m_new, l_i, acc


@triton.jit
def _attn_split(qkv_ptr, part_ptr, kbase, vbase, kb0, vb0, p0, cos_ptr, sin_ptr, qn_ptr, kn_ptr, g, split, pos,
                eps, sm_scale, S, HD: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, QS: tl.constexpr,
                KVS: tl.constexpr, BT: tl.constexpr, QK_NORM: tl.constexpr):
    """One split of KV head g's attention: its G query heads (padded to GP >= 16 rows for tl.dot) over cache
    positions [p0, p0 + BT) that precede pos, plus the new position pos when it falls in this split. Writes
    the split's softmax partial (acc, m, l) for the combine. kb0/vb0 were loaded by the caller before it
    waited for q/k/v. Rounding follows HF: RoPE and q/k norm in the model dtype, bf16 scores."""
    DT: tl.constexpr = kbase.dtype.element_ty
    d = tl.arange(0, HD)
    half: tl.constexpr = HD // 2
    dp = (d + half) % HD                         # rotate_half partner
    sgn = tl.where(d < half, -1.0, 1.0)
    gq = tl.arange(0, GP)
    qm = gq < G
    qrow = (g * G + gq)[:, None] * HD
    q = tl.load(qkv_ptr + qrow + d[None, :], mask=qm[:, None], other=0.0, cache_modifier=".cg")
    qs = tl.load(qkv_ptr + qrow + dp[None, :], mask=qm[:, None], other=0.0, cache_modifier=".cg")
    if QK_NORM:
        rq = 1.0 / tl.sqrt(tl.sum(q * q, axis=1) / HD + eps)
        q = _rnd(_rnd(q * rq[:, None], DT) * tl.load(qn_ptr + d)[None, :], DT)
        qs = _rnd(_rnd(qs * rq[:, None], DT) * tl.load(qn_ptr + dp)[None, :], DT)
    cos = tl.load(cos_ptr + pos * HD + d)
    sin = tl.load(sin_ptr + pos * HD + d)
    q = _rnd(_rnd(q * cos[None, :], DT) + _rnd(sgn[None, :] * qs * sin[None, :], DT), DT)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([GP, HD], dtype=tl.float32)
    if (pos >= p0) & (pos < p0 + BT):
        # this split holds the new position: its k/v enter from registers and go to the cache for later tokens
        kof = QS + g * HD
        k = tl.load(qkv_ptr + kof + d, cache_modifier=".cg")
        ks = tl.load(qkv_ptr + kof + dp, cache_modifier=".cg")
        v = tl.load(qkv_ptr + QS + KVS + g * HD + d, cache_modifier=".cg")
        if QK_NORM:
            rk_ = 1.0 / tl.sqrt(tl.sum(k * k, axis=0) / HD + eps)
            k = _rnd(_rnd(k * rk_, DT) * tl.load(kn_ptr + d), DT)
            ks = _rnd(_rnd(ks * rk_, DT) * tl.load(kn_ptr + dp), DT)
        k = _rnd(_rnd(k * cos, DT) + _rnd(sgn * ks * sin, DT), DT)
        tl.store(kbase + pos * HD + d, k.to(DT))
        tl.store(vbase + pos * HD + d, v.to(DT))
        m_i = _rnd(tl.sum(q * k[None, :], axis=1), DT) * sm_scale
        l_i = tl.full([GP], 1.0, tl.float32)
        acc = tl.zeros([GP, HD], dtype=tl.float32) + v[None, :]
    if p0 < pos:
        m_i, l_i, acc = _attn_block(q.to(DT), kb0, vb0, p0, pos, m_i, l_i, acc, sm_scale, BT)
    base = part_ptr + (g * S + split) * GP * (HD + 2)
    tl.store(base + gq[:, None] * HD + d[None, :], acc)
    tl.store(base + GP * HD + gq, m_i)
    tl.store(base + GP * HD + GP + gq, l_i)


@triton.jit
def _attn_combine(part_ptr, attn_ptr, g, n_act, S, HD: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,
                  GH: tl.constexpr, SP: tl.constexpr, DT: tl.constexpr):
    """Merge the softmax partials of KV head g's first n_act splits into its G heads' attention output
    (GH = G rounded up to a power of two)."""
    sp = tl.arange(0, SP)
    gq = tl.arange(0, GH)
    d = tl.arange(0, HD)
    sm = sp < n_act
    base = part_ptr + (g * S + sp) * GP * (HD + 2)                     # [SP]
    m = tl.load(base[:, None] + GP * HD + gq[None, :], mask=sm[:, None], other=float("-inf"), cache_modifier=".cg")
    l = tl.load(base[:, None] + GP * HD + GP + gq[None, :], mask=sm[:, None], other=0.0, cache_modifier=".cg")
    a = tl.load(base[:, None, None] + gq[None, :, None] * HD + d[None, None, :], mask=sm[:, None, None], other=0.0,
                cache_modifier=".cg")                                  # [SP, GH, HD]
    M = tl.max(m, axis=0)                                              # [GH]
    w = tl.where(sm[:, None], tl.exp(m - M[None, :]), 0.0)             # [SP, GH]
    o = tl.sum(a * w[:, :, None], axis=0) / tl.sum(l * w, axis=0)[:, None]
    tl.store(attn_ptr + (g * G + gq)[:, None] * HD + d[None, :], _rnd(o, DT), mask=(gq < G)[:, None])


@triton.jit
def _trace(trace_ptr, cta, tr, trace_cap, t_start, waited, ti, step, VENDOR: tl.constexpr):
    """One record per task: start ns, end ns, ns spent waiting, (step << 40 | smid << 24 | task index)."""
    t_end = global_time_ns(VENDOR)
    tb = trace_ptr + (tl.cast(cta, tl.int64) * trace_cap + tr) * 4
    tl.store(tb + 0, t_start)
    tl.store(tb + 1, t_end)
    tl.store(tb + 2, waited)
    tl.store(tb + 3, (tl.cast(step, tl.int64) << 40) | (tl.cast(sm_id(VENDOR), tl.int64) << 24)
             | tl.cast(ti, tl.int64))


@triton.jit
def monokernel(
    # weights and model data
    w_ptr, woff_ptr, small_ptr, soff_ptr, embed_ptr, cos_ptr, sin_ptr, cache_ptr,
    # activations (fp32) and outputs
    act_ptr, aoff_ptr, logits_ptr, write_logits, part_ptr, attn_S, partial_v_ptr, partial_i_ptr, out_ptr, forced_ptr, eos_ptr, n_eos,
    # the plan
    tasks_ptr, cta_start_ptr, layout_ptr, rpc_ptr, tgt_ptr, cnt_ptr, dummy_base, smid_tab_ptr, use_smid,
    # sync, errors, trace
    sync_ptr, err_ptr, trace_ptr, trace_tokens, trace_cap,
    # run parameters
    pos0, n_tokens, max_seq, window, fnorm_off, force, seed, inv_temp, top_k, top_p, eps, sm_scale, max_spin, bar_per_tok,
    # shapes
    H: tl.constexpr, I: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
    HD: tl.constexpr, NKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, GH: tl.constexpr, SP: tl.constexpr,
    HAS_BIAS: tl.constexpr, QK_NORM: tl.constexpr,
    # tiling and modes
    BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_DOWN: tl.constexpr, BN_LM: tl.constexpr,
    BK: tl.constexpr, BT: tl.constexpr, GPOW: tl.constexpr,
    MODE: tl.constexpr, PREFETCH: tl.constexpr, SAMPLE: tl.constexpr,
    TRACE: tl.constexpr, VENDOR: tl.constexpr, FILTER_ITERS: tl.constexpr,
    PF_DIST: tl.constexpr, NLP: tl.constexpr, PFB: tl.constexpr = 0, ROWPF: tl.constexpr = 0,
):
    QS: tl.constexpr = (NKV * G) * HD
    KVS: tl.constexpr = NKV * HD
    WAIT: tl.constexpr = MODE == 1
    DT: tl.constexpr = w_ptr.dtype.element_ty
    HB: tl.constexpr = BK // 2
    BNC: tl.constexpr = max(max(max(BN_QKV, BN_O), max(BN_GU, BN_DOWN)), BN_LM)   # rows of a carried chunk
    EVEN: tl.constexpr = (H % BK == 0) & (QS % BK == 0) & (I % BK == 0)
    nprog = tl.num_programs(0)
    pid = tl.program_id(0)
    rs = tl.arange(0, GPOW)
    rc = tl.arange(0, BNC)
    cta = pid
    if use_smid != 0:
        # Topology mapping: the plan numbers CTAs SM-major (the SMs of the probe scan in order), so this
        # program runs plan-CTA = its rank in (smid, pid) order. One barrier, once per launch.
        sm = sm_id(VENDOR)
        tl.store(smid_tab_ptr + pid, sm)
        tl.debug_barrier()
        tl.atomic_add(sync_ptr + S_SLOT, 1, sem="release", scope="gpu")
        _spin_until(sync_ptr + S_SLOT, nprog, sync_ptr, err_ptr, max_spin, -3, -1, VENDOR)
        sms = tl.load(smid_tab_ptr + rs, mask=rs < nprog, other=2147483647, cache_modifier=".cg")
        cta = tl.sum(((sms < sm) | ((sms == sm) & (rs < pid))).to(tl.int32), axis=0)
    t_lo = tl.load(cta_start_ptr + cta)
    t_hi = tl.load(cta_start_ptr + cta + 1)
    kc_layer = NKV * max_seq * HD
    R_QKV = tl.load(rpc_ptr + 0)
    tr = 0
    stop = 0
    # the first chunk of this CTA's first task; from here on each task loads its successor's
    lo, hi = _first_chunk(w_ptr, tasks_ptr, t_lo, t_lo < t_hi, H, I, QS, BN_QKV, BN_O, BN_GU, BN_DOWN, BN_LM,
                          BNC, HB, EVEN)
    for step in range(0, n_tokens):
        t1 = step + 1
        pos = pos0 + step
        # this token's input embedding is ready, unless generation stopped at EOS (then no token comes)
        if stop == 0:
            _spin_until(sync_ptr + S_TOK, step, sync_ptr, err_ptr, max_spin, -1, -1, VENDOR)
            stop = tl.load(sync_ptr + S_STOP, volatile=True)
        if stop == 0:
            best_v = float("-inf")
            best_i = 0
            rb = -1          # wait cache: counters rb + 0..rm known ready for this token
            rm = -1
            pend_idx = -1    # deferred release: pend_n finished tiles not yet published on counter pend_idx
            pend_n = 0
            for ti in range(t_lo, t_hi):
                # task row: type, layer, tile, barrier#, weight offset (lo, hi), release counter, wait base
                trow = tasks_ptr + ti * 8
                typ = tl.load(trow)
                layer = tl.load(trow + 1)
                tile = tl.load(trow + 2)
                w_off = tl.load(trow + 4).to(tl.int64) * 64   # stored in units of 64 elements: 128-byte aligned
                rel = tl.load(trow + 6)
                cb = tl.load(trow + 7)
                # the successor: the next task, or this CTA's first task of the next token
                tn = ti + 1
                n_ok = tn < t_hi
                if tn >= t_hi:
                    tn = t_lo
                    n_ok = t1 < n_tokens
                if rel != pend_idx:
                    _flush(cnt_ptr, pend_idx, pend_n)
                    pend_idx = rel
                    pend_n = 0
                if PF_DIST > 0:
                    if ti + PF_DIST < t_hi:
                        _prefetch_l2(w_ptr, tasks_ptr, ti + PF_DIST, BN_QKV, BN_O, BN_GU, BN_DOWN, BN_LM, H, I, QS,
                                     NLP, VENDOR)
                if TRACE:
                    t_start = global_time_ns(VENDOR)
                else:
                    t_start = tl.zeros([], dtype=tl.int64)
                waited = tl.zeros([], dtype=tl.int64)
                lrow = layer * 5
                if typ == T_ATTN:
                    # one split of one KV head; the last split to arrive merges the partials and publishes
                    g = tile // attn_S
                    split = tile % attn_S
                    kbase = cache_ptr + tl.cast(layer, tl.int64) * 2 * kc_layer + tl.cast(g, tl.int64) * max_seq * HD
                    p_lo = 0
                    if window > 0:
                        p_lo = tl.maximum(pos - window + 1, 0)
                    p0 = p_lo + split * BT
                    if p0 <= pos:
                        kb0, vb0 = _cache_block(kbase, kbase + kc_layer, p0, pos, HD, BT)   # before the wait
                        if WAIT:
                            rb, rm = _wait_rows(cnt_ptr, tgt_ptr, cb, R_QKV, g * G * HD, (g + 1) * G * HD, t1, rb,
                                                rm, sync_ptr, err_ptr, max_spin, ti, VENDOR)
                            rb, rm = _wait_rows(cnt_ptr, tgt_ptr, cb, R_QKV, QS + g * HD, QS + (g + 1) * HD, t1, rb,
                                                rm, sync_ptr, err_ptr, max_spin, ti, VENDOR)
                            rb, rm = _wait_rows(cnt_ptr, tgt_ptr, cb, R_QKV, QS + KVS + g * HD,
                                                QS + KVS + (g + 1) * HD, t1, rb, rm, sync_ptr, err_ptr, max_spin, ti, VENDOR)
                            if TRACE:
                                waited = global_time_ns(VENDOR) - t_start
                        _attn_split(act_ptr + tl.load(aoff_ptr + lrow + 1), part_ptr, kbase, kbase + kc_layer, kb0,
                                    vb0, p0, cos_ptr, sin_ptr, small_ptr + tl.load(soff_ptr + layer * 8 + 1),
                                    small_ptr + tl.load(soff_ptr + layer * 8 + 2), g, split, pos, eps, sm_scale,
                                    attn_S, HD, G, GP, QS, KVS, BT, QK_NORM)
                    tl.debug_barrier()
                    old = tl.atomic_add(sync_ptr + S_ARR + g, 1, sem="acq_rel", scope="gpu")
                    if old == (step * L + layer + 1) * attn_S - 1:
                        n_act = tl.minimum((pos - p_lo) // BT + 1, attn_S)
                        _attn_combine(part_ptr, act_ptr + tl.load(aoff_ptr + lrow + 2), g, n_act, attn_S, HD, G, GP,
                                      GH, SP, DT)
                        pend_n += 1
                    # attention needs its registers: its successor's chunk is loaded after it
                    nlo, nhi = _first_chunk(w_ptr, tasks_ptr, tn, n_ok, H, I, QS, BN_QKV, BN_O, BN_GU, BN_DOWN, BN_LM,
                                            BNC, HB, EVEN)
                else:
                    nlo, nhi = _first_chunk(w_ptr, tasks_ptr, tn, n_ok, H, I, QS, BN_QKV, BN_O, BN_GU, BN_DOWN, BN_LM,
                                            BNC, HB, EVEN)
                    if typ == T_QKV:
                        rows = tile * BN_QKV + rc
                        rmask = rc < BN_QKV
                        # layer 0 reads the embedding row, released through S_TOK: its wait base is a block of
                        # always-ready dummy counters
                        acc, _, waited, rb, rm = _gemv(w_ptr, w_off, lo, hi, act_ptr + tl.load(aoff_ptr + lrow + 0),
                                                       small_ptr + tl.load(soff_ptr + layer * 8 + 3), eps, cnt_ptr,
                                                       tgt_ptr, cb, tl.load(rpc_ptr + 4), t1, rb, rm, sync_ptr, err_ptr,
                                                       max_spin, ti, H, BN_QKV, BNC, BK, True, False, 0, WAIT, TRACE,
                                                       VENDOR)
                        y = acc
                        if HAS_BIAS:
                            y += tl.load(small_ptr + tl.load(soff_ptr + layer * 8 + 0) + rows, mask=rmask, other=0.0)
                        tl.store(act_ptr + tl.load(aoff_ptr + lrow + 1) + rows, _rnd(y, DT), mask=rmask)
                        pend_n += 1
                    elif typ == T_O:
                        rows = tile * BN_O + rc
                        rmask = rc < BN_O
                        acc, _, waited, rb, rm = _gemv(w_ptr, w_off, lo, hi, act_ptr + tl.load(aoff_ptr + lrow + 2),
                                                       small_ptr, eps, cnt_ptr, tgt_ptr, cb, tl.load(rpc_ptr + 1), t1, rb,
                                                       rm, sync_ptr, err_ptr, max_spin, ti, QS, BN_O, BNC, BK, False,
                                                       False, 0, WAIT, TRACE, VENDOR)
                        h = tl.load(act_ptr + tl.load(aoff_ptr + lrow + 0) + rows, mask=rmask, other=0.0,
                                    cache_modifier=".cg")
                        tl.store(act_ptr + tl.load(aoff_ptr + lrow + 3) + rows, _rnd(h + _rnd(acc, DT), DT), mask=rmask)
                        pend_n += 1
                    elif typ == T_GU:
                        rows = tile * BN_GU + rc
                        rmask = rc < BN_GU
                        ag, au, waited, rb, rm = _gemv(w_ptr, w_off, lo, hi, act_ptr + tl.load(aoff_ptr + lrow + 3),
                                                       small_ptr + tl.load(soff_ptr + layer * 8 + 4), eps, cnt_ptr,
                                                       tgt_ptr, cb, tl.load(rpc_ptr + 2), t1, rb, rm, sync_ptr, err_ptr,
                                                       max_spin, ti, H, BN_GU, BNC, BK, True, True, I * H, WAIT, TRACE,
                                                       VENDOR)
                        gt = _rnd(ag, DT)
                        y = _rnd(_rnd(gt / (1.0 + tl.exp(-gt)), DT) * _rnd(au, DT), DT)   # HF: silu(g) * u in bf16
                        tl.store(act_ptr + tl.load(aoff_ptr + lrow + 4) + rows, y, mask=rmask)
                        pend_n += 1
                    elif typ == T_DOWN:
                        rows = tile * BN_DOWN + rc
                        rmask = rc < BN_DOWN
                        acc, _, waited, rb, rm = _gemv(w_ptr, w_off, lo, hi, act_ptr + tl.load(aoff_ptr + lrow + 4),
                                                       small_ptr, eps, cnt_ptr, tgt_ptr, cb, tl.load(rpc_ptr + 3), t1, rb,
                                                       rm, sync_ptr, err_ptr, max_spin, ti, I, BN_DOWN, BNC, BK, False,
                                                       False, 0, WAIT, TRACE, VENDOR)
                        hm = tl.load(act_ptr + tl.load(aoff_ptr + lrow + 3) + rows, mask=rmask, other=0.0,
                                     cache_modifier=".cg")
                        tl.store(act_ptr + tl.load(aoff_ptr + lrow + 5) + rows, _rnd(hm + _rnd(acc, DT), DT), mask=rmask)
                        pend_n += 1
                    elif typ == T_LM:
                        rows = tile * BN_LM + rc
                        rmask = rc < BN_LM
                        acc, _, waited, rb, rm = _gemv(w_ptr, w_off, lo, hi, act_ptr + tl.load(aoff_ptr + lrow + 0),
                                                       small_ptr + fnorm_off, eps, cnt_ptr, tgt_ptr, cb,
                                                       tl.load(rpc_ptr + 4), t1, rb, rm, sync_ptr, err_ptr, max_spin, ti,
                                                       H, BN_LM, BNC, BK, True, False, 0, WAIT, TRACE, VENDOR)
                        lg = _rnd(acc, DT)                            # HF returns logits in the model dtype
                        if write_logits != 0:
                            tl.store(logits_ptr + tl.cast(step, tl.int64) * V + rows, lg, mask=rmask)
                        if SAMPLE == 2:
                            sc = lg * inv_temp
                            tl.store(partial_v_ptr + GPOW + rows, sc, mask=rmask)   # scaled logits for the filter passes
                        else:
                            sc = gumbel_scores(lg, rows, pos, seed, inv_temp, V, SAMPLE)
                        b, bi = tile_best(sc, rows, rmask & (rows < V))
                        take = b > best_v
                        best_v = tl.where(take, b, best_v)
                        best_i = tl.where(take, bi, best_i)
                    else:  # T_BAR: grid mode's global barrier after a phase
                        tl.debug_barrier()
                        tl.atomic_add(sync_ptr + S_BAR, 1, sem="release", scope="gpu")
                        nb = step * bar_per_tok + tl.load(trow + 3) + 1
                        _spin_until(sync_ptr + S_BAR, nb * nprog, sync_ptr, err_ptr, max_spin, -2, ti, VENDOR)
                        if TRACE:
                            waited = global_time_ns(VENDOR) - t_start
                if TRACE:
                    if (step < trace_tokens) & (tr < trace_cap):
                        _trace(trace_ptr, cta, tr, trace_cap, t_start, waited, ti, step, VENDOR)
                        tr += 1
                lo = nlo
                hi = nhi
            _flush(cnt_ptr, pend_idx, pend_n)
            # this CTA is done with the token: publish its best candidate; the last CTA to finish samples
            tl.store(partial_v_ptr + cta, best_v)
            tl.store(partial_i_ptr + cta, best_i)
            tl.debug_barrier()
            old = tl.atomic_add(sync_ptr + S_DONE, 1, sem="acq_rel", scope="gpu")
            if old == t1 * nprog - 1:
                pv = tl.load(partial_v_ptr + rs, mask=rs < nprog, other=float("-inf"), cache_modifier=".cg")
                pi = tl.load(partial_i_ptr + rs, mask=rs < nprog, other=0, cache_modifier=".cg")
                b, tok = tile_best(pv, pi, rs < nprog)
                if SAMPLE == 2:
                    tok = filtered_sample(partial_v_ptr + GPOW, V, b, top_k, top_p, seed, pos, 256, FILTER_ITERS)
                if force != 0:
                    tok = tl.load(forced_ptr + step + 1)
                tl.store(out_ptr + step, tok)
                er = tl.arange(0, 8)
                eos = tl.load(eos_ptr + er, mask=er < n_eos, other=-1)
                if tl.sum((eos == tok).to(tl.int32), axis=0) > 0:
                    tl.store(sync_ptr + S_STOP, 1)
                tl.store(sync_ptr + S_NTOK, t1)
                # the next token's input: h[0] = embedding row of tok
                rh = tl.arange(0, BK)
                for k0 in range(0, H, BK):
                    e = tl.load(embed_ptr + tl.cast(tok, tl.int64) * H + k0 + rh, mask=k0 + rh < H, other=0.0)
                    tl.store(act_ptr + k0 + rh, e.to(tl.float32), mask=k0 + rh < H)
                tl.debug_barrier()
                tl.atomic_xchg(sync_ptr + S_TOK, t1, sem="release", scope="gpu")
