"""Device script: tok/s of each in-kernel sampling mode against greedy, on one engine per sync mode
(llama-3.2-1b shapes, random bf16 weights, the tuned config, the cache sized for the run), with the
registers / spills / shared memory of the variant each mode compiled and an instrumented run's breakdown per
mode (where the sampling's extra time goes). Writes the JSON given as argument.

python3 bench/sampling_modes.py OUT.json      (KOG_GIT_COMMIT names the commit the device's copy runs)
"""
from __future__ import annotations

import json
import os
import statistics
import sys

import torch

from kog.engine.config import PRESETS
from kog.engine.kernel import monokernel as kernel
from kog.engine.monokernel import Monokernel
from kog.engine.weights import random_weights
from kog.probe.probes.common import kernel_footprint
from kog.tune.store import tuned_config

PROMPT, NEW, MAX_SEQ, RUNS = list(range(100, 164)), 256, 384, 5
BREAKDOWN_TOKENS, TRACE_TOKENS = 48, 8
MODES = {"greedy": (0.0, 0, 1.0), "temperature": (0.8, 0, 1.0), "top_k50": (0.8, 50, 1.0),
         "top_p0.9": (0.8, 0, 0.9), "top_k50_top_p0.9": (0.8, 50, 0.9)}


def compiled_variants() -> dict[int, tuple]:
    """Every compiled monokernel variant: (registers, spills, shared bytes)."""
    out = {}
    for cache in kernel.device_caches.values():
        for key, k in cache[0].items():
            k._init_handles()
            f = kernel_footprint(k)
            out[hash(key)] = (f["regs"], f["spills"], f["smem"])
    return out


def breakdown_us(mk, temperature, top_k, top_p) -> dict:
    """Microseconds per token of an instrumented run in this mode: the categories (`other` holds the token's
    end: the sampling search and the hand-off) and each phase's time and wait."""
    b = mk.breakdown(PROMPT, BREAKDOWN_TOKENS, temperature=temperature, top_k=top_k, top_p=top_p, seed=1)
    out = {c: round(b[c] * 1e6, 2) for c in ("seconds_per_token", "streaming", "waiting", "barrier", "other")
           if b.get(c) is not None}
    out["phases"] = {ph: {k: round(v * 1e6, 2) for k, v in d.items() if k in ("seconds_per_token", "waiting")}
                     for ph, d in b["phases"].items()}
    return out


def main(path: str) -> None:
    cfg = PRESETS["llama-3.2-1b"].replace(eos_token_id=())
    w = random_weights(cfg, "cuda", seed=0, dtype=torch.bfloat16)
    doc = {"device": torch.cuda.get_device_name(), "git_commit": os.environ.get("KOG_GIT_COMMIT"),
           "model": cfg.name, "prompt_tokens": len(PROMPT), "new_tokens": NEW, "max_seq": MAX_SEQ,
           "note": f"median of {RUNS} launches per mode (seeds 2..{RUNS + 1}); kernel: (registers, spills, shared "
                   "bytes) of the variant that mode compiled, [] when it reuses the previous mode's"}
    for mode in ("targeted", "grid"):
        e = tuned_config(cfg, torch.device("cuda"), MAX_SEQ).replace(mode=mode)
        mk = Monokernel(cfg, w, e, torch.device("cuda"), max_seq=MAX_SEQ, trace_tokens=TRACE_TOKENS)
        mk.n_eos = 0
        doc[mode] = {"config": e.to_dict()}
        for name, (t, k, p) in MODES.items():
            before = set(compiled_variants())
            mk.generate(PROMPT, NEW, temperature=t, top_k=k, top_p=p, seed=1)      # compiles the variant
            new = [v for h, v in compiled_variants().items() if h not in before]
            runs = [NEW / mk.generate(PROMPT, NEW, temperature=t, top_k=k, top_p=p, seed=s)[1]
                    for s in range(2, RUNS + 2)]
            doc[mode][name] = {"tok_per_s": statistics.median(runs), "runs": runs, "kernel": new,
                               "breakdown_us": breakdown_us(mk, t, k, p)}
            print(mode, name, round(statistics.median(runs), 1), new, flush=True)
        del mk
        torch.cuda.empty_cache()
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
