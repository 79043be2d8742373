"""Tensor parallelism's cross-GPU exchange (TP constexpr; kog.engine.tp_plan plans it, tp_monokernel runs it).

O and down store partial sums of the hidden rows. XPUSH tasks store one chunk of them straight into every
rank's receive buffer (peer stores over NVLink) and bump that rank's chunk flag with a system-scope release;
XRED tasks wait for the chunk's G arrivals, add the G partials in rank order in float32, add the residual and
publish the new hidden rows like any tile. The token's last CTA exchanges the ranks' best (score, global id)
before it releases the next token.

Peer addresses come in one int64 table per rank (layout.TP_*): the kernel's signature does not depend on G,
and the single-GPU launch passes None there (a constexpr), so its code is the single-GPU kernel's.
"""
import triton
import triton.language as tl

from kog.engine.kernel.act import act_offset
from kog.engine.kernel.names import (ACT_DPART, ACT_H, ACT_HMID, ACT_HOUT, ACT_OPART, BUF_DPART, BUF_HMID,
                                     BUF_HOUT, BUF_OPART, E_FLAG, FLAG_STRIDE, T_XPUSH, TP_FLAGS, TP_PEERS, TP_RANK,
                                     TP_RECV, TP_SAMPLE_FLAG, TP_SCORES, TP_TOKENS)
from kog.engine.kernel.numerics import rnd
from kog.engine.kernel.sync import Pending, spin_until, wait_rows
from kog.engine.kernel.vendor import global_time_ns


@triton.jit
def _peer(peers, block, p, NR: tl.constexpr, DTYPE: tl.constexpr):
    """Rank p's address in table block `block` (TP_RECV, TP_FLAGS, TP_SCORES, TP_TOKENS)."""
    return tl.load(peers + TP_PEERS + block * NR + p).to(tl.pointer_type(DTYPE))


@triton.jit
def exchange_task(task, point, t1, t_start, wc, pend, ac, pa, sy, DT: tl.constexpr, M, C):
    """XPUSH / XRED of exchange chunk task.tile after O (point 0) or down (point 1). Returns (wc, pend, waited)."""
    NR: tl.constexpr = C.NR
    XR: tl.constexpr = C.XR
    waited = tl.zeros([], dtype=tl.int64)
    rank = tl.load(pa.peers + TP_RANK).to(tl.int32)
    f = (task.layer * 2 + point) * (M.H // XR) + task.tile          # the chunk's flag
    rows = task.tile * XR + tl.arange(0, XR)
    slot = (task.layer * 2 + point) * NR
    if task.kind == T_XPUSH:
        part_buf = tl.where(point == 0, BUF_OPART, BUF_DPART)
        wc = wait_rows(wc, pa, task.wait, tl.load(pa.rpc + part_buf), task.tile * XR, (task.tile + 1) * XR, t1, sy,
                       task.index, C.VENDOR)
        if C.TRACE:
            waited = global_time_ns(C.VENDOR) - t_start
        part = tl.where(point == 0, act_offset(task.layer, ACT_OPART, M, C), act_offset(task.layer, ACT_DPART, M, C))
        x = tl.load(ac.act + part + rows, cache_modifier=".cg")
        for p in tl.static_range(NR):
            tl.store(_peer(pa.peers, TP_RECV, p, NR, tl.float32) + tl.cast(slot + rank, tl.int64) * M.H + rows, x)
        tl.debug_barrier()    # every thread's stores happen-before the releases below
        for p in tl.static_range(NR):
            fl = _peer(pa.peers, TP_FLAGS, p, NR, tl.int32) + tl.cast(f, tl.int64) * FLAG_STRIDE
            tl.atomic_add(fl, 1, sem="release", scope="sys")
    else:
        fl = _peer(pa.peers, TP_FLAGS, rank, NR, tl.int32) + tl.cast(f, tl.int64) * FLAG_STRIDE
        spin_until(fl, t1 * NR, sy, E_FLAG - f, task.index, C.VENDOR, True)
        # the residual: the layer's input rows (point 0) or hmid (point 1)
        res_buf = tl.where(point == 0, BUF_HOUT, BUF_HMID)
        wc = wait_rows(wc, pa, task.wait, tl.load(pa.rpc + res_buf), task.tile * XR, (task.tile + 1) * XR, t1, sy,
                       task.index, C.VENDOR)
        if C.TRACE:
            waited = global_time_ns(C.VENDOR) - t_start
        recv = _peer(pa.peers, TP_RECV, rank, NR, tl.float32) + tl.cast(slot, tl.int64) * M.H
        acc = tl.load(recv + rows, cache_modifier=".cg")
        for p in tl.static_range(1, NR):
            acc += tl.load(recv + p * M.H + rows, cache_modifier=".cg")
        res = tl.where(point == 0, act_offset(task.layer, ACT_H, M, C), act_offset(task.layer, ACT_HMID, M, C))
        out = tl.where(point == 0, act_offset(task.layer, ACT_HMID, M, C), act_offset(task.layer, ACT_HOUT, M, C))
        h = tl.load(ac.act + res + rows, cache_modifier=".cg")
        tl.store(ac.act + out + rows, rnd(h + acc, DT))
        pend = Pending(pend.counter, pend.n + 1)
    return wc, pend, waited


@triton.jit
def pick_across_ranks(b, tok, step, t1, pa, sy, NR: tl.constexpr, VENDOR: tl.constexpr):
    """Vocab-parallel sampling (run by the last CTA of a token): push this rank's best (score, global id) into
    every rank's slot [token parity, rank], bump every rank's sample flag, wait for all NR candidates, take the
    max, ties to the lowest id (= kog.engine.tp.vocab_parallel_pick)."""
    rank = tl.load(pa.peers + TP_RANK).to(tl.int32)
    sf = tl.load(pa.peers + TP_SAMPLE_FLAG).to(tl.int32)
    par = (step % 2) * NR
    for p in tl.static_range(NR):
        tl.store(_peer(pa.peers, TP_SCORES, p, NR, tl.float32) + par + rank, b)
        tl.store(_peer(pa.peers, TP_TOKENS, p, NR, tl.int32) + par + rank, tok)
    tl.debug_barrier()
    for p in tl.static_range(NR):
        tl.atomic_add(_peer(pa.peers, TP_FLAGS, p, NR, tl.int32) + tl.cast(sf, tl.int64) * FLAG_STRIDE, 1,
                      sem="release", scope="sys")
    fl = _peer(pa.peers, TP_FLAGS, rank, NR, tl.int32) + tl.cast(sf, tl.int64) * FLAG_STRIDE
    spin_until(fl, t1 * NR, sy, E_FLAG - sf, -1, VENDOR, True)
    rr = tl.arange(0, NR)
    sv = tl.load(_peer(pa.peers, TP_SCORES, rank, NR, tl.float32) + par + rr, cache_modifier=".cg")
    si = tl.load(_peer(pa.peers, TP_TOKENS, rank, NR, tl.int32) + par + rr, cache_modifier=".cg")
    best = tl.max(sv, axis=0)
    return tl.min(tl.where(sv == best, si, 2147483647), axis=0)
