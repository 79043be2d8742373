"""The topology report of a scan run: what the GPU looks like to a persistent kernel.

Every section reads only its own tables; a table that is missing (the probe failed, was skipped, or the
scan was interrupted) becomes a section saying what is missing and the error the scan recorded, never a
failure of the whole report.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pandas as pd

from kog.errors import UsageError
from kog.reports import figures as F
from kog.reports.html import Section, corrupt_files, error_for, note_corrupt, render_page, table_or_none

# table -> the probe that writes it (for the "missing" messages)
PROBE_OF = {"placement": "placement", "latency": "latency", "l2map": "l2map", "l2_partition": "l2map",
            "l2_region_home": "l2map", "signal": "signal", "barrier": "sync", "flag": "sync", "atomics": "sync",
            "launch": "sync", "bandwidth": "bandwidth"}


def _summary(run) -> dict[str, Any]:
    if not run.has_json("summary"):
        return {}
    try:
        s = run.json("summary")
        return s if isinstance(s, dict) else {}
    except Exception:
        return {}


def _missing(sec: Section, run, names: list[str], label: str) -> Section:
    probes = sorted({PROBE_OF.get(n, n) for n in names})
    err = error_for(run, *names, *probes)
    bad = {f: why for f, why in corrupt_files(run).items() if f in {f"{n}.parquet" for n in names}}
    if bad:
        sec.missing(f"{label}: " + "; ".join(f"{f} is corrupt ({why})" for f, why in bad.items()), err)
        return sec
    tables = ", ".join(f"'{n}'" for n in names)
    sec.missing(f"{label}: this run has no {tables} table{'s' if len(names) > 1 else ''} "
                f"(probe {', '.join(probes)} did not run or did not finish).", err)
    return sec


def _guard(sec: Section, run, fn: Callable[[], None], what: str) -> Section:
    """Run one section's body; bad data in one table (wrong columns, NaNs) costs that section, not the
    report."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - a report shows what it can
        sec.missing(f"{what} could not be drawn from this run's data.", f"{type(e).__name__}: {e}")
    return sec


def _partition_series(run, summary) -> pd.Series | None:
    t = table_or_none(run, "l2_partition")
    if t is not None and {"sm", "partition"} <= set(t.columns):
        return t.set_index("sm")["partition"]
    parts = summary.get("l2_partitions")
    if isinstance(parts, list) and parts and all(isinstance(p, list) for p in parts):
        return pd.Series({int(sm): i for i, p in enumerate(parts) for sm in p})
    return None


def _comparison_frame(comp) -> pd.DataFrame | None:
    """summary.json's `comparison` (a list of rows or a {figure: row} dict) as one frame with columns
    figure, ours, published, ratio, gap, note. Accepts both spellings the scan may use: published/note
    or theirs (a value or a [lo, hi] range)/source/explanation."""
    if not comp:
        return None
    if isinstance(comp, dict):
        rows = [{"figure": k, **(v if isinstance(v, dict) else {"ours": v})} for k, v in comp.items()]
    else:
        rows = [r for r in comp if isinstance(r, dict)]
    if not rows:
        return None
    out = []
    for r in rows:
        pub = r.get("published", r.get("theirs"))
        lo_hi = pub if isinstance(pub, (list, tuple)) and len(pub) == 2 else None
        mid = (float(lo_hi[0]) + float(lo_hi[1])) / 2 if lo_hi else pub
        ours = r.get("ours")
        ratio = r.get("ratio")
        if ratio is None and isinstance(ours, (int, float)) and isinstance(mid, (int, float)) and mid:
            ratio = ours / mid
        gap = r.get("gap")
        if gap is None and lo_hi and isinstance(ours, (int, float)):
            lo, hi = map(float, lo_hi)
            gap = 0.0 if lo <= ours <= hi else (ours - hi) / hi if ours > hi else (ours - lo) / lo
        elif gap is None and isinstance(ratio, (int, float)):
            gap = ratio - 1
        note = " — ".join(str(x) for x in (r.get("note"), r.get("explanation"), r.get("source")) if x)
        out.append({"figure": r.get("figure"), "ours": ours,
                    "published": f"{lo_hi[0]}–{lo_hi[1]}" if lo_hi else pub, "ratio": ratio,
                    "gap": gap, "note": note or None})
    return pd.DataFrame(out)


# the inventory's a-priori dispatch names, as the placement probe names what it measures (kog.probe.scan)
DISPATCH_NAMES = {"gpc-fill": "breadth-first"}


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def card_tiles(s: dict, part: pd.Series | None, dev: dict) -> list[tuple[str, Any, str]]:
    """The summary card: what a persistent kernel needs to know first, each with how it was measured;
    a figure the scan lacks reads 'not measured in this scan'."""
    tiles: list[tuple[str, Any, str]] = []
    if part is not None and len(part):
        sizes = part.value_counts().sort_index()
        tiles.append(("L2 partitions x SMs", " + ".join(str(int(n)) for n in sizes) + f" ({len(sizes)} x)",
                      "per-SM L2 map, clustered"))
    else:
        tiles.append(("L2 partitions x SMs", None, ""))
    pen = s.get("l2_far_penalty") or {}
    if _num(pen.get("ns")) is not None:
        tiles.append(("far-L2 penalty", f"+{pen['ns']:.0f} ns (x{pen.get('ratio', 0):.2f})",
                      str(pen.get("method") or "")))
    else:
        tiles.append(("far-L2 penalty", None, ""))
    bw = s.get("bandwidth") or {}
    sat = s.get("sms_to_saturate_hbm")
    tiles.append(("SMs to saturate HBM", f"{sat} of {s.get('sms') or dev.get('sms')}" if sat else None,
                  f"95% of {bw.get('reference_peak_GBps', 0):,.0f} GB/s ({bw.get('reference')})"
                  if bw.get("reference_peak_GBps") else "95% of the best read"))
    tiles.append(("grid barrier, all CTAs", f"{s['barrier_us_all_ctas']:.2f} us"
                  if _num(s.get("barrier_us_all_ctas")) is not None else None, "atomic barrier, 1 warp per CTA"))
    tiles.append(("flag one-way", f"{s['flag_oneway_us']:.2f} us" if _num(s.get("flag_oneway_us")) is not None
                  else None, "ping-pong between two CTAs / 2"))
    gpu = _num(s.get("launch_gpu_us"))
    tiles.append(("launch, GPU", f"{gpu:.2f} us" if gpu is not None else None,
                  "CUDA-event timed empty launches, queued"))
    host = _num(s.get("launch_host_us", s.get("launch_us")))
    tiles.append(("launch, host", f"{host:.1f} us" if host is not None else None,
                  "Triton launch from Python, host side"))
    return tiles


def _methods_frame(s: dict) -> pd.DataFrame | None:
    """The headline latencies with their method, and the other methods' figures labelled."""
    ln, lm = s.get("latency_ns") or {}, s.get("latency_method") or {}
    if not ln:
        return None
    rows = [{"figure": k, "ns": v, "method": lm.get(k) or ("headline (this scan predates method labels)"
                                                           if v is not None else "not measured in this scan"),
             "headline": "yes"} for k, v in ln.items()]
    rows += [{"figure": r.get("figure"), "ns": r.get("ns"), "method": r.get("method"), "headline": ""}
             for r in s.get("latency_other_methods") or [] if isinstance(r, dict)]
    return pd.DataFrame(rows)


def _cross_frame(s: dict) -> pd.DataFrame | None:
    rows = [r for r in s.get("cross_checks") or [] if isinstance(r, dict)]
    if not rows:
        return None
    out = pd.DataFrame(rows)
    out["ratio"] = [f"{r:.3f}" if isinstance(r, (int, float)) else "not measured in this scan" for r in out["ratio"]]
    return out


def scan_sections(run) -> list[Section]:
    s = _summary(run)
    dev = run.meta.get("device") or {}
    part = _partition_series(run, s)
    sections: list[Section] = []

    sec = Section("card", "At a glance")
    sec.card(card_tiles(s, part, dev))
    if s.get("summary_rebuilt"):
        sec.note(str(s["summary_rebuilt"]) + ".", "info")
    sections.append(sec)

    # inventory
    sec = Section("inventory", "Inventory")
    inv = {k: dev.get(k) for k in ("name", "vendor", "arch", "sms", "dies", "dispatch", "l2_bytes", "mem_bytes",
                                   "sm_clock_max_mhz", "mem_clock_max_mhz", "driver", "runtime", "ecc",
                                   "power_limit_w", "pcie") if dev.get(k) is not None}
    if inv.get("dispatch") or s.get("dispatch"):
        # one name for the dispatch rule: the placement probe's measured one where the scan has it
        measured = s.get("dispatch")
        inv["dispatch"] = (f"{DISPATCH_NAMES.get(measured, measured)} (measured)" if measured else
                           f"{DISPATCH_NAMES.get(inv['dispatch'], inv['dispatch'])} (inventory, not measured)")
    if inv.get("l2_bytes"):
        inv["l2_bytes"] = f"{inv['l2_bytes'] / 2**20:.0f} MiB"
    if inv.get("mem_bytes"):
        inv["mem_bytes"] = f"{inv['mem_bytes'] / 1e9:.0f} GB"
    if inv:
        sec.kv(inv)
    else:
        sec.missing("device inventory: meta.json has no 'device' entry.", error_for(run, "inventory", "device"))
    if s:
        lat = s.get("latency_ns") or {}
        nm = (lambda v: "not measured in this scan" if v is None else v)
        sec.kv({"L2 partitions": len(s["l2_partitions"]) if isinstance(s.get("l2_partitions"), list) else None,
                **{f"latency {k} (ns)": nm(v) for k, v in lat.items()},
                "grid barrier, all CTAs (us)": nm(s.get("barrier_us_all_ctas")),
                "flag one-way (us)": nm(s.get("flag_oneway_us")),
                "launch, host: Triton launch from Python (us)": nm(s.get("launch_host_us", s.get("launch_us"))),
                "launch, GPU: CUDA-event timed empty launches (us)": nm(s.get("launch_gpu_us")),
                "CUDA graph launch, per kernel (us)": nm(s.get("graph_launch_us")),
                "SMs to saturate HBM": nm(s.get("sms_to_saturate_hbm")), "scan time (s)": s.get("scan_seconds")})
        mf = _methods_frame(s)
        if mf is not None:
            sec.table(mf, caption="latency: the headline figures are one access kind (dependent plain loads); "
                                  "other methods' figures beside them, labelled")
    else:
        why = corrupt_files(run).get("summary.json")
        sec.missing(f"summary.json is corrupt ({why})." if why else "summary.json: the scan did not write its summary.",
                    error_for(run, "summary"))
    note_corrupt(sec, run)
    errs = run.meta.get("errors") or {}
    if errs:
        sec.note(f"{len(errs)} probe(s) recorded an error: " + "; ".join(f"{k}: {v}" for k, v in errs.items()),
                 "warn")
    sections.append(sec)

    # placement
    sec = Section("placement", "Placement map")
    pl = table_or_none(run, "placement")
    if pl is None:
        _missing(sec, run, ["placement"], "placement map")
    else:
        def body():
            sec.p("Which SM each program id (CTA) lands on. A persistent kernel's mapping of work to SMs "
                  "relies on this order being stable across launches.")
            sec.figure(F.placement_map(pl, part.to_dict() if part is not None else None),
                       "program id to SM id placement map", fmt="png")
            per = pl.groupby("launch").agg(ctas=("pid", "count"), distinct_sms=("smid", "nunique"))
            per["ctas_per_sm"] = per["ctas"] / per["distinct_sms"]
            sec.table(per.reset_index(), caption="per launch")
        _guard(sec, run, body, "The placement map")
    sections.append(sec)

    # latency ladder
    sec = Section("latency", "Latency ladder")
    lt = table_or_none(run, "latency")
    if lt is None:
        _missing(sec, run, ["latency"], "latency ladder")
    else:
        def body():
            pl_ns = {k: v for k, v in (s.get("latency_ns") or {}).items() if isinstance(v, (int, float))}
            sec.figure(F.latency_ladder(lt, pl_ns, dev.get("l2_bytes")), "latency vs working set size")
            if "level" in lt:
                agg = lt.groupby("level", sort=False).agg(
                    from_bytes=("bytes", "min"), to_bytes=("bytes", "max"), ns=("ns", "median"),
                    **({"cycles": ("cycles", "median")} if "cycles" in lt else {}))
                sec.table(agg.reset_index(), caption="plateaus (median per level)")
        _guard(sec, run, body, "The latency ladder")
    sections.append(sec)

    # per-SM L2 map
    sec = Section("l2map", "Per-SM L2 latency and partitions")
    l2 = table_or_none(run, "l2map")
    homes = table_or_none(run, "l2_region_home")
    home = homes.set_index("region")["partition"] if homes is not None and "region" in homes else None
    if l2 is None:
        _missing(sec, run, ["l2map"], "per-SM L2 latency map")
    else:
        def body():
            sec.p("Each SM times L2 hits to every address region of an L2-resident buffer: the near/far blocks "
                  "show which SMs share an L2 partition and which partition each region lives in.")
            sec.figure(F.l2_heatmap(l2, part, home), "per-SM L2 latency heatmap", fmt="png")
        _guard(sec, run, body, "The L2 heatmap")
    if part is None:
        _missing(sec, run, ["l2_partition"], "partition map")
    else:
        def body():
            sec.figure(F.partition_map(part, home, dev.get("sms")), "SM to L2 partition map", fmt="png")
            counts = part.value_counts().sort_index()
            sec.table(pd.DataFrame({"partition": counts.index, "sms": counts.values}), caption="SMs per partition")
        _guard(sec, run, body, "The partition map")
    if homes is None and l2 is not None:
        sec.note("No 'l2_region_home' table: regions are shown in address order.", "warn")
    sections.append(sec)

    # signal
    sec = Section("signal", "SM x SM signal latency")
    sg = table_or_none(run, "signal")
    if sg is None:
        _missing(sec, run, ["signal"], "SM x SM signal latency")
    else:
        def body():
            sec.p("One-way flag latency from every SM to every other, rows and columns in cluster order "
                  "(L2 partition first, then similarity of the SMs' latency profiles): blocks are GPCs / "
                  "partitions.")
            sec.figure(F.signal_heatmap(sg, part), "SM by SM signal latency heatmap", fmt="png")
            q = sg["ns"].quantile([0.0, 0.5, 0.99, 1.0])
            sec.kv({"pairs": len(sg), "min (ns)": q.iloc[0], "median (ns)": q.iloc[1], "p99 (ns)": q.iloc[2],
                    "max (ns)": q.iloc[3]})
        _guard(sec, run, body, "The signal heatmap")
    sections.append(sec)

    # sync costs
    sec = Section("sync", "Synchronisation costs")
    names = ["barrier", "flag", "atomics", "launch"]
    tabs = {n: table_or_none(run, n) for n in names}
    absent = [n for n in names if tabs[n] is None]
    if len(absent) == len(names):
        _missing(sec, run, names, "sync costs")
    else:
        def body():
            anchors = {"barrier": s["barrier_us_all_ctas"]} if s.get("barrier_us_all_ctas") else {}
            sec.figure(F.sync_costs(tabs["barrier"], tabs["flag"], tabs["atomics"], tabs["launch"], anchors),
                       "barrier, flag, atomic and launch costs")
            if tabs["launch"] is not None:
                sec.table(tabs["launch"], caption="launch overhead")
        _guard(sec, run, body, "The sync-cost curves")
        if absent:
            _missing(sec, run, absent, "part of the sync costs")
    sections.append(sec)

    # bandwidth
    sec = Section("bandwidth", "Bandwidth vs SMs")
    bw = table_or_none(run, "bandwidth")
    if bw is None:
        _missing(sec, run, ["bandwidth"], "bandwidth vs SMs")
    else:
        def body():
            b = s.get("bandwidth") or {}
            sec.figure(F.bandwidth_curve(bw, s.get("sms_to_saturate_hbm"), reference=b.get("torch_copy_GBps")),
                       "bandwidth against number of SMs, with the same run's torch copy")
            peak = bw.groupby("kind")["GBps"].max()
            ratio = b.get("read_over_torch_copy")
            sec.kv({f"peak {k} (GB/s)": v for k, v in peak.items()} |
                   {"torch device-to-device copy, same run (GB/s)": b.get("torch_copy_GBps")
                    or "not measured in this scan",
                    "read peak / torch copy": f"{ratio:.3f}" if isinstance(ratio, (int, float))
                    else "not measured in this scan",
                    "SMs to saturate HBM (95% of the reference peak)": s.get("sms_to_saturate_hbm")
                    or "not reached in this scan"})
            if isinstance(ratio, (int, float)) and ratio < 0.95:
                sec.note(f"The probe's best read is {ratio:.0%} of the same run's device-to-device copy: it does "
                         "not saturate HBM, so its 'SMs to saturate' is against a peak it does not reach.", "warn")
        _guard(sec, run, body, "The bandwidth curve")
    sections.append(sec)

    # cross-checks within the run
    sec = Section("crosscheck", "Cross-checked in the same run")
    cf = _cross_frame(s)
    if cf is None:
        sec.missing("summary.json has no 'cross_checks' (a scan from before they were recorded).",
                    error_for(run, "cross_checks"))
    else:
        sec.p("Each headline against an independent measurement made in the same scan; ratio = ours / theirs.")
        sec.table(cf)
    sections.append(sec)

    # comparison
    sec = Section("comparison", "Compared with published figures")
    cmp = _comparison_frame(s.get("comparison"))
    if cmp is None:
        sec.missing("summary.json has no 'comparison' with published figures.", error_for(run, "comparison"))
    else:
        def body():
            sec.p("Published Hopper microbenchmarks (H100/H800) and the anchors measured on the lent H200. A gap "
                  "over 30% is marked and needs the explanation in its note.")
            gap = pd.to_numeric(cmp["gap"], errors="coerce")
            shown = cmp.copy()
            shown["gap"] = [f"{g:+.0%}" if g == g else None for g in gap]
            shown["gap > 30%"] = ["yes" if abs(g) > 0.3 else "" for g in gap.fillna(0.0)]
            sec.table(shown)
            far = shown[shown["gap > 30%"] == "yes"]
            if len(far):
                sec.note(f"{len(far)} figure(s) differ by more than 30% from the published value: "
                         + ", ".join(map(str, far["figure"])), "warn")
        _guard(sec, run, body, "The comparison table")
    sections.append(sec)
    return sections


def default_output(run, name: str = "report.html") -> Path:
    return Path(run.path) / name


def render_scan_report(run, out: str | Path | None = None) -> Path:
    """Render the topology report of a scan run to `out` (default RUN/report.html); returns the path."""
    if getattr(run, "kind", None) != "scan":
        raise UsageError(f"render_scan_report needs a scan run, got a {getattr(run, 'kind', '?')} run: {run.path}")
    s = _summary(run)
    dev = run.meta.get("device") or {}
    name = s.get("device") or dev.get("name") or "unknown GPU"
    facts = {"device": name, "SMs": s.get("sms") or dev.get("sms"), "status": run.status,
             "started": run.meta.get("started"), "git": run.meta.get("git_commit"), "run": Path(run.path).name}
    out = Path(out) if out else default_output(run)
    return render_page(out, f"kog topology report: {name}",
                       "What this GPU looks like to a persistent kernel: placement, latency per SM and L2 "
                       "partition, signal latency, sync costs, bandwidth.", facts, scan_sections(run), "scan")
