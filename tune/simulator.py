"""Cost model of one monokernel decode step, from a probe scan (`kogtune search --backend sim`).

Deterministic: the same (ModelConfig, EngineConfig, scan) gives the same prediction. It is used in CI
(no GPU), to pre-screen configs, and to make a simulated sweep that the sampler replay is developed on.

Streaming model of one GEMV phase (N rows, K cols) with tiles of BN rows x BK columns:
  * a CTA loops over its tiles, and per tile over ceil(K/BK) steps; one step loads B = BN*BK*2 bytes and
    costs  t_step = LAT + B / CTA_GBPS + ELEM_NS * (BN*BK / threads)  (a dependent load, issue, reduce);
    with prefetch the next chunk is in flight during the current one (up to 2 chunks per CTA).
  * Little's law: an SM with c co-resident CTAs pulls c*B*(1+prefetch)/t_step; the chip is capped by the
    scan's bandwidth for the active SMs, derated for many short row segments (DRAM pages:
    1 / (1 + SEG * streams / segment_bytes)). Tiny tiles under-fill the pipeline; big ones lose co-residency.
  * grid sync: a phase lasts as long as its busiest CTA (rounds of ceil(tiles/G)), then a barrier
    (scan barrier_us(G)) plus REFILL (the pipeline drains and refills at every barrier).
  * targeted sync / no sync: phases overlap (an idle CTA moves on), so only the exposed part of each
    dependency is paid: flag latency (partly hidden by prefetch), the producer rows the consumer's first
    chunk needs (wait granularity x mapping), and a poll per counter read.
The free parameters (LAT, CTA_GBPS, ELEM_NS, SEG, REFILL) are fitted to the H200 anchor measurements of a
persistent streaming kernel (stream_ceiling_h200_2026-11-29.json, Llama-3.2-1B, 26 rows); the fit and its
error: `fit_params()`, `calibration_error()`. Against real trials: `trial_error(rows)`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, asdict
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from kog.engine.config import DTYPE_BYTES, ModelConfig
from kog.engine.engine_config import EngineConfig
from kog.tune.scan_model import ScanModel, load_scan, synthetic_h200

ANCHOR_FILE = "stream_ceiling_h200_2026-11-29.json"
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


# Fitted by fit_params() against the anchors (see calibration_error()); refit with
# `python -m kog.tune.simulator --fit` when the anchors change.
FITTED = SimParams(lat_us=0.9640, cta_gbps=36.79, elem_ns=0.08021, seg=0.09947, refill_us=3.119)
# calibration_error(FITTED) on the 26 anchor rows: median 5.2 %, max 22 % (fitted 2026-11-29 anchors)


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
def regs_per_thread(bn: int, block_k: int, num_warps: int) -> int:
    """Register estimate of one streaming CTA, rounded to the allocation granule of 8. A heuristic fitted to
    the anchors' co-residency: 8 warps could not run 2 CTAs/SM, 4 warps ran 4 CTAs/SM (BN*BK 8192); the
    warp count (cross-warp reduction) weighs more than the tile. The GPU backend asks the compiled kernel."""
    elems = bn * block_k / (32 * num_warps)
    r = 72 + 0.1 * elems + 8 * num_warps
    return int(math.ceil(r / 8) * 8)


def max_ctas_per_sm(cfg: EngineConfig, model: ModelConfig | None = None) -> int:
    """Co-resident CTAs per SM the simulator assumes for `cfg` (registers and threads)."""
    bns = [cfg.bn_qkv, cfg.bn_o, 2 * cfg.bn_gate_up, cfg.bn_down, cfg.bn_lm]
    regs = max(regs_per_thread(b, cfg.block_k, cfg.num_warps) for b in bns)
    threads = 32 * cfg.num_warps
    return max(0, min(REGS_PER_SM // (regs * threads), MAX_THREADS_PER_SM // threads, MAX_CTAS_PER_SM_HW))


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


# ---- calibration against the anchors ------------------------------------------------------------
def anchor_path() -> Path | None:
    import os
    for d in (os.environ.get("KOG_ANCHORS_DIR"), "/work/shared/anchors",
              str(Path(__file__).resolve().parents[2] / "shared" / "anchors")):
        if d and (Path(d) / ANCHOR_FILE).exists():
            return Path(d) / ANCHOR_FILE
    data = Path(__file__).resolve().parent / "data" / ANCHOR_FILE
    return data if data.exists() else None


def load_anchor_rows() -> list[dict[str, Any]]:
    """The anchor rows with a tok/s (failed launches dropped)."""
    p = anchor_path()
    if p is None:
        raise FileNotFoundError(f"anchor file {ANCHOR_FILE} not found (set KOG_ANCHORS_DIR)")
    d = json.loads(p.read_text())
    return [r for r in d["rows"] if "tok_s" in r]


def _llama1b_phases() -> list[tuple[int, int]]:
    H, I, L, V, QKV = 2048, 8192, 16, 128256, (32 + 2 * 8) * 64
    ph: list[tuple[int, int]] = []
    for _ in range(L):
        ph += [(QKV, H), (H, H), (2 * I, H), (H, I)]
    return ph + [(V, H)]


def predict_stream(bn: int, bk: int, warps: int, G: int, sync: int, scan: ScanModel | None = None,
                   params: SimParams | None = None) -> float:
    """tok/s of the anchor kernel (stream all Llama-3.2-1B matrices; sync 1 = grid barrier per phase)."""
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
    """Median / max abs % error of the simulator against the anchor rows."""
    rows = load_anchor_rows()
    e = np.abs(_errors(rows, scan or synthetic_h200(), params or FITTED)) * 100
    return {"median_abs_pct": float(np.median(e)), "max_abs_pct": float(e.max()), "rows": len(rows),
            "anchors": str(anchor_path())}


_FREE = ("lat_us", "cta_gbps", "elem_ns", "seg", "refill_us")


def fit_params(scan: ScanModel | None = None, iters: int = 1500) -> SimParams:
    """Fit the free parameters to the anchors: Nelder-Mead on log-parameters, loss = mean |log ratio|."""
    rows = load_anchor_rows()
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


# ---- the engine --------------------------------------------------------------------------------
def predict(model: ModelConfig, cfg: EngineConfig, scan: ScanModel | None = None,
            params: SimParams | None = None, context: int = 320) -> Prediction:
    """Predicted tok/s and time breakdown of one decode step of `model` under `cfg`.

    `context`: KV positions attended (prompt + half the generated tokens of a typical bench run)."""
    scan = scan or load_scan()
    p = params or FITTED
    es = DTYPE_BYTES.get(model.dtype, 2)
    fit = max_ctas_per_sm(cfg, model)
    if cfg.ctas_per_sm > fit:
        return Prediction(0.0, math.inf, {}, False,
                          f"too many blocks in cooperative launch (simulated residency: {fit} CTAs/SM fit)")
    H, I, V, L = model.hidden_size, model.intermediate_size, model.vocab_size, model.num_layers
    G = scan.sms * cfg.ctas_per_sm
    c = cfg.ctas_per_sm
    # (name, N tiles-rows, K, rows per tile, consumer needs the whole vector (RMSNorm) before it)
    layer = [("qkv", model.qkv_size, H, cfg.bn_qkv, True), ("o", H, model.q_size, cfg.bn_o, False),
             ("gate_up", I, H, cfg.bn_gate_up, True), ("down", H, I, cfg.bn_down, False)]
    spread = cfg.mapping == "topology"   # topology places tasks on distinct SMs from the scan's placement
    costs = {}
    for name, N, K, bn, _ in layer + [("lm", V, H, cfg.bn_lm, True)]:
        rows_per_tile = 2 * bn if name == "gate_up" else bn          # gate and up rows of one task
        pc = phase_cost(N * (2 if name == "gate_up" else 1), K, rows_per_tile, cfg.block_k, cfg.num_warps,
                        c, cfg.prefetch, scan, p, es, spread=spread)
        if cfg.mapping == "contiguous":    # consecutive rows per CTA: longer DRAM runs
            pc.overlapped_us /= 1.02
            pc.synced_us /= 1.02
        costs[name] = pc

    # attention, split over KV blocks (flash-decode): one task per (head, attn_block of positions), each a
    # dependent K/V block load, then a combine step
    blk_bytes = 2 * cfg.attn_block * model.head_dim * es
    t_blk = p.lat_us + blk_bytes / (p.cta_gbps * 1e3)
    attn_tasks = model.num_heads * math.ceil(context / cfg.attn_block)
    attn_us = math.ceil(attn_tasks / G) * t_blk + 0.5

    stream = wait = barrier = other = 0.0
    bar = scan.barrier_us(G) + p.refill_us
    flag = scan.flag_us * (1 - 0.6 * cfg.prefetch)
    poll = p.poll_us * (1 - 0.5 * cfg.prefetch)
    order = [n for n, *_ in layer]
    for name in order + ["lm"]:
        pc = costs[name]
        reps = 1 if name == "lm" else L
        tasks_per_cta = math.ceil(pc.tasks / G)
        other += reps * tasks_per_cta * p.task_us
        if cfg.mode == "grid":
            stream += reps * pc.overlapped_us
            barrier += reps * (bar + (pc.synced_us - pc.overlapped_us))
        else:
            # round-robin / contiguous pile every phase's extra tile on the same CTAs; the topology
            # mapping rotates the assignment per phase (and spreads over SMs), so it stays balanced
            stream += reps * (pc.overlapped_us if cfg.mapping == "topology" else pc.busiest_us)
            needs_all = dict((n, a) for n, _, _, _, a in layer + [("lm", V, H, cfg.bn_lm, True)])[name]
            prev = {"qkv": "down", "o": None, "gate_up": "o", "down": "gate_up", "lm": "down"}[name]
            tail = (costs[prev].synced_us - costs[prev].overlapped_us) if prev else 0.0
            prev_rows = {"qkv": H, "o": model.q_size, "gate_up": H, "down": I, "lm": H}[name]
            counter_rows = cfg.sync_rows or cfg.block_k
            K = prev_rows
            if needs_all:
                frac = 1.0     # RMSNorm needs every row of the producer
                n_polls = 1
            else:
                prev_time = costs[prev].overlapped_us if prev else attn_us
                frac = min(1.0, counter_rows / prev_rows) if cfg.mapping != "contiguous" else \
                    min(1.0, counter_rows * G / prev_rows)
                tail = max(tail, frac * prev_time)
                n_polls = math.ceil(K / min(counter_rows, cfg.block_k)) if cfg.sync_rows else math.ceil(K / cfg.block_k)
            wait += reps * (flag + frac * tail * 0.5 + n_polls * tasks_per_cta * poll)
    # attention waits on qkv (all heads' rows of its head) and is waited on by o
    if cfg.mode == "grid":
        barrier += L * bar
        other += L * attn_us
    else:
        wait += L * flag
        other += L * attn_us
    # sampling: argmax over the logits needs every CTA's partial result (one grid-wide step), and the launch
    samp = scan.barrier_us(G) + 1.0
    other += samp + scan.launch_us
    total_us = stream + wait + barrier + other
    s = total_us * 1e-6
    return Prediction(1.0 / s, s, {"streaming": stream * 1e-6, "waiting": wait * 1e-6,
                                   "barrier": barrier * 1e-6, "other": other * 1e-6})


def trial_error(rows: Iterable[dict[str, Any]], model: ModelConfig, scan: ScanModel | None = None) -> dict[str, Any]:
    """Simulator error against real trials: rows of {params (EngineConfig fields)..., 'tok_per_s'}.

    Returns median / max abs % error over the rows with a measured tok/s and a feasible prediction."""
    scan = scan or load_scan()
    fields = set(EngineConfig.__dataclass_fields__)
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


if __name__ == "__main__":
    import sys
    if "--fit" in sys.argv:
        fp = fit_params()
        print(fp)
        print(calibration_error(fp))
    else:
        print(calibration_error())
