"""Synchronisation between the CTAs of one launch: bounded waits, readiness counters, tags, barriers.

Targeted mode: a producer stores its tile, and once the CTA moves on to a task that publishes elsewhere it
releases the tiles it finished on their readiness counter (one release increment for a run of tiles:
`Pending`). A consumer issues its weight loads first, then waits (acquire) only on the counters covering the
rows it is about to read, so the HBM stream keeps flowing across phase boundaries. The plan (plan.py) says
which counter each task releases and which buffer it reads; the counter of input row r is
`wait base + r // rows_per_counter`, the rule plan.counters_over states in Python.

qkv reaches attention through tagged words instead (the ring's path): each value travels with its token
number in one 64-bit word, so a reader that sees the tag sees the value, with no fence and no counter.

Every spin is bounded in time (SyncArgs.timeout_ns; EngineConfig.wait_timeout_s): every 64th poll reads the
abort word and a clock (the GPU's global timer; the host's clock in the interpreter), so the first poll that
succeeds costs nothing more, and a wait that can never finish ends in seconds on any platform. A timeout
records err = [1, what, task, target, value] and raises the abort word, which ends every other spin at once:
the kernel finishes (with garbage) and the host raises one clear error naming the counter and the task
(kog.engine.monokernel).
"""
from collections import namedtuple

import triton
import triton.language as tl

from kog.engine.kernel.names import E_BARRIER, E_TAG, S_ABORT, S_BAR
from kog.engine.kernel.vendor import global_time_ns, poll_acquire, wait_clock_ns

# counters base + 0..ready of the buffer at `base` are known ready for this token: a CTA's later tasks of a
# phase skip those waits (and their L2 round trips)
Waits = namedtuple("Waits", "base ready")
# finished tiles not yet published on `counter`
Pending = namedtuple("Pending", "counter n")


@triton.jit
def record_abort(sy, what, task, target, value):
    """The first CTA to time out records [1, what, task, target, value] and raises the abort word; a later one
    (or a wait that ended because another CTA aborted) records nothing."""
    if tl.atomic_cas(sy.sync + S_ABORT, 0, 1) == 0:
        tl.store(sy.err + 0, 1)
        tl.store(sy.err + 1, what)
        tl.store(sy.err + 2, task)
        tl.store(sy.err + 3, target)
        tl.store(sy.err + 4, value)


@triton.jit
def spin_until(ptr, target, sy, what, task, VENDOR: tl.constexpr, SYS: tl.constexpr = False):
    """Wait (bounded) until *ptr >= target with acquire semantics. On timeout: record and abort everyone.

    Every poll is an acquire load (vendor.poll_acquire; SYS for words peer GPUs bump): the one that sees the
    target synchronizes with the producers' release increments, so the data they published (and no stale L1
    copy of it) is what this CTA reads next.

    The first poll goes out before the target is looked at (a target of 0 is met by any count): the target is
    often a table read (wait_rows), an L2 round trip after an earlier acquire invalidated L1, and a branch on
    it held the poll back until it returned."""
    v = poll_acquire(ptr, VENDOR, SYS)
    n = 0
    ab = 0
    t_end = tl.full([], 0, tl.int64)
    while (v < target) & (ab == 0):
        v = poll_acquire(ptr, VENDOR, SYS)
        n, ab, t_end = _count_poll(n, ab, t_end, sy, VENDOR)
    _give_up(v < target, sy, what, task, target, v)


@triton.jit
def _count_poll(n, ab, t_end, sy, VENDOR: tl.constexpr):
    """One more poll of a bounded wait. Every 64th also reads the abort word (another CTA timed out) and the
    clock: the first such read sets the deadline (now + timeout), a later one past it ends the wait (ab = 2)."""
    n += 1
    if n % 64 == 0:
        ab = tl.load(sy.sync + S_ABORT, volatile=True)
        now = wait_clock_ns(VENDOR)
        if t_end == 0:
            t_end = now + sy.timeout_ns
        elif now > t_end:
            ab = 2
    return n, ab, t_end


@triton.jit
def _give_up(short, sy, what, task, target, value):
    """A bounded wait that ended short records why (record_abort keeps only the first CTA's record, so a wait
    that ended because another CTA aborted records nothing)."""
    if short:
        record_abort(sy, what, task, target, value)


@triton.jit
def wait_rows(wc, pa, base, R, r0, r1, t1, sy, task, VENDOR: tl.constexpr):
    """Wait until rows [r0, r1) of the buffer whose counters start at `base` (R rows each) are ready for token
    t1 - 1; `wc` (Waits) skips the counters this CTA already saw ready. Returns the updated Waits."""
    c0 = r0 // R
    c1 = (r1 - 1) // R
    rb = wc.base
    rm = wc.ready
    if base != rb:
        rb = base
        rm = -1
    for c in range(c0, c1 + 1):
        if c > rm:
            tgt = tl.load(pa.target + base + c) * t1
            spin_until(pa.cnt + base + c, tgt, sy, base + c, task, VENDOR)
            if c == rm + 1:
                rm = c
    return Waits(rb, rm)


@triton.jit
def timed_wait_rows(wc, pa, base, R, r0, r1, t1, sy, task, waited, TRACE: tl.constexpr, VENDOR: tl.constexpr):
    """wait_rows, adding the time it blocked to `waited` in an instrumented run."""
    if TRACE:
        w0 = global_time_ns(VENDOR)
    wc = wait_rows(wc, pa, base, R, r0, r1, t1, sy, task, VENDOR)
    if TRACE:
        waited += global_time_ns(VENDOR) - w0
    return wc, waited


@triton.jit
def publish(cnt, pend, STAMP: tl.constexpr, VENDOR: tl.constexpr):
    """Publish finished tiles: every thread's stores happen-before one release increment of pend.n. STAMP
    (traced launches): returns when its CTA barrier ended (0: nothing published), which splits a publish's
    cost between the warps' arrival and the release's fence."""
    t_bar = tl.zeros([], dtype=tl.int64)
    if (pend.n > 0) & (pend.counter >= 0):
        tl.debug_barrier()
        if STAMP:
            t_bar = global_time_ns(VENDOR)
        tl.atomic_add(cnt + pend.counter, pend.n, sem="release", scope="gpu")
    return t_bar


@triton.jit
def publish_before(cnt, pend, release, STAMP: tl.constexpr, VENDOR: tl.constexpr):
    """At a task's start: publish the tiles pending on another counter than the one this task releases
    (a task never waits while holding finished tiles back). Returns the pending tiles and publish's stamp."""
    t_bar = tl.zeros([], dtype=tl.int64)
    if release != pend.counter:
        t_bar = publish(cnt, pend, STAMP, VENDOR)
        pend = Pending(release, 0)
    return pend, t_bar


@triton.jit
def grid_barrier(sy, number, nprog, task, VENDOR: tl.constexpr):
    """Grid mode: the `number`-th barrier of the launch (counted from 1) over all nprog CTAs."""
    tl.debug_barrier()
    tl.atomic_add(sy.sync + S_BAR, 1, sem="release", scope="gpu")
    spin_until(sy.sync + S_BAR, number * nprog, sy, E_BARRIER, task, VENDOR)


# ---- tagged words: qkv -> attention ------------------------------------------------------------------------

@triton.jit
def tag_store(ptr, offs, y, t1):
    """Store fp32 values with the token tag t1 in one aligned 64-bit word each: a reader that sees the tag sees
    the value, so no fence or counter publishes them. The store is a plain st.global.b64 (weak in PTX's
    model; tag_wait's polls are volatile): aligned 64-bit stores were never seen torn on the H200 (the GPU
    ring test and the benches check the values), but a strong store (st.relaxed.gpu, inline asm on NVIDIA)
    would make the pairing race-free by the letter of the model."""
    bits = y.to(tl.int32, bitcast=True).to(tl.int64) & 4294967295
    tl.store(ptr + offs, bits | (t1.to(tl.int64) << 32))


@triton.jit
def tagged_value(ptr, offs, mask, TAG: tl.constexpr):
    """Values at offs: the fp32 activation buffer, or (TAG) the tagged buffer's words (low half: the value's
    bits), read from L2."""
    if TAG:
        w = tl.load(ptr + offs, mask=mask, other=0, cache_modifier=".cg")
        v = (w & 4294967295).to(tl.int32).to(tl.float32, bitcast=True)
    else:
        v = tl.load(ptr + offs, mask=mask, other=0.0, cache_modifier=".cg")
    return v


@triton.jit
def tag_wait(qkvt, g, t1, sy, task, HD: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, QS: tl.constexpr,
             KVS: tl.constexpr, kv_on, VENDOR: tl.constexpr):
    """Wait (bounded) until KV head g's q rows, k row and v row carry this token's tag t1, polling every word
    once per poll from L2. kv_on = 0: the q rows only (a split without the new position reads no new k / v).
    On timeout: record [1, E_TAG, task, t1, lowest tag seen] and abort everyone."""
    d = tl.arange(0, HD)
    gq = tl.arange(0, GP)
    qm = (gq < G)[:, None] & (d >= 0)[None, :]
    qo = (g * G + gq)[:, None] * HD + d[None, :]
    ko = QS + g * HD + d
    n = 0
    ab = 0
    t_end = tl.full([], 0, tl.int64)
    lo = t1 * 0
    while (lo < t1) & (ab == 0):
        tq = tl.load(qkvt + qo, mask=qm, other=0, volatile=True) >> 32
        tk = tl.load(qkvt + ko, mask=(d >= 0) & (kv_on != 0), other=t1.to(tl.int64) << 32, volatile=True) >> 32
        tv = tl.load(qkvt + KVS + ko, mask=(d >= 0) & (kv_on != 0), other=t1.to(tl.int64) << 32,
                     volatile=True) >> 32
        tq = tl.where(qm, tq, t1)
        lo = tl.minimum(tl.min(tl.min(tq, axis=1), axis=0), tl.minimum(tl.min(tk, axis=0), tl.min(tv, axis=0)))
        lo = lo.to(tl.int32)
        n, ab, t_end = _count_poll(n, ab, t_end, sy, VENDOR)
    _give_up(lo < t1, sy, E_TAG, task, t1, lo)
