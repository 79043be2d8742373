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


def bench_preset(preset: str, outdir: Path, tokens: int, repeats: int) -> dict:
    from kog.engine.monokernel import release_gpu_memory
    from kog.tune.bench import run_bench
    t0 = time.perf_counter()
    out, run = run_bench(preset, tokens=tokens, repeats=repeats, runs_dir=str(outdir / "runs"),
                         json_out=str(outdir / f"{preset}.json"), progress=False)
    release_gpu_memory()            # the preset's weights go before the next preset's arrive
    return {"run": str(run), "git_commit": out["git_commit"], "bench_wall_seconds": out["wall_seconds"],
            "seconds": round(time.perf_counter() - t0, 3),
            "kog_targeted_tok_per_s": out["systems"].get("kog-targeted", {}).get("tok_per_s"),
            "limit_tok_per_s": out["limit_tok_per_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--presets", default=",".join(BENCHED))
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    outdir = Path(a.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    summary_path = outdir / "all_presets.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {"presets": {}}
    t0 = time.perf_counter()
    for preset in a.presets.split(","):
        try:
            summary["presets"][preset] = bench_preset(preset, outdir, a.tokens, a.repeats)
        except Exception as e:       # one preset's failure is recorded; the others still run
            summary["presets"][preset] = {"error": f"{type(e).__name__}: {e}"[:500]}
        print(preset, json.dumps(summary["presets"][preset].get("seconds") or summary["presets"][preset]),
              flush=True)
        summary["total_seconds"] = round(sum(p.get("seconds", 0.0) for p in summary["presets"].values()), 3)
        summary_path.write_text(json.dumps(summary, indent=1) + "\n")
    print("this call", round(time.perf_counter() - t0, 1), "s; all presets so far", summary["total_seconds"], "s")


if __name__ == "__main__":
    main()
