"""Device script: the exhaustive sweep of kog.tune.sweep.DEFAULT_SUBSPACE (108 configs) on the GPU, then a
60-trial `kogtune search` (TPE, the default sampler) of the same model, in one device call.

    python3 bench/tune_h200.py [--model llama-3.2-1b] [--budget-s 520]

Writes under $OUT (partial results survive a kill): the sweep table <device>-<model>-sweep.parquet (rewritten
every 10 configs), the search's Optuna storage search.db + its run directory runs/, the tuned-config store
tuned/, and tune_h200.json (rewritten after each phase) with: precompile s, per-trial s (median), sweep s,
search s, best config + tok/s of each, the engine-default config's tok/s measured in this run, device name,
versions, and the git commit from $KOG_GIT_COMMIT.

How the time is spent. Every trial runs in a warm worker process (kog.tune.isolation.WarmWorker: torch,
the CUDA context, the random weights and the reference logits are made once per process; a crash, hang,
OOM or CUDA error fails that trial and replaces the process). The sweep's distinct kernels compile
in parallel compile-only processes (--compile-processes) while the measuring worker already measures the
configs whose kernel is ready (the engine default's kernel first). The search asks 8 trials at a time and
compiles the next 8 while measuring.

Per-trial measurement (kog.tune.objective.TRIAL_DEFAULTS): a 16-token prompt, the correctness gate over 16
teacher-forced tokens (max_rel_err <= 2e-2 against the reference), a 16-token warm-up, a 32-token short
run (reported for pruning), then 3 timed runs of 128 tokens, median tok/s; the KV cache of `kogtune bench`'s
default run (321 positions: the kernel's build depends on it). At ~1.1 ms/token that is ~0.5 s of decoding
plus the Monokernel build and the gate: ~1 s a trial.

Wall budget: the sweep stops starting new configs at budget - search reserve (the rest of its rows are
'skipped'); the search stops asking new trials at budget - 15 s; both finish what they started.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

T0 = time.time()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--budget-s", type=float, default=520.0, help="wall budget of the whole script")
    ap.add_argument("--search-trials", type=int, default=60)
    ap.add_argument("--search-reserve-s", type=float, default=190.0,
                    help="seconds kept for the search (the sweep stops starting configs before)")
    # unset: the trials' own protocol (objective.TRIAL_DEFAULTS); a value set here reaches the search's closing
    # confirmation too, which otherwise runs the bench's longer protocol (search.CONFIRM_PROTOCOL)
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--compile-processes", type=int, default=None, help="default: CPU cores - 2")
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--study", default="tune-h200", help="the search's study name (kog.tune.promote names it)")
    ap.add_argument("--payload", default=None, help="JSON merged into every trial's payload (CPU rehearsal: "
                    "device, dtype, token counts)")
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("KOG_TUNED_DIR", str(out / "tuned"))
    os.environ.setdefault("KOG_RUNS_DIR", str(out / "runs"))
    end = T0 + a.budget_s
    extra = {k: v for k, v in (("tokens", a.tokens), ("repeats", a.repeats)) if v is not None}
    extra.update(json.loads(a.payload) if a.payload else {})
    R: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "model": a.model, "budget_s": a.budget_s,
               "git_commit": os.environ.get("KOG_GIT_COMMIT"), "trial": None, "versions": versions()}
    from kog.tune.objective import TRIAL_DEFAULTS
    R["trial"] = {**TRIAL_DEFAULTS, **extra}

    def save() -> None:
        R["elapsed_s"] = round(time.time() - T0, 1)
        from kog.fsutil import atomic_write_text
        atomic_write_text(out / "tune_h200.json", json.dumps(R, indent=1, default=str))

    try:
        from kog.probe.device import require_gpu
        dev = require_gpu()
        R["device"] = {"name": dev.name, "sms": dev.sms}
    except Exception as e:
        R["device"] = {"error": f"{type(e).__name__}: {e}"}
    save()

    # ---- the sweep --------------------------------------------------------------------------------------
    sweep_path = None
    if not a.skip_sweep:
        from kog.engine.engine_config import EngineConfig
        from kog.tune.sweep import record_sweep, sweep_path as default_path, to_engine_config
        st: dict = {}
        t = time.time()
        try:
            sweep_path = out / default_path(R["device"].get("name", "gpu"), a.model, False).name
            _, df = record_sweep(a.model, "gpu", sweep_path, timeout=120.0, payload_extra=extra, stats=st,
                                 deadline=end - a.search_reserve_s, compile_processes=a.compile_processes,
                                 progress=True)
            ok = df[df["status"] == "ok"]
            best = ok.loc[ok["tok_per_s"].idxmax()] if len(ok) else None
            dflt = EngineConfig()
            drow = [r for r in df.to_dict("records") if _same(to_engine_config(_params(r)), dflt)]
            R["sweep"] = {
                "path": str(sweep_path), "configs": int(len(df)), "measured_ok": int(len(ok)),
                "status_counts": df["status"].value_counts().to_dict(),
                "sweep_s": round(time.time() - t, 1), "precompile_s": st.get("precompile_s"),
                "kernels": st.get("kernels"), "compile_failures": len(st.get("compile_failures", {})),
                "compile_failure_examples": dict(list(st.get("compile_failures", {}).items())[:3]),
                "worker_starts": st.get("worker_starts"),
                "measured_while_compiling": st.get("measured_while_compiling"),
                "recheck_first_config": st.get("recheck"),
                "per_trial_s_median": _median(st.get("trial_wall_s")),
                "per_trial_s_p90": _pct(st.get("trial_wall_s"), 0.9),
                # in-trial parts: the first launch of each variant (~0 s when the precompiled kernel is hit)
                "in_trial_median_s": {k: _median(st.get("trial_" + k)) for k in
                                      ("compile_seconds", "gate_s", "warmup_s", "trial_s")},
                "in_trial_max_s": {k: max(st.get("trial_" + k) or [0]) for k in
                                   ("compile_seconds", "gate_s", "warmup_s", "trial_s")},
                "best": None if best is None else {"params": _params(best.to_dict()),
                                                   "tok_per_s": float(best["tok_per_s"])},
                "engine_default": drow[0] if drow else None,
                "fail_examples": df[~df["status"].isin(["ok", "skipped"])][["status", "fail_reason"]]
                .head(5).to_dict("records"),
            }
        except Exception as e:
            R["sweep"] = {"error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()[-3000:],
                          "sweep_s": round(time.time() - t, 1), "stats": st}
        save()

    # ---- the search ---------------------------------------------------------------------------------------
    t = time.time()
    try:
        from kog.tune.cli import build_parser
        args = build_parser().parse_args([
            "search", "--model", a.model, "--trials", str(a.search_trials), "--backend", "gpu",
            "--storage", f"sqlite:///{(out / 'search.db').resolve()}", "--runs-dir", str(out / "runs"),
            "--study", a.study, "--json"])
        args.payload_extra = extra
        args.compile_processes = a.compile_processes
        args.deadline = end - 15.0
        from kog.tune.search import cli_search
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = cli_search(args)
        lines = [ln for ln in buf.getvalue().splitlines() if ln.strip().startswith("{")]
        summ = json.loads(lines[-1]) if lines else {}
        R["search"] = {"rc": rc, "search_s": round(time.time() - t, 1),
                       **search_stats(out / "search.db", a.model, a.study),
                       "summary": {k: summ.get(k) for k in ("trials", "states", "fail_kinds", "best", "stored",
                                                            "run", "report")}}
    except Exception as e:
        R["search"] = {"error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()[-3000:],
                       "search_s": round(time.time() - t, 1)}
    save()
    print(json.dumps({k: R.get(k) for k in ("device", "elapsed_s")}, default=str))
    for k in ("sweep", "search"):
        v = R.get(k) or {}
        print(k, json.dumps({x: v.get(x) for x in ("sweep_s", "search_s", "per_trial_s_median", "best",
                                                   "engine_default", "confirmation", "error")}, default=str)[:1500])
    return 0


def _params(row: dict) -> dict:
    from kog.tune.sweep import PARAM_COLUMNS
    out = {}
    for k in PARAM_COLUMNS:
        v = row.get(k)
        out[k] = v.item() if hasattr(v, "item") else v
    return out


def _same(a, b) -> bool:
    return a.to_dict() == b.to_dict()


def _median(xs):
    return round(statistics.median(xs), 3) if xs else None


def _pct(xs, q):
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))], 3)


def search_stats(db: Path, model: str, study: str = "tune-h200") -> dict:
    """Per-trial walls, the engine default's trial (the initial design queues it first) and the best."""
    import optuna
    from kog.probe.device import require_gpu
    from kog.tune.search import engine_default
    from kog.tune.space import resolve_model_config
    from optuna.trial import TrialState
    st = optuna.load_study(study_name=study, storage=f"sqlite:///{db.resolve()}")
    ts = st.get_trials(deepcopy=False)
    walls = [t.user_attrs["wall_s"] for t in ts if "wall_s" in t.user_attrs]
    # the same default as the initial design's first trial (kog.tune.search.initial_design): what the
    # engine runs on this device when nothing is stored
    dev = require_gpu()
    dflt = engine_default("gpu", dev.name, dev, resolve_model_config(model)).to_dict()
    d = [t for t in ts if t.user_attrs.get("config") == dflt and t.state == TrialState.COMPLETE]
    done = [t for t in ts if t.state == TrialState.COMPLETE]
    best = max(done, key=lambda t: t.value) if done else None
    parts = {k: [t.user_attrs[k] for t in ts if k in t.user_attrs] for k in ("compile_seconds", "gate_s",
                                                                              "warmup_s", "trial_s")}
    return {"per_trial_s_median": _median(walls), "per_trial_s_p90": _pct(walls, 0.9),
            "in_trial_median_s": {k: _median(v) for k, v in parts.items()},
            "in_trial_max_s": {k: max(v) if v else None for k, v in parts.items()},
            "fresh_worker_trials": sum(bool(t.user_attrs.get("fresh_worker")) for t in ts),
            "engine_default_tok_per_s": d[0].value if d else None,
            "best": None if best is None else {"trial": best.number, "tok_per_s": best.value,
                                               "config": best.user_attrs.get("config")},
            "confirmation": st.user_attrs.get("confirmation"),
            "states": {s.name: sum(1 for t in ts if t.state == s) for s in TrialState if
                       any(t.state == s for t in ts)}}


def versions() -> dict:
    v = {"python": platform.python_version()}
    for m in ("torch", "triton", "optuna", "numpy"):
        try:
            v[m] = __import__(m).__version__
        except Exception as e:
            v[m] = f"missing: {type(e).__name__}"
    try:
        import torch
        v["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            v["gpu"] = torch.cuda.get_device_name(0)
    except Exception:
        pass
    try:
        import subprocess
        v["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        pass
    return v


if __name__ == "__main__":
    sys.exit(main())
