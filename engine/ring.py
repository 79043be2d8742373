"""The weight ring, planned: which chunk of which matrix each CTA streams, in what order, packed how.

Why a ring: the weights a CTA will read are known before any token runs (the plan fixes who runs what), only
the activations are not. Without it a CTA's loads are in flight only while its current task runs (a task
issues its tile, waits for it, reduces, stores), and a CTA blocked on a dependency has at most its next tile
in flight. With it, `slots` chunks are always requested ahead by bulk copies into shared memory (no
registers), so the HBM stream keeps flowing while the CTA reduces, stores, waits for an input or for the next
token (kernel/ring.py runs it).

A chunk is the slice of a task's row tile at one K step (gate_up: its gate and up slices together), as wide
as a slot holds for the phase's rows (chunk_shape: block_k at the largest bn; fewer rows, wider chunks, at
most the power of two covering K), zero-padded to one slot. `ring_order` lists, per CTA, its chunks in the
order the kernel consumes them; `pack_ring_weights` writes the weights in exactly that order, so CTA c's chunk
i is ONE contiguous slot-sized block at (lo[c] + i) * slot: one bulk copy per chunk and no table to read on
the way. The streamed bytes are the checkpoint's, only reordered; a K that is not a multiple of the chunk ends
in a short step packed densely and copied at its own size (a per-chunk byte table: RING_SIZES).

NVIDIA sm_90 only; the interpreter emulates the slots in global memory. AMD: refused by validate().
"""
from __future__ import annotations

import numpy as np

from kog.engine.layout import GEMV_TYPES, RING_BAR_BYTES, T_DOWN, T_GU, T_LM, T_O, T_QKV


def phase_bn(ecfg) -> dict[int, int]:
    """Rows per task of each GEMV task type, from an EngineConfig (the `bn` every function here takes)."""
    return {T_QKV: ecfg.bn_qkv, T_O: ecfg.bn_o, T_GU: ecfg.bn_gate_up, T_DOWN: ecfg.bn_down, T_LM: ecfg.bn_lm}


def launch_smem(triton_shared: int, ring_extra: int) -> int:
    """Dynamic shared memory a ring launch asks for: Triton's own, 1 KiB aligned, then the ring (the kernel
    finds the ring at the end)."""
    return -(-triton_shared // 1024) * 1024 + ring_extra


def pow2ceil(n: int) -> int:
    """The smallest power of two >= n."""
    return 1 << (int(n) - 1).bit_length()


def phase_k(typ: int, *, H: int, I: int, QS: int) -> int:
    """K of a GEMV task type: the hidden size, except O (the query width) and down (the intermediate size)."""
    return {T_QKV: H, T_O: QS, T_GU: H, T_DOWN: I, T_LM: H}[typ]


def chunk_shape(typ: int, *, H: int, I: int, QS: int, block_k: int, bn: dict[int, int]) -> tuple[int, int, int]:
    """(K, columns per chunk, rows per chunk) of a GEMV task type.

    A chunk fills one slot: as many columns as a slot holds for the phase's rows (gate_up: its bn gate rows
    and bn up rows), at most the power of two that covers K. With every bn equal that is block_k (gate_up:
    block_k / 2); a phase with fewer rows gets wider chunks, so fewer rows share each per-chunk row
    reduction (bn_gate_up 4 at bn 8 elsewhere: gate_up's [8, 2048] chunk spans all of a 2048-wide K, one
    chunk per task)."""
    K = phase_k(typ, H=H, I=I, QS=QS)
    rows = 2 * bn[typ] if typ == T_GU else bn[typ]
    bkc = min(slot_elems(block_k=block_k, bn=bn) // rows, pow2ceil(K))
    return K, bkc, rows


def kernel_chunk_cols(*, H: int, I: int, QS: int, block_k: int, bn: dict[int, int]) -> dict[str, int]:
    """The monokernel's per-phase chunk widths (constexprs BKC_*), as chunk_shape gives them."""
    dims = dict(H=H, I=I, QS=QS, block_k=block_k, bn=bn)
    names = {T_QKV: "BKC_QKV", T_O: "BKC_O", T_GU: "BKC_GU", T_DOWN: "BKC_DOWN", T_LM: "BKC_LM"}
    # BKC_X: the width of the normed-input cache, the chunk of every phase whose one chunk spans its normed
    # input (K = H for qkv, gate_up and the LM head; chunk_shape caps those at the power of two covering H)
    return {**{name: chunk_shape(t, **dims)[1] for t, name in names.items()}, "BKC_X": pow2ceil(H)}


def slot_elems(*, block_k: int, bn: dict[int, int]) -> int:
    """Elements of one slot (and of one chunk in the packed weights): the largest chunk of any phase."""
    return max(max(bn[t] for t in (T_QKV, T_O, T_DOWN, T_LM)) * block_k, bn[T_GU] * block_k)


def slot_bytes(*, block_k: int, bn: dict[int, int], elem: int = 2) -> int:
    return slot_elems(block_k=block_k, bn=bn) * elem


def ring_bytes(slots: int, *, block_k: int, bn: dict[int, int], elem: int = 2) -> int:
    """Dynamic shared memory the ring adds to a CTA."""
    return RING_BAR_BYTES + slots * slot_bytes(block_k=block_k, bn=bn, elem=elem) if slots else 0


def padded_fraction(*, H: int, I: int, QS: int, block_k: int, bn: dict[int, int]) -> float:
    """Share of padding in the ring's whole-step layout: a K that is not a multiple of its chunk width ends
    in a short step (sheared-llama-2.7b at block_k 2048: 2560 columns = 2048 + 512). The launcher then packs
    such steps densely and copies each chunk at its own size (RING_SIZES: a per-chunk byte table, the
    consumer reads short steps with row pitch ne), so no padding is streamed."""
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
            if typ in GEMV_TYPES:
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
    tight: short last K steps stored densely, see _matrix_chunks). Each matrix's chunks go straight to their
    places in one preallocated buffer: beside the checkpoint only the result and one matrix's chunks are
    held (a concatenation of all chunks, then a gather, held three padded copies at once)."""
    import torch
    slot = slot_elems(block_k=block_k, bn=bn)
    L0 = weights.layer(0)
    dims = dict(H=L0["wqkv"].shape[1], I=L0["w_down"].shape[1], QS=L0["wo"].shape[1], block_k=block_k, bn=bn)
    bkc = {t: chunk_shape(t, **dims)[1] for t in (T_QKV, T_O, T_GU, T_DOWN, T_LM)}

    def natural():
        for layer in range(num_layers):
            L = weights.layer(layer)
            yield _matrix_chunks(L["wqkv"], bn[T_QKV], bkc[T_QKV], slot, tight=tight)
            yield _matrix_chunks(L["wo"], bn[T_O], bkc[T_O], slot, tight=tight)
            yield _matrix_chunks(L["w_gate"], bn[T_GU], bkc[T_GU], slot, up=L["w_up"], tight=tight)
            yield _matrix_chunks(L["w_down"], bn[T_DOWN], bkc[T_DOWN], slot, tight=tight)
        yield _matrix_chunks(weights["lm_head"], bn[T_LM], bkc[T_LM], slot, tight=tight)

    order = np.asarray(order, dtype=np.int64)
    at = np.argsort(order, kind="stable")        # result positions, by the natural chunk they take
    src = order[at]
    lm = weights["lm_head"]
    out = torch.empty((len(order), slot), dtype=lm.dtype, device=lm.device)
    n0 = 0
    for c in natural():
        lo, hi = np.searchsorted(src, n0), np.searchsorted(src, n0 + c.shape[0])
        if hi > lo:
            out[torch.as_tensor(at[lo:hi], device=c.device)] = c[torch.as_tensor(src[lo:hi] - n0, device=c.device)]
        n0 += c.shape[0]
    if len(order) and (order.min() < 0 or order.max() >= n0):
        raise ValueError(f"ring order names chunk {int(order.max())} of {n0}")
    return out.reshape(-1)


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
