"""Bench tables shared by the bench (which writes them) and the engine report (which reads them, or
derives them from a bench JSON that has no run directory), and how to read a bench document's errors in
either of its layouts (rel_errs). pandas only: no matplotlib here.

The per-phase breakdown comes from a kog system's breakdown_extra['phases'] ({phase: {seconds_per_token,
waiting, tasks}}, engine/trace.py): in a phase, `waiting` is the targeted wait for producers and the rest
of its time is streaming; the grid mode's 'barrier' phase is all barrier. The token's remainder (task
decode, sampling, the token hand-off) is the system's `other` and shows as its own phase, so the rows of
a system add up to its per-system breakdown.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kog.engine.engine_config import PHASES as GEMV_PHASES

BREAKDOWN_COLUMNS = ["system", "phase", "category", "seconds_per_token"]
BARRIER_PHASE = "barrier"
OTHER_PHASE = "other"
# a decode step's order (engine/plan.py TASK_NAMES), then the barriers and the token's remainder
PHASE_ORDER = ("qkv", "attn", "o", "gate_up", "down", "lm", BARRIER_PHASE, OTHER_PHASE)


# What a bench document's max_rel_err is measured against (its top-level max_rel_err_oracle; kog.tune.bench)
ORACLE_FP32 = "reference computed in float32 over the model's weights"
ORACLE_SAME = "reference (float32 weights)"


def rel_errs(doc: dict, rec: dict) -> tuple[float | None, float | None]:
    """(error against the float32 reference, error against the model-dtype reference) of one system's record
    in a bench document; None where not measured. Benches written before the float32 oracle became the gate
    have no max_rel_err_oracle: their max_rel_err is against the model-dtype Reference and
    max_rel_err_fp32_ref against the float32 one."""
    if "max_rel_err_oracle" in doc:
        e = rec.get("max_rel_err")
        return e, (rec.get("max_rel_err_model_dtype_ref") if doc["max_rel_err_oracle"] == ORACLE_FP32 else e)
    e16 = rec.get("max_rel_err")
    return (rec.get("max_rel_err_fp32_ref") if doc.get("reference_max_rel_err_vs_fp32") is not None else e16), e16


KOG = ("kog-targeted", "kog-grid", "kog-rule")      # kog's systems: never a baseline; kog-rule: the rule's config


def rated_tok_per_s(s: Any) -> float | None:
    """A system record's median tok/s, None where it has none (an error, not built)."""
    v = s.get("tok_per_s") if isinstance(s, dict) else None
    return float(v) if isinstance(v, (int, float)) and v == v else None


def fastest_baseline(doc: dict[str, Any]) -> tuple[str | None, float | None]:
    """(name, median tok/s) of the fastest system of the run that is not kog."""
    rated = {k: rated_tok_per_s(v) for k, v in doc["systems"].items()
             if k not in KOG and rated_tok_per_s(v) is not None}
    if not rated:
        return None, None
    name = max(rated, key=rated.get)
    return name, rated[name]


def spread(s: dict[str, Any]) -> tuple[float | None, float | None]:
    """(min, max) tok/s over a system's timed runs."""
    runs = [float(x) for x in (s.get("runs_tok_per_s") or []) if isinstance(x, (int, float))]
    lo, hi = s.get("tok_per_s_min"), s.get("tok_per_s_max")
    if lo is None and runs:
        lo, hi = min(runs), max(runs)
    return lo, hi


def _phase_key(phase: str) -> tuple[int, str]:
    return (PHASE_ORDER.index(phase) if phase in PHASE_ORDER else len(PHASE_ORDER) - 2, str(phase))


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if f == f else None


def phase_rows(system: str, rec: dict[str, Any]) -> list[dict[str, Any]]:
    """[system, phase, category, seconds_per_token] rows of one system's bench record; [] when it has no
    per-phase breakdown (a baseline, or a stand-in whose phases are not {phase: {...}})."""
    extra = rec.get("breakdown_extra") if isinstance(rec, dict) else None
    phases = extra.get("phases") if isinstance(extra, dict) else None
    if not isinstance(phases, dict):
        return []
    rows = []
    for phase, p in sorted(phases.items(), key=lambda kv: _phase_key(kv[0])):
        if not isinstance(p, dict):
            continue
        total, wait = _num(p.get("seconds_per_token")), _num(p.get("waiting")) or 0.0
        if total is None:
            continue
        if phase == BARRIER_PHASE:
            rows.append((phase, "barrier", total))
        else:
            rows += [(phase, "streaming", max(total - wait, 0.0)), (phase, "waiting", min(wait, total))]
    if not rows:
        return []
    other = _num((rec.get("breakdown") or {}).get("other"))
    if other is not None:
        rows.append((OTHER_PHASE, "other", other))
    return [dict(zip(BREAKDOWN_COLUMNS, (system, *r))) for r in rows]


def phase_breakdown(systems: dict[str, Any]) -> pd.DataFrame:
    """The `breakdown` table of a bench: every system's per-phase rows (BREAKDOWN_COLUMNS)."""
    rows = [r for name, rec in (systems or {}).items() for r in phase_rows(name, rec)]
    return pd.DataFrame(rows, columns=BREAKDOWN_COLUMNS)


def phase_table(bd: pd.DataFrame) -> pd.DataFrame:
    """One row per (phase, system): microseconds per token by category, total, and the phase's share of
    the system's token time; phases in decode order (first-seen order for any other)."""
    wide = bd.pivot_table(index=["phase", "system"], columns="category", values="seconds_per_token",
                          aggfunc="sum").fillna(0.0) * 1e6
    phases = sorted(dict.fromkeys(bd["phase"]), key=_phase_key)
    systems = list(dict.fromkeys(bd["system"]))
    wide = wide.reindex(pd.MultiIndex.from_tuples([(p, s) for p in phases for s in systems
                                                   if (p, s) in wide.index], names=["phase", "system"]))
    cats = [c for c in ("streaming", "waiting", "barrier", "other") if c in wide.columns] + \
        [c for c in wide.columns if c not in ("streaming", "waiting", "barrier", "other")]
    wide = wide[cats]
    wide["total"] = wide.sum(axis=1)
    per_system = wide.groupby(level="system", sort=False)["total"].transform("sum")
    wide["share of token"] = (wide["total"] / per_system.where(per_system > 0)).map(
        lambda v: "" if v != v else f"{v:.1%}")
    wide = wide.rename(columns={c: f"{c} (us)" for c in cats + ["total"]})
    wide.columns.name = None
    return wide.reset_index()


# ---- the critical path per layer, from an instrumented run's per-task trace ---------------------------------
# Between the last task of one phase ending and the last task of the next ending, in decode order; the first
# segment starts at the previous layer's down. Each is set beside what the phase's weight bytes take at the
# run's copy rate, so the excess is the latency chain and imbalance the engine pays there.
LAYER_SEGMENTS = (("down", "qkv"), ("qkv", "attn"), ("attn", "o"), ("o", "gate_up"), ("gate_up", "down"))
SEGMENT_COLUMNS = ["system", "layer", "segment", "us", "stream_us", "excess_us"]


def model_shapes_of(doc: dict[str, Any] | None) -> dict[str, Any]:
    """A bench JSON's model_shapes; an older one only names its model, which helps when it is a preset
    ({} when neither)."""
    doc = doc or {}
    if isinstance(doc.get("model_shapes"), dict):
        return doc["model_shapes"]
    from kog.engine.config import PRESETS
    cfg = PRESETS.get(doc.get("model"))
    if cfg is None:
        return {}
    return dict(hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, qkv_size=cfg.qkv_size,
                q_size=cfg.q_size)


def phase_weight_bytes(shapes: dict[str, Any]) -> dict[str, int] | None:
    """Weight bytes per layer of each GEMV phase from a bench JSON's model_shapes (None when incomplete)."""
    try:
        H, I = int(shapes["hidden_size"]), int(shapes["intermediate_size"])
        qkv, q, es = int(shapes["qkv_size"]), int(shapes["q_size"]), int(shapes.get("bytes_per_weight", 2))
    except (KeyError, TypeError, ValueError):
        return None
    return {"qkv": qkv * H * es, "attn": 0, "o": H * q * es, "gate_up": 2 * I * H * es, "down": H * I * es}


def _system_tasks(tl: pd.DataFrame, system: str, need: set[str]) -> pd.DataFrame | None:
    """The traced tasks of `system` (all of them when the timeline has no system column). None when there are
    none or the timeline lacks a column of `need`."""
    t = tl[tl["system"] == system] if "system" in tl.columns else tl
    return None if t.empty or not need <= set(t.columns) else t


def _traced_token(tl: pd.DataFrame, system: str, need: set[str]) -> pd.DataFrame | None:
    """The tasks of one traced token of `system`: the second when there are two or more (the first carries
    the launch's start-up). None when there are none or the timeline lacks a column of `need`."""
    t = _system_tasks(tl, system, need)
    if t is None:
        return None
    steps = sorted(t["step"].unique())
    return t[t["step"] == (steps[1] if len(steps) > 1 else steps[0])]


def layer_segments(tl: pd.DataFrame, system: str, copy_GBps: float | None,
                   phase_bytes: dict[str, int] | None) -> pd.DataFrame:
    """SEGMENT_COLUMNS rows of one traced token of `system` (the second traced token when there are two or
    more: the first carries the launch's start-up); stream_us / excess_us are NaN without bytes or a copy
    rate. Empty when the trace has no tasks of that system."""
    tok = _traced_token(tl, system, {"step", "layer", "phase", "end_ns"})
    if tok is None:
        return pd.DataFrame(columns=SEGMENT_COLUMNS)
    ends = tok.groupby(["layer", "phase"])["end_ns"].max()
    rows = []
    for layer in sorted(tok.loc[tok["phase"] != "lm", "layer"].unique()):
        for prev, ph in LAYER_SEGMENTS:
            prev_layer = layer - 1 if ph == "qkv" else layer
            if (prev_layer, prev) not in ends or (layer, ph) not in ends:
                continue
            us = (ends[(layer, ph)] - ends[(prev_layer, prev)]) / 1e3
            stream = (phase_bytes[ph] / (copy_GBps * 1e3)) if phase_bytes and copy_GBps else float("nan")
            rows.append((system, int(layer), f"{prev} -> {ph}", us, stream, us - stream))
    return pd.DataFrame(rows, columns=SEGMENT_COLUMNS)


def critical_path_table(seg: pd.DataFrame) -> pd.DataFrame:
    """Median over layers per segment (decode order), plus the layer total: measured, streaming alone and
    the excess, in microseconds."""
    if seg.empty:
        return pd.DataFrame(columns=["segment", "us", "stream_us", "excess_us"])
    order = [f"{a} -> {b}" for a, b in LAYER_SEGMENTS]
    med = seg.groupby("segment")[["us", "stream_us", "excess_us"]].median().reindex(order).dropna(how="all")
    per_layer = seg.groupby("layer")[["us", "stream_us", "excess_us"]].sum(min_count=1)
    med.loc["layer (sum)"] = per_layer.median()
    return med.reset_index().rename(columns={"index": "segment"})


HOP_COLUMNS = ["segment", "tail_us", "ready_us", "first_task_us", "task_us", "tasks_max", "span_us"]


def hop_table(tl: pd.DataFrame, system: str) -> pd.DataFrame:
    """What each critical-path segment a -> b of a layer is made of, median over the layers of one traced
    token (_traced_token, as layer_segments): tail_us, a's last CTA ending after
    its median CTA (one tile more than others, then contention); ready_us, b's input ready after a's last
    task ended (median CTA; a b task's start plus its wait, so the release, the poll and the hand-off);
    first_task_us and task_us, b's tasks busy (start to end less the wait), a CTA's first of the layer
    (input load, norm) and the others; tasks_max, b's tasks on the busiest CTA; span_us, a's last end to b's
    last end (what layer_segments measures). Needs the timeline's cta, start_ns and wait_ns columns."""
    tok = _traced_token(tl, system, {"step", "layer", "phase", "cta", "start_ns", "end_ns", "wait_ns"})
    if tok is None:
        return pd.DataFrame(columns=HOP_COLUMNS)
    tok = tok.sort_values(["cta", "start_ns"])
    busy = (tok["end_ns"] - tok["start_ns"] - tok["wait_ns"]) / 1e3
    tok = tok.assign(busy=busy, k=tok.groupby(["cta", "layer", "phase"]).cumcount())
    rows = []
    for layer in sorted(tok.loc[tok["phase"] != "lm", "layer"].unique()):
        for prev, ph in LAYER_SEGMENTS:
            a = tok[(tok["layer"] == (layer - 1 if ph == "qkv" else layer)) & (tok["phase"] == prev)]
            b = tok[(tok["layer"] == layer) & (tok["phase"] == ph)]
            if a.empty or b.empty:
                continue
            last = a["end_ns"].max()
            first = b[b["k"] == 0]
            rows.append((f"{prev} -> {ph}", (last - a.groupby("cta")["end_ns"].max().median()) / 1e3,
                         ((first["start_ns"] + first["wait_ns"]).median() - last) / 1e3,
                         first["busy"].median(), b.loc[b["k"] > 0, "busy"].median(),
                         int(b.groupby("cta").size().max()), (b["end_ns"].max() - last) / 1e3))
    if not rows:
        return pd.DataFrame(columns=HOP_COLUMNS)
    order = [f"{x} -> {y}" for x, y in LAYER_SEGMENTS]
    med = pd.DataFrame(rows, columns=HOP_COLUMNS).groupby("segment").median()
    return med.reindex([o for o in order if o in med.index]).reset_index()


TAIL_COLUMNS = ["phase", "tail_us", "late_start_us", "more_wait_us", "more_busy_us", "more_tasks", "same_last_next",
                "distinct_last", "groups"]


def tail_table(tl: pd.DataFrame, system: str) -> pd.DataFrame:
    """Why a GEMV phase's last CTA ends last, over every traced token of `system` (a CTA's part of a phase: its
    tasks of that phase and layer). Per phase, means over (token, layer) of the last CTA against the median
    CTA: tail_us, how much later it ended; late_start_us, began; more_wait_us, waited within the phase;
    more_busy_us, streamed (task time less waits); more_tasks. same_last_next: how often the same CTA is last
    in that layer the next traced token (about 1 / grid by chance): a slow CTA that stays slow is something a
    plan could deal around, one that changes every token is not. distinct_last: how many CTAs were ever last.
    Needs the timeline's cta, start_ns and wait_ns columns; empty without them."""
    t = _system_tasks(tl, system, {"step", "layer", "phase", "cta", "start_ns", "end_ns", "wait_ns"})
    if t is None:
        return pd.DataFrame(columns=TAIL_COLUMNS)
    g = t[t["phase"].isin(GEMV_PHASES)]
    g = g.assign(busy=g["end_ns"] - g["start_ns"] - g["wait_ns"])
    per = g.groupby(["phase", "step", "layer", "cta"]).agg(
        start=("start_ns", "min"), end=("end_ns", "max"), wait=("wait_ns", "sum"), busy=("busy", "sum"),
        tasks=("end_ns", "size"))
    if per.empty:
        return pd.DataFrame(columns=TAIL_COLUMNS)
    groups = per.groupby(level=["phase", "step", "layer"])
    last = per.loc[groups["end"].idxmax()].reset_index("cta")
    more = last.drop(columns="cta") - groups.median()
    rank = {s: i for i, s in enumerate(sorted(g["step"].unique()))}
    who = last["cta"].reset_index()
    who["k"] = who["step"].map(rank)
    nxt = who.assign(k=who["k"] - 1)[["phase", "layer", "k", "cta"]]
    pair = who.merge(nxt, on=["phase", "layer", "k"], suffixes=("", "_next"))
    same = (pair["cta"] == pair["cta_next"]).groupby(pair["phase"]).mean()
    ns = more[["end", "start", "wait", "busy"]] / 1e3
    tab = pd.concat([ns, more[["tasks"]]], axis=1).groupby(level="phase").mean()
    tab.columns = TAIL_COLUMNS[1:6]
    tab["same_last_next"] = same.reindex(tab.index)
    tab["distinct_last"] = who.groupby("phase")["cta"].nunique()
    tab["groups"] = who.groupby("phase").size()
    return tab.reindex([p for p in GEMV_PHASES if p in tab.index]).reset_index()


STREAMING_COLUMNS = ["phase", "few_us", "half_us", "most_us", "token_share_few"]
NO_STREAM = "none"


def streaming_table(tl: pd.DataFrame, system: str) -> pd.DataFrame:
    """How many CTAs keep the weight stream going, instant by instant, over each traced token of `system`
    (means over tokens, us a token). A CTA streams while it is inside a task past the task's wait; each instant
    counts for the phase with the most streaming CTAs then (NO_STREAM when none). few_us: at most an eighth of
    the grid streams, too few to keep the HBM busy; half_us: at most half; most_us: more than half.
    token_share_few: few_us over the token. A wait only costs where it leaves the HBM with few streaming CTAs
    (a CTA waiting while the others stream has its ring full): this says where that happens. Needs the
    timeline's cta, start_ns and wait_ns columns; empty without them."""
    t = _system_tasks(tl, system, {"step", "phase", "cta", "start_ns", "end_ns", "wait_ns"})
    if t is None:
        return pd.DataFrame(columns=STREAMING_COLUMNS)
    grid = t["cta"].nunique()
    span_of = t.groupby("step").agg(lo=("start_ns", "min"), hi=("end_ns", "max"))
    t = t[t["phase"] != BARRIER_PHASE]                    # a CTA at a grid barrier streams nothing
    phases = sorted(t["phase"].unique(), key=_phase_key)
    acc = np.zeros((len(phases) + 1, 3))
    span = 0.0
    steps = t["step"].unique()
    for step, s in t.groupby("step"):
        lo = (s["start_ns"] + s["wait_ns"]).to_numpy(dtype=np.int64)
        hi = s["end_ns"].to_numpy(dtype=np.int64)
        ph = s["phase"].map({p: i for i, p in enumerate(phases)}).to_numpy()
        edges = np.unique(np.concatenate([lo, hi, span_of.loc[step].to_numpy(dtype=np.int64)]))
        counts = np.zeros((len(phases), len(edges)), dtype=np.int64)
        np.add.at(counts, (ph, np.searchsorted(edges, lo)), 1)
        np.add.at(counts, (ph, np.searchsorted(edges, hi)), -1)
        counts = counts.cumsum(axis=1)[:, :-1]             # on [edges[i], edges[i + 1])
        dt = np.diff(edges) / 1e3
        total = counts.sum(axis=0)
        who = np.where(total > 0, counts.argmax(axis=0), len(phases))
        band = np.select([total <= grid // 8, total <= grid // 2], [0, 1], 2)
        np.add.at(acc, (who, band), dt)
        span += dt.sum()
    tab = pd.DataFrame(acc / len(steps), index=phases + [NO_STREAM], columns=STREAMING_COLUMNS[1:4])
    tab["token_share_few"] = tab["few_us"] / (span / len(steps))
    return tab[tab[STREAMING_COLUMNS[1:4]].sum(axis=1) > 0].rename_axis("phase").reset_index()


GAP_COLUMNS = ["phase", "next_phase", "per_cta", "median_us", "p90_us", "us_per_cta", "barrier_us", "fence_us"]
ALL_GAPS = "all"


def gap_table(tl: pd.DataFrame, system: str) -> pd.DataFrame:
    """The gaps between a CTA's consecutive tasks over the traced tokens of `system`, by the phase of the task
    before (phase) and after (next_phase): how many a CTA has a token, their median and 90th percentile, and
    what they add up to a CTA a token; a last row (phase ALL_GAPS) sums every pair. A gap is what a CTA does
    between two tasks: decode the next task's row and, in targeted mode, publish the tiles it holds when the
    next task releases another counter (a CTA barrier and a release fence): most of the breakdown's "other".
    A pair whose median is far above the others' is a slow publish. Traced runs that stamp their publishes
    (the timeline's publish_ns and publish_barrier_ns) split it: barrier_us, the median CTA barrier of the
    gaps that published (the warps arriving), and fence_us, the rest of that publish (the release's fence
    and atomic); NaN without the stamps or without a publish. Needs the timeline's cta and start_ns columns;
    empty without them."""
    t = _system_tasks(tl, system, {"step", "phase", "cta", "start_ns", "end_ns"})
    if t is None:
        return pd.DataFrame(columns=GAP_COLUMNS)
    t = t.sort_values(["step", "cta", "start_ns"])
    nxt = t.groupby(["step", "cta"])
    stamped = {"publish_ns", "publish_barrier_ns"} <= set(t.columns)
    pub = nxt["publish_ns"].shift(-1) if stamped else pd.Series(0.0, index=t.index)
    bar = nxt["publish_barrier_ns"].shift(-1) if stamped else pd.Series(0.0, index=t.index)
    g = pd.DataFrame({"phase": t["phase"], "next_phase": nxt["phase"].shift(-1),
                      "gap": (nxt["start_ns"].shift(-1) - t["end_ns"]) / 1e3}).dropna()
    if g.empty:
        return pd.DataFrame(columns=GAP_COLUMNS)
    published = pub.loc[g.index] > 0
    g["barrier"] = (bar.loc[g.index] / 1e3).where(published)
    g["fence"] = ((pub.loc[g.index] - bar.loc[g.index]) / 1e3).where(published)
    per = t["step"].nunique() * t["cta"].nunique()       # CTA-tokens
    tab = g.groupby(["phase", "next_phase"]).agg(
        per_cta=("gap", "size"), median_us=("gap", "median"), p90_us=("gap", lambda x: x.quantile(0.9)),
        us_per_cta=("gap", "sum"), barrier_us=("barrier", "median"), fence_us=("fence", "median")).reset_index()
    tab[["per_cta", "us_per_cta"]] /= per
    tab = tab.sort_values(["phase", "next_phase"], key=lambda c: c.map(_phase_key)).reset_index(drop=True)
    total = {"phase": ALL_GAPS, "next_phase": "", "per_cta": len(g) / per, "median_us": g["gap"].median(),
             "p90_us": g["gap"].quantile(0.9), "us_per_cta": g["gap"].sum() / per,
             "barrier_us": g["barrier"].median(), "fence_us": g["fence"].median()}
    return pd.concat([tab, pd.DataFrame([total])], ignore_index=True)[GAP_COLUMNS]


ATTN_TIMING_COLUMNS = ["split", "start_us", "wait_end_us", "end_us", "merged", "layers"]


def attn_split_timing(tl: pd.DataFrame, attn: pd.DataFrame, system: str) -> pd.DataFrame:
    """When each attention split of one traced token (_traced_token) starts, ends its wait and ends, in us
    relative to the end of its layer's last qkv task, median over the layers and KV heads, with the share of
    them that merged. `attn` is the split stamps table (kog.engine.trace.attn_stamps_table: task, step,
    split, wait_ns, merged; `bench/engine_check.py --save-timeline --attn-stamps` writes attn_t<i>.parquet).
    It shows whether the splits wait on their layer's qkv phase (a wait that ends just after the phase,
    whenever the split started) or on something else, such as round trips queued behind the weight stream."""
    tok = _traced_token(tl, system, {"step", "task", "layer", "phase", "start_ns", "end_ns"})
    need = {"step", "task", "split", "wait_ns", "merged"}
    if tok is None or attn is None or attn.empty or not need <= set(attn.columns):
        return pd.DataFrame(columns=ATTN_TIMING_COLUMNS)
    qkv_end = tok[tok["phase"] == "qkv"].groupby("layer")["end_ns"].max()
    a = attn[attn["step"] == tok["step"].iloc[0]][["task", "split", "wait_ns", "merged"]]
    m = a.merge(tok[["task", "layer", "start_ns", "end_ns"]], on="task")
    m = m[m["layer"].isin(qkv_end.index)]
    if m.empty:
        return pd.DataFrame(columns=ATTN_TIMING_COLUMNS)
    ref = m["layer"].map(qkv_end)
    m = m.assign(start_us=(m["start_ns"] - ref) / 1e3, wait_end_us=(m["start_ns"] + m["wait_ns"] - ref) / 1e3,
                 end_us=(m["end_ns"] - ref) / 1e3, merged=m["merged"].astype(float))
    g = m.groupby("split")
    out = g[["start_us", "wait_end_us", "end_us"]].median().assign(merged=g["merged"].mean(),
                                                                    layers=g["layer"].nunique())
    return out.reset_index()[ATTN_TIMING_COLUMNS]
