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

Weight ring (RING constexpr = EngineConfig.weight_ring slots, kog.engine.ring; the default on NVIDIA sm_90+):
every GEMV reads its weight chunks from shared-memory slots that thread 0 refills with bulk copies ahead of
use (_gemv_ring), so the stream continues while the CTA reduces, stores and waits; w_ptr then holds the
weights repacked in each CTA's consumption order. A copy that never lands is recorded as counter -4.

Tensor parallelism (TP constexpr, kog.engine.tp_monokernel; off by default, and then the compiled code is the
single-GPU kernel's, SASS byte for byte): o and down store partial sums; xpush / xred tasks (types 7, 8) move
them between ranks through peer pointers and per-chunk flags (system-scope release / acquire); the token's
last CTA exchanges the ranks' best (score, global id) before it releases the next token. Flag timeouts are
recorded as counter -16 - flag.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

from kog.engine.abort import record_abort
from kog.engine.ring import (ROW_BLOCK, pack_pairs, ring_drain, ring_fill, ring_init, ring_prefetch_ahead, ring_tile,
                             ring_wait, row_read, rows_load, rows_store, unpack_words)
from kog.engine.sampling import filtered_sample, gumbel_scores, tile_best
from kog.engine.vendor import (dyn_smem_size, global_time_after, global_time_ns, poll_acquire, release_counter,
                               ring_prefetch_l2, sm_id, smem_base, wait_counters)

# Activation numerics, fixed per process. Default: activations stay float32 from step to step (the model's
# math on the checkpoint's weights; what is rounded to the model dtype is what must be: the KV cache, and q
# for the tensor-core dot against it; and down's input where XCACHE_DOWN keeps it in registers as model-dtype
# words), so the kernel's logits sit close to the float32 oracle
# (kog.engine.bench: 2e-2 is below the distance of any bf16-rounding implementation, HF's own included).
# KOG_HF_ROUNDING=1: round where HF keeps bf16/fp16 tensors (norm outputs, projections, residuals, RoPE,
# scores, logits): HF's function, with its rounding noise. Read once at import (Triton checks that a global
# constexpr is unchanged since compile). The tensor-parallel engines share it, so TP and tp_compat stay equal.
HF_ROUNDING: tl.constexpr = tl.constexpr(os.environ.get("KOG_HF_ROUNDING", "0") == "1")
# down's input (the SiLU product, which HF keeps in the model dtype) held in registers across a CTA's down tasks
# as model-dtype words, not reloaded from L2 by every task (_gemv_ring's XW); False: float32, reloaded
XCACHE_DOWN: tl.constexpr = tl.constexpr(True)
# an attention split of several tiles (EngineConfig.attn_tile) asks the L2 for its later tiles' K/V before
# its wait (one bulk prefetch each), as it loads the first tile's into registers there
ATTN_L2PF: tl.constexpr = tl.constexpr(True)

# task types: keep in sync with plan.py
T_QKV: tl.constexpr = tl.constexpr(0)
T_ATTN: tl.constexpr = tl.constexpr(1)
T_O: tl.constexpr = tl.constexpr(2)
T_GU: tl.constexpr = tl.constexpr(3)
T_DOWN: tl.constexpr = tl.constexpr(4)
T_LM: tl.constexpr = tl.constexpr(5)
T_BAR: tl.constexpr = tl.constexpr(6)
T_NONE: tl.constexpr = tl.constexpr(15)    # dispatch type of a task a pipelined run already ran (EngineConfig.pipeline_stages)

# scalar sync words (int32) in `sync_ptr`
S_ABORT: tl.constexpr = tl.constexpr(0)
S_TOK: tl.constexpr = tl.constexpr(1)       # tokens whose embedding is ready (next token may start)
S_DONE: tl.constexpr = tl.constexpr(2)      # CTAs finished with the current token (monotonic)
S_BAR: tl.constexpr = tl.constexpr(3)       # grid-barrier arrivals (monotonic)
S_STOP: tl.constexpr = tl.constexpr(4)      # EOS seen
S_NTOK: tl.constexpr = tl.constexpr(5)      # tokens produced
S_SLOT: tl.constexpr = tl.constexpr(16)     # start-up rendezvous of the topology mapping
S_ARR: tl.constexpr = tl.constexpr(1024)    # arrivals of attention splits per (layer, KV head) (monotonic)


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
                record_abort(sync_ptr + S_ABORT, err_ptr, what, task, target, v)


@triton.jit
def _prefetch_tasks(w_ptr, tasks_ptr, lo, hi, UPO: tl.constexpr, VENDOR: tl.constexpr):
    """Pull the weight tiles of tasks [lo, hi) into L2 (NVIDIA prefetch.global.L2, one per 128-byte line;
    column 5 of a task row holds its tile's line count). Costs no registers to speak of and never blocks.
    Used ahead of time (EngineConfig.prefetch) and while a wait blocks (EngineConfig.blocked_prefetch); both
    measured slower than no prefetch on the H200 (bench/h200/ENGINE_NOTES.md) and are off by default."""
    if VENDOR == 1:
        lane = tl.arange(0, 128).to(tl.int64) * 64
        for tj in range(lo, hi):
            typ = tl.load(tasks_ptr + tj * 8)
            base = w_ptr + tl.load(tasks_ptr + tj * 8 + 4).to(tl.int64) * 64
            nl = tl.load(tasks_ptr + tj * 8 + 5)
            for j in range(0, nl, 128):
                a = base + tl.minimum(j * 64 + lane, (nl - 1) * 64)
                tl.inline_asm_elementwise("prefetch.global.L2 [$1];\nmov.u32 $0, 0;", "=r,l", [a],
                                          dtype=tl.int32, is_pure=False, pack=1)
                if typ == 3:   # gate_up: the up tile lies UPO elements after the gate tile
                    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\nmov.u32 $0, 0;", "=r,l", [a + UPO],
                                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _wait_rows(cnt_ptr, tgt_ptr, base, R, r0, r1, t1, rb, rm, sync_ptr, err_ptr, max_spin, task,
               w_ptr, tasks_ptr, t_hi, UPO: tl.constexpr, PFB: tl.constexpr, VENDOR: tl.constexpr):
    """Wait until rows [r0, r1) of a buffer are ready for token t1-1 (counters base + r // R).

    (rb, rm) caches what this CTA already knows: counters base rb + 0..rm are ready for this token, so a
    CTA's second and later tasks of a phase skip the wait (and its L2 round trip) entirely.
    PFB > 0: when the first poll finds the data not ready, the CTA first L2-prefetches its current task's
    tile and the next PFB tasks' tiles (the blocked time then streams weights instead of idling)."""
    c0 = r0 // R
    c1 = (r1 - 1) // R
    if base != rb:
        rb = base
        rm = -1
    pf = 0
    for c in range(c0, c1 + 1):
        if c > rm:
            tgt = tl.load(tgt_ptr + base + c) * t1
            if PFB > 0:
                if pf == 0:
                    if tl.load(cnt_ptr + base + c, volatile=True) < tgt:
                        _prefetch_tasks(w_ptr, tasks_ptr, task, tl.minimum(task + 1 + PFB, t_hi), UPO, VENDOR)
                        pf = 1
            _spin_until(cnt_ptr + base + c, tgt, sync_ptr, err_ptr, max_spin, base + c, task, VENDOR)
            if c == rm + 1:
                rm = c
    return rb, rm


@triton.jit
def _not_ready(cnt_ptr, tgt_ptr, base, R, r1, t1, rb, rm):
    """Whether rows up to r1 of a buffer are not known ready for token t1-1: the (rb, rm) wait cache does not
    cover them and their last counter is short (one poll; a hint for what to do before the real wait)."""
    c1 = (r1 - 1) // R
    short = False
    if (base != rb) | (c1 > rm):
        short = tl.load(cnt_ptr + base + c1, volatile=True) < tl.load(tgt_ptr + base + c1) * t1
    return short


@triton.jit
def _task_row(tasks_ptr, ti):
    """Task ti's row: type, layer, tile, weight offset (elements; stored in units of 64 = 128-byte aligned),
    release counter, first counter it waits on."""
    trow = tasks_ptr + ti * 8
    return (tl.load(trow), tl.load(trow + 1), tl.load(trow + 2), tl.load(trow + 4).to(tl.int64) * 64,
            tl.load(trow + 6), tl.load(trow + 7))


@triton.jit
def _flush(cnt_ptr, pend_idx, pend_n):
    """Publish finished tiles: every thread's stores happen-before one release increment of pend_n."""
    if (pend_n > 0) & (pend_idx >= 0):
        tl.debug_barrier()
        tl.atomic_add(cnt_ptr + pend_idx, pend_n, sem="release", scope="gpu")


@triton.jit
def _load_tile(ptrs, kk, K: tl.constexpr, EVEN: tl.constexpr):
    """A weight tile, read once per token: evict_first, so the stream does not push the small data every task
    re-reads (task rows, offsets, counter targets, x) out of L1 and L2. Measured on the H200: +3.6% tok/s
    (bench/h200/ENGINE_NOTES.md); Nsight Compute had shown ~15% of warp stalls on those metadata loads."""
    if EVEN:
        w = tl.load(ptrs, eviction_policy="evict_first")
    else:
        w = tl.load(ptrs, mask=kk[None, :] < K, other=0.0, eviction_policy="evict_first")
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
def _rnd(x, DT: tl.constexpr):
    """Where HF keeps a bf16/fp16 tensor: round to the model dtype and back under HF_ROUNDING, else keep x
    (float32 activations)."""
    if HF_ROUNDING:
        x = x.to(DT).to(tl.float32)
    return x


@triton.jit
def _normed_x(x_ptr, g_ptr, eps, kk, K: tl.constexpr, DT: tl.constexpr):
    """HF RMSNorm of the whole input vector: weight * (x * rsqrt(mean(x^2) + eps)).to(dtype)."""
    x = tl.load(x_ptr + kk, mask=kk < K, other=0.0)
    g = tl.load(g_ptr + kk, mask=kk < K, other=0.0)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / K + eps)
    return _rnd(_rnd(x * r, DT) * g, DT)


@triton.jit
def _timed_wait(cnt_ptr, tgt_ptr, cbase, R, r0, r1, t1, rb, rm, sync_ptr, err_ptr, max_spin, task, waited,
                w_ptr, tasks_ptr, t_hi, UPO: tl.constexpr, PFB: tl.constexpr, TRACE: tl.constexpr,
                VENDOR: tl.constexpr):
    """_wait_rows, adding the time it blocked to `waited` in an instrumented run."""
    if TRACE:
        w0 = global_time_ns(VENDOR)
    rb, rm = _wait_rows(cnt_ptr, tgt_ptr, cbase, R, r0, r1, t1, rb, rm, sync_ptr, err_ptr, max_spin, task,
                        w_ptr, tasks_ptr, t_hi, UPO, PFB, VENDOR)
    if TRACE:
        waited += global_time_ns(VENDOR) - w0
    return rb, rm, waited


@triton.jit
def _gemv(w_ptr, w_off, x_ptr, g_ptr, eps, cnt_ptr, tgt_ptr, cbase, R, t1, rb, rm, sync_ptr, err_ptr, max_spin,
          task, tasks_ptr, t_hi, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, NORM: tl.constexpr,
          WAIT: tl.constexpr, UPO: tl.constexpr, PFB: tl.constexpr, TRACE: tl.constexpr, VENDOR: tl.constexpr,
          KS: tl.constexpr = 0, KB: tl.constexpr = 0):
    """acc[BN] = W[tile rows, :K] . x (x RMS-normed with weight g when NORM). Each chunk's weight load is
    issued BEFORE the wait for the matching chunk of x, so the HBM stream does not stop at a dependency.

    NORM with K <= BK normalizes x first, exactly as HF does; a longer K (hidden > block_k) applies the
    1/rms scale to the dot product instead (same math, different rounding).
    KS > 0: a K-slice [KB, KB + K) of rows KS long (EngineConfig.tp_compat: the slice a tensor-parallel rank
    holds, reduced exactly as that rank reduces it)."""
    DT: tl.constexpr = w_ptr.dtype.element_ty
    EVEN: tl.constexpr = K % BK == 0
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    if KS == 0:
        wrow = w_ptr + w_off + (rn * K).to(tl.int64)[:, None]
    else:
        wrow = w_ptr + w_off + KB + (rn * KS).to(tl.int64)[:, None]
        x_ptr += KB
    acc = tl.zeros([BN], dtype=tl.float32)
    ss = 0.0
    waited = tl.zeros([], dtype=tl.int64)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        w = _load_tile(wrow + kk[None, :], kk, K, EVEN)
        if WAIT:
            rb, rm, waited = _timed_wait(cnt_ptr, tgt_ptr, cbase, R, KB + k0, KB + tl.minimum(k0 + BK, K), t1, rb, rm,
                                         sync_ptr, err_ptr, max_spin, task, waited, w_ptr, tasks_ptr, t_hi, UPO, PFB,
                                         TRACE, VENDOR)
        if NORM:
            if K <= BK:
                xg = _normed_x(x_ptr, g_ptr, eps, kk, K, DT)
            else:
                x, xg = _load_x(x_ptr, g_ptr, kk, K, EVEN, True)
                ss += tl.sum(x * x, axis=0)
        else:
            x, xg = _load_x(x_ptr, g_ptr, kk, K, EVEN, False)
        acc += tl.sum(w.to(tl.float32) * xg[None, :], axis=1)
    if NORM:
        if K > BK:
            acc = acc * (1.0 / tl.sqrt(ss / K + eps))
    return acc, waited, rb, rm


@triton.jit
def _gemv_rank_sum(w_ptr, w_off, x_ptr, g_ptr, eps, cnt_ptr, tgt_ptr, cbase, R, t1, rb, rm, sync_ptr, err_ptr,
                   max_spin, task, tasks_ptr, t_hi, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   WAIT: tl.constexpr, UPO: tl.constexpr, PFB: tl.constexpr, TRACE: tl.constexpr,
                   VENDOR: tl.constexpr, TPC: tl.constexpr):
    """A row-parallel GEMV (O, down) rounded to the model dtype, as TPC tensor-parallel ranks compute it: each
    rank's K slice reduced alone (_gemv's KS/KB) and rounded, the slices added in rank order in float32 (the
    exchange's XRED sum; EngineConfig.tp_compat). TPC = 1: the whole row, NOT yet rounded (_rounded_sum
    rounds it where the caller uses it, which keeps the default kernel's instruction schedule)."""
    DT: tl.constexpr = w_ptr.dtype.element_ty
    if TPC == 1:
        acc, waited, rb, rm = _gemv(w_ptr, w_off, x_ptr, g_ptr, eps, cnt_ptr, tgt_ptr, cbase, R, t1, rb, rm,
                                    sync_ptr, err_ptr, max_spin, task, tasks_ptr, t_hi, K, BN, BK, False, WAIT, UPO,
                                    PFB, TRACE, VENDOR)
    else:
        acc = tl.zeros([BN], dtype=tl.float32)
        waited = tl.zeros([], dtype=tl.int64)
        for r in tl.static_range(TPC):
            part, wt, rb, rm = _gemv(w_ptr, w_off, x_ptr, g_ptr, eps, cnt_ptr, tgt_ptr, cbase, R, t1, rb, rm,
                                     sync_ptr, err_ptr, max_spin, task, tasks_ptr, t_hi, K // TPC, BN, BK, False,
                                     WAIT, UPO, PFB, TRACE, VENDOR, K, r * (K // TPC))
            acc += _rnd(part, DT)
            waited += wt
    return acc, waited, rb, rm


@triton.jit
def _rounded_sum(acc, DT: tl.constexpr, TPC: tl.constexpr):
    """_gemv_rank_sum's result in the model dtype (its TPC > 1 sum is already a sum of rounded slices)."""
    if TPC == 1:
        acc = _rnd(acc, DT)
    return acc


@triton.jit
def _gemv2(w_ptr, off_a, off_b, x_ptr, g_ptr, eps, cnt_ptr, tgt_ptr, cbase, R, t1, rb, rm, sync_ptr, err_ptr,
           max_spin, task, tasks_ptr, t_hi, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, WAIT: tl.constexpr,
           UPO: tl.constexpr, PFB: tl.constexpr, TRACE: tl.constexpr, VENDOR: tl.constexpr):
    """Two row tiles (gate and up) against the same RMS-normed x, sharing the waits and the x loads."""
    DT: tl.constexpr = w_ptr.dtype.element_ty
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
            rb, rm, waited = _timed_wait(cnt_ptr, tgt_ptr, cbase, R, k0, tl.minimum(k0 + BK, K), t1, rb, rm, sync_ptr,
                                         err_ptr, max_spin, task, waited, w_ptr, tasks_ptr, t_hi, UPO, PFB, TRACE,
                                         VENDOR)
        if K <= BK:
            xg = _normed_x(x_ptr, g_ptr, eps, kk, K, DT)
        else:
            x, xg = _load_x(x_ptr, g_ptr, kk, K, EVEN, True)
            ss += tl.sum(x * x, axis=0)
        acc_a += tl.sum(wa.to(tl.float32) * xg[None, :], axis=1)
        acc_b += tl.sum(wb.to(tl.float32) * xg[None, :], axis=1)
    if K > BK:
        r = 1.0 / tl.sqrt(ss / K + eps)
        acc_a = acc_a * r
        acc_b = acc_b * r
    return acc_a, acc_b, waited, rb, rm


@triton.jit
def _x_pairs(x_ptr, g_ptr, eps, k0, ne, K: tl.constexpr, BKC: tl.constexpr, NORM: tl.constexpr,
             DT: tl.constexpr, SSV: tl.constexpr = False):
    """x[k0 + 2j] and x[k0 + 2j + 1] (j < BKC / 2, columns >= ne read 0) to meet a ring chunk's word pairs,
    times the RMSNorm weight when NORM: normalized first, exactly as HF, when one chunk spans K (K <= BKC);
    else x * g, and ss = this chunk's sum of squares (the caller scales the dot product, as _gemv); SSV: ss
    per pair, not reduced (the caller sums the steps' vectors and reduces once)."""
    rj = tl.arange(0, BKC // 2)
    ok = 2 * rj < ne
    xl = tl.load(x_ptr + k0 + 2 * rj, mask=ok, other=0.0)
    xh = tl.load(x_ptr + k0 + 2 * rj + 1, mask=ok, other=0.0)
    ss = 0.0
    if NORM:
        gl = tl.load(g_ptr + k0 + 2 * rj, mask=ok, other=0.0)
        gh = tl.load(g_ptr + k0 + 2 * rj + 1, mask=ok, other=0.0)
        # one reduction for both halves: each is a shuffle chain, a shared-memory round and a CTA barrier
        if K <= BKC:
            r = 1.0 / tl.sqrt(tl.sum(xl * xl + xh * xh, axis=0) / K + eps)
            xl = _rnd(_rnd(xl * r, DT) * gl, DT)
            xh = _rnd(_rnd(xh * r, DT) * gh, DT)
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
def _ring_input(x_ptr, g_ptr, eps, k0, cnt_ptr, tgt_ptr, cbase, R, t1, rb, rm, sync_ptr, err_ptr, max_spin, task,
                waited, w_ptr, tasks_ptr, t_hi, c_lo, nch, pmax, pn, K: tl.constexpr, BKC: tl.constexpr,
                NORM: tl.constexpr, WAIT: tl.constexpr, SLOTB: tl.constexpr, UPO: tl.constexpr,
                TRACE: tl.constexpr, VENDOR: tl.constexpr, PFB: tl.constexpr, SSV: tl.constexpr):
    """The input of the K step at k0 (nothing, all masked, when k0 >= K): wait for its rows' counters, then
    load its x pairs (_x_pairs). Returns (xl, xh, s2, rb, rm, waited)."""
    ne = tl.minimum(BKC, K - k0)
    if WAIT:
        if k0 < K:
            if PFB > 0:    # blocked on the input: HBM streams the PFB chunks beyond the ring meanwhile
                if _not_ready(cnt_ptr, tgt_ptr, cbase, R, k0 + ne, t1, rb, rm):
                    ring_prefetch_ahead(w_ptr, c_lo, nch, pmax, pn, PFB, SLOTB, VENDOR)
            rb, rm, waited = _timed_wait(cnt_ptr, tgt_ptr, cbase, R, k0, k0 + ne, t1, rb, rm, sync_ptr, err_ptr,
                                         max_spin, task, waited, w_ptr, tasks_ptr, t_hi, UPO, 0, TRACE, VENDOR)
    xl, xh, s2 = _x_pairs(x_ptr, g_ptr, eps, k0, ne, K, BKC, NORM, DT=w_ptr.dtype.element_ty, SSV=SSV)
    return xl, xh, s2, rb, rm, waited


@triton.jit
def _gemv_ring(rbase, gring_ptr, cta, cn, pn, w_ptr, c_lo, nch, pmax, x_ptr, g_ptr, eps, cnt_ptr,
               tgt_ptr, cbase, R, t1, rb, rm, sync_ptr, err_ptr, max_spin, task, tasks_ptr, t_hi,
               K: tl.constexpr, BN: tl.constexpr, BKC: tl.constexpr, NORM: tl.constexpr, GU: tl.constexpr,
               WAIT: tl.constexpr, NS: tl.constexpr, SLOTB: tl.constexpr, UPO: tl.constexpr,
               TRACE: tl.constexpr, VENDOR: tl.constexpr, sz_ptr=None, SIZES: tl.constexpr = False,
               PF: tl.constexpr = 0, xc_l=None, xc_h=None, xc_key=None, xkey=None, PFB: tl.constexpr = 0,
               XRAW: tl.constexpr = False, xd=None, xd_key=None, XW: tl.constexpr = False):
    """_gemv (GU: _gemv2) with the weights from the CTA's ring (kog.engine.ring): per K step, top the ring
    up (the copies of later chunks, later tasks and the next token fly while this one waits and computes),
    wait for the input's counters, wait for the chunk, multiply. Returns (acc, acc2 (GU: the up rows),
    waited, rb, rm, cn, pn, xc_l, xc_h, xc_key, xd, xd_key).

    When one chunk spans the input (K <= BKC) and it is RMS-normed (NORM: qkv, gate_up at its wide chunk,
    the LM head) or XRAW (O, whose chunk is as wide as the cache), its x pairs (normed) are cached in
    registers (xc_l, xc_h) under xkey (the input buffer's offset and the token): a CTA's next task of the
    phase reuses them instead of loading x (and g) again from L2 and reducing x * x across the CTA (a CTA
    runs ~60 LM tasks a token on the same x).

    XW (down, when its one chunk spans K = intermediate): the plain input is cached the same way, as words of
    two model-dtype values (ring.pack_pairs: xd, keyed by xd_key), the input HF itself keeps in bf16/fp16. Without
    it every down task reloaded the whole [I] vector from L2, all CTAs at once, and waited for it (the
    largest stall of sheared-llama-2.7b's down tasks, Nsight Compute, bench/h200/ENGINE_NOTES.md).

    An RMS-normed input over several K steps (K > BKC: qkv at sheared-llama-2.7b's [32, 512] chunks): step
    k + 1's input is waited for and loaded before step k's chunk wait and math, so its L2 latency is not paid
    between two chunks, and the sum of squares is kept per thread and reduced once, not once a step."""
    DT: tl.constexpr = w_ptr.dtype.element_ty
    # the next step's input one step ahead only for an RMS-normed input: on llama-3.2-1b's down (K = 8192 in
    # four 2048-column steps, not normed) the held input cost 35 registers and 1.2% (H200, same run)
    MULTI: tl.constexpr = (K > BKC) and NORM
    CACHED: tl.constexpr = (K <= BKC) and (NORM or XRAW)
    XWC: tl.constexpr = XW and (K <= BKC) and (not CACHED) and (DT != tl.float32)    # (words: 16-bit dtypes)
    acc = tl.zeros([BN], dtype=tl.float32)
    acc2 = tl.zeros([BN], dtype=tl.float32)
    accg = tl.zeros([2 * BN], dtype=tl.float32)     # GU: gate rows then up rows, split after the K loop
    ssv = tl.zeros([BKC // 2], dtype=tl.float32)
    waited = tl.zeros([], dtype=tl.int64)
    if MULTI:    # step 0's input; each step then fetches the next one's (the copies are asked for first)
        pn = ring_fill(w_ptr, c_lo, nch, pmax, rbase, gring_ptr, cta, pn, cn, sz_ptr, NS, SLOTB, SIZES, VENDOR, PF)
        xn_l, xn_h, sn, rb, rm, waited = _ring_input(x_ptr, g_ptr, eps, 0, cnt_ptr, tgt_ptr, cbase, R, t1, rb, rm,
                                                     sync_ptr, err_ptr, max_spin, task, waited, w_ptr, tasks_ptr,
                                                     t_hi, c_lo, nch, pmax, pn, K, BKC, NORM, WAIT, SLOTB, UPO,
                                                     TRACE, VENDOR, PFB, True)
    for k0 in range(0, K, BKC):
        ne = tl.minimum(BKC, K - k0)
        pn = ring_fill(w_ptr, c_lo, nch, pmax, rbase, gring_ptr, cta, pn, cn, sz_ptr, NS, SLOTB, SIZES, VENDOR, PF)
        if MULTI:
            xl = xn_l
            xh = xn_h
            ssv += sn
            xn_l, xn_h, sn, rb, rm, waited = _ring_input(x_ptr, g_ptr, eps, k0 + BKC, cnt_ptr, tgt_ptr, cbase, R,
                                                         t1, rb, rm, sync_ptr, err_ptr, max_spin, task, waited,
                                                         w_ptr, tasks_ptr, t_hi, c_lo, nch, pmax, pn, K, BKC, NORM,
                                                         WAIT, SLOTB, UPO, TRACE, VENDOR, PFB, True)
        elif CACHED:
            if xkey == xc_key:       # this token's input, as an earlier task of this CTA loaded (and normed) it
                xl = xc_l
                xh = xc_h
            else:
                xl, xh, s2, rb, rm, waited = _ring_input(x_ptr, g_ptr, eps, k0, cnt_ptr, tgt_ptr, cbase, R, t1, rb,
                                                         rm, sync_ptr, err_ptr, max_spin, task, waited, w_ptr,
                                                         tasks_ptr, t_hi, c_lo, nch, pmax, pn, K, BKC, NORM, WAIT,
                                                         SLOTB, UPO, TRACE, VENDOR, PFB, False)
                xc_l = xl
                xc_h = xh
                xc_key = xkey
        elif XWC:
            if xkey == xd_key:       # this token's input of this layer, as an earlier down task loaded it
                xl, xh = unpack_words(xd, DT)
            else:
                xl, xh, s2, rb, rm, waited = _ring_input(x_ptr, g_ptr, eps, k0, cnt_ptr, tgt_ptr, cbase, R, t1, rb,
                                                         rm, sync_ptr, err_ptr, max_spin, task, waited, w_ptr,
                                                         tasks_ptr, t_hi, c_lo, nch, pmax, pn, K, BKC, NORM, WAIT,
                                                         SLOTB, UPO, TRACE, VENDOR, PFB, False)
                xd = pack_pairs(xl, xh, DT)
                xd_key = xkey
                # the first task computes with the words too, so every down task of the token sees one input
                xl, xh = unpack_words(xd, DT)
        else:
            xl, xh, s2, rb, rm, waited = _ring_input(x_ptr, g_ptr, eps, k0, cnt_ptr, tgt_ptr, cbase, R, t1, rb, rm,
                                                     sync_ptr, err_ptr, max_spin, task, waited, w_ptr, tasks_ptr,
                                                     t_hi, c_lo, nch, pmax, pn, K, BKC, NORM, WAIT, SLOTB, UPO,
                                                     TRACE, VENDOR, PFB, False)
        dep = ring_wait(rbase, cn, sync_ptr, err_ptr, max_spin, task, NS, VENDOR)
        if GU:   # the gate and up rows of the chunk as ONE [2 BN, BKC / 2] tile: one row reduction, not two
            lo, hi = ring_tile(rbase, gring_ptr, cta, cn, 0, ne, dep, 2 * BN, BKC, NS, SLOTB, DT, VENDOR, SIZES)
            accg += tl.sum(lo * xl[None, :] + hi * xh[None, :], axis=1)
        else:
            lo, hi = ring_tile(rbase, gring_ptr, cta, cn, 0, ne, dep, BN, BKC, NS, SLOTB, DT, VENDOR, SIZES)
            acc += tl.sum(lo * xl[None, :] + hi * xh[None, :], axis=1)
        cn += 1
    if GU:
        acc, acc2 = tl.split(tl.trans(tl.reshape(accg, [2, BN])))
    if NORM:
        if MULTI:
            r = 1.0 / tl.sqrt(tl.sum(ssv, axis=0) / K + eps)
            acc = acc * r
            acc2 = acc2 * r
    return acc, acc2, waited, rb, rm, cn, pn, xc_l, xc_h, xc_key, xd, xd_key


@triton.jit
def _load_after_wait(ptrs, VENDOR: tl.constexpr):
    """fp32 loads that must stay below a wait_counters in a pipelined loop: on NVIDIA an inline-asm load
    (Triton's pipeliner would turn a tl.load into a copy issued chunks ahead, pulling the wait with it into
    a stage it cannot predicate); the address already carries the wait's opaque 0."""
    if VENDOR == 1:
        v = tl.inline_asm_elementwise("ld.global.b32 $0, [$1];", "=r,l", [ptrs], dtype=tl.float32,
                                      is_pure=False, pack=1)
    else:
        v = tl.load(ptrs)
    return v


@triton.jit
def _task_epilogue(typ, y, y2, rows, act_ptr, out_off, res_off, bias_ptr, dep, logits_ptr, write_logits,
                   partial_v_ptr, step, pos, seed, inv_temp, best_v, best_i, DT: tl.constexpr,
                   HAS_BIAS: tl.constexpr, V: tl.constexpr, GPOW: tl.constexpr, SAMPLE: tl.constexpr):
    """A GEMV task's output, as the monokernel's per-task branches compute it (y: the rows' dot products with
    the RMSNorm scale applied; y2: gate_up's up rows): qkv (+ bias), o and down (+ residual), gate_up
    (silu(gate) * up; rounded as HF under HF_ROUNDING), lm (logits -> this tile's best candidate). Loads add the
    caller's wait dependency `dep` (pipelined loops: keeps them below the wait)."""
    if typ == 0:       # qkv
        if HAS_BIAS:
            y += tl.load(bias_ptr + dep + rows)
        tl.store(act_ptr + out_off + rows, _rnd(y, DT))
    elif typ == 2:     # o: + residual
        h = tl.load(act_ptr + res_off + dep + rows, cache_modifier=".cg")
        tl.store(act_ptr + out_off + rows, _rnd(h + _rnd(y, DT), DT))
    elif typ == 3:     # gate_up
        gt = _rnd(y, DT)
        tl.store(act_ptr + out_off + rows, _rnd(_rnd(gt / (1.0 + tl.exp(-gt)), DT) * _rnd(y2, DT), DT))
    elif typ == 4:     # down: + residual
        hm = tl.load(act_ptr + res_off + dep + rows, cache_modifier=".cg")
        tl.store(act_ptr + out_off + rows, _rnd(hm + _rnd(y, DT), DT))
    else:              # lm
        lg = _rnd(y, DT)
        if write_logits != 0:
            tl.store(logits_ptr + tl.cast(step, tl.int64) * V + rows, lg)
        if SAMPLE == 2:
            sc = lg * inv_temp
            tl.store(partial_v_ptr + GPOW + rows, sc)
        else:
            sc = gumbel_scores(lg, rows, pos, seed, inv_temp, V, SAMPLE)
        b, bi = tile_best(sc, rows, rows < V)
        take = b > best_v
        best_v = tl.where(take, b, best_v)
        best_i = tl.where(take, bi, best_i)
    return best_v, best_i


@triton.jit
def _gemv_run(ti0, nrun, tasks_ptr, w_ptr, x_ptr, g_ptr, eps, cnt_ptr, tgt_ptr, cb, ncnt, t1, sync_ptr, max_spin,
              act_ptr, out_off, res_off, bias_ptr, logits_ptr, write_logits, partial_v_ptr, step, pos, seed, inv_temp,
              best_v, best_i, fail, TYPE: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              NORM: tl.constexpr, WAIT: tl.constexpr, UPO: tl.constexpr, HAS_BIAS: tl.constexpr, V: tl.constexpr,
              GPOW: tl.constexpr, SAMPLE: tl.constexpr, PIPE: tl.constexpr, VENDOR: tl.constexpr):
    """A run of nrun consecutive tasks of one phase (same type, layer, input and release counter; the task
    table's column 3 holds nrun at the run's first task) as ONE flat loop over its (task, K-chunk) chunks,
    software-pipelined by Triton (num_stages=PIPE): each [BN, BK] weight chunk is copied into shared memory
    PIPE-1 chunks ahead of its use, ACROSS task boundaries, so a CTA's weight stream no longer drains after
    every task (the ~1.4 us fixed cost per task of _gemv; bench/stream_pipelined.py streams at the copy
    limit this way). The run waits once, at its first chunk, for every counter of its input (wait_counters:
    one inline asm, because a Python spin loop would stop the pipelining); the weight copies of the first
    PIPE-1 chunks are already in flight then. x, the residual and the bias are loaded at addresses that add
    the wait's opaque 0, which keeps them below the wait. Each task's epilogue runs at its last chunk.

    Same math as _gemv / _gemv2 with K > BK (x * g chunks, the 1/rms scale on the dot product) and the same
    epilogues as the monokernel's per-task branches. Returns the LM's running best and the first counter
    index that timed out (-1: none)."""
    DT: tl.constexpr = w_ptr.dtype.element_ty
    NK: tl.constexpr = K // BK
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BN], dtype=tl.float32)
    acc2 = tl.zeros([BN], dtype=tl.float32)
    ss = 0.0
    for c in tl.range(0, nrun * NK, num_stages=PIPE):
        j = c // NK
        kc = c - j * NK
        trow = tasks_ptr + (ti0 + j) * 8
        tile = tl.load(trow + 2)
        wp = w_ptr + tl.load(trow + 4).to(tl.int64) * 64 + (rn * K).to(tl.int64)[:, None] + (kc * BK + rk)[None, :]
        wa = tl.load(wp, eviction_policy="evict_first")
        if TYPE == 3:
            wb = tl.load(wp + UPO, eviction_policy="evict_first")
        if WAIT:
            f, dep = wait_counters(cnt_ptr + cb, tgt_ptr + cb, ncnt, t1, max_spin, sync_ptr + S_ABORT,
                                   tl.where(c == 0, 1, 0), VENDOR)
            fail = tl.maximum(fail, f)
        else:
            dep = c * 0
        kk = kc * BK + rk
        x = _load_after_wait(x_ptr + dep + kk, VENDOR)
        if NORM:
            xg = x * tl.load(g_ptr + kk)
            if j == 0:   # the run's tasks share one input: its sum of squares comes from the first task's chunks
                ss += tl.sum(x * x, axis=0)
        else:
            xg = x
        acc = tl.where(kc == 0, 0.0, acc) + tl.sum(wa.to(tl.float32) * xg[None, :], axis=1)
        if TYPE == 3:
            acc2 = tl.where(kc == 0, 0.0, acc2) + tl.sum(wb.to(tl.float32) * xg[None, :], axis=1)
        if kc == NK - 1:
            rows = tile * BN + rn
            r = 1.0
            if NORM:
                r = 1.0 / tl.sqrt(ss / K + eps)
            best_v, best_i = _task_epilogue(TYPE, acc * r, acc2 * r, rows, act_ptr, out_off, res_off, bias_ptr, dep,
                                            logits_ptr, write_logits, partial_v_ptr, step, pos, seed, inv_temp,
                                            best_v, best_i, DT, HAS_BIAS, V, GPOW, SAMPLE)
    return best_v, best_i, fail


@triton.jit
def _gemv_segment(ch0, nch, chunks_ptr, tasks_ptr, w_ptr, act_ptr, aoff_ptr, small_ptr, soff_ptr, eps, cnt_ptr,
                  tgt_ptr, t1, sync_ptr, max_spin, logits_ptr, write_logits, partial_v_ptr, step, pos, seed,
                  inv_temp, best_v, best_i, pend_idx, pend_n, fail, BN: tl.constexpr, BK: tl.constexpr,
                  AW: tl.constexpr, HAS_BIAS: tl.constexpr, V: tl.constexpr, GPOW: tl.constexpr,
                  SAMPLE: tl.constexpr, PIPE: tl.constexpr, VENDOR: tl.constexpr):
    """A flat segment (kog.engine.flat_plan): consecutive GEMV tasks of any phases and layers as ONE loop over
    their [BN, BK] chunks, software-pipelined by Triton (num_stages=PIPE), so the weight copies of the next
    chunks are in flight across task, phase and layer boundaries. Per chunk the table gives the weights, K
    and k0, the counters to wait on, the input vector and its multiplier. At a task's first chunk: the
    deferred release of earlier tasks (when this task releases elsewhere; inline asm: a tl.debug_barrier
    would stop the pipelining), then the wait (wait_counters asm; the release's opaque 0 orders them); x is
    loaded below the wait (_load_after_wait). At its last chunk: the task's epilogue, as in the per-task
    branches. Returns the LM's best, the deferred-release state and the first timed-out counter."""
    DT: tl.constexpr = w_ptr.dtype.element_ty
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BN], dtype=tl.float32)
    acc2 = tl.zeros([BN], dtype=tl.float32)
    ss = 0.0
    for c in tl.range(ch0, ch0 + nch, num_stages=PIPE):
        e = chunks_ptr + c * 8
        w0 = tl.load(e)
        ti = tl.load(e + 1)
        wbase = tl.load(e + 2).to(tl.int64) * 64
        kw = tl.load(e + 3)
        cbw = tl.load(e + 4)
        ncnt = tl.load(e + 5)
        xoff = tl.load(e + 6)
        goff = tl.load(e + 7)
        typ = w0 & 15
        fl = w0 >> 4
        K = (kw & 65535) * 16            # multiples of 16 the compiler can see: 16-byte copies
        k0 = (kw >> 16) * 16
        w = tl.load(w_ptr + wbase + (rn * K).to(tl.int64)[:, None] + (k0 + rk)[None, :],
                    eviction_policy="evict_first")
        first = (fl & 1) != 0
        fdep = c * 0
        if first:
            rel = tl.load(tasks_ptr + ti * 8 + 6)
            if rel != pend_idx:
                fdep = release_counter(cnt_ptr + pend_idx, pend_n, ((pend_n > 0) & (pend_idx >= 0)).to(tl.int32),
                                       VENDOR)
                pend_idx = rel
                pend_n = 0
        f, dep = wait_counters(cnt_ptr + cbw, tgt_ptr + cbw, ncnt, t1, max_spin, sync_ptr + S_ABORT,
                               tl.where((fl & 8) != 0, 1, 0) + fdep, VENDOR)
        fail = tl.maximum(fail, tl.where(f >= 0, cbw + f, -1))      # the counter's index
        # x as ONE [1, BK] load in the weight tile's layout: a 1-D x feeding both the sum of squares and the
        # broadcast got loaded once per layout (3 scalar loads per element). Its address carries the wait's
        # opaque 0, so the pipeliner leaves it below the wait (a plain, vectorized, L1-cached ld.global; the
        # spin's ld.acquire orders it after the producers' release).
        x = tl.zeros([1, BK], dtype=tl.float32)
        if dep == 0:      # always: a load inside an scf.if is no pipelining candidate
            # offsets the compiler sees as multiples of 16 elements (flat_chunks asserts xoff's): 16-byte loads
            x = tl.load((act_ptr + (xoff // 16) * 16 + dep * 16 + k0 + rk)[None, :])
        xg = x * tl.load((small_ptr + goff + k0 + rk)[None, :])
        if (fl & 16) != 0:
            ss = tl.where(first, 0.0, ss) + tl.sum(tl.sum(x * x, axis=1), axis=0)
        part = tl.sum(w.to(tl.float32) * xg, axis=1)
        up = (fl & 4) != 0
        acc = tl.where(first, 0.0, acc) + tl.where(up, 0.0, part)
        acc2 = tl.where(first, 0.0, acc2) + tl.where(up, part, 0.0)
        if (fl & 2) != 0:
            trow = tasks_ptr + ti * 8
            layer = tl.load(trow + 1)
            lrow = layer * AW
            r = 1.0
            if (typ == 0) | (typ == 3) | (typ == 5):     # the RMSNorm scale of the input (K > BK path of _gemv)
                r = 1.0 / tl.sqrt(ss / K + eps)
            # output / residual offsets: qkv -> qkv buffer; o: h -> hmid; gate_up -> act; down: hmid -> next h
            ocol = tl.where(typ == 0, 1, tl.where(typ == 2, 3, tl.where(typ == 3, 4, 5)))
            rcol = tl.where(typ == 2, 0, 3)
            best_v, best_i = _task_epilogue(typ, acc * r, acc2 * r, tl.load(trow + 2) * BN + rn, act_ptr,
                                            tl.load(aoff_ptr + lrow + ocol), tl.load(aoff_ptr + lrow + rcol),
                                            small_ptr + tl.load(soff_ptr + layer * 8, mask=typ == 0, other=0),
                                            dep, logits_ptr,
                                            write_logits, partial_v_ptr, step, pos, seed, inv_temp, best_v, best_i,
                                            DT, HAS_BIAS, V, GPOW, SAMPLE)
            if typ != 5:
                pend_n += 1
    return best_v, best_i, pend_idx, pend_n, fail


@triton.jit
def _record_timeout(sync_ptr, err_ptr, cnt_ptr, tgt_ptr, idx, task, t1):
    """The first CTA whose wait timed out records [1, counter, task, target, value] and raises abort (a wait
    that ended because another CTA aborted records nothing)."""
    record_abort(sync_ptr + S_ABORT, err_ptr, idx, task, tl.load(tgt_ptr + idx) * t1,
                 tl.load(cnt_ptr + idx, volatile=True))


@triton.jit
def _pipe_task(typ, layer, ti, nrun, tasks_ptr, w_ptr, small_ptr, soff_ptr, act_ptr, aoff_ptr, lrow, rpc_ptr,
               fnorm_off, eps, cnt_ptr, tgt_ptr, cb, t1, sync_ptr, max_spin, logits_ptr, write_logits, partial_v_ptr,
               step, pos, seed, inv_temp, best_v, best_i, H: tl.constexpr, I: tl.constexpr, V: tl.constexpr,
               QS: tl.constexpr, BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr,
               BN_DOWN: tl.constexpr, BN_LM: tl.constexpr, BK: tl.constexpr, BK_GU: tl.constexpr,
               WAIT: tl.constexpr, HAS_BIAS: tl.constexpr, GPOW: tl.constexpr, SAMPLE: tl.constexpr,
               PIPE: tl.constexpr, VENDOR: tl.constexpr):
    """The pipelined run of a GEMV phase: its input, norm weight, output and residual buffers and the
    counters it waits on (rows per counter of the input: rpc), the same as the per-task branches'."""
    fail = -1
    if typ == T_QKV:
        R = tl.load(rpc_ptr + 4)
        best_v, best_i, fail = _gemv_run(
            ti, nrun, tasks_ptr, w_ptr, act_ptr + tl.load(aoff_ptr + lrow + 0),
            small_ptr + tl.load(soff_ptr + layer * 8 + 3), eps, cnt_ptr, tgt_ptr, cb, (H - 1) // R + 1, t1, sync_ptr,
            max_spin, act_ptr, tl.load(aoff_ptr + lrow + 1), 0, small_ptr + tl.load(soff_ptr + layer * 8 + 0),
            logits_ptr, write_logits, partial_v_ptr, step, pos, seed, inv_temp, best_v, best_i, fail,
            0, H, BN_QKV, BK, True, WAIT, I * H, HAS_BIAS, V, GPOW, SAMPLE, PIPE, VENDOR)
    elif typ == T_O:
        R = tl.load(rpc_ptr + 1)
        best_v, best_i, fail = _gemv_run(
            ti, nrun, tasks_ptr, w_ptr, act_ptr + tl.load(aoff_ptr + lrow + 2), small_ptr, eps, cnt_ptr, tgt_ptr,
            cb, (QS - 1) // R + 1, t1, sync_ptr, max_spin, act_ptr, tl.load(aoff_ptr + lrow + 3),
            tl.load(aoff_ptr + lrow + 0), small_ptr, logits_ptr, write_logits, partial_v_ptr, step, pos, seed,
            inv_temp, best_v, best_i, fail, 2, QS, BN_O, BK, False, WAIT, I * H, False, V, GPOW, SAMPLE, PIPE,
            VENDOR)
    elif typ == T_GU:
        R = tl.load(rpc_ptr + 2)
        best_v, best_i, fail = _gemv_run(
            ti, nrun, tasks_ptr, w_ptr, act_ptr + tl.load(aoff_ptr + lrow + 3),
            small_ptr + tl.load(soff_ptr + layer * 8 + 4), eps, cnt_ptr, tgt_ptr, cb, (H - 1) // R + 1, t1, sync_ptr,
            max_spin, act_ptr, tl.load(aoff_ptr + lrow + 4), 0, small_ptr, logits_ptr, write_logits, partial_v_ptr,
            step, pos, seed, inv_temp, best_v, best_i, fail, 3, H, BN_GU, BK_GU, True, WAIT, I * H, False, V, GPOW,
            SAMPLE, PIPE, VENDOR)
    elif typ == T_DOWN:
        R = tl.load(rpc_ptr + 3)
        best_v, best_i, fail = _gemv_run(
            ti, nrun, tasks_ptr, w_ptr, act_ptr + tl.load(aoff_ptr + lrow + 4), small_ptr, eps, cnt_ptr, tgt_ptr,
            cb, (I - 1) // R + 1, t1, sync_ptr, max_spin, act_ptr, tl.load(aoff_ptr + lrow + 5),
            tl.load(aoff_ptr + lrow + 3), small_ptr, logits_ptr, write_logits, partial_v_ptr, step, pos, seed,
            inv_temp, best_v, best_i, fail, 4, I, BN_DOWN, BK, False, WAIT, I * H, False, V, GPOW, SAMPLE, PIPE,
            VENDOR)
    else:   # T_LM
        R = tl.load(rpc_ptr + 4)
        best_v, best_i, fail = _gemv_run(
            ti, nrun, tasks_ptr, w_ptr, act_ptr + tl.load(aoff_ptr + lrow + 0), small_ptr + fnorm_off, eps, cnt_ptr,
            tgt_ptr, cb, (H - 1) // R + 1, t1, sync_ptr, max_spin, act_ptr, 0, 0, small_ptr, logits_ptr,
            write_logits, partial_v_ptr, step, pos, seed, inv_temp, best_v, best_i, fail, 5, H, BN_LM, BK, True,
            WAIT, I * H, False, V, GPOW, SAMPLE, PIPE, VENDOR)
    return best_v, best_i, fail


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
    Scores are rounded to the model dtype before scaling, as HF's bf16 q @ k^T then .float() * scale (in
    either numerics mode: one of the roundings the float32-activation default keeps, with q's and p's bf16
    for the tensor-core dots)."""
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
def _qkv_val(ptr, offs, mask, TAG: tl.constexpr):
    """qkv values at offs: the fp32 activation buffer, or (TAG) the tagged buffer's 64-bit words (low half:
    the value's bits, high half: the token tag; _tag_store), read from L2."""
    if TAG:
        w = tl.load(ptr + offs, mask=mask, other=0, cache_modifier=".cg")
        v = (w & 4294967295).to(tl.int32).to(tl.float32, bitcast=True)
    else:
        v = tl.load(ptr + offs, mask=mask, other=0.0, cache_modifier=".cg")
    return v


@triton.jit
def _tag_store(ptr, offs, y, t1):
    """Store fp32 values with the token tag t1 in one aligned 64-bit word each: a reader that sees the tag sees
    the value, so no fence or counter publishes them (the qkv -> attention hand-off). The store is a plain
    st.global.b64 (weak in PTX's model; _tag_wait's polls are volatile): aligned 64-bit stores were never
    seen torn on the H200 (the GPU ring test and the benches check the values), but a strong store
    (st.relaxed.gpu, inline asm on NVIDIA) would make the pairing race-free by the letter of the model."""
    bits = y.to(tl.int32, bitcast=True).to(tl.int64) & 4294967295
    tl.store(ptr + offs, bits | (t1.to(tl.int64) << 32))


@triton.jit
def _split_inputs(qkv_ptr, g, HD: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, QS: tl.constexpr,
                  KVS: tl.constexpr, TAG: tl.constexpr, kv_on=1):
    """An attention split's inputs, read from L2 once they are known ready (their counters waited for, or TAG:
    _tag_wait saw every word tagged): KV head g's G query rows (padded to GP) and their rotate-half partners,
    the new k row and its partner, the new v row (kv_on = 0: not read, zeros; the split holds no new position).
    Why not the words _tag_wait's last poll read: on llama-3.2-1b those values diverged from the reference
    (teacher-forced error 2.5-6.8e-2 against 7.2e-3, varying run to run; H200, 2026-12-02,
    bench/h200/engine_check_attn_inputs_2026-12-02.json) while this reload after the poll is exact. The likely
    cause (not proven): the [HD] k / v rows are held by two warps there, and the poll's reduction checks one
    copy's tag while the other warp may keep an older word. The reload costs one L2 round trip (0.6% on
    llama-3.2-1b)."""
    d = tl.arange(0, HD)
    half: tl.constexpr = HD // 2
    dp = (d + half) % HD                         # rotate_half partner
    gq = tl.arange(0, GP)
    qm = (gq < G)[:, None] & (d >= 0)[None, :]
    qrow = (g * G + gq)[:, None] * HD
    q = _qkv_val(qkv_ptr, qrow + d[None, :], qm, TAG)
    qs = _qkv_val(qkv_ptr, qrow + dp[None, :], qm, TAG)
    kof = QS + g * HD
    km = (d >= 0) & (kv_on != 0)
    k = _qkv_val(qkv_ptr, kof + d, km, TAG)
    ks = _qkv_val(qkv_ptr, kof + dp, km, TAG)
    v = _qkv_val(qkv_ptr, KVS + kof + d, km, TAG)
    return q, qs, k, ks, v


@triton.jit
def _tag_wait(qkvt_ptr, g, t1, sync_ptr, err_ptr, max_spin, task, HD: tl.constexpr, G: tl.constexpr,
              GP: tl.constexpr, QS: tl.constexpr, KVS: tl.constexpr, kv_on=1):
    """Wait (bounded) until KV head g's q rows, k row and v row carry this token's tag t1: the attention
    split's input, polled in the data itself (every word once per poll, from L2). kv_on = 0: the q rows only
    (a split without the new position reads no new k / v). On timeout: record [1, -5, task, t1, tag seen] and
    abort everyone."""
    d = tl.arange(0, HD)
    gq = tl.arange(0, GP)
    qm = (gq < G)[:, None] & (d >= 0)[None, :]
    qo = (g * G + gq)[:, None] * HD + d[None, :]
    ko = QS + g * HD + d
    n = 0
    ab = 0
    lo = t1 * 0
    while (lo < t1) & (n < max_spin) & (ab == 0):
        tq = tl.load(qkvt_ptr + qo, mask=qm, other=0, volatile=True) >> 32
        tk = tl.load(qkvt_ptr + ko, mask=(d >= 0) & (kv_on != 0), other=t1.to(tl.int64) << 32, volatile=True) >> 32
        tv = tl.load(qkvt_ptr + KVS + ko, mask=(d >= 0) & (kv_on != 0), other=t1.to(tl.int64) << 32,
                     volatile=True) >> 32
        tq = tl.where(qm, tq, t1)
        lo = tl.minimum(tl.min(tl.min(tq, axis=1), axis=0), tl.minimum(tl.min(tk, axis=0), tl.min(tv, axis=0)))
        lo = lo.to(tl.int32)
        n += 1
        if n % 64 == 0:
            ab = tl.load(sync_ptr + S_ABORT, volatile=True)
    if lo < t1:
        if ab == 0:
            record_abort(sync_ptr + S_ABORT, err_ptr, -5, task, t1, lo)


@triton.jit
def _attn_split(q, qs, k, ks, v, cos, sin, part_ptr, kbase, vbase, kb0, vb0, p0, qn_ptr, kn_ptr, g, split, pos,
                eps, sm_scale, S, HD: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, BT: tl.constexpr,
                QK_NORM: tl.constexpr, BSP: tl.constexpr = 0):
    """One split of KV head g's attention: its G query heads (padded to GP >= 16 rows for tl.dot) over cache
    positions [p0, p0 + BSP) that precede pos, plus the new position pos when it falls in this split. Writes
    the split's softmax partial (acc, m, l) for the combine. The positions go through tl.dot in tiles of BT
    (EngineConfig.attn_tile; BSP = 0: one tile). Everything that does not depend on this token's q/k/v was
    loaded by the caller before it waited for them: kb0/vb0 (the first tile's K/V), cos/sin (RoPE at pos);
    q, qs, k, ks, v are _split_inputs' values. Under HF_ROUNDING, RoPE and q/k norm round
    to the model dtype as HF's do."""
    SPAN: tl.constexpr = BSP if BSP > 0 else BT
    DT: tl.constexpr = kbase.dtype.element_ty
    d = tl.arange(0, HD)
    half: tl.constexpr = HD // 2
    dp = (d + half) % HD                         # rotate_half partner
    sgn = tl.where(d < half, -1.0, 1.0)
    gq = tl.arange(0, GP)
    if QK_NORM:
        rq = 1.0 / tl.sqrt(tl.sum(q * q, axis=1) / HD + eps)
        q = _rnd(_rnd(q * rq[:, None], DT) * tl.load(qn_ptr + d)[None, :], DT)
        qs = _rnd(_rnd(qs * rq[:, None], DT) * tl.load(qn_ptr + dp)[None, :], DT)
    q = _rnd(_rnd(q * cos[None, :], DT) + _rnd(sgn[None, :] * qs * sin[None, :], DT), DT)
    m_i = tl.full([GP], float("-inf"), tl.float32)
    l_i = tl.zeros([GP], dtype=tl.float32)
    acc = tl.zeros([GP, HD], dtype=tl.float32)
    if (pos >= p0) & (pos < p0 + SPAN):
        # this split holds the new position: its k/v enter from registers and go to the cache for later tokens
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
    for t0 in range(BT, SPAN, BT):      # attn_tile: the split's later tiles (none when SPAN == BT)
        # loaded in turn (loading the next during the current one spilled: 255 registers)
        if p0 + t0 < pos:
            kb, vb = _cache_block(kbase, vbase, p0 + t0, pos, HD, BT)
            m_i, l_i, acc = _attn_block(q.to(DT), kb, vb, p0 + t0, pos, m_i, l_i, acc, sm_scale, BT)
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
def _attn_stamp(atr_ptr, cta, n, cap, t_start, t_wait, t_in, t_split, t_arr, t_end, merged, step, ti):
    """One attention split's sub-steps (Monokernel(attn_stamps=True)): task start, input wait over, q/k/v
    read, split math done (its partials stored), arrival counted, end (after the merge if it merged); 1 + whether
    it merged; step << 40 | task index. An empty split's wait / inputs / math stamps are its start.
    kog.engine.trace.attn_stamps_table reads them."""
    b = atr_ptr + (tl.cast(cta, tl.int64) * cap + n) * 8
    tl.store(b + 0, t_start)
    tl.store(b + 1, t_wait)
    tl.store(b + 2, t_in)
    tl.store(b + 3, t_split)
    tl.store(b + 4, t_arr)
    tl.store(b + 5, t_end)
    tl.store(b + 6, merged.to(tl.int64) + 1)     # 1: a record (clocks read 0 in the interpreter), 2: merged
    tl.store(b + 7, (tl.cast(step, tl.int64) << 40) | tl.cast(ti, tl.int64))


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


# ---- tensor parallelism (TP constexpr): the cross-GPU exchange --------------------------------------------
# tp_ptr: an int64 table per rank (kog.engine.tp_monokernel builds it): [0] rank, [1] first global token id of
# this rank's LM-head rows, [2] the sample flag's index, then four blocks of NR peer addresses (data_ptr()s,
# turned into pointers in-kernel): receive buffers, flags, sample scores, sample tokens. One table argument
# instead of 4*G pointer arguments keeps the signature independent of G (and the single-GPU kernel, which
# gets tp_ptr=None, a constexpr, has exactly its old parameter list).
TPX_RECV: tl.constexpr = tl.constexpr(8)
FLAG_STRIDE: tl.constexpr = tl.constexpr(32)     # int32 per flag (kog.engine.tp_plan.FLAG_STRIDE)
T_XPUSH: tl.constexpr = tl.constexpr(7)
T_XRED: tl.constexpr = tl.constexpr(8)


@triton.jit
def _peer_ptr(tp_ptr, block, peer, NR: tl.constexpr, DTYPE: tl.constexpr):
    """Address `peer` of table block `block` (0 recv, 1 flags, 2 sample scores, 3 sample tokens)."""
    a = tl.load(tp_ptr + TPX_RECV + block * NR + peer)
    return a.to(tl.pointer_type(DTYPE))


@triton.jit
def _spin_flag(flag_ptr, target, sync_ptr, err_ptr, max_spin, what, task, VENDOR: tl.constexpr):
    """_spin_until for a flag that PEER GPUs bump: system-scope acquire polls, pairing with the producers'
    system-scope release over NVLink."""
    _spin_until(flag_ptr, target, sync_ptr, err_ptr, max_spin, what, task, VENDOR, True)


@triton.jit
def _tp_task(typ, layer, chunk, trow, ti, t1, act_ptr, aoff_ptr, lrow, cnt_ptr, tgt_ptr, cb, rpc_ptr, rb, rm,
             pend_n, sync_ptr, err_ptr, max_spin, w_ptr, tasks_ptr, t_hi, tp_ptr, t_start, H: tl.constexpr,
             L: tl.constexpr, DT: tl.constexpr, UPO: tl.constexpr, PFB: tl.constexpr, TRACE: tl.constexpr,
             VENDOR: tl.constexpr, NR: tl.constexpr, XR: tl.constexpr):
    """XPUSH / XRED of one exchange chunk (kog.engine.tp_plan). Task row: type, layer, chunk, point
    (0 after O, 1 after down), flag index, 0, local counter it releases, first counter it waits on.

    xpush: wait for this rank's partial rows of the chunk, store them into every rank's
           recv[layer, point, rank, rows] (peer stores over NVLink; our own slot is a local store), then bump
           each rank's chunk flag with a system-scope release.
    xred:  wait (system-scope acquire) until the chunk's flag counts NR arrivals for this token and for the
           residual rows, sum the NR partials in rank order 0..NR-1 in float32, add the residual, round to the
           model dtype once (kog.engine.tp.TPReference), store the new hidden rows; published by the caller's
           deferred release like any tile."""
    waited = tl.zeros([], dtype=tl.int64)
    pt = tl.load(trow + 3)
    f = tl.load(trow + 4)
    rank = tl.load(tp_ptr + 0).to(tl.int32)
    rows = chunk * XR + tl.arange(0, XR)
    slot = (layer * 2 + pt) * NR
    if typ == T_XPUSH:
        rb, rm = _wait_rows(cnt_ptr, tgt_ptr, cb, tl.load(rpc_ptr + 5 + pt), chunk * XR, (chunk + 1) * XR, t1,
                            rb, rm, sync_ptr, err_ptr, max_spin, ti, w_ptr, tasks_ptr, t_hi, UPO, PFB, VENDOR)
        if TRACE:
            waited = global_time_ns(VENDOR) - t_start
        x = tl.load(act_ptr + tl.load(aoff_ptr + lrow + 5 + pt) + rows, cache_modifier=".cg")
        for p in tl.static_range(NR):
            dst = _peer_ptr(tp_ptr, 0, p, NR, tl.float32) + tl.cast(slot + rank, tl.int64) * H
            tl.store(dst + rows, x)
        tl.debug_barrier()    # every thread's stores happen-before the releases below
        for p in tl.static_range(NR):
            fl = _peer_ptr(tp_ptr, 1, p, NR, tl.int32) + tl.cast(f, tl.int64) * FLAG_STRIDE
            tl.atomic_add(fl, 1, sem="release", scope="sys")
    elif typ == T_XRED:
        fl = _peer_ptr(tp_ptr, 1, rank, NR, tl.int32) + tl.cast(f, tl.int64) * FLAG_STRIDE
        _spin_flag(fl, t1 * NR, sync_ptr, err_ptr, max_spin, -16 - f, ti, VENDOR)
        # the residual: the layer's input rows (point 0) or hmid (point 1)
        rb, rm = _wait_rows(cnt_ptr, tgt_ptr, cb, tl.load(rpc_ptr + 4 - 2 * pt), chunk * XR, (chunk + 1) * XR, t1,
                            rb, rm, sync_ptr, err_ptr, max_spin, ti, w_ptr, tasks_ptr, t_hi, UPO, PFB, VENDOR)
        if TRACE:
            waited = global_time_ns(VENDOR) - t_start
        recv = _peer_ptr(tp_ptr, 0, rank, NR, tl.float32) + tl.cast(slot, tl.int64) * H
        acc = tl.load(recv + rows, cache_modifier=".cg")
        for p in tl.static_range(1, NR):
            acc += tl.load(recv + p * H + rows, cache_modifier=".cg")
        h = tl.load(act_ptr + tl.load(aoff_ptr + lrow + 3 * pt) + rows, cache_modifier=".cg")
        tl.store(act_ptr + tl.load(aoff_ptr + lrow + 3 + 4 * pt) + rows, _rnd(h + acc, DT))
        pend_n += 1
    return waited, rb, rm, pend_n


@triton.jit
def _tp_pick(b, tok, step, t1, tp_ptr, sync_ptr, err_ptr, max_spin, NR: tl.constexpr, VENDOR: tl.constexpr):
    """Vocab-parallel sampling across ranks (run by the last CTA of a token): push this rank's best
    (score, global id) into every rank's slot [token parity, rank], bump every rank's sample flag, wait for
    all NR candidates, and take the max, ties to the lowest id (= kog.engine.tp.vocab_parallel_pick)."""
    rank = tl.load(tp_ptr + 0).to(tl.int32)
    sf = tl.load(tp_ptr + 2).to(tl.int32)
    par = (step % 2) * NR
    for p in tl.static_range(NR):
        tl.store(_peer_ptr(tp_ptr, 2, p, NR, tl.float32) + par + rank, b)
        tl.store(_peer_ptr(tp_ptr, 3, p, NR, tl.int32) + par + rank, tok)
    tl.debug_barrier()
    for p in tl.static_range(NR):
        tl.atomic_add(_peer_ptr(tp_ptr, 1, p, NR, tl.int32) + tl.cast(sf, tl.int64) * FLAG_STRIDE, 1,
                      sem="release", scope="sys")
    fl = _peer_ptr(tp_ptr, 1, rank, NR, tl.int32) + tl.cast(sf, tl.int64) * FLAG_STRIDE
    _spin_flag(fl, t1 * NR, sync_ptr, err_ptr, max_spin, -16 - sf, -1, VENDOR)
    rr = tl.arange(0, NR)
    sv = tl.load(_peer_ptr(tp_ptr, 2, rank, NR, tl.float32) + par + rr, cache_modifier=".cg")
    si = tl.load(_peer_ptr(tp_ptr, 3, rank, NR, tl.int32) + par + rr, cache_modifier=".cg")
    best = tl.max(sv, axis=0)
    return tl.min(tl.where(sv == best, si, 2147483647), axis=0)


# Run parameters and plan-derived sizes are never specialized: Triton would otherwise compile a new variant
# whenever one of them crosses "== 1" or "% 16 == 0" (a 512-token run after an 8-token warm-up; two plans
# whose counter counts differ), which costs seconds per launch and defeats kogtune's precompile.
@triton.jit(do_not_specialize=["attn_S", "n_eos", "write_logits", "dummy_base", "use_smid", "trace_tokens",
                               "trace_cap", "pos0", "n_tokens", "max_seq", "window", "force", "seed", "top_k",
                               "max_spin", "bar_per_tok"])
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
    MODE: tl.constexpr, SAMPLE: tl.constexpr,
    TRACE: tl.constexpr, VENDOR: tl.constexpr, FILTER_ITERS: tl.constexpr,
    PF_DIST: tl.constexpr, PFB: tl.constexpr, ROWPF: tl.constexpr, PIPE: tl.constexpr,
    # tensor parallelism (kog.engine.tp_monokernel): off by default, and then the kernel is the single-GPU one
    TP: tl.constexpr = False, NR: tl.constexpr = 1, XR: tl.constexpr = 1, VR: tl.constexpr = 0,
    tp_ptr=None,
    # flat pipelined segments (EngineConfig.flat_loop; kog.engine.flat_plan): off by default
    FLAT: tl.constexpr = False, chunks_ptr=None,
    # EngineConfig.tp_compat: O and down reduced as TPC tensor-parallel ranks reduce them (1: off)
    TPC: tl.constexpr = 1,
    # the weight ring (EngineConfig.weight_ring; kog.engine.ring): RING slots of SLOTB bytes; off by default
    RING: tl.constexpr = 0, SLOTB: tl.constexpr = 0, ring_lo_ptr=None, gring_ptr=None,
    RING_SIZES: tl.constexpr = False, ring_sz_ptr=None,
    # the ring's chunk width per phase (kog.engine.ring.kernel_chunk_cols: a slot's worth of the phase's rows)
    BKC_QKV: tl.constexpr = 0, BKC_O: tl.constexpr = 0, BKC_GU: tl.constexpr = 0, BKC_DOWN: tl.constexpr = 0,
    BKC_LM: tl.constexpr = 0, BKC_X: tl.constexpr = 0,
    # qkv handed to attention as token-tagged 64-bit words (qkvt_ptr: [L, qkv rows] int64), not via counters
    TAGQKV: tl.constexpr = False, qkvt_ptr=None,
    # EngineConfig.row_prefetch 2 (with the ring): the compact task rows (kog.engine.ring.compact_rows) read in
    # blocks into shared memory (grow_ptr: the interpreter's global stand-in)
    rows4_ptr=None, grow_ptr=None,
    # EngineConfig.attn_tile > 0: BT is the attention's tl.dot tile (attn_tile) and BS the cache positions per
    # split (attn_block), which a split walks tile by tile; 0: a split is one tile of BT positions
    BS: tl.constexpr = 0,
    # Monokernel(attn_stamps=True) on a traced launch: each attention split of the first trace_tokens tokens
    # records its sub-steps (_attn_stamp) in atr_ptr [grid, cap, 8]
    ATRACE: tl.constexpr = False, atr_ptr=None, atr_cap=0,
):
    QS: tl.constexpr = (NKV * G) * HD
    KVS: tl.constexpr = NKV * HD
    WAIT: tl.constexpr = MODE == 1
    DT: tl.constexpr = w_ptr.dtype.element_ty
    BK_GU: tl.constexpr = BK // 2 if BK >= 128 else BK   # gate+up: two tiles, same registers as one
    AW: tl.constexpr = 7 if TP else 5                      # columns of the activation-offset table
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
        _spin_until(sync_ptr + S_SLOT, nprog, sync_ptr, err_ptr, max_spin, -3, -1, VENDOR)
        sms = tl.load(smid_tab_ptr + rs, mask=rs < nprog, other=2147483647, cache_modifier=".cg")
        cta = tl.sum(((sms < sm) | ((sms == sm) & (rs < pid))).to(tl.int32), axis=0)
    t_lo = tl.load(cta_start_ptr + cta)
    t_hi = tl.load(cta_start_ptr + cta + 1)
    kc_layer = NKV * max_seq * HD
    R_QKV = tl.load(rpc_ptr + 0)
    tr = 0
    stop = 0
    if RING > 0:
        # the ring is the last RING_BYTES of the launch's dynamic shared memory (the launcher adds them to
        # Triton's own); chunk cursors count from the launch's start; w_ptr holds the weights packed as
        # this CTA's chunks in consumption order (kog.engine.ring)
        RING_BYTES: tl.constexpr = 1024 + RING * SLOTB
        rbase = smem_base(VENDOR) + dyn_smem_size(VENDOR) - RING_BYTES
        ring_init(rbase, RING, VENDOR)
        c_lo = tl.load(ring_lo_ptr + cta)
        nch = tl.load(ring_lo_ptr + cta + 1) - c_lo
        pmax = n_tokens * nch
        cn = nch * 0         # chunks consumed (an int32 tensor: loop-carried)
        pn = ring_fill(w_ptr, c_lo, nch, pmax, rbase, gring_ptr, cta, cn, cn, ring_sz_ptr, RING, SLOTB, RING_SIZES,
                       VENDOR, PF_DIST)
    ROWSM: tl.constexpr = (ROWPF == 2) and (RING > 0)
    # O's input (the attention output) rides the ring's input cache when its one chunk is as wide as the cache
    XRAW_O: tl.constexpr = (RING > 0) and (BKC_O == BKC_X) and (QS <= BKC_O)
    # down's plain input cached in registers as model-dtype words where its one chunk spans the intermediate
    XW_DOWN: tl.constexpr = (RING > 0) and (I <= BKC_DOWN) and (TP == 0) and XCACHE_DOWN
    SPLIT: tl.constexpr = BS if BS > 0 else BT             # positions per attention split
    if ROWPF == 1:
        # the row of the task after the current one is loaded while the current one runs (its L1/L2 latency
        # was part of the ~450 ns gap between tasks): r_* hold the next task's row
        r_typ, r_layer, r_tile, r_woff, r_rel, r_cb = _task_row(tasks_ptr, tl.maximum(tl.minimum(t_lo, t_hi - 1), 0))
    if RING > 0:
        # the ring's normed-input cache (_gemv_ring): x pairs of the last RMS-normed input, keyed by the input's
        # offset + token << 32 (xtok); -1: nothing cached yet
        xc_l = tl.zeros([BKC_X // 2], dtype=tl.float32)
        xc_h = tl.zeros([BKC_X // 2], dtype=tl.float32)
        xc_key = tl.full([], -1, tl.int64)
        # down's input cache (_gemv_ring's XW): words of two model-dtype values, keyed like xc_key
        if XW_DOWN:
            xd = tl.zeros([BKC_DOWN // 2], dtype=tl.int32)
        else:
            xd = tl.zeros([2], dtype=tl.int32)
        xd_key = tl.full([], -1, tl.int64)
    if ATRACE:
        atr_n = 0        # attention records written by this CTA
    for step in range(0, n_tokens):
        t1 = step + 1
        pos = pos0 + step
        xtok = t1.to(tl.int64) * 4294967296
        # this token's input embedding is ready, unless generation stopped at EOS (then no token comes)
        if stop == 0:
            if PFB > 0:
                if tl.load(sync_ptr + S_TOK, volatile=True) < step:   # blocked on the sampled token
                    if RING > 0:
                        ring_prefetch_ahead(w_ptr, c_lo, nch, pmax, pn, PFB, SLOTB, VENDOR)
                    else:
                        _prefetch_tasks(w_ptr, tasks_ptr, t_lo, tl.minimum(t_lo + PFB, t_hi), I * H, VENDOR)
            _spin_until(sync_ptr + S_TOK, step, sync_ptr, err_ptr, max_spin, -1, -1, VENDOR)
            stop = tl.load(sync_ptr + S_STOP, volatile=True)
        if stop == 0:
            best_v = float("-inf")
            best_i = 0
            rb = -1          # wait cache: counters rb + 0..rm known ready for this token
            rm = -1
            pend_idx = -1    # deferred release: pend_n finished tiles not yet published on counter pend_idx
            pend_n = 0
            fail = -1        # pipelined runs: first timed-out counter (-1: none)
            if ROWSM:
                # the token's first block of rows into row buffer 0 (every thread read the last token's rows
                # before the CTA barrier that ended it); the block-start barrier of task 0 publishes it
                rows_store(rbase, grow_ptr, cta, 0, rows_load(rows4_ptr, t_lo, t_hi, True), VENDOR)
            for ti in range(t_lo, t_hi):
                # task row: type, layer, tile, barrier#, weight offset (lo, hi), release counter, wait base
                trow = tasks_ptr + ti * 8
                if ROWSM:
                    # rows from shared memory: at a block's first task, a CTA barrier (every thread is done
                    # with the buffer the next block goes to, and the stores of this block are visible),
                    # then the next block's load, stored after this task (its latency hidden by the task)
                    j = ti - t_lo
                    blk0 = (j % ROW_BLOCK) == 0
                    if blk0:
                        tl.debug_barrier()
                    nxt = rows_load(rows4_ptr, ti + ROW_BLOCK, t_hi, blk0)
                    typ, layer, tile, rel, cb, early = row_read(rbase, grow_ptr, cta, j, VENDOR)
                    w_off = tl.zeros([], dtype=tl.int64)     # the ring reads no weight offset
                elif ROWPF == 1:
                    early = 0
                    typ, layer, tile, w_off, rel, cb = r_typ, r_layer, r_tile, r_woff, r_rel, r_cb
                    tn = ti + 1
                    tn = tl.where(tn < t_hi, tn, t_lo)     # after the last task: the next token's first
                    r_typ, r_layer, r_tile, r_woff, r_rel, r_cb = _task_row(tasks_ptr, tn)
                else:
                    early = 0
                    typ, layer, tile, w_off, rel, cb = _task_row(tasks_ptr, ti)
                dtyp = typ       # the type the per-task branches below dispatch on
                rec = 1          # whether this task gets a trace record
                nrun = 1
                if PIPE > 0:
                    # pipelined GEMV runs / flat segments: the first task runs them all (column 3 = how many);
                    # the others only skip (column 3 = 0). Attention and barriers take the per-task branches.
                    if (typ != T_ATTN) & (typ <= T_LM):
                        dtyp = T_NONE
                        nrun = tl.load(trow + 3)
                        rec = (nrun > 0).to(tl.int32)
                do_flush = rel != pend_idx
                if FLAT:         # a flat segment releases inside its loop (task by task, in order)
                    do_flush = do_flush & (dtyp != T_NONE)
                if do_flush:
                    _flush(cnt_ptr, pend_idx, pend_n)
                    pend_idx = rel
                    pend_n = 0
                if (PF_DIST > 0) & (RING == 0):   # always-on L2 prefetch of the task PF_DIST ahead (the ring
                    if ti + PF_DIST < t_hi:          # prefetches chunks instead: ring_fill)
                        _prefetch_tasks(w_ptr, tasks_ptr, ti + PF_DIST, ti + PF_DIST + 1, I * H, VENDOR)
                if TRACE:
                    t_start = global_time_ns(VENDOR)
                else:
                    t_start = tl.zeros([], dtype=tl.int64)
                waited = tl.zeros([], dtype=tl.int64)
                lrow = layer * AW
                if FLAT:
                    if (dtyp == T_NONE) & (nrun > 0):
                        best_v, best_i, pend_idx, pend_n, fail = _gemv_segment(
                            tl.load(trow + 5), tl.load(trow + 4), chunks_ptr, tasks_ptr, w_ptr, act_ptr, aoff_ptr,
                            small_ptr, soff_ptr, eps, cnt_ptr, tgt_ptr, t1, sync_ptr, max_spin, logits_ptr,
                            write_logits, partial_v_ptr, step, pos, seed, inv_temp, best_v, best_i, pend_idx, pend_n,
                            fail, BN_QKV, BK, AW, HAS_BIAS, V, GPOW, SAMPLE, PIPE, VENDOR)
                        if fail >= 0:
                            _record_timeout(sync_ptr, err_ptr, cnt_ptr, tgt_ptr, fail, ti, t1)
                elif PIPE > 0:
                    if dtyp == T_NONE:
                        if nrun > 0:
                            best_v, best_i, fail = _pipe_task(typ, layer, ti, nrun, tasks_ptr, w_ptr, small_ptr,
                                                              soff_ptr, act_ptr, aoff_ptr, lrow, rpc_ptr, fnorm_off,
                                                              eps, cnt_ptr, tgt_ptr, cb, t1, sync_ptr, max_spin,
                                                              logits_ptr, write_logits, partial_v_ptr, step, pos,
                                                              seed, inv_temp, best_v, best_i, H, I, V, QS, BN_QKV,
                                                              BN_O, BN_GU, BN_DOWN, BN_LM, BK, BK_GU, WAIT, HAS_BIAS,
                                                              GPOW, SAMPLE, PIPE, VENDOR)
                            pend_n += nrun
                            if fail >= 0:
                                _record_timeout(sync_ptr, err_ptr, cnt_ptr, tgt_ptr, cb + fail, ti, t1)
                if dtyp == T_QKV:
                    rows = tile * BN_QKV + tl.arange(0, BN_QKV)
                    # layer 0 reads the embedding row, released through S_TOK: its wait base is a block of
                    # always-ready dummy counters
                    if RING > 0:
                        acc, acc2, waited, rb, rm, cn, pn, xc_l, xc_h, xc_key, xd, xd_key = _gemv_ring(
                            rbase, gring_ptr, cta, cn, pn, w_ptr, c_lo, nch, pmax,
                            act_ptr + tl.load(aoff_ptr + lrow + 0), small_ptr + tl.load(soff_ptr + layer * 8 + 3), eps,
                            cnt_ptr, tgt_ptr, cb, tl.load(rpc_ptr + 4), t1, rb, rm, sync_ptr, err_ptr, max_spin, ti,
                            tasks_ptr, t_hi, H, BN_QKV, BKC_QKV, True, False, WAIT, RING, SLOTB, I * H, TRACE, VENDOR,
                            ring_sz_ptr, RING_SIZES, PF_DIST,
                            xc_l, xc_h, xc_key, tl.load(aoff_ptr + lrow + 0) + xtok, PFB, xd=xd, xd_key=xd_key)
                    else:
                        acc, waited, rb, rm = _gemv(w_ptr, w_off, act_ptr + tl.load(aoff_ptr + lrow + 0),
                                                    small_ptr + tl.load(soff_ptr + layer * 8 + 3), eps, cnt_ptr,
                                                    tgt_ptr, cb, tl.load(rpc_ptr + 4), t1, rb, rm, sync_ptr, err_ptr,
                                                    max_spin, ti, tasks_ptr, t_hi, H, BN_QKV, BK, True, WAIT, I * H,
                                                    PFB, TRACE, VENDOR)
                    y = acc
                    if HAS_BIAS:
                        y += tl.load(small_ptr + tl.load(soff_ptr + layer * 8 + 0) + rows)
                    if TAGQKV:   # tagged words: attention polls the data itself; no counter, no release
                        _tag_store(qkvt_ptr + layer * (QS + 2 * KVS), rows, _rnd(y, DT), t1)
                    else:
                        tl.store(act_ptr + tl.load(aoff_ptr + lrow + 1) + rows, _rnd(y, DT))
                        pend_n += 1
                elif dtyp == T_ATTN:
                    # one split of one KV head; the last split to arrive merges the partials and publishes
                    g = tile // attn_S
                    split = tile % attn_S
                    kbase = cache_ptr + tl.cast(layer, tl.int64) * 2 * kc_layer + tl.cast(g, tl.int64) * max_seq * HD
                    p_lo = 0
                    if window > 0:
                        p_lo = tl.maximum(pos - window + 1, 0)
                    p0 = p_lo + split * SPLIT
                    if ATRACE:       # an empty split (p0 > pos) keeps these: no wait, no inputs, no math
                        a_wait = t_start
                        a_in = t_start
                        a_split = t_start
                    if p0 <= pos:
                        # only the split that holds the new position reads this token's k and v; the others
                        # wait for q alone, which the qkv phase produces first (its tiles are dealt in row
                        # order, q's rows first), so they overlap the phase's last k / v tiles
                        has_new = ((pos >= p0) & (pos < p0 + SPLIT)).to(tl.int32)
                        # before the wait: all that does not depend on this token's q/k/v
                        kb0, vb0 = _cache_block(kbase, kbase + kc_layer, p0, pos, HD, BT)
                        if ATTN_L2PF and (VENDOR == 1):
                            # the split's later tiles are loaded in turn after the wait (registers); ask the L2
                            # for them now, so each costs an L2 round trip there, not an HBM one
                            for t0 in tl.static_range(BT, SPLIT, BT):
                                if p0 + t0 < pos:
                                    nb = (tl.minimum(pos - p0 - t0, BT) * HD
                                          * (kbase.dtype.element_ty.primitive_bitwidth // 8)).to(tl.int32)
                                    ring_prefetch_l2(kbase + (p0 + t0) * HD, nb, VENDOR)
                                    ring_prefetch_l2(kbase + kc_layer + (p0 + t0) * HD, nb, VENDOR)
                        dh = tl.arange(0, HD)
                        cs = tl.load(cos_ptr + pos * HD + dh)
                        sn = tl.load(sin_ptr + pos * HD + dh)
                        if TAGQKV:   # qkv as token-tagged words: the wait polls them
                            qkv_in = qkvt_ptr + layer * (QS + 2 * KVS)
                            if WAIT:
                                if (PFB > 0) & (RING > 0):   # the attention hop streams no weights: ask the L2
                                    ring_prefetch_ahead(w_ptr, c_lo, nch, pmax, pn, PFB, SLOTB, VENDOR)
                                _tag_wait(qkv_in, g, t1, sync_ptr, err_ptr, max_spin, ti, HD, G, GP, QS, KVS,
                                          has_new)
                        else:
                            qkv_in = act_ptr + tl.load(aoff_ptr + lrow + 1)
                            if WAIT:
                                rb, rm = _wait_rows(cnt_ptr, tgt_ptr, cb, R_QKV, g * G * HD, (g + 1) * G * HD, t1,
                                                    rb, rm, sync_ptr, err_ptr, max_spin, ti, w_ptr, tasks_ptr, t_hi,
                                                    I * H, PFB, VENDOR)
                                if has_new != 0:
                                    rb, rm = _wait_rows(cnt_ptr, tgt_ptr, cb, R_QKV, QS + g * HD, QS + (g + 1) * HD,
                                                        t1, rb, rm, sync_ptr, err_ptr, max_spin, ti, w_ptr, tasks_ptr,
                                                        t_hi, I * H, PFB, VENDOR)
                                    rb, rm = _wait_rows(cnt_ptr, tgt_ptr, cb, R_QKV, QS + KVS + g * HD,
                                                        QS + KVS + (g + 1) * HD, t1, rb, rm, sync_ptr, err_ptr,
                                                        max_spin, ti, w_ptr, tasks_ptr, t_hi, I * H, PFB, VENDOR)
                        if ATRACE:
                            a_wait = global_time_ns(VENDOR)
                        q, qs, kn, ksn, vn = _split_inputs(qkv_in, g, HD, G, GP, QS, KVS, TAGQKV, has_new)
                        if ATRACE:
                            a_in = global_time_after(tl.sum(tl.sum(q, axis=1), axis=0).to(tl.int32, bitcast=True),
                                                     VENDOR)
                        if WAIT:
                            if TRACE:
                                waited = global_time_ns(VENDOR) - t_start
                        _attn_split(q, qs, kn, ksn, vn, cs, sn, part_ptr, kbase, kbase + kc_layer, kb0, vb0, p0,
                                    small_ptr + tl.load(soff_ptr + layer * 8 + 1),
                                    small_ptr + tl.load(soff_ptr + layer * 8 + 2), g, split, pos, eps, sm_scale,
                                    attn_S, HD, G, GP, BT, QK_NORM, SPLIT)
                        if ATRACE:
                            a_split = global_time_ns(VENDOR)
                    tl.debug_barrier()
                    # one arrival counter per (layer, KV head): a split with no cached positions yet (p0 > pos)
                    # skips the qkv wait and arrives at once, possibly before the previous layer's splits of
                    # this head have all arrived; on a counter shared by the layers that early arrival made
                    # the previous layer's real last split miss its turn (no merge, no release: deadlock)
                    old = tl.atomic_add(sync_ptr + S_ARR + layer * NKV + g, 1, sem="acq_rel", scope="gpu")
                    if ATRACE:
                        a_arr = global_time_after(old, VENDOR)
                    if old == (step + 1) * attn_S - 1:
                        n_act = tl.minimum((pos - p_lo) // SPLIT + 1, attn_S)
                        _attn_combine(part_ptr, act_ptr + tl.load(aoff_ptr + lrow + 2), g, n_act, attn_S, HD, G, GP,
                                      GH, SP, DT)
                        pend_n += 1
                    if ATRACE:
                        if (step < trace_tokens) & (atr_n < atr_cap):
                            _attn_stamp(atr_ptr, cta, atr_n, atr_cap, t_start, a_wait, a_in, a_split, a_arr,
                                        global_time_ns(VENDOR), old == (step + 1) * attn_S - 1, step, ti)
                            atr_n += 1
                elif dtyp == T_O:
                    rows = tile * BN_O + tl.arange(0, BN_O)
                    # the residual before the input wait where the plan proves it ready (plan.early_residual)
                    h = tl.load(act_ptr + tl.load(aoff_ptr + lrow + 0) + rows, mask=(rows >= 0) & (early != 0),
                                other=0.0, cache_modifier=".cg")
                    if RING > 0:
                        acc, acc2, waited, rb, rm, cn, pn, xc_l, xc_h, xc_key, xd, xd_key = _gemv_ring(
                            rbase, gring_ptr, cta, cn, pn, w_ptr, c_lo, nch, pmax,
                            act_ptr + tl.load(aoff_ptr + lrow + 2), small_ptr, eps, cnt_ptr, tgt_ptr, cb,
                            tl.load(rpc_ptr + 1), t1, rb, rm, sync_ptr, err_ptr, max_spin, ti, tasks_ptr, t_hi, QS,
                            BN_O, BKC_O, False, False, WAIT, RING, SLOTB, I * H, TRACE, VENDOR, ring_sz_ptr,
                            RING_SIZES, PF_DIST,
                            xc_l, xc_h, xc_key, tl.load(aoff_ptr + lrow + 2) + xtok, PFB, XRAW_O, xd, xd_key)
                    else:
                        acc, waited, rb, rm = _gemv_rank_sum(w_ptr, w_off, act_ptr + tl.load(aoff_ptr + lrow + 2),
                                                             small_ptr, eps, cnt_ptr, tgt_ptr, cb, tl.load(rpc_ptr + 1),
                                                             t1, rb, rm, sync_ptr, err_ptr, max_spin, ti, tasks_ptr,
                                                             t_hi, QS, BN_O, BK, WAIT, I * H, PFB, TRACE, VENDOR, TPC)
                    if TP:   # a partial sum of the hidden rows: the exchange adds the ranks' partials
                        tl.store(act_ptr + tl.load(aoff_ptr + lrow + 5) + rows, _rounded_sum(acc, DT, TPC))
                    else:
                        if early == 0:
                            h = tl.load(act_ptr + tl.load(aoff_ptr + lrow + 0) + rows, cache_modifier=".cg")
                        tl.store(act_ptr + tl.load(aoff_ptr + lrow + 3) + rows,
                                 _rnd(h + _rounded_sum(acc, DT, TPC), DT))
                    pend_n += 1
                elif dtyp == T_GU:
                    rows = tile * BN_GU + tl.arange(0, BN_GU)
                    if RING > 0:
                        ag, au, waited, rb, rm, cn, pn, xc_l, xc_h, xc_key, xd, xd_key = _gemv_ring(
                            rbase, gring_ptr, cta, cn, pn, w_ptr, c_lo, nch, pmax,
                            act_ptr + tl.load(aoff_ptr + lrow + 3), small_ptr + tl.load(soff_ptr + layer * 8 + 4), eps,
                            cnt_ptr, tgt_ptr, cb, tl.load(rpc_ptr + 2), t1, rb, rm, sync_ptr, err_ptr, max_spin, ti,
                            tasks_ptr, t_hi, H, BN_GU, BKC_GU, True, True, WAIT, RING, SLOTB, I * H, TRACE, VENDOR,
                            ring_sz_ptr, RING_SIZES, PF_DIST,
                            xc_l, xc_h, xc_key, tl.load(aoff_ptr + lrow + 3) + xtok, PFB, xd=xd, xd_key=xd_key)
                    else:
                        ag, au, waited, rb, rm = _gemv2(w_ptr, w_off, w_off + I * H,
                                                        act_ptr + tl.load(aoff_ptr + lrow + 3),
                                                        small_ptr + tl.load(soff_ptr + layer * 8 + 4), eps, cnt_ptr,
                                                        tgt_ptr, cb, tl.load(rpc_ptr + 2), t1, rb, rm, sync_ptr,
                                                        err_ptr, max_spin, ti, tasks_ptr, t_hi, H, BN_GU, BK_GU, WAIT,
                                                        I * H, PFB, TRACE, VENDOR)
                    gt = _rnd(ag, DT)
                    y = _rnd(_rnd(gt / (1.0 + tl.exp(-gt)), DT) * _rnd(au, DT), DT)   # silu(g) * u (HF: in bf16)
                    tl.store(act_ptr + tl.load(aoff_ptr + lrow + 4) + rows, y)
                    pend_n += 1
                elif dtyp == T_DOWN:
                    rows = tile * BN_DOWN + tl.arange(0, BN_DOWN)
                    hm = tl.load(act_ptr + tl.load(aoff_ptr + lrow + 3) + rows, mask=(rows >= 0) & (early != 0),
                                 other=0.0, cache_modifier=".cg")
                    if RING > 0:
                        acc, acc2, waited, rb, rm, cn, pn, xc_l, xc_h, xc_key, xd, xd_key = _gemv_ring(
                            rbase, gring_ptr, cta, cn, pn, w_ptr, c_lo, nch, pmax,
                            act_ptr + tl.load(aoff_ptr + lrow + 4), small_ptr, eps, cnt_ptr, tgt_ptr, cb,
                            tl.load(rpc_ptr + 3), t1, rb, rm, sync_ptr, err_ptr, max_spin, ti, tasks_ptr, t_hi, I,
                            BN_DOWN, BKC_DOWN, False, False, WAIT, RING, SLOTB, I * H, TRACE, VENDOR, ring_sz_ptr,
                            RING_SIZES, PF_DIST,
                            xc_l, xc_h, xc_key, tl.load(aoff_ptr + lrow + 4) + xtok, PFB, xd=xd,
                            xd_key=xd_key, XW=XW_DOWN)
                    else:
                        acc, waited, rb, rm = _gemv_rank_sum(w_ptr, w_off, act_ptr + tl.load(aoff_ptr + lrow + 4),
                                                             small_ptr, eps, cnt_ptr, tgt_ptr, cb, tl.load(rpc_ptr + 3),
                                                             t1, rb, rm, sync_ptr, err_ptr, max_spin, ti, tasks_ptr,
                                                             t_hi, I, BN_DOWN, BK, WAIT, I * H, PFB, TRACE, VENDOR, TPC)
                    if TP:
                        tl.store(act_ptr + tl.load(aoff_ptr + lrow + 6) + rows, _rounded_sum(acc, DT, TPC))
                    else:
                        if early == 0:
                            hm = tl.load(act_ptr + tl.load(aoff_ptr + lrow + 3) + rows, cache_modifier=".cg")
                        tl.store(act_ptr + tl.load(aoff_ptr + lrow + 5) + rows,
                                 _rnd(hm + _rounded_sum(acc, DT, TPC), DT))
                    pend_n += 1
                elif dtyp == T_LM:
                    rows = tile * BN_LM + tl.arange(0, BN_LM)
                    if RING > 0:
                        acc, acc2, waited, rb, rm, cn, pn, xc_l, xc_h, xc_key, xd, xd_key = _gemv_ring(
                            rbase, gring_ptr, cta, cn, pn, w_ptr, c_lo, nch, pmax,
                            act_ptr + tl.load(aoff_ptr + lrow + 0), small_ptr + fnorm_off, eps, cnt_ptr, tgt_ptr, cb,
                            tl.load(rpc_ptr + 4), t1, rb, rm, sync_ptr, err_ptr, max_spin, ti, tasks_ptr, t_hi, H,
                            BN_LM, BKC_LM, True, False, WAIT, RING, SLOTB, I * H, TRACE, VENDOR, ring_sz_ptr,
                            RING_SIZES, PF_DIST,
                            xc_l, xc_h, xc_key, tl.load(aoff_ptr + lrow + 0) + xtok, PFB, xd=xd, xd_key=xd_key)
                    else:
                        acc, waited, rb, rm = _gemv(w_ptr, w_off, act_ptr + tl.load(aoff_ptr + lrow + 0),
                                                    small_ptr + fnorm_off, eps, cnt_ptr,
                                                    tgt_ptr, cb, tl.load(rpc_ptr + 4), t1, rb, rm, sync_ptr, err_ptr,
                                                    max_spin, ti, tasks_ptr, t_hi, H, BN_LM, BK, True, WAIT, I * H,
                                                    PFB, TRACE, VENDOR)
                    lg = _rnd(acc, DT)                            # HF_ROUNDING: logits in the model dtype, as HF
                    if write_logits != 0:
                        tl.store(logits_ptr + tl.cast(step, tl.int64) * V + rows, lg)
                    if SAMPLE == 2:
                        sc = lg * inv_temp
                        tl.store(partial_v_ptr + GPOW + rows, sc)   # scaled logits for the filter passes
                    elif TP:     # vocab parallel: scores and picks are keyed by the global token id
                        gid = tl.load(tp_ptr + 1).to(tl.int32) + rows
                        sc = gumbel_scores(lg, gid, pos, seed, inv_temp, VR, SAMPLE)
                    else:
                        sc = gumbel_scores(lg, rows, pos, seed, inv_temp, V, SAMPLE)
                    if TP:
                        b, bi = tile_best(sc, gid, gid < VR)
                    else:
                        b, bi = tile_best(sc, rows, rows < V)
                    take = b > best_v
                    best_v = tl.where(take, b, best_v)
                    best_i = tl.where(take, bi, best_i)
                elif TP:   # the cross-GPU exchange (targeted mode only: a TP plan has no barriers)
                    waited, rb, rm, pend_n = _tp_task(typ, layer, tile, trow, ti, t1, act_ptr, aoff_ptr, lrow,
                                                      cnt_ptr, tgt_ptr, cb, rpc_ptr, rb, rm, pend_n, sync_ptr,
                                                      err_ptr, max_spin, w_ptr, tasks_ptr, t_hi, tp_ptr, t_start,
                                                      H, L, DT, I * H, PFB, TRACE, VENDOR, NR, XR)
                elif dtyp == T_BAR:  # grid mode's global barrier after a phase
                    tl.debug_barrier()
                    tl.atomic_add(sync_ptr + S_BAR, 1, sem="release", scope="gpu")
                    if ROWSM:
                        nb = step * bar_per_tok + tile + 1    # compact rows carry the barrier number as tile
                    else:
                        nb = step * bar_per_tok + tl.load(trow + 3) + 1
                    if PFB > 0:
                        if tl.load(sync_ptr + S_BAR, volatile=True) < nb * nprog:
                            if RING > 0:
                                ring_prefetch_ahead(w_ptr, c_lo, nch, pmax, pn, PFB, SLOTB, VENDOR)
                            else:
                                _prefetch_tasks(w_ptr, tasks_ptr, ti + 1, tl.minimum(ti + 1 + PFB, t_hi), I * H,
                                                VENDOR)
                    _spin_until(sync_ptr + S_BAR, nb * nprog, sync_ptr, err_ptr, max_spin, -2, ti, VENDOR)
                    if TRACE:
                        waited = global_time_ns(VENDOR) - t_start
                if TRACE:
                    if (step < trace_tokens) & (tr < trace_cap) & (rec != 0):
                        _trace(trace_ptr, cta, tr, trace_cap, t_start, waited, ti, step, VENDOR)
                        tr += 1
                if ROWSM:
                    if blk0:
                        rows_store(rbase, grow_ptr, cta, (j // ROW_BLOCK + 1) % 2, nxt, VENDOR)
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
                if TP:    # every rank's best to every rank; all take the same max (ties: lowest id)
                    tok = _tp_pick(b, tok, step, t1, tp_ptr, sync_ptr, err_ptr, max_spin, NR, VENDOR)
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
                # the next token's input: h[0] = embedding row of tok, in 512-wide pieces whatever block_k is (a
                # block_k-wide piece held 32 registers a thread at block_k 4096, live beside the input cache:
                # sheared-llama-2.7b's other phases then spilled and slowed, H200)
                EMB: tl.constexpr = 512
                rh = tl.arange(0, EMB)
                for k0 in range(0, H, EMB):
                    e = tl.load(embed_ptr + tl.cast(tok, tl.int64) * H + k0 + rh, mask=k0 + rh < H, other=0.0)
                    tl.store(act_ptr + k0 + rh, e.to(tl.float32), mask=k0 + rh < H)
                tl.debug_barrier()
                tl.atomic_xchg(sync_ptr + S_TOK, t1, sem="release", scope="gpu")
    if RING > 0:
        ring_drain(rbase, cn, pn, sync_ptr, err_ptr, max_spin, RING, VENDOR)
