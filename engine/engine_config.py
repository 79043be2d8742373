"""EngineConfig: every knob of the monokernel, validated before any launch.

Compile-time knobs (constexpr: a change recompiles): sync mode, num_warps, block_k, rows per task per phase
(bn_*), the weight ring's slots, the attention split and tile. Plain data (kernel inputs: no recompile): the
task-to-CTA mapping and the wait granularity (rows per counter). ctas_per_sm changes the plan AND, on NVIDIA,
the register cap (maxnreg) the launcher compiles with, so 2, 3 and 4 CTAs/SM are three kernels there.
`compile_key()` lists the constexpr fields.

Both sync modes, the wait granularity and every mapping stay knobs although the H200 favours one setting of
each today: the tuner searches them, and a chiplet GPU needs them.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from kog.engine.config import ConfigError, ModelConfig

SYNC_MODES = ("targeted", "grid")
# What the engine runs by default on NVIDIA sm_90+ (kog.engine.monokernel.platform_default), each measured
# faster on the H200 than the alternative (docs/engine-notes.md): the weight ring with 3 slots, 64 cache
# positions per attention split, gate_up in 4-row tiles, so one chunk spans its K and its normed input stays
# in registers across a CTA's tasks
SM90_DEFAULT = dict(weight_ring=3, attn_block=64, bn_gate_up=4)
MAX_ATTN_SPLITS = 64
MAPPINGS = ("round-robin", "contiguous", "topology")
PHASES = ("qkv", "o", "gate_up", "down", "lm")


# A wait on the GPU ends within microseconds (a token's time at most); the bound leaves room for a launch under
# compute-sanitizer, which runs orders of magnitude slower. The interpreter runs a launch's programs (and the
# tensor-parallel ranks) in Python, where one may wait on another's whole layer on a loaded machine.
WAIT_TIMEOUT_GPU_S = 10.0
WAIT_TIMEOUT_INTERPRETER_S = 120.0


def wait_timeout_seconds(e: "EngineConfig", interpreter: bool) -> float:
    """The bound on every spin-wait of a launch: e.wait_timeout_s, or the platform's default when it is 0."""
    if e.wait_timeout_s > 0:
        return float(e.wait_timeout_s)
    return WAIT_TIMEOUT_INTERPRETER_S if interpreter else WAIT_TIMEOUT_GPU_S


@dataclass(frozen=True)
class EngineConfig:
    # Defaults: the best targeted-mode tiling of the exhaustive sweep on the H200 (llama-3.2-1b,
    # tune/data/nvidia-h200-llama-3.2-1b-sweep.parquet); sm90_default adds the ring.
    mode: str = "targeted"            # "targeted": per-dependency counters; "grid": a barrier between phases
    ctas_per_sm: int = 2              # persistent CTAs per SM (grid = SMs * ctas_per_sm, all co-resident)
    num_warps: int = 4
    block_k: int = 2048               # K chunk a task loads per step (and the finest wait along K); with the
                                      # ring, the slot holds block_k x the largest bn, and a phase with fewer
                                      # rows reads wider chunks (kog.engine.ring.chunk_shape)
    bn_qkv: int = 8                   # rows per task, per phase
    bn_o: int = 8
    bn_gate_up: int = 8
    bn_down: int = 8
    bn_lm: int = 8
    sync_rows: int = 4096             # producer rows that share one readiness counter (0 = one per block_k)
    tp_compat: int = 1                # G > 1: O and down reduced as G tensor-parallel ranks reduce them (each
                                      # rank's K slice rounded, added in rank order): the same tokens and
                                      # logits as TPMonokernel with G GPUs, bit for bit
    weight_ring: int = 0              # > 0: slots of the per-CTA shared-memory weight ring (kog.engine.ring):
                                      # bulk copies keep this many chunks requested ahead across tasks,
                                      # phases, layers and tokens, and the task rows come through shared
                                      # memory (NVIDIA sm_90; emulated by the interpreter)
    mapping: str = "round-robin"      # task -> CTA strategy
    attn_block: int = 32              # KV positions per attention split (widened for long caches: attn_layout)
    attn_tile: int = 0                # > 0: positions per tl.dot tile, a split walking attn_block / attn_tile of
                                      # them (Triton's shared memory holds one tile: the ring keeps its slots
                                      # at wider splits); 0: one tile of attn_block
    wait_timeout_s: float = 0.0       # bound on every spin-wait, in seconds: a wait that outlasts it is an
                                      # error naming the counter and the task, not a hang (0: the platform's
                                      # default, wait_timeout_seconds)

    def replace(self, **kw: Any) -> "EngineConfig":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EngineConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        bad = set(d) - names
        if bad:
            raise ConfigError(f"unknown engine config field(s): {', '.join(sorted(bad))}")
        return cls(**d)

    def bn(self, phase: str) -> int:
        return getattr(self, "bn_" + phase)

    def attn_layout(self, span: int) -> tuple["EngineConfig", int]:
        """(config, attention splits) for a cache of `span` positions: each split covers attn_block positions,
        and at most MAX_ATTN_SPLITS of them (every split is a task of every layer and token, holding positions
        or not), so a longer cache doubles attn_block until they fit."""
        blk = self.attn_block
        while -(-span // blk) > MAX_ATTN_SPLITS:
            blk *= 2
        return (self if blk == self.attn_block else self.replace(attn_block=blk)), -(-span // blk)

    def attn_dot_tile(self) -> int:
        """Cache positions per tl.dot tile of the attention (the kernel's BT): attn_tile, else attn_block."""
        return self.attn_tile or self.attn_block

    def compile_key(self) -> tuple:
        """Fields that are constexpr in the kernel. Configs with equal keys share one compiled kernel only if they
        also share the register cap (ctas_per_sm on NVIDIA): see kog.tune.search.kernel_key()."""
        return (self.mode, self.num_warps, self.block_k, self.bn_qkv, self.bn_o, self.bn_gate_up,
                self.bn_down, self.bn_lm, self.attn_block, self.tp_compat, self.weight_ring, self.attn_tile)

    def validate(self, model: ModelConfig, sms: int | None = None, max_ctas_per_sm: int | None = None) -> "EngineConfig":
        """Raise ConfigError naming the first impossible choice (tiles must divide shapes, CTAs co-resident)."""
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ConfigError(f"engine config: {msg}")

        def pow2(x: int) -> bool:
            return x > 0 and (x & (x - 1)) == 0

        need(self.mode in SYNC_MODES, f"mode {self.mode!r} not in {SYNC_MODES}")
        need(self.mapping in MAPPINGS, f"mapping {self.mapping!r} not in {MAPPINGS}")
        need(self.num_warps in (1, 2, 4, 8, 16), f"num_warps {self.num_warps} not in 1,2,4,8,16")
        need(1 <= self.ctas_per_sm <= 8, f"ctas_per_sm {self.ctas_per_sm} not in 1..8")
        if max_ctas_per_sm is not None:
            need(self.ctas_per_sm <= max_ctas_per_sm,
                 f"ctas_per_sm {self.ctas_per_sm} exceeds the {max_ctas_per_sm} CTAs that fit on one SM")
        need(pow2(self.block_k), f"block_k {self.block_k} is not a power of two")
        need(self.tp_compat in (1, 2, 4, 8), f"tp_compat {self.tp_compat} not in 1, 2, 4, 8")
        if self.tp_compat > 1:
            g = self.tp_compat
            need(model.num_kv_heads % g == 0 and model.intermediate_size % g == 0,
                 f"tp_compat {g} must divide the KV heads ({model.num_kv_heads}) and intermediate_size "
                 f"({model.intermediate_size}), as tensor parallelism over {g} GPUs does")
        need(0 <= self.weight_ring <= 16, f"weight_ring {self.weight_ring} not in 0..16")
        if self.weight_ring:
            need(self.tp_compat == 1, "weight_ring runs with tp_compat 1")
            need(self.block_k >= 128, f"weight_ring needs block_k >= 128 (chunks start 128-byte aligned; got "
                 f"{self.block_k})")
            for what, K in (("hidden_size", model.hidden_size), ("q_size", model.q_size),
                            ("intermediate_size", model.intermediate_size)):
                need(K % 8 == 0, f"weight_ring needs 16-byte weight rows: {what} {K} is not a multiple of 8")
            # shared memory per SM on sm_90 (the only ring target): the ring (kog.engine.ring.ring_bytes) plus
            # Triton's own (one attention tile of the model dtype and up to 8 KiB more, as kog.engine.regreport
            # reads it off the compiled kernel) and the driver's 1 KiB per CTA; the launcher checks the exact
            # figure after compiling
            from kog.engine.ring import phase_bn, ring_bytes
            per_cta = (ring_bytes(self.weight_ring, block_k=self.block_k, bn=phase_bn(self))
                       + self.attn_dot_tile() * model.head_dim * 2 + 9 * 1024)
            need(per_cta * self.ctas_per_sm <= 228 * 1024,
                 f"weight_ring {self.weight_ring} does not fit: {self.ctas_per_sm} CTAs/SM x ~{per_cta // 1024} KiB "
                 f"of shared memory each exceed the 228 KiB of an sm_90 SM")
        need(pow2(self.attn_block) and self.attn_block >= 16, f"attn_block {self.attn_block} must be a power of two >= 16")
        if self.attn_tile:
            need(pow2(self.attn_tile) and 16 <= self.attn_tile <= self.attn_block,
                 f"attn_tile {self.attn_tile} must be a power of two in 16..attn_block ({self.attn_block})")
        need(math.isfinite(self.wait_timeout_s) and self.wait_timeout_s >= 0,
             f"wait_timeout_s {self.wait_timeout_s} must be a finite number of seconds >= 0")
        H, I = model.hidden_size, model.intermediate_size
        # K need not be a multiple of block_k: the last chunk of a row is masked.
        # the LM head's last tile may be ragged (a vocabulary such as 32,001): lm_tiles
        rows = {"qkv": model.qkv_size, "o": H, "gate_up": I, "down": H, "lm": model.vocab_size}
        for ph, n in rows.items():
            bn = self.bn(ph)
            need(pow2(bn), f"bn_{ph} {bn} is not a power of two")
            need(n % bn == 0 or ph == "lm", f"bn_{ph} {bn} does not divide the {n} rows of {ph}")
        if self.sync_rows:
            need(pow2(self.sync_rows), f"sync_rows {self.sync_rows} is not a power of two")
            for ph in ("qkv", "o", "gate_up", "down"):
                need(self.sync_rows % self.bn(ph) == 0,
                     f"sync_rows {self.sync_rows} is not a multiple of bn_{ph} {self.bn(ph)}")
        return self


def lm_tiles(vocab_size: int, bn_lm: int) -> int:
    """LM-head tasks of a single-GPU step: whole bn_lm-row tiles over the vocabulary, the last one ragged when
    bn_lm does not divide it (the packed head is padded with zero rows to whole tiles, kog.engine.monokernel,
    and the kernel never stores or samples a row >= V)."""
    return -(-vocab_size // bn_lm)


def fits(e: EngineConfig, model: ModelConfig, span: int | None = None) -> bool:
    """Whether `e` validates for `model`, with the attention block widened as a cache of `span` positions
    widens it (EngineConfig.attn_layout: Triton's shared memory grows with it, so a ring may stop fitting)."""
    try:
        (e.attn_layout(span)[0] if span else e).validate(model)
        return True
    except ConfigError:
        return False


def sm90_default(model: ModelConfig, span: int | None = None) -> EngineConfig:
    """The built-in config on NVIDIA sm_90+: SM90_DEFAULT, with fewer ring slots where the model's shared
    memory needs them (a head_dim of 128 widens Triton's attention tile; beyond 4,096 cached positions the
    widened attention block does too), for a cache of `span` positions when given; EngineConfig() when not
    even two slots fit. Where SM90_DEFAULT's chunks leave a short last step along the hidden size (a hidden
    size that is not a multiple of the chunk), every phase whose K one chunk of two or more rows can span
    takes that chunk instead (span_k_tiling), with 32-position attention tiles beside three ring slots."""
    e = EngineConfig()
    base = dict(SM90_DEFAULT)
    if not _gate_up_spans_k(e.replace(**base), model):
        # 4-row gate_up pays where its one chunk spans K (the normed input is then cached across tasks);
        # where it does not, 8-row tiles measured faster (docs/engine-notes.md)
        base["bn_gate_up"] = e.bn_gate_up
    candidates = [base]
    if _short_hidden_steps(e.replace(**base), model):
        # one chunk per task instead of a whole and a partial step: measured faster where the hidden size
        # leaves a partial step; where every step is whole, these tilings measured slower
        # (docs/engine-notes.md, "One chunk spanning K")
        candidates.insert(0, dict(base, **span_k_tiling(e.replace(**base), model), attn_tile=SPAN_ATTN_TILE))
    for cand in candidates:
        for slots in range(cand["weight_ring"], 1, -1):
            c = e.replace(**dict(cand, weight_ring=slots))
            if fits(c, model, span):
                return c
    return e


# attention tiles of the span-K tiling: they leave the shared memory for 3 ring slots at head_dim 128
SPAN_ATTN_TILE = 32
# the fewest rows of a span-K chunk: a one-row chunk as wide as a whole slot spilled registers on the H200
MIN_SPAN_ROWS = 2


def span_k_tiling(e: EngineConfig, model: ModelConfig) -> dict[str, int]:
    """Rows per task and block_k such that each phase's task is one chunk spanning its K, in slots of e's size:
    per phase the most rows (at most e's) whose chunk covers K (gate_up's chunk holds 2 x bn rows); a phase
    that no chunk of MIN_SPAN_ROWS rows spans keeps e's rows and its steps along K."""
    from kog.engine.layout import T_DOWN, T_GU, T_LM, T_O, T_QKV, TASK_NAMES
    from kog.engine.ring import phase_bn, phase_k, pow2ceil, slot_elems
    slot = slot_elems(block_k=e.block_k, bn=phase_bn(e))
    bn: dict[str, int] = {}
    for typ in (T_QKV, T_O, T_GU, T_DOWN, T_LM):
        ph = TASK_NAMES[typ]
        K = phase_k(typ, H=model.hidden_size, I=model.intermediate_size, QS=model.q_size)
        per_bn = 2 if ph == "gate_up" else 1
        b = e.bn(ph)
        while b > 1 and slot // (per_bn * b) < pow2ceil(K) and per_bn * b // 2 >= MIN_SPAN_ROWS:
            b //= 2
        bn[ph] = b if slot // (per_bn * b) >= pow2ceil(K) else e.bn(ph)
    out = {f"bn_{ph}": b for ph, b in bn.items()}
    # the slot keeps its size: block_k x the largest rows (kog.engine.ring.slot_elems)
    out["block_k"] = slot // max(bn.values())
    return out


def _short_hidden_steps(e: EngineConfig, model: ModelConfig) -> bool:
    """Whether a phase whose K is the hidden size (or the query width) steps along K in chunks that leave a
    partial last step (kog.engine.ring.chunk_shape: 3,072 columns in 2,048-column chunks)."""
    from kog.engine.layout import T_LM, T_O, T_QKV
    from kog.engine.ring import chunk_shape, phase_bn
    for typ in (T_QKV, T_O, T_LM):
        K, bkc, _ = chunk_shape(typ, H=model.hidden_size, I=model.intermediate_size, QS=model.q_size,
                                block_k=e.block_k, bn=phase_bn(e))
        if K > bkc and K % bkc:
            return True
    return False


def _gate_up_spans_k(e: EngineConfig, model: ModelConfig) -> bool:
    """Whether one ring chunk of gate_up covers its whole K (kog.engine.ring.chunk_shape)."""
    from kog.engine.layout import T_GU
    from kog.engine.ring import chunk_shape, phase_bn
    K, bkc, _ = chunk_shape(T_GU, H=model.hidden_size, I=model.intermediate_size, QS=model.q_size,
                            block_k=e.block_k, bn=phase_bn(e))
    return bkc >= K
