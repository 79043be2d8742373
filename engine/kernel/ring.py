"""The weight ring, executed: each CTA streams its weights through shared-memory slots that one thread fills
with bulk copies ahead of the tasks that read them, across task, phase, layer and token boundaries.

kog.engine.ring plans it (which chunk goes where, the packed weights); this file runs it. The producer cursor
`pn` and the consumer cursor `cn` count chunks since the launch began; chunk n lives in slot n % slots and
completes the (n // slots)-th phase of that slot's mbarrier. The consumer waits on the mbarrier and reads the
words out of shared memory; before each refill a CTA barrier proves every thread is done with the slot.

The task rows travel the same way: a CTA loads ROW_BLOCK rows in one coalesced load, one block ahead, into the
mbarriers' region, and each task reads its row from shared memory (a row read from global memory right before
its task left the load's L2 latency between every two tasks).

NVIDIA sm_90 only (cp.async.bulk + mbarrier, kernel/vendor.py). Under TRITON_INTERPRET=1 the ring and the row
blocks are emulated in global memory (gring, grow: same cursors, same slots, plain copies), so the CPU tests
check the plan and the cursor arithmetic.
"""
from collections import namedtuple

import triton
import triton.language as tl

from kog.engine.kernel.names import E_RING, ROW_AREA, ROW_BLOCK, ROW_WORDS, RING_BAR_BYTES
from kog.engine.kernel.sync import record_abort
from kog.engine.kernel.vendor import (dyn_smem_size, ld_shared_b32, mbar_init, mbar_init_fence, mbar_wait,
                                      ring_copy, smem_base, st_shared_b32)

# a CTA's ring: its shared-memory base, its first chunk in the packed weights, chunks per token, the launch's
# last chunk (the producer stops there)
RingSpan = namedtuple("RingSpan", "base lo n end")
# chunks consumed and requested since the launch began
RingCursor = namedtuple("RingCursor", "cn pn")


@triton.jit
def ring_open(pa, cta, n_tokens, C):
    """Set up this CTA's ring: the last RING_BAR_BYTES + RING slots of the launch's dynamic shared memory (the
    launcher adds them after Triton's own), one mbarrier per slot (thread 0), made visible to the copy engine
    and to every thread. Returns (RingSpan, RingCursor) with nothing consumed and nothing yet requested."""
    rbase = smem_base(C.VENDOR) + dyn_smem_size(C.VENDOR) - (RING_BAR_BYTES + C.RING * C.SLOTB)
    for s in tl.static_range(C.RING):
        mbar_init(rbase + s * 8, C.VENDOR)
    mbar_init_fence(C.VENDOR)
    tl.debug_barrier()
    lo = tl.load(pa.ring_lo + cta)
    n = tl.load(pa.ring_lo + cta + 1) - lo
    cn = n * 0         # an int32 tensor: loop-carried
    return RingSpan(rbase, lo, n, n_tokens * n), RingCursor(cn, cn)


@triton.jit
def _slot_addr(rs, slot, SLOTB: tl.constexpr):
    return rs.base + RING_BAR_BYTES + slot * SLOTB


@triton.jit
def ring_fill(rs, rc, w, pa, cta, C):
    """Request chunks until RING are outstanding beyond the consumer or the launch's last chunk is requested;
    returns the cursor. Chunk n is CTA-local chunk n % rs.n of the packed weights (one slot-sized block;
    RING_SIZES: it moves ring_sz[chunk] bytes, the tight packing's short last K steps). Callers have consumed
    chunks < cn completely: the CTA barrier first makes every thread's reads of those slots happen-before
    their refill."""
    SLOTE: tl.constexpr = C.SLOTB // 2
    pn = rc.pn
    tl.debug_barrier()
    while (pn < rc.cn + C.RING) & (pn < rs.end):
        src = w + (rs.lo + pn % rs.n).to(tl.int64) * SLOTE
        slot = pn % C.RING
        if C.VENDOR == 1:
            if C.RING_SIZES:
                nb = tl.load(pa.ring_sz + rs.lo + pn % rs.n)
            else:
                nb = C.SLOTB
            ring_copy(_slot_addr(rs, slot, C.SLOTB), src, nb, rs.base + slot * 8, C.VENDOR)
        else:                # interpreter: the same slot in a global-memory ring, copied at once
            e = tl.arange(0, SLOTE)
            tl.store(pa.gring + (cta * C.RING + slot) * SLOTE + e, tl.load(src + e))
        pn += 1
    return RingCursor(rc.cn, pn)


@triton.jit
def ring_wait(rs, cn, sy, task, C):
    """Wait until chunk cn has landed; an opaque 0 for the slot's reads. A copy that never lands (it cannot,
    short of a fault) is recorded as E_RING and aborts the kernel instead of hanging it."""
    # bounded on the clock, as the counter waits: a try_wait may suspend the thread for a while before it
    # reports "not yet", so a count of polls says little about the time waited
    f, dep = mbar_wait(rs.base + (cn % C.RING) * 8, (cn // C.RING) & 1, sy.timeout_ns, C.VENDOR)
    if f != 0:
        record_abort(sy, E_RING, task, cn, 0)
    return dep


@triton.jit
def pack_pairs(lo, hi, DT: tl.constexpr):
    """float32 pairs (lo: elements 2j, hi: 2j + 1) as one 32-bit word each, both rounded to the model dtype
    (bf16 / fp16), low half = lo: the layout of a ring chunk's words, half the registers of the pairs."""
    if DT == tl.bfloat16:
        wl = lo.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 65535
        wh = hi.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32)
    else:
        wl = lo.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 65535
        wh = hi.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
    return wl | (wh << 16)


@triton.jit
def unpack_words(w, DT: tl.constexpr):
    """Words of two model-dtype values (a ring chunk's, or pack_pairs') as float32 pairs (lo, hi)."""
    if DT == tl.bfloat16:
        lo = (w << 16).to(tl.float32, bitcast=True)
        hi = (w & -65536).to(tl.float32, bitcast=True)
    else:
        lo = (w & 65535).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (w >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def ring_tile(rs, cn, pa, cta, ne, dep, BN: tl.constexpr, BKC: tl.constexpr, DT: tl.constexpr, C):
    """The BN rows of chunk cn's slot as float32 (even, odd) column pairs [BN, BKC // 2]: word j of a row holds
    elements 2j (low half) and 2j + 1 (high half). Columns >= ne (a short last chunk) read 0."""
    rn = tl.arange(0, BN)
    rj = tl.arange(0, BKC // 2)
    ok = (2 * rj < ne)[None, :]      # (the packed chunk's padding is zeros; masked anyway: NaN * 0 is NaN)
    slot = cn % C.RING
    if C.VENDOR == 1:
        if C.RING_SIZES:        # the tight packing: a short last K step has row pitch ne
            a = _slot_addr(rs, slot, C.SLOTB) + dep + (rn * (ne * 2))[:, None] + (rj * 4)[None, :]
        else:
            a = _slot_addr(rs, slot, C.SLOTB) + dep + (rn * (BKC * 2))[:, None] + (rj * 4)[None, :]
        lo, hi = unpack_words(ld_shared_b32(a, C.VENDOR), DT)
        lo = tl.where(ok, lo, 0.0)
        hi = tl.where(ok, hi, 0.0)
    else:
        if C.RING_SIZES:
            b = pa.gring + (cta * C.RING + slot) * (C.SLOTB // 2) + (rn * ne)[:, None] + (2 * rj)[None, :]
        else:
            b = pa.gring + (cta * C.RING + slot) * (C.SLOTB // 2) + (rn * BKC)[:, None] + (2 * rj)[None, :]
        lo = tl.load(b, mask=ok, other=0.0).to(tl.float32)
        hi = tl.load(b + 1, mask=ok, other=0.0).to(tl.float32)
    return lo, hi


@triton.jit
def ring_close(rs, rc, sy, C):
    """Before the CTA exits: wait for every requested chunk nobody consumed (EOS, or the launch's end), so no
    copy is still writing into the shared memory of a finished CTA."""
    for c in range(rc.cn, rc.pn):
        ring_wait(rs, c, sy, -1, C)


# ---- task rows through shared memory ------------------------------------------------------------------------

@triton.jit
def rows_load(rows, r0, t_hi, on):
    """Task rows [r0, r0 + ROW_BLOCK) (those below t_hi, and only if `on`), as ROW_BLOCK * ROW_WORDS words."""
    e = tl.arange(0, ROW_BLOCK * ROW_WORDS)
    r = r0 + e // ROW_WORDS
    return tl.load(rows + r * ROW_WORDS + e % ROW_WORDS, mask=(r < t_hi) & on, other=0)


@triton.jit
def rows_store(rs, pa, cta, buf, v, VENDOR: tl.constexpr):
    """Row block v (rows_load) into row buffer `buf` (0 or 1)."""
    e = tl.arange(0, ROW_BLOCK * ROW_WORDS)
    if VENDOR == 1:
        st_shared_b32(rs.base + ROW_AREA + buf * (ROW_BLOCK * ROW_WORDS * 4) + e * 4, v, VENDOR)
    else:
        tl.store(pa.grow + (cta * 2 + buf) * (ROW_BLOCK * ROW_WORDS) + e, v)


@triton.jit
def row_read(rs, pa, cta, j, VENDOR: tl.constexpr):
    """The four words of the CTA's j-th task row of the token, from the row buffers."""
    i = ((j // ROW_BLOCK) % 2) * ROW_BLOCK + j % ROW_BLOCK
    if VENDOR == 1:
        a = rs.base + ROW_AREA + i * (ROW_WORDS * 4)
        w0 = ld_shared_b32(a, VENDOR)
        w1 = ld_shared_b32(a + 4, VENDOR)
        w2 = ld_shared_b32(a + 8, VENDOR)
        w3 = ld_shared_b32(a + 12, VENDOR)
    else:
        b = pa.grow + cta * (2 * ROW_BLOCK * ROW_WORDS) + i * ROW_WORDS
        w0 = tl.load(b)
        w1 = tl.load(b + 1)
        w2 = tl.load(b + 2)
        w3 = tl.load(b + 3)
    return w0, w1, w2, w3
