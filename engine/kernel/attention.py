"""Attention of one decode step: a task per (KV head, split of the cache), the last split to arrive merges.

A split covers SPLIT cache positions (EngineConfig.attn_block), walked in tiles of BT (attn_tile) through
tl.dot; the KV head's G query heads are padded to GP >= 16 rows for it. Everything that does not depend on
this token's q / k / v (the first tile's cached K / V, RoPE's cos / sin, an L2 prefetch of the later tiles) is
loaded before the split waits for them. The split holding the new position applies q / k norm (Qwen3) and RoPE
to the new key, writes k / v into the cache, and adds the position from registers. Each split stores its
softmax partial (acc, m, l); the last to arrive on its (layer, KV head) arrival word merges them into the
head's G rows of the attention output (in groups of COMBINE_SPLITS splits when there are more) and publishes
them like any tile. A split with no cached positions yet does nothing: only the token's live_splits arrive.
"""
from collections import namedtuple

import triton
import triton.language as tl

from kog.engine.kernel.act import act_offset
from kog.engine.kernel.names import ACT_ATTN, ACT_QKV, BUF_QKV, P_KNORM, P_QNORM, S_ARR, SOFF_COLS
from kog.engine.kernel.numerics import rnd
from kog.engine.kernel.sync import Pending, tag_wait, tagged_value, wait_rows
from kog.engine.kernel.trace import attn_stamp
from kog.engine.kernel.vendor import dot, global_time_after, global_time_ns, ring_prefetch_l2

# a split's view of its KV head's cache: K and V bases, and the first tile's K and V (loaded before the wait)
CacheView = namedtuple("CacheView", "k v k0 v0")
# this token's q rows and their rotate-half partners, the new k row and its partner, the new v row
SplitInputs = namedtuple("SplitInputs", "q qs k ks v")


@triton.jit
def attention_task(task, tok, t_start, wc, pend, atr_n, cta, mw, ac, pa, sy, tra, fx, M, C):
    """One split of one KV head (task.tile = kv_head * splits + split). Returns (wc, pend, waited, atr_n)."""
    DT: tl.constexpr = mw.cache.dtype.element_ty
    S = fx.attn_splits
    g = task.tile // S
    split = task.tile % S
    kc_layer = M.NKV * fx.max_seq * M.HD
    kbase = mw.cache + tl.cast(task.layer, tl.int64) * 2 * kc_layer + tl.cast(g, tl.int64) * fx.max_seq * M.HD
    p_lo = _window_start(tok.pos, fx)
    p0 = p_lo + split * C.SPLIT
    waited = tl.zeros([], dtype=tl.int64)
    # stamps of a traced split (attn_stamps); an empty split (p0 > pos) keeps t_start: no wait, inputs, math
    a_wait = t_start
    a_in = t_start
    a_split = t_start
    if p0 <= tok.pos:
        # only the split holding the new position reads this token's k and v; the others wait for q alone,
        # which the qkv phase produces first (its tiles are dealt in row order, q's rows first)
        has_new = ((tok.pos >= p0) & (tok.pos < p0 + C.SPLIT)).to(tl.int32)
        kb0, vb0 = _cache_block(kbase, kbase + kc_layer, p0, tok.pos, M.HD, C.BT)
        if C.VENDOR == 1:
            # the split's later tiles are loaded in turn after the wait (registers); ask the L2 for them now,
            # so each costs an L2 round trip there, not an HBM one
            for t0 in tl.static_range(C.BT, C.SPLIT, C.BT):
                if p0 + t0 < tok.pos:
                    nb = (tl.minimum(tok.pos - p0 - t0, C.BT) * M.HD * (DT.primitive_bitwidth // 8)).to(tl.int32)
                    ring_prefetch_l2(kbase + (p0 + t0) * M.HD, nb, C.VENDOR)
                    ring_prefetch_l2(kbase + kc_layer + (p0 + t0) * M.HD, nb, C.VENDOR)
        dh = tl.arange(0, M.HD)
        cs = tl.load(mw.cos + tok.pos * M.HD + dh)
        sn = tl.load(mw.sin + tok.pos * M.HD + dh)
        # the q / k norm weights' offsets before the wait: after it each is an L2 round trip (the acquire
        # invalidated L1) ahead of the weights' own
        so = mw.soff + task.layer * SOFF_COLS
        qn = mw.small + tl.load(so + P_QNORM)
        kn = mw.small + tl.load(so + P_KNORM)
        if C.TAGQKV:   # qkv as token-tagged words: the wait polls them
            qkv_in = ac.qkvt + task.layer * (M.QS + 2 * M.KVS)
            if C.WAIT:
                tag_wait(qkv_in, g, tok.t1, sy, task.index, M.HD, M.G, M.GP, M.QS, M.KVS, has_new, C.VENDOR)
        else:
            qkv_in = ac.act + act_offset(task.layer, ACT_QKV, M, C)
            if C.WAIT:
                wc = _wait_qkv_rows(wc, pa, task, g, has_new, tok.t1, sy, M, C.VENDOR)
        if C.ATRACE:
            a_wait = global_time_ns(C.VENDOR)
        x = _split_inputs(qkv_in, g, M.HD, M.G, M.GP, M.QS, M.KVS, C.TAGQKV, has_new)
        if C.ATRACE:
            a_in = global_time_after(tl.sum(tl.sum(x.q, axis=1), axis=0).to(tl.int32, bitcast=True), C.VENDOR)
        if C.WAIT:
            if C.TRACE:
                waited = global_time_ns(C.VENDOR) - t_start
        _attn_split(x, cs, sn, CacheView(kbase, kbase + kc_layer, kb0, vb0), qn, kn, ac.part, g, split, tok.pos, p0,
                    fx.eps, fx.sm_scale, S, M, C)
        if C.ATRACE:
            a_split = global_time_ns(C.VENDOR)
    # one arrival word per (layer, KV head), counting only the splits that hold cached positions (a cache
    # sized for the model's context has mostly empty splits: each arrival is an L2 round trip), so the last
    # of this token's live_splits merges. A word per layer: an arrival may come before the previous layer's
    # merge, which a shared word would then miss (no merge, no release: a deadlock).
    merged = tl.zeros([], dtype=tl.int1)
    a_arr = t_start
    if p0 <= tok.pos:
        tl.debug_barrier()
        n_act = live_splits(tok.pos, fx, C)
        old = tl.atomic_add(sy.sync + S_ARR + task.layer * M.NKV + g, 1, sem="acq_rel", scope="gpu")
        merged = old == tok.arrived + n_act - 1
        if C.ATRACE:
            a_arr = global_time_after(old, C.VENDOR)
        if merged:
            _attn_combine(ac.part, ac.act + act_offset(task.layer, ACT_ATTN, M, C), g, n_act, S, DT, M)
            pend = Pending(pend.counter, pend.n + 1)
    if C.ATRACE:
        if (tok.step < tra.tokens) & (atr_n < tra.atr_cap):
            attn_stamp(tra, cta, atr_n, (t_start, a_wait, a_in, a_split, a_arr, global_time_ns(C.VENDOR)), merged,
                       tok.step, task.index)
            atr_n += 1
    return wc, pend, waited, atr_n


@triton.jit
def live_splits(pos, fx, C):
    """Splits of a KV head that hold cached positions when the token at `pos` runs (the others skip it)."""
    return tl.minimum((pos - _window_start(pos, fx)) // C.SPLIT + 1, fx.attn_splits)


@triton.jit
def _window_start(pos, fx):
    """The first cached position attention reads (a sliding window's start; 0 without one)."""
    p_lo = 0
    if fx.window > 0:
        p_lo = tl.maximum(pos - fx.window + 1, 0)
    return p_lo


@triton.jit
def _wait_qkv_rows(wc, pa, task, g, has_new, t1, sy, M, VENDOR: tl.constexpr):
    """The counters of KV head g's q rows, and of its k and v rows when the split holds the new position."""
    R = tl.load(pa.rpc + BUF_QKV)
    wc = wait_rows(wc, pa, task.wait, R, g * M.G * M.HD, (g + 1) * M.G * M.HD, t1, sy, task.index, VENDOR)
    if has_new != 0:
        wc = wait_rows(wc, pa, task.wait, R, M.QS + g * M.HD, M.QS + (g + 1) * M.HD, t1, sy, task.index, VENDOR)
        wc = wait_rows(wc, pa, task.wait, R, M.QS + M.KVS + g * M.HD, M.QS + M.KVS + (g + 1) * M.HD, t1, sy,
                       task.index, VENDOR)
    return wc


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
def _attn_block(qb, kb, vb, p0, pos, m_i, l_i, acc, sm_scale, BT: tl.constexpr, VENDOR: tl.constexpr):
    """Online-softmax update with one block of cached positions [p0, p0 + BT) (those < pos count).
    Scores are rounded to the model dtype before scaling, as HF's bf16 q @ k^T then .float() * scale (in
    either numerics mode: one of the roundings the float32-activation default keeps, with q's and p's bf16
    for the tensor-core dots)."""
    t = tl.arange(0, BT)
    s = dot(qb, tl.trans(kb), VENDOR).to(kb.dtype).to(tl.float32) * sm_scale      # [GP, BT]
    s = tl.where(((p0 + t) < pos)[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.where(m_new == float("-inf"), 1.0, tl.exp(m_i - m_new))
    p = tl.where(s == float("-inf"), 0.0, tl.exp(s - m_new[:, None]))
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + dot(p.to(vb.dtype), vb, VENDOR)
    return m_new, l_i, acc


@triton.jit
def _split_inputs(qkv, g, HD: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, QS: tl.constexpr,
                  KVS: tl.constexpr, TAG: tl.constexpr, kv_on):
    """A split's inputs (SplitInputs), read from L2 once they are known ready: KV head g's G query rows (padded
    to GP) and their rotate-half partners, the new k row and its partner, the new v row (kv_on = 0: zeros).
    Read again after the tag wait rather than taken from its polls: on llama-3.2-1b those values diverged
    from the reference (teacher-forced error 2.5-6.8e-2 against 7.2e-3, run to run) while the reload is exact;
    the likely cause (not proven): the [HD] rows are held by two warps, and the poll's reduction checks one
    copy's tag while the other may keep an older word. The reload costs one L2 round trip."""
    d = tl.arange(0, HD)
    half: tl.constexpr = HD // 2
    dp = (d + half) % HD                         # rotate_half partner
    gq = tl.arange(0, GP)
    qm = (gq < G)[:, None] & (d >= 0)[None, :]
    qrow = (g * G + gq)[:, None] * HD
    q = tagged_value(qkv, qrow + d[None, :], qm, TAG)
    qs = tagged_value(qkv, qrow + dp[None, :], qm, TAG)
    kof = QS + g * HD
    km = (d >= 0) & (kv_on != 0)
    k = tagged_value(qkv, kof + d, km, TAG)
    ks = tagged_value(qkv, kof + dp, km, TAG)
    v = tagged_value(qkv, KVS + kof + d, km, TAG)
    return SplitInputs(q, qs, k, ks, v)


@triton.jit
def _attn_split(x, cos, sin, kv, qn_ptr, kn_ptr, part, g, split, pos, p0, eps, sm_scale, S, M, C):
    """One split of KV head g over cache positions [p0, p0 + SPLIT) before pos, plus the new position when it
    falls in this split; writes the split's softmax partial (acc, m, l). Under HF_ROUNDING, RoPE and q/k norm
    round to the model dtype as HF's do."""
    HD: tl.constexpr = M.HD
    GP: tl.constexpr = M.GP
    BT: tl.constexpr = C.BT
    DT: tl.constexpr = kv.k.dtype.element_ty
    d = tl.arange(0, HD)
    half: tl.constexpr = HD // 2
    dp = (d + half) % HD                         # rotate_half partner
    sgn = tl.where(d < half, -1.0, 1.0)
    gq = tl.arange(0, GP)
    q = x.q
    qs = x.qs
    if M.QK_NORM:
        rq = 1.0 / tl.sqrt(tl.sum(q * q, axis=1) / HD + eps)
        q = rnd(rnd(q * rq[:, None], DT) * tl.load(qn_ptr + d)[None, :], DT)
        qs = rnd(rnd(qs * rq[:, None], DT) * tl.load(qn_ptr + dp)[None, :], DT)
    q = rnd(rnd(q * cos[None, :], DT) + rnd(sgn[None, :] * qs * sin[None, :], DT), DT)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([GP, HD], dtype=tl.float32)
    if (pos >= p0) & (pos < p0 + C.SPLIT):
        # this split holds the new position: its k/v enter from registers and go to the cache for later tokens
        k = x.k
        ks = x.ks
        if M.QK_NORM:
            rk_ = 1.0 / tl.sqrt(tl.sum(k * k, axis=0) / HD + eps)
            k = rnd(rnd(k * rk_, DT) * tl.load(kn_ptr + d), DT)
            ks = rnd(rnd(ks * rk_, DT) * tl.load(kn_ptr + dp), DT)
        k = rnd(rnd(k * cos, DT) + rnd(sgn * ks * sin, DT), DT)
        tl.store(kv.k + pos * HD + d, k.to(DT))
        tl.store(kv.v + pos * HD + d, x.v.to(DT))
        m_i = rnd(tl.sum(q * k[None, :], axis=1), DT) * sm_scale
        l_i = tl.full([GP], 1.0, tl.float32)
        acc = tl.zeros([GP, HD], dtype=tl.float32) + x.v[None, :]
    if p0 < pos:
        m_i, l_i, acc = _attn_block(q.to(DT), kv.k0, kv.v0, p0, pos, m_i, l_i, acc, sm_scale, BT, C.VENDOR)
    for t0 in range(BT, C.SPLIT, BT):      # attn_tile: the split's later tiles (none when SPLIT == BT)
        # loaded in turn (loading the next during the current one spilled: 255 registers)
        if p0 + t0 < pos:
            kb, vb = _cache_block(kv.k, kv.v, p0 + t0, pos, HD, BT)
            m_i, l_i, acc = _attn_block(q.to(DT), kb, vb, p0 + t0, pos, m_i, l_i, acc, sm_scale, BT, C.VENDOR)
    base = part + (g * S + split) * GP * (HD + 2)
    tl.store(base + gq[:, None] * HD + d[None, :], acc)
    tl.store(base + GP * HD + gq, m_i)
    tl.store(base + GP * HD + GP + gq, l_i)


# the most splits merged at once: their [splits, G, HD] partials are held in registers, so a cache of many
# splits (64 at 4,096 positions in 64-position splits) is merged in groups of this many with a running max
COMBINE_SPLITS = tl.constexpr(16)
# the most partial values one step of the merge holds (64 a thread at 4 warps): more splits, fewer columns
MERGE_VALUES = tl.constexpr(8192)


@triton.constexpr_function
def merge_columns(GD, HD, rows):
    """Columns of one merge step over `rows` splits: all GD when they hold at most MERGE_VALUES partials, else
    fewer, but always whole heads (at least HD)."""
    cw = GD if GD * rows <= MERGE_VALUES else MERGE_VALUES // rows
    return cw if cw >= HD else HD


@triton.jit
def _attn_combine(part, attn_out, g, n_act, S, DT: tl.constexpr, M):
    """Merge the softmax partials of KV head g's first n_act splits into its G heads' attention output: up to
    COMBINE_SPLITS splits at once (no running rescale in the common case), more in groups
    (_attn_combine_groups).

    The heads' outputs are merged as [splits, columns] tiles, CB columns (CB / HD whole heads) a step: each
    thread holds whole columns, so the sums over the splits stay in its registers (Triton lays a [splits,
    heads, HD] tile out with the splits across the warps: a CTA barrier and a shared-memory round per sum),
    and a step holds at most MERGE_VALUES values, so a long cache's many splits do not spill."""
    if M.SP > COMBINE_SPLITS:
        _attn_combine_groups(part, attn_out, g, n_act, S, DT, M)
    else:
        HD: tl.constexpr = M.HD
        GP: tl.constexpr = M.GP
        GD: tl.constexpr = M.GH * HD
        CB: tl.constexpr = merge_columns(GD, HD, M.SP)
        HB: tl.constexpr = CB // HD
        sp = tl.arange(0, M.SP)
        sm = sp < n_act
        base = part + (g * S + sp) * GP * (HD + 2)                         # [SP]
        cc = tl.arange(0, CB)
        for c0 in tl.static_range(0, GD, CB):
            if c0 < M.G * HD:                                              # (padded heads: nothing to store)
                gq = c0 // HD + tl.arange(0, HB)
                m = tl.load(base[:, None] + GP * HD + gq[None, :], mask=sm[:, None], other=float("-inf"),
                            cache_modifier=".cg")
                l = tl.load(base[:, None] + GP * HD + GP + gq[None, :], mask=sm[:, None], other=0.0,
                            cache_modifier=".cg")
                a = tl.load(base[:, None] + c0 + cc[None, :], mask=sm[:, None], other=0.0, cache_modifier=".cg")
                w = tl.where(sm[:, None], tl.exp(m - tl.max(m, axis=0)[None, :]), 0.0)      # [SP, HB]
                wn = w / tl.sum(l * w, axis=0)[None, :]
                wc = tl.reshape(tl.broadcast_to(wn[:, :, None], [M.SP, HB, HD]), [M.SP, CB])
                o = tl.sum(a * wc, axis=0)
                tl.store(attn_out + g * M.G * HD + c0 + cc, rnd(o, DT), mask=c0 + cc < M.G * HD)


@triton.jit
def _attn_combine_groups(part, attn_out, g, n_act, S, DT: tl.constexpr, M):
    """_attn_combine over many splits: column steps as _attn_combine's (at most MERGE_VALUES partials of a
    group at once), each over the splits in groups of COMBINE_SPLITS folded into a running max, weight sum and
    output per column (split 0 always holds positions, so the running max is finite after the first group)."""
    HD: tl.constexpr = M.HD
    GP: tl.constexpr = M.GP
    GD: tl.constexpr = M.GH * HD
    CB: tl.constexpr = merge_columns(GD, HD, COMBINE_SPLITS)
    HB: tl.constexpr = CB // HD
    sp = tl.arange(0, COMBINE_SPLITS)
    cc = tl.arange(0, CB)
    for c0 in tl.static_range(0, GD, CB):
        if c0 < M.G * HD:
            gq = c0 // HD + tl.arange(0, HB)
            run_m = tl.full([HB], float("-inf"), tl.float32)
            run_l = tl.zeros([HB], dtype=tl.float32)
            run_o = tl.zeros([CB], dtype=tl.float32)
            for s0 in range(0, n_act, COMBINE_SPLITS):
                sm = (s0 + sp) < n_act
                base = part + (g * S + s0 + sp) * GP * (HD + 2)
                m = tl.load(base[:, None] + GP * HD + gq[None, :], mask=sm[:, None], other=float("-inf"),
                            cache_modifier=".cg")
                l = tl.load(base[:, None] + GP * HD + GP + gq[None, :], mask=sm[:, None], other=0.0,
                            cache_modifier=".cg")
                a = tl.load(base[:, None] + c0 + cc[None, :], mask=sm[:, None], other=0.0, cache_modifier=".cg")
                new_m = tl.maximum(run_m, tl.max(m, axis=0))                              # [HB]
                keep = tl.where(run_m == float("-inf"), 0.0, tl.exp(run_m - new_m))
                w = tl.where(sm[:, None], tl.exp(m - new_m[None, :]), 0.0)               # [SPG, HB]
                run_l = run_l * keep + tl.sum(l * w, axis=0)
                wc = tl.reshape(tl.broadcast_to(w[:, :, None], [COMBINE_SPLITS, HB, HD]), [COMBINE_SPLITS, CB])
                kc = tl.reshape(tl.broadcast_to(keep[:, None], [HB, HD]), [CB])
                run_o = run_o * kc + tl.sum(a * wc, axis=0)
                run_m = new_m
            lc = tl.reshape(tl.broadcast_to(run_l[:, None], [HB, HD]), [CB])
            tl.store(attn_out + g * M.G * HD + c0 + cc, rnd(run_o / lc, DT), mask=c0 + cc < M.G * HD)
