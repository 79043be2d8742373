"""Device script: `kogtune bench` of every preset (or those named), one after the other in one process, each
preset's bench JSON written as OUTDIR/<preset>.json and its run under OUTDIR/runs (`kogtune report RUN`
renders its report afterwards); then OUTDIR/all_presets.json: each preset's bench wall time (weights, copy,
references, systems) and the sum.
A later call for other presets adds to the same summary, so the bench of every preset can be split over
several device commands and still be added up.

python3 bench/all_presets.py OUTDIR [--presets a,b,...] [--tokens 256] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kog.engine.config import PRESETS

BENCHED = [p for p in PRESETS if p != "tiny"]


def bench_preset(preset: str, outdir: Path, tokens: int, repeats: int, **bench_kw) -> dict:
    """One preset's bench (run_bench; bench_kw: its other options), and what the summary keeps of it."""
    from kog.engine.monokernel import release_gpu_memory
    from kog.tune.bench import run_bench
    t0 = time.perf_counter()
    out, run = run_bench(preset, tokens=tokens, repeats=repeats, runs_dir=str(outdir / "runs"),
                         json_out=str(outdir / f"{preset}.json"), progress=False, **bench_kw)
    release_gpu_memory()            # the preset's weights go before the next preset's arrive
    return {"run": str(run), "git_commit": out["git_commit"], "bench_wall_seconds": out["wall_seconds"],
            "seconds": round(time.perf_counter() - t0, 3),
            "kog_targeted_tok_per_s": out["systems"].get("kog-targeted", {}).get("tok_per_s"),
            "limit_tok_per_s": out["limit_tok_per_s"]}


def record(outdir: Path, preset: str, entry: dict) -> dict:
    """Add one preset's entry to OUTDIR/all_presets.json (kept from earlier calls) with the sum of every
    preset's seconds; the summary as written."""
    path = outdir / "all_presets.json"
    summary = json.loads(path.read_text()) if path.exists() else {"presets": {}}
    summary["presets"][preset] = entry
    summary["total_seconds"] = round(sum(p.get("seconds", 0.0) for p in summary["presets"].values()), 3)
    path.write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--presets", default=",".join(BENCHED))
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    outdir = Path(a.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    for preset in a.presets.split(","):
        try:
            entry = bench_preset(preset, outdir, a.tokens, a.repeats)
        except Exception as e:       # one preset's failure is recorded; the others still run
            entry = {"error": f"{type(e).__name__}: {e}"[:500]}
        summary = record(outdir, preset, entry)
        print(preset, json.dumps(entry.get("seconds") or entry), flush=True)
    print("this call", round(time.perf_counter() - t0, 1), "s; all presets so far", summary["total_seconds"], "s")


if __name__ == "__main__":
    main()
