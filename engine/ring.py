"""The weight ring (EngineConfig.weight_ring = slots): each CTA streams its weights through a ring of shared-
memory slots that one thread fills with bulk copies (cp.async.bulk, the TMA engine) AHEAD of the tasks that
read them, across task, phase, layer and token boundaries.

Why: the weights a CTA will read are known before any token runs (the plan fixes who runs what), only the
activations are not. In the per-task kernel a CTA's loads are in flight only while its current task runs: a
task issues its tile, waits for it, reduces, stores (the per-task drain), and a CTA blocked on a dependency
has at most its next tile in flight (bench/h200/ENGINE_NOTES.md: both cost ~0.4 ms of a 1.08 ms token).
With the ring, `slots` chunks are always requested ahead, without registers (the copies land in shared
memory), so the HBM stream keeps flowing while the CTA reduces, stores, waits for an input or for the next
token. Registers hold a chunk only while it is multiplied.

Planning (Python, here): `ring_chunks` lists, per CTA, the chunks of its GEMV tasks in the order the kernel
consumes them: a chunk is the [bn, bk] slice of a task's row tile at one K step (gate_up: its gate and up
slices together, [2 bn, bk / 2]). Each is two int32: the slice's first weight element / 64, and
type | elements per row << 4 (the last K step of a row may be shorter). Execution (Triton, below): the
producer cursor `pn` and the consumer cursor `cn` count chunks since the launch began; chunk n lives in slot
n % slots and completes the (n // slots)-th phase of that slot's mbarrier. The consumer waits on the mbarrier,
reads the words out of shared memory, and before each refill a CTA barrier proves every thread is done with
the slot being reused.

NVIDIA only (sm_90 cp.async.bulk + mbarrier, kog.engine.vendor). Under TRITON_INTERPRET=1 the ring is
emulated in global memory (same cursors, same slots, plain copies), so the CPU tests check the plan and the
cursor arithmetic. AMD: refused by validate() (no bulk-copy path written; unverified hardware anyway).
"""
from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from kog.engine.plan import T_DOWN, T_GU, T_LM, T_O, T_QKV
from kog.engine.vendor import bulk_copy, bulk_expect, ld_shared_b32, mbar_init, mbar_init_fence, mbar_wait

BAR_BYTES = tl.constexpr(1024)   # the slots' mbarriers (8 bytes each) at the ring's start; slots follow


def chunk_shape(typ: int, *, H: int, I: int, QS: int, block_k: int, bn: dict[int, int]) -> tuple[int, int, int]:
    """(K, columns per chunk, rows per chunk) of a GEMV task type."""
    K = {T_QKV: H, T_O: QS, T_GU: H, T_DOWN: I, T_LM: H}[typ]
    bkc = block_k // 2 if typ == T_GU else block_k
    rows = 2 * bn[typ] if typ == T_GU else bn[typ]
    return K, bkc, rows


def slot_bytes(*, block_k: int, bn: dict[int, int], elem: int = 2) -> int:
    """Bytes of one slot: the largest chunk of any phase (gate_up: gate + up rows at block_k / 2)."""
    return max(max(bn[t] for t in (T_QKV, T_O, T_DOWN, T_LM)) * block_k, bn[T_GU] * block_k) * elem


def ring_bytes(slots: int, *, block_k: int, bn: dict[int, int], elem: int = 2) -> int:
    """Dynamic shared memory the ring adds to a CTA."""
    return BAR_BYTES.value + slots * slot_bytes(block_k=block_k, bn=bn, elem=elem) if slots else 0


def ring_chunks(tasks: np.ndarray, cta_start: np.ndarray, *, H: int, I: int, QS: int, block_k: int,
                bn: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(chunk table [n, 2] int32, per-CTA first chunk [grid + 1] int32) for the monokernel's task table
    `tasks` ([T, 8]: type, layer, tile, aux, weight offset / 64, ...), in each CTA's consumption order."""
    rows, lo = [], [0]
    for c in range(len(cta_start) - 1):
        for ti in range(int(cta_start[c]), int(cta_start[c + 1])):
            typ = int(tasks[ti, 0])
            if typ not in (T_QKV, T_O, T_GU, T_DOWN, T_LM):
                continue
            K, bkc, _ = chunk_shape(typ, H=H, I=I, QS=QS, block_k=block_k, bn=bn)
            w0 = int(tasks[ti, 4]) * 64
            for k0 in range(0, K, bkc):
                assert (w0 + k0) % 64 == 0, "ring chunks start 128-byte aligned (block_k >= 128)"
                rows.append(((w0 + k0) // 64, typ | (min(bkc, K - k0) << 4)))
        lo.append(len(rows))
    tab = np.asarray(rows, dtype=np.int64).reshape(-1, 2)
    assert tab.size == 0 or tab[:, 0].max() < 2 ** 31, "weight offsets / 64 must fit in int32"
    return tab.astype(np.int32), np.asarray(lo, dtype=np.int32)


# ---- execution ---------------------------------------------------------------------------------------------

@triton.jit
def _slot_addr(rbase, slot, SLOTB: tl.constexpr):
    return rbase + BAR_BYTES + slot * SLOTB


@triton.jit
def ring_init(rbase, NS: tl.constexpr, VENDOR: tl.constexpr):
    """One mbarrier per slot (thread 0), made visible to the copy engine and to every thread."""
    for s in tl.static_range(NS):
        mbar_init(rbase + s * 8, VENDOR)
    mbar_init_fence(VENDOR)
    tl.debug_barrier()


@triton.jit
def ring_fill(w_ptr, tab_ptr, c_lo, nch, pmax, rbase, gring_ptr, cta, pn, cn, H: tl.constexpr, I: tl.constexpr,
              QS: tl.constexpr, BN_QKV: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr,
              BN_DOWN: tl.constexpr, BN_LM: tl.constexpr, BK: tl.constexpr, NS: tl.constexpr,
              SLOTB: tl.constexpr, UPO: tl.constexpr, VENDOR: tl.constexpr):
    """Request chunks until NS are outstanding beyond the consumer (cn) or the launch's last chunk (pmax) is
    requested; returns the producer cursor. Callers have consumed chunks < cn completely: the CTA barrier
    first makes every thread's reads of those slots happen-before their refill."""
    tl.debug_barrier()
    while (pn < cn + NS) & (pn < pmax):
        e = tab_ptr + (c_lo + pn % nch) * 2
        src = w_ptr + tl.load(e).to(tl.int64) * 64
        d = tl.load(e + 1)
        typ = d & 15
        ne = d >> 4                                           # elements per row in this chunk
        K = tl.where(typ == 2, QS, tl.where(typ == 4, I, H))
        bnr = tl.where(typ == 0, BN_QKV, tl.where(typ == 2, BN_O, tl.where(typ == 3, BN_GU,
                                                                             tl.where(typ == 4, BN_DOWN, BN_LM))))
        bkc = tl.where(typ == 3, BK // 2, BK)
        parts = tl.where(typ == 3, 2, 1)                      # gate_up: gate rows, then up rows (UPO further)
        slot = pn % NS
        if VENDOR == 1:
            bar = rbase + slot * 8
            dst = _slot_addr(rbase, slot, SLOTB)
            bulk_expect(bar, parts * bnr * ne * 2, VENDOR)
            if bkc == K:     # whole rows: each part's rows are one contiguous span
                for p in range(0, parts):
                    bulk_copy(dst + p * bnr * bkc * 2, src + p * UPO, bnr * K * 2, bar, VENDOR)
            else:
                for r in range(0, parts * bnr):
                    p = r // bnr
                    bulk_copy(dst + r * bkc * 2, src + p * UPO + (r - p * bnr) * K, ne * 2, bar, VENDOR)
        else:                # interpreter: the same slot in a global-memory ring, copied at once
            cols = tl.arange(0, BK)
            dstg = gring_ptr + (cta * NS + slot) * (SLOTB // 2)
            for r in range(0, parts * bnr):
                p = r // bnr
                v = tl.load(src + p * UPO + (r - p * bnr) * K + cols, mask=cols < ne, other=0.0)
                tl.store(dstg + r * bkc + cols, v, mask=cols < ne)
        pn += 1
    return pn


@triton.jit
def ring_wait(rbase, cn, sync_ptr, err_ptr, max_spin, task, NS: tl.constexpr, VENDOR: tl.constexpr):
    """Wait until chunk cn has landed; an opaque 0 for the slot's reads. A copy that never lands (it cannot,
    short of a fault) is recorded as counter -4 and aborts the kernel instead of hanging it."""
    # a copy has no dependency on other CTAs: it lands within microseconds, so the bound is far below the
    # counter waits' (each try_wait may also suspend the thread for a while before it reports "not yet")
    f, dep = mbar_wait(rbase + (cn % NS) * 8, (cn // NS) & 1, tl.minimum(max_spin, 1 << 16), VENDOR)
    if f != 0:
        if tl.atomic_cas(sync_ptr + 0, 0, 1) == 0:
            tl.store(err_ptr + 0, 1)
            tl.store(err_ptr + 1, -4)
            tl.store(err_ptr + 2, task)
            tl.store(err_ptr + 3, cn)
            tl.store(err_ptr + 4, 0)
    return dep


@triton.jit
def ring_tile(rbase, gring_ptr, cta, cn, row0, ne, dep, BN: tl.constexpr, BKC: tl.constexpr, NS: tl.constexpr,
              SLOTB: tl.constexpr, DT: tl.constexpr, VENDOR: tl.constexpr):
    """Rows [row0, row0 + BN) of chunk cn's slot as float32 (even, odd) column pairs [BN, BKC // 2]: word j of
    a row holds elements 2j (low half) and 2j + 1 (high half). Columns >= ne (a short last chunk) read 0."""
    rn = tl.arange(0, BN)
    rj = tl.arange(0, BKC // 2)
    ok = (2 * rj < ne)[None, :]
    slot = cn % NS
    if VENDOR == 1:
        a = _slot_addr(rbase, slot, SLOTB) + dep + ((row0 + rn) * (BKC * 2))[:, None] + (rj * 4)[None, :]
        w = ld_shared_b32(a, VENDOR)
        if DT == tl.bfloat16:
            lo = (w << 16).to(tl.float32, bitcast=True)
            hi = (w & -65536).to(tl.float32, bitcast=True)
        else:
            lo = (w & 65535).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
            hi = (w >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        lo = tl.where(ok, lo, 0.0)
        hi = tl.where(ok, hi, 0.0)
    else:
        b = gring_ptr + (cta * NS + slot) * (SLOTB // 2) + ((row0 + rn) * BKC)[:, None] + (2 * rj)[None, :]
        lo = tl.load(b, mask=ok, other=0.0).to(tl.float32)
        hi = tl.load(b + 1, mask=ok, other=0.0).to(tl.float32)
    return lo, hi


@triton.jit
def ring_drain(rbase, cn, pn, sync_ptr, err_ptr, max_spin, NS: tl.constexpr, VENDOR: tl.constexpr):
    """Before the CTA exits: wait for every requested chunk nobody consumed (EOS, or the launch's end), so no
    copy is still writing into the shared memory of a finished CTA."""
    for c in range(cn, pn):
        ring_wait(rbase, c, sync_ptr, err_ptr, max_spin, -1, NS, VENDOR)
