"""The monokernel: ONE persistent Triton launch that runs whole decode steps, sampling included.

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
from kog.engine.vendor import global_time_ns, sm_id

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
S_SLOT: tl.constexpr = tl.constexpr(16)     # per-SM slot counters for the topology mapping


@triton.jit
def _spin_until(ptr, target, sync_ptr, err_ptr, max_spin, what, task):
    """Wait (bounded) until *ptr >= target, then acquire. On timeout: record and abort everyone.

    Polls with plain volatile loads (no atomic traffic on a counter the producers are incrementing),
    then one acquire RMW that synchronizes with the producers' release increments."""
    if target > 0:
        v = tl.load(ptr, volatile=True)
        n = 0
        ab = 0
        while (v < target) & (n < max_spin) & (ab == 0):
            v = tl.load(ptr, volatile=True)
            n += 1
            if n % 64 == 0:
                ab = tl.load(sync_ptr + S_ABORT, volatile=True)
        if v >= target:
            tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
        elif ab == 0:
            if tl.atomic_cas(sync_ptr + S_ABORT, 0, 1) == 0:
                tl.store(err_ptr + 0, 1)
                tl.store(err_ptr + 1, what)
                tl.store(err_ptr + 2, task)
                tl.store(err_ptr + 3, target)
                tl.store(err_ptr + 4, v)


@triton.jit
def _wait_rows(cnt_ptr, tgt_ptr, base, R, r0, r1, t1, rb, rm, sync_ptr, err_ptr, max_spin, task):
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
            _spin_until(cnt_ptr + base + c, tgt, sync_ptr, err_ptr, max_spin, base + c, task)
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
def _load_tile(ptrs, kk, K: tl.constexpr, EVEN: tl.constexpr):
    if EVEN:
        w = tl.load(ptrs)
    else:
        w = tl.load(ptrs, mask=kk[None, :] < K, other=0.0)
    return w


@triton.jit
def _load_x(x_ptr, g_ptr, kk, K: tl.constexpr, EVEN: tl.constexpr, NORM: tl.constexpr):
    """A chunk of the input vector (times the RMSNorm weight when NORM). Plain cached loads: the acquire
    that made the data visible also invalidated this SM's L1, and the data do not change in the phase."""
    if EVEN:
        x = tl.load(x_ptr + kk)
        if NORM:
            g = tl.load(g_ptr + kk)
    else:
        x = tl.load(x_ptr + kk, mask=kk < K, other=0.0)
        if NORM:
            g = tl.load(g_ptr + kk, mask=kk < K, other=0.0)
    if NORM:
        xg = x * g
    else:
        xg = x
    return x, xg


@triton.jit
def _gemv(w_ptr, w_off, x_ptr, g_ptr, cnt_ptr, tgt_ptr, cbase, R, t1, rb, rm, sync_ptr, err_ptr, max_spin, task,
          K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, NORM: tl.constexpr, WAIT: tl.constexpr,
          TRACE: tl.constexpr, VENDOR: tl.constexpr):
    """acc[BN] = W[tile rows, :K] . (x * gamma)[:K] and sum(x*x). Each chunk's weight load is issued BEFORE
    the wait for the matching chunk of x, so the HBM stream does not stop at a dependency."""
    EVEN: tl.constexpr = K % BK == 0
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    wrow = w_ptr + w_off + (rn * K).to(tl.int64)[:, None]
    acc = tl.zeros([BN], dtype=tl.float32)
    ss = 0.0
    waited = tl.zeros([], dtype=tl.int64)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        w = _load_tile(wrow + kk[None, :], kk, K, EVEN)
        if WAIT:
            if TRACE:
                w0 = global_time_ns(VENDOR)
            rb, rm = _wait_rows(cnt_ptr, tgt_ptr, cbase, R, k0, tl.minimum(k0 + BK, K), t1, rb, rm, sync_ptr,
                                err_ptr, max_spin, task)
            if TRACE:
                waited += global_time_ns(VENDOR) - w0
        x, xg = _load_x(x_ptr, g_ptr, kk, K, EVEN, NORM)
        acc += tl.sum(w.to(tl.float32) * xg[None, :], axis=1)
        ss += tl.sum(x * x, axis=0)
    return acc, ss, waited, rb, rm


@triton.jit
def _gemv2(w_ptr, off_a, off_b, x_ptr, g_ptr, cnt_ptr, tgt_ptr, cbase, R, t1, rb, rm, sync_ptr, err_ptr, max_spin,
           task, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, WAIT: tl.constexpr, TRACE: tl.constexpr,
           VENDOR: tl.constexpr):
    """Two row tiles (gate and up) against the same normed x, sharing the waits and the x loads."""
    EVEN: tl.constexpr = K % BK == 0
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    ra = w_ptr + off_a + (rn * K).to(tl.int64)[:, None]
    rbp = w_ptr + off_b + (rn * K).to(tl.int64)[:, None]
    acc_a = tl.zeros([BN], dtype=tl.float32)
    acc_b = tl.zeros([BN], dtype=tl.float32)
    ss = 0.0
    waited = tl.zeros([], dtype=tl.int64)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        wa = _load_tile(ra + kk[None, :], kk, K, EVEN)
        wb = _load_tile(rbp + kk[None, :], kk, K, EVEN)
        if WAIT:
            if TRACE:
                w0 = global_time_ns(VENDOR)
            rb, rm = _wait_rows(cnt_ptr, tgt_ptr, cbase, R, k0, tl.minimum(k0 + BK, K), t1, rb, rm, sync_ptr,
                                err_ptr, max_spin, task)
            if TRACE:
                waited += global_time_ns(VENDOR) - w0
        x, xg = _load_x(x_ptr, g_ptr, kk, K, EVEN, True)
        acc_a += tl.sum(wa.to(tl.float32) * xg[None, :], axis=1)
        acc_b += tl.sum(wb.to(tl.float32) * xg[None, :], axis=1)
        ss += tl.sum(x * x, axis=0)
    return acc_a, acc_b, ss, waited, rb, rm


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
def _attn_block(qb, kb, vb, p0, pos, m_i, l_i, acc, BT: tl.constexpr):
    """Online-softmax update with one block of cached positions [p0, p0 + BT) (those < pos count)."""
    t = tl.arange(0, BT)
    s = tl.dot(qb, tl.trans(kb))                      # [GP, BT]
    s = tl.where(((p0 + t) < pos)[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb)
    return m_new, l_i, acc


@triton.jit
def _attention(qkv_ptr, attn_ptr, kbase, vbase, kb0, vb0, p_lo, cos_ptr, sin_ptr, qn_ptr, kn_ptr, g, pos, eps,
               sm_scale, HD: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, QS: tl.constexpr, KVS: tl.constexpr,
               BT: tl.constexpr, QK_NORM: tl.constexpr):
    """Attention of the G query heads of KV head g at position pos over positions [p_lo, pos].

    kb0/vb0: the first cache block [p_lo, p_lo + BT), loaded by the caller before it waited for q/k/v.
    This position's k/v enter the softmax straight from registers (and are written to the cache for the
    tokens after), so no read-back and no CTA barrier sit on the critical path."""
    d = tl.arange(0, HD)
    half: tl.constexpr = HD // 2
    dp = (d + half) % HD                         # rotate_half partner
    sgn = tl.where(d < half, -1.0, 1.0)
    gq = tl.arange(0, GP)
    qm = gq < G
    qrow = (g * G + gq)[:, None] * HD
    q = tl.load(qkv_ptr + qrow + d[None, :], mask=qm[:, None], other=0.0, cache_modifier=".cg")
    qs = tl.load(qkv_ptr + qrow + dp[None, :], mask=qm[:, None], other=0.0, cache_modifier=".cg")
    kof = QS + g * HD
    vof = QS + KVS + g * HD
    k = tl.load(qkv_ptr + kof + d, cache_modifier=".cg")
    ks = tl.load(qkv_ptr + kof + dp, cache_modifier=".cg")
    v = tl.load(qkv_ptr + vof + d, cache_modifier=".cg")
    if QK_NORM:
        rq = 1.0 / tl.sqrt(tl.sum(q * q, axis=1) / HD + eps)
        q = q * rq[:, None] * tl.load(qn_ptr + d)[None, :]
        qs = qs * rq[:, None] * tl.load(qn_ptr + dp)[None, :]
        rk_ = 1.0 / tl.sqrt(tl.sum(k * k, axis=0) / HD + eps)
        k = k * rk_ * tl.load(kn_ptr + d)
        ks = ks * rk_ * tl.load(kn_ptr + dp)
    cos = tl.load(cos_ptr + pos * HD + d)
    sin = tl.load(sin_ptr + pos * HD + d)
    q = (q * cos[None, :] + sgn[None, :] * qs * sin[None, :]) * sm_scale
    k = k * cos + sgn * ks * sin
    kc = k.to(kbase.dtype.element_ty)
    vc = v.to(vbase.dtype.element_ty)
    tl.store(kbase + pos * HD + d, kc)
    tl.store(vbase + pos * HD + d, vc)
    qb = q.to(kbase.dtype.element_ty)
    # the new position first (scores as the cache would give them: k, v rounded to the cache dtype)
    m_i = tl.sum(qb.to(tl.float32) * kc.to(tl.float32)[None, :], axis=1)
    l_i = tl.full([GP], 1.0, tl.float32)
    acc = tl.zeros([GP, HD], dtype=tl.float32) + vc.to(tl.float32)[None, :]
    m_i, l_i, acc = _attn_block(qb, kb0, vb0, p_lo, pos, m_i, l_i, acc, BT)
    for p0 in range(p_lo + BT, pos, BT):
        kb, vb = _cache_block(kbase, vbase, p0, pos, HD, BT)
        m_i, l_i, acc = _attn_block(qb, kb, vb, p0, pos, m_i, l_i, acc, BT)
    o = acc / l_i[:, None]
    tl.store(attn_ptr + qrow + d[None, :], o, mask=qm[:, None])


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
    act_ptr, aoff_ptr, logits_ptr, write_logits, partial_v_ptr, partial_i_ptr, out_ptr, forced_ptr, eos_ptr, n_eos,
    # the plan
    tasks_ptr, cta_start_ptr, layout_ptr, rpc_ptr, tgt_ptr, cnt_ptr, dummy_base, smid_tab_ptr, use_smid,
    # sync, errors, trace
    sync_ptr, err_ptr, trace_ptr, trace_tokens, trace_cap,
    # run parameters
    pos0, n_tokens, max_seq, window, fnorm_off, force, seed, inv_temp, top_k, top_p, eps, sm_scale, max_spin, bar_per_tok,
    # shapes
    H: tl.constexpr, I: tl.constexpr, V: tl.constexpr, L: tl.constexpr,
    HD: tl.constexpr, NKV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr,
    HAS_BIAS: tl.constexpr, QK_NORM: tl.constexpr,
    # tiling and modes
    BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_DOWN: tl.constexpr, BN_LM: tl.constexpr,
    BK: tl.constexpr, BT: tl.constexpr, GPOW: tl.constexpr,
    MODE: tl.constexpr, PREFETCH: tl.constexpr, SAMPLE: tl.constexpr,
    TRACE: tl.constexpr, VENDOR: tl.constexpr, FILTER_ITERS: tl.constexpr,
    PF_DIST: tl.constexpr, NLP: tl.constexpr,
):
    QS: tl.constexpr = (NKV * G) * HD
    KVS: tl.constexpr = NKV * HD
    WAIT: tl.constexpr = MODE == 1
    BK_GU: tl.constexpr = BK // 2 if BK >= 128 else BK   # gate+up: two tiles, same registers as one
    nprog = tl.num_programs(0)
    pid = tl.program_id(0)
    rs = tl.arange(0, GPOW)
    cta = pid
    if use_smid != 0:
        # Topology mapping: the plan numbers CTAs SM-major (the SMs of the probe scan in order), so this
        # program runs plan-CTA = its rank in (smid, pid) order. One barrier, once per launch.
        sm = sm_id(VENDOR)
        tl.store(smid_tab_ptr + pid, sm)
        tl.debug_barrier()
        tl.atomic_add(sync_ptr + S_SLOT, 1, sem="release", scope="gpu")
        _spin_until(sync_ptr + S_SLOT, nprog, sync_ptr, err_ptr, max_spin, -3, -1)
        sms = tl.load(smid_tab_ptr + rs, mask=rs < nprog, other=2147483647, cache_modifier=".cg")
        cta = tl.sum(((sms < sm) | ((sms == sm) & (rs < pid))).to(tl.int32), axis=0)
    t_lo = tl.load(cta_start_ptr + cta)
    t_hi = tl.load(cta_start_ptr + cta + 1)
    kc_layer = NKV * max_seq * HD
    R_QKV = tl.load(rpc_ptr + 0)
    tr = 0
    for step in range(0, n_tokens):
        t1 = step + 1
        pos = pos0 + step
        # this token's input embedding is ready (and generation has not stopped)
        _spin_until(sync_ptr + S_TOK, step, sync_ptr, err_ptr, max_spin, -1, -1)
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
                if typ == T_QKV:
                    rows = tile * BN_QKV + tl.arange(0, BN_QKV)
                    # layer 0 reads the embedding row, released through S_TOK: its wait base is a block of
                    # always-ready dummy counters
                    acc, ss, waited, rb, rm = _gemv(w_ptr, w_off, act_ptr + tl.load(aoff_ptr + lrow + 0),
                                                    small_ptr + tl.load(soff_ptr + layer * 8 + 3), cnt_ptr,
                                                    tgt_ptr, cb, tl.load(rpc_ptr + 4), t1, rb, rm, sync_ptr, err_ptr,
                                                    max_spin, ti, H, BN_QKV, BK, True, WAIT, TRACE, VENDOR)
                    y = acc * (1.0 / tl.sqrt(ss / H + eps))
                    if HAS_BIAS:
                        y += tl.load(small_ptr + tl.load(soff_ptr + layer * 8 + 0) + rows)
                    tl.store(act_ptr + tl.load(aoff_ptr + lrow + 1) + rows, y)
                    pend_n += 1
                elif typ == T_ATTN:
                    g = tile
                    kbase = cache_ptr + tl.cast(layer, tl.int64) * 2 * kc_layer + tl.cast(g, tl.int64) * max_seq * HD
                    p_lo = 0
                    if window > 0:
                        p_lo = tl.maximum(pos - window + 1, 0)
                    kb0, vb0 = _cache_block(kbase, kbase + kc_layer, p_lo, pos, HD, BT)   # before the wait
                    if WAIT:
                        rb, rm = _wait_rows(cnt_ptr, tgt_ptr, cb, R_QKV, g * G * HD, (g + 1) * G * HD, t1, rb, rm,
                                            sync_ptr, err_ptr, max_spin, ti)
                        rb, rm = _wait_rows(cnt_ptr, tgt_ptr, cb, R_QKV, QS + g * HD, QS + (g + 1) * HD, t1, rb, rm,
                                            sync_ptr, err_ptr, max_spin, ti)
                        rb, rm = _wait_rows(cnt_ptr, tgt_ptr, cb, R_QKV, QS + KVS + g * HD, QS + KVS + (g + 1) * HD,
                                            t1, rb, rm, sync_ptr, err_ptr, max_spin, ti)
                        if TRACE:
                            waited = global_time_ns(VENDOR) - t_start
                    _attention(act_ptr + tl.load(aoff_ptr + lrow + 1), act_ptr + tl.load(aoff_ptr + lrow + 2), kbase,
                               kbase + kc_layer, kb0, vb0, p_lo, cos_ptr, sin_ptr,
                               small_ptr + tl.load(soff_ptr + layer * 8 + 1),
                               small_ptr + tl.load(soff_ptr + layer * 8 + 2),
                               g, pos, eps, sm_scale, HD, G, GP, QS, KVS, BT, QK_NORM)
                    pend_n += 1
                elif typ == T_O:
                    rows = tile * BN_O + tl.arange(0, BN_O)
                    acc, ss, waited, rb, rm = _gemv(w_ptr, w_off, act_ptr + tl.load(aoff_ptr + lrow + 2), small_ptr,
                                                    cnt_ptr, tgt_ptr, cb, tl.load(rpc_ptr + 1), t1, rb, rm, sync_ptr,
                                                    err_ptr, max_spin, ti, QS, BN_O, BK, False, WAIT, TRACE, VENDOR)
                    h = tl.load(act_ptr + tl.load(aoff_ptr + lrow + 0) + rows, cache_modifier=".cg")
                    tl.store(act_ptr + tl.load(aoff_ptr + lrow + 3) + rows, h + acc)
                    pend_n += 1
                elif typ == T_GU:
                    rows = tile * BN_GU + tl.arange(0, BN_GU)
                    ag, au, ss, waited, rb, rm = _gemv2(w_ptr, w_off, w_off + I * H,
                                                        act_ptr + tl.load(aoff_ptr + lrow + 3),
                                                        small_ptr + tl.load(soff_ptr + layer * 8 + 4), cnt_ptr, tgt_ptr,
                                                        cb, tl.load(rpc_ptr + 2), t1, rb, rm, sync_ptr, err_ptr,
                                                        max_spin, ti, H, BN_GU, BK_GU, WAIT, TRACE, VENDOR)
                    r = 1.0 / tl.sqrt(ss / H + eps)
                    gt = ag * r
                    y = gt / (1.0 + tl.exp(-gt)) * (au * r)
                    tl.store(act_ptr + tl.load(aoff_ptr + lrow + 4) + rows, y)
                    pend_n += 1
                elif typ == T_DOWN:
                    rows = tile * BN_DOWN + tl.arange(0, BN_DOWN)
                    acc, ss, waited, rb, rm = _gemv(w_ptr, w_off, act_ptr + tl.load(aoff_ptr + lrow + 4), small_ptr,
                                                    cnt_ptr, tgt_ptr, cb, tl.load(rpc_ptr + 3), t1, rb, rm, sync_ptr,
                                                    err_ptr, max_spin, ti, I, BN_DOWN, BK, False, WAIT, TRACE, VENDOR)
                    hm = tl.load(act_ptr + tl.load(aoff_ptr + lrow + 3) + rows, cache_modifier=".cg")
                    tl.store(act_ptr + tl.load(aoff_ptr + lrow + 5) + rows, hm + acc)
                    pend_n += 1
                elif typ == T_LM:
                    rows = tile * BN_LM + tl.arange(0, BN_LM)
                    acc, ss, waited, rb, rm = _gemv(w_ptr, w_off, act_ptr + tl.load(aoff_ptr + lrow + 0),
                                                    small_ptr + fnorm_off, cnt_ptr,
                                                    tgt_ptr, cb, tl.load(rpc_ptr + 4), t1, rb, rm, sync_ptr, err_ptr,
                                                    max_spin, ti, H, BN_LM, BK, True, WAIT, TRACE, VENDOR)
                    lg = acc * (1.0 / tl.sqrt(ss / H + eps))
                    if write_logits != 0:
                        tl.store(logits_ptr + tl.cast(step, tl.int64) * V + rows, lg)
                    if SAMPLE == 2:
                        sc = lg * inv_temp
                        tl.store(partial_v_ptr + GPOW + rows, sc)   # scaled logits for the filter passes
                    else:
                        sc = gumbel_scores(lg, rows, pos, seed, inv_temp, V, SAMPLE)
                    b, bi = tile_best(sc, rows, rows < V)
                    take = b > best_v
                    best_v = tl.where(take, b, best_v)
                    best_i = tl.where(take, bi, best_i)
                else:  # T_BAR: grid mode's global barrier after a phase
                    tl.debug_barrier()
                    tl.atomic_add(sync_ptr + S_BAR, 1, sem="release", scope="gpu")
                    nb = step * bar_per_tok + tl.load(trow + 3) + 1
                    _spin_until(sync_ptr + S_BAR, nb * nprog, sync_ptr, err_ptr, max_spin, -2, ti)
                    if TRACE:
                        waited = global_time_ns(VENDOR) - t_start
                if TRACE:
                    if (step < trace_tokens) & (tr < trace_cap):
                        _trace(trace_ptr, cta, tr, trace_cap, t_start, waited, ti, step, VENDOR)
                        tr += 1
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
