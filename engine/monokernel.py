"""Launcher of the monokernel: packs the weights, turns a Plan into kernel inputs, launches, checks.

    mk = Monokernel(cfg, weights, EngineConfig(mode="targeted"))
    tokens, seconds = mk.generate(prompt_ids, 512)              # greedy; temperature/top_k/top_p/seed too
    logits = mk.teacher_forced_logits(prompt_ids, forced_ids)   # [n, V] for the correctness gate
    mk.breakdown()                                              # instrumented run -> seconds/token by category

Prefill runs on the plain-torch reference (it fills the same KV cache tensor the kernel then extends);
every decode step afterwards happens inside ONE launch of kernel.monokernel, sampling included.
Weights are repacked once into one buffer in task order, with each RMSNorm's weight folded into the
columns of the matrix that consumes it (the kernel applies the 1/rms scale to the matrix output).
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from kog.engine.config import ConfigError, ModelConfig
from kog.engine.engine_config import EngineConfig, fits, sm90_default
from kog.engine.plan import (BUF_ATTN, BUF_HMID, BUF_HOUT, BUF_QKV, BUF_ACT, N_BUF, T_ATTN, T_BAR, TASK_NAMES, Plan,
                             make_plan)
from kog.engine.sampling import sample_mode
from kog.engine.vendor import INTERPRET, ctas_per_sm_fit, vendor_code
from kog.probe.errors import KogError

BUF_NAMES = {BUF_QKV: "qkv", BUF_ATTN: "attn", BUF_HMID: "hmid", BUF_ACT: "act", BUF_HOUT: "h"}


class MonokernelError(KogError):
    """The kernel reported an error (a wait timed out): the message names the counter and the task."""


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _run_lengths(rows: np.ndarray, cta_start: np.ndarray) -> np.ndarray:
    """Column 3 of the task table for pipelined GEMV runs (EngineConfig.pipeline_stages): at the first task of
    each maximal run of consecutive tasks of one CTA with the same type, layer, release counter and wait base,
    the run's length; 0 at the run's other tasks (the kernel's run loop executes them)."""
    n = np.zeros(len(rows), dtype=np.int64)
    key = rows[:, [0, 1, 6, 7]]
    for c in range(len(cta_start) - 1):
        i, hi = int(cta_start[c]), int(cta_start[c + 1])
        while i < hi:
            j = i + 1
            if rows[i, 0] not in (T_ATTN, T_BAR):
                while j < hi and (key[j] == key[i]).all():
                    j += 1
            n[i] = j - i
            i = j
    return n


def kernel_meta(cfg: ModelConfig, e: EngineConfig, *, attn_splits: int, grid: int, vendor: int, sample: int,
                trace: bool, tag_qkv: bool, ptrs: dict[str, Any], attn_stamps: bool = False) -> dict[str, Any]:
    """The keyword arguments of one monokernel launch: its constexprs (shapes, tiling, modes, the ring's slot
    and chunk widths), the optional pointers (`ptrs`: chunks_ptr, ring_lo_ptr, gring_ptr, ring_sz_ptr,
    rows4_ptr, grow_ptr, qkvt_ptr, each passed only where the config uses it, so kernel files that predate a
    feature still launch), the register cap and the cooperative launch. One function for the launcher
    (Monokernel._launch_args) and for kog.engine.regreport's compile without a GPU, so the two cannot drift."""
    g = cfg.num_heads // cfg.num_kv_heads
    meta = dict(H=cfg.hidden_size, I=cfg.intermediate_size, V=cfg.vocab_size, L=cfg.num_layers,
                HD=cfg.head_dim, NKV=cfg.num_kv_heads, G=g, GP=max(16, _next_pow2(g)), GH=_next_pow2(g),
                SP=_next_pow2(attn_splits),
                HAS_BIAS=bool(cfg.attention_bias), QK_NORM=bool(cfg.qk_norm),
                BN_QKV=e.bn_qkv, BN_O=e.bn_o, BN_GU=e.bn_gate_up, BN_DOWN=e.bn_down, BN_LM=e.bn_lm,
                BK=e.block_k, BT=e.attn_dot_tile(), GPOW=_next_pow2(grid), MODE=1 if e.mode == "targeted" else 0,
                SAMPLE=sample, TRACE=bool(trace),
                VENDOR=vendor, FILTER_ITERS=24, PF_DIST=int(e.prefetch),
                PFB=int(e.blocked_prefetch), ROWPF=int(e.row_prefetch), PIPE=int(e.pipeline_stages),
                num_warps=e.num_warps)
    if e.attn_tile:         # a split walks attn_block / attn_tile tiles (kernel: BS)
        meta["BS"] = e.attn_block
    if trace and attn_stamps:    # the attention splits' sub-step stamps (Monokernel(attn_stamps=True))
        meta.update(ATRACE=True, atr_ptr=ptrs["atr_ptr"], atr_cap=ptrs["atr_cap"])
    if e.flat_loop:      # only then: the kernel's other callers (and older kernel files) never see them
        meta.update(FLAT=True, chunks_ptr=ptrs["chunks_ptr"])
    if e.tp_compat > 1:
        meta.update(TPC=int(e.tp_compat))
    if e.weight_ring:
        from kog.engine.ring import kernel_chunk_cols, padded_fraction, phase_bn, slot_bytes
        bn, H, I, QS = phase_bn(e), cfg.hidden_size, cfg.intermediate_size, cfg.q_size
        meta.update(RING=int(e.weight_ring), SLOTB=slot_bytes(block_k=e.block_k, bn=bn),
                    ring_lo_ptr=ptrs["ring_lo_ptr"], gring_ptr=ptrs["gring_ptr"],
                    **kernel_chunk_cols(H=H, I=I, QS=QS, block_k=e.block_k, bn=bn))
        if tag_qkv:
            meta.update(TAGQKV=True, qkvt_ptr=ptrs["qkvt_ptr"])
        if padded_fraction(H=H, I=I, QS=QS, block_k=e.block_k, bn=bn) > 0:
            meta.update(RING_SIZES=True, ring_sz_ptr=ptrs["ring_sz_ptr"])
        if e.row_prefetch == 2:
            meta.update(rows4_ptr=ptrs["rows4_ptr"], grow_ptr=ptrs["grow_ptr"])
    if vendor == 1:
        # cap registers so ctas_per_sm CTAs fit on one SM (spills beat a grid that cannot be co-resident)
        meta["maxnreg"] = min(255, (65536 // (e.ctas_per_sm * e.num_warps * 32)) // 8 * 8)
    if vendor != INTERPRET:
        meta["launch_cooperative_grid"] = True   # the driver refuses a grid that is not co-resident
    return meta


class Monokernel:
    EXACT_PREFILL = True        # prefill in float32 (see __init__); the TP ranks override it
    attn_stamps = False         # __init__(attn_stamps=True) turns it on (tables built without __init__: off)

    def __init__(self, cfg: ModelConfig, weights, ecfg: EngineConfig | None = None, device=None,
                 max_seq: int | None = None, sm_partition: dict[int, int] | None = None,
                 trace_tokens: int = 0, compile_only: bool = False, attn_stamps: bool = False):
        from kog.engine.reference import Reference
        self.cfg = cfg
        self.ecfg = ecfg or EngineConfig()
        self.vendor = vendor_code()
        self.device = torch.device(device) if device is not None else weights.device
        if self.vendor != INTERPRET and self.device.type != "cuda":
            raise ConfigError("the monokernel needs the weights on a GPU (or TRITON_INTERPRET=1 on the CPU)")
        if self.vendor == INTERPRET:
            sms = 1
            self.ecfg = self.ecfg.replace(ctas_per_sm=1)
        else:
            sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        self.sms = sms
        if self.ecfg.weight_ring and self.vendor not in (INTERPRET, 1):
            raise ConfigError("weight_ring needs NVIDIA sm_90 bulk copies (no AMD path is written)")
        # The prompt's prefill: the reference in float32 over the checkpoint's weights, into the model-dtype
        # KV cache the kernel extends. The kernel's activations are float32; a bf16 prefill's per-op rounding
        # was most of its teacher-forced error against the float32 oracle (kog.engine.bench). Tensor-parallel
        # ranks and tp_compat keep the model dtype: their prefill must match TPMonokernel's bit for bit.
        exact = self.EXACT_PREFILL and self.ecfg.tp_compat <= 1
        self.ref = Reference(cfg, weights, max_seq, compute_dtype=torch.float32 if exact else None,
                             cache_dtype=weights.dtype)
        self.max_seq = self.ref.max_seq
        # attention splits: each covers attn_block positions, together the whole cache (or the sliding window)
        span = min(self.max_seq, getattr(cfg, "sliding_window", None) or self.max_seq)
        self.ecfg, self.attn_splits = self.ecfg.attn_layout(span)
        self.plan: Plan = make_plan(cfg, self.ecfg, sms, sm_partition, self.attn_splits)
        self.trace_tokens = trace_tokens
        # traced launches also stamp each attention split's sub-steps (kog.engine.trace.attn_stamps_table)
        self.attn_stamps = bool(attn_stamps) and trace_tokens > 0
        # compile_only (kog.tune.objective.precompile_one): the streamed weight buffer is a placeholder of the
        # same dtype and alignment, so the kernel compiles to the same variant without a packed copy of the
        # weights per compile process (14 of them beside the measuring worker exhausted an H200's memory).
        # Such an engine must never launch.
        self.compile_only = compile_only
        self._pack(weights)
        self._alloc()
        self.compile_seconds: float | None = None
        self._last_trace: np.ndarray | None = None
        self._last_ms_per_token: float | None = None

    # ---- one-time preparation -----------------------------------------------------------------------
    def _pack(self, w) -> None:
        cfg, dev = self.cfg, self.device
        dt = w.dtype
        mats, offs, o = [], np.zeros((cfg.num_layers + 1, 8), dtype=np.int64), 0

        def add(t: torch.Tensor) -> int:
            nonlocal o
            mats.append(t.contiguous().view(-1))
            start, o = o, o + t.numel()
            return start

        for i in range(cfg.num_layers):
            L = w.layer(i)
            offs[i, 0] = add(L["wqkv"])
            offs[i, 1] = add(L["wo"])
            offs[i, 2] = add(L["w_gate"])
            offs[i, 3] = add(L["w_up"])          # must follow w_gate: the kernel finds it at +I*H
            offs[i, 4] = add(L["w_down"])
        offs[cfg.num_layers, 0] = add(w["lm_head"])
        assert (offs % 64 == 0).all(), "every tile offset must be 128-byte aligned"
        self.wbuf = self._placeholder(dt) if self.compile_only else torch.cat(mats).to(dev)
        del mats
        self._woff_np = offs
        self.woff = torch.tensor(offs, device=dev)
        # small fp32 parameters: q/k/v bias, q_norm, k_norm, the RMSNorm weights (applied to x in-kernel,
        # not folded into the matrices, so the streamed weights are bit-identical to the checkpoint's)
        small, soffs, so = [torch.zeros(64)], np.zeros((cfg.num_layers, 8), dtype=np.int64), 64
        for i in range(cfg.num_layers):
            L = w.layer(i)
            for j, name in ((0, "bqkv"), (1, "q_norm"), (2, "k_norm"), (3, "attn_norm"), (4, "ffn_norm")):
                if name in L:
                    soffs[i, j] = so
                    small.append(L[name].float().cpu().view(-1))
                    so += L[name].numel()
                    pad = (-so) % 16                 # keep every vector 64-byte aligned
                    small.append(torch.zeros(pad))
                    so += pad
        self.fnorm_off = so
        small.append(w["norm"].float().cpu().view(-1))
        so += w["norm"].numel()
        pad = (-so) % 16
        small.append(torch.zeros(pad))
        so += pad
        # ones: the x multiplier of the flat segments' un-normed phases (o, down), as long as the longest K
        self.ones_off = so
        small.append(torch.ones(max(cfg.hidden_size, cfg.q_size, cfg.intermediate_size)))
        self.small = torch.cat(small).to(dev)
        self.soff = torch.tensor(soffs, device=dev)
        self._soff_np = soffs
        self.embed = w["embed"]
        cos, sin = self.ref.cos.float(), self.ref.sin.float()   # the prefill's table (float32, or tp_compat's model dtype)
        self.cos, self.sin = cos.contiguous(), sin.contiguous()

    def _placeholder(self, dtype) -> torch.Tensor:
        """compile_only's weight buffer: one 128-byte line (the allocator aligns it as the real buffer)."""
        return torch.empty(128 // torch.tensor([], dtype=dtype).element_size(), dtype=dtype, device=self.device)

    def _alloc(self) -> None:
        cfg, p, dev = self.cfg, self.plan, self.device
        H, I, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
        aoff, o = np.zeros((L + 2, 5), dtype=np.int32), 0
        for layer in range(L + 1):
            for j, n in enumerate((H, cfg.qkv_size, cfg.q_size, H, I)):
                aoff[layer, j] = o
                o += n
        aoff[L + 1, 0] = o
        self.aoff = torch.tensor(aoff, device=dev)
        self._aoff_np = aoff
        self.act = torch.zeros(o + H, dtype=torch.float32, device=dev)
        self.gpow = _next_pow2(p.grid)
        self.partial_v = torch.zeros(self.gpow + cfg.vocab_size, dtype=torch.float32, device=dev)
        self.partial_i = torch.zeros(self.gpow, dtype=torch.int32, device=dev)
        g = cfg.num_heads // cfg.num_kv_heads
        self.gp = max(16, _next_pow2(g))
        self.part = torch.zeros(cfg.num_kv_heads * self.attn_splits * self.gp * (cfg.head_dim + 2),
                                dtype=torch.float32, device=dev)
        i32 = dict(dtype=torch.int32, device=dev)
        self.dummy_base = p.n_counters
        self._chunks_np = None
        from kog.engine.plan import tagged_qkv
        # qkv -> attention through token-tagged words (plan.TAGGED_QKV), on the ring's path; zeroed every
        # launch, so no tag of an earlier launch can pass for this one's
        self.tag_qkv = tagged_qkv(self.ecfg)
        self.qkvt = torch.zeros(cfg.num_layers * cfg.qkv_size if self.tag_qkv else 1, dtype=torch.int64,
                                device=dev)
        tasks = self._task_table()
        self.tasks = torch.tensor(tasks, **i32)
        self.chunks = torch.tensor(self._chunks_np, **i32) if self._chunks_np is not None else None
        self._ring_tables(tasks)
        self.cta_start = torch.tensor(p.cta_start, **i32)
        self.layout = torch.tensor(p.layout, **i32)
        self.rpc = torch.tensor(p.rows_per_counter, **i32)
        # counters, then a block of always-ready dummies (target 0) that layer 0's waits point at
        n_dummy = max(cfg.qkv_size, cfg.intermediate_size, cfg.hidden_size) // int(p.rows_per_counter.min()) + 2
        self.target = torch.tensor(np.concatenate([p.target, np.zeros(n_dummy, np.int32)]), **i32)
        self.cnt = torch.zeros(p.n_counters + n_dummy, **i32)
        # sync words: the kernel's S_* slots below 1024, then one attention arrival counter per (layer, KV head)
        self.sync = torch.zeros(max(64 + (1 << 12), 1024 + cfg.num_layers * cfg.num_kv_heads), **i32)
        self.err = torch.zeros(8, **i32)
        self.smid_tab = torch.zeros(self.gpow, **i32)
        eos = list(cfg.eos_token_id)[:8]
        self.eos = torch.tensor(eos + [-1] * (8 - len(eos)), **i32)
        self.n_eos = len(eos)
        self.trace_cap = int(np.max(p.cta_start[1:] - p.cta_start[:-1])) * max(self.trace_tokens, 1)
        self.trace = torch.zeros((p.grid, self.trace_cap, 4) if self.trace_tokens else (1, 1, 4),
                                 dtype=torch.int64, device=dev)
        self.atr_cap = 1
        if self.attn_stamps:     # room for every attention task of the busiest CTA, per traced token
            n_attn = np.bincount(np.repeat(np.arange(p.grid), np.diff(p.cta_start)),
                                 weights=(p.tasks[:, 0] == T_ATTN), minlength=p.grid)
            self.atr_cap = int(n_attn.max()) * max(self.trace_tokens, 1)
        self.atr = torch.zeros((p.grid if self.attn_stamps else 1, self.atr_cap, 8), dtype=torch.int64, device=dev)

    def _ring_tables(self, tasks: np.ndarray) -> None:
        """Weight ring (kog.engine.ring): the GEMV weights repacked as each CTA's chunks in consumption order
        (they replace the task-order buffer: the ring path reads nothing else), each CTA's first chunk, and
        the interpreter's global-memory stand-in for the shared-memory slots."""
        from kog.engine.plan import T_DOWN, T_GU, T_LM, T_O, T_QKV
        from kog.engine.ring import (pack_ring_weights, padded_fraction, phase_bn, ring_bytes,
                                     ring_chunk_bytes, ring_order, slot_bytes)
        e, cfg = self.ecfg, self.cfg
        self.ring_extra_smem = 0
        if not e.weight_ring:
            return
        if self.vendor != INTERPRET and self.wbuf.element_size() != 2:
            raise ConfigError("weight_ring streams 16-bit weights (bf16 / fp16)")
        bn = phase_bn(e)
        H, I = cfg.hidden_size, cfg.intermediate_size
        tiles = {T_QKV: cfg.qkv_size // e.bn_qkv, T_O: H // e.bn_o, T_GU: I // e.bn_gate_up,
                 T_DOWN: H // e.bn_down, T_LM: cfg.vocab_size // e.bn_lm}
        order, lo = ring_order(tasks, self.plan.cta_start, num_layers=cfg.num_layers, n_tiles=tiles, H=H, I=I,
                               QS=cfg.q_size, block_k=e.block_k, bn=bn)
        # a K that is not a multiple of its chunk: short last steps packed densely and copied at their size
        self.ring_sizes = padded_fraction(H=H, I=I, QS=cfg.q_size, block_k=e.block_k, bn=bn) > 0
        dt = self.wbuf.dtype
        self.wbuf = None                                  # the ring's packing replaces it (peak: one copy less)
        self.wbuf = self._placeholder(dt) if self.compile_only else pack_ring_weights(
            self.ref.w, cfg.num_layers, order, block_k=e.block_k, bn=bn, tight=self.ring_sizes).to(self.device)
        sizes = ring_chunk_bytes(tasks, self.plan.cta_start, H=H, I=I, QS=cfg.q_size, block_k=e.block_k, bn=bn)
        self.ring_sz = torch.tensor(sizes if sizes.size else np.zeros(1, np.int32), dtype=torch.int32,
                                    device=self.device)
        self.ring_lo = torch.tensor(lo.astype(np.int32), dtype=torch.int32, device=self.device)
        self.slot_bytes = slot_bytes(block_k=e.block_k, bn=bn)
        self.ring_extra_smem = ring_bytes(e.weight_ring, block_k=e.block_k, bn=bn)
        n = self.plan.grid * e.weight_ring * self.slot_bytes // 2 if self.vendor == INTERPRET else 1
        self.gring = torch.zeros(n, dtype=self.wbuf.dtype, device=self.device)
        if e.row_prefetch == 2:      # task rows through shared memory (kog.engine.ring.compact_rows)
            from kog.engine.plan import early_residual
            from kog.engine.ring import ROW_BLOCK, compact_rows
            early = early_residual(tasks, self.plan.cta_start)
            self.rows4 = torch.tensor(compact_rows(tasks, early), dtype=torch.int32, device=self.device)
            n = self.plan.grid * 2 * ROW_BLOCK.value * 4 if self.vendor == INTERPRET else 1
            self.grow = torch.zeros(n, dtype=torch.int32, device=self.device)

    def _task_table(self) -> np.ndarray:
        """The plan's tasks with what each needs precomputed (one row of 8 int32 per task): type, layer, tile,
        barrier number, weight offset of the tile (lo, hi words), counter it releases, first counter it waits on."""
        from kog.engine.plan import T_ATTN, T_DOWN, T_GU, T_LM, T_O, T_QKV
        cfg, e, p = self.cfg, self.ecfg, self.plan
        H, I, Q, L = cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.num_layers
        lay, R, wo = p.layout, p.rows_per_counter, self._woff_np
        t = p.tasks.astype(np.int64)
        typ, layer, tile = t[:, 0], t[:, 1], t[:, 2]
        lc = np.minimum(layer, L - 1)                     # the LM head's "layer" is L
        woff = np.zeros(len(t), dtype=np.int64)
        elems = np.zeros(len(t), dtype=np.int64)          # weight elements of the task's tile (gate: one tile)
        rel = np.full(len(t), -1, dtype=np.int64)
        wait = np.zeros(len(t), dtype=np.int64)
        prev_h = np.where(layer > 0, lay[np.maximum(layer - 1, 0), BUF_HOUT], self.dummy_base)
        spec = {  # type: (weight matrix column in woff, rows per tile, K, produced buffer, wait base)
            T_QKV: (0, e.bn_qkv, H, BUF_QKV, prev_h),
            T_O: (1, e.bn_o, Q, BUF_HMID, lay[lc, BUF_ATTN]),
            T_GU: (2, e.bn_gate_up, H, BUF_ACT, lay[lc, BUF_HMID]),
            T_DOWN: (4, e.bn_down, I, BUF_HOUT, lay[lc, BUF_ACT]),
        }
        for ty, (col, bn, K, buf, wb) in spec.items():
            m = typ == ty
            woff[m] = wo[layer[m], col] + tile[m] * bn * K
            elems[m] = bn * K
            rel[m] = lay[layer[m], buf] + (tile[m] * bn) // R[buf]
            wait[m] = wb[m]
        m = typ == T_ATTN
        group_rows = Q // cfg.num_kv_heads                # tile = kv head * splits + split
        rel[m] = lay[layer[m], BUF_ATTN] + (tile[m] // self.attn_splits) * group_rows // R[BUF_ATTN]
        wait[m] = lay[layer[m], BUF_QKV]
        m = typ == T_LM
        woff[m] = wo[L, 0] + tile[m] * e.bn_lm * H
        elems[m] = e.bn_lm * H
        wait[m] = lay[L - 1, BUF_HOUT]
        if e.mode != "targeted":
            rel[:] = -1                                   # grid mode publishes nothing: barriers order phases
        if self.tag_qkv:
            rel[typ == T_QKV] = -1                        # attention polls the tagged words instead
        out = np.zeros((len(t), 8), dtype=np.int64)
        out[:, :4] = t
        assert (woff % 64 == 0).all()
        out[:, 4] = woff // 64                            # in units of 64 elements (alignment known to the compiler)
        out[:, 5] = -(-elems * self.wbuf.element_size() // 128)   # 128-byte lines of the tile (L2 prefetch)
        out[:, 6] = rel
        out[:, 7] = wait
        if e.pipeline_stages and e.flat_loop:
            from kog.engine.flat_plan import flat_chunks
            self._chunks_np, out = flat_chunks(
                out, p.cta_start, H=H, I=I, QS=Q, L=L, block_k=e.block_k, aoff=self._aoff_np,
                soff=self._soff_np, fnorm_off=int(self.fnorm_off), ones_off=int(self.ones_off),
                rows_per_counter=p.rows_per_counter)
            return out.astype(np.int32)
        if e.pipeline_stages:
            gemv = (typ != T_ATTN) & (typ != T_BAR)       # barriers keep their number in column 3
            out[:, 3] = np.where(gemv, _run_lengths(out, p.cta_start), out[:, 3])
        return out.astype(np.int32)

    # ---- launching ------------------------------------------------------------------------------------
    def _launch(self, first_token: int, pos0: int, n: int, forced: torch.Tensor | None, temperature: float,
                top_k: int, top_p: float, seed: int, write_logits: bool, trace: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, logits, args, meta = self._launch_args(first_token, pos0, n, forced, temperature, top_k, top_p, seed,
                                                    write_logits, trace)
        self._compile(args, meta)
        self._start(args, meta)
        self._check_error()
        return out, (logits if write_logits else None)

    def _launch_args(self, first_token: int, pos0: int, n: int, forced: torch.Tensor | None, temperature: float,
                     top_k: int, top_p: float, seed: int, write_logits: bool, trace: bool):
        """(out, logits, args, meta) of one launch; resets the counters, sync words and the first input.
        Split from _launch so the tensor-parallel launcher starts G of them before it synchronizes any."""
        cfg, e, p = self.cfg, self.ecfg, self.plan
        if pos0 + n > self.max_seq:
            raise ConfigError(f"{pos0 + n} positions exceed the KV cache's max_seq {self.max_seq}")
        out = torch.full((n,), -1, dtype=torch.int32, device=self.device)
        logits = torch.empty((n, cfg.vocab_size) if write_logits else (1,), dtype=torch.float32, device=self.device)
        forced_t = forced if forced is not None else torch.zeros(1, dtype=torch.int32, device=self.device)
        self.cnt.zero_()
        if self.tag_qkv:
            self.qkvt.zero_()
        self.sync.zero_()
        self.err.zero_()
        self.act[: cfg.hidden_size] = self.embed[first_token].float()
        mode = sample_mode(temperature, top_k, top_p)
        window = getattr(cfg, "sliding_window", None) or 0
        args = (self.wbuf, self.woff, self.small, self.soff, self.embed, self.cos, self.sin, self.ref.cache,
                self.act, self.aoff, logits, 1 if write_logits else 0, self.part, self.attn_splits, self.partial_v, self.partial_i, out, forced_t, self.eos, self.n_eos,
                self.tasks, self.cta_start, self.layout, self.rpc, self.target, self.cnt, self.dummy_base,
                self.smid_tab, 1 if e.mapping == "topology" else 0,
                self.sync, self.err, self.trace, self.trace_tokens if trace else 0, self.trace_cap,
                pos0, n, self.max_seq, int(window), int(self.fnorm_off), 1 if forced is not None else 0, int(seed),
                1.0 / temperature if temperature > 0 else 1.0, int(top_k), float(top_p), float(cfg.rms_norm_eps),
                1.0 / math.sqrt(cfg.head_dim), int(e.max_spin), int(p.barriers_per_token))
        meta = kernel_meta(cfg, e, attn_splits=self.attn_splits, grid=p.grid, vendor=self.vendor, sample=mode,
                           trace=trace, tag_qkv=self.tag_qkv,
                           ptrs=dict(chunks_ptr=self.chunks, ring_lo_ptr=getattr(self, "ring_lo", None),
                                     gring_ptr=getattr(self, "gring", None), ring_sz_ptr=getattr(self, "ring_sz", None),
                                     rows4_ptr=getattr(self, "rows4", None), grow_ptr=getattr(self, "grow", None),
                                     qkvt_ptr=self.qkvt, atr_ptr=self.atr, atr_cap=self.atr_cap),
                           attn_stamps=self.attn_stamps)
        return out, logits, args, meta

    def _compile(self, args, meta) -> None:
        """First launch on a GPU: compile (timed) and check that the grid is co-resident."""
        from kog.engine.kernel import monokernel
        if self.vendor != INTERPRET and self.compile_seconds is None:
            t0 = time.perf_counter()
            k = monokernel.warmup(*args, grid=(self.plan.grid,), **meta)
            self.compile_seconds = time.perf_counter() - t0
            self._add_ring_smem(k)
            self._check_residency(k)

    def _add_ring_smem(self, k) -> None:
        """Launch a compiled kernel with the weight ring's shared memory after Triton's own (the kernel finds
        the ring at the end of its dynamic shared memory). Idempotent per compiled kernel; must run before
        the kernel's first load (the driver's shared-memory attribute is set then)."""
        if not self.ring_extra_smem or getattr(k, "_kog_ring_smem", None) == self.ring_extra_smem:
            return
        own = getattr(k, "_kog_triton_smem", k.metadata.shared)
        from kog.engine.ring import launch_smem
        total = launch_smem(own, self.ring_extra_smem)
        props = torch.cuda.get_device_properties(self.device)
        block_max = getattr(props, "shared_memory_per_block_optin", 227 * 1024)
        if total > block_max:
            raise ConfigError(f"weight_ring {self.ecfg.weight_ring} does not fit: {self.ring_extra_smem} B of ring "
                              f"after the kernel's {own} B is more than the {block_max} B of shared memory one CTA "
                              f"may have; use fewer slots or a smaller block_k")
        k._kog_triton_smem = own
        k.metadata = k.metadata._replace(shared=total)
        k.packed_metadata = (k.metadata.num_warps, k.metadata.num_ctas, total)
        k._kog_ring_smem = self.ring_extra_smem

    def _start(self, args, meta) -> None:
        from kog.engine.kernel import monokernel
        if self.compile_only or (self.ring_extra_smem and self.vendor != INTERPRET):
            # every compiled variant (traced, logits, sampling modes) gets the ring's shared memory first
            self._add_ring_smem(monokernel.warmup(*args, grid=(self.plan.grid,), **meta))
        if not self.compile_only:  # placeholder weights: compile and load the variant, never run it
            monokernel[(self.plan.grid,)](*args, **meta)

    def _check_residency(self, k) -> None:
        """Refuse a grid larger than what fits on the SMs at once (a persistent grid must be co-resident)."""
        try:
            k._init_handles()
            props = torch.cuda.get_device_properties(self.device)
            self.kernel_regs, self.kernel_spills = k.n_regs, k.n_spills
            fit = ctas_per_sm_fit(k, self.ecfg.num_warps,
                                  regs_per_sm=getattr(props, "regs_per_multiprocessor", 65536),
                                  smem_per_sm=getattr(props, "shared_memory_per_multiprocessor", 228 * 1024),
                                  threads_per_sm=getattr(props, "max_threads_per_multi_processor", 2048))
        except Exception:
            return
        self.max_ctas_per_sm = fit
        if self.ecfg.ctas_per_sm > fit:
            raise ConfigError(f"ctas_per_sm {self.ecfg.ctas_per_sm} does not fit: the kernel uses {k.n_regs} "
                              f"registers/thread and {k.metadata.shared} B shared memory, so {fit} CTAs fit per SM")

    def _check_error(self) -> None:
        err = self.err.cpu().tolist()
        if err[0] == 0:
            return
        what, task, target, value = err[1:5]
        where = self._describe_counter(what)
        tdesc = self._describe_task(task)
        raise MonokernelError(f"monokernel: a wait timed out on {where} in {tdesc} "
                              f"(counter {value} < target {target}); the kernel aborted instead of hanging")

    def _describe_counter(self, idx: int) -> str:
        if idx == -1:
            return "the token-ready flag"
        if idx == -2:
            return "the grid barrier"
        if idx == -3:
            return "the start-up SM rendezvous"
        if idx == -4:
            return "a weight-ring slot (its bulk copy never landed)"
        if idx == -5:
            return "the tagged qkv rows of an attention split (their token tag)"
        lay = self.plan.layout
        best = None
        for layer in range(lay.shape[0]):
            for b in range(N_BUF):
                if lay[layer, b] <= idx:
                    best = (layer, b, idx - lay[layer, b])
        if best is None or idx >= self.plan.n_counters:
            return f"counter {idx}"
        layer, b, c = best
        r = int(self.plan.rows_per_counter[b])
        return f"counter {idx} ({BUF_NAMES[b]} of layer {layer}, rows {c * r}..{(c + 1) * r - 1})"

    def _describe_task(self, ti: int) -> str:
        if ti < 0:
            return "the token start"
        typ, layer, tile, _ = (int(x) for x in self.plan.tasks[ti])
        cta = int(np.searchsorted(self.plan.cta_start, ti, side="right") - 1)
        return f"task {ti} ({TASK_NAMES[typ]} layer {layer} tile {tile}, CTA {cta})"

    # ---- public API -----------------------------------------------------------------------------------
    def _prefill(self, prompt: list[int]) -> None:
        if not prompt:
            raise ConfigError("the prompt is empty")
        self.ref.reset()
        if len(prompt) > 1:
            if self.ecfg.tp_compat > 1:
                self._tp_compat_prefill(prompt[:-1])
            else:
                self.ref.prefill(prompt[:-1])

    @torch.no_grad()
    def _tp_compat_prefill(self, toks: list[int]) -> None:
        """The prompt's KV cache as tp_compat tensor-parallel ranks fill it (kog.engine.tp.TPReference: each
        rank's partial sums added in rank order, TPMonokernel's prefill), so the decode that follows matches
        TPMonokernel's bit for bit. Rank r's caches hold KV heads [r * nkv/G, (r + 1) * nkv/G)."""
        from kog.engine.tp import TPReference
        if getattr(self, "_tpref", None) is None:
            self._tpref = TPReference(self.cfg, self.ref.w, self.ecfg.tp_compat, self.max_seq)
        self._tpref.reset()
        self._tpref.prefill(toks)
        self.ref.cache.copy_(torch.cat([r.cache for r in self._tpref.ranks], dim=2))

    def generate(self, prompt_ids, n: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int = 0, trace: bool = False) -> tuple[list[int], float]:
        """n new tokens after the prompt (fewer if EOS), and the seconds the decode launch took."""
        prompt = [int(t) for t in prompt_ids]
        self._prefill(prompt)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        out, _ = self._launch(prompt[-1], len(prompt) - 1, n, None, temperature, top_k, top_p, seed,
                              False, trace)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - t0
        toks = out.cpu().tolist()
        ntok = int(self.sync[5].item())
        toks = toks[:ntok]
        if trace:
            self._last_trace = self.trace.cpu().numpy()
            self._last_atr = self.atr.cpu().numpy() if self.attn_stamps else None
            self._last_ms_per_token = dt * 1e3 / max(ntok, 1)
        return toks, dt

    def teacher_forced_logits(self, prompt_ids, forced_ids) -> torch.Tensor:
        """[n, V] float32 logits with the same feeding as Reference.teacher_forced_logits."""
        prompt, forced = [int(t) for t in prompt_ids], [int(t) for t in forced_ids]
        self._prefill(prompt)
        feed = torch.tensor([prompt[-1]] + forced, dtype=torch.int32, device=self.device)
        n = len(forced)
        # force the fed tokens; EOS must not stop a teacher-forced run
        saved = self.n_eos
        self.n_eos = 0
        try:
            _, logits = self._launch(prompt[-1], len(prompt) - 1, n, feed, 0.0, 0, 1.0, 0, True, False)
        finally:
            self.n_eos = saved
        return logits

    def breakdown(self, prompt_ids=None, n: int = 64) -> dict[str, Any]:
        """Where a token's time goes, from an instrumented run: seconds per token (CTA-averaged) in
        streaming (task time not spent waiting), waiting (on dependencies), barrier (grid mode) and other
        (task decode, sampling, token hand-off), plus per-phase numbers and the raw trace (pandas).
        Also the instrumentation's cost: the same run untraced vs traced (`trace_overhead`)."""
        from kog.engine.trace import breakdown_from_trace
        if self.trace_tokens == 0:
            raise ConfigError("breakdown() needs Monokernel(..., trace_tokens=N)")
        prompt = list(prompt_ids) if prompt_ids is not None else [1, 2, 3, 4]
        self.generate(prompt, n, trace=True)               # compiles the traced variant
        _, plain = self.generate(prompt, n)
        _, traced = self.generate(prompt, n, trace=True)
        out = breakdown_from_trace(self._last_trace, self.plan, self._last_ms_per_token * 1e-3, self.trace_tokens)
        if self.attn_stamps:
            from kog.engine.trace import attn_stamps_table
            out["attn_table"] = attn_stamps_table(self._last_atr, self.plan)
        out["trace_overhead"] = traced / plain - 1.0
        out["untraced_seconds_per_token"] = plain / n
        return out


def precompile(model_cfg: ModelConfig, engine_cfg: EngineConfig) -> None:
    """Hook for kogtune: compile the kernel for a config ahead of measuring (needs a GPU)."""
    from kog.engine.weights import random_weights
    w = random_weights(model_cfg, device="cuda", seed=0)
    Monokernel(model_cfg, w, engine_cfg, max_seq=64).generate([1, 2], 1)


# ---- bench systems: kog-targeted / kog-grid ---------------------------------------------------------------

class KogSystem:
    """The monokernel as a `kogtune bench` system (EOS ignored, greedy, tuned config when one is stored)."""

    def __init__(self, cfg: ModelConfig, weights, device, mode: str, ecfg: EngineConfig | None = None):
        self.cfg, self.weights, self.device, self.mode = cfg, weights, device, mode
        self.explicit = ecfg is not None
        self.ecfg = (ecfg or _default_config(cfg, device)).replace(mode=mode)
        self.mk: Monokernel | None = None
        self._last_prompt: list[int] | None = None

    def _engine(self, need: int) -> Monokernel:
        if self.mk is None or self.mk.max_seq < need:
            max_seq = max(need, 64)
            if not self.explicit:     # the default for this cache length (a long one may need fewer ring slots)
                span = min(max_seq, getattr(self.cfg, "sliding_window", None) or max_seq)
                self.ecfg = _default_config(self.cfg, self.device, span).replace(mode=self.mode)
            self.mk = Monokernel(self.cfg, self.weights, self.ecfg, self.device, max_seq=max_seq,
                                 trace_tokens=8)
            self.mk.n_eos = 0
        return self.mk

    def generate(self, prompt_ids, n: int):
        prompt = list(prompt_ids)
        self._last_prompt = prompt
        return self._engine(len(prompt) + n + 1).generate(prompt, n)

    def teacher_forced_logits(self, prompt_ids, forced_ids):
        return self._engine(len(prompt_ids) + len(forced_ids) + 1).teacher_forced_logits(prompt_ids, forced_ids)

    def breakdown(self) -> dict[str, Any]:
        mk = self._engine(len(self._last_prompt or [1]) + 64)
        b = mk.breakdown(self._last_prompt or [1, 2, 3, 4], n=48)
        self.trace_table = b.pop("table", None)
        phases = b.pop("phases", {})
        out = {k: b[k] for k in ("streaming", "waiting", "barrier", "other")}
        out["seconds_per_token_traced"] = b["seconds_per_token"]
        out["phases"] = phases
        out["compile_seconds"] = mk.compile_seconds
        return out


def platform_default(cfg: ModelConfig, device=None, span: int | None = None) -> EngineConfig:
    """The built-in config for this GPU: on NVIDIA sm_90+ (cp.async.bulk) engine_config.sm90_default (the
    weight ring with 3 slots, or 2 where shared memory needs it, the task rows in blocks through shared
    memory, 64 positions per attention split, 4-row gate_up tiles where one chunk spans the hidden size;
    bench/h200/ENGINE_NOTES.md: 1,024 vs 920 tok/s for the ring in one run on the H200, llama-3.2-1b; session
    7's same-run pairs: 1,146.9 vs 1,107.5 for 4- vs 8-row gate_up, 1,200.0 vs 1,149.6 with vs without the
    normed-input cache; session 9: 1,265.3 vs 1,228.5 for the rows through shared memory), elsewhere (the interpreter, AMD, older NVIDIA) EngineConfig() as it is."""
    try:
        import torch as _t
        if (_t.cuda.is_available() and not getattr(_t.version, "hip", None)
                and _t.cuda.get_device_capability(device) >= (9, 0) and vendor_code() != INTERPRET):
            return sm90_default(cfg, span)
    except (ConfigError, RuntimeError, AssertionError):
        pass
    return EngineConfig()


def _default_config(cfg: ModelConfig, device, span: int | None = None) -> EngineConfig:
    """The tuned config for this GPU and model shape (the user's store, else kog's own measured table,
    kog.tune.store.builtin_config), when it fits a cache of `span` positions; else the platform's built-in
    default for that span."""
    try:
        import torch as _t
        from kog.tune.store import best_config, builtin_config
        name = _t.cuda.get_device_name(device) if _t.cuda.is_available() else "cpu"
        best = best_config(name, cfg)
        if best is None:                  # kog's own measured tiling for this GPU and shape, if any
            best = builtin_config(name, cfg)
        if best is not None and fits(best, cfg, span):
            return best
    except Exception:
        pass
    return platform_default(cfg, device, span)


def _register() -> None:
    try:
        from kog.engine.bench import register_system
    except Exception:
        return
    register_system("kog-targeted", lambda cfg, w, dev: KogSystem(cfg, w, dev, "targeted"))
    register_system("kog-grid", lambda cfg, w, dev: KogSystem(cfg, w, dev, "grid"))


_register()
