"""The tuning report of an Optuna study: history with best-so-far, parameter importances, parallel
coordinates, the top configurations, and every failed trial with its reason (user attribute
'fail_reason', written by kogtune's trial runner).

A study comes as an optuna.Study, or as a study run whose meta.json (or study.json) names `study_name`
and `storage` (a storage URL; a relative sqlite path is relative to the run directory), or as a run
with only a `trials` table (study.trials_dataframe() format): then importances and parallel
coordinates are left out and the report says so.
"""
from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from kog.errors import UsageError
from kog.reports import figures as F
from kog.reports.html import Block, Section, embed_figure, error_for, render_page

TOP_N = 10


def mask_url(url: str | None) -> str | None:
    """A storage URL with its password hidden (a report gets mailed around)."""
    return re.sub(r"(//[^:/@]+):[^@/]*@", r"\1:***@", url) if url else url


def resolve_storage(storage: str, base: Path | None) -> str:
    """A storage URL; 'sqlite:///rel.db' and bare file paths are taken relative to `base`."""
    if "://" not in storage:
        p = Path(storage)
        return f"sqlite:///{(base / p) if base is not None and not p.is_absolute() else p}"
    if storage.startswith("sqlite:///") and base is not None:
        rest = storage[len("sqlite:///"):]
        if rest and not rest.startswith("/") and not Path(rest).exists():
            return f"sqlite:///{base / rest}"
    return storage


def _study_ref(run) -> tuple[str | None, str | None]:
    meta = run.meta
    name = meta.get("study_name") or meta.get("study")
    storage = meta.get("storage")
    if run.has_json("study"):
        try:
            d = run.json("study")
            name = name or d.get("study_name") or d.get("name")
            storage = storage or d.get("storage")
        except Exception:
            pass
    if storage is None:
        dbs = sorted(p for p in Path(run.path).iterdir() if p.suffix in (".db", ".sqlite", ".sqlite3"))
        if dbs:
            storage = f"sqlite:///{dbs[0]}"
    return name, storage


def load_study(study_name: str | None, storage: str, base: Path | None = None):
    """optuna.load_study with one clear error line; with no name, the storage's only study."""
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = resolve_storage(storage, base)
    try:
        if study_name is None:
            names = optuna.study.get_all_study_names(storage=url)
            if len(names) != 1:
                raise UsageError(f"storage {mask_url(url)} holds {len(names)} studies "
                                 f"({', '.join(names) or 'none'}): name one with --study")
            study_name = names[0]
        return optuna.load_study(study_name=study_name, storage=url)
    except UsageError:
        raise
    except KeyError:
        raise UsageError(f"no study named {study_name!r} in {mask_url(url)}") from None
    except Exception as e:  # noqa: BLE001 - bad URL, unreachable server, corrupt file
        raise UsageError(f"cannot open Optuna storage {mask_url(url)}: {type(e).__name__}: {e}") from None


def trials_frame(study, attrs: tuple[str, ...] = ("number", "value", "state", "params", "user_attrs",
                                                  "duration")) -> pd.DataFrame:
    """study.trials_dataframe with the objective in a column named 'value' whatever Optuna calls it
    ('values_0' for a multi-objective study, 'value_<metric name>' once set_metric_names was called)."""
    df = study.trials_dataframe(attrs=attrs)
    if "value" not in df:
        named = [c for c in df.columns if c.startswith(("value_", "values_"))]
        if named:
            df = df.rename(columns={named[0]: "value"})
    return df


def _param_cols(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c.startswith("params_")]


def _importances(study) -> tuple[dict[str, float] | None, str | None]:
    import optuna
    errors = []
    evaluators = []
    try:
        evaluators.append(optuna.importance.FanovaImportanceEvaluator(seed=0))
    except Exception as e:  # noqa: BLE001
        errors.append(f"fANOVA: {e}")
    if hasattr(optuna.importance, "PedAnovaImportanceEvaluator"):
        evaluators.append(optuna.importance.PedAnovaImportanceEvaluator())
    for ev in evaluators:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                imp = optuna.importance.get_param_importances(study, evaluator=ev)
            if imp:
                return {k: float(v) for k, v in imp.items()}, type(ev).__name__
        except Exception as e:  # noqa: BLE001 - e.g. too few trials, one-valued params, missing sklearn
            errors.append(f"{type(ev).__name__}: {type(e).__name__}: {e}")
    return None, "; ".join(errors) or "no evaluator available"


def _parallel_coordinates(study) -> dict | str:
    """optuna's matplotlib parallel-coordinate plot (it draws through pyplot: take its figure, embed it,
    close it so no pyplot state is left behind)."""
    try:
        import matplotlib
        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
        from optuna.visualization.matplotlib import plot_parallel_coordinate
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ax = plot_parallel_coordinate(study)
        fig = ax.figure
        try:
            fig.set_size_inches(11, 4.8)
            fig.tight_layout()   # optuna lays out for its own size: rotated labels would be cut
            return embed_figure(fig, "parallel coordinates of the trials' parameters", None, "png", dpi=100)
        finally:
            plt.close(fig)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


def study_sections(df: pd.DataFrame, study=None, run=None, info: dict[str, Any] | None = None) -> list[Section]:
    maximize = True
    if study is not None:
        try:
            maximize = study.direction.name == "MAXIMIZE"
        except Exception:  # multi-objective
            maximize = study.directions[0].name == "MAXIMIZE"
    state = df["state"].astype(str) if "state" in df else pd.Series([], dtype=str)
    df = df.assign(state=state)
    ok = df[df["state"] == "COMPLETE"].dropna(subset=["value"]) if "value" in df else df.iloc[0:0]
    sections: list[Section] = []

    sec = Section("overview", "Study")
    counts = state.value_counts().to_dict()
    best = (ok.loc[ok["value"].idxmax()] if maximize else ok.loc[ok["value"].idxmin()]) if len(ok) else None
    sec.kv({**(info or {}), "direction": "maximize" if maximize else "minimize", "trials": len(df),
            **{f"{k.lower()} trials": v for k, v in counts.items()},
            "best value": None if best is None else float(best["value"]),
            "best trial": None if best is None else int(best["number"])})
    if best is not None:
        sec.kv({c[len("params_"):]: best[c] for c in _param_cols(df)})
    sections.append(sec)

    sec = Section("history", "Optimization history")
    if len(df) and "value" in df:
        sec.figure(F.study_history(df, maximize), "objective per trial with best so far")
    else:
        sec.missing("no trials yet.")
    sections.append(sec)

    sec = Section("importance", "Parameter importances")
    if study is None:
        sec.missing("parameter importances need the Optuna study; this run has only a trials table.")
    elif len(ok) < 2:
        sec.missing(f"parameter importances need at least 2 completed trials ({len(ok)} so far).")
    else:
        imp, how = _importances(study)
        if imp:
            sec.figure(F.importances(imp), "parameter importances")
            sec.p(f"Evaluator: {how}.")
        else:
            sec.missing("parameter importances could not be computed.", how)
    sections.append(sec)

    sec = Section("parallel", "Parallel coordinates")
    if study is None:
        sec.missing("parallel coordinates need the Optuna study; this run has only a trials table.")
    elif len(ok) < 2:
        sec.missing(f"parallel coordinates need at least 2 completed trials ({len(ok)} so far).")
    else:
        r = _parallel_coordinates(study)
        if isinstance(r, dict):
            sec.blocks.append(Block("figure", r))
        else:
            sec.missing("parallel coordinates could not be drawn.", r)
    sections.append(sec)

    sec = Section("top", f"Top {TOP_N} configurations")
    if len(ok):
        top = ok.sort_values("value", ascending=not maximize).head(TOP_N)
        cols = ["number", "value"] + _param_cols(df) + [c for c in df.columns if c.startswith("user_attrs_")
                                                          and c != "user_attrs_fail_reason"]
        t = top[[c for c in cols if c in top]].rename(columns=lambda c: c.replace("params_", "").replace("user_attrs_", ""))
        sec.table(t.dropna(axis=1, how="all"))
    else:
        sec.missing("no completed trial.", error_for(run, "trial", "search") if run is not None else None)
    sections.append(sec)

    sec = Section("failed", "Failed trials")
    bad = df[df["state"] == "FAIL"]
    if len(bad):
        reason = bad["user_attrs_fail_reason"] if "user_attrs_fail_reason" in bad else pd.Series(None, index=bad.index)
        t = pd.DataFrame({"number": bad["number"], "reason": reason.fillna("(no reason recorded)")})
        t = pd.concat([t, bad[_param_cols(df)].rename(columns=lambda c: c[len("params_"):])], axis=1)
        sec.p(f"{len(bad)} trial(s) failed; each failure is kept with its reason and never counts as a best.")
        sec.table(t)
        by = t["reason"].astype(str).str.split(":").str[0].value_counts()
        sec.table(pd.DataFrame({"kind of failure": by.index, "trials": by.values}), caption="by kind")
    else:
        sec.p("No trial failed.")
    pruned = int((df["state"] == "PRUNED").sum())
    if pruned:
        sec.p(f"{pruned} trial(s) were pruned after a short measurement (slower than the running median).")
    sections.append(sec)
    return sections


def render_study_report(study_or_run, out: str | Path | None = None, storage: str | None = None) -> Path:
    """Render the tuning report of an optuna.Study, a study run (or its path) to `out` (default
    RUN/report.html; for a bare Study, ./<study name>-report.html)."""
    run = None
    study = None
    info: dict[str, Any] = {}
    if isinstance(study_or_run, (str, Path)):
        from kog.runstore import open_run
        study_or_run = open_run(study_or_run)
    if hasattr(study_or_run, "trials_dataframe"):
        study = study_or_run
        df = trials_frame(study)
        info = {"study": study.study_name}
    else:
        run = study_or_run
        if getattr(run, "kind", None) not in ("study", "sweep"):
            raise UsageError(f"render_study_report needs a study run, got a {getattr(run, 'kind', '?')} run: "
                             f"{run.path}")
        name, url = _study_ref(run)
        url = storage or url
        load_error = None
        if url:
            try:
                study = load_study(name, url, Path(run.path))
                df = trials_frame(study)
                info = {"study": study.study_name, "storage": mask_url(url)}
            except UsageError as e:
                # a redacted or unreachable storage (e.g. PostgreSQL on another host): the run's own
                # trials table still tells most of the story
                if not run.has_table("trials"):
                    raise
                load_error = str(e)
        if study is None:
            if not run.has_table("trials"):
                raise UsageError(f"study run {run.path} names no Optuna storage and has no trials table")
            df = run.table("trials")
            info = {"study": name, "storage": mask_url(url)}
            if load_error:
                info["storage not opened"] = load_error
    if out is None:
        out = Path(run.path) / "report.html" if run is not None else Path(f"{study.study_name}-report.html")
    elif Path(out).is_dir():     # a run directory given as the destination
        out = Path(out) / "report.html"
    name = info.get("study") or "study"
    dev = ((run.meta.get("device") or {}).get("name") if run is not None else None) or \
        (study.user_attrs.get("device") if study is not None else None)
    facts = {"study": name, "device": dev, "trials": len(df),
             **({"status": run.status, "run": Path(run.path).name} if run is not None else {})}
    return render_page(Path(out), f"kog tuning report: {name}",
                       "What the search tried, what mattered, what won, and what failed and why.",
                       facts, study_sections(df, study, run, info), "study")
