"""Device script: the monokernel (llama-3.2-1b preset, default EngineConfig unless --set k=v) as a target for
Nsight Compute. It warms up (compile, first touch) and then runs ONE decode launch of --tokens tokens, the
launch ncu should profile:

    ncu --clock-control none --kernel-name monokernel --launch-skip 1 --launch-count 1 \
        --section SourceCounters --section WarpStateStats -o $OUT/mk python3 bench/ncu_monokernel.py
    ncu -i $OUT/mk.ncu-rep --page source --csv --print-source sass > $OUT/sass.csv

Per-instruction warp-stall samples then say where the per-task time goes (bench/h200/ENGINE_NOTES.md).
"""
from __future__ import annotations

import argparse
import json

import torch

from kog.engine.config import PRESETS
from kog.engine.engine_config import EngineConfig
from kog.engine.monokernel import Monokernel
from kog.engine.weights import random_weights


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--set", action="append", default=[], help="EngineConfig override k=v (repeatable)")
    a = ap.parse_args()
    kw = {}
    for s in a.set:
        k, v = s.split("=", 1)
        kw[k] = v if k in ("mode", "mapping") else int(v)
    cfg = PRESETS[a.model]
    w = random_weights(cfg, "cuda", seed=0)
    mk = Monokernel(cfg, w, EngineConfig(**kw), max_seq=640)
    mk.n_eos = 0
    prompt = list(range(100, 164))
    mk.generate(prompt, 8)                      # launch 0: compile and warm-up (ncu skips it)
    toks, dt = mk.generate(prompt, a.tokens)    # launch 1: the profiled one
    print(json.dumps({"tokens": len(toks), "tok_s_under_tool": len(toks) / dt, "config": kw}))


if __name__ == "__main__":
    main()
