"""Device script: what a cache sized for the model's context costs against one sized for the run. The
monokernel with the engine's config for each cache (kog.tune.store.tuned_config), random bf16 weights, a
64-token prompt, 256 new tokens, targeted mode; kog.Engine's default cache is DEFAULT_MAX_SEQ positions, the
bench sizes it to the run. Writes the JSON given as argument after every measurement (a timeout keeps what
ran).

python3 bench/cache_span.py OUT.json [--presets llama-3.2-1b ...] [--caches 384 4096] [--tag NAME]
    (KOG_GIT_COMMIT names the commit the device's copy runs)
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from kog.engine.api import DEFAULT_MAX_SEQ
from kog.engine.config import PRESETS
from kog.engine.monokernel import Monokernel
from kog.engine.weights import random_weights
from kog.provenance import git_commit
from kog.tune.store import tuned_config

PROMPT, NEW, RUNS = list(range(100, 164)), 256, 5


def time_cache(cfg, w, max_seq: int) -> dict:
    """Median tok/s of RUNS launches (after one that compiles) with a cache of max_seq positions."""
    e = tuned_config(cfg, torch.device("cuda"), max_seq)
    mk = Monokernel(cfg, w, e, torch.device("cuda"), max_seq=max_seq)
    mk.n_eos = 0
    t0 = time.perf_counter()
    mk.generate(PROMPT, NEW)
    first_s = time.perf_counter() - t0
    runs = [NEW / mk.generate(PROMPT, NEW)[1] for _ in range(RUNS)]
    out = {"tok_per_s": statistics.median(runs), "runs": runs, "first_call_s": first_s,
           "attn_splits": mk.attn_splits, "config": e.to_dict()}
    del mk
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--presets", nargs="+", default=["llama-3.2-1b"])
    ap.add_argument("--caches", nargs="+", type=int, default=[len(PROMPT) + NEW + 64, DEFAULT_MAX_SEQ])
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    doc = {"device": torch.cuda.get_device_name(), "git_commit": git_commit(), "tag": a.tag,
           "prompt_tokens": len(PROMPT), "new_tokens": NEW,
           "note": f"targeted, random bf16 weights, median of {RUNS} launches after a compiling one"}
    for name in a.presets:
        cfg = PRESETS[name].replace(eos_token_id=())
        w = random_weights(cfg, "cuda", seed=0, dtype=torch.bfloat16)
        for ms in a.caches:
            doc[f"{name}/{ms}"] = time_cache(cfg, w, ms)
            print(a.tag, name, ms, round(doc[f"{name}/{ms}"]["tok_per_s"], 1), flush=True)
            with open(a.out, "w") as f:
                json.dump(doc, f, indent=1)
        del w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
