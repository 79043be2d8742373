"""Device script: the fused MLP (EngineConfig.fused_mlp) against the rule's config, same run, per preset.

For each preset, on the same random bf16 weights: the rule's config (kog.tune.store.tuned_config) and the same
with fused_mlp=1, targeted mode. Each engine's teacher-forced error over 32 tokens against the float32
reference (the bf16 weights upcast) and its greedy agreement with the bf16 reference; then ROUNDS rounds of
one launch of each in alternation (after a warm-up launch each), and one instrumented run of each (phases'
us a token, waits). The limit = the run's copy rate (read + written) / weight bytes a token.

python3 bench/fused_mlp.py OUT.json [--presets llama-3.2-1b ...] [--mode targeted|grid]
Writes OUT.json after every preset (a timeout keeps what ran). KOG_GIT_COMMIT names the commit.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
import traceback

import torch

from kog.engine.config import PRESETS
from kog.engine.monokernel import Monokernel
from kog.engine.reference import Reference
from kog.engine.weights import random_weights
from kog.provenance import git_commit
from kog.tune.bench import copy_bandwidth_GBps, first_divergence, max_rel_err, reference_fp32_logits
from kog.tune.store import tuned_config

PROMPT, NEW, ROUNDS, MAX_SEQ, CHECK, TRACED = list(range(100, 164)), 256, 3, 384, 32, 32


def references(cfg, w) -> dict:
    """Greedy tokens and teacher-forced logits of the bf16 reference, and the float32 reference's logits."""
    ref = Reference(cfg, w, MAX_SEQ)
    tokens = ref.greedy(PROMPT, CHECK)
    del ref
    fp32 = reference_fp32_logits(cfg, w, PROMPT, tokens)
    torch.cuda.empty_cache()
    return {"tokens": tokens, "fp32": fp32}


def check(mk, refs) -> dict:
    logits = mk.teacher_forced_logits(PROMPT, refs["tokens"])
    toks, _ = mk.generate(PROMPT, CHECK)
    return {"rel_err_vs_fp32_ref": max_rel_err(logits, refs["fp32"]),
            "first_divergence_vs_bf16_ref": first_divergence(toks, refs["tokens"])}


def phases(mk) -> dict:
    b = mk.breakdown(PROMPT, TRACED)
    return {"seconds_per_token_traced": b.get("seconds_per_token_traced"),
            **{c: round(b[c] * 1e6, 2) for c in ("streaming", "waiting", "barrier", "other") if b.get(c) is not None},
            "phases": {p: {"us_per_token": round(d["seconds_per_token"] * 1e6, 2),
                           "waiting_us": round((d.get("waiting") or 0.0) * 1e6, 2)} for p, d in b["phases"].items()}}


def run_preset(name: str, mode: str) -> dict:
    cfg = PRESETS[name].replace(eos_token_id=())
    w = random_weights(cfg, "cuda", seed=0, dtype=torch.bfloat16)
    refs = references(cfg, w)
    base = tuned_config(cfg, torch.device("cuda"), MAX_SEQ).replace(mode=mode)
    configs = {"rule": base, "fused": base.replace(fused_mlp=1)}
    copy = copy_bandwidth_GBps(torch.device("cuda"))
    limit = copy * 1e9 / cfg.weight_bytes_per_token()
    out = {"config": dataclasses.asdict(base), "copy_GBps": copy, "limit_tok_per_s": limit, "systems": {}}
    engines = {}
    for label, e in configs.items():
        t0 = time.time()
        mk = Monokernel(cfg, w, e, torch.device("cuda"), max_seq=MAX_SEQ, trace_tokens=8)
        mk.n_eos = 0
        out["systems"][label] = {**check(mk, refs), "build_and_check_s": round(time.time() - t0, 1),
                                 "regs": getattr(mk, "kernel_regs", None)}
        mk.generate(PROMPT, NEW)          # warm-up: the launch length's specialization, first touch
        engines[label] = mk
    runs: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(ROUNDS):
        for label, mk in engines.items():
            runs[label].append(NEW / mk.generate(PROMPT, NEW)[1])
    for label, mk in engines.items():
        s = out["systems"][label]
        s.update(tok_per_s=statistics.median(runs[label]), runs=runs[label],
                 of_limit=statistics.median(runs[label]) / limit, breakdown_us=phases(mk))
        print(name, label, round(s["tok_per_s"], 1), f"{s['of_limit']:.1%}", f"err {s['rel_err_vs_fp32_ref']:.2e}",
              flush=True)
    out["fused_over_rule"] = out["systems"]["fused"]["tok_per_s"] / out["systems"]["rule"]["tok_per_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--presets", nargs="+", default=["llama-3.2-1b"])
    ap.add_argument("--mode", default="targeted")
    a = ap.parse_args()
    doc = {"device": torch.cuda.get_device_name(), "git_commit": git_commit(), "prompt_tokens": len(PROMPT),
           "new_tokens": NEW, "max_seq": MAX_SEQ, "rounds": ROUNDS, "mode": a.mode, "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d"),
           "note": "rule = the engine's config for the preset; fused = the same with fused_mlp=1; tok/s medians "
                   "of ROUNDS launches in alternation; phases from an instrumented run of TRACED tokens",
           "presets": {}}
    for name in a.presets:
        try:
            doc["presets"][name] = run_preset(name, a.mode)
        except Exception as e:     # the next preset still runs; the error is recorded
            doc["presets"][name] = {"error": repr(e)[:500], "tb": traceback.format_exc()[-2000:]}
            print(name, "error", repr(e)[:300], flush=True)
        torch.cuda.empty_cache()
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1, default=str)


if __name__ == "__main__":
    main()
