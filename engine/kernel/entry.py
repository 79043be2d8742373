"""The monokernel: ONE persistent Triton launch that runs whole decode steps, sampling included.

Each CTA walks its task list (plan.py) once per token and dispatches each task on its type (tasks.py,
attention.py, exchange.py); targeted mode publishes and waits per dependency, grid mode meets at a barrier
after every phase (sync.py). A CTA that finishes its token bumps S_DONE; the last one picks the token from
the CTAs' best candidates (sampling.py), writes it and the next embedding row, and releases S_TOK so the next
token's first layer may start.

Arguments: the launcher's groups (layout.*Args, each a namedtuple of tensors and per-engine values), the
per-launch run values as plain arguments, and two constexpr groups (layout.Shape, layout.Tiling). The run
values are kept out of the groups because Triton specializes integers inside a tuple (a value of 1 becomes a
constant, multiples of 16 get an alignment hint) whatever do_not_specialize says, and a 512-token launch
after an 8-token one must not compile again.
"""
from collections import namedtuple

import triton
import triton.language as tl

from kog.engine.kernel.attention import attention_task, live_splits
from kog.engine.kernel.exchange import exchange_task, pick_across_ranks
from kog.engine.kernel.gemv import XCache
from kog.engine.kernel.names import (E_LOGITS, E_RENDEZVOUS, E_TOKEN, HEAD_EARLY_BIT, HEAD_LAYER_SHIFT,
                                     HEAD_POINT_BIT, HEAD_TYPE_MASK, ROW_BLOCK, ROW_WORDS, S_DONE, S_NTOK, S_SAMPLE,
                                     S_SLOT, S_STOP, S_TOK, T_ATTN, T_BAR, T_DOWN, T_GU, T_LM, T_O, T_QKV)
from kog.engine.kernel.ring import RingCursor, RingSpan, ring_close, ring_fill, ring_open, row_read, rows_load, rows_store
from kog.engine.kernel.sampling import Filter, filtered_pick, filtered_reset, post_draw, tile_best
from kog.engine.kernel.sync import Pending, Waits, grid_barrier, publish, publish_before, record_abort, spin_until
from kog.engine.kernel.tasks import Best, StreamState, gate_up_task, lm_task, qkv_task, residual_task
from kog.engine.kernel.trace import trace_clock, trace_task
from kog.engine.kernel.vendor import global_time_ns, sm_id

# a task's row of the table, decoded (layout.ROW_*)
Task = namedtuple("Task", "index kind layer tile release wait early point")
# the token in flight: step of the launch, step + 1 (counter targets scale with it), cache position, the
# input caches' key of this token, the attention arrivals of the launch's earlier tokens (per arrival word:
# only splits holding cached positions arrive, attention.live_splits of each token)
Tok = namedtuple("Tok", "step t1 pos xtok arrived")
# this CTA: its number in the plan and its weight ring
Cta = namedtuple("Cta", "index rs")
# what the LM head and the token pick need of the run values
Run = namedtuple("Run", "seed inv_temp top_k top_p write_logits force n_eos")


@triton.jit(do_not_specialize=["pos0", "n_tokens", "force", "seed", "top_k", "write_logits", "n_eos"])
def monokernel(mw, ac, pa, sy, tra, fx, pos0, n_tokens, force, seed, top_k, inv_temp, top_p, write_logits, n_eos,
               M, C):
    nprog = tl.num_programs(0)
    cta = _cta_number(pa, sy, fx, C)
    t_lo = tl.load(pa.cta_start + cta)
    t_hi = tl.load(pa.cta_start + cta + 1)
    run = Run(seed, inv_temp, top_k, top_p, write_logits, force, n_eos)
    if C.RING > 0:
        # chunk cursors count from the launch's start; mw.w holds the weights packed as this CTA's chunks in
        # consumption order (kog.engine.ring)
        rs, rc = ring_open(pa, cta, n_tokens, C)
        rc = ring_fill(rs, rc, mw.w, pa, cta, C)
        xc = _empty_input_cache(C)
    else:
        rs = RingSpan(0, 0, 0, 0)
        rc = RingCursor(0, 0)
        xc = XCache(0.0, 0.0, 0, 0, 0)
    me = Cta(cta, rs)
    stop = 0
    tr = 0           # task records written (traced launches)
    atr_n = 0        # attention records written
    arrived = 0
    for step in range(0, n_tokens):
        t1 = step + 1
        tok = Tok(step, t1, pos0 + step, t1.to(tl.int64) * 4294967296, arrived)
        arrived += live_splits(tok.pos, fx, C)
        if stop == 0:   # this token's input embedding is ready, unless generation stopped at EOS
            spin_until(sy.sync + S_TOK, step, sy, E_TOKEN, -1, C.VENDOR)
            stop = tl.load(sy.sync + S_STOP, volatile=True)
        if stop == 0:
            best = Best(float("-inf"), 0, float("-inf"))
            sm = StreamState(Waits(-1, -1), rc, xc)
            pend = Pending(-1, 0)
            if C.RING > 0:
                # the token's first block of rows into row buffer 0 (every thread read the last token's rows
                # before the CTA barrier that ended it); the block-start barrier of task 0 publishes it
                rows_store(rs, pa, cta, 0, rows_load(pa.rows, t_lo, t_hi, True), C.VENDOR)
            for ti in range(t_lo, t_hi):
                j = ti - t_lo
                task, nxt, blk0 = _read_task(ti, j, t_hi, me, pa, C)
                t_pub = trace_clock(C.TRACE, C.VENDOR)
                pend, t_bar = publish_before(pa.cnt, pend, task.release, C.TRACE, C.VENDOR)
                t_start = trace_clock(C.TRACE, C.VENDOR)
                waited = tl.zeros([], dtype=tl.int64)
                if task.kind == T_QKV:
                    sm, pend, waited = qkv_task(task, tok, sm, pend, me, mw, ac, pa, sy, fx, M, C)
                elif task.kind == T_ATTN:
                    wc, pend, waited, atr_n = attention_task(task, tok, t_start, sm.wc, pend, atr_n, cta, mw, ac, pa,
                                                             sy, tra, fx, M, C)
                    sm = StreamState(wc, sm.rc, sm.xc)
                elif task.kind == T_O:
                    sm, pend, waited = residual_task(task, tok, sm, pend, me, mw, ac, pa, sy, fx, C.O, False, M, C)
                elif task.kind == T_GU:
                    sm, pend, waited = gate_up_task(task, tok, sm, pend, me, mw, ac, pa, sy, fx, M, C)
                elif task.kind == T_DOWN:
                    sm, pend, waited = residual_task(task, tok, sm, pend, me, mw, ac, pa, sy, fx, C.DOWN, True, M, C)
                elif task.kind == T_LM:
                    sm, best, waited = lm_task(task, tok, sm, best, me, mw, ac, pa, sy, fx, run, M, C)
                elif C.TP:     # the cross-GPU exchange (targeted mode only: a TP plan has no barriers)
                    wc, pend, waited = exchange_task(task, task.point, tok.t1, t_start, sm.wc, pend, ac, pa, sy,
                                                     mw.w.dtype.element_ty, M, C)
                    sm = StreamState(wc, sm.rc, sm.xc)
                elif task.kind == T_BAR:  # grid mode's barrier after a phase (tile: its number in the token)
                    grid_barrier(sy, step * fx.bar_per_tok + task.tile + 1, nprog, ti, C.VENDOR)
                    if C.TRACE:
                        waited = global_time_ns(C.VENDOR) - t_start
                if C.TRACE:
                    if (step < tra.tokens) & (tr < tra.cap):
                        trace_task(tra, cta, tr, t_start, waited, ti, step, t_pub, t_bar, C.VENDOR)
                        tr += 1
                if C.RING > 0:
                    if blk0:
                        rows_store(rs, pa, cta, (j // ROW_BLOCK + 1) % 2, nxt, C.VENDOR)
            rc = sm.rc
            xc = sm.xc
            _end_token(tok, best, pend, cta, nprog, mw, ac, pa, sy, run, M, C)
    if C.RING > 0:
        ring_close(rs, rc, sy, C)


@triton.jit
def _cta_number(pa, sy, fx, C):
    """This program's CTA number in the plan: its program id, or with the topology mapping its rank in
    (%smid, program id) order, since the plan numbers CTAs SM-major (the scan's SMs in order). The latter
    takes one rendezvous of the whole grid, once per launch."""
    pid = tl.program_id(0)
    cta = pid
    if fx.use_smid != 0:
        nprog = tl.num_programs(0)
        rs = tl.arange(0, C.GPOW)
        sm = sm_id(C.VENDOR)
        tl.store(pa.smid_tab + pid, sm)
        tl.debug_barrier()
        tl.atomic_add(sy.sync + S_SLOT, 1, sem="release", scope="gpu")
        spin_until(sy.sync + S_SLOT, nprog, sy, E_RENDEZVOUS, -1, C.VENDOR)
        sms = tl.load(pa.smid_tab + rs, mask=rs < nprog, other=2147483647, cache_modifier=".cg")
        cta = tl.sum(((sms < sm) | ((sms == sm) & (rs < pid))).to(tl.int32), axis=0)
    return cta


@triton.jit
def _empty_input_cache(C):
    """The ring's input cache before any task ran: keys -1 (nothing cached). The word cache of down's input
    exists only where it is used (C.DOWN.XW)."""
    if C.DOWN.XW:
        xd = tl.zeros([C.DOWN.BK // 2], dtype=tl.int32)
    else:
        xd = tl.zeros([2], dtype=tl.int32)
    return XCache(tl.zeros([C.BKC_X // 2], dtype=tl.float32), tl.zeros([C.BKC_X // 2], dtype=tl.float32),
                  tl.full([], -1, tl.int64), xd, tl.full([], -1, tl.int64))


@triton.jit
def _read_task(ti, j, t_hi, me, pa, C):
    """(Task, the next row block, whether this task starts a block): with the ring the rows come from shared
    memory, loaded a block ahead (at a block's first task: a CTA barrier, since every thread must be done
    with the buffer the next block goes to and see this block's stores; then the next block's load, stored
    after this task so the task hides its latency); without it, straight from the table."""
    if C.RING > 0:
        blk0 = (j % ROW_BLOCK) == 0
        if blk0:
            tl.debug_barrier()
        nxt = rows_load(pa.rows, ti + ROW_BLOCK, t_hi, blk0)
        w0, w1, w2, w3 = row_read(me.rs, pa, me.index, j, C.VENDOR)
    else:
        blk0 = False
        nxt = 0
        r = pa.rows + ti * ROW_WORDS
        w0 = tl.load(r)
        w1 = tl.load(r + 1)
        w2 = tl.load(r + 2)
        w3 = tl.load(r + 3)
    task = Task(ti, w0 & HEAD_TYPE_MASK, w0 >> HEAD_LAYER_SHIFT, w1, w2, w3, (w0 >> HEAD_EARLY_BIT) & 1,
                (w0 >> HEAD_POINT_BIT) & 1)
    return task, nxt, blk0


@triton.jit
def _end_token(tok, best, pend, cta, nprog, mw, ac, pa, sy, run, M, C):
    """This CTA is done with the token: publish what it holds back and its best candidate (top-k / top-p: its
    draw once the grid searched with it, sampling.filtered_pick). The last CTA to finish picks the token,
    records it (EOS stops the launch), writes the next token's input embedding and releases the next
    token."""
    publish(pa.cnt, pend, False, C.VENDOR)
    if C.SAMPLE == 2:   # top-k / top-p: every CTA searches with the others, then draws
        f = _filter(ac, sy, M, C)
        tl.store(f.maxima + cta, best.top)
        post_draw(f, best.v, best.i)
        bv, bi = filtered_pick(f, cta, cta + 1, nprog, M.V, run.top_k, run.top_p, sy, C.VENDOR, C.FILTER_BV)
        best = Best(bv, bi, best.top)
    tl.store(ac.partial_v + cta, best.v)
    tl.store(ac.partial_i + cta, best.i)
    # the stop list is read before the arrival: after it (an acquire) the read is an L2 round trip between
    # the token's pick and the next token's embedding
    er = tl.arange(0, 8)
    eos = tl.load(ac.eos + er, mask=er < run.n_eos, other=-1)
    tl.debug_barrier()
    old = tl.atomic_add(sy.sync + S_DONE, 1, sem="acq_rel", scope="gpu")
    if old == tok.t1 * nprog - 1:
        rs = tl.arange(0, C.GPOW)
        pv = tl.load(ac.partial_v + rs, mask=rs < nprog, other=float("-inf"), cache_modifier=".cg")
        pi = tl.load(ac.partial_i + rs, mask=rs < nprog, other=0, cache_modifier=".cg")
        b, t = tile_best(pv, pi, rs < nprog)
        if C.TP:    # every rank's best to every rank; all take the same max (ties: lowest id)
            t = pick_across_ranks(b, t, tok.step, tok.t1, pa, sy, C.NR, C.VENDOR)
        if C.SAMPLE == 2:
            filtered_reset(_filter(ac, sy, M, C))
        if run.force != 0:
            t = tl.load(ac.forced + tok.step + 1)
        t = _checked_token(t, b, run.force, tok, sy, M, C)
        if tl.sum((eos == t).to(tl.int32), axis=0) > 0:
            tl.store(sy.sync + S_STOP, 1)
        tl.store(sy.sync + S_NTOK, tok.t1)
        # the next token's input, layer 0's h (activation offset 0): the embedding row in 512-wide pieces (a
        # wider piece stays live beside the input caches and made other phases spill)
        EMB: tl.constexpr = 512
        rh = tl.arange(0, EMB)
        for k0 in range(0, M.H, EMB):
            e = tl.load(mw.embed + tl.cast(t, tl.int64) * M.H + k0 + rh, mask=k0 + rh < M.H, other=0.0)
            tl.store(ac.act + k0 + rh, e.to(tl.float32), mask=k0 + rh < M.H)
        tl.debug_barrier()
        tl.atomic_xchg(sy.sync + S_TOK, tok.t1, sem="release", scope="gpu")
        # the token goes to host memory (the launcher's pinned buffer, for the host to read while the launch
        # runs) only after the next token is released: the write crosses the bus, off the critical path
        tl.store(ac.out + tok.step, t)


@triton.jit
def _checked_token(t, b, force, tok, sy, M, C):
    """The picked token, or 0 with the launch aborted (E_LOGITS) when the pick found no token: its best score
    NaN or -inf (every logit NaN: each tile keeps its initial -inf and id 0, a silent token 0 otherwise), or an
    id outside the vocabulary, which would index the embedding out of bounds. A tensor-parallel rank checks
    the id only (a rank's padded vocabulary slice may hold no finite logit); a forced token is the host's."""
    if C.TP:
        bad = (t < 0) | (t >= C.VR)
    else:
        bad = (t < 0) | (t >= M.V) | ((force == 0) & ((b != b) | (b == float("-inf"))))
    if bad:
        record_abort(sy, E_LOGITS, -1, tok.step, t)
        t = 0
    return t


@triton.jit
def _filter(ac, sy, M, C):
    """The top-k / top-p search's memory (sampling.Filter): in partial_v after the CTAs' picks, the LM tiles'
    scaled logits, their Gumbel scores, each CTA's max (tasks.lm_task writes the first two); the per-round
    sums; the arrival words."""
    lbuf = ac.partial_v + C.GPOW
    return Filter(lbuf, lbuf + M.V, lbuf + 2 * M.V, ac.search, sy.sync + S_SAMPLE)
