"""The chunk table of flat pipelined segments (EngineConfig.flat_loop): planned in Python, executed by
kog.engine.kernel._gemv_segment.

A segment is a maximal sequence of consecutive GEMV tasks (qkv, o, gate_up, down, lm) in one CTA's task list,
across phases and layers (attention tasks end segments). The kernel runs a segment as ONE loop over its
chunks that Triton software-pipelines, so each CTA's weight stream stays in flight across task, phase and
layer boundaries instead of draining at each of them (bench/h200/ENGINE_NOTES.md: the per-run version,
pipeline_stages alone, still drained ~5 times per layer). Every chunk is a [BN, BK] weight tile slice, the
same shape for every phase (bn_* equal, block_k dividing every K); gate_up's chunks alternate gate and up.

Chunk row (int32 x 8):
    0  type | flags << 4   flags: FIRST (task's first chunk: reset, release, wait), LAST (its epilogue runs),
                           UP (an up-projection chunk: second accumulator), WAIT (this chunk waits for its
                           input counters), NORMSS (adds x.x to the RMSNorm sum of squares)
    1  task index (the epilogue reads layer, tile and the release counter from the task table)
    2  weight offset of the chunk's tile rows / 64 (up chunks: + I*H)
    3  K / 16 | (k0 / 16) << 16
    4  first counter the task waits on        5  number of counters
    6  activation offset of the input vector  7  small-buffer offset of the x multiplier (norm weight, or ones)
The segment's first task carries, in the task table: column 3 = tasks in the segment, 4 = chunks,
5 = first chunk; its other tasks have column 3 = 0 (the kernel skips them).
"""
from __future__ import annotations

import numpy as np

from kog.engine.plan import T_DOWN, T_GU, T_LM, T_O, T_QKV

F_FIRST, F_LAST, F_UP, F_WAIT, F_NORMSS = 1, 2, 4, 8, 16
GEMV = (T_QKV, T_O, T_GU, T_DOWN, T_LM)


def flat_chunks(tasks: np.ndarray, cta_start: np.ndarray, *, H: int, I: int, QS: int, L: int, block_k: int,
                aoff: np.ndarray, soff: np.ndarray, fnorm_off: int, ones_off: int,
                rows_per_counter: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(chunk table [n, 8] int32, task table with the segment columns) for the monokernel's task table
    `tasks` ([T, 8]: type, layer, tile, aux, weight offset / 64, lines, release counter, wait base)."""
    assert block_k % 16 == 0 and H % 16 == 0 and I % 16 == 0 and QS % 16 == 0
    t = tasks.astype(np.int64).copy()
    # per type: K, index of its input buffer's rows-per-counter in the kernel's rpc table, x offset column
    # of the activation-offset table, norm weight column of the small-offset table (-1: none)
    spec = {T_QKV: (H, 4, 0, 3), T_O: (QS, 1, 2, -1), T_GU: (H, 2, 3, 4), T_DOWN: (I, 3, 4, -1), T_LM: (H, 4, 0, -2)}
    rows: list[list[int]] = []
    for c in range(len(cta_start) - 1):
        i, hi = int(cta_start[c]), int(cta_start[c + 1])
        while i < hi:
            if int(t[i, 0]) not in GEMV:
                i += 1
                continue
            j = i
            while j < hi and int(t[j, 0]) in GEMV:
                j += 1
            first_chunk, prev_cb = len(rows), None
            for k in range(i, j):
                typ, layer = int(t[k, 0]), int(t[k, 1])
                K, ri, xcol, gcol = spec[typ]
                nk = K // block_k
                R = int(rows_per_counter[ri])
                cb = int(t[k, 7])
                ncnt = (K - 1) // R + 1
                xoff = int(aoff[min(layer, L), xcol])
                goff = ones_off if gcol == -1 else (fnorm_off if gcol == -2 else int(soff[layer, gcol]))
                parts = (0, 1) if typ == T_GU else (0,)
                seq = [(kc, up) for kc in range(nk) for up in parts]
                for n, (kc, up) in enumerate(seq):
                    fl = 0
                    if n == 0:
                        fl |= F_FIRST
                        if cb != prev_cb:
                            fl |= F_WAIT
                    if n == len(seq) - 1:
                        fl |= F_LAST
                    if up:
                        fl |= F_UP
                    elif gcol != -1:
                        fl |= F_NORMSS
                    w = int(t[k, 4]) + (up * I * H) // 64
                    rows.append([typ | fl << 4, k, w, K // 16 | (kc * block_k // 16) << 16, cb, ncnt, xoff, goff])
                prev_cb = cb
            t[i, 3] = j - i
            t[i, 4] = len(rows) - first_chunk
            t[i, 5] = first_chunk
            t[i + 1:j, 3] = 0
            i = j
    chunks = np.array(rows, dtype=np.int64).reshape(-1, 8)
    # the kernel loads x and its multiplier as 16-byte vectors from these offsets (element multiples of 16)
    assert (chunks[:, 6] % 16 == 0).all() and (chunks[:, 7] % 16 == 0).all(), "x offsets must be multiples of 16"
    assert (chunks >= 0).all() and (chunks < 2 ** 31).all(), "chunk table entries must fit int32"
    return chunks.astype(np.int32), t.astype(np.int32)
