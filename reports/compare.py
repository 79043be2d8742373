"""Two runs of the same kind side by side (two GPUs, two scans of one GPU, a bench before and after
tuning): every headline number of both, the change in percent, and changes over THRESHOLD marked:
green when the change is for the better, red when for the worse, yellow when neither applies."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from kog.errors import UsageError
from kog.reports import figures as F
from kog.reports.html import Section, fmt_value, render_page

THRESHOLD = 0.05   # a change above 5% is marked


def _open(r):
    if isinstance(r, (str, Path)):
        p = Path(r)
        if p.is_file() and p.suffix == ".json":
            from kog.reports.engine_report import JsonBench
            return JsonBench(p)
        from kog.runstore import open_run
        return open_run(p)
    return r


def change_class(a: Any, b: Any, better: str | None) -> tuple[str, str]:
    """(change text, CSS class) of b against a."""
    try:
        a, b = float(a), float(b)
    except (TypeError, ValueError):
        differs = a != b and a is not None and b is not None
        return ("differs" if differs else "", "flag" if differs else "")
    if a != a or b != b:
        return ("", "")
    if a == 0:
        return ("", "" if b == 0 else "flag")
    rel = (b - a) / abs(a)
    text = f"{rel:+.1%}"
    if abs(rel) <= THRESHOLD:
        return (text, "")
    if better is None:
        return (text, "flag")
    good = (rel > 0) == (better == "higher")
    return (text, "changed-up" if good else "changed-down")


def metrics_block(sec: Section, rows: list[tuple[str, Any, Any, str | None]], name_a: str, name_b: str,
                  caption: str | None = None) -> int:
    """Add a metric | A | B | change table; returns how many rows changed by more than THRESHOLD."""
    cells, marked = [], 0
    for metric, a, b, better in rows:
        text, cls = change_class(a, b, better)
        marked += bool(cls)
        cells.append([(metric, ""), (fmt_value(a), ""), (fmt_value(b), ""), (text, cls)])
    sec.cells(["metric", name_a, name_b, "change"], cells, caption)
    return marked


def _safe_table(run, name):
    try:
        return run.table(name) if run.has_table(name) else None
    except Exception:
        return None


def _summary(run) -> dict:
    try:
        return run.json("summary") if run.has_json("summary") else {}
    except Exception:
        return {}


def _scan(a, b, na, nb) -> list[Section]:
    sa, sb = _summary(a), _summary(b)
    da, db = a.meta.get("device") or {}, b.meta.get("device") or {}
    sec = Section("inventory", "Inventory")
    keys = ("name", "arch", "sms", "l2_bytes", "mem_bytes", "sm_clock_max_mhz", "mem_clock_max_mhz", "driver",
            "runtime")
    metrics_block(sec, [(k, da.get(k), db.get(k), None) for k in keys], na, nb)
    sections = [sec]

    sec = Section("headline", "Headline figures")
    la, lb = sa.get("latency_ns") or {}, sb.get("latency_ns") or {}
    rows = [(f"latency {k} (ns)", la.get(k), lb.get(k), "lower") for k in ("l1", "l2_near", "l2_far", "hbm")]
    parts = lambda s: len(s["l2_partitions"]) if isinstance(s.get("l2_partitions"), list) else None  # noqa: E731
    rows += [("L2 partitions", parts(sa), parts(sb), None),
             ("grid barrier, all CTAs (us)", sa.get("barrier_us_all_ctas"), sb.get("barrier_us_all_ctas"), "lower"),
             ("flag one-way (us)", sa.get("flag_oneway_us"), sb.get("flag_oneway_us"), "lower"),
             ("launch, host: Triton from Python (us)", sa.get("launch_host_us", sa.get("launch_us")),
              sb.get("launch_host_us", sb.get("launch_us")), "lower"),
             ("launch, GPU: CUDA events (us)", sa.get("launch_gpu_us"), sb.get("launch_gpu_us"), "lower"),
             ("CUDA graph launch (us)", sa.get("graph_launch_us"), sb.get("graph_launch_us"), "lower"),
             ("SMs to saturate HBM", sa.get("sms_to_saturate_hbm"), sb.get("sms_to_saturate_hbm"), "lower")]
    bwa, bwb = _safe_table(a, "bandwidth"), _safe_table(b, "bandwidth")
    for kind in sorted(set(bwa["kind"] if bwa is not None else []) | set(bwb["kind"] if bwb is not None else [])):
        pk = lambda t: float(t[t["kind"] == kind]["GBps"].max()) if t is not None and (t["kind"] == kind).any() else None  # noqa: E731
        rows.append((f"peak {kind} bandwidth (GB/s)", pk(bwa), pk(bwb), "higher"))
    rows.append(("scan time (s)", sa.get("scan_seconds"), sb.get("scan_seconds"), "lower"))
    n = metrics_block(sec, rows, na, nb)
    sec.p(f"{n} figure(s) differ by more than {THRESHOLD:.0%}.")
    sections.append(sec)

    sec = Section("curves", "Curves, both runs")
    lta, ltb = _safe_table(a, "latency"), _safe_table(b, "latency")
    if lta is not None and ltb is not None:
        fig = F.latency_ladder(lta[["bytes", "ns"]], None, None, others=[(nb, ltb[["bytes", "ns"]])])
        fig.axes[0].legend([na, nb], fontsize=8)
        sec.figure(fig, "latency ladders of both runs")
    else:
        sec.missing("latency ladder: " + ", ".join(n for n, t in ((na, lta), (nb, ltb)) if t is None)
                    + " has no 'latency' table.")
    if bwa is not None and bwb is not None:
        sec.figure(F.bandwidth_curve(bwa, None, others=[(nb, bwb)], label=na), "bandwidth vs SMs of both runs")
    else:
        sec.missing("bandwidth vs SMs: " + ", ".join(n for n, t in ((na, bwa), (nb, bwb)) if t is None)
                    + " has no 'bandwidth' table.")
    ba, bb = _safe_table(a, "barrier"), _safe_table(b, "barrier")
    if ba is not None and bb is not None:
        ga = ba.groupby("ctas")["us"].min()
        gb = bb.groupby("ctas")["us"].min()
        fig = F.new_figure(8, 3.6)
        ax = fig.subplots()
        ax.plot(ga.index, ga.values, "o-", ms=3, color=F.PALETTE[0], label=na)
        ax.plot(gb.index, gb.values, "s--", ms=3, color=F.PALETTE[1], label=nb)
        ax.set_xlabel("CTAs in the barrier")
        ax.set_ylabel("us per barrier (best over warps)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        sec.figure(fig, "grid barrier cost of both runs")
    sections.append(sec)
    return sections


def _bench(a, b, na, nb) -> list[Section]:
    from kog.reports.engine_report import bench_document, system_breakdowns
    da, db = bench_document(a) or {}, bench_document(b) or {}
    sec = Section("setup", "Setup")
    metrics_block(sec, [(k, da.get(k), db.get(k), None) for k in
                        ("device", "model", "dtype", "prompt_tokens", "new_tokens", "git_commit")] +
                  [("device copy (GB/s)", da.get("copy_GBps"), db.get("copy_GBps"), "higher"),
                   ("weight bytes per token", da.get("weight_bytes_per_token"), db.get("weight_bytes_per_token"),
                    "lower"),
                   ("bandwidth limit (tok/s)", da.get("limit_tok_per_s"), db.get("limit_tok_per_s"), "higher")],
                  na, nb)
    sections = [sec]
    sa, sb = da.get("systems") or {}, db.get("systems") or {}
    names = list(dict.fromkeys(list(sa) + list(sb)))
    sec = Section("throughput", "Tokens per second")
    if names:
        tp = lambda s, n: (s.get(n) or {}).get("tok_per_s") if isinstance(s.get(n), dict) else None  # noqa: E731
        n = metrics_block(sec, [(f"{x} tok/s", tp(sa, x), tp(sb, x), "higher") for x in names], na, nb)
        sec.p(f"{n} system(s) changed by more than {THRESHOLD:.0%}.")
        sec.figure(F.compare_bars(names, [tp(sa, x) or 0 for x in names], [tp(sb, x) or 0 for x in names], na, nb,
                                  "tokens per second"), "tokens per second of both runs")
    else:
        sec.missing("neither run has measured systems (bench.json).")
    sections.append(sec)
    ba, bb = system_breakdowns(da, _safe_table(a, "breakdown")), system_breakdowns(db, _safe_table(b, "breakdown"))
    sec = Section("breakdown", "Time per token by category")
    rows = [(f"{sysname} {cat} (us)", (ba.get(sysname) or {}).get(cat, 0) * 1e6 if sysname in ba else None,
             (bb.get(sysname) or {}).get(cat, 0) * 1e6 if sysname in bb else None, "lower")
            for sysname in dict.fromkeys(list(ba) + list(bb)) for cat in ("streaming", "waiting", "barrier", "other")]
    if rows:
        metrics_block(sec, rows, na, nb)
    else:
        sec.missing("neither run has a time breakdown.")
    sections.append(sec)
    return sections


def _study(a, b, na, nb) -> list[Section]:
    from kog.reports.tuning import _study_ref, load_study, trials_frame
    frames = []
    for r in (a, b):
        name, url = _study_ref(r)
        frames.append(trials_frame(load_study(name, url, Path(r.path))) if url else
                      (r.table("trials") if r.has_table("trials") else pd.DataFrame(columns=["number", "state", "value"])))
    fa, fb = frames
    def stats(df):
        ok = df[df["state"].astype(str) == "COMPLETE"]
        best = ok.loc[ok["value"].idxmax()] if len(ok) else None
        return ok, best
    (oa, bea), (ob, beb) = stats(fa), stats(fb)
    sec = Section("study", "Studies")
    rows = [("trials", len(fa), len(fb), None), ("completed", len(oa), len(ob), None),
            ("failed", int((fa["state"].astype(str) == "FAIL").sum()), int((fb["state"].astype(str) == "FAIL").sum()),
             "lower"),
            ("best value (tok/s)", None if bea is None else bea["value"], None if beb is None else beb["value"],
             "higher")]
    params = sorted({c for c in list(fa.columns) + list(fb.columns) if c.startswith("params_")})
    rows += [(f"best {p[len('params_'):]}", None if bea is None else bea.get(p), None if beb is None else beb.get(p),
              None) for p in params]
    metrics_block(sec, rows, na, nb)
    sections = [sec]
    sec = Section("history", "Histories")
    for nm, df in ((na, fa), (nb, fb)):
        if len(df):
            sec.figure(F.study_history(df.assign(state=df["state"].astype(str))), f"history of {nm}", caption=nm)
    sections.append(sec)
    return sections


def render_compare(run_a, run_b, out: str | Path | None = None) -> Path:
    """Render two runs of the same kind side by side to `out` (default RUN_A/compare.html)."""
    a, b = _open(run_a), _open(run_b)
    if a.kind != b.kind:
        raise UsageError(f"cannot compare a {a.kind} run with a {b.kind} run ({a.path} vs {b.path})")
    def label(r, tag):
        dev = (r.meta.get("device") or {}).get("name") or "?"
        return f"{tag}: {dev}"
    na, nb = label(a, "A"), label(b, "B")
    build = {"scan": _scan, "bench": _bench, "study": _study, "sweep": _study}.get(a.kind)
    if build is None:
        raise UsageError(f"no comparison for {a.kind} runs")
    sections = build(a, b, na, nb)
    if out is None:
        pa = Path(a.path)
        out = pa.with_name(f"{pa.stem}-compare.html") if pa.is_file() else pa / "compare.html"
    return render_page(Path(out), f"kog comparison of two {a.kind} runs", f"{na} vs {nb}",
                       {"A": str(a.path), "B": str(b.path), "marked": f"changes over {THRESHOLD:.0%}"},
                       sections, "compare")
