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


def _optuna_figure(plot, alt: str, size: tuple[float, float], **kw) -> dict | str:
    """One of optuna.visualization.matplotlib's plots, embedded. They draw through pyplot: take the
    figure, embed it, close it so no pyplot state is left behind. An error comes back as its text."""
    try:
        import matplotlib
        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
        import numpy as np
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ax = plot(**kw)
            fig = np.asarray(ax).ravel()[0].figure
        try:
            fig.set_size_inches(*size)
            with warnings.catch_warnings():     # colour-bar axes: tight_layout warns, and still lays out
                warnings.simplefilter("ignore")
                fig.tight_layout()   # optuna lays out for its own size: rotated labels would be cut
            return embed_figure(fig, alt, None, "png", dpi=100)
        finally:
            plt.close(fig)
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


def _parallel_coordinates(study) -> dict | str:
    from optuna.visualization.matplotlib import plot_parallel_coordinate
    return _optuna_figure(plot_parallel_coordinate, "parallel coordinates of the trials' parameters", (11, 4.8),
                          study=study, target_name=_metric(study))


def _metric(study) -> str:
    """The objective's name as the study names it (set_metric_names), else tok/s."""
    try:
        names = study.metric_names
    except Exception:  # noqa: BLE001
        names = None
    return names[0] if names else "tok/s"


# ---- trials: what happened to each -----------------------------------------------------------------
REFUSED_PREFIX = "invalid:"      # kog.tune.objective's fail_reason for a config refused before any launch
OUTCOMES = ("complete", "pruned", "refused", "failed")


def outcome(state: str, reason: Any) -> str:
    """complete / pruned (stopped after a short measurement) / refused (the constraints rejected the config
    before any launch: PRUNED with fail_reason 'invalid: ...') / failed; other states lower-cased."""
    st = str(state).upper().split(".")[-1]
    if st == "PRUNED":
        return "refused" if str(reason or "").startswith(REFUSED_PREFIX) else "pruned"
    return {"COMPLETE": "complete", "FAIL": "failed"}.get(st, st.lower())


def with_outcome(df: pd.DataFrame) -> pd.DataFrame:
    reason = df["user_attrs_fail_reason"] if "user_attrs_fail_reason" in df else pd.Series(None, index=df.index)
    return df.assign(outcome=[outcome(s, r) for s, r in zip(df["state"], reason)])


def _cell_is_nested(v: Any) -> bool:
    return isinstance(v, (dict, list)) or (isinstance(v, str) and v[:1] in "{[")


def flat_columns(df: pd.DataFrame, cols: list[str]) -> list[str]:
    """The columns of `cols` whose cells are plain values: a dict or list (a config, a breakdown, JSON of
    one) is no table cell; the report shows those as their own columns or figures."""
    return [c for c in cols if c in df and not df[c].dropna().map(_cell_is_nested).any()]


def params_table(df: pd.DataFrame) -> pd.DataFrame:
    """number, outcome, value, one column per parameter, then the plain user attributes."""
    attrs = [c for c in df.columns if c.startswith("user_attrs_") and c not in ("user_attrs_fail_reason",
                                                                                "user_attrs_worker")]
    cols = ["number", "outcome", "value"] + _param_cols(df) + flat_columns(df, attrs)
    t = df[[c for c in cols if c in df]]
    return t.rename(columns=lambda c: c.replace("params_", "").replace("user_attrs_", ""))


def _as_dict(v: Any) -> dict | None:
    if isinstance(v, dict):
        return v
    if isinstance(v, str) and v.startswith("{"):
        import json
        try:
            d = json.loads(v)
            return d if isinstance(d, dict) else None
        except ValueError:
            return None
    return None


def default_trial(df: pd.DataFrame, attrs: dict[str, Any]):
    """The completed trial that ran the engine's default config (the search queues it first and tags it
    user_attrs 'baseline'; older studies: the trial whose parameters equal study attr 'engine_default')."""
    ok = df[df["outcome"] == "complete"]
    if "user_attrs_baseline" in ok:
        tagged = ok[ok["user_attrs_baseline"].notna()]
        if len(tagged):
            return tagged.iloc[0]
    want = attrs.get("engine_default")
    if isinstance(want, dict) and want:
        cols = {f"params_{k}": v for k, v in want.items() if f"params_{k}" in ok}
        if cols and len(cols) == len(_param_cols(ok)):
            hit = ok[[all(r[c] == v for c, v in cols.items()) for _, r in ok.iterrows()]]
            if len(hit):
                return hit.iloc[0]
    return None


def _best_vs_default(sec: Section, best, base, maximize: bool) -> None:
    """The best trial against the engine default: speed-up, the parameters that differ, and the time per
    token by category (and phase, where the trials recorded it) side by side."""
    speed = best["value"] / base["value"] if base["value"] else None
    sec.kv({"engine default (trial)": int(base["number"]), "default tok/s": float(base["value"]),
            "best (trial)": int(best["number"]), "best tok/s": float(best["value"]),
            "speed-up over the default": None if speed is None else f"{speed:.3f}x"})
    pcols = [c for c in best.index if c.startswith("params_")]
    diff = [(c[len("params_"):], base[c], best[c]) for c in pcols if str(base[c]) != str(best[c])]
    if diff:
        sec.table(pd.DataFrame(diff, columns=["parameter", "default", "best"]),
                  caption="parameters where the best differs from the default")
    bb, db = (_as_dict(x.get("user_attrs_breakdown")) for x in (best, base))
    if not (bb and db):
        sec.p("No per-category breakdown was recorded for these trials (GPU trials time whole tokens; "
              "`kogtune bench` has the breakdown of the stored config).")
        return
    rows = []
    for k in [k for k in bb if k in db]:
        b, d = _num(bb[k]), _num(db[k])
        if b is None or d is None:
            continue
        rows.append({"part": k, "default (us/token)": d * 1e6, "best (us/token)": b * 1e6,
                     "change (us)": (b - d) * 1e6})
    if rows:
        t = pd.DataFrame(rows)
        sec.table(t, caption="time per token by part, default vs best")
        sec.figure(F.compare_bars(list(t["part"]), list(t["default (us/token)"]), list(t["best (us/token)"]),
                                  f"default (trial {int(base['number'])})", f"best (trial {int(best['number'])})",
                                  "us per token"), "time per token by part: default against best")


def _confirmation(sec: Section, conf: dict[str, Any] | None) -> None:
    """The search's closing same-run measurements of the best and the default (kog.tune.search.confirm_best)."""
    if not conf:
        sec.p("No same-run confirmation: the best above was measured once, in its own trial (a search before "
              "confirmations, or one stopped before its end).")
        return
    if not conf.get("rounds"):
        sec.p("The best is the engine default: nothing to confirm.")
        return
    import statistics
    b, d = conf.get("best_tok_per_s") or [], conf.get("default_tok_per_s") or []
    gain = conf.get("gain")
    sec.kv({"confirmation rounds (alternating)": int(conf["rounds"]),
            "best tok/s (median)": statistics.median(b) if b else None,
            "default tok/s (median)": statistics.median(d) if d else None,
            "confirmed gain": None if gain is None else f"{gain:+.1%}"})
    if conf.get("errors"):
        sec.p("Confirmation runs that failed: " + "; ".join(conf["errors"]))
    if gain is not None and gain <= 0:
        sec.p("The best did not hold against the default when measured again: the search stored the engine "
              "default's config.")


def _num(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if x == x else None


def _sim_error_text(err: dict[str, Any] | None) -> str:
    if not isinstance(err, dict) or err.get("median_abs_pct") is None:
        return ("Its error against measurements was not recorded with this study "
                "(python -m kog.tune.simulator --calibration states it).")
    ring = (f"; the {err['ring_rows']} with the weight ring (the default engine path): median "
            f"{err['ring_median_abs_pct']:.1f} %, max {err['ring_max_abs_pct']:.0f} %"
            if err.get("ring_rows") and err.get("ring_median_abs_pct") is not None else "")
    return (f"The simulator's error against {err.get('rows', '?')} measured configs "
            f"({err.get('against', 'measured on the H200')}): median {err['median_abs_pct']:.1f} %, "
            f"max {err['max_abs_pct']:.0f} % (relative, tok/s){ring}.")


def study_sections(df: pd.DataFrame, study=None, run=None, info: dict[str, Any] | None = None,
                   attrs: dict[str, Any] | None = None) -> list[Section]:
    maximize = True
    if study is not None:
        try:
            maximize = study.direction.name == "MAXIMIZE"
        except Exception:  # multi-objective
            maximize = study.directions[0].name == "MAXIMIZE"
    attrs = attrs or {}
    state = df["state"].astype(str).str.split(".").str[-1] if "state" in df else pd.Series([], dtype=str)
    df = with_outcome(df.assign(state=state))
    ok = df[df["outcome"] == "complete"].dropna(subset=["value"]) if "value" in df else df.iloc[0:0]
    sections: list[Section] = []

    sec = Section("overview", "Study")
    if is_simulated(df, attrs):
        sec.note("SIMULATED: every value in this report is the cost model's prediction (kogtune search "
                 "--backend sim), not a measurement. " + _sim_error_text(attrs.get("simulator_error")), "sim")
    counts = df["outcome"].value_counts().to_dict()
    best = (ok.loc[ok["value"].idxmax()] if maximize else ok.loc[ok["value"].idxmin()]) if len(ok) else None
    sec.kv({**(info or {}), "objective": _metric(study) if study is not None else "tok/s",
            "direction": "maximize" if maximize else "minimize", "trials": len(df),
            **{f"{k} trials": counts.get(k, 0) for k in OUTCOMES},
            **{f"{k} trials": v for k, v in counts.items() if k not in OUTCOMES},
            "best value": None if best is None else float(best["value"]),
            "best trial": None if best is None else int(best["number"])})
    if best is not None:
        sec.table(pd.DataFrame([{c[len("params_"):]: best[c] for c in _param_cols(df)}]),
                  caption="the best trial's parameters")
    if attrs.get("dashboard"):
        sec.p(f"Browse the study live: {attrs['dashboard']}")
    sections.append(sec)

    sec = Section("default", "Best against the engine default")
    base = default_trial(df, attrs) if best is not None else None
    if best is None:
        sec.missing("no completed trial to compare.")
    elif base is None:
        sec.missing("no completed trial ran the engine's default config (the search queues it first; a study "
                    "made before that, or one whose default failed, has none).")
    else:
        _best_vs_default(sec, best, base, maximize)
        _confirmation(sec, attrs.get("confirmation"))
    sections.append(sec)

    sec = Section("history", "Optimization history")
    if len(df) and "value" in df:
        sec.figure(F.study_history(df, maximize), "objective per trial with best so far, every trial shown",
                   caption=f"all {len(df)} trials: completed as dots, pruned and refused at the bottom")
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
            from optuna.visualization.matplotlib import plot_param_importances
            r = _optuna_figure(plot_param_importances, "parameter importances (Optuna)", (8, 0.4 * len(imp) + 1.6),
                               study=study, evaluator=_evaluator(how), target_name=_metric(study))
            sec.blocks.append(Block("figure", r)) if isinstance(r, dict) else \
                sec.figure(F.importances(imp), "parameter importances")
            sec.p(f"Evaluator: {how}.")
        else:
            sec.missing("parameter importances could not be computed.", how)
    sections.append(sec)

    sec = Section("parallel", "Parallel coordinates and slices")
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
        from optuna.visualization.matplotlib import plot_slice
        n = max(1, len(_param_cols(df)))
        r = _optuna_figure(plot_slice, "objective against each parameter (Optuna slice plot)",
                           (min(3.0 * n, 15), 3.4), study=study, target_name=_metric(study))
        if isinstance(r, dict):
            sec.blocks.append(Block("figure", r))
    sections.append(sec)

    sec = Section("top", f"Top {TOP_N} configurations")
    if len(ok):
        top = ok.sort_values("value", ascending=not maximize).head(TOP_N)
        sec.table(params_table(top).drop(columns="outcome").dropna(axis=1, how="all"))
    else:
        sec.missing("no completed trial.", error_for(run, "trial", "search") if run is not None else None)
    sections.append(sec)

    sec = Section("trials", "Every trial")
    if len(df):
        sec.table(params_table(df.sort_values("number")).dropna(axis=1, how="all"), max_rows=len(df),
                  caption="one row per trial, one column per parameter")
    else:
        sec.missing("no trials yet.")
    sections.append(sec)

    sections.append(_not_completed(df))
    return sections


def _evaluator(name: str | None):
    import optuna
    if name == "PedAnovaImportanceEvaluator":
        return optuna.importance.PedAnovaImportanceEvaluator()
    return optuna.importance.FanovaImportanceEvaluator(seed=0)


def is_simulated(df: pd.DataFrame, attrs: dict[str, Any]) -> bool:
    """A --backend sim study: its user attrs say so, or its trials carry 'simulated'."""
    if attrs.get("backend") == "sim":
        return True
    col = df.get("user_attrs_simulated")
    return bool(col is not None and col.fillna(False).astype(bool).any())


def _not_completed(df: pd.DataFrame) -> Section:
    """Failed, pruned and refused trials, each kind apart with its reasons."""
    sec = Section("failed", "Failed, pruned and refused trials")
    reason = df["user_attrs_fail_reason"] if "user_attrs_fail_reason" in df else pd.Series(None, index=df.index)
    params = df[_param_cols(df)].rename(columns=lambda c: c[len("params_"):])
    what = {"failed": "failed (crash, timeout, wrong result): kept with the reason, never counted as a best",
            "pruned": "pruned: stopped after a short measurement that was slower than most trials so far",
            "refused": "refused before launch: the constraints rejected the config, no GPU time spent"}
    for kind, text in what.items():
        sel = df["outcome"] == kind
        n = int(sel.sum())
        if not n:
            sec.p(f"No trial {kind}.")
            continue
        sec.p(f"{n} trial(s) {text}.")
        t = pd.concat([pd.DataFrame({"number": df.loc[sel, "number"],
                                     "reason": reason[sel].fillna("(no reason recorded)")}), params[sel]], axis=1)
        sec.table(t, caption=kind)
        if kind != "pruned":
            by = t["reason"].astype(str).str.split(":").str[0].value_counts()
            sec.table(pd.DataFrame({"kind of " + kind: by.index, "trials": by.values}), caption="by kind")
    return sec


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
    attrs = _study_attrs(study, run)
    dev = ((run.meta.get("device") or {}).get("name") if run is not None else None) or attrs.get("device")
    sim = is_simulated(df, attrs)
    facts = {"study": name, "device": dev, "backend": "SIMULATED (cost model)" if sim else attrs.get("backend"),
             "trials": len(df), **({"status": run.status, "run": Path(run.path).name} if run is not None else {})}
    banner = ("SIMULATED study (--backend sim): the tok/s here are the cost model's predictions, not "
              "measurements. " + _sim_error_text(attrs.get("simulator_error"))) if sim else None
    return render_page(Path(out), f"kog tuning report: {name}" + (" (SIMULATED)" if sim else ""),
                       "What the search tried, what mattered, what won against the engine's default, and what "
                       "failed and why.", facts, study_sections(df, study, run, info, attrs), "study",
                       extra={"banner": banner})


def _study_attrs(study, run) -> dict[str, Any]:
    """The study's user attributes (backend, device, engine_default, simulator_error, ...): from the study,
    else from the summary.json of its run."""
    attrs: dict[str, Any] = {}
    if run is not None and run.has_json("summary"):
        try:
            summ = run.json("summary")
            attrs.update(summ.get("attrs") or {})
            for k in ("backend", "dashboard"):
                if summ.get(k) is not None:
                    attrs.setdefault(k, summ[k])
        except Exception:  # noqa: BLE001 - a report shows what it can
            pass
    if study is not None:
        attrs.update(study.user_attrs)
    return attrs
