"""Where one token's time goes, layer by layer, from an instrumented run's per-task trace (no GPU needed).

    python bench/layer_anatomy.py [RUN_DIR_OR_TIMELINE] [--system kog-targeted] [--json OUT]

Reads the `timeline` table a `kogtune bench` run writes (default: the bundled
reports/data/h200_bench_run/timeline.parquet) and, for one traced token, prints per layer the critical-path
segments between phase completions (the last task of a phase to end):

    down(l-1) -> qkv      the norm + QKV of the layer after the previous layer's hidden is complete
    qkv -> attn           attention: waits on q/k/v rows, splits, last-arriver merge
    attn -> o             the O projection after the merged attention output is published
    o -> gate_up          the gate/up projection (the largest phase: 2 x I x H weights)
    gate_up -> down       the down projection

beside each phase's weight bytes at the run's copy bandwidth (what the segment would take if it only
streamed), so the excess of each segment is the latency chain / imbalance that the engine pays there.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
SEGMENTS = (("qkv", "down"), ("attn", "qkv"), ("o", "attn"), ("gate_up", "o"), ("down", "gate_up"))


def phase_bytes(cfg) -> dict[str, int]:
    es = 2
    H, I = cfg.hidden_size, cfg.intermediate_size
    return {"qkv": cfg.qkv_size * H * es, "attn": 0, "o": H * cfg.q_size * es, "gate_up": 2 * I * H * es,
            "down": H * I * es}


def anatomy(tl: pd.DataFrame, system: str, copy_GBps: float, cfg) -> pd.DataFrame:
    t = tl[tl.system == system] if "system" in tl.columns else tl
    if t.empty:
        return pd.DataFrame()
    steps = sorted(t.step.unique())
    s = t[t.step == (steps[1] if len(steps) > 1 else steps[0])]     # the first traced token has the start-up
    ends = s.groupby(["layer", "phase"]).end_ns.max()
    pb = phase_bytes(cfg)
    rows = []
    for layer in sorted(s[s.phase != "lm"].layer.unique()):
        for ph, prev in SEGMENTS:
            prev_layer = layer - 1 if ph == "qkv" else layer
            if (prev_layer, prev) not in ends or (layer, ph) not in ends:
                continue
            us = (ends[(layer, ph)] - ends[(prev_layer, prev)]) / 1e3
            stream = pb[ph] / (copy_GBps * 1e3)          # bytes / (GB/s) in us
            rows.append(dict(layer=int(layer), segment=f"{prev}->{ph}", us=us, stream_us=stream,
                             excess_us=us - stream))
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python bench/layer_anatomy.py")
    ap.add_argument("run", nargs="?", default=str(REPO / "reports/data/h200_bench_run"),
                    help="a kogtune bench run directory (or its timeline.parquet)")
    ap.add_argument("--system", default="kog-targeted")
    ap.add_argument("--json", default=None, help="write the per-segment medians here")
    a = ap.parse_args(argv)
    p = Path(a.run)
    run = p if p.is_dir() else p.parent
    tl = pd.read_parquet(run / "timeline.parquet" if p.is_dir() else p)
    bench = json.loads((run / "bench.json").read_text())
    from kog.engine.config import PRESETS
    cfg = PRESETS.get(bench["model"])
    if cfg is None:
        print(f"layer_anatomy: model {bench['model']!r} is not a preset (byte counts need its shapes)", file=sys.stderr)
        return 2
    df = anatomy(tl, a.system, float(bench["copy_GBps"]), cfg)
    if df.empty:
        print(f"layer_anatomy: no traced tasks of {a.system} in {run}", file=sys.stderr)
        return 2
    med = df.groupby("segment", sort=False)[["us", "stream_us", "excess_us"]].median().round(2)
    per_layer = df.groupby("layer").us.sum()
    print(f"{bench['model']} {a.system}, {run.name}: median per layer (us), streaming at {bench['copy_GBps']:.0f} GB/s")
    print(med.to_string())
    print(f"layer span median {per_layer.median():.1f} us (streaming alone {med.stream_us.sum():.1f} us); "
          f"x {len(per_layer)} layers = {per_layer.sum():.0f} us of the token")
    if a.json:
        Path(a.json).write_text(json.dumps({"model": bench["model"], "system": a.system, "run": run.name,
                                            "median_us": med.reset_index().to_dict("records"),
                                            "layer_span_median_us": float(per_layer.median())}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
