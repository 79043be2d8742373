"""Launcher of the monokernel: packs the weights, turns a Plan into kernel inputs, launches, checks.

    mk = Monokernel(cfg, weights, EngineConfig(mode="targeted"))
    tokens, seconds = mk.generate(prompt_ids, 512)              # greedy; temperature/top_k/top_p/seed too
    logits = mk.teacher_forced_logits(prompt_ids, forced_ids)   # [n, V] for the correctness gate
    for t in mk.stream(prompt_ids, 512): ...                    # each token as the running kernel writes it
    mk.breakdown()                                              # instrumented run -> seconds/token by category

Prefill runs on the plain-torch reference (it fills the same KV cache tensor the kernel then extends);
every decode step afterwards happens inside ONE launch of kernel.monokernel, sampling included. The kernel
writes each token into host memory (a pinned buffer the GPU writes through its mapping), so the host can read
the tokens while the launch runs (stream).
The plan (plan.py) is checked once per engine (plan.check_plan) before anything launches.
"""
from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from kog.engine import layout as LY
from kog.engine.config import ConfigError, ModelConfig
from kog.engine.engine_config import EngineConfig, lm_tiles, sm90_default, wait_timeout_seconds
from kog.engine.kernel.sampling import sample_mode
from kog.engine.kernel.trace import TASK_RECORD
from kog.engine.kernel.vendor import INTERPRET, NVIDIA, ctas_per_sm_fit, vendor_code
from kog.engine.plan import Plan, check_plan, make_plan
from kog.errors import KogError


class MonokernelError(KogError):
    """The kernel reported an error: a wait timed out (the message names the counter and the task) or a
    token pick found no token (the message names the step)."""


class EngineMemoryError(KogError):
    """The GPU ran out of memory while an engine was built; what the build had allocated is freed."""


def _next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _cx(t):
    """A namedtuple of host values as the kernel's constexprs (nested groups too)."""
    import triton.language as tl
    return type(t)(*(_cx(v) if isinstance(v, tuple) else tl.constexpr(v) for v in t))


def gemv_specs(cfg: ModelConfig, e: EngineConfig, rows_per_counter, tp: bool = False) -> dict[str, LY.GemvSpec]:
    """The five GEMV phases' constexpr specs (layout.GemvSpec): K, rows per task, columns per K step (the ring's
    chunk, or the direct path's block: gate_up's two tiles take half of block_k), and where an input stays in
    registers across a CTA's tasks (O's raw input where its one chunk is as wide as the normed inputs' cache,
    down's as model-dtype words where one chunk spans it; not with tensor parallelism), and the rows per
    readiness counter of each phase's input buffer (the plan's rows_per_counter: a constexpr, since a table
    read there would be an L2 round trip after every acquire, ahead of the wait's first poll)."""
    H, I, QS = cfg.hidden_size, cfg.intermediate_size, cfg.q_size
    bn = dict(qkv=e.bn_qkv, o=e.bn_o, gu=e.bn_gate_up, down=e.bn_down, lm=e.bn_lm)
    if e.weight_ring:
        from kog.engine.ring import kernel_chunk_cols, phase_bn
        cols = kernel_chunk_cols(H=H, I=I, QS=QS, block_k=e.block_k, bn=phase_bn(e))
        bk = dict(qkv=cols["BKC_QKV"], o=cols["BKC_O"], gu=cols["BKC_GU"], down=cols["BKC_DOWN"], lm=cols["BKC_LM"])
        xraw_o = bk["o"] == cols["BKC_X"] and QS <= bk["o"]
        xw_down = I <= bk["down"] and not tp
    else:
        bk = dict(qkv=e.block_k, o=e.block_k, gu=e.block_k // 2 if e.block_k >= 128 else e.block_k,
                  down=e.block_k, lm=e.block_k)
        xraw_o = xw_down = False
    ranks = int(e.tp_compat)
    R = [int(r) for r in rows_per_counter]
    return dict(QKV=LY.GemvSpec(H, bn["qkv"], bk["qkv"], True, False, False, False, LY.W_QKV, 1, R[LY.BUF_HOUT]),
                O=LY.GemvSpec(QS, bn["o"], bk["o"], False, False, xraw_o, False, LY.W_O, ranks, R[LY.BUF_ATTN]),
                GU=LY.GemvSpec(H, bn["gu"], bk["gu"], True, True, False, False, LY.W_GATE, 1, R[LY.BUF_HMID]),
                DOWN=LY.GemvSpec(I, bn["down"], bk["down"], False, False, False, xw_down, LY.W_DOWN, ranks,
                                 R[LY.BUF_ACT]),
                LM=LY.GemvSpec(H, bn["lm"], bk["lm"], True, False, False, False, LY.W_LM, 1, R[LY.BUF_HOUT]))


def kernel_constants(cfg: ModelConfig, e: EngineConfig, *, attn_splits: int, grid: int, rows_per_counter,
                     vendor: int, sample: int, trace: bool, attn_stamps: bool = False,
                     tp: tuple[int, int, int] | None = None) -> tuple[LY.Shape, LY.Tiling, dict[str, Any]]:
    """(Shape, Tiling, launch options) of one launch: the kernel's constexpr groups and num_warps, the register
    cap and the cooperative launch. One function for the launcher and for kog.engine.regreport's compile
    without a GPU, so the two cannot drift. tp: (ranks, exchange rows, vocabulary) of a tensor-parallel rank."""
    g = cfg.num_heads // cfg.num_kv_heads
    shape = LY.Shape(H=cfg.hidden_size, I=cfg.intermediate_size, V=cfg.vocab_size, L=cfg.num_layers,
                     HD=cfg.head_dim, NKV=cfg.num_kv_heads, G=g, GP=max(16, _next_pow2(g)), GH=_next_pow2(g),
                     SP=_next_pow2(attn_splits), QS=cfg.q_size, KVS=cfg.kv_size,
                     HAS_BIAS=bool(cfg.attention_bias), QK_NORM=bool(cfg.qk_norm))
    ring = int(e.weight_ring)
    slotb = bkc_x = 0
    sizes = False
    if ring:
        from kog.engine.ring import kernel_chunk_cols, padded_fraction, phase_bn, slot_bytes
        dims = dict(H=cfg.hidden_size, I=cfg.intermediate_size, QS=cfg.q_size, block_k=e.block_k, bn=phase_bn(e))
        slotb, bkc_x = slot_bytes(block_k=e.block_k, bn=phase_bn(e)), kernel_chunk_cols(**dims)["BKC_X"]
        sizes = padded_fraction(**dims) > 0
    nr, xr, vr = tp or (1, 1, 0)
    tiling = LY.Tiling(WAIT=e.mode == "targeted", **gemv_specs(cfg, e, rows_per_counter, tp is not None),
                       BT=e.attn_dot_tile(), SPLIT=e.attn_block, GPOW=_next_pow2(grid), SAMPLE=sample,
                       FILTER_BV=4 * e.num_warps, TRACE=bool(trace), ATRACE=bool(trace and attn_stamps), VENDOR=vendor,
                       TPC=int(e.tp_compat),
                       RING=ring, SLOTB=slotb, RING_SIZES=sizes, BKC_X=bkc_x, TAGQKV=bool(ring), TP=tp is not None,
                       NR=nr, XR=xr, VR=vr)
    opts: dict[str, Any] = {"num_warps": e.num_warps}
    if vendor == NVIDIA:
        # cap registers so ctas_per_sm CTAs fit on one SM (spills beat a grid that cannot be co-resident)
        opts["maxnreg"] = min(255, (65536 // (e.ctas_per_sm * e.num_warps * 32)) // 8 * 8)
    if vendor != INTERPRET:
        opts["launch_cooperative_grid"] = True   # the driver refuses a grid that is not co-resident
    return _cx(shape), _cx(tiling), opts



def kernel_groups(b, cfg: ModelConfig, e: EngineConfig, plan: Plan, trace: bool) -> tuple:
    """The kernel's argument groups (layout.*Args) over the buffers `b` holds (a Monokernel, or
    kog.engine.regreport's stand-ins with the same attribute names): one function for both, so the
    compile without a GPU sees exactly the launcher's arguments."""
    mw = LY.ModelArgs(b.wbuf, b.woff, b.small, b.soff, b.embed, b.cos, b.sin, b.cache)
    ac = LY.ActArgs(b.act, b.part, b.qkvt, b.logits, b.partial_v, b.partial_i, b.out, b.forced, b.eos,
                    b.search)
    pa = LY.PlanArgs(b.rows, b.cta_start, b.rpc, b.target, b.cnt, b.smid_tab, b.ring_lo, b.ring_sz, b.gring, b.grow,
                     b.peers)
    sy = LY.SyncArgs(b.sync, b.err, int(wait_timeout_seconds(e, vendor_code() == INTERPRET) * 1e9))
    tra = LY.TraceArgs(b.trace, b.trace_tokens if trace else 0, b.trace_cap, b.atr, b.atr_cap)
    fx = LY.EngineArgs(b.max_seq, int(getattr(cfg, "sliding_window", None) or 0), int(b.fnorm_off),
                       float(cfg.rms_norm_eps), 1.0 / math.sqrt(cfg.head_dim), b.attn_splits,
                       1 if e.mapping == "topology" else 0, int(plan.barriers_per_token))
    return mw, ac, pa, sy, tra, fx


def _layer_vectors(cfg: ModelConfig, partials: bool) -> list[tuple[int, int]]:
    """(layout.ACT_* column, elements) of the vectors one layer holds, in buffer order (kernel/act.py)."""
    H = cfg.hidden_size
    cols = [(LY.ACT_H, H), (LY.ACT_QKV, cfg.qkv_size), (LY.ACT_ATTN, cfg.q_size), (LY.ACT_HMID, H),
            (LY.ACT_MLP, cfg.intermediate_size)]
    return cols + ([(LY.ACT_OPART, H), (LY.ACT_DPART, H)] if partials else [])


def activation_offset(cfg: ModelConfig, layer: int, col: int, partials: bool = False) -> int:
    """Element offset of activation vector `col` (layout.ACT_*) of `layer` in the float32 activation buffer: per
    layer its input h, qkv, the attention output, hmid, the SiLU product (and with `partials` O's and down's
    partial sums); ACT_HOUT of layer l is ACT_H of l + 1; "layer" L holds the final hidden vector (the LM head's
    input). Layer 0's h is at 0: the kernel writes the next token's embedding there. kernel/act.py computes the
    same offsets from the shape's constexprs."""
    vecs = _layer_vectors(cfg, partials)
    stride = sum(n for _, n in vecs)
    if col == LY.ACT_HOUT:
        return (layer + 1) * stride
    o = 0
    for c, n in vecs:
        if c == col:
            return layer * stride + o
        o += n
    raise ValueError(f"activation column {col} is not held (partials={partials})")


def activation_size(cfg: ModelConfig, partials: bool = False) -> int:
    """Float32 elements of the activation buffer: every layer's vectors and the final hidden vector."""
    return activation_offset(cfg, cfg.num_layers, LY.ACT_H, partials) + cfg.hidden_size


class Monokernel:
    EXACT_PREFILL = True        # prefill in float32 (see __init__); the TP ranks override it
    CHECK_WEIGHTS = True        # the TP ranks' shards are checked whole by TPMonokernel instead
    attn_stamps = False         # __init__(attn_stamps=True) turns it on (tables built without __init__: off)

    def __init__(self, cfg: ModelConfig, weights, ecfg: EngineConfig | None = None, device=None,
                 max_seq: int | None = None, sm_partition: dict[int, int] | None = None,
                 trace_tokens: int = 0, compile_only: bool = False, attn_stamps: bool = False):
        if self.CHECK_WEIGHTS:
            from kog.engine.weights import check_weights
            # a missing, misshapen or NaN tensor: one line, before any packing (compile_only may be given
            # placeholder_weights: shapes only, nothing to scan)
            check_weights(cfg, weights, finite=not compile_only)
        try:
            self._build(cfg, weights, ecfg, device, max_seq, sm_partition, trace_tokens, compile_only, attn_stamps)
            return
        except torch.OutOfMemoryError as e:
            what = str(e).strip().splitlines()[0] if str(e).strip() else "out of memory"
        # outside the handler: the error's traceback (and the frames holding partial buffers) is gone, so
        # dropping this engine's own references frees everything the build allocated
        self.__dict__.clear()
        release_gpu_memory()
        raise EngineMemoryError(f"out of GPU memory building the engine ({what}); nothing was kept: use a smaller "
                                f"max_seq, free the GPU, or pick a card with more memory")

    def _build(self, cfg, weights, ecfg, device, max_seq, sm_partition, trace_tokens, compile_only,
               attn_stamps) -> None:
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
        if self.ecfg.weight_ring and self.vendor not in (INTERPRET, NVIDIA):
            raise ConfigError("weight_ring needs NVIDIA sm_90 bulk copies (no AMD path is written)")
        # The prompt's prefill: the reference in float32 over the checkpoint's weights, into the model-dtype
        # KV cache the kernel extends. The kernel's activations are float32; a bf16 prefill's per-op rounding
        # was most of its teacher-forced error against the float32 oracle. Tensor-parallel ranks and tp_compat
        # keep the model dtype: their prefill must match TPMonokernel's bit for bit.
        exact = self.EXACT_PREFILL and self.ecfg.tp_compat <= 1
        self.ref = Reference(cfg, weights, max_seq, compute_dtype=torch.float32 if exact else None,
                             cache_dtype=weights.dtype)
        self.max_seq = self.ref.max_seq
        self.cache = self.ref.cache        # the KV cache the prefill fills and the kernel extends
        # attention splits: each covers attn_block positions, together the whole cache (or the sliding window)
        self.ecfg, self.attn_splits = self.ecfg.attn_layout(cfg.attention_span(self.max_seq))
        self.plan: Plan = self._make_plan(sms, sm_partition)
        self.trace_tokens = trace_tokens
        # traced launches also stamp each attention split's sub-steps (kog.engine.trace.attn_stamps_table)
        self.attn_stamps = bool(attn_stamps) and trace_tokens > 0
        # compile_only (kogtune's parallel compile processes): the streamed weight buffer is a placeholder of
        # the same dtype and alignment, so the kernel compiles to the same variant without a packed copy of
        # the weights per compile process. Such an engine must never launch.
        self.compile_only = compile_only
        self._pack(weights)
        self._alloc()
        self.compile_seconds: float | None = None
        # the compiled kernel's registers and spilled bytes a thread: known once it is compiled (first launch)
        self.kernel_regs: int | None = None
        self.kernel_spills: int | None = None
        self._last_trace: np.ndarray | None = None
        self._last_ms_per_token: float | None = None

    def _make_plan(self, sms: int, sm_partition) -> Plan:
        """The single-GPU plan, checked before anything launches (tensor-parallel ranks plan differently)."""
        plan = make_plan(self.cfg, self.ecfg, sms, sm_partition, self.attn_splits)
        check_plan(plan, self.cfg, self.ecfg)
        return plan

    # ---- one-time preparation -----------------------------------------------------------------------
    def _pack(self, w) -> None:
        """The streamed weights in one buffer (their offsets in units of 64 elements: 128-byte aligned tiles the
        compiler can see), the small float32 parameters (biases, q/k norms, the RMSNorm weights, applied to x
        in-kernel so the streamed weights stay the checkpoint's), the embedding and the RoPE tables."""
        cfg, dev = self.cfg, self.device
        mats, offs, o = [], np.zeros((cfg.num_layers + 1, LY.WOFF_COLS), dtype=np.int64), 0

        def add(t: torch.Tensor) -> int:
            nonlocal o
            if not self.compile_only:       # compile_only packs no weights (a placeholder buffer below)
                mats.append(t.contiguous().view(-1))
            start, o = o, o + t.numel()
            assert start % 64 == 0, "every matrix must start 128-byte aligned"
            return start // 64

        for i in range(cfg.num_layers):
            L = w.layer(i)
            for col, name in ((LY.W_QKV, "wqkv"), (LY.W_O, "wo"), (LY.W_GATE, "w_gate"), (LY.W_UP, "w_up"),
                              (LY.W_DOWN, "w_down")):
                offs[i, col] = add(L[name])
        offs[cfg.num_layers, LY.W_LM] = add(self._lm_head(w))
        self.wbuf = self._placeholder(w.dtype) if self.compile_only else torch.cat(mats).to(dev)
        del mats
        self.woff = torch.tensor(offs, device=dev)
        small, soffs, so = [torch.zeros(64)], np.zeros((cfg.num_layers, LY.SOFF_COLS), dtype=np.int64), 64
        for i in range(cfg.num_layers):
            L = w.layer(i)
            for j, name in ((LY.P_BIAS, "bqkv"), (LY.P_QNORM, "q_norm"), (LY.P_KNORM, "k_norm"),
                            (LY.P_ATTN_NORM, "attn_norm"), (LY.P_FFN_NORM, "ffn_norm")):
                if name in L:
                    soffs[i, j] = so
                    so = _append_aligned(small, L[name], so)
        self.fnorm_off = so
        so = _append_aligned(small, w["norm"], so)
        self.small = torch.cat(small).to(dev)
        self.soff = torch.tensor(soffs, device=dev)
        self.embed = w["embed"]
        cos, sin = self.ref.cos.float(), self.ref.sin.float()   # the prefill's table (float32, or tp_compat's model dtype)
        self.cos, self.sin = cos.contiguous(), sin.contiguous()

    def _lm_head(self, w) -> torch.Tensor:
        """The LM head as the kernel streams it: padded with zero rows to whole bn_lm tiles when bn_lm does not
        divide the vocabulary (lm_tiles; the kernel never stores or samples a row >= V), else itself; and
        itself in a compile_only engine, which packs no weights (a padded copy would be the whole head)."""
        lm, V = w["lm_head"], self.cfg.vocab_size
        pad = lm_tiles(V, self.ecfg.bn_lm) * self.ecfg.bn_lm - V
        return lm if pad == 0 or self.compile_only else torch.cat([lm, lm.new_zeros((pad, lm.shape[1]))])

    def _placeholder(self, dtype) -> torch.Tensor:
        """compile_only's weight buffer: one 128-byte line (the allocator aligns it as the real buffer)."""
        return torch.empty(128 // torch.tensor([], dtype=dtype).element_size(), dtype=dtype, device=self.device)

    def _alloc(self, partials: bool = False) -> None:
        cfg, p, dev = self.cfg, self.plan, self.device
        self.act = torch.zeros(activation_size(cfg, partials), dtype=torch.float32, device=dev)
        self.gpow = _next_pow2(p.grid)
        # the CTAs' picks; top-k / top-p's scaled logits, Gumbel scores and CTA maxima (kernel/entry.py _filter)
        self.partial_v = torch.zeros(2 * self.gpow + 2 * cfg.vocab_size, dtype=torch.float32, device=dev)
        self.partial_i = torch.zeros(self.gpow, dtype=torch.int32, device=dev)
        self.search = torch.zeros(LY.SAMPLE_SEARCH, dtype=torch.int64, device=dev)
        gp = max(16, _next_pow2(cfg.num_heads // cfg.num_kv_heads))
        self.part = torch.zeros(cfg.num_kv_heads * self.attn_splits * gp * (cfg.head_dim + 2),
                                dtype=torch.float32, device=dev)
        i32 = dict(dtype=torch.int32, device=dev)
        # qkv -> attention through token-tagged words (the ring's path); zeroed every launch, so no tag of an
        # earlier launch can pass for this one's
        self.tag_qkv = p.tagged_qkv
        self.qkvt = torch.zeros(cfg.num_layers * cfg.qkv_size if self.tag_qkv else 1, dtype=torch.int64, device=dev)
        self.rows = torch.tensor(p.rows, **i32)
        self.cta_start = torch.tensor(p.cta_start, **i32)
        self.rpc = torch.tensor(p.rows_per_counter, **i32)
        # counters, then a block of always-ready ones (target 0) that layer 0's waits point at
        n_dummy = max(cfg.qkv_size, cfg.intermediate_size, cfg.hidden_size) // int(p.rows_per_counter.min()) + 2
        self.target = torch.tensor(np.concatenate([p.target, np.zeros(n_dummy, np.int32)]), **i32)
        self.cnt = torch.zeros(p.n_counters + n_dummy, **i32)
        # sync words: layout.S_* below S_ARR, then one attention arrival word per (layer, KV head)
        self.sync = torch.zeros(max(64 + (1 << 12), LY.S_ARR + cfg.num_layers * cfg.num_kv_heads), **i32)
        self.err = torch.zeros(8, **i32)
        self.smid_tab = torch.zeros(self.gpow, **i32)
        eos = list(cfg.eos_token_id)[:8]
        self.eos = torch.tensor(eos + [-1] * (8 - len(eos)), **i32)
        self.n_eos = len(eos)
        # the tokens of a launch: host memory the kernel writes through its device mapping (pinned on a GPU),
        # so the host reads each token while the launch still runs; one buffer for every launch of the engine
        self.out_host = torch.full((self.max_seq + 1,), -1, dtype=torch.int32,
                                   pin_memory=dev.type == "cuda")
        self._running = None         # what tells whether the last launch ended (a CUDA event, or a thread)
        self.trace_cap = int(np.max(p.cta_start[1:] - p.cta_start[:-1])) * max(self.trace_tokens, 1)
        rec = TASK_RECORD.value
        self.trace = torch.zeros((p.grid, self.trace_cap, rec) if self.trace_tokens else (1, 1, rec),
                                 dtype=torch.int64, device=dev)
        self.atr_cap = 1
        if self.attn_stamps:     # room for every attention task of the busiest CTA, per traced token
            n_attn = np.bincount(np.repeat(np.arange(p.grid), np.diff(p.cta_start)),
                                 weights=(p.tasks[:, 0] == LY.T_ATTN), minlength=p.grid)
            self.atr_cap = int(n_attn.max()) * max(self.trace_tokens, 1)
        self.atr = torch.zeros((p.grid if self.attn_stamps else 1, self.atr_cap, 8), dtype=torch.int64, device=dev)
        self.peers = None            # tensor-parallel ranks: the peer table (kog.engine.tp_monokernel)
        self._ring_tables()

    def _ring_tables(self) -> None:
        """Weight ring (kog.engine.ring): the GEMV weights repacked as each CTA's chunks in consumption order
        (they replace the packed buffer: the ring path reads nothing else), each CTA's first chunk, the bytes
        of each chunk's copy, and the interpreter's global-memory stand-ins for the slots and row blocks."""
        from kog.engine.weights import Weights
        from kog.engine.ring import (pack_ring_weights, padded_fraction, phase_bn, ring_bytes, ring_chunk_bytes,
                                     ring_order, slot_bytes)
        e, cfg, p = self.ecfg, self.cfg, self.plan
        self.ring_extra_smem = 0
        self.ring_lo = self.ring_sz = self.gring = self.grow = None
        if not e.weight_ring:
            return
        if self.vendor != INTERPRET and self.wbuf.element_size() != 2:
            raise ConfigError("weight_ring streams 16-bit weights (bf16 / fp16)")
        bn = phase_bn(e)
        H, I = cfg.hidden_size, cfg.intermediate_size
        tiles = {LY.T_QKV: cfg.qkv_size // e.bn_qkv, LY.T_O: H // e.bn_o, LY.T_GU: I // e.bn_gate_up,
                 LY.T_DOWN: H // e.bn_down, LY.T_LM: lm_tiles(cfg.vocab_size, e.bn_lm)}
        order, lo = ring_order(p.tasks, p.cta_start, num_layers=cfg.num_layers, n_tiles=tiles, H=H, I=I,
                               QS=cfg.q_size, block_k=e.block_k, bn=bn)
        tight = padded_fraction(H=H, I=I, QS=cfg.q_size, block_k=e.block_k, bn=bn) > 0
        dt = self.wbuf.dtype
        self.wbuf = None                                  # the ring's packing replaces it (peak: one copy less)
        if self.compile_only:
            self.wbuf = self._placeholder(dt)
        else:
            streamed = Weights({**self.ref.w, "lm_head": self._lm_head(self.ref.w)})   # the padded head, if ragged
            self.wbuf = pack_ring_weights(streamed, cfg.num_layers, order, block_k=e.block_k, bn=bn,
                                          tight=tight).to(self.device)
        sizes = ring_chunk_bytes(p.tasks, p.cta_start, H=H, I=I, QS=cfg.q_size, block_k=e.block_k, bn=bn)
        self.ring_sz = torch.tensor(sizes if sizes.size else np.zeros(1, np.int32), dtype=torch.int32,
                                    device=self.device)
        self.ring_lo = torch.tensor(lo.astype(np.int32), dtype=torch.int32, device=self.device)
        self.ring_extra_smem = ring_bytes(e.weight_ring, block_k=e.block_k, bn=bn)
        interp = self.vendor == INTERPRET
        n = p.grid * e.weight_ring * slot_bytes(block_k=e.block_k, bn=bn) // 2 if interp else 1
        self.gring = torch.zeros(n, dtype=self.wbuf.dtype, device=self.device)
        self.grow = torch.zeros(p.grid * 2 * LY.ROW_BLOCK * LY.ROW_WORDS if interp else 1, dtype=torch.int32,
                                device=self.device)

    # ---- launching ------------------------------------------------------------------------------------
    def groups(self, trace: bool = False) -> tuple:
        """The kernel's argument groups over this engine's buffers (kernel_groups)."""
        return kernel_groups(self, self.cfg, self.ecfg, self.plan, trace)

    def constants(self, sample: int, trace: bool) -> tuple:
        return kernel_constants(self.cfg, self.ecfg, attn_splits=self.attn_splits, grid=self.plan.grid,
                                rows_per_counter=self.plan.rows_per_counter, vendor=self.vendor, sample=sample,
                                trace=trace, attn_stamps=self.attn_stamps)

    def _launch(self, first_token: int, pos0: int, n: int, forced: torch.Tensor | None, temperature: float,
                top_k: int, top_p: float, seed: int, write_logits: bool, trace: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        args, opts = self._launch_args(first_token, pos0, n, forced, temperature, top_k, top_p, seed, write_logits,
                                       trace)
        self._compile(args, opts)
        self._start(args, opts)
        self._check_error()
        return self.out, (self.logits if write_logits else None)

    def _launch_args(self, first_token: int, pos0: int, n: int, forced: torch.Tensor | None, temperature: float,
                     top_k: int, top_p: float, seed: int, write_logits: bool, trace: bool) -> tuple[tuple, dict]:
        """(args, launch options) of one launch; resets the counters, sync words and the first input. Split from
        _launch so the tensor-parallel launcher starts G of them before it synchronizes any."""
        cfg = self.cfg
        check_launch(self.embed.shape[0], first_token, pos0, n, temperature, top_k, top_p, seed)
        if pos0 + n > self.max_seq:
            raise ConfigError(f"{pos0 + n} positions exceed the KV cache's max_seq {self.max_seq}")
        self._wait_launch()          # the last launch may still write the token buffer
        self.out = self.out_host[:n]
        self.out.fill_(-1)
        self.logits = torch.empty((n, cfg.vocab_size) if write_logits else (1,), dtype=torch.float32,
                                  device=self.device)
        self.forced = forced if forced is not None else torch.zeros(1, dtype=torch.int32, device=self.device)
        self.cnt.zero_()
        if self.tag_qkv:
            self.qkvt.zero_()
        self.sync.zero_()
        self.err.zero_()
        self.act[: cfg.hidden_size] = self.embed[first_token].float()
        mode = sample_mode(temperature, top_k, top_p)
        if mode == 2:           # the search's sums (an aborted launch may leave some behind)
            self.search.zero_()
        run = (pos0, n, 1 if forced is not None else 0, int(seed), int(top_k),
               1.0 / temperature if temperature > 0 else 1.0, float(top_p), 1 if write_logits else 0, self.n_eos)
        shape, tiling, opts = self.constants(mode, trace)
        return (*self.groups(trace), *run, shape, tiling), opts

    def _compile(self, args, opts) -> None:
        """First launch on a GPU: compile (timed) and check that the grid is co-resident."""
        from kog.engine.kernel import monokernel
        if self.vendor != INTERPRET and self.compile_seconds is None:
            t0 = time.perf_counter()
            k = monokernel.warmup(*args, grid=(self.plan.grid,), **opts)
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

    def _start(self, args, opts) -> None:
        from kog.engine.kernel import monokernel
        if self.compile_only or (self.ring_extra_smem and self.vendor != INTERPRET):
            # every compiled variant (traced, logits, sampling modes) gets the ring's shared memory first
            self._add_ring_smem(monokernel.warmup(*args, grid=(self.plan.grid,), **opts))
        if not self.compile_only:  # placeholder weights: compile and load the variant, never run it
            monokernel[(self.plan.grid,)](*args, **opts)
            if self.vendor != INTERPRET:
                self._running = torch.cuda.Event()
                self._running.record()

    def _launch_ended(self) -> bool:
        r = self._running
        return r is None or (not r.is_alive() if hasattr(r, "is_alive") else r.query())

    def _wait_launch(self) -> None:
        r, self._running = self._running, None
        if r is None:
            return
        if hasattr(r, "join"):
            r.join()
            if r.errors:
                raise r.errors[0]
        else:
            r.synchronize()

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

    # ---- errors ---------------------------------------------------------------------------------------
    _SPECIAL_WAITS = {LY.E_TOKEN: "the token-ready flag", LY.E_BARRIER: "the grid barrier",
                      LY.E_RENDEZVOUS: "the start-up SM rendezvous",
                      LY.E_RING: "a weight-ring slot (its bulk copy never landed)",
                      LY.E_TAG: "the tagged qkv rows of an attention split (their token tag)",
                      LY.E_SAMPLE: "a round of the top-k / top-p search (every CTA meets at the token's end)"}

    def _check_error(self) -> None:
        err = self.err.cpu().tolist()
        if err[0] == 0:
            return
        what, task, target, value = err[1:5]
        if what == LY.E_LOGITS:
            raise MonokernelError(f"monokernel: no token could be picked at step {target} of the launch (picked id "
                                  f"{value}): its logits were not finite (NaN activations); the kernel aborted "
                                  f"instead of emitting a garbage token")
        raise MonokernelError(f"monokernel: a wait timed out on {self._describe_counter(what)} in "
                              f"{self._describe_task(task)} (counter {value} < target {target}); the kernel aborted "
                              f"instead of hanging")

    def _describe_counter(self, idx: int) -> str:
        if idx in self._SPECIAL_WAITS:
            return self._SPECIAL_WAITS[idx]
        if idx < 0 or idx >= self.plan.n_counters:
            return f"counter {idx}"
        from kog.engine.plan import _describe
        return _describe(self.plan, idx)

    def _describe_task(self, ti: int) -> str:
        if ti < 0:
            return "the token start"
        typ, layer, tile, _ = (int(x) for x in self.plan.tasks[ti])
        cta = int(np.searchsorted(self.plan.cta_start, ti, side="right") - 1)
        return f"task {ti} ({LY.TASK_NAMES[typ]} layer {layer} tile {tile}, CTA {cta})"

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
        out, _ = self._launch(prompt[-1], len(prompt) - 1, n, None, temperature, top_k, top_p, seed, False, trace)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - t0
        ntok = int(self.sync[LY.S_NTOK].item())
        toks = out.cpu().tolist()[:ntok]
        if trace:
            self._last_trace = self.trace.cpu().numpy()
            self._last_atr = self.atr.cpu().numpy() if self.attn_stamps else None
            self._last_ms_per_token = dt * 1e3 / max(ntok, 1)
        return toks, dt

    def stream(self, prompt_ids, n: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
               seed: int = 0, poll_s: float = 20e-6):
        """Yield each new token id as the running kernel writes it (n of them, fewer at a stop id). The host
        polls the token buffer while the launch runs (in the interpreter the launch runs on a thread), so the
        first token arrives long before the last. Afterwards self.last_stream holds prefill_s, ttft_s (call to
        first token), decode_s (launch to the kernel's end) and tokens."""
        t_call = time.perf_counter()
        prompt = [int(t) for t in prompt_ids]
        self._prefill(prompt)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        args, opts = self._launch_args(prompt[-1], len(prompt) - 1, n, None, temperature, top_k, top_p, seed,
                                       False, False)
        self._compile(args, opts)
        t0c = time.perf_counter()
        if self.vendor == INTERPRET:
            self._running = _launch_thread(self, args, opts)
        else:
            self._start(args, opts)
        buf = self.out.numpy()
        got, ttft = 0, None
        try:
            while got < n:
                if buf[got] >= 0:
                    if ttft is None:
                        ttft = time.perf_counter() - t_call
                    got += 1
                    yield int(buf[got - 1])
                elif self._launch_ended():
                    if buf[got] < 0:          # ended (a stop id, or an error the check below names)
                        break
                else:
                    time.sleep(poll_s)
        finally:
            self._wait_launch()
            t_end = time.perf_counter()
            self.last_stream = dict(prefill_s=t0 - t_call, ttft_s=ttft, decode_s=t_end - t0c, tokens=got,
                                    compile_s=t0c - t0)
        self._check_error()

    def set_stop_ids(self, ids) -> None:
        """The ids that end a launch after they are produced (at most 8; [] = never stop early): they replace
        the checkpoint's EOS ids for the launches that follow."""
        ids = [int(i) for i in ids]
        if len(ids) > self.eos.numel():
            raise ConfigError(f"at most {self.eos.numel()} stop ids, got {len(ids)}")
        bad = [i for i in ids if not 0 <= i < self.cfg.vocab_size]
        if bad:
            raise ConfigError(f"stop id {bad[0]} is outside the vocabulary [0, {self.cfg.vocab_size})")
        self.eos.copy_(torch.tensor(ids + [-1] * (self.eos.numel() - len(ids)), dtype=torch.int32))
        self.n_eos = len(ids)

    def teacher_forced_logits(self, prompt_ids, forced_ids) -> torch.Tensor:
        """[n, V] float32 logits with the same feeding as Reference.teacher_forced_logits."""
        prompt, forced = [int(t) for t in prompt_ids], [int(t) for t in forced_ids]
        self._prefill(prompt)
        feed = torch.tensor([prompt[-1]] + forced, dtype=torch.int32, device=self.device)
        # force the fed tokens; EOS must not stop a teacher-forced run
        saved = self.n_eos
        self.n_eos = 0
        try:
            _, logits = self._launch(prompt[-1], len(prompt) - 1, len(forced), feed, 0.0, 0, 1.0, 0, True, False)
        finally:
            self.n_eos = saved
        return logits

    def breakdown(self, prompt_ids=None, n: int = 64, temperature: float = 0.0, top_k: int = 0,
                  top_p: float = 1.0, seed: int = 0) -> dict[str, Any]:
        """Where a token's time goes, from an instrumented run (greedy, or sampling as generate's options):
        seconds per token (CTA-averaged) in streaming (task time not spent waiting), waiting (on
        dependencies), barrier (grid mode) and other (task decode, sampling, token hand-off), plus per-phase
        numbers and the raw trace (pandas). Also the instrumentation's cost: the same run untraced vs traced
        (`trace_overhead`)."""
        from kog.engine.trace import breakdown_from_trace
        if self.trace_tokens == 0:
            raise ConfigError("breakdown() needs Monokernel(..., trace_tokens=N)")
        prompt = list(prompt_ids) if prompt_ids is not None else [1, 2, 3, 4]
        opts = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        self.generate(prompt, n, trace=True, **opts)        # compiles the traced variant
        _, plain = self.generate(prompt, n, **opts)
        _, traced = self.generate(prompt, n, trace=True, **opts)
        out = breakdown_from_trace(self._last_trace, self.plan, self._last_ms_per_token * 1e-3, self.trace_tokens)
        if self.attn_stamps:
            from kog.engine.trace import attn_stamps_table
            out["attn_table"] = attn_stamps_table(self._last_atr, self.plan)
        out["trace_overhead"] = traced / plain - 1.0
        out["untraced_seconds_per_token"] = plain / n
        return out


SEED_RANGE = (0, 2 ** 63)       # the kernel's seed argument is an int64


def check_launch(rows: int, first_token: int, pos0: int, n: int, temperature: float, top_k: int,
                 top_p: float, seed: int) -> None:
    """ConfigError for launch arguments the kernel cannot run (checked here: in the kernel they would read
    outside the cache or the embedding's `rows`, or sample from NaN)."""
    if not 0 <= int(first_token) < rows:
        raise ConfigError(f"token id {first_token} is outside the embedding (0..{rows - 1})")
    if pos0 < 0 or n < 1:
        raise ConfigError(f"a launch needs a position >= 0 and >= 1 new token (got position {pos0}, {n} tokens)")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ConfigError(f"temperature must be a finite number >= 0 (got {temperature})")
    if top_k < 0 or not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_k must be >= 0 and top_p in (0, 1] (got {top_k}, {top_p})")
    if not SEED_RANGE[0] <= int(seed) < SEED_RANGE[1]:
        raise ConfigError(f"seed must be in [0, 2**63) (got {seed})")


def release_gpu_memory() -> None:
    """Collect what nothing references any more and hand the GPU allocator's cached blocks back."""
    import gc
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _launch_thread(mk: Monokernel, args, opts):
    """The interpreter's launch on a thread (it runs to its end on the calling thread otherwise), so the host
    can read the tokens it writes while it runs; the thread's join is _wait_launch's."""
    import threading
    errors: list[BaseException] = []

    def run() -> None:
        try:
            mk._start(args, opts)
        except BaseException as e:      # re-raised on the caller's thread by _wait_launch's check
            errors.append(e)

    t = threading.Thread(target=run, daemon=True, name="kog-monokernel-launch")
    t.errors = errors
    t.start()
    return t


def _append_aligned(parts: list, t: torch.Tensor, at: int) -> int:
    """Append t (as float32) and zeros up to the next 16 elements (64 bytes); returns the new end."""
    parts.append(t.float().cpu().view(-1))
    at += t.numel()
    pad = (-at) % 16
    parts.append(torch.zeros(pad))
    return at + pad


def platform_default(cfg: ModelConfig, device=None, span: int | None = None) -> EngineConfig:
    """The built-in config for this GPU: on NVIDIA sm_90+ (cp.async.bulk) engine_config.sm90_default (the
    weight ring, 64 positions per attention split, 4-row gate_up tiles where one chunk spans the hidden size),
    elsewhere (the interpreter, AMD, older NVIDIA) EngineConfig() as it is."""
    try:
        if (torch.cuda.is_available() and not getattr(torch.version, "hip", None)
                and torch.cuda.get_device_capability(device) >= (9, 0) and vendor_code() != INTERPRET):
            return sm90_default(cfg, span)
    except (ConfigError, RuntimeError, AssertionError):
        pass
    return EngineConfig()
