"""The engine report of a bench run: every system's tok/s against the bandwidth limit, where a token's
time goes (streaming / waiting / barrier / other) in grid-sync vs targeted-wait mode, a per-SM timeline
of an instrumented run, the share of token time lost to grid sync (the published monokernel system
measured 35% on standard stacks), and a gzipped Chrome trace per kog mode in the run folder for Perfetto.

Inputs: bench.json (the document `kogtune bench` writes; `--out FILE` copies it), optional tables `breakdown`
[system, phase, category, seconds_per_token] and `timeline` [cta, sm, task, phase, kind, start_ns, end_ns]
(+ optional 'system'; or the engine's raw trace with wait_ns). A committed bench JSON file
(bench/h200/<preset>.json) renders too: its per-phase breakdown comes from the systems'
breakdown_extra.phases (kog.reports.bench_tables), and it has no timeline.

The grid-sync share of a system is its barrier seconds per token (instrumented run) over its seconds per
token (the bench's timed runs, 1 / tok_per_s); without a timed rate, over the breakdown's total.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd

from kog.errors import UsageError
from kog.reports import figures as F
from kog.reports.bench_tables import (critical_path_table, fastest_baseline, layer_segments, model_shapes_of,
                                      phase_breakdown, phase_table, phase_weight_bytes, rel_errs, spread,
                                      streaming_table, tail_table)
from kog.reports.html import Section, corrupt_files, error_for, note_corrupt, render_page, table_or_none

PUBLISHED_GRID_SYNC_SHARE = 0.35   # the published monokernel system's grid-sync share on standard stacks
CATEGORIES = ("streaming", "waiting", "barrier", "other")
TAIL_HEADERS = {"tail_us": "ended later (us)", "late_start_us": "began later (us)", "more_wait_us": "waited more (us)",
                "more_busy_us": "streamed longer (us)", "more_tasks": "more tasks",
                "same_last_next": "same CTA last next token", "distinct_last": "CTAs ever last",
                "groups": "layers x tokens"}
STREAMING_HEADERS = {"few_us": "at most 1/8 of the CTAs streaming (us)", "half_us": "at most 1/2 (us)",
                     "most_us": "more than 1/2 (us)", "token_share_few": "share of the token with at most 1/8"}
BENCH_JSON_NAMES = ("bench", "results", "summary")


def _timeline_tables(sec: Section, tl: pd.DataFrame, systems: list[str], table_of, headers: dict[str, str],
                     caption: str, intro: str) -> None:
    """One table a system from the timeline (table_of(tl, system)), under one paragraph; nothing when every
    system's table is empty."""
    tabs = [(n, table_of(tl, n)) for n in systems]
    tabs = [(n, t) for n, t in tabs if not t.empty]
    if tabs:
        sec.p(intro)
        for n, t in tabs:
            sec.table(t.rename(columns=headers).round(3).dropna(axis=1, how="all"), caption=caption.format(n))


class JsonBench:
    """A bench JSON file outside any run directory, read like a run that has only its document."""

    kind = "bench"
    status = "complete"

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.doc = json.loads(self.path.read_text())
        except Exception as e:
            raise UsageError(f"not a readable bench JSON: {self.path} ({e})") from None
        if not isinstance(self.doc, dict) or "systems" not in self.doc:
            raise UsageError(f"not a bench JSON: {self.path} has no 'systems'")
        self.meta = {"kind": "bench", "device": {"name": device_name(self.doc)},
                     "git_commit": self.doc.get("git_commit"), "started": self.doc.get("date")}

    def has_table(self, name: str) -> bool:
        return False

    def has_json(self, name: str) -> bool:
        return name == "bench"

    def json(self, name: str):
        return self.doc


def device_name(doc: dict[str, Any] | None) -> str | None:
    """bench.json's device: the DeviceInfo dict `kogtune bench` writes, or a bare name."""
    d = (doc or {}).get("device")
    if isinstance(d, dict):
        return d.get("name") or d.get("arch")
    return None if d is None else str(d)


def bench_document(run) -> dict[str, Any] | None:
    for name in BENCH_JSON_NAMES:
        if run.has_json(name):
            try:
                d = run.json(name)
            except Exception:
                continue
            if isinstance(d, dict) and isinstance(d.get("systems"), dict):
                return d
    return None


def _clocks(s: dict[str, Any]) -> str | None:
    """'start / end' SM clock (MHz) of a system's timed runs, None when the GPU state was not read."""
    mhz = [(s.get(k) or {}).get("sm_mhz") for k in ("gpu_start", "gpu_end")]
    return None if all(m is None for m in mhz) else " / ".join("–" if m is None else str(m) for m in mhz)


def _tps(s: Any) -> float:
    try:
        return float(s.get("tok_per_s")) if isinstance(s, dict) else float("nan")
    except (TypeError, ValueError):
        return float("nan")


def system_breakdowns(doc: dict[str, Any] | None, bd: pd.DataFrame | None) -> dict[str, dict[str, float]]:
    """Seconds per token per category for each system: bench.json's per-system breakdown, else the sum
    of the per-phase table."""
    out: dict[str, dict[str, float]] = {}
    for name, s in ((doc or {}).get("systems") or {}).items():
        b = s.get("breakdown") if isinstance(s, dict) else None
        if isinstance(b, dict) and b:
            out[name] = {k: float(v) for k, v in b.items() if isinstance(v, (int, float))}
    if bd is not None and {"system", "category", "seconds_per_token"} <= set(bd.columns):
        for name, g in bd.groupby("system", sort=False):
            out.setdefault(str(name), g.groupby("category")["seconds_per_token"].sum().to_dict())
    return out


def write_chrome_trace(tl: pd.DataFrame, path: Path, system: str | None = None) -> Path:
    """Trace-event JSON (Perfetto / chrome://tracing): one complete ('X') event per timeline row,
    pid = SM, tid = CTA, times in microseconds from the first stamp; gzipped when `path` ends in .gz
    (Perfetto and chrome://tracing open it as it is)."""
    t0 = int(tl["start_ns"].min()) if len(tl) else 0
    events: list[dict[str, Any]] = []
    for sm in sorted(tl["sm"].unique()):
        events.append({"name": "process_name", "ph": "M", "pid": int(sm), "args": {"name": f"SM {int(sm)}"}})
    cols = [c for c in ("cta", "sm", "task", "phase", "kind", "start_ns", "end_ns") if c in tl]
    for r in tl[cols].itertuples(index=False):
        d = r._asdict()
        events.append({"name": str(d.get("phase", d.get("kind"))), "cat": str(d.get("kind", "")), "ph": "X",
                       "ts": (int(d["start_ns"]) - t0) / 1e3, "dur": max(int(d["end_ns"]) - int(d["start_ns"]), 0) / 1e3,
                       "pid": int(d["sm"]), "tid": int(d["cta"]),
                       "args": {"task": int(d["task"]) if "task" in d else None, "kind": str(d.get("kind"))}})
    doc = {"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"producer": "kog", "system": system}}
    data = json.dumps(doc, separators=(",", ":")).encode()
    if str(path).endswith(".gz"):
        import gzip
        data = gzip.compress(data, compresslevel=6, mtime=0)    # mtime 0: the same run gives the same bytes
    _write_output(Path(path), data)
    return path


def _write_output(path: Path, data: bytes) -> None:
    """Every file this module writes goes through here (atomic, through the run store's writer)."""
    from kog.runstore import atomic_write_bytes
    atomic_write_bytes(path, data)


def trace_path(run, out: Path, suffix: str) -> Path:
    """Where a bench's Chrome trace goes: gzipped inside its run folder, so re-rendering a report elsewhere
    (`kogtune report --bundled` into the current folder) leaves no trace files there; beside the report
    when the run folder cannot take it (a bench JSON file, a read-only installed package)."""
    import os
    name = f"timeline{suffix}.trace.json.gz"
    base = Path(getattr(run, "path", out.parent))
    if base.is_dir() and os.access(base, os.W_OK):
        return base / name
    return out.with_name(f"{out.stem}.{name}")


def _href(target: Path, page: Path) -> str:
    """A link from the page to `target`: relative where one exists (the pair moves together), else file://."""
    import os
    try:
        return os.path.relpath(Path(target).resolve(), Path(page).resolve().parent)
    except ValueError:      # another drive (Windows)
        return Path(target).resolve().as_uri()


def timeline_spans(tl: pd.DataFrame) -> pd.DataFrame:
    """The timeline as spans with a `kind`. The engine's raw trace table has one row per task with
    `wait_ns` (the targeted wait at its start) instead of a kind: split it into a waiting span and a
    streaming span; tasks of phase 'barrier' are barrier spans."""
    if "kind" in tl.columns or "wait_ns" not in tl.columns:
        return tl
    tl = tl.copy()
    is_bar = tl["phase"].astype(str).eq("barrier") if "phase" in tl else pd.Series(False, index=tl.index)
    wait = tl["wait_ns"].fillna(0).clip(lower=0).astype("int64")
    mid = (tl["start_ns"] + wait).clip(upper=tl["end_ns"])
    waits = tl[~is_bar & (wait > 0)].assign(kind="waiting", end_ns=mid[~is_bar & (wait > 0)])
    work = tl[~is_bar].assign(kind="streaming", start_ns=mid[~is_bar])
    bars = tl[is_bar].assign(kind="barrier")
    out = pd.concat([waits, work, bars]).drop(columns=["wait_ns"])
    return out.sort_values(["cta", "start_ns"]).reset_index(drop=True)


def grid_sync_shares(doc: dict[str, Any] | None, per_system: dict[str, dict[str, float]],
                     names: list[str]) -> list[tuple[str, float, float, str]]:
    """(system, barrier share, waiting share, denominator) for each system with a breakdown: seconds per
    token in grid barriers / in targeted waits over the system's timed seconds per token (1 / tok_per_s)
    when the bench has one, else over the breakdown's total."""
    systems = (doc or {}).get("systems") or {}
    out = []
    for n in names:
        b = per_system[n]
        tps = _tps(systems.get(n, {}))
        if tps == tps and tps > 0:
            total, what = 1.0 / tps, "timed seconds per token"
        else:
            total, what = sum(b.values()), "breakdown total"
        if total > 0:
            out.append((n, b.get("barrier", 0.0) / total, b.get("waiting", 0.0) / total, what))
    return out


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", s).strip("-").lower() or "trace"


def bench_sections(run, out: Path) -> list[Section]:
    doc = bench_document(run)
    bd = table_or_none(run, "breakdown")
    if (bd is None or "phase" not in bd.columns or bd.empty) and doc:
        # a bench JSON (or an older run) without the per-phase table: derive it from breakdown_extra.phases
        derived = phase_breakdown(doc.get("systems") or {})
        if not derived.empty:
            bd = derived
    tl = table_or_none(run, "timeline")
    sections: list[Section] = []
    systems: dict[str, Any] = (doc or {}).get("systems") or {}
    limit = (doc or {}).get("limit_tok_per_s")
    if not limit and doc and doc.get("copy_GBps") and doc.get("weight_bytes_per_token"):
        limit = doc["copy_GBps"] * 1e9 / doc["weight_bytes_per_token"]

    sec = Section("overview", "Benchmark")
    if doc is None:
        bad = [f"{f} is corrupt ({why})" for f, why in corrupt_files(run).items()
               if f in {f"{n}.json" for n in BENCH_JSON_NAMES}]
        sec.missing("; ".join(bad) + "." if bad else
                    "bench.json: this run has no benchmark document (the bench did not finish).",
                    error_for(run, "bench"))
    else:
        sec.kv({"model": doc.get("model"), "dtype": doc.get("dtype"), "prompt tokens": doc.get("prompt_tokens"),
                "new tokens": doc.get("new_tokens"), "device": device_name(doc), "date": doc.get("date"),
                "git commit": doc.get("git_commit"),
                "device copy (GB/s)": doc.get("copy_GBps"),
                "weight bytes per token": doc.get("weight_bytes_per_token"),
                "bandwidth limit (tok/s)": limit})
        if doc.get("versions"):
            sec.kv({f"{k}": v for k, v in doc["versions"].items()})
    note_corrupt(sec, run)
    errs = run.meta.get("errors") or {}
    if errs:
        sec.note(f"{len(errs)} part(s) of the bench recorded an error: "
                 + "; ".join(f"{k}: {v}" for k, v in errs.items()), "warn")
    sections.append(sec)

    sec = Section("throughput", "Tokens per second against the bandwidth limit")
    if not systems:
        sec.missing("no systems were measured (bench.json 'systems' is empty or missing).", error_for(run, "bench"))
    else:
        names = sorted(systems, key=lambda n: -(_tps(systems[n]) if _tps(systems[n]) == _tps(systems[n]) else -1))
        tps = [_tps(systems[n]) for n in names]
        sec.p("Batch-1 decode. The limit is the device-to-device copy bandwidth measured in the same run divided "
              "by the bytes of weights every token must read.")
        sec.figure(F.toks_vs_limit(names, [0.0 if v != v else v for v in tps], limit), "tokens per second by system")
        base_name, base = fastest_baseline(doc)
        if base_name:
            sec.p(f"Ratios are against the fastest baseline of this run, {base_name}; min and max are over each "
                  "system's timed runs; the GPU's SM clock and its clock event (throttle) reasons are read at the "
                  "start and the end of each system's runs.")
        rows = []
        for n, v in zip(names, tps):
            s = systems[n] if isinstance(systems[n], dict) else {}
            lo, hi = spread(s)
            rows.append({"system": n, "tok/s (median)": v, "min": lo, "max": hi,
                         "runs": len(s.get("runs_tok_per_s") or []) or None, "new tokens": s.get("new_tokens"),
                         "% of limit": (100 * v / limit) if limit else None,
                         f"x {base_name}": (v / base) if base_name and v == v else None,
                         "SM MHz start / end": _clocks(s),
                         "clock events": ", ".join(sorted({r for k in ("gpu_start", "gpu_end")
                                                           for r in ((s.get(k) or {}).get("clock_event_reasons")
                                                                     or [])})) or None,
                         "max rel err vs float32": rel_errs(doc, s)[0],
                         f"vs {doc.get('dtype', 'model-dtype')} reference": rel_errs(doc, s)[1],
                         "compile (s)": s.get("compile_seconds"),
                         "config": s.get("config_source"),
                         "note": s.get("note") or s.get("stopped_early"),
                         "error": s.get("error") or s.get("max_rel_err_error") or s.get("breakdown_error")
                         or error_for(run, n)})
        table = pd.DataFrame(rows)
        sec.table(table.dropna(axis=1, how="all"))
        r32 = doc.get("reference_max_rel_err_vs_fp32")
        if isinstance(r32, (int, float)):
            sec.p(f"Errors are teacher-forced: against the reference computed in float32 over the same weights, "
                  f"and against the same reference run in the model dtype, which itself is at {r32:.2e} from the "
                  f"float32 one: the scale of bf16/fp16 rounding noise for this model.")
    sections.append(sec)

    per_system = system_breakdowns(doc, bd)
    kog_systems = [n for n in ("kog-grid", "kog-targeted") if n in per_system] + \
        [n for n in per_system if n not in ("kog-grid", "kog-targeted")]
    sec = Section("breakdown", "Where a token's time goes: grid sync vs targeted wait")
    if bd is not None and {"system", "phase", "category", "seconds_per_token"} <= set(bd.columns):
        sec.p("Seconds per token in each phase, split into streaming weights, waiting for producers (targeted), "
              "grid barriers and other work.")
        try:
            order = [n for n in ("kog-grid", "kog-targeted") if n in set(bd["system"])] + \
                [n for n in dict.fromkeys(bd["system"]) if n not in ("kog-grid", "kog-targeted")]
            sec.figure(F.stacked_breakdown(bd, "phase", order), "per-phase stacked bars by category")
        except Exception as e:  # noqa: BLE001
            sec.missing("the per-phase breakdown could not be drawn.", f"{type(e).__name__}: {e}")
        try:
            sec.table(phase_table(bd[bd["system"].isin(order)]),
                      caption="Per phase: microseconds per token by category and the phase's share of the "
                              "system's token time ('other' is the token's remainder: task decode, sampling, "
                              "the token hand-off).")
        except Exception as e:  # noqa: BLE001
            sec.missing("the per-phase table could not be built.", f"{type(e).__name__}: {e}")
    elif bd is not None:
        sec.note("The 'breakdown' table has no per-phase split (no 'phase' column): per-system totals only.",
                 "warn")
    else:
        sec.missing("per-phase breakdown: this run has no 'breakdown' table; the per-system totals follow.",
                    error_for(run, "breakdown", "instrument"))
    if per_system:
        long = pd.DataFrame([(n, c, v) for n in kog_systems for c, v in per_system[n].items()],
                            columns=["system", "category", "seconds_per_token"])
        sec.figure(F.stacked_breakdown(long, "system", kog_systems), "stacked time per token by system")
        wide = long.pivot_table(index="system", columns="category", values="seconds_per_token", aggfunc="sum")
        wide = (wide.reindex(kog_systems) * 1e6).add_suffix(" (us)")
        wide["total (us)"] = wide.sum(axis=1)
        wide.columns.name = None
        sec.table(wide.reset_index())
    else:
        sec.missing("no system reports a time breakdown (bench.json systems[*].breakdown).",
                    error_for(run, "breakdown"))
    sections.append(sec)

    sec = Section("critical-path", "The critical path of a layer")
    seg_tables = []
    if tl is not None and {"step", "layer", "phase", "end_ns"} <= set(tl.columns):
        pb = phase_weight_bytes(model_shapes_of(doc))
        for n in kog_systems:
            seg = layer_segments(tl, n, (doc or {}).get("copy_GBps"), pb)
            if not seg.empty:
                seg_tables.append((n, critical_path_table(seg)))
    if seg_tables:
        sec.p("One traced token, layer by layer: from the last task of one phase ending to the last task of the "
              "next (the previous layer's down to qkv, then attention, O, gate/up, down), median over the "
              "layers, beside what the phase's weight bytes take at the copy bandwidth measured in the same "
              "run. The excess is what the dependency chain and the imbalance between CTAs cost there.")
        for n, tab in seg_tables:
            tab = tab.rename(columns={"us": "measured (us)", "stream_us": "streaming alone (us)",
                                      "excess_us": "excess (us)"})
            sec.table(tab.round(2).dropna(axis=1, how="all"), caption=n)
        names = [n for n, _ in seg_tables]
        _timeline_tables(sec, tl, names, tail_table, TAIL_HEADERS, "{}: the last CTA of each phase",
                         "Why each phase's last CTA ends last: against the median CTA, how much later it ended, "
                         "began the phase, waited and streamed (us), how many more tasks it ran, and how often the "
                         "same CTA is last in that layer the next traced token (about 1 / CTAs by chance; empty "
                         "with one traced token). A tail the same CTA keeps is a plan's to fix; one that moves "
                         "every token is not.")
        _timeline_tables(sec, tl, names, streaming_table, STREAMING_HEADERS, "{}: CTAs streaming, by phase",
                         "How many CTAs keep the weight stream going: each instant of a traced token counts for "
                         "the phase most of the streaming CTAs run then ('none': no CTA streams), by how many "
                         "stream. A wait only costs where it leaves too few CTAs streaming to keep the memory "
                         "busy: a CTA that waits while the others stream has its ring full. The first column is "
                         "where the token loses its bandwidth.")
    else:
        sec.missing("the per-layer critical path needs the instrumented run's 'timeline' table (task end stamps "
                    "per layer and phase).", error_for(run, "timeline", "instrument"))
    sections.append(sec)

    sec = Section("sync-share", "Share of token time lost to grid synchronisation")
    shares = grid_sync_shares(doc, per_system, kog_systems)
    if shares:
        grid = {n: (s, what) for n, s, _, what in shares}
        sec.figure(F.sync_share([(n, s) for n, s, _, _ in shares], PUBLISHED_GRID_SYNC_SHARE),
                   "share of token time in grid barriers vs the published 35%")
        if "kog-grid" in grid:
            share, what = grid["kog-grid"]
            sec.note(f"On this GPU, grid barriers take {share:.1%} of kog-grid's token time (barrier seconds per "
                     f"token / {what}); the published monokernel system measured "
                     f"{PUBLISHED_GRID_SYNC_SHARE:.0%} on standard stacks.")
        sec.table(pd.DataFrame([{"system": n, "barrier share": f"{s:.1%}", "waiting share": f"{w:.1%}",
                                 "of": what} for n, s, w, what in shares]))
    else:
        sec.missing("no breakdown to compute the grid-sync share from.", error_for(run, "breakdown"))
    sections.append(sec)

    sec = Section("timeline", "Per-SM timeline of an instrumented run")
    if tl is not None:
        try:
            tl = timeline_spans(tl)
        except Exception:  # noqa: BLE001 - shown as missing below
            pass
    need = {"cta", "sm", "kind", "start_ns", "end_ns"}
    if tl is None and isinstance(run, JsonBench):
        sec.missing("per-SM timeline: a bench JSON file carries no instrumented trace; the run directory of "
                    "`kogtune bench` on a GPU has it (table 'timeline') and its report draws it.")
    elif tl is None or not need <= set(tl.columns):
        sec.missing("per-SM timeline: this run has no 'timeline' table from an instrumented run"
                    + ("" if tl is None else f" with columns {sorted(need)}") + ".",
                    error_for(run, "timeline", "instrument"))
    else:
        try:
            sec.p("Each row is an SM; bars are the logged spans of the CTAs on it, coloured by what they were doing.")
            shown, caption = tl, None
            if "step" in tl and tl["step"].nunique() > 2:
                # a whole instrumented run is too dense to read: draw its first two tokens (the trace has all)
                first = sorted(tl["step"].unique())[:2]
                shown = tl[tl["step"].isin(first)]
                caption = f"first 2 of {tl['step'].nunique()} traced tokens; the Chrome trace holds them all"
            sec.figure(F.timeline(shown), "per-SM timeline", caption=caption, fmt="png")
            groups = list(tl.groupby("system", sort=False)) if "system" in tl else [(None, tl)]
            for sysname, g in groups:
                suffix = f".{_slug(str(sysname))}" if sysname is not None else ""
                p = write_chrome_trace(g, trace_path(run, out, suffix), None if sysname is None else str(sysname))
                sec.link(_href(p, out), f"Chrome trace{f' of {sysname}' if sysname is not None else ''} "
                                        f"({p.resolve()}, gzipped): open it in Perfetto (ui.perfetto.dev) or "
                                        "chrome://tracing")
        except Exception as e:  # noqa: BLE001
            sec.missing("the timeline could not be drawn.", f"{type(e).__name__}: {e}")
    sections.append(sec)
    return sections


def _as_bench(run):
    if isinstance(run, (str, Path)):
        p = Path(run)
        if p.is_file() and p.suffix == ".json":
            return JsonBench(p)
        from kog.runstore import open_run
        return open_run(p)
    return run


def render_bench_report(run, out: str | Path | None = None) -> Path:
    """Render the engine report of a bench run (or a bench JSON file) to `out` (default RUN/report.html,
    or <file>.html beside a JSON file); the Chrome traces go gzipped into the run folder (trace_path)."""
    run = _as_bench(run)
    if getattr(run, "kind", None) != "bench":
        raise UsageError(f"render_bench_report needs a bench run, got a {getattr(run, 'kind', '?')} run: {run.path}")
    if out is None:
        out = run.path.with_suffix(".html") if isinstance(run, JsonBench) else Path(run.path) / "report.html"
    out = Path(out)
    doc = bench_document(run) or {}
    model = doc.get("model") or "unknown model"
    device = device_name(doc) or (run.meta.get("device") or {}).get("name") or "unknown GPU"
    facts = {"model": model, "device": device, "dtype": doc.get("dtype"), "new tokens": doc.get("new_tokens"),
             "status": run.status, "run": run.path.name}
    sections = bench_sections(run, out)
    return render_page(out, f"kog engine report: {model} on {device}",
                       "Batch-1 decode throughput and where a token's time goes, grid sync vs targeted wait.",
                       facts, sections, "bench")
