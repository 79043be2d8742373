"""The decode step's GEMV tasks: a row tile of one matrix, its input, its epilogue.

  qkv      rows of Wqkv . RMSNorm(h) (+ bias)           -> the qkv buffer (or tagged words for attention)
  o        hmid = h + rows of Wo . attn                  (tensor parallelism: the partial sum only)
  gate_up  silu(Wg . RMSNorm(hmid)) * (Wu . RMSNorm(hmid))
  down     h' = hmid + rows of Wdown . act               (tensor parallelism: the partial sum only)
  lm       logits = rows of Wlm . RMSNorm(h_L) -> this tile's best candidate for the next token

Each returns the CTA's updated stream state (StreamState: wait cache, ring cursor, input cache), its pending
release and the ns it waited (traced launches).
"""
from collections import namedtuple

import triton
import triton.language as tl

from kog.engine.kernel.act import act_offset
from kog.engine.kernel.gemv import GemvInput, gemv, rounded_sum
from kog.engine.kernel.names import (ACT_ATTN, ACT_DPART, ACT_H, ACT_HMID, ACT_HOUT, ACT_MLP, ACT_OPART,
                                     ACT_QKV, P_ATTN_NORM, P_BIAS, P_FFN_NORM, SOFF_COLS, TP_VOCAB_LO)
from kog.engine.kernel.numerics import rnd
from kog.engine.kernel.sampling import gumbel_scores, tile_best
from kog.engine.kernel.sync import Pending, tag_store

# what a CTA carries from task to task: the wait cache, the ring's cursor, the inputs held in registers
StreamState = namedtuple("StreamState", "wc rc xc")
# the LM head's running best candidate of this CTA; top: its max scaled logit (top-k / top-p's search)
Best = namedtuple("Best", "v i top")


@triton.jit
def _input(task, col: tl.constexpr, norm, tok, mw, ac, S, M, C):
    """The GemvInput of a task reading activation column `col` (S.R rows per counter), RMS-normed with the
    weight at small[norm] when the phase consumes a norm."""
    xo = act_offset(task.layer, col, M, C)
    return GemvInput(ac.act + xo, mw.small + norm, task.wait, S.R, xo + tok.xtok)


@triton.jit
def _gemv_task(task, tok, sm, cta, mw, ac, pa, sy, fx, col: tl.constexpr, norm, S, M, C):
    """The task's GEMV (S: its phase's GemvSpec) over activation column `col`: (acc, acc2, waited, StreamState)."""
    inp = _input(task, col, norm, tok, mw, ac, S, M, C)
    acc, acc2, waited, wc, rc, xc = gemv(inp, task.layer, task.tile, tok.t1, task.index, fx.eps, sm.wc, sm.rc, sm.xc,
                                         cta.rs, mw, pa, sy, cta.index, S, C)
    return acc, acc2, waited, StreamState(wc, rc, xc)


@triton.jit
def qkv_task(task, tok, sm, pend, cta, mw, ac, pa, sy, fx, M, C):
    DT: tl.constexpr = mw.w.dtype.element_ty
    so = mw.soff + task.layer * SOFF_COLS
    rows = task.tile * C.QKV.BN + tl.arange(0, C.QKV.BN)
    if M.HAS_BIAS:   # loaded before the wait: after it, its offset and rows would be two L2 round trips (the
        # acquire invalidated L1) between the GEMV and the store attention waits for
        bias = tl.load(mw.small + tl.load(so + P_BIAS) + rows)
    # layer 0 reads the embedding row, released with the token: its wait base is a block of always-ready counters
    y, _, waited, sm = _gemv_task(task, tok, sm, cta, mw, ac, pa, sy, fx, ACT_H, tl.load(so + P_ATTN_NORM),
                                  C.QKV, M, C)
    if M.HAS_BIAS:
        y += bias
    if C.TAGQKV:   # tagged words: attention polls the data itself; no counter, no release
        tag_store(ac.qkvt + task.layer * (M.QS + 2 * M.KVS), rows, rnd(y, DT), tok.t1)
    else:
        tl.store(ac.act + act_offset(task.layer, ACT_QKV, M, C) + rows, rnd(y, DT))
        pend = Pending(pend.counter, pend.n + 1)
    return sm, pend, waited


@triton.jit
def residual_task(task, tok, sm, pend, cta, mw, ac, pa, sy, fx, S, DOWN: tl.constexpr, M, C):
    """O (DOWN False, S = C.O: hmid = h + Wo . attn) or down (S = C.DOWN: h' = hmid + Wdown . act). The residual
    rows load before the input wait where the plan proved them ready (task.early), so their L2 latency leaves
    the epilogue."""
    DT: tl.constexpr = mw.w.dtype.element_ty
    res = ac.act + act_offset(task.layer, ACT_HMID if DOWN else ACT_H, M, C)
    rows = task.tile * S.BN + tl.arange(0, S.BN)
    h = tl.load(res + rows, mask=(rows >= 0) & (task.early != 0), other=0.0, cache_modifier=".cg")
    if DOWN:
        acc, _, waited, sm = _gemv_task(task, tok, sm, cta, mw, ac, pa, sy, fx, ACT_MLP, 0, S, M, C)
    else:
        acc, _, waited, sm = _gemv_task(task, tok, sm, cta, mw, ac, pa, sy, fx, ACT_ATTN, 0, S, M, C)
    if C.TP:   # a partial sum of the hidden rows: the exchange adds the ranks' partials
        tl.store(ac.act + act_offset(task.layer, ACT_DPART if DOWN else ACT_OPART, M, C) + rows,
                 rounded_sum(acc, DT, S.RANKS))
    else:
        if task.early == 0:
            h = tl.load(res + rows, cache_modifier=".cg")
        tl.store(ac.act + act_offset(task.layer, ACT_HOUT if DOWN else ACT_HMID, M, C) + rows,
                 rnd(h + rounded_sum(acc, DT, S.RANKS), DT))
    return sm, Pending(pend.counter, pend.n + 1), waited


@triton.jit
def gate_up_task(task, tok, sm, pend, cta, mw, ac, pa, sy, fx, M, C):
    DT: tl.constexpr = mw.w.dtype.element_ty
    rows = task.tile * C.GU.BN + tl.arange(0, C.GU.BN)
    norm = tl.load(mw.soff + task.layer * SOFF_COLS + P_FFN_NORM)
    ag, au, waited, sm = _gemv_task(task, tok, sm, cta, mw, ac, pa, sy, fx, ACT_HMID, norm, C.GU, M, C)
    gt = rnd(ag, DT)
    y = rnd(rnd(gt / (1.0 + tl.exp(-gt)), DT) * rnd(au, DT), DT)   # silu(g) * u (HF: in the model dtype)
    tl.store(ac.act + act_offset(task.layer, ACT_MLP, M, C) + rows, y)
    return sm, Pending(pend.counter, pend.n + 1), waited


@triton.jit
def _store_vocab_rows(ptr, rows, v, V: tl.constexpr, RAGGED: tl.constexpr):
    """Store a vocabulary tile's values; RAGGED (bn_lm does not divide V): the last tile's rows >= V are the
    padded head's zero rows and are not stored (they would land on the next buffer's)."""
    if RAGGED:
        tl.store(ptr + rows, v, mask=rows < V)
    else:
        tl.store(ptr + rows, v)


@triton.jit
def lm_task(task, tok, sm, best, cta, mw, ac, pa, sy, fx, run, M, C):
    """Logits of this tile's vocabulary rows (stored when asked), their sampling scores, the CTA's best."""
    DT: tl.constexpr = mw.w.dtype.element_ty
    RAGGED: tl.constexpr = (M.V % C.LM.BN) != 0
    rows = task.tile * C.LM.BN + tl.arange(0, C.LM.BN)
    acc, _, waited, sm = _gemv_task(task, tok, sm, cta, mw, ac, pa, sy, fx, ACT_H, fx.fnorm_off, C.LM, M, C)
    lg = rnd(acc, DT)                            # HF_ROUNDING: logits in the model dtype, as HF
    if run.write_logits != 0:
        _store_vocab_rows(ac.logits + tl.cast(tok.step, tl.int64) * M.V, rows, lg, M.V, RAGGED)
    top = best.top
    if C.SAMPLE == 2:   # the top-k / top-p search's inputs (entry._filter): scaled logits, Gumbel scores, maxima
        sc = lg * run.inv_temp
        _store_vocab_rows(ac.partial_v + C.GPOW, rows, sc, M.V, RAGGED)
        top = tl.maximum(top, tl.max(tl.where(rows < M.V, sc, float("-inf")), axis=0))
        gs = gumbel_scores(lg, rows, tok.pos, run.seed, run.inv_temp, M.V, 1)
        _store_vocab_rows(ac.partial_v + C.GPOW + M.V, rows, gs, M.V, RAGGED)
        b, bi = tile_best(gs, rows, rows < M.V)
    elif C.TP:     # vocab parallel: scores and picks are keyed by the global token id
        gid = tl.load(pa.peers + TP_VOCAB_LO).to(tl.int32) + rows
        sc = gumbel_scores(lg, gid, tok.pos, run.seed, run.inv_temp, C.VR, C.SAMPLE)
        b, bi = tile_best(sc, gid, gid < C.VR)
    else:
        sc = gumbel_scores(lg, rows, tok.pos, run.seed, run.inv_temp, M.V, C.SAMPLE)
        b, bi = tile_best(sc, rows, rows < M.V)
    take = b > best.v
    return sm, Best(tl.where(take, b, best.v), tl.where(take, bi, best.i), top), waited
