"""`kogtune replay SWEEP --seeds 10`: how fast do the samplers find the best config of a recorded sweep?

Each replay is an Optuna study over the sweep's own sub-space (one categorical parameter per config
column, with the values the table holds) whose objective looks the config up in the table instead of
measuring it. A row that FAILED (crash, wrong result, NaN tok/s) is a failed trial; it still cost an
evaluation. A config proposed again costs nothing (its result is known), so evaluations count distinct
configs. K = evaluations until one within 2% of the table's best; the command prints per sampler the
median K over the seeds, and last: `median evaluations to within 2% of best: K/N` (N = configs in the
table) for the chosen sampler (default: the search's default, TPE).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from kog.errors import UsageError

NON_PARAM = {"tok_per_s", "status", "fail_reason", "backend", "device", "model", "error"}
WITHIN = 0.02


def load_sweep(path: str | Path):
    import pandas as pd
    p = Path(path)
    if not p.exists():
        raise UsageError(f"no such sweep table: {p}")
    from kog.fsutil import check_input_file
    check_input_file(p, "sweep table")
    try:
        df = pd.read_csv(p) if p.suffix == ".csv" else pd.read_parquet(p)
    except Exception as e:
        raise UsageError(f"sweep table {p} is unreadable: {type(e).__name__}: {e}") from None
    if "tok_per_s" not in df.columns:
        raise UsageError(f"sweep table {p} has no tok_per_s column")
    df["tok_per_s"] = _numbers(df["tok_per_s"], p)
    params = [c for c in df.columns if c not in NON_PARAM]
    if not params:
        raise UsageError(f"sweep table {p} has no config columns")
    if df["tok_per_s"].notna().sum() == 0:
        raise UsageError(f"sweep table {p} has no successful row")
    return df, params


def _numbers(col, path: Path):
    """The tok_per_s column as floats (empty cells NaN: a failed config); UsageError naming the first row
    holding text instead of a number (row 1 is the first data row, as a spreadsheet shows it under the
    header: line row+1 of a CSV)."""
    import pandas as pd
    num = pd.to_numeric(col, errors="coerce")
    bad = col.notna() & num.isna()
    if bad.any():
        i = int(bad.to_numpy().nonzero()[0][0])
        raise UsageError(f"sweep table {path}: row {i + 1}, column tok_per_s holds {col.iloc[i]!r}, not a number")
    return num.astype(float)


def _py(v):
    try:
        return v.item()
    except AttributeError:
        return v


def replay_once(df, params: list[str], sampler_name: str, seed: int, within: float = WITHIN) -> int:
    """Evaluations (distinct configs looked up) until one within `within` of the table's best."""
    import math
    import optuna
    from kog.tune.search import make_sampler, quiet_optuna
    quiet_optuna()
    choices = {c: sorted({_py(v) for v in df[c].dropna().unique()}, key=lambda x: (str(type(x)), x))
               for c in params}
    table: dict[tuple, float] = {}
    for row in df.itertuples(index=False):
        d = row._asdict()
        key = tuple(_py(d[c]) for c in params)
        v = d["tok_per_s"]
        table[key] = float(v) if v is not None and not (isinstance(v, float) and math.isnan(v)) else math.nan
    best = max(v for v in table.values() if not math.isnan(v))
    target = (1 - within) * best
    n = len(table)
    seen: dict[tuple, float] = {}
    state = {"hit": None}

    def objective(trial):
        key = tuple(trial.suggest_categorical(c, choices[c]) for c in params)
        if key not in table:                 # not in the sub-space's table: rejected before any launch
            raise optuna.TrialPruned()
        if key not in seen:
            seen[key] = table[key]
            if state["hit"] is None and not math.isnan(table[key]) and table[key] >= target:
                state["hit"] = len(seen)
        v = seen[key]
        if math.isnan(v):
            raise RuntimeError("failed config")
        return v

    study = optuna.create_study(direction="maximize", sampler=make_sampler(sampler_name, seed))
    trials = 0
    while state["hit"] is None and len(seen) < n and trials < 20 * n:
        study.optimize(objective, n_trials=1, catch=(RuntimeError,))
        trials += 1
    return state["hit"] if state["hit"] is not None else n


def replay(path: str | Path, samplers: list[str], seeds: int) -> dict[str, Any]:
    df, params = load_sweep(path)
    n = len(df.drop_duplicates(subset=params))
    res: dict[str, Any] = {"sweep": str(path), "configs": n, "params": params,
                           "simulated": bool((df.get("backend") == "sim").any()) if "backend" in df else None,
                           "samplers": {}}
    for s in samplers:
        ks = [replay_once(df, params, s, seed) for seed in range(seeds)]
        res["samplers"][s] = {"evaluations": ks, "median": statistics.median(ks)}
    return res


def cli_replay(args) -> int:
    from kog.tune.search import make_sampler
    sampler = args.sampler
    make_sampler(sampler)        # a missing optional dependency: one clear line, exit 2
    samplers = [sampler] + [c for c in (args.compare or "").split(",") if c and c != sampler]
    for c in samplers:
        make_sampler(c)
    if args.seeds < 1:
        raise UsageError("--seeds must be >= 1")
    res = replay(args.sweep, samplers, args.seeds)
    n = res["configs"]
    k = res["samplers"][sampler]["median"]
    if args.json:           # JSON only: `kogtune replay SWEEP --json | python -m json.tool`
        print(json.dumps({**res, "sampler": sampler, "median_evaluations": k}))
        return 0
    if res.get("simulated"):
        print(f"note: {args.sweep} is a SIMULATED sweep (backend sim), not a measurement")
    for s in samplers:
        r = res["samplers"][s]
        print(f"{s}: evaluations to within 2% of best per seed {r['evaluations']}, median {r['median']:g}/{n}")
    print(f"median evaluations to within 2% of best: {k:g}/{n}")
    return 0
