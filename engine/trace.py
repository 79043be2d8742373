"""Instrumented-run analysis: the kernel's per-task %globaltimer records -> time breakdown and Perfetto trace.

Each record (kernel/trace.py trace_task) is [start_ns, end_ns, waited_ns, step << 40 | smid << 24 | task index,
publish start ns, publish barrier end ns].
Categories per token, averaged over CTAs:
  streaming  task time not spent waiting (weight loads + math of the task)
  waiting    time a task spent in targeted waits for its inputs
  barrier    time in grid barriers (grid mode)
  other      the rest of the token: task decode, the token hand-off (sampling, embedding), idle tails
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from kog.engine.plan import T_BAR, TASK_NAMES, Plan

CATEGORIES = ("streaming", "waiting", "barrier", "other")


TABLE_COLUMNS = ["cta", "sm", "step", "task", "phase", "layer", "start_ns", "end_ns", "wait_ns", "publish_ns",
                 "publish_barrier_ns"]


def trace_table(trace: np.ndarray, plan: Plan):
    """The raw records as a DataFrame of TABLE_COLUMNS: publish_ns is the publish of held tiles right before the
    task (0: none), publish_barrier_ns its CTA barrier (the warps arriving; the rest is the release's fence)."""
    import pandas as pd
    grid, cap, _ = trace.shape
    rows = []
    for c in range(grid):
        rec = trace[c]
        rec = rec[rec[:, 1] > 0]
        if len(rec) == 0:
            continue
        packed = rec[:, 3]
        ti = packed & ((1 << 24) - 1)
        rows.append(pd.DataFrame({
            "cta": c, "sm": (packed >> 24) & 0xFFFF, "step": packed >> 40, "task": ti,
            "phase": [TASK_NAMES[int(t)] for t in plan.tasks[ti, 0]], "layer": plan.tasks[ti, 1],
            "start_ns": rec[:, 0], "end_ns": rec[:, 1], "wait_ns": rec[:, 2],
            "publish_ns": np.where(rec[:, 5] > 0, rec[:, 0] - rec[:, 4], 0),
            "publish_barrier_ns": np.where(rec[:, 5] > 0, rec[:, 5] - rec[:, 4], 0)}))
    if not rows:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    df = pd.concat(rows, ignore_index=True)
    t0 = df["start_ns"].min()
    df["start_ns"] -= t0
    df["end_ns"] -= t0
    return df


# Monokernel(attn_stamps=True): the sub-steps of each attention split (kernel._attn_stamp), as durations
ATTN_STEPS = ("wait", "inputs", "split", "arrive", "merge")


def attn_stamps_table(atr: np.ndarray, plan: Plan):
    """Each stamped attention split of a traced launch as a row [cta, step, task, layer, kv_head, split,
    merged, wait_ns, inputs_ns, split_ns, arrive_ns, merge_ns]: the time from its start to its q/k/v being
    ready (wait), reading them (inputs), its math up to its stored partials (split), the arrival atomic
    (arrive), and the rest of the task (merge: the last arriver's merge; ~0 for the others). An empty split
    (no cached position yet) does nothing: all its time is in merge (its task's end), the rest 0."""
    import pandas as pd
    splits = int(plan.meta.get("attn_splits", 1))
    rows = []
    for c in range(atr.shape[0]):
        rec = atr[c]
        rec = rec[rec[:, 6] > 0]
        if len(rec) == 0:
            continue
        ti = rec[:, 7] & ((1 << 40) - 1)
        tile = plan.tasks[ti, 2]
        t = rec[:, :6]
        d = np.diff(t, axis=1)
        rows.append(pd.DataFrame({"cta": c, "step": rec[:, 7] >> 40, "task": ti, "layer": plan.tasks[ti, 1],
                                  "kv_head": tile // splits, "split": tile % splits, "merged": rec[:, 6] == 2,
                                  **{f"{k}_ns": d[:, i] for i, k in enumerate(ATTN_STEPS)}}))
    cols = ["cta", "step", "task", "layer", "kv_head", "split", "merged"] + [f"{k}_ns" for k in ATTN_STEPS]
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=cols)


def breakdown_from_trace(trace: np.ndarray, plan: Plan, seconds_per_token: float, traced_tokens: int) -> dict[str, Any]:
    df = trace_table(trace, plan)
    if df.empty:
        return {"seconds_per_token": seconds_per_token, **{c: None for c in CATEGORIES}, "phases": {}}
    # skip the first traced token: it carries the launch's start-up
    steps = sorted(df["step"].unique())
    if len(steps) > 1:
        df = df[df["step"] != steps[0]]
    ntok = df["step"].nunique()
    dur = (df["end_ns"] - df["start_ns"]).clip(lower=0)
    is_bar = df["phase"] == TASK_NAMES[T_BAR]
    per_cta_tok = 1e-9 / (plan.grid * ntok)
    barrier = float(dur[is_bar].sum()) * per_cta_tok
    waiting = float(df.loc[~is_bar, "wait_ns"].sum()) * per_cta_tok
    streaming = float((dur[~is_bar] - df.loc[~is_bar, "wait_ns"]).clip(lower=0).sum()) * per_cta_tok
    other = max(seconds_per_token - barrier - waiting - streaming, 0.0)
    phases = {}
    for ph, g in df.groupby("phase"):
        d = (g["end_ns"] - g["start_ns"]).clip(lower=0)
        w = g["wait_ns"] if ph != TASK_NAMES[T_BAR] else d
        phases[ph] = {"seconds_per_token": float(d.sum()) * per_cta_tok,
                      "waiting": float(w.sum()) * per_cta_tok, "tasks": int(len(g) // max(ntok, 1))}
    return {"seconds_per_token": seconds_per_token, "streaming": streaming, "waiting": waiting,
            "barrier": barrier, "other": other, "phases": phases, "traced_tokens": int(ntok), "table": df}


def chrome_trace(df, path: str | Path) -> Path:
    """Write a Chrome-trace JSON (Perfetto opens it): one track per CTA, grouped by SM."""
    events = []
    for r in df.itertuples(index=False):
        events.append({"name": f"{r.phase} L{r.layer}", "ph": "X", "pid": int(r.sm), "tid": int(r.cta),
                       "ts": r.start_ns / 1e3, "dur": max((r.end_ns - r.start_ns) / 1e3, 0.001),
                       "args": {"task": int(r.task), "step": int(r.step), "wait_us": r.wait_ns / 1e3}})
    from kog.fsutil import atomic_write_text
    return atomic_write_text(path, json.dumps({"traceEvents": events, "displayTimeUnit": "ns"}))
