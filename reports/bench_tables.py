"""Bench tables shared by the bench (which writes them) and the engine report (which reads them, or
derives them from a bench JSON that has no run directory). pandas only: no matplotlib here.

The per-phase breakdown comes from a kog system's breakdown_extra['phases'] ({phase: {seconds_per_token,
waiting, tasks}}, engine/trace.py): in a phase, `waiting` is the targeted wait for producers and the rest
of its time is streaming; the grid mode's 'barrier' phase is all barrier. The token's remainder (task
decode, sampling, the token hand-off) is the system's `other` and shows as its own phase, so the rows of
a system add up to its per-system breakdown.
"""
from __future__ import annotations

from typing import Any

import pandas as pd

BREAKDOWN_COLUMNS = ["system", "phase", "category", "seconds_per_token"]
BARRIER_PHASE = "barrier"
OTHER_PHASE = "other"
# a decode step's order (engine/plan.py TASK_NAMES), then the barriers and the token's remainder
PHASE_ORDER = ("qkv", "attn", "o", "gate_up", "down", "lm", BARRIER_PHASE, OTHER_PHASE)


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
