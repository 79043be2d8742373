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

Planning (Python, here): a chunk is the slice of a task's row tile at one K step (gate_up: its gate and up
slices together), as wide as a slot holds for the phase's rows (chunk_shape: block_k at the largest bn,
gate_up at equal bn block_k / 2; fewer rows, wider chunks, at most the power of two covering K),
zero-padded to one slot. `ring_order` lists, per CTA, its chunks in
the order the kernel consumes them; `pack_ring_weights` writes the weights in exactly that order, so CTA c's
chunk i is ONE contiguous slot-sized block at (lo[c] + i) * slot: one bulk copy per chunk (copies of 1-4 KB
row pieces measured slower: bench/h200/ENGINE_NOTES.md) and no table to read on the way. The streamed
bytes are the checkpoint's, only reordered (a K that is not a multiple of the chunk: its short last step is
packed densely and copied at its own size, from a per-chunk byte table: RING_SIZES). Execution (Triton, below): the
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

from kog.engine.abort import record_abort
from kog.engine.plan import T_BAR, T_DOWN, T_GU, T_LM, T_O, T_QKV
from kog.engine.vendor import (ld_shared_b32, mbar_init, mbar_init_fence, mbar_wait, ring_copy, ring_prefetch_l2,
                               st_shared_b32)

BAR_BYTES = tl.constexpr(1024)   # the slots' mbarriers (8 bytes each) at the ring's start; slots follow
# EngineConfig.row_prefetch = 2: the task rows in shared memory, two blocks of ROW_BLOCK compact rows (16 bytes
# each) in the mbarriers' region from byte ROW_AREA (<= 16 slots use its first 128 bytes)
ROW_BLOCK = tl.constexpr(16)
ROW_AREA = tl.constexpr(512)


def phase_bn(ecfg) -> dict[int, int]:
    """Rows per task of each GEMV task type, from an EngineConfig (the `bn` every function here takes)."""
    return {T_QKV: ecfg.bn_qkv, T_O: ecfg.bn_o, T_GU: ecfg.bn_gate_up, T_DOWN: ecfg.bn_down, T_LM: ecfg.bn_lm}


def launch_smem(triton_shared: int, ring_extra: int) -> int:
    """Dynamic shared memory a ring launch asks for: Triton's own, 1 KiB aligned, then the ring (the kernel
    finds the ring at the end)."""
    return -(-triton_shared // 1024) * 1024 + ring_extra


def _pow2ceil(n: int) -> int:
    return 1 << (int(n) - 1).bit_length()


def chunk_shape(typ: int, *, H: int, I: int, QS: int, block_k: int, bn: dict[int, int]) -> tuple[int, int, int]:
    """(K, columns per chunk, rows per chunk) of a GEMV task type.

    A chunk fills one slot: as many columns as a slot holds for the phase's rows (gate_up: its bn gate rows
    and bn up rows), at most the power of two that covers K. With every bn equal that is block_k (gate_up:
    block_k / 2); a phase with fewer rows gets wider chunks, so fewer rows share each per-chunk row
    reduction (bn_gate_up 4 at bn 8 elsewhere: gate_up's [8, 2048] chunk spans all of a 2048-wide K, one
    chunk per task)."""
    K = {T_QKV: H, T_O: QS, T_GU: H, T_DOWN: I, T_LM: H}[typ]
    rows = 2 * bn[typ] if typ == T_GU else bn[typ]
    bkc = min(slot_elems(block_k=block_k, bn=bn) // rows, _pow2ceil(K))
    return K, bkc, rows


def kernel_chunk_cols(*, H: int, I: int, QS: int, block_k: int, bn: dict[int, int]) -> dict[str, int]:
    """The monokernel's per-phase chunk widths (constexprs BKC_*), as chunk_shape gives them."""
    dims = dict(H=H, I=I, QS=QS, block_k=block_k, bn=bn)
    names = {T_QKV: "BKC_QKV", T_O: "BKC_O", T_GU: "BKC_GU", T_DOWN: "BKC_DOWN", T_LM: "BKC_LM"}
    # BKC_X: the width of the normed-input cache, the chunk of every phase whose one chunk spans its normed
    # input (K = H for qkv, gate_up and the LM head; chunk_shape caps those at the power of two covering H)
    return {**{name: chunk_shape(t, **dims)[1] for t, name in names.items()}, "BKC_X": _pow2ceil(H)}


def slot_elems(*, block_k: int, bn: dict[int, int]) -> int:
    """Elements of one slot (and of one chunk in the packed weights): the largest chunk of any phase."""
    return max(max(bn[t] for t in (T_QKV, T_O, T_DOWN, T_LM)) * block_k, bn[T_GU] * block_k)


def slot_bytes(*, block_k: int, bn: dict[int, int], elem: int = 2) -> int:
    return slot_elems(block_k=block_k, bn=bn) * elem


def ring_bytes(slots: int, *, block_k: int, bn: dict[int, int], elem: int = 2) -> int:
    """Dynamic shared memory the ring adds to a CTA."""
    return BAR_BYTES.value + slots * slot_bytes(block_k=block_k, bn=bn, elem=elem) if slots else 0


def padded_fraction(*, H: int, I: int, QS: int, block_k: int, bn: dict[int, int]) -> float:
    """Share of padding in the ring's whole-step layout: a K that is not a multiple of its chunk width ends
    in a short step (sheared-llama-2.7b at block_k 2048: 2560 columns = 2048 + 512). The launcher then packs
    such steps densely and copies each chunk at its own size (RING_SIZES: a per-chunk byte table, the
    consumer reads short steps with row pitch ne), so no padding is streamed (measured on the H200:
    sheared-llama-2.7b 371.2 vs 325.5 tok/s without the ring, two runs one device call apart;
    bench/h200/ENGINE_NOTES.md, session 6)."""
    real = padded = 0
    for typ in (T_QKV, T_O, T_GU, T_DOWN):
        K, bkc, _ = chunk_shape(typ, H=H, I=I, QS=QS, block_k=block_k, bn=bn)
        real += K
        padded += -(-K // bkc) * bkc
    return 1.0 - real / padded


def _nkc(typ: int, dims: dict, block_k: int, bn: dict[int, int]) -> int:
    K, bkc, _ = chunk_shape(typ, block_k=block_k, bn=bn, **dims)
    return -(-K // bkc)


def natural_bases(num_layers: int, n_tiles: dict[int, int], dims: dict, block_k: int,
                  bn: dict[int, int]) -> dict[tuple[int, int], int]:
    """First natural chunk index of each (layer, type) matrix: layers in order, qkv, o, gate_up, down within
    a layer, then the LM head (layer = num_layers); inside a matrix, tile-major then K step."""
    base, n = {}, 0
    for layer in range(num_layers):
        for typ in (T_QKV, T_O, T_GU, T_DOWN):
            base[(layer, typ)] = n
            n += n_tiles[typ] * _nkc(typ, dims, block_k, bn)
    base[(num_layers, T_LM)] = n
    return base


def _cta_gemv_tasks(tasks: np.ndarray, cta_start: np.ndarray):
    """(cta, type, layer, tile) of every GEMV task, each CTA's in the order it runs them (attention and
    barrier tasks have no chunks)."""
    for c in range(len(cta_start) - 1):
        for ti in range(int(cta_start[c]), int(cta_start[c + 1])):
            typ, layer, tile = (int(x) for x in tasks[ti, :3])
            if typ in (T_QKV, T_O, T_GU, T_DOWN, T_LM):
                yield c, typ, layer, tile


def ring_order(tasks: np.ndarray, cta_start: np.ndarray, *, num_layers: int, n_tiles: dict[int, int],
               H: int, I: int, QS: int, block_k: int, bn: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(natural chunk index of every chunk in consumption order, first chunk of each CTA [grid + 1]) for the
    monokernel's task table `tasks` ([T, >= 3]: type, layer, tile, ...)."""
    dims = dict(H=H, I=I, QS=QS)
    base = natural_bases(num_layers, n_tiles, dims, block_k, bn)
    order = []
    counts = np.zeros(len(cta_start) - 1, dtype=np.int64)
    for c, typ, layer, tile in _cta_gemv_tasks(tasks, cta_start):
        nk = _nkc(typ, dims, block_k, bn)
        order.extend(range(base[(layer, typ)] + tile * nk, base[(layer, typ)] + (tile + 1) * nk))
        counts[c] += nk
    return np.asarray(order, dtype=np.int64), np.concatenate([[0], np.cumsum(counts)])


def _matrix_chunks(w, bn: int, bkc: int, slot: int, up=None, tight: bool = False):
    """[tiles * K steps, slot] chunks of W ([N, K], zero-padded to whole K steps): tile-major, then K step;
    each chunk is the tile's bn rows x bkc columns (then up's, for gate_up), padded to one slot.
    tight: a short last K step (ne = K % bkc columns) is stored as [rows, ne] at the chunk's start, so its
    bulk copy moves only rows * ne elements (the consumer then reads it with row pitch ne)."""
    import torch
    N, K = w.shape
    pad = (-K) % bkc
    mats = [w] if up is None else [w, up]
    parts = []
    for m in mats:
        if pad:
            m = torch.nn.functional.pad(m, (0, pad))
        nk = m.shape[1] // bkc
        parts.append(m.reshape(N // bn, bn, nk, bkc).permute(0, 2, 1, 3))   # [tiles, nk, bn, bkc]
    c = torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]
    T, nk, R, B = c.shape
    if tight and pad:
        ne = B - pad
        flat = c.reshape(T, nk, R * B).clone()
        flat[:, -1] = 0
        flat[:, -1, :R * ne] = c[:, -1, :, :ne].reshape(T, R * ne)
        c = flat
    c = c.reshape(T * nk, -1)
    if c.shape[1] < slot:
        c = torch.nn.functional.pad(c, (0, slot - c.shape[1]))
    return c


def pack_ring_weights(weights, num_layers: int, order: np.ndarray, *, block_k: int, bn: dict[int, int],
                      tight: bool = False):
    """The GEMV weights as consecutive slot-sized chunks in consumption order (ring_order): chunk i of the
    result is natural chunk order[i]. Same bytes as the checkpoint's matrices, reordered (and padded;
    tight: short last K steps stored densely, see _matrix_chunks)."""
    import torch
    slot = slot_elems(block_k=block_k, bn=bn)
    L0 = weights.layer(0)
    dims = dict(H=L0["wqkv"].shape[1], I=L0["w_down"].shape[1], QS=L0["wo"].shape[1], block_k=block_k, bn=bn)
    bkc = {t: chunk_shape(t, **dims)[1] for t in (T_QKV, T_O, T_GU, T_DOWN, T_LM)}
    nat = []
    for layer in range(num_layers):
        L = weights.layer(layer)
        nat.append(_matrix_chunks(L["wqkv"], bn[T_QKV], bkc[T_QKV], slot, tight=tight))
        nat.append(_matrix_chunks(L["wo"], bn[T_O], bkc[T_O], slot, tight=tight))
        nat.append(_matrix_chunks(L["w_gate"], bn[T_GU], bkc[T_GU], slot, up=L["w_up"], tight=tight))
        nat.append(_matrix_chunks(L["w_down"], bn[T_DOWN], bkc[T_DOWN], slot, tight=tight))
    nat.append(_matrix_chunks(weights["lm_head"], bn[T_LM], bkc[T_LM], slot, tight=tight))
    nat = torch.cat(nat, 0)
    idx = torch.as_tensor(order, device=nat.device)
    return nat.index_select(0, idx).reshape(-1)


def ring_chunk_bytes(tasks: np.ndarray, cta_start: np.ndarray, *, H: int, I: int, QS: int, block_k: int,
                     bn: dict[int, int], elem: int = 2) -> np.ndarray:
    """Bytes each chunk's bulk copy moves, in consumption order (ring_order's): rows x columns of the K step
    (a short last step only its ne columns: the tight packing). The kernel reads it when RING_SIZES."""
    dims = dict(H=H, I=I, QS=QS)
    out = []
    for _, typ, _, _ in _cta_gemv_tasks(tasks, cta_start):
        K, bkc, rows = chunk_shape(typ, block_k=block_k, bn=bn, **dims)
        out.extend(rows * min(bkc, K - k0) * elem for k0 in range(0, K, bkc))
    return np.asarray(out, dtype=np.int32)


def compact_rows(tasks: np.ndarray, early: np.ndarray | None = None) -> np.ndarray:
    """The task table ([T, 8]: type, layer, tile, barrier number, weight offset, lines, release counter, wait
    base) as the shared-memory row blocks hold it (row_prefetch 2): [T, 4] int32 = type | early << 7 | layer
    << 8, tile (a barrier task: its barrier number), release counter, wait base. `early` (bool per task,
    kog.engine.plan.early_residual): the task's residual rows may load before its input wait. The ring path
    reads no weight offset."""
    t = np.asarray(tasks, dtype=np.int64)
    out = np.zeros((len(t), 4), dtype=np.int64)
    out[:, 0] = t[:, 0] | (t[:, 1] << 8)
    if early is not None:
        out[:, 0] |= np.asarray(early, dtype=np.int64) << 7
    out[:, 1] = np.where(t[:, 0] == T_BAR, t[:, 3], t[:, 2])
    out[:, 2] = t[:, 6]
    out[:, 3] = t[:, 7]
    return out.astype(np.int32)


# ---- execution ---------------------------------------------------------------------------------------------

# Task rows through shared memory (row_prefetch 2). A row read from global memory right before its task
# left the load's L2 latency between every two tasks: ptxas moves the row into uniform registers at once,
# so even a row loaded one task ahead (row_prefetch 1) stalled there (0.25-0.4 us a task on the H200, ~11% of
# a sheared-llama-2.7b token at 760 tasks a CTA; bench/h200/ENGINE_NOTES.md, session 9). Now a CTA loads
# ROW_BLOCK rows in one coalesced load per block, one block ahead, and each task reads its row from shared
# memory. The interpreter keeps the blocks in global memory (grow_ptr), same indices.

@triton.jit
def rows_load(rows_ptr, r0, t_hi, on):
    """Compact rows [r0, r0 + ROW_BLOCK) (those below t_hi, and only if `on`), as ROW_BLOCK * 4 words."""
    e = tl.arange(0, ROW_BLOCK * 4)
    r = r0 + e // 4
    return tl.load(rows_ptr + r * 4 + e % 4, mask=(r < t_hi) & on, other=0)


@triton.jit
def rows_store(rbase, grow_ptr, cta, buf, v, VENDOR: tl.constexpr):
    """Row block v (rows_load) into row buffer `buf` (0 or 1)."""
    e = tl.arange(0, ROW_BLOCK * 4)
    if VENDOR == 1:
        st_shared_b32(rbase + ROW_AREA + buf * (ROW_BLOCK * 16) + e * 4, v, VENDOR)
    else:
        tl.store(grow_ptr + (cta * 2 + buf) * (ROW_BLOCK * 4) + e, v)


@triton.jit
def row_read(rbase, grow_ptr, cta, j, VENDOR: tl.constexpr):
    """(type, layer, tile, release counter, wait base, early) of the CTA's j-th task of the token (early: its
    residual rows may load before its input wait, compact_rows)."""
    i = ((j // ROW_BLOCK) % 2) * ROW_BLOCK + j % ROW_BLOCK
    if VENDOR == 1:
        a = rbase + ROW_AREA + i * 16
        w0 = ld_shared_b32(a, VENDOR)
        w1 = ld_shared_b32(a + 4, VENDOR)
        w2 = ld_shared_b32(a + 8, VENDOR)
        w3 = ld_shared_b32(a + 12, VENDOR)
    else:
        b = grow_ptr + cta * (2 * ROW_BLOCK * 4) + i * 4
        w0 = tl.load(b)
        w1 = tl.load(b + 1)
        w2 = tl.load(b + 2)
        w3 = tl.load(b + 3)
    return w0 & 127, w0 >> 8, w1, w2, w3, (w0 >> 7) & 1


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
def ring_fill(w_ptr, c_lo, nch, pmax, rbase, gring_ptr, cta, pn, cn, sz_ptr, NS: tl.constexpr,
              SLOTB: tl.constexpr, SIZES: tl.constexpr, VENDOR: tl.constexpr, PF: tl.constexpr = 0):
    """Request chunks until NS are outstanding beyond the consumer (cn) or the launch's last chunk (pmax) is
    requested; returns the producer cursor. Chunk n is CTA-local chunk n % nch of the packed weights (one
    slot-sized block; SIZES: it moves sz_ptr[chunk] bytes, the tight packing's short last K steps).
    PF > 0 (EngineConfig.prefetch with the ring): with each chunk's copy, chunk n + PF is L2-prefetched, so
    HBM keeps working PF chunks beyond the ring while the CTA waits on a dependency (the ring alone holds
    NS chunks, ~6 us of a CTA's share of the stream at 3 x 32 KB).
    Callers have consumed chunks < cn completely: the CTA barrier first makes every thread's reads of those
    slots happen-before their refill."""
    SLOTE: tl.constexpr = SLOTB // 2
    tl.debug_barrier()
    while (pn < cn + NS) & (pn < pmax):
        src = w_ptr + (c_lo + pn % nch).to(tl.int64) * SLOTE
        slot = pn % NS
        if VENDOR == 1:
            if SIZES:
                nb = tl.load(sz_ptr + c_lo + pn % nch)
            else:
                nb = SLOTB
            ring_copy(_slot_addr(rbase, slot, SLOTB), src, nb, rbase + slot * 8, VENDOR)
            if PF > 0:
                if pn + PF < pmax:       # whole slots: a tight short chunk's block is padded to one
                    ring_prefetch_l2(w_ptr + (c_lo + (pn + PF) % nch).to(tl.int64) * SLOTE, SLOTB, VENDOR)
        else:                # interpreter: the same slot in a global-memory ring, copied at once
            e = tl.arange(0, SLOTE)
            tl.store(gring_ptr + (cta * NS + slot) * SLOTE + e, tl.load(src + e))
        pn += 1
    return pn


@triton.jit
def ring_prefetch_ahead(w_ptr, c_lo, nch, pmax, pn, N: tl.constexpr, SLOTB: tl.constexpr, VENDOR: tl.constexpr):
    """L2-prefetch the N chunks beyond the ring's requests (pn .. pn + N - 1, up to the launch's last): called
    while the CTA blocks on a dependency (EngineConfig.blocked_prefetch with the ring), so HBM keeps
    streaming this CTA's next weights during an all-to-all hop, when the ring alone (its NS slots already
    requested) has nothing more to ask for. Whole slots, as ring_fill's PF path prefetches them."""
    SLOTE: tl.constexpr = SLOTB // 2
    for j in tl.static_range(N):
        if pn + j < pmax:
            ring_prefetch_l2(w_ptr + (c_lo + (pn + j) % nch).to(tl.int64) * SLOTE, SLOTB, VENDOR)


@triton.jit
def ring_wait(rbase, cn, sync_ptr, err_ptr, max_spin, task, NS: tl.constexpr, VENDOR: tl.constexpr):
    """Wait until chunk cn has landed; an opaque 0 for the slot's reads. A copy that never lands (it cannot,
    short of a fault) is recorded as counter -4 and aborts the kernel instead of hanging it."""
    # a copy has no dependency on other CTAs: it lands within microseconds, so the bound is far below the
    # counter waits' (each try_wait may also suspend the thread for a while before it reports "not yet")
    f, dep = mbar_wait(rbase + (cn % NS) * 8, (cn // NS) & 1, tl.minimum(max_spin, 1 << 16), VENDOR)
    if f != 0:
        record_abort(sync_ptr, err_ptr, -4, task, cn, 0)
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
def ring_tile(rbase, gring_ptr, cta, cn, row0, ne, dep, BN: tl.constexpr, BKC: tl.constexpr, NS: tl.constexpr,
              SLOTB: tl.constexpr, DT: tl.constexpr, VENDOR: tl.constexpr, SIZES: tl.constexpr = False):
    """Rows [row0, row0 + BN) of chunk cn's slot as float32 (even, odd) column pairs [BN, BKC // 2]: word j of
    a row holds elements 2j (low half) and 2j + 1 (high half). Columns >= ne (a short last chunk) read 0."""
    rn = tl.arange(0, BN)
    rj = tl.arange(0, BKC // 2)
    ok = (2 * rj < ne)[None, :]      # (the packed chunk's padding is zeros; masked anyway: NaN * 0 is NaN)
    slot = cn % NS
    if VENDOR == 1:
        if SIZES:        # the tight packing: a short last K step has row pitch ne
            a = _slot_addr(rbase, slot, SLOTB) + dep + ((row0 + rn) * (ne * 2))[:, None] + (rj * 4)[None, :]
        else:
            a = _slot_addr(rbase, slot, SLOTB) + dep + ((row0 + rn) * (BKC * 2))[:, None] + (rj * 4)[None, :]
        lo, hi = unpack_words(ld_shared_b32(a, VENDOR), DT)
        lo = tl.where(ok, lo, 0.0)
        hi = tl.where(ok, hi, 0.0)
    else:
        if SIZES:
            b = gring_ptr + (cta * NS + slot) * (SLOTB // 2) + ((row0 + rn) * ne)[:, None] + (2 * rj)[None, :]
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
