"""Exhaustive sweep of a sub-space of EngineConfig, measured config by config through the isolation layer.

    python -m kog.tune.sweep --model llama-3.2-1b --backend gpu      # every config of DEFAULT_SUBSPACE
    -> tune/data/<device>-<model>-sweep.parquet  (config columns, tok_per_s, status, fail_reason, backend)

`kogtune replay` replays samplers against such a table. A sweep made with --backend sim is a simulation:
it is written as tune/data/sim-<device>-<model>-sweep.parquet so its name never suggests a measurement.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

from kog.engine.engine_config import EngineConfig

# 2 x 3 x 3 x 3 x 2 = 108 configs: the knobs that matter most at batch 1 (sync, residency, tiling, mapping);
# the others stay at the engine's defaults. Grid mode has no counters (sync_rows 0). A table recorded by an
# older kog may have more columns (the committed one has `prefetch`, a knob since removed from the engine):
# to_engine_config ignores the retired ones.
DEFAULT_SUBSPACE: dict[str, list[Any]] = {
    "mode": ["targeted", "grid"],
    "ctas_per_sm": [2, 3, 4],
    "block_k": [1024, 2048, 4096],
    "bn": [2, 4, 8],                 # bn_qkv = bn_o = bn_gate_up = bn_down
    "mapping": ["round-robin", "topology"],
}
PARAM_COLUMNS = tuple(DEFAULT_SUBSPACE)
DATA_DIR = Path(__file__).resolve().parent / "data"


def enumerate_subspace(sub: dict[str, list[Any]] | None = None) -> list[dict[str, Any]]:
    sub = sub or DEFAULT_SUBSPACE
    keys = list(sub)
    return [dict(zip(keys, vals)) for vals in itertools.product(*(sub[k] for k in keys))]


def to_engine_config(row: dict[str, Any]) -> EngineConfig:
    """The EngineConfig of a sweep row: its EngineConfig columns (the retired ones dropped:
    kog.tune.store.RETIRED_FIELDS), bn as the tile height of every phase but the LM head."""
    from kog.tune.store import RETIRED_FIELDS
    names = set(EngineConfig.__dataclass_fields__) - set(RETIRED_FIELDS)
    kw = {k: v for k, v in row.items() if k in names}
    if "bn" in row:
        b = int(row["bn"])
        kw.update(bn_qkv=b, bn_o=b, bn_gate_up=b, bn_down=b)
    for k in ("ctas_per_sm", "block_k"):
        if k in kw:
            kw[k] = int(kw[k])
    return EngineConfig(**kw)


def sweep_path(device_name: str, model_name: str, simulated: bool) -> Path:
    import re
    slug = lambda s: re.sub(r"[^a-z0-9.]+", "-", s.lower()).strip("-")  # noqa: E731
    return DATA_DIR / f"{'sim-' if simulated else ''}{slug(device_name)}-{slug(model_name)}-sweep.parquet"


def _write_table(rows: list[dict[str, Any]], path: Path, backend: str, name: str, model_name: str):
    """The table so far, written atomically (a kill mid-write leaves the previous version)."""
    import pandas as pd
    from kog.fsutil import atomic_write_table
    df = pd.DataFrame(rows)
    df["backend"] = backend
    df["device"] = name
    df["model"] = model_name
    atomic_write_table(path, df)
    return df


def record_sweep(model_spec: str, backend: str = "sim", out: str | Path | None = None,
                 timeout: float = 120.0, isolate: bool | None = None, sub: dict[str, list[Any]] | None = None,
                 payload_extra: dict[str, Any] | None = None, progress: bool = True, workers: int = 1,
                 deadline: float | None = None, checkpoint_every: int = 10, compile_processes: int | None = None,
                 target: str | None = None, compile_target: str | None = None, stats: dict | None = None):
    """Measure (or simulate) every config of the sub-space; write the table; return (path, DataFrame).

    Isolated trials run in `workers` warm worker processes (one per GPU: worker i sees GPU i when
    workers > 1), restarted after any failure that may have poisoned them. On the GPU the distinct kernels
    compile in parallel processes first-come-first-served, and each config is measured as soon as its
    kernel is ready, so compiling overlaps measuring. The table is rewritten every `checkpoint_every`
    configs (partial results survive a kill). Past `deadline` (a kog.tune.deadline.Deadline, or a time.time() value)
    no new config starts: the rest
    are rows with status 'skipped'. `stats` (a dict) receives timings: precompile_s, per-trial walls, starts,
    how many configs were measured while kernels still compiled, and `recheck`: the first measured config
    measured again at the end, when nothing compiles beside it (the disturbance of overlapping).
    `target` / `compile_target` override the child functions (tests)."""
    import queue
    import threading
    import time
    from kog.tune.isolation import WarmWorker, WorkerPool
    from kog.tune.objective import COMPILE_TARGET, TARGETS, sim_trial
    from kog.tune.scan_model import load_scan
    from kog.tune.space import Infeasible, check, resolve_model_config, residency_fn
    from kog.tune.deadline import as_deadline
    deadline = as_deadline(deadline)
    t_start = time.time()
    model = resolve_model_config(model_spec)
    if backend == "gpu":
        from kog.probe.device import require_gpu
        dev = require_gpu()
        name, sms = dev.name, dev.sms
    else:
        scan = load_scan()
        name, sms = scan.device_name, scan.sms
    isolate = (backend == "gpu") if isolate is None else isolate
    path = Path(out) if out else sweep_path(name, model.name, simulated=backend == "sim")
    rows = enumerate_subspace(sub)
    cfgs = [to_engine_config(r) for r in rows]
    maxc = residency_fn(backend)
    recs: list[dict[str, Any] | None] = [None] * len(rows)
    valid: list[int] = []
    for i, (r, cfg) in enumerate(zip(rows, cfgs)):
        try:
            check(cfg, model, sms, maxc)
            valid.append(i)
        except Infeasible as e:
            recs[i] = {**r, "tok_per_s": float("nan"), "status": "invalid", "fail_reason": str(e)}
    st = stats if stats is not None else {}
    st.update(configs=len(rows), valid=len(valid), trial_wall_s=[], worker_starts=0, precompile_s=None,
              kernels=0, compile_failures={})
    lock = threading.Lock()
    done = [0]

    def finish(i: int, rec: dict[str, Any]) -> None:
        with lock:
            recs[i] = rec
            done[0] += 1
            n = done[0]
            if checkpoint_every and n % checkpoint_every == 0:
                _write_table([r for r in recs if r is not None], path, backend, name, model.name)
        if progress:
            print(f"[{n}/{len(valid)}] {json.dumps(rows[i])} -> {rec['tok_per_s']:.1f} {rec['fail_reason']}",
                  file=sys.stderr, flush=True)

    ready: "queue.Queue[int]" = queue.Queue()
    pool = None
    ctarget = compile_target or (COMPILE_TARGET if backend == "gpu" else None)
    if isolate and ctarget is not None and valid:
        from kog.tune.search import default_compile_processes, kernel_key, precompile
        groups: dict[tuple, list[int]] = {}
        for i in valid:
            groups.setdefault(kernel_key(cfgs[i]), []).append(i)
        st["kernels"] = len(groups)
        n = min(compile_processes or default_compile_processes(model), len(groups))
        envs = [{"CUDA_VISIBLE_DEVICES": str(j % workers)} if workers > 1 else None for j in range(n)]
        pool = WorkerPool(n, envs, "compile")
        left = [len(groups)]
        t_pc = time.time()

        def compiled(key, o) -> None:
            if not o.ok:
                st["compile_failures"][str(key)] = o.reason   # the trial reproduces it, with its status
            for i in groups[key]:
                ready.put(i)
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    st["precompile_s"] = round(time.time() - t_pc, 2)

        dkey = kernel_key(EngineConfig())       # the engine default's kernel first: the baseline early
        order = sorted(valid, key=lambda i: kernel_key(cfgs[i]) != dkey)
        precompile(model_spec, [cfgs[i] for i in order], timeout=max(timeout, 600.0),
                   payload_extra=payload_extra, pool=pool, on_done=compiled, target=ctarget)
    else:
        for i in valid:
            ready.put(i)

    def measure(w: WarmWorker | None) -> None:
        while True:
            with lock:
                if done[0] + taken[0] >= len(valid):
                    return
            if deadline is not None and deadline.passed():
                return
            try:
                i = ready.get(timeout=0.2)
            except queue.Empty:
                continue
            with lock:
                taken[0] += 1
            rec: dict[str, Any] = {**rows[i], "tok_per_s": float("nan"), "status": "ok", "fail_reason": ""}
            payload = {"model": model_spec, "config": cfgs[i].to_dict(), **(payload_extra or {})}
            if w is not None:
                o = w.run(target or TARGETS[backend], payload, timeout)
                st["trial_wall_s"].append(round(o.wall_s, 3))
                for k in ("compile_seconds", "gate_s", "warmup_s", "trial_s"):   # a cache miss shows here
                    if o.data.get(k) is not None:
                        st.setdefault("trial_" + k, []).append(round(float(o.data[k]), 3))
                if o.ok:
                    rec["tok_per_s"] = o.value
                else:
                    rec.update(status=o.status, fail_reason=o.reason)
            else:
                try:
                    rec["tok_per_s"] = sim_trial(payload, lambda s, v: None)["value"]
                except Exception as e:
                    rec.update(status="error", fail_reason=f"{type(e).__name__}: {e}")
            with lock:
                taken[0] -= 1
                if compiling() and rec["status"] == "ok":
                    st["measured_while_compiling"] += 1
                if st.get("recheck") is None and rec["status"] == "ok" and w is not None:
                    st["recheck"] = {"index": i, "first": rec["tok_per_s"], "first_while_compiling": compiling()}
            finish(i, rec)

    taken = [0]
    st["measured_while_compiling"] = 0

    def compiling() -> bool:
        return pool is not None and st["precompile_s"] is None

    measurers = [WarmWorker({"CUDA_VISIBLE_DEVICES": str(j)} if workers > 1 else None, f"measure-{j}")
                 if isolate else None for j in range(max(1, workers))]
    try:
        threads = [threading.Thread(target=measure, args=(w,), daemon=True) for w in measurers]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        rc = st.get("recheck")
        if rc is not None and measurers[0] is not None and (deadline is None or not deadline.passed()):
            # the first config again, now that no compile runs beside it: how much compiling disturbed it
            i = rc["index"]
            o = measurers[0].run(target or TARGETS[backend], {"model": model_spec, "config": cfgs[i].to_dict(),
                                                              **(payload_extra or {})}, timeout)
            rc.update(params=rows[i], again=o.value if o.ok else None, again_status=o.status)
    finally:
        if pool is not None:
            pool.close()
        for w in measurers:
            if w is not None:
                st["worker_starts"] += w.starts
                w.close()
    for i, r in enumerate(rows):
        if recs[i] is None:
            recs[i] = {**r, "tok_per_s": float("nan"), "status": "skipped",
                       "fail_reason": "not measured: the sweep's wall budget was spent"}
    df = _write_table(recs, path, backend, name, model.name)   # type: ignore[arg-type]
    st["sweep_s"] = round(time.time() - t_start, 2)
    st["measured"] = int((df["status"] != "skipped").sum() - (df["status"] == "invalid").sum())
    return path, df


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kog.tune.sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--backend", choices=["gpu", "sim"], default="gpu")
    ap.add_argument("--out", default=None)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1, help="warm measuring workers (one per GPU)")
    a = ap.parse_args(argv)
    path, df = record_sweep(a.model, a.backend, a.out, a.timeout, workers=a.workers,
                            payload_extra={"tokens": a.tokens, "repeats": a.repeats})
    ok = df["tok_per_s"].notna().sum()
    print(f"{len(df)} configs, {ok} measured, best {df['tok_per_s'].max():.1f} tok/s -> {path}")
    return 0


if __name__ == "__main__":
    from kog.errors import cli_entry
    sys.exit(cli_entry("kog.tune.sweep")(main)())
