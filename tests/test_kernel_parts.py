"""Each part of the monokernel's Triton code alone, under TRITON_INTERPRET=1, against a plain-torch or numpy
reference: synchronisation, the weight ring and its task rows, the GEMV (direct and through the ring),
attention, the cross-rank pick, tracing. tests/test_monokernel.py runs them together."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from kog.engine import layout as LY
from kog.engine.kernel.act import act_offset
from kog.engine.kernel.attention import CacheView, _attn_combine, _attn_split, _split_inputs
from kog.engine.kernel.exchange import pick_across_ranks
from kog.engine.kernel.gemv import GemvInput, XCache, gemv
from kog.engine.kernel.ring import RingCursor, RingSpan, ring_fill, ring_tile, row_read, rows_load, rows_store
from kog.engine.kernel.sync import (Pending, Waits, publish_before, spin_until, tag_store, tag_wait, tagged_value,
                                    wait_rows)
from kog.engine.kernel.trace import trace_task

assert os.environ.get("TRITON_INTERPRET") == "1"


def _cx(t):
    return type(t)(*(_cx(v) if isinstance(v, tuple) else tl.constexpr(v) for v in t))


def _sync(timeout_ns=50_000_000):
    return LY.SyncArgs(torch.zeros(64, dtype=torch.int32), torch.zeros(8, dtype=torch.int32), timeout_ns)


# ---- sync ---------------------------------------------------------------------------------------------------

@triton.jit
def _spin_kernel(cnt, target, sy, what):
    spin_until(cnt, target, sy, what, 7, 0)


def test_a_bounded_spin_returns_when_ready_and_records_the_wait_when_not():
    sy = _sync()
    cnt = torch.tensor([5], dtype=torch.int32)
    _spin_kernel[(1,)](cnt, 5, sy, 3)
    assert sy.err[0] == 0 and sy.sync[LY.S_ABORT] == 0
    _spin_kernel[(1,)](cnt, 6, sy, 3)
    assert sy.err[:5].tolist() == [1, 3, 7, 6, 5] and sy.sync[LY.S_ABORT] == 1      # what, task, target, value


@triton.jit
def _wait_kernel(pa, sy, base, R, r0, r1, t1, out, rel_a, rel_b):
    wc = wait_rows(Waits(-1, -1), pa, base, R, r0, r1, t1, sy, 0, 0)
    tl.store(out + 0, wc.base)
    tl.store(out + 1, wc.ready)
    pend, _ = publish_before(pa.cnt, Pending(rel_a, 3), rel_a, False, 0)     # same counter: nothing published yet
    tl.store(out + 2, pend.n)
    pend, _ = publish_before(pa.cnt, pend, rel_b, False, 0)                  # another one: the 3 tiles go out
    tl.store(out + 3, pend.counter)


def test_wait_rows_covers_the_counters_of_the_rows_and_a_release_publishes_pending_tiles():
    """Rows 40..99 of a buffer counted per 32 rows: counters 1..3 of the buffer (base 4: 5..7) reach
    target * t1; the wait cache then knows them ready. A task releasing another counter publishes first."""
    sy = _sync()
    target = torch.tensor([9, 9, 9, 9, 2, 2, 2, 2, 0, 0], dtype=torch.int32)
    cnt = torch.tensor([0, 0, 0, 0, 0, 4, 4, 4, 0, 0], dtype=torch.int32)
    pa = LY.PlanArgs(None, None, None, target, cnt, None, None, None, None, None, None)
    out = torch.zeros(4, dtype=torch.int32)
    _wait_kernel[(1,)](pa, sy, 4, 32, 40, 100, 2, out, 8, 9)
    assert sy.err[0] == 0 and out.tolist() == [4, -1, 3, 9]    # the cache grows from counter 0 only
    assert cnt[8] == 3
    cnt[7] = 3                                                  # counter 3 short of 2 * 2: the wait gives up
    _wait_kernel[(1,)](pa, sy, 4, 32, 40, 100, 2, out, 8, 9)
    assert sy.err[:5].tolist() == [1, 7, 0, 4, 3]


@triton.jit
def _tag_kernel(qkvt, vals, t1, sy, out, HD: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, QS: tl.constexpr,
                KVS: tl.constexpr, N: tl.constexpr):
    r = tl.arange(0, N)
    tag_store(qkvt, r, tl.load(vals + r), t1)
    tag_wait(qkvt, 1, t1, sy, 5, HD, G, GP, QS, KVS, 1, 0)
    tl.store(out + r, tagged_value(qkvt, r, r >= 0, True))


def test_tagged_words_carry_value_and_token():
    """A tag store packs each float with the token; the wait sees every word of KV head 1's q, k and v rows
    tagged and the values read back exactly; an older tag times out as E_TAG."""
    HD, G, nkv = 16, 2, 2
    QS, KVS = nkv * G * HD, nkv * HD
    N = QS + 2 * KVS
    vals = torch.randn(N)
    qkvt = torch.zeros(N, dtype=torch.int64)
    out = torch.zeros(N)
    sy = _sync()
    _tag_kernel[(1,)](qkvt, vals, 3, sy, out, HD, G, 16, QS, KVS, N)
    assert sy.err[0] == 0 and torch.equal(out, vals) and ((qkvt >> 32) == 3).all()
    sy2 = _sync()
    stale = qkvt.clone()
    stale[QS + HD] = stale[QS + HD] & 4294967295 | (2 << 32)                                  # k row of head 1
    _poll_only[(1,)](stale, 3, sy2, HD, G, 16, QS, KVS)
    assert sy2.err[:3].tolist() == [1, LY.E_TAG, 5]


@triton.jit
def _poll_only(qkvt, t1, sy, HD: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, QS: tl.constexpr,
               KVS: tl.constexpr):
    tag_wait(qkvt, 1, t1, sy, 5, HD, G, GP, QS, KVS, 1, 0)


# ---- the ring and the task rows ----------------------------------------------------------------------------------

@triton.jit
def _ring_kernel(w, pa, sy, out, n_chunks, C, BN: tl.constexpr, BKC: tl.constexpr):
    rs = RingSpan(0, tl.load(pa.ring_lo), tl.load(pa.ring_lo + 1) - tl.load(pa.ring_lo), n_chunks)
    rc = RingCursor(0, 0)
    rn = tl.arange(0, BN)
    rj = tl.arange(0, BKC // 2)
    for c in range(0, n_chunks):
        cn = c           # (an assignment: a tensor in the interpreter, as the kernel's cursor is)
        rc = ring_fill(rs, RingCursor(cn, rc.pn), w, pa, 0, C)
        lo, hi = ring_tile(rs, cn, pa, 0, BKC, 0, BN, BKC, w.dtype.element_ty, C)
        base = out + c * BN * BKC + rn[:, None] * BKC
        tl.store(base + 2 * rj[None, :], lo)
        tl.store(base + 2 * rj[None, :] + 1, hi)


def test_the_ring_hands_out_each_chunk_in_order():
    """Chunks requested ahead through 2 slots (the interpreter's global stand-in) come back as the (even, odd)
    column pairs of the packed weights, chunk after chunk, wrapping around the slots."""
    BN, BKC, n = 4, 16, 5
    w = torch.randn(n * BN * BKC, dtype=torch.float16)
    C = _cx(LY.Tiling(WAIT=True, QKV=None, O=None, GU=None, DOWN=None, LM=None, BT=16, SPLIT=16, GPOW=1, SAMPLE=0,
                      FILTER_BV=16, TRACE=False, ATRACE=False, VENDOR=0, TPC=1, RING=2, SLOTB=BN * BKC * 2,
                      RING_SIZES=False, BKC_X=BKC, TAGQKV=True, TP=False, NR=1, XR=1, VR=0))
    pa = LY.PlanArgs(None, None, None, None, None, None, torch.tensor([0, n], dtype=torch.int32), None,
                     torch.zeros(2 * BN * BKC, dtype=torch.float16), None, None)
    out = torch.zeros(n * BN * BKC)
    _ring_kernel[(1,)](w, pa, _sync(), out, n, C, BN, BKC)
    assert torch.equal(out, w.float())


@triton.jit
def _rows_kernel(rows, pa, out, t_lo, t_hi):
    rs = RingSpan(0, 0, 0, 0)
    rows_store(rs, pa, 0, 0, rows_load(rows, t_lo, t_hi, True), 0)
    for ti in range(t_lo, t_hi):
        j = ti - t_lo
        if (j % LY_ROW_BLOCK) == 0:
            rows_store(rs, pa, 0, (j // LY_ROW_BLOCK + 1) % 2, rows_load(rows, ti + LY_ROW_BLOCK, t_hi, True), 0)
        w0, w1, w2, w3 = row_read(rs, pa, 0, j, 0)
        tl.store(out + ti * 4 + 0, w0)
        tl.store(out + ti * 4 + 1, w1)
        tl.store(out + ti * 4 + 2, w2)
        tl.store(out + ti * 4 + 3, w3)


LY_ROW_BLOCK = tl.constexpr(LY.ROW_BLOCK)


def test_task_rows_travel_in_blocks_through_the_row_buffers():
    """40 rows (two and a half blocks): every task reads its own row back from the two alternating buffers."""
    rows = torch.arange(40 * 4, dtype=torch.int32).view(40, 4)
    pa = LY.PlanArgs(None, None, None, None, None, None, None, None, None,
                     torch.zeros(2 * LY.ROW_BLOCK * LY.ROW_WORDS, dtype=torch.int32), None)
    out = torch.zeros(40 * 4, dtype=torch.int32)
    _rows_kernel[(1,)](rows, pa, out, 0, 40)
    assert torch.equal(out, rows.view(-1))


# ---- gemv ----------------------------------------------------------------------------------------------------

@triton.jit
def _gemv_kernel(mw, pa, sy, x, g, out, out2, layer, tile, eps, xc_l, S, C):
    inp = GemvInput(x, g, 0, 64, 7)
    if C.RING > 0:
        rs = RingSpan(0, 0, tl.load(pa.ring_lo + 1), tl.load(pa.ring_lo + 1))
        rc = ring_fill(rs, RingCursor(0, 0), mw.w, pa, 0, C)
        xc = XCache(xc_l, xc_l, -1, tl.zeros([2], dtype=tl.int32), -1)
    else:
        rs = RingSpan(0, 0, 0, 0)
        rc = RingCursor(0, 0)
        xc = XCache(0.0, 0.0, 0, 0, 0)
    acc, acc2, waited, wc, rc, xc = gemv(inp, layer, tile, 1, 0, eps, Waits(-1, -1), rc, xc, rs, mw, pa, sy, 0, S, C)
    r = tl.arange(0, S.BN)
    tl.store(out + r, acc)
    tl.store(out2 + r, acc2)


def _tiling(ring: int, spec_kw: dict, slotb: int = 0) -> LY.Tiling:
    spec = LY.GemvSpec(**spec_kw)
    return _cx(LY.Tiling(WAIT=False, QKV=spec, O=spec, GU=spec, DOWN=spec, LM=spec, BT=16, SPLIT=16, GPOW=1,
                         SAMPLE=0, FILTER_BV=16, TRACE=False, ATRACE=False, VENDOR=0, TPC=1, RING=ring, SLOTB=slotb,
                         RING_SIZES=False, BKC_X=spec.BK if ring else 0, TAGQKV=False, TP=False, NR=1, XR=1, VR=0))


@pytest.mark.parametrize("K, BK, norm", [(48, 16, True), (32, 64, True), (40, 16, False)])
def test_direct_gemv_matches_torch(K, BK, norm):
    """Rows 8..15 of W times x (RMS-normed with weight g over K: normalized first when one block spans K, the
    1/rms scale applied to the dot products otherwise), gate and up rows together."""
    torch.manual_seed(0)
    N, BN, eps = 32, 8, 1e-5
    wg, wu = torch.randn(N, K), torch.randn(N, K)
    x, g = torch.randn(K), torch.rand(K) + 0.5
    wbuf = torch.cat([wg.view(-1), wu.view(-1)])
    woff = torch.zeros(LY.WOFF_COLS, dtype=torch.int64)
    woff[LY.W_GATE], woff[LY.W_UP] = 0, N * K // 64 if (N * K) % 64 == 0 else -1
    assert woff[LY.W_UP] >= 0
    mw = LY.ModelArgs(wbuf, woff, None, None, None, None, None, None)
    out, out2 = torch.zeros(BN), torch.zeros(BN)
    C = _tiling(0, dict(K=K, BN=BN, BK=BK, NORM=norm, GU=True, XRAW=False, XW=False, WCOL=LY.W_GATE, RANKS=1, R=64))
    _gemv_kernel[(1,)](mw, None, _sync(), x, g, out, out2, 0, 1, eps, 0.0, C.GU, C)
    xn = x / torch.sqrt((x * x).mean() + eps) * g if norm else x
    torch.testing.assert_close(out, wg[8:16] @ xn, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out2, wu[8:16] @ xn, rtol=1e-4, atol=1e-4)


def test_ring_gemv_matches_torch():
    """The same rows through the ring: the tile packed as [BN, K] chunks of 16 columns, two of them a task."""
    torch.manual_seed(1)
    K, BN, BKC, eps = 32, 8, 16, 1e-5
    w = torch.randn(BN, K, dtype=torch.float16)
    x, g = torch.randn(K), torch.rand(K) + 0.5
    packed = w.view(BN, 2, BKC).permute(1, 0, 2).reshape(-1).contiguous()
    mw = LY.ModelArgs(packed, None, None, None, None, None, None, None)
    pa = LY.PlanArgs(None, None, None, None, None, None, torch.tensor([0, 2], dtype=torch.int32), None,
                     torch.zeros(2 * BN * BKC, dtype=torch.float16), None, None)
    out, out2 = torch.zeros(BN), torch.zeros(BN)
    C = _tiling(2, dict(K=K, BN=BN, BK=BKC, NORM=True, GU=False, XRAW=False, XW=False, WCOL=LY.W_QKV, RANKS=1, R=64),
                slotb=BN * BKC * 2)
    _gemv_kernel[(1,)](mw, pa, _sync(), x, g, out, out2, 0, 0, eps, torch.zeros(BKC // 2), C.QKV, C)
    xn = x / torch.sqrt((x * x).mean() + eps) * g
    torch.testing.assert_close(out, w.float() @ xn, rtol=1e-3, atol=1e-3)


# ---- attention -------------------------------------------------------------------------------------------------

@triton.jit
def _attn_kernel(qkv, cos, sin, kc, vc, part, out, pos, eps, sm_scale, S, M, C):
    g = 1
    x = _split_inputs(qkv, g, M.HD, M.G, M.GP, M.QS, M.KVS, False, 1)
    for split in range(0, S):
        p0 = split * C.SPLIT
        t = tl.arange(0, C.BT)
        d = tl.arange(0, M.HD)
        kb0 = tl.load(kc + (p0 + t)[:, None] * M.HD + d[None, :], mask=((p0 + t) < pos)[:, None], other=0.0)
        vb0 = tl.load(vc + (p0 + t)[:, None] * M.HD + d[None, :], mask=((p0 + t) < pos)[:, None], other=0.0)
        _attn_split(x, tl.load(cos + d), tl.load(sin + d), CacheView(kc, vc, kb0, vb0), kc, kc, part, g, split, pos,
                    p0, eps, sm_scale, S, M, C)
    _attn_combine(part, out, g, S, S, tl.float32, M)


@pytest.mark.parametrize("G, merge_values, combine_splits", [(2, None, None), (3, None, None), (3, 32, None),
                                                             (3, None, 2), (3, 32, 2)])
def test_attention_splits_and_their_merge_match_softmax_attention(G, merge_values, combine_splits, monkeypatch):
    """KV head 1 of 2 (G query heads each, head_dim 16; 3 heads pad to 4 in the merge) over 40 cached positions
    plus the new one, in three splits of 16 positions: RoPE on q and the new k, the new k / v written to the
    cache, the partials merged (merge_values 32: one head a step, as a long cache's many splits are;
    combine_splits 2: the three splits in groups of two with a running max, as more than 16 splits are)."""
    import kog.engine.kernel.attention as attention
    if merge_values is not None:
        monkeypatch.setattr(attention, "MERGE_VALUES", tl.constexpr(merge_values))
    if combine_splits is not None:
        monkeypatch.setattr(attention, "COMBINE_SPLITS", tl.constexpr(combine_splits))
    torch.manual_seed(2)
    HD, nkv, pos, BT = 16, 2, 40, 16
    QS, KVS = nkv * G * HD, nkv * HD
    qkv = torch.randn(QS + 2 * KVS)
    kc, vc = torch.randn(64, HD), torch.randn(64, HD)
    ang = torch.rand(HD // 2).repeat(2) * 3
    cos, sin = torch.cos(ang), torch.sin(ang)
    S = 3
    M = _cx(LY.Shape(H=QS, I=1, V=1, L=1, HD=HD, NKV=nkv, G=G, GP=16, GH=triton.next_power_of_2(G), SP=4, QS=QS,
                     KVS=KVS, HAS_BIAS=False, QK_NORM=False))
    C = _cx(LY.Tiling(WAIT=False, QKV=None, O=None, GU=None, DOWN=None, LM=None, BT=BT, SPLIT=BT, GPOW=1, SAMPLE=0,
                      FILTER_BV=16, TRACE=False, ATRACE=False, VENDOR=0, TPC=1, RING=0, SLOTB=0, RING_SIZES=False,
                      BKC_X=0, TAGQKV=False, TP=False, NR=1, XR=1, VR=0))
    part = torch.zeros(nkv * S * 16 * (HD + 2))
    out = torch.zeros(QS)
    kc0 = kc.clone()
    _attn_kernel[(1,)](qkv, cos, sin, kc, vc, part, out, pos, 1e-6, 1 / math.sqrt(HD), S, M, C)

    def rope(v):
        return v * cos + torch.cat([-v[..., HD // 2:], v[..., :HD // 2]], -1) * sin
    q = rope(qkv[HD * G: 2 * HD * G].view(G, HD))
    k_new, v_new = rope(qkv[QS + HD: QS + 2 * HD]), qkv[QS + KVS + HD: QS + KVS + 2 * HD]
    torch.testing.assert_close(kc[pos], k_new)
    torch.testing.assert_close(vc[pos], v_new)
    keys = torch.cat([kc0[:pos], k_new[None]])
    vals = torch.cat([vc[:pos], v_new[None]])
    ref = torch.softmax(q @ keys.T / math.sqrt(HD), -1) @ vals
    torch.testing.assert_close(out[HD * G: 2 * HD * G].view(G, HD), ref, rtol=2e-3, atol=2e-3)
    assert not out[2 * HD * G:].any()          # the padded heads are not stored: they are the next head's rows


# ---- activation offsets ------------------------------------------------------------------------------------------

@triton.jit
def _act_offsets_kernel(out, L: tl.constexpr, NCOL: tl.constexpr, M, C):
    for layer in tl.static_range(L):
        for col in tl.static_range(NCOL):          # layout.ACT_* are 0 .. 7
            tl.store(out + layer * 8 + col, act_offset(layer, col, M, C))


@pytest.mark.parametrize("tp", [False, True])
def test_the_kernels_activation_offsets_are_the_hosts(tp):
    """kernel/act.py computes each vector's offset from the shape; the host sizes the buffer from
    monokernel.activation_offset: the two must agree, column by column (Qwen-like GQA shape, odd sizes)."""
    from kog.engine.config import ModelConfig
    from kog.engine.monokernel import activation_offset, activation_size
    cfg = ModelConfig(arch="qwen2", name="t", hidden_size=96, intermediate_size=200, num_layers=3, num_heads=6,
                      num_kv_heads=2, head_dim=16, vocab_size=64)
    M = _cx(LY.Shape(H=96, I=200, V=64, L=3, HD=16, NKV=2, G=3, GP=16, GH=4, SP=1, QS=cfg.q_size, KVS=cfg.kv_size,
                     HAS_BIAS=False, QK_NORM=False))
    C = _cx(LY.Tiling(WAIT=False, QKV=None, O=None, GU=None, DOWN=None, LM=None, BT=16, SPLIT=16, GPOW=1, SAMPLE=0,
                      FILTER_BV=16, TRACE=False, ATRACE=False, VENDOR=0, TPC=1, RING=0, SLOTB=0, RING_SIZES=False,
                      BKC_X=0, TAGQKV=False, TP=tp, NR=1, XR=1, VR=0))
    out = torch.full((3 * 8,), -1, dtype=torch.int32)
    cols = range(8) if tp else [LY.ACT_H, LY.ACT_QKV, LY.ACT_ATTN, LY.ACT_HMID, LY.ACT_MLP, LY.ACT_HOUT]
    assert list(cols) == list(range(len(cols)))    # the kernel walks columns 0 .. len(cols) - 1
    _act_offsets_kernel[(1,)](out, 3, len(cols), M, C)
    want = {(layer, c): activation_offset(cfg, layer, c, tp) for layer in range(3) for c in cols}
    got = {(layer, c): int(out[layer * 8 + c]) for layer in range(3) for c in cols}
    assert got == want
    assert activation_size(cfg, tp) == activation_offset(cfg, 3, LY.ACT_H, tp) + 96
    assert activation_offset(cfg, 2, LY.ACT_HOUT, tp) == activation_offset(cfg, 3, LY.ACT_H, tp)


# ---- exchange and trace ------------------------------------------------------------------------------------------

@triton.jit
def _pick_kernel(pa, sy, out, b, tok):
    tl.store(out, pick_across_ranks(b, tok, 0, 1, pa, sy, 1, 0))


def test_one_rank_picks_its_own_candidate():
    """The cross-rank pick with a single rank (its peer table points at its own buffers): its best returns."""
    flags = torch.zeros(4 * LY.FLAG_STRIDE, dtype=torch.int32)
    scores, toks = torch.zeros(2), torch.zeros(2, dtype=torch.int32)
    peers = torch.tensor([0, 0, 1, 0, 0, 0, 0, 0, 0, flags.data_ptr(), scores.data_ptr(), toks.data_ptr()],
                         dtype=torch.int64)
    pa = LY.PlanArgs(None, None, None, None, None, None, None, None, None, None, peers)
    out = torch.zeros(1, dtype=torch.int32)
    sy = _sync()
    _pick_kernel[(1,)](pa, sy, out, 1.5, 42)
    assert out.item() == 42 and sy.err[0] == 0 and flags[LY.FLAG_STRIDE] == 1


@triton.jit
def _trace_kernel(tra):
    trace_task(tra, 1, 2, 10, 3, 77, 5, 8, 9, 0)


def test_a_task_record_holds_step_task_and_the_publish_before_it():
    from kog.engine.kernel.trace import TASK_RECORD
    buf = torch.zeros((2, 4, TASK_RECORD.value), dtype=torch.int64)
    _trace_kernel[(1,)](LY.TraceArgs(buf, 1, 4, None, 1))
    start, _, waited, key, pub, bar = buf[1, 2].tolist()
    assert (start, waited, key >> 40, key & 0xFFFFFF, pub, bar) == (10, 3, 5, 77, 8, 9)
