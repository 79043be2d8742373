"""Cost models of one monokernel decode step (`kogtune search --backend sim`), from a probe scan.

Deterministic: the same (ModelConfig, EngineConfig, scan) gives the same prediction. It is used in CI
(no GPU), to pre-screen configs, and to make a simulated sweep that the sampler replay is developed on.

Two models live here:

1. The stream model (phase_cost, predict_stream, SimParams/FITTED): a plain persistent GEMV stream with an
   optional grid barrier per phase, fitted to the stream-ceiling measurements of the H200
   (tune/data/h200-stream-ceiling.json). Kept as the reference for what streaming alone reaches.

2. The engine model (predict_engine, EngineParams/ENGINE_FITTED; `predict()` uses it): the real monokernel,
   fitted to the configs measured on the H200 (ENGINE_TABLE, extracted from the committed bench JSON, and the
   measured sweep SWEEP_TABLE). It models register-limited co-residency and the spills past the register
   cap, per-task overhead, streaming per phase (latency-bound blended with the scan's bandwidth), the waits
   of targeted mode or the barriers of grid mode at each phase boundary, and the attention chain per layer;
   not the task-to-SM mapping (it moved the measured sweep within noise).

docs/simulator.md has how each model was fitted and the errors measured (`python -m kog.tune.simulator
--calibration` re-measures them); tests/test_tune_sim.py bounds them. Only two models and one GPU were
measured: other shapes and GPUs are extrapolation. Against real trials of a study: `trial_error(rows)`.
"""
from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass, asdict
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from kog.engine.config import DTYPE_BYTES, ModelConfig
from kog.engine.engine_config import EngineConfig, lm_tiles
from kog.tune.scan_model import ScanModel, load_scan, scan_from_dir, synthetic_h200
from kog.tune.store import RETIRED_FIELDS

STREAM_TABLE = Path(__file__).resolve().parent / "data" / "h200-stream-ceiling.json"
REGS_PER_SM, MAX_THREADS_PER_SM, MAX_CTAS_PER_SM_HW = 65536, 2048, 32


@dataclass(frozen=True)
class SimParams:
    lat_us: float = 0.9          # effective latency of one dependent tile load under load
    cta_gbps: float = 20.0       # how fast one CTA issues and drains a tile (GB/s)
    elem_ns: float = 4.0         # reduce cost per weight element per thread, ns
    seg: float = 0.05            # DRAM penalty per (concurrent row stream / segment byte)
    refill_us: float = 0.9       # pipeline drain + refill at each grid barrier
    poll_us: float = 0.03        # unhidden cost of one satisfied counter poll
    task_us: float = 0.05        # per task: table read, offsets, store, counter release


# Fitted by fit_params() against the stream-ceiling rows (calibration_error() measures it); refit with
# `python -m kog.tune.simulator --fit` when they change.
FITTED = SimParams(lat_us=0.9640, cta_gbps=36.79, elem_ns=0.08021, seg=0.09947, refill_us=3.119)


@dataclass
class Prediction:
    tok_per_s: float
    seconds_per_token: float
    breakdown: dict[str, float]          # streaming, waiting, barrier, other (seconds / token)
    feasible: bool = True
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- residency -------------------------------------------------------------------------------
def max_ctas_per_sm(cfg: EngineConfig, model: ModelConfig | None = None) -> int:
    """Co-resident CTAs per SM the simulator allows for `cfg` (the engine caps registers to fit them:
    see engine_max_ctas_per_sm; the cost of the cap is the spills predict_engine charges)."""
    return engine_max_ctas_per_sm(cfg)


# ---- one phase --------------------------------------------------------------------------------
@dataclass
class PhaseCost:
    bytes: float
    synced_us: float        # busiest CTA, phase alone (grid sync)
    overlapped_us: float    # share of the time when phases overlap (no barrier), load balanced
    busiest_us: float       # the same when the busiest CTA of every phase is the same one (round-robin)
    tasks: int
    rounds: int


def phase_cost(N: int, K: int, bn: int, bk: int, warps: int, ctas_per_sm: int, prefetch: int,
               scan: ScanModel, p: SimParams, es: int = 2, spread: bool = True) -> PhaseCost:
    sms = scan.sms
    G = sms * ctas_per_sm
    ntiles = max(1, math.ceil(N / bn))
    ksteps = max(1, math.ceil(K / bk))
    kb = min(bk, K)
    B = bn * kb * es
    elems = bn * bk / (32 * warps)
    issue_us = B / (p.cta_gbps * 1e3) + p.elem_ns * elems / 1e3
    t_step = p.lat_us + issue_us
    cta_rate = min(B * (1 + prefetch) / t_step, B / issue_us)          # bytes/us, one CTA
    seg_eff = 1.0 / (1.0 + p.seg * (min(G, ntiles) * bn) / (kb * es))
    total = float(ntiles * ksteps * B)

    def chip_rate(active_ctas: int) -> float:
        # `spread`: the first sms CTAs land on distinct SMs (measured placement on the H200)
        act_sms = min(sms, active_ctas) if spread else min(sms, math.ceil(active_ctas / ctas_per_sm))
        return min(active_ctas * cta_rate, scan.bandwidth_gbps(act_sms) * 1e3 * seg_eff)

    active = min(G, ntiles)
    rounds = math.ceil(ntiles / G)
    synced = max(total / chip_rate(active), rounds * ksteps * B / cta_rate)
    overlapped = total / chip_rate(G)
    # round-robin from task 0 gives CTA 0 ceil(tiles/G) tiles in every phase: at full concurrency it
    # gets a 1/G share of the chip, so its extra tiles are extra time even without barriers
    busiest = max(overlapped, rounds * G * ksteps * B / chip_rate(G))
    return PhaseCost(total, synced, overlapped, busiest, ntiles, rounds)


# ---- calibration against the stream-ceiling rows ---------------------------------------------------
def load_stream_rows() -> list[dict[str, Any]]:
    """The stream-ceiling rows (STREAM_TABLE) with a tok/s (failed launches dropped)."""
    d = json.loads(STREAM_TABLE.read_text())
    return [r for r in d["rows"] if "tok_s" in r]


def _llama1b_phases() -> list[tuple[int, int]]:
    H, I, L, V, QKV = 2048, 8192, 16, 128256, (32 + 2 * 8) * 64
    ph: list[tuple[int, int]] = []
    for _ in range(L):
        ph += [(QKV, H), (H, H), (2 * I, H), (H, I)]
    return ph + [(V, H)]


def predict_stream(bn: int, bk: int, warps: int, G: int, sync: int, scan: ScanModel | None = None,
                   params: SimParams | None = None) -> float:
    """tok/s of the stream kernel (stream all Llama-3.2-1B matrices; sync 1 = grid barrier per phase)."""
    scan = scan or synthetic_h200()
    p = params or FITTED
    c = max(1, G // scan.sms)
    t = 0.0
    from collections import Counter
    for (N, K), n in Counter(_llama1b_phases()).items():
        pc = phase_cost(N, K, bn, bk, warps, c, 0, scan, p)
        t += n * (pc.synced_us + scan.barrier_us(G) + p.refill_us if sync else pc.busiest_us)
    return 1e6 / t


def _errors(rows: list[dict[str, Any]], scan: ScanModel, p: SimParams) -> np.ndarray:
    pred = np.array([predict_stream(r["BN"], r["BK"], r["warps"], r["G"], r["sync"], scan, p) for r in rows])
    meas = np.array([r["tok_s"] for r in rows], float)
    return (pred - meas) / meas


def calibration_error(params: SimParams | None = None, scan: ScanModel | None = None) -> dict[str, Any]:
    """Median / max abs % error of the stream model against the stream-ceiling rows."""
    rows = load_stream_rows()
    e = np.abs(_errors(rows, scan or synthetic_h200(), params or FITTED)) * 100
    return {"median_abs_pct": float(np.median(e)), "max_abs_pct": float(e.max()), "rows": len(rows),
            "table": STREAM_TABLE.name}


_FREE = ("lat_us", "cta_gbps", "elem_ns", "seg", "refill_us")


def fit_params(scan: ScanModel | None = None, iters: int = 1500) -> SimParams:
    """Fit the free parameters to the stream-ceiling rows: Nelder-Mead on log-parameters, loss = mean
    |log ratio|."""
    rows = load_stream_rows()
    scan = scan or synthetic_h200()
    base = SimParams()

    def mk(x: np.ndarray) -> SimParams:
        return SimParams(**{**asdict(base), **{k: float(math.exp(v)) for k, v in zip(_FREE, x)}})

    def loss(x: np.ndarray) -> float:
        e = _errors(rows, scan, mk(x))
        return float(np.mean(np.abs(np.log1p(e))))

    x0 = np.log([getattr(base, k) for k in _FREE])
    return mk(_nelder_mead(loss, x0, iters))


def _nelder_mead(f, x0: np.ndarray, iters: int, step: float = 0.4) -> np.ndarray:
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(vals)
        simplex = [simplex[i] for i in order]
        vals = [vals[i] for i in order]
        c = np.mean(simplex[:-1], axis=0)
        xr = c + (c - simplex[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = c + 2 * (c - simplex[-1])
            fe = f(xe)
            simplex[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = xr, fr
        else:
            xc = c + 0.5 * (simplex[-1] - c)
            fc = f(xc)
            if fc < vals[-1]:
                simplex[-1], vals[-1] = xc, fc
            else:
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (s - simplex[0]) for s in simplex[1:]]
                vals = [vals[0]] + [f(s) for s in simplex[1:]]
    return simplex[int(np.argmin(vals))]


# ---- measured engine rows (bench/h200 JSON -> tune/data/h200-engine-measurements.parquet) ----------
ENGINE_TABLE = Path(__file__).resolve().parent / "data" / "h200-engine-measurements.parquet"

# Each measurement file: which engine code ran, which EngineConfig defaults the sweep keys are relative to,
# and whether the breakdown's "other" is trustworthy. Reconstructed from git history (engine_config.py) and
# docs/engine-notes.md; the commit is the checkout the device ran (its tree, not a clean HEAD).
_OLD_DEFAULTS = dict(mode="targeted", ctas_per_sm=4, num_warps=4, block_k=2048, bn_qkv=4, bn_o=4, bn_gate_up=4,
                     bn_down=4, bn_lm=8, sync_rows=0, prefetch=2, mapping="round-robin", attn_block=64,
                     weight_ring=0, attn_tile=0)
_SPLIT_DEFAULTS = dict(_OLD_DEFAULTS, ctas_per_sm=2, bn_qkv=8, bn_o=8, bn_down=8, bn_lm=8, sync_rows=8192,
                       prefetch=0)
_NEW_DEFAULTS = dict(_SPLIT_DEFAULTS, bn_gate_up=8)
_SYNC4K_DEFAULTS = dict(_NEW_DEFAULTS, sync_rows=4096, attn_block=32)
# the engine as it runs by default on sm_90 (engine_config.sm90_default; for sheared-llama-2.7b its span-K
# tiling): the weight ring
_RING_LLAMA_DEFAULTS = dict(_SYNC4K_DEFAULTS, weight_ring=3, attn_block=64, bn_gate_up=4)
_RING_SHEARED_DEFAULTS = dict(_SYNC4K_DEFAULTS, weight_ring=3, attn_block=64, attn_tile=32, block_k=4096, bn_qkv=4,
                              bn_o=4, bn_gate_up=2, bn_down=2, bn_lm=4)
_SOURCES = [
    # (file, git revision of the file (None = working tree), engine commit, version note, defaults,
    #  attention split, new tokens per run, breakdown 'other' valid)
    ("bench/h200/engine_check_2026-11-29.json", None, "368bff3",
     "L2 prefetch of upcoming tiles, register cap (maxnreg), per-KV-head attention", _OLD_DEFAULTS, False, 256, False),
    ("bench/h200/engine_sweep_2026-11-29.json", None, "fe28f46",
     "attention history block loaded before the wait, per-KV-head attention", _OLD_DEFAULTS, False, 256, False),
    ("bench/h200/llama-3.2-1b.json", "7727f49", "4c955f7",
     "defaults from the sweep (2 CTAs/SM, 8-row tiles), per-KV-head attention", _NEW_DEFAULTS, False, 512, True),
    ("bench/h200/sheared-llama-2.7b.json", "0bd2947", "4c955f7",
     "defaults from the sweep (2 CTAs/SM, 8-row tiles), per-KV-head attention", _NEW_DEFAULTS, False, 512, True),
    ("bench/h200/engine_check_attnsplit_2026-11-29.json", None, "541e351",
     "attention split over cache positions (last arriver merges), HF rounding points", _SPLIT_DEFAULTS, True, 256,
     True),
    ("bench/h200/llama-3.2-1b.json", "dd110d4", "1abbc77",
     "attention split, bn_gate_up 8", _NEW_DEFAULTS, True, 512, True),
    ("bench/h200/llama-3.2-1b.json", "1e57fc0", "598343f",
     "acquire polls, weight tiles loaded evict_first", _NEW_DEFAULTS, True, 512, True),
    ("bench/h200/llama-3.2-1b.json", "857433a", "099da93",
     "sync_rows 4096, attn_block 32 (current defaults)", _SYNC4K_DEFAULTS, True, 512, True),
    ("bench/h200/engine_check_attn_sync_2026-11-29.json", None, "e913ee4",
     "attention block / wait granularity sweep", _NEW_DEFAULTS, True, 256, True),
    # the weight ring, the default path on sm_90 (the engine as it runs now). Not here: the ring benches of the
    # engine versions before it settled (a484c6b, a713f4c, the docs/lab ring checks: a row prefetch since folded
    # into the ring, other chunk shapes)
    ("bench/h200/llama-3.2-1b.json", "73177b1", "a5d89e7",
     "weight ring (3 slots), attention splits of 64, gate_up in 4-row tiles: the engine as it runs",
     _RING_LLAMA_DEFAULTS, True, 512, True),
    ("bench/h200/sheared-llama-2.7b.json", "a9be91e", "f347ae3",
     "weight ring, kog's measured sheared-llama-2.7b config", _RING_SHEARED_DEFAULTS, True, 512, True),
    ("bench/h200/engine_check_attn_tile_2026-12-01.json", None, "6658203",
     "weight ring: attention split and tile sweep", _RING_SHEARED_DEFAULTS, True, 256, True, "sheared-llama-2.7b"),
]
# sweep keys that name a knob of an engine version the current one does not have (the row is skipped), and
# retired knobs folded into the ring (ignored)
_FOREIGN_KEYS = ("blocked_prefetch", "_SMS_CAP")
_FOLDED_KEYS = ("row_prefetch",)
_CFG_FIELDS = tuple(_OLD_DEFAULTS)
_PHASES_BD = ("qkv", "attn", "o", "gate_up", "down", "lm")


def _parse_key(key: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in filter(None, key.split(",")):
        k, v = part.split("=", 1)
        out[k] = v if k in ("mode", "mapping") else int(v)
    return out





def _bd_columns(bd: dict[str, Any] | None, other_valid: bool, traced_spt: float | None) -> dict[str, Any]:
    nan = float("nan")
    cols: dict[str, Any] = {f"bd_{k}": nan for k in ("streaming", "waiting", "barrier", "other")}
    cols.update({f"wait_{p}": nan for p in _PHASES_BD})
    cols["bd_traced_s"] = nan
    if not bd:
        return cols
    for k in ("streaming", "waiting", "barrier", "other"):
        cols[f"bd_{k}"] = float(bd.get(k, nan))
    if not other_valid:      # instrumentation bug of that version: 'other' held the wall time of the trace
        cols["bd_other"] = nan
    phases = bd.get("phases") or {}
    for p in _PHASES_BD:
        if p in phases:
            cols[f"wait_{p}"] = float(phases[p].get("waiting", nan))
    cols["bd_traced_s"] = float(traced_spt) if (traced_spt and other_valid) else nan
    return cols


def _read_source(root: Path, rel: str, rev: str | None) -> dict[str, Any] | None:
    if rev is None:
        p = root / rel
        return json.loads(p.read_text()) if p.exists() else None
    import subprocess
    try:
        txt = subprocess.run(["git", "-C", str(root), "show", f"{rev}:{rel}"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return json.loads(txt)


def extract_engine_measurements(root: str | Path):
    """Every measured engine config of the bench JSON under `root` (a kog checkout: _SOURCES names the files
    and the git revisions to read them at) as one tidy DataFrame (full EngineConfig per row).

    tok_s is max(runs): the first run of a pair was a cold launch (compile + first touch) in the sweeps."""
    import pandas as pd
    root = Path(root)
    rows: list[dict[str, Any]] = []
    for rel, rev, commit, note, defaults, split, new_tokens, other_ok, *sweep_model in _SOURCES:
        d = _read_source(root, rel, rev)
        if d is None:
            continue
        src = rel + (f"@{rev}" if rev else "")
        base = dict(source=src, engine_commit=commit, engine_version=note, attn_split=split)
        if "systems" in d:       # kogtune bench: kog-targeted / kog-grid with the defaults of that commit
            for name, s in d["systems"].items():
                if not name.startswith("kog-"):
                    continue
                cfg = dict(defaults, mode=name.split("-", 1)[1])
                extra = s.get("breakdown_extra") or {}
                bd = dict(s.get("breakdown") or {}, phases=extra.get("phases"))
                rows.append(dict(base, label=name, model=d["model"], **cfg, new_tokens=int(s["new_tokens"]),
                                 tok_s=float(max(s["runs_tok_per_s"])), tok_s_recorded=float(s["tok_per_s"]),
                                 runs=json.dumps(s["runs_tok_per_s"]), regs=float("nan"), spills=float("nan"),
                                 **_bd_columns(bd, other_ok, extra.get("seconds_per_token_traced"))))
            continue
        for section in ("llama1b_perf", "sweep"):
            for key, v in (d.get(section) or {}).items():
                if "tok_s" not in v:
                    continue
                if "config" in v:
                    c = v["config"]
                    over = dict(ast.literal_eval(c) if isinstance(c, str) else c)
                elif section == "llama1b_perf":
                    over = {"mode": key}
                else:
                    over = _parse_key(key)
                if any(k in over for k in _FOREIGN_KEYS):
                    continue
                cfg = dict(defaults, **{k: x for k, x in over.items() if k not in _FOLDED_KEYS})
                bd = v.get("breakdown")
                rows.append(dict(base, label=f"{section}:{key}", model=(sweep_model or ["llama-3.2-1b"])[0], **cfg,
                                 new_tokens=new_tokens,
                                 tok_s=float(max(v["runs"])), tok_s_recorded=float(v["tok_s"]),
                                 runs=json.dumps(v["runs"]), regs=float(v.get("regs", "nan")),
                                 spills=float(v.get("spills", "nan")),
                                 **_bd_columns(bd, other_ok, (bd or {}).get("seconds_per_token"))))
    df = pd.DataFrame(rows)
    for f in ("ctas_per_sm", "num_warps", "block_k", "bn_qkv", "bn_o", "bn_gate_up", "bn_down", "bn_lm",
              "sync_rows", "prefetch", "attn_block", "weight_ring", "attn_tile", "new_tokens"):
        df[f] = df[f].astype("int64")
    return df


def load_engine_measurements():
    """The committed table (tune/data/h200-engine-measurements.parquet)."""
    import pandas as pd
    return pd.read_parquet(ENGINE_TABLE)


# ---- the real engine -----------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineParams:
    """Free parameters of the engine model (fitted by fit_engine_params() to the measured rows)."""
    lat_us: float = 2.0          # dependent weight-chunk load latency under load (one HBM round trip per chunk)
    lat_pf_us: float = 1.0       # the same when the task's tile was L2-prefetched by the task before (l2_prefetch)
    warp_gbps: float = 8.0       # how fast one warp issues/drains a chunk (GB/s): cta rate = warps * this ...
    sm_gbps: float = 60.0        # ... capped at this SM's drain rate shared by its co-resident CTAs (GB/s)
    bw_frac: float = 0.85        # share of the scan's streaming bandwidth the engine can reach
    task_us: float = 0.7         # per task: decode, offsets, output store, counter release (measured ~0.7)
    spill_us: float = 0.5        # per weight chunk at 100 spilled registers (local-memory round trips) ...
    spill_pow: float = 1.5       # ... growing as (spills / 100) ** spill_pow: past ~150 the weight tile itself spills
    pf_us: float = 0.3           # per task with l2_prefetch: the prefetch's fixed issue cost (task-row reads, branch)
    pf_kb_us: float = 0.02       # per task with l2_prefetch and per KiB of its tile: one prefetch per 128-byte line
    chain_us: float = 9.0        # per layer: qkv -> attention -> (merge) -> o release/acquire chain, fixed part
    refill_us: float = 2.0       # per grid barrier: pipeline drain + refill beyond the scan's barrier latency
    poll_us: float = 0.05        # per counter a task checks (targeted mode)
    wait_chunk_us: float = 0.1   # targeted mode, per weight chunk: the wait check between its load and its use
    token_us: float = 20.0       # per token: argmax hand-off, embedding row, token flag
    ring_hide: float = 1.0       # weight ring: each slot past the first hides this share of a chunk's load latency
    ring_chunk_us: float = 0.1   # weight ring, per chunk: the slot's mbarrier wait and the next bulk copy's issue
    ring_fixed: float = 1.0      # weight ring: its per-task and per-layer fixed costs (task_us, chain_us, token_us)
                                 # as a share of the register path's: task rows come through shared memory


# Fitted by fit_engine_params() to the engine rows (ENGINE_TABLE, the weight-ring rows of the current engine
# among them) plus the measured sweep (SWEEP_TABLE); refit with `python -m kog.tune.simulator --fit-engine`.
# Its errors: docs/simulator.md, error_summary().
ENGINE_FITTED = EngineParams(lat_us=0.7474, lat_pf_us=0.4996, warp_gbps=7.912, sm_gbps=36.25, bw_frac=1.0,
                             task_us=0.2106, spill_us=1.18, spill_pow=2.167, pf_us=0.3083, pf_kb_us=0.0178,
                             chain_us=8.887, refill_us=0.1633, poll_us=0.1977, wait_chunk_us=0.1019, token_us=50.74,
                             ring_hide=7.961, ring_chunk_us=0.01329, ring_fixed=0.701)

MIN_REGS = 96            # ASSUMED: below this register cap the kernel is taken as not runnable (never measured < 128)
# Register demand of the compiled kernel = REG_BASE + the largest weight chunk held per thread (w), in targeted
# mode + REG_TARGETED + TARGETED_TILE * w (the chunk's load is issued before the wait, so the tile is live across
# the spin loop); ptxas spills SPILL_QUAD * shortfall^2 (few for a small shortfall: it first evicts cheap
# long-lived values; many once the tile itself does not fit). FITTED BY HAND to ptxas' numbers for the distinct
# kernels of the measured sweep (tune/data/sim-regreport-llama-3.2-1b-ea912ba.parquet; docs/simulator.md).
REG_BASE = 140
REG_TARGETED = 20
TARGETED_TILE = 0.5
SPILL_QUAD = 0.009
SOFTMAX_Q = 6.0          # ASSUMED: sharpness of the latency-bound / bandwidth-bound blend of a phase
MAX_SEQ = 640            # ASSUMED: cache span the split attention covers (measured: 10 splits of 64 positions)


def register_cap(cfg: EngineConfig, ctas_per_sm: int | None = None) -> int:
    """The engine's maxnreg (engine/monokernel.py): ctas_per_sm CTAs must fit in the 64K registers of an SM."""
    c = ctas_per_sm or cfg.ctas_per_sm
    return min(255, (REGS_PER_SM // (c * cfg.num_warps * 32)) // 8 * 8)


def _phase_shapes(model: ModelConfig, cfg: EngineConfig) -> list[tuple[str, int, int, int, int]]:
    """(phase, tasks, K, rows one task streams, K elements per chunk) per layer (lm: once).

    gate_up streams its gate and up tiles together with half the K chunk (kernel.py BK_GU = BK // 2): the
    same registers as one tile, twice the chunks."""
    H, I = model.hidden_size, model.intermediate_size
    if cfg.weight_ring:
        return _ring_phase_shapes(model, cfg)
    bk = cfg.block_k
    bk_gu = bk // 2 if bk >= 128 else bk
    return [("qkv", model.qkv_size // cfg.bn_qkv, H, cfg.bn_qkv, bk),
            ("o", H // cfg.bn_o, model.q_size, cfg.bn_o, bk),
            ("gate_up", I // cfg.bn_gate_up, H, 2 * cfg.bn_gate_up, bk_gu),
            ("down", H // cfg.bn_down, I, cfg.bn_down, bk),
            ("lm", lm_tiles(model.vocab_size, cfg.bn_lm), H, cfg.bn_lm, bk)]


def _ring_phase_shapes(model: ModelConfig, cfg: EngineConfig) -> list[tuple[str, int, int, int, int]]:
    """_phase_shapes with the weight ring: a chunk fills one slot, so a phase with fewer rows reads wider
    chunks (kog.engine.ring.chunk_shape; gate_up's rows are its gate and up rows)."""
    from kog.engine.layout import T_DOWN, T_GU, T_LM, T_O, T_QKV
    from kog.engine.ring import chunk_shape, phase_bn
    bn = phase_bn(cfg)
    rows_of = {"qkv": model.qkv_size, "o": model.hidden_size, "gate_up": model.intermediate_size,
               "down": model.hidden_size, "lm": model.vocab_size}
    out = []
    for name, typ in (("qkv", T_QKV), ("o", T_O), ("gate_up", T_GU), ("down", T_DOWN), ("lm", T_LM)):
        K, bkc, rows = chunk_shape(typ, H=model.hidden_size, I=model.intermediate_size, QS=model.q_size,
                                   block_k=cfg.block_k, bn=bn)
        n = lm_tiles(rows_of[name], bn[typ]) if name == "lm" else rows_of[name] // bn[typ]
        out.append((name, n, K, rows, bkc))
    return out


def estimate_spills(model: ModelConfig, cfg: EngineConfig) -> tuple[int, float]:
    """(registers, spills) the compiled kernel is expected to have: demand = REG_BASE + the largest weight chunk
    held per thread (bf16 pairs in 32-bit registers) (+ the targeted wait's share); the shortfall spills. A crude
    estimate (the kernel is one function: its worst phase decides); the GPU backend has the compiler's real
    numbers and engine/regreport.py reproduces them without a GPU. With the weight ring the weight chunk
    sits in shared memory, not registers: no spills (the ring configs measured 0)."""
    if cfg.weight_ring:
        return min(register_cap(cfg), REG_BASE), 0.0
    es = DTYPE_BYTES.get(model.dtype, 2)
    threads = 32 * cfg.num_warps
    w = max(rows * min(bk, K) * es / 4 / threads for _, _, K, rows, bk in _phase_shapes(model, cfg))
    cap = register_cap(cfg)
    demand = REG_BASE + w + (REG_TARGETED + TARGETED_TILE * w if cfg.mode == "targeted" else 0.0)
    return min(cap, int(math.ceil(demand))), float(round(SPILL_QUAD * max(0.0, demand - cap) ** 2))


def engine_max_ctas_per_sm(cfg: EngineConfig) -> int:
    """Largest ctas_per_sm the engine can launch for cfg's warps: threads, and a register cap >= MIN_REGS."""
    best = 0
    for c in range(1, 9):
        if c * 32 * cfg.num_warps <= MAX_THREADS_PER_SM and register_cap(cfg, c) >= MIN_REGS:
            best = c
    return best


def _ring_fixed_costs(p: EngineParams) -> EngineParams:
    """The fixed costs of the ring path: ring_fixed x the register path's per-task, per-layer chain and
    per-token costs."""
    import dataclasses
    f = p.ring_fixed
    return dataclasses.replace(p, task_us=p.task_us * f, chain_us=p.chain_us * f, token_us=p.token_us * f)


def _softmax(a: float, b: float, q: float = SOFTMAX_Q) -> float:
    return (a ** q + b ** q) ** (1.0 / q)


def predict_engine(model: ModelConfig, cfg: EngineConfig, scan: ScanModel | None = None,
                   params: EngineParams | None = None, *, context: int = 320, attn_split: bool = True,
                   spills: float | None = None, l2_prefetch: int = 0) -> Prediction:
    """Predicted tok/s and CTA-averaged breakdown of the real monokernel (engine/kernel.py) for one token.

    Structure (what a CTA does, from engine/plan.py): per layer qkv -> attention -> o -> gate_up -> down, then
    the LM head; tasks dealt to G = sms * ctas_per_sm persistent CTAs.
      streaming: per phase, soft-max of the latency-bound time (each task: chunks x (load latency + spill
                 cost) + bytes / CTA rate, spread over G CTAs) and the bandwidth-bound time (bytes /
                 (bw_frac * scan bandwidth)). With l2_prefetch, a task's tile was pulled into L2 by the task
                 before it: its chunks see lat_pf_us instead of lat_us.
      other:     per task task_us (+ with l2_prefetch the prefetch's issue cost: pf_us + pf_kb_us per KiB),
                 per token token_us; in targeted mode the wait check of every chunk (wait_chunk_us).
      waiting (targeted) per phase boundary: the scan's flag latency, the producer's tail (the last round
                 of its tasks: ceil(n/G) - n/G of a task time; an RMSNorm consumer or a counter covering all
                 rows waits for it) and counter polls; per layer the attention chain.
      barrier (grid): per phase boundary the scan's barrier + refill_us + the producer's tail; per layer the
                 attention phase (the chain) is spent at the barrier too.
    Mapping is not modelled (round-robin vs topology: within 1.5 % on average in the measured sweep).
    `spills`: the compiler's count if known, else estimate_spills(). `attn_split`: the current engine (one
    task per KV head and cache block, the last arriver merges); False = the older per-KV-head task looping
    over the cache. `l2_prefetch`: the L2 prefetch distance of an older engine that had one (the calibration
    rows measured on it); the current engine has none, so predict() leaves it 0."""
    scan = scan or load_scan()
    p = params or ENGINE_FITTED
    es = DTYPE_BYTES.get(model.dtype, 2)
    fit = engine_max_ctas_per_sm(cfg)
    if cfg.ctas_per_sm > fit:
        return Prediction(0.0, math.inf, {}, False,
                          f"too many blocks in cooperative launch (simulated residency: {fit} CTAs/SM fit)")
    if spills is None or not np.isfinite(spills):
        spills = estimate_spills(model, cfg)[1]
    if cfg.weight_ring:
        p = _ring_fixed_costs(p)
    L = model.num_layers
    G = scan.sms * cfg.ctas_per_sm
    cta_rate = min(p.warp_gbps * cfg.num_warps, p.sm_gbps / cfg.ctas_per_sm) * 1e3   # bytes/us one CTA drains
    bw = p.bw_frac * scan.bandwidth_gbps(scan.sms) * 1e3   # bytes/us the chip streams
    lat = p.lat_pf_us if l2_prefetch > 0 else p.lat_us      # a prefetched tile is in L2 when its task runs
    if cfg.weight_ring:
        # the ring keeps weight_ring chunks requested ahead (across tasks, phases and layers): each slot past
        # the first hides ring_hide of a chunk's load latency; every chunk waits on its slot's mbarrier
        lat = lat / (1.0 + p.ring_hide * (cfg.weight_ring - 1)) + p.ring_chunk_us
    per_chunk = lat + p.spill_us * (spills / 100.0) ** p.spill_pow
    counter_rows = cfg.sync_rows or cfg.block_k
    targeted = cfg.mode != "grid"

    stream = wait = barrier = other = 0.0
    t_task: dict[str, float] = {}
    tail: dict[str, float] = {}
    for name, n, K, rows, bk in _phase_shapes(model, cfg):
        reps = 1 if name == "lm" else L
        chunks = math.ceil(K / bk)
        task_bytes = rows * K * es
        lat_bound = n / G * (chunks * per_chunk + task_bytes / cta_rate)
        bw_bound = n * task_bytes / bw
        per_task = p.task_us + (p.pf_us + p.pf_kb_us * task_bytes / 1024 if l2_prefetch > 0 else 0.0) \
            + (p.wait_chunk_us * chunks if targeted else 0.0)
        stream += reps * _softmax(lat_bound, bw_bound)
        other += reps * n / G * per_task
        # a task's wall time when the chip is busy (the phase's time per task round)
        t_task[name] = (_softmax(lat_bound, bw_bound) / max(n / G, 1e-9)) + per_task
        tail[name] = (math.ceil(n / G) - n / G) * t_task[name]

    # attention: per layer a chain of dependent steps between the last qkv tile and the first o tile
    blk_bytes = 2 * cfg.attn_block * model.head_dim * es
    if attn_split:
        n_attn = model.num_kv_heads * math.ceil(MAX_SEQ / cfg.attn_block)
        seq_blocks, merge = 1, p.lat_us
    else:
        n_attn = model.num_kv_heads
        seq_blocks, merge = max(1, math.ceil(context / cfg.attn_block)), 0.0
    chain = p.chain_us + seq_blocks * blk_bytes / cta_rate + (seq_blocks - 1) * p.lat_us + merge
    other += L * n_attn / G * p.task_us

    prev = {"qkv": "down", "o": None, "gate_up": "o", "down": "gate_up", "lm": "down"}
    reads = {"qkv": model.hidden_size, "o": model.q_size, "gate_up": model.hidden_size,
             "down": model.intermediate_size, "lm": model.hidden_size}
    needs_all = {"qkv": True, "o": False, "gate_up": True, "down": False, "lm": True}   # RMSNorm first
    shapes = {s[0]: s for s in _phase_shapes(model, cfg)}
    if not targeted:
        bar = scan.barrier_us(G) + p.refill_us
        for name in ("qkv", "o", "gate_up", "down"):     # 5 barriers per layer: after qkv, attn, o, gate_up, down
            barrier += L * (bar + tail[name])
        barrier += L * (bar + chain)
    else:
        for name in ("qkv", "o", "gate_up", "down", "lm"):
            reps = 1 if name == "lm" else L
            n = shapes[name][1]
            n_cnt = math.ceil(reads[name] / counter_rows)
            polls = n / G * n_cnt * p.poll_us
            src = prev[name]
            if src is None:          # o waits on attention: the chain
                exposed = chain
            else:
                full = needs_all[name] or counter_rows >= reads[name]
                exposed = tail[src] * (1.0 if full else min(1.0, counter_rows / reads[name]))
            wait += reps * (scan.flag_us + exposed + polls)
    # token hand-off: the LM head's last round, argmax over every CTA's partial result, next token's start
    other += p.token_us + tail["lm"]
    total_us = stream + wait + barrier + other
    s = total_us * 1e-6
    return Prediction(1.0 / s, s, {"streaming": stream * 1e-6, "waiting": wait * 1e-6,
                                   "barrier": barrier * 1e-6, "other": other * 1e-6})


# ---- engine calibration --------------------------------------------------------------------------
_ENGINE_FREE = ("lat_us", "lat_pf_us", "warp_gbps", "sm_gbps", "bw_frac", "task_us", "spill_us", "spill_pow", "pf_us", "pf_kb_us",
                "chain_us", "refill_us", "poll_us", "wait_chunk_us", "token_us", "ring_hide", "ring_chunk_us", "ring_fixed")
_BD_PARTS = ("streaming", "waiting", "barrier", "other")
BD_WEIGHT = 0.3          # ASSUMED: weight of the breakdown terms against the tok/s term in the fit loss


def calibration_scan() -> ScanModel:
    """The H200 scan bundled with kog (the device the rows were measured on); synthetic if absent."""
    try:
        from kog.probe.scan import bundled_scan_path
        return scan_from_dir(bundled_scan_path())
    except Exception:
        return synthetic_h200()


@dataclass(frozen=True)
class _Row:
    model: ModelConfig
    cfg: EngineConfig
    context: int
    attn_split: bool
    spills: float
    tok_s: float
    bd: tuple[float, ...]               # measured streaming, waiting, barrier, other (s/token, untraced scale)
    l2_prefetch: int = 0                # the L2 prefetch distance of the engine version the row measured


def _engine_rows(df=None) -> list[_Row]:
    from kog.engine.config import preset
    df = load_engine_measurements() if df is None else df
    out = []
    for r in df.to_dict("records"):
        cfg = EngineConfig(**{k: r[k] for k in _CFG_FIELDS if k not in RETIRED_FIELDS})
        traced = r["bd_traced_s"]
        scale = (1.0 / r["tok_s"]) / traced if np.isfinite(traced) and traced > 0 else 1.0
        bd = tuple(float(r[f"bd_{k}"]) * scale for k in _BD_PARTS)
        out.append(_Row(preset(r["model"]), cfg, 64 + r["new_tokens"] // 2, bool(r["attn_split"]),
                        float(r["spills"]), float(r["tok_s"]), bd, int(r["prefetch"])))
    return out


SWEEP_TABLE = Path(__file__).resolve().parent / "data" / "nvidia-h200-llama-3.2-1b-sweep.parquet"
# The measured sweep ran a 16-token prompt and 128 new tokens: the cache holds 16 + 64 positions on average.
SWEEP_CONTEXT = 16 + 64


def load_sweep_measurements(path: str | Path | None = None):
    """The measured sweep's rows with status ok (None when the table is absent)."""
    import pandas as pd
    path = Path(path) if path else SWEEP_TABLE
    if not path.exists():
        return None
    df = pd.read_parquet(path)
    return df[(df["status"] == "ok") & df["tok_per_s"].notna()].reset_index(drop=True)


def _sweep_rows(df=None) -> list[_Row]:
    """The sweep as calibration rows: spills unknown (NaN -> estimate_spills), split attention, no breakdown."""
    from kog.engine.config import preset
    from kog.tune.sweep import to_engine_config, PARAM_COLUMNS
    df = load_sweep_measurements() if df is None else df
    if df is None:
        return []
    nan = float("nan")
    return [_Row(preset(r.get("model", "llama-3.2-1b")), to_engine_config({k: r[k] for k in PARAM_COLUMNS}),
                 SWEEP_CONTEXT, True, nan, float(r["tok_per_s"]), (nan,) * 4, int(r.get("prefetch", 0)))
            for r in df.to_dict("records")]


def _row_predict(r: _Row, scan: ScanModel, p: EngineParams, measured_spills: bool = True) -> Prediction:
    return predict_engine(r.model, r.cfg, scan, p, context=r.context, attn_split=r.attn_split,
                          spills=r.spills if measured_spills else None, l2_prefetch=r.l2_prefetch)


def _engine_loss(rows: list[_Row], scan: ScanModel, p: EngineParams, measured_spills: bool = True) -> float:
    terms, bd_terms = [], []
    for r in rows:
        pr = _row_predict(r, scan, p, measured_spills)
        if not pr.feasible:
            terms.append(5.0)
            continue
        terms.append(abs(math.log(pr.tok_per_s / r.tok_s)))
        for k, m in zip(_BD_PARTS, r.bd):
            if np.isfinite(m) and m > 0:
                bd_terms.append(abs(math.log(max(pr.breakdown[k], 1e-9) / m)))
    return float(np.mean(terms) + (BD_WEIGHT * np.mean(bd_terms) if bd_terms else 0.0))


def _mk_engine(x: np.ndarray, base: EngineParams) -> EngineParams:
    kw = {k: float(math.exp(v)) for k, v in zip(_ENGINE_FREE, x)}
    kw["bw_frac"] = min(1.0, kw["bw_frac"])     # the engine cannot stream faster than the scan measured
    return EngineParams(**{**asdict(base), **kw})


def fit_engine_params(rows: list[_Row] | None = None, scan: ScanModel | None = None, iters: int = 3000,
                      start: EngineParams | None = None, measured_spills: bool = True) -> EngineParams:
    """Fit EngineParams to measured rows: Nelder-Mead on log-parameters, loss = mean |log(pred/meas)| of
    tok/s + BD_WEIGHT * mean |log ratio| of the breakdown parts the row has. Default rows: the engine rows
    + the measured sweep (its spills estimated)."""
    rows = _engine_rows() + _sweep_rows() if rows is None else rows
    scan = scan or calibration_scan()
    base = start or EngineParams()
    x0 = np.log([getattr(base, k) for k in _ENGINE_FREE])
    x = _nelder_mead(lambda v: _engine_loss(rows, scan, _mk_engine(v, base), measured_spills), x0, iters)
    return _mk_engine(x, base)


def engine_errors(params: EngineParams | None = None, scan: ScanModel | None = None,
                  measured_spills: bool = True):
    """Per-row prediction vs measurement (DataFrame: the table's columns + pred_tok_s, err_pct)."""
    df = load_engine_measurements()
    rows = _engine_rows(df)
    scan = scan or calibration_scan()
    p = params or ENGINE_FITTED
    preds = [_row_predict(r, scan, p, measured_spills) for r in rows]
    df = df.copy()
    df["pred_tok_s"] = [pr.tok_per_s for pr in preds]
    df["err_pct"] = (df["pred_tok_s"] - df["tok_s"]) / df["tok_s"] * 100
    for k in ("streaming", "waiting", "barrier", "other"):
        df[f"pred_{k}"] = [pr.breakdown.get(k, float("nan")) for pr in preds]
    return df


def engine_calibration_error(params: EngineParams | None = None, scan: ScanModel | None = None,
                             loo: bool = False, measured_spills: bool = True) -> dict[str, Any]:
    """Median / max abs % error of the engine model over the measured rows (in-sample with `params`,
    default ENGINE_FITTED). loo=True: leave-one-out, each row predicted by a refit on the others (slow)."""
    scan = scan or calibration_scan()
    df = engine_errors(params, scan, measured_spills)
    e = df["err_pct"].abs().to_numpy()
    out = {"rows": int(len(df)), "median_abs_pct": float(np.median(e)), "max_abs_pct": float(e.max()),
           "worst": str(df.loc[df["err_pct"].abs().idxmax(), "label"]), "scan": scan.source,
           "measured_spills": measured_spills}
    if loo:
        rows = _engine_rows()
        start = params or ENGINE_FITTED
        le = []
        for i, r in enumerate(rows):
            fp = fit_engine_params(rows[:i] + rows[i + 1:], scan, iters=LOO_ITERS, start=start,
                                   measured_spills=measured_spills)
            pr = _row_predict(r, scan, fp, measured_spills)
            le.append(abs(pr.tok_per_s - r.tok_s) / r.tok_s * 100)
        out.update(loo_median_abs_pct=float(np.median(le)), loo_max_abs_pct=float(np.max(le)))
    return out


def spearman(a, b) -> float:
    """Spearman rank correlation (average ranks for ties), numpy only."""
    def ranks(x):
        x = np.asarray(x, float)
        order = np.argsort(x, kind="mergesort")
        r = np.empty(len(x))
        r[order] = np.arange(len(x), dtype=float)
        for v in np.unique(x):            # ties share their mean rank
            m = x == v
            if m.sum() > 1:
                r[m] = r[m].mean()
        return r
    ra, rb = ranks(a), ranks(b)
    return float(np.corrcoef(ra, rb)[0, 1])


def sweep_errors(params: EngineParams | None = None, scan: ScanModel | None = None, df=None):
    """The measured sweep (SWEEP_TABLE) with pred_tok_s, err_pct (estimated spills); None when absent."""
    df = load_sweep_measurements() if df is None else df
    if df is None:
        return None
    scan = scan or calibration_scan()
    p = params or ENGINE_FITTED
    df = df.copy()
    df["pred_tok_s"] = [_row_predict(r, scan, p).tok_per_s for r in _sweep_rows(df)]
    df["err_pct"] = (df["pred_tok_s"] - df["tok_per_s"]) / df["tok_per_s"] * 100
    return df


def _sweep_summary(meas: np.ndarray, pred: np.ndarray) -> dict[str, Any]:
    e = np.abs(pred - meas) / meas * 100
    best = int(np.argmax(meas))
    pick = int(np.argmax(pred))
    return {"rows": int(len(meas)), "median_abs_pct": float(np.median(e)),
            "p90_abs_pct": float(np.percentile(e, 90)), "max_abs_pct": float(e.max()),
            "spearman": spearman(pred, meas), "measured_best_tok_s": float(meas[best]),
            "predicted_best_index": pick, "predicted_best_measured_tok_s": float(meas[pick]),
            "predicted_best_within_2pct": bool(meas[pick] >= 0.98 * meas[best])}


def sweep_calibration_error(params: EngineParams | None = None, scan: ScanModel | None = None,
                            cv: int = 0, seed: int = 0, iters: int | None = None) -> dict[str, Any] | None:
    """Error of the engine model on the measured sweep: in-sample with `params` (default ENGINE_FITTED), and
    with cv = k > 1 also k-fold cross-validated: each fold of sweep rows is predicted by a refit (started
    from `params`, CV_ITERS Nelder-Mead steps) on the other folds + the 39 engine rows. Also the ranking:
    Spearman of predicted vs measured tok/s and whether the predicted best config measures within 2 % of
    the measured best. None when the sweep table is absent."""
    df = sweep_errors(params, scan)
    if df is None:
        return None
    scan = scan or calibration_scan()
    meas = df["tok_per_s"].to_numpy(float)
    out = {"in_sample": _sweep_summary(meas, df["pred_tok_s"].to_numpy(float)), "table": SWEEP_TABLE.name}
    if cv > 1:
        rows, eng = _sweep_rows(), _engine_rows()
        fold = np.random.default_rng(seed).permutation(len(rows)) % cv
        pred = np.empty(len(rows))
        for f in range(cv):
            train = eng + [r for r, k in zip(rows, fold) if k != f]
            fp = fit_engine_params(train, scan, iters=iters or CV_ITERS, start=params or ENGINE_FITTED)
            for i in np.flatnonzero(fold == f):
                pred[i] = _row_predict(rows[i], scan, fp).tok_per_s
        out["cv"] = dict(_sweep_summary(meas, pred), folds=cv, seed=seed)
    return out


def error_summary(params: EngineParams | None = None, scan: ScanModel | None = None) -> dict[str, Any]:
    """The engine model's error in one line for a report: median / max |relative error| of tok/s over every
    measured row it was fitted to (the engine rows, the weight-ring rows among them, and the measured sweep),
    in-sample with `params` (default ENGINE_FITTED)."""
    scan = scan or calibration_scan()
    eng = engine_errors(params, scan)
    errs = list(eng["err_pct"].abs())
    ring = eng[eng["weight_ring"] > 0]["err_pct"].abs() if "weight_ring" in eng else eng.iloc[0:0]["err_pct"]
    sw = sweep_errors(params, scan)
    if sw is not None:
        errs += list(sw["err_pct"].abs())
    e = np.asarray(errs, float)
    return {"rows": int(e.size), "median_abs_pct": round(float(np.median(e)), 2),
            "max_abs_pct": round(float(e.max()), 1),
            "ring_rows": int(len(ring)), "ring_median_abs_pct": round(float(ring.median()), 2) if len(ring) else None,
            "ring_max_abs_pct": round(float(ring.max()), 1) if len(ring) else None,
            "against": f"{len(eng)} engine configs ({len(ring)} with the weight ring) and "
                       f"{0 if sw is None else len(sw)} sweep configs measured on the H200, in-sample"}


CV_ITERS = 1500          # refit iterations per fold, started from the full fit


LOO_ITERS = 400          # refit iterations per left-out row, started from the full fit


def predict(model: ModelConfig, cfg: EngineConfig, scan: ScanModel | None = None,
            params: EngineParams | None = None, context: int = 320) -> Prediction:
    """The engine model (predict_engine) for the current engine: split attention, estimated spills."""
    return predict_engine(model, cfg, scan, params, context=context, attn_split=True)


# Tensor parallelism: defaults where the scan has no p2p tables, measured on 2 x H200 over NVLink (one-way flag,
# peer copy; docs/simulator.md).
TP_FLAG_US = 1.5
TP_PEER_GBPS = 660.0
TP_EXCHANGES_PER_LAYER = 2   # after O (attention partial sums) and after down (MLP partial sums)


def predict_tp(model: ModelConfig, cfg: EngineConfig, G: int, exchange_rows: int,
               scan: ScanModel | None = None, params: EngineParams | None = None, context: int = 320) -> Prediction:
    """Tensor-parallel engine (kog.engine.tp_monokernel) over G GPUs: one rank's engine-model prediction on
    its shard (kog.engine.tp.shard_config: heads, intermediate and vocab divided by G) plus the exchange.

    Exchange (breakdown part 'exchange'): per layer TP_EXCHANGES_PER_LAYER points, each exposing one
    cross-GPU flag latency (the scan's p2p_flag_us when the scan has kogprobe's p2p tables, else TP_FLAG_US,
    the measured 2 x H200 median) plus one chunk's partial sums (exchange_rows fp32 values to each of the
    G - 1 peers) over the peer bandwidth (scan p2p_gbps, else TP_PEER_GBPS); plus one flag per token for the
    ranks' pick exchange. The chunks before the last overlap with the producers' remaining tiles (that is
    what the chunking is for), so only the last chunk is counted.
    UNCALIBRATED: no term here is fitted to TP measurements (docs/simulator.md; tests/test_tune_tp.py
    compares it with the few there are)."""
    from kog.engine.config import ConfigError
    from kog.engine.tp import shard_config
    scan = scan or load_scan()
    try:
        shard = shard_config(model, G)
    except ConfigError as e:
        return Prediction(0.0, math.inf, {}, feasible=False, reason=str(e))
    base = predict(shard, cfg, scan, params, context=context)
    if not base.feasible:
        return base
    flag_us = scan.p2p_flag_us if scan.p2p_flag_us else TP_FLAG_US
    gbps = scan.p2p_gbps if scan.p2p_gbps else TP_PEER_GBPS
    chunk_us = exchange_rows * 4 * (G - 1) / (gbps * 1e3)      # fp32 partials; GB/s -> bytes/us = 1e3
    ex_us = model.num_layers * TP_EXCHANGES_PER_LAYER * (flag_us + chunk_us) + flag_us
    s = base.seconds_per_token + ex_us * 1e-6
    return Prediction(1.0 / s, s, {**base.breakdown, "exchange": ex_us * 1e-6})


def trial_error(rows: Iterable[dict[str, Any]], model: ModelConfig, scan: ScanModel | None = None) -> dict[str, Any]:
    """Simulator error against real trials: rows of {params (EngineConfig fields)..., 'tok_per_s'}.

    Returns median / max abs % error over the rows with a measured tok/s and a feasible prediction."""
    scan = scan or load_scan()
    fields = set(EngineConfig.__dataclass_fields__) - set(RETIRED_FIELDS)
    errs = []
    for r in rows:
        meas = r.get("tok_per_s")
        if meas is None or not np.isfinite(meas) or meas <= 0:
            continue
        cfg = EngineConfig(**{k: v for k, v in r.items() if k in fields})
        pr = predict(model, cfg, scan)
        if pr.feasible:
            errs.append(abs(pr.tok_per_s - meas) / meas * 100)
    if not errs:
        return {"n": 0, "median_abs_pct": None, "max_abs_pct": None}
    return {"n": len(errs), "median_abs_pct": float(np.median(errs)), "max_abs_pct": float(np.max(errs))}


def study_error(study, model: ModelConfig, scan: ScanModel | None = None) -> dict[str, Any]:
    """trial_error over the COMPLETE trials of an Optuna study measured on the GPU."""
    import optuna
    rows = [{**t.params, "tok_per_s": t.value} for t in study.get_trials(deepcopy=False,
                                                                           states=(optuna.trial.TrialState.COMPLETE,))]
    return trial_error(rows, model, scan)


def _fmt_params(p) -> str:
    return f"{type(p).__name__}(" + ", ".join(f"{k}={v:.4g}" for k, v in asdict(p).items()) + ")"


def main(argv: list[str] | None = None) -> int:
    """python -m kog.tune.simulator [--calibration [--loo] [--cv K]] [--fit] [--fit-engine] [--extract [CHECKOUT]]"""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m kog.tune.simulator")
    ap.add_argument("--calibration", action="store_true",
                    help="errors against the stream-ceiling rows, the engine rows and the measured sweep")
    ap.add_argument("--loo", action="store_true", help="with --calibration: leave-one-out error too (~1-2 min)")
    ap.add_argument("--cv", type=int, default=0, metavar="K",
                    help="with --calibration: K-fold cross-validated error on the measured sweep too (~1-2 min)")
    ap.add_argument("--fit", action="store_true", help="refit the stream model's parameters")
    ap.add_argument("--fit-engine", action="store_true", help="refit the engine parameters to the measured rows")
    ap.add_argument("--extract", nargs="?", const=".", default=None, metavar="CHECKOUT",
                    help=f"rebuild {ENGINE_TABLE.name} from the bench JSON of a kog checkout (default: .)")
    a = ap.parse_args(argv)
    if a.extract:
        df = extract_engine_measurements(a.extract)
        from kog.fsutil import atomic_write_table
        atomic_write_table(ENGINE_TABLE, df)
        print(f"{len(df)} rows -> {ENGINE_TABLE}")
    if a.fit:
        fp = fit_params()
        print(_fmt_params(fp))
        print(calibration_error(fp))
    if a.fit_engine:
        fp = fit_engine_params()
        print(_fmt_params(fp))
        print(engine_calibration_error(fp))
        print("sweep:", sweep_calibration_error(fp))
    if a.calibration or not (a.extract or a.fit or a.fit_engine):
        print("stream ceiling:", calibration_error())
        print("engine rows:", engine_calibration_error(loo=a.loo))
        sw = sweep_calibration_error(cv=a.cv)
        if sw is None:
            print(f"measured sweep: not available ({SWEEP_TABLE.name} absent)")
        else:
            for k in ("in_sample", "cv"):
                if k in sw:
                    print(f"measured sweep ({k}):", {n: (round(v, 3) if isinstance(v, float) else v)
                                                     for n, v in sw[k].items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
