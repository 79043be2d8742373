"""Where one token's time goes, layer by layer, from an instrumented run's per-task trace (no GPU needed).

    python -m kog.reports.layer_anatomy [RUN_DIR] [--system kog-targeted] [--json OUT] [--hops] [--tails]
                                        [--streaming] [--gaps] [--attn ATTN_PARQUET]

Reads the `timeline` table and bench.json of a `kogtune bench` run directory (default: the bundled
reports/data/h200_bench_run) and prints, per critical-path segment of a layer (the last task of one phase
ending to the last of the next: down(l-1) -> qkv -> attn -> o -> gate_up -> down), the median over the layers
of the measured time, what the phase's weight bytes take at the run's copy rate, and the excess (the latency
chain and imbalance paid there). The engine report shows the same table (kog.reports.bench_tables).
--hops adds what each segment is made of (kog.reports.bench_tables.hop_table: the last CTA's lag, the
hand-off, the first and later tasks; the hop anatomy in docs/engine-notes.md). --tails adds why each GEMV
phase's last CTA is last, over every traced token (kog.reports.bench_tables.tail_table: it began late, waited
more, streamed longer or had more tasks; whether the same CTA is last again the next token). --streaming adds
how many CTAs keep the weight stream going over the token, by phase (kog.reports.bench_tables.streaming_table:
the time too few CTAs stream to keep the HBM busy is where a wait costs). --gaps adds the gaps between a
CTA's consecutive tasks by the phases on either side (kog.reports.bench_tables.gap_table: the task rows'
decode and the publishes, most of the breakdown's "other"; runs traced with publish stamps split each publish
into its CTA barrier and its release fence). RUN_DIR may also be a
timeline parquet that bench/engine_check.py --save-timeline wrote (no bench.json: no streaming columns).
--attn adds, from the split stamps that `--save-timeline --attn-stamps` wrote beside it (attn_t<i>.parquet),
when each attention split starts, ends its wait and ends against its layer's qkv phase end
(kog.reports.bench_tables.attn_split_timing; the attention hop in docs/engine-notes.md).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from kog.reports.bench_tables import (attn_split_timing, critical_path_table, gap_table, hop_table, layer_segments,
                                      model_shapes_of, phase_weight_bytes, streaming_table, tail_table)

from kog.reports.cli import BUNDLED_BENCH_RUN


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kog.reports.layer_anatomy")
    ap.add_argument("run", nargs="?", default=str(BUNDLED_BENCH_RUN),
                    help="a kogtune bench run directory, or an engine_check.py timeline parquet")
    ap.add_argument("--system", default="kog-targeted")
    ap.add_argument("--json", default=None, help="write the per-segment medians here")
    ap.add_argument("--hops", action="store_true", help="also what each segment is made of (hop_table)")
    ap.add_argument("--tails", action="store_true", help="also why each phase's last CTA is last (tail_table)")
    ap.add_argument("--streaming", action="store_true",
                    help="also how many CTAs stream over the token, by phase (streaming_table)")
    ap.add_argument("--gaps", action="store_true",
                    help="also the gaps between a CTA's consecutive tasks, by the phases around them (gap_table)")
    ap.add_argument("--attn", default=None, metavar="ATTN_PARQUET",
                    help="also the attention splits' timing from this split-stamps parquet (attn_split_timing)")
    a = ap.parse_args(argv)
    run = Path(a.run)
    try:
        attn = pd.read_parquet(a.attn) if a.attn else None
    except (OSError, ValueError) as e:
        print(f"layer_anatomy: {a.attn} is not a split-stamps parquet ({type(e).__name__})", file=sys.stderr)
        return 2
    try:
        if run.suffix == ".parquet":        # an engine_check.py --save-timeline file: one system, no bench.json
            tl = pd.read_parquet(run).assign(system=a.system)
            bench = {}
        else:
            tl = pd.read_parquet(run / "timeline.parquet")
            bench = json.loads((run / "bench.json").read_text())
    except (OSError, ValueError) as e:
        print(f"layer_anatomy: {run} is not a bench run directory with a timeline ({type(e).__name__})",
              file=sys.stderr)
        return 2
    seg = layer_segments(tl, a.system, bench.get("copy_GBps"), phase_weight_bytes(model_shapes_of(bench)))
    if seg.empty:
        print(f"layer_anatomy: no traced tasks of {a.system} in {run}", file=sys.stderr)
        return 2
    med = critical_path_table(seg).set_index("segment").round(2)
    print(f"{bench.get('model')} {a.system}, {run.name}: median per layer (us), streaming at "
          f"{bench.get('copy_GBps', float('nan')):.0f} GB/s")
    print(med.to_string())
    if a.hops:
        print("\nwhat each segment is made of (us; median over layers)")
        print(hop_table(tl, a.system).set_index("segment").round(2).to_string())
    if a.tails:
        print("\nthe last CTA of each GEMV phase against the median CTA (us, tasks; means over tokens and layers)")
        print(tail_table(tl, a.system).set_index("phase").round(3).to_string())
    if a.streaming:
        print("\nus a token with at most 1/8 (few), 1/2 (half) or more (most) of the CTAs streaming, by the phase "
              "most of them run (means over tokens)")
        print(streaming_table(tl, a.system).set_index("phase").round(3).to_string())
    if a.gaps:
        print("\ngaps between a CTA's consecutive tasks, by the phases before and after (a CTA a token; us)")
        print(gap_table(tl, a.system).set_index(["phase", "next_phase"]).round(3).to_string())
    if a.json:
        from kog.fsutil import atomic_write_text
        atomic_write_text(a.json, json.dumps({"model": bench.get("model"), "system": a.system, "run": run.name,
                                              "median_us": med.reset_index().to_dict("records")}, indent=1) + "\n")
    if attn is not None:     # after --json: a stamps file that does not match the run costs only its own table
        at = attn_split_timing(tl, attn, a.system)
        if at.empty:
            print(f"layer_anatomy: {a.attn} has no splits of the traced token in {run}", file=sys.stderr)
            return 2
        print("\nattention splits against their layer's qkv phase end (us; median over layers and KV heads)")
        print(at.set_index("split").round(2).to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
