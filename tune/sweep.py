"""Exhaustive sweep of a sub-space of EngineConfig, measured config by config through the isolation layer.

    python -m kog.tune.sweep --model llama-3.2-1b --backend gpu      # on the H200: >= 200 configs
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

# 2 x 3 x 3 x 3 x 2 x 2 = 216 configs: the knobs that matter most at batch 1 (sync, residency, tiling,
# mapping, prefetch); the others stay at the engine's defaults. Grid mode has no counters (sync_rows 0).
DEFAULT_SUBSPACE: dict[str, list[Any]] = {
    "mode": ["targeted", "grid"],
    "ctas_per_sm": [2, 3, 4],
    "block_k": [1024, 2048, 4096],
    "bn": [2, 4, 8],                 # bn_qkv = bn_o = bn_gate_up = bn_down
    "mapping": ["round-robin", "topology"],
    "prefetch": [0, 1],
}
PARAM_COLUMNS = ("mode", "ctas_per_sm", "block_k", "bn", "mapping", "prefetch")
DATA_DIR = Path(__file__).resolve().parent / "data"


def enumerate_subspace(sub: dict[str, list[Any]] | None = None) -> list[dict[str, Any]]:
    sub = sub or DEFAULT_SUBSPACE
    keys = list(sub)
    return [dict(zip(keys, vals)) for vals in itertools.product(*(sub[k] for k in keys))]


def to_engine_config(row: dict[str, Any]) -> EngineConfig:
    kw = {k: v for k, v in row.items() if k in EngineConfig.__dataclass_fields__}
    if "bn" in row:
        b = int(row["bn"])
        kw.update(bn_qkv=b, bn_o=b, bn_gate_up=b, bn_down=b)
    for k in ("ctas_per_sm", "block_k", "prefetch"):
        if k in kw:
            kw[k] = int(kw[k])
    return EngineConfig(**kw)


def sweep_path(device_name: str, model_name: str, simulated: bool) -> Path:
    import re
    slug = lambda s: re.sub(r"[^a-z0-9.]+", "-", s.lower()).strip("-")  # noqa: E731
    return DATA_DIR / f"{'sim-' if simulated else ''}{slug(device_name)}-{slug(model_name)}-sweep.parquet"


def record_sweep(model_spec: str, backend: str = "sim", out: str | Path | None = None,
                 timeout: float = 120.0, isolate: bool | None = None, sub: dict[str, list[Any]] | None = None,
                 payload_extra: dict[str, Any] | None = None, progress: bool = True):
    """Measure (or simulate) every config of the sub-space; write the table; return (path, DataFrame)."""
    import pandas as pd
    from kog.tune.isolation import run_isolated
    from kog.tune.objective import TARGETS, sim_trial
    from kog.tune.scan_model import load_scan
    from kog.tune.space import Infeasible, check, resolve_model_config, residency_fn
    model = resolve_model_config(model_spec)
    if backend == "gpu":
        from kog.probe.device import require_gpu
        dev = require_gpu()
        name, sms = dev.name, dev.sms
    else:
        scan = load_scan()
        name, sms = scan.device_name, scan.sms
    isolate = (backend == "gpu") if isolate is None else isolate
    rows = enumerate_subspace(sub)
    cfgs = [to_engine_config(r) for r in rows]
    if backend == "gpu":
        from kog.tune.search import precompile
        precompile(model_spec, cfgs)
    maxc = residency_fn(backend)
    out_rows = []
    for i, (r, cfg) in enumerate(zip(rows, cfgs)):
        rec: dict[str, Any] = {**r, "tok_per_s": float("nan"), "status": "ok", "fail_reason": ""}
        try:
            check(cfg, model, sms, maxc)
        except Infeasible as e:
            rec.update(status="invalid", fail_reason=str(e))
            out_rows.append(rec)
            continue
        payload = {"model": model_spec, "config": cfg.to_dict(), **(payload_extra or {})}
        if isolate:
            o = run_isolated(TARGETS[backend], payload, timeout)
            if o.ok:
                rec["tok_per_s"] = o.value
            else:
                rec.update(status=o.status, fail_reason=o.reason)
        else:
            try:
                rec["tok_per_s"] = sim_trial(payload, lambda s, v: None)["value"]
            except Exception as e:
                rec.update(status="error", fail_reason=f"{type(e).__name__}: {e}")
        out_rows.append(rec)
        if progress:
            print(f"[{i + 1}/{len(rows)}] {json.dumps(r)} -> {rec['tok_per_s']:.1f} {rec['fail_reason']}",
                  file=sys.stderr, flush=True)
    df = pd.DataFrame(out_rows)
    df["backend"] = backend
    df["device"] = name
    df["model"] = model.name
    path = Path(out) if out else sweep_path(name, model.name, simulated=backend == "sim")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":
        df.to_csv(path, index=False)
    else:
        df.to_parquet(path, index=False)
    return path, df


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kog.tune.sweep", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--backend", choices=["gpu", "sim"], default="gpu")
    ap.add_argument("--out", default=None)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    path, df = record_sweep(a.model, a.backend, a.out, a.timeout,
                            payload_extra={"tokens": a.tokens, "repeats": a.repeats})
    ok = df["tok_per_s"].notna().sum()
    print(f"{len(df)} configs, {ok} measured, best {df['tok_per_s'].max():.1f} tok/s -> {path}")
    return 0


if __name__ == "__main__":
    from kog.probe.errors import cli_entry
    sys.exit(cli_entry("kog.tune.sweep")(main)())
