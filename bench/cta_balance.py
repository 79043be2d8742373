"""Device script: do the CTAs stream at different rates, the same CTAs every token, and does a plan that deals
each phase's tiles in proportion to each CTA's measured rate end the phases together (issue 24)?

Every phase ends when its slowest CTA ends, so a CTA that streams 10% slower than the median makes every
other CTA wait at every hop; the free stream (no dependencies, bench/stream_ceiling.py) hides that, the
engine does not. For each preset, on the same random bf16 weights and config (the CTA numbering by SM, so a
rate belongs to an SM, not to a program id the hardware may place elsewhere next launch):
  1. calibrate: an instrumented run of the free stream with the uniform plan; a CTA's rate = the weight bytes
     its tasks stream a token / the time from the token's start to its last task's end (median over tokens);
     how persistent the rates are (correlation of the first and second half of the tokens);
  2. targeted mode with the uniform plan (A) against the plan weighted by those rates (B), timed in
     alternation; per-phase tails (last CTA's end - median CTA's end, per layer) from an instrumented run of
     each; the free stream with the weighted plan, timed.

python3 bench/cta_balance.py OUT.json [--presets llama-3.1-8b ...]    (KOG_GIT_COMMIT names the commit)
Writes OUT.json after every preset (a timeout keeps what ran).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stream_ceiling import without_barriers  # noqa: E402

from kog.engine.config import DTYPE_BYTES, PRESETS  # noqa: E402
from kog.engine.layout import T_DOWN, T_GU, T_LM, T_O, T_QKV  # noqa: E402
from kog.engine.monokernel import Monokernel  # noqa: E402
from kog.engine.plan import Plan, check_plan, make_plan  # noqa: E402
from kog.engine.weights import random_weights  # noqa: E402
from kog.provenance import git_commit  # noqa: E402
from kog.tune.bench import copy_bandwidth_GBps  # noqa: E402
from kog.tune.store import tuned_config  # noqa: E402

PROMPT, NEW, RUNS, ROUNDS, MAX_SEQ, TRACE_TOKENS, TRACED = list(range(100, 164)), 256, 3, 2, 384, 8, 24
GEMV_PHASES = ("qkv", "o", "gate_up", "down", "lm")


class Planned(Monokernel):
    """The monokernel on a plan dealt by `cta_weight` (None: the uniform plan); `free`: grid mode's plan
    without its barriers (a measurement of the stream, never an engine)."""
    cta_weight: np.ndarray | None = None
    free = False

    def _make_plan(self, sms: int, sm_partition) -> Plan:
        plan = make_plan(self.cfg, self.ecfg, sms, sm_partition, self.attn_splits, cta_weight=self.cta_weight)
        if self.free:
            return without_barriers(plan, self.cfg, self.ecfg)
        check_plan(plan, self.cfg, self.ecfg)
        return plan


def engine(cfg, w, ecfg, weight, free: bool, traced: bool):
    cls = type("P", (Planned,), {"cta_weight": weight, "free": free})
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    mk = cls(cfg, w, ecfg.replace(mode="grid" if free else "targeted"), torch.device("cuda"), max_seq=MAX_SEQ,
             sm_partition={s: 0 for s in range(sms)}, trace_tokens=TRACE_TOKENS if traced else 0)
    mk.n_eos = 0
    mk.generate(PROMPT, NEW)
    return mk


def tok_s(mk) -> float:
    return NEW / mk.generate(PROMPT, NEW)[1]


def cta_bytes(plan: Plan, cfg, ecfg) -> np.ndarray:
    """Weight bytes each CTA's tasks stream a token."""
    es = DTYPE_BYTES.get(cfg.dtype, 2)
    H, I, QS = cfg.hidden_size, cfg.intermediate_size, cfg.q_size
    per = {T_QKV: ecfg.bn_qkv * H, T_O: ecfg.bn_o * QS, T_GU: 2 * ecfg.bn_gate_up * H, T_DOWN: ecfg.bn_down * I,
           T_LM: ecfg.bn_lm * H}
    out = np.zeros(plan.grid)
    for c in range(plan.grid):
        t = plan.tasks_of(c)[:, 0]
        out[c] = sum(per.get(int(x), 0) for x in t) * es
    return out


def cta_rates(df, plan: Plan, cfg, ecfg) -> dict:
    """Per CTA: bytes a token / (its last task's end - the token's first start), median over tokens; and the
    correlation of the rates of the first and second half of the tokens."""
    finish = df.groupby(["step", "cta"])["end_ns"].max().unstack("cta")
    start = df.groupby("step")["start_ns"].min()
    finish = finish.sub(start, axis=0).reindex(columns=range(plan.grid))
    rate = cta_bytes(plan, cfg, ecfg)[None, :] / finish.to_numpy()            # bytes per ns = GB/s
    half = len(rate) // 2
    a, b = np.nanmean(rate[:half], axis=0), np.nanmean(rate[half:], axis=0)
    med = np.nanmedian(rate, axis=0)
    sm = df.groupby("cta")["sm"].first().reindex(range(plan.grid)).to_numpy()
    return {"rate_GBps": med.tolist(), "sm": sm.tolist(), "tokens": int(len(rate)),
            "cv": float(np.nanstd(med) / np.nanmean(med)), "min_over_median": float(np.nanmin(med) / np.nanmedian(med)),
            "max_over_median": float(np.nanmax(med) / np.nanmedian(med)),
            "halves_corr": float(np.corrcoef(a, b)[0, 1]),
            "sm_pair_corr": float(np.corrcoef(med[0::2], med[1::2])[0, 1])}


def phase_tails(df) -> dict:
    """Per GEMV phase, us a token: the last CTA's end of the phase's tasks minus the median CTA's, per layer,
    summed over the layers (what the next hop waits beyond the typical CTA)."""
    g = df[df["phase"].isin(GEMV_PHASES)]
    last = g.groupby(["step", "phase", "layer", "cta"])["end_ns"].max()
    by = last.groupby(["step", "phase", "layer"])
    tail = (by.max() - by.median()).groupby(["step", "phase"]).sum().groupby("phase").mean() / 1e3
    return {p: round(float(v), 2) for p, v in tail.items()}


def tail_anatomy(df) -> dict:
    """Per GEMV phase, what makes the last CTA last (means over tokens and layers, us): how much later than the
    median CTA it began the phase, waited more within it, or streamed longer; how many more tiles it had; and
    whether the same CTA is last again the next token (the chance level is 1 / grid)."""
    g = df[df["phase"].isin(GEMV_PHASES)].copy()
    g["busy"] = g["end_ns"] - g["start_ns"] - g["wait_ns"]
    per = g.groupby(["step", "phase", "layer", "cta"]).agg(start=("start_ns", "min"), end=("end_ns", "max"),
                                                           wait=("wait_ns", "sum"), busy=("busy", "sum"),
                                                           tiles=("task", "size")).reset_index()
    out = {}
    for ph, d in per.groupby("phase"):
        rows, last_of = [], {}
        for (step, layer), e in d.groupby(["step", "layer"]):
            i = e["end"].idxmax()
            med = e[["start", "end", "wait", "busy", "tiles"]].median()
            rows.append([e.at[i, "end"] - med["end"], e.at[i, "start"] - med["start"], e.at[i, "wait"] - med["wait"],
                         e.at[i, "busy"] - med["busy"], e.at[i, "tiles"] - med["tiles"]])
            last_of[(step, layer)] = int(e.at[i, "cta"])
        r = np.mean(np.asarray(rows, dtype=np.float64), axis=0)
        same = [last_of[(s, lay)] == last_of.get((s + 1, lay)) for (s, lay) in last_of if (s + 1, lay) in last_of]
        out[ph] = {"tail_us": round(r[0] / 1e3, 3), "late_start_us": round(r[1] / 1e3, 3),
                   "more_wait_us": round(r[2] / 1e3, 3), "more_busy_us": round(r[3] / 1e3, 3),
                   "more_tiles": round(float(r[4]), 2), "same_last_next_token": round(float(np.mean(same)), 3),
                   "distinct_last_ctas": len(set(last_of.values())), "groups": len(last_of)}
    return out


def run_anatomy(name: str) -> dict:
    cfg = PRESETS[name].replace(eos_token_id=())
    w = random_weights(cfg, "cuda", seed=0, dtype=torch.bfloat16)
    base = tuned_config(cfg, torch.device("cuda"), MAX_SEQ).replace(mapping="topology")
    mk = engine(cfg, w, base, None, free=False, traced=True)
    bd = mk.breakdown(PROMPT, TRACED)
    out = {"config": dataclasses.asdict(base), "tok_per_s": statistics.median(tok_s(mk) for _ in range(RUNS)),
           "tails_us": phase_tails(bd["table"]), "anatomy": tail_anatomy(bd["table"])}
    print(name, json.dumps(out["anatomy"]), flush=True)
    return out


def run_preset(name: str) -> dict:
    cfg = PRESETS[name].replace(eos_token_id=())
    w = random_weights(cfg, "cuda", seed=0, dtype=torch.bfloat16)
    base = tuned_config(cfg, torch.device("cuda"), MAX_SEQ).replace(mapping="topology")
    copy = copy_bandwidth_GBps(torch.device("cuda"))
    limit = copy * 1e9 / cfg.weight_bytes_per_token()
    out = {"config": dataclasses.asdict(base), "copy_GBps": copy, "limit_tok_per_s": limit}
    t0 = time.time()

    fa = engine(cfg, w, base, None, free=True, traced=True)
    out["free_uniform"] = {"tok_per_s": statistics.median(tok_s(fa) for _ in range(RUNS))}
    b = fa.breakdown(PROMPT, TRACED)
    cal = cta_rates(b["table"], fa.plan, cfg, base)
    out["calibration"] = cal
    weight = np.asarray(cal["rate_GBps"])
    weight = np.where(np.isfinite(weight) & (weight > 0), weight, np.nanmedian(weight))
    out["weights_minmax"] = [float(weight.min() / np.median(weight)), float(weight.max() / np.median(weight))]
    print(name, "calibrated", {k: round(v, 3) for k, v in cal.items() if isinstance(v, float)}, flush=True)
    del fa, b
    torch.cuda.empty_cache()

    ta = engine(cfg, w, base, None, free=False, traced=True)
    tb = engine(cfg, w, base, weight, free=False, traced=True)
    runs = {"uniform": [], "weighted": []}
    for _ in range(ROUNDS):
        runs["uniform"] += [tok_s(ta) for _ in range(RUNS)]
        runs["weighted"] += [tok_s(tb) for _ in range(RUNS)]
    for label, mk in (("uniform", ta), ("weighted", tb)):
        bd = mk.breakdown(PROMPT, TRACED)
        out[f"targeted_{label}"] = {
            "tok_per_s": statistics.median(runs[label]), "runs": runs[label],
            "of_limit": statistics.median(runs[label]) / limit,
            "waiting_us": round(bd["waiting"] * 1e6, 2), "other_us": round(bd["other"] * 1e6, 2),
            "phase_waits_us": {p: round((d.get("waiting") or 0) * 1e6, 2) for p, d in bd["phases"].items()},
            "tails_us": phase_tails(bd["table"])}
        print(name, label, round(out[f"targeted_{label}"]["tok_per_s"], 1), out[f"targeted_{label}"]["tails_us"],
              flush=True)
    out["weighted_over_uniform"] = out["targeted_weighted"]["tok_per_s"] / out["targeted_uniform"]["tok_per_s"]
    del ta, tb
    torch.cuda.empty_cache()

    fb = engine(cfg, w, base, weight, free=True, traced=False)
    out["free_weighted"] = {"tok_per_s": statistics.median(tok_s(fb) for _ in range(RUNS))}
    del fb
    torch.cuda.empty_cache()
    out["seconds"] = round(time.time() - t0, 1)
    print(name, "free", round(out["free_uniform"]["tok_per_s"], 1), "->", round(out["free_weighted"]["tok_per_s"], 1),
          "targeted x", round(out["weighted_over_uniform"], 4), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--presets", nargs="+", default=["llama-3.2-1b"])
    ap.add_argument("--anatomy", action="store_true", help="only the uniform plan's tail anatomy (targeted)")
    a = ap.parse_args()
    doc = {"device": torch.cuda.get_device_name(), "git_commit": git_commit(), "prompt_tokens": len(PROMPT),
           "new_tokens": NEW, "max_seq": MAX_SEQ, "runs": RUNS * ROUNDS,
           "note": "per-CTA stream rates from the free stream's instrumented run (uniform plan, CTAs numbered by "
                   "SM); targeted mode on the uniform plan vs the plan dealt by those rates, timed in alternation "
                   "(medians); tails: last CTA's end of a phase minus the median CTA's, us a token", "presets": {}}
    for name in a.presets:
        try:
            doc["presets"][name] = run_anatomy(name) if a.anatomy else run_preset(name)
        except Exception as e:          # keep what the other presets measured
            doc["presets"][name] = {"error": f"{type(e).__name__}: {e}"}
            print(name, "failed:", e, flush=True)
        Path(a.out).write_text(json.dumps(doc, indent=1, default=str))
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
