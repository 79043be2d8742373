"""`kogprobe scan`: run the probes on one GPU and store a scan run.

    runs/<time>-<device>-scan/  meta.json, one Parquet table per probe table (kog.probe.probes lists
                                them), summary.json, probe_extras.json, report.html (rendered by the
                                caller's render_report: the CLI passes kog.reports')

Each probe runs inside its own try: a failure is recorded (meta.json "errors") and the scan goes on;
Ctrl-C keeps the probes that finished (the run is marked incomplete, with a partial summary).
"""
from __future__ import annotations

import importlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

from kog.errors import UsageError
from kog.probe.probes import PROBES

# Published figures the summary compares against (ours / theirs; a gap over 30% gets an explanation).
PUBLISHED = {
    "l2_near_cycles": {"theirs": 260.0, "src": "Hopper L2 load hit, near partition (H100/H800 microbenchmarks); "
                                               "ours: ld.cg map, near cells"},
    "l2_far_over_near": {"theirs": (1.6, 1.9), "src": "Hopper L2 far / near latency (H100/H800 microbenchmarks); "
                                                      "ours: the main map (home-slice atomics)"},
    "hbm_cycles": {"theirs": (480.0, 650.0), "src": "Hopper HBM latency (H100/H800 microbenchmarks)"},
    "barrier_us_all_ctas": {"theirs": 0.92, "src": "anchors: Triton atomic barrier, 132 CTAs, this H200"},
    "flag_oneway_us": {"theirs": 0.71, "src": "anchors: Triton flag ping-pong one-way, this H200"},
    "launch_gpu_us": {"theirs": 2.4, "src": "H200 plain CUDA kernel launch latency (published microbenchmarks)"},
}

# Why ours may differ, by figure and direction (used only when the gap exceeds 30%).
EXPLAIN = {
    ("l2_near_cycles", "high"): "Triton issues each scalar load from every lane and the timed loop adds "
                                "its own overhead; or the map fell back to atom.add round trips, which cost "
                                "more than a plain load hit",
    ("l2_near_cycles", "low"): "the published figure is a random chase over a mix of partitions; ours is "
                               "the near partition alone",
    ("l2_far_over_near", "high"): "atomics always travel to the home slice, so the far penalty is not hidden "
                                  "by a near copy as it is for plain loads",
    ("l2_far_over_near", "low"): "plain loads of far lines are served from a copy in the near partition "
                                 "after the first touch, which hides most of the far penalty",
    ("hbm_cycles", "high"): "our chase reaches 8x L2 with random 128-B lines across 2 MiB pages: TLB misses "
                            "add to the DRAM latency; the published chases stay inside the TLB reach",
    ("hbm_cycles", "low"): "the largest sets of our ladder still hit in L2 or the TLB often",
    ("barrier_us_all_ctas", "high"): "this barrier arrives with a release atomic and polls with acquire "
                                     "atomics like the anchor; a busy or down-clocked GPU costs more",
    ("barrier_us_all_ctas", "low"): "the anchor timed all iterations host-side with launch jitter included",
    ("flag_oneway_us", "high"): "the two CTAs landed on SMs in different L2 partitions (the anchor's may not)",
    ("flag_oneway_us", "low"): "the two CTAs landed on SMs in the same L2 partition",
    ("launch_gpu_us", "high"): "ours is a Triton kernel (its launch carries more arguments and a larger "
                               "parameter block than a bare CUDA kernel)",
    ("launch_gpu_us", "low"): "queued launches overlap their setup with the previous kernel; the published "
                              "figure times one launch from the host call",
}

# How each headline latency is measured: one access kind for all of them (dependent plain loads), so the
# ladder from L2 to HBM compares like with like; other methods are kept beside, labelled.
LOAD_METHOD = {"l1": "latency ladder: dependent plain loads, L1-sized working set",
               "l2_near": "per-SM L2 map: plain L2 loads (ld.cg), near cells",
               "l2_far": "per-SM L2 map: plain L2 loads (ld.cg), far cells",
               "l2_near_ladder": "latency ladder: dependent plain loads, first L2 plateau",
               "l2_far_ladder": "latency ladder: dependent plain loads, last L2 plateau",
               "hbm": "latency ladder: dependent plain loads, working set 8x L2"}
ATOMIC_METHOD = "per-SM L2 map: atomics to the line's home slice"


def bundled_scan_path() -> Path:
    """The scan recorded on the lent H200 that ships with kog (a run directory)."""
    return Path(__file__).resolve().parent / "data" / "h200_scan"


def find_scan(path=None, device_name: str | None = None) -> Path | None:
    """The scan to use, in one order for every caller: `path` when given (UsageError if it is no directory);
    else the latest complete scan run of `device_name` in the run store (KOG_RUNS_DIR; of any device when
    no device is named); else the bundled scan, when it was recorded on that device or none is named;
    else None."""
    if path is not None:
        p = Path(path)
        if not p.is_dir():
            raise UsageError(f"no such scan directory: {p}")
        return p
    from kog.runstore import RunError, RunStore, open_run
    run = RunStore().latest("scan", device_name=device_name)
    if run is not None:
        return run.path
    try:
        bundled = open_run(bundled_scan_path())
    except RunError:
        return None
    if device_name is None or (bundled.meta.get("device") or {}).get("name") == device_name:
        return bundled.path
    return None


def _f(x: Any, nd: int = 3) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else round(x, nd)


def compare(figure: str, ours: float | None) -> dict:
    pub = PUBLISHED[figure]
    theirs = pub["theirs"]
    row = {"figure": figure, "ours": _f(ours), "theirs": theirs, "source": pub["src"]}
    if ours is None:
        row.update(ratio=None, gap=None, explanation="not measured in this scan")
        return row
    if isinstance(theirs, tuple):
        lo, hi = theirs
        mid = (lo + hi) / 2
        gap = 0.0 if lo <= ours <= hi else (ours - hi) / hi if ours > hi else (ours - lo) / lo
    else:
        mid = theirs
        gap = (ours - theirs) / theirs
    row["ratio"] = _f(ours / mid)
    row["gap"] = _f(gap)
    row["explanation"] = (EXPLAIN[(figure, "high" if gap > 0 else "low")] if abs(gap) > 0.30 else
                          "within 30%")
    return row


def build_summary(tables: dict, extras: dict, device: dict | None, scan_seconds: float | None,
                  errors: dict | None = None, probe_seconds: dict | None = None) -> dict:
    """summary.json from the tables and the probes' extras (pure: used by the scan and the tests)."""
    from kog.probe.probes.bandwidth import peak_summary
    from kog.probe.probes.l2map import partitions_as_lists
    from kog.probe.probes.signal import by_partition
    dev = device or {}
    s: dict[str, Any] = {"device": dev.get("name"), "sms": dev.get("sms"), "vendor": dev.get("vendor")}
    lat = extras.get("latency", {})
    l2 = extras.get("l2map", {})
    lev = lat.get("levels_ns", {})
    levc = lat.get("levels_cycles", {})
    part = tables.get("l2_partition")
    s["l2_partitions"] = partitions_as_lists(part) if part is not None else None
    ldcg = (l2.get("other_modes") or {}).get("ld_cg") or {}
    ghz = l2.get("sm_ghz")
    s.update(headline_latency(lev, levc, l2, ldcg, ghz))
    s["latency_ladder_ns"] = {k: _f(v) for k, v in lev.items()}
    s["hbm_plateau_from_bytes"] = lat.get("hbm_plateau_from_bytes")
    b = tables.get("barrier")
    sms = dev.get("sms")
    if b is not None and len(b):
        w1 = b[b["warps"] == b["warps"].min()]
        row = w1[w1["ctas"] == sms] if sms in set(w1["ctas"]) else w1[w1["ctas"] == w1["ctas"].max()]
        s["barrier_us_all_ctas"] = _f(row["us"].iloc[0])
    else:
        s["barrier_us_all_ctas"] = None
    fl = tables.get("flag")
    s["flag_oneway_us"] = _f(fl[fl["kind"] == "pingpong_oneway"]["us"].iloc[0]) if fl is not None and \
        (fl["kind"] == "pingpong_oneway").any() else None
    la = tables.get("launch")
    get = (lambda m: _f(la[la["mode"] == m]["us"].iloc[0]) if la is not None and (la["mode"] == m).any()
           else None)
    # two different figures: what a launch costs the host (a Triton launch from Python) and the GPU's own
    # launch latency (CUDA-event timed empty launches, queued)
    s["launch_host_us"], s["launch_host_sync_us"] = get("plain"), get("plain_sync")
    s["launch_gpu_us"], s["graph_launch_us"] = get("gpu_queued"), get("graph")
    bw = tables.get("bandwidth")
    s["bandwidth"] = None
    s["sms_to_saturate_hbm"] = None
    if bw is not None and len(bw):
        ps = peak_summary(bw, (extras.get("bandwidth") or {}).get("torch_copy_GBps"))
        s["bandwidth"] = {k: (_f(v, 3) if isinstance(v, float) else v) for k, v in ps.items()}
        s["sms_to_saturate_hbm"] = ps["sms_to_saturate_hbm"]
        s["hbm_read_GBps"] = _f(ps["read_peak_GBps"], 1)
        s["hbm_copy_GBps"] = _f(ps["copy_peak_GBps"], 1)
    sig = tables.get("signal")
    if sig is not None and len(sig):
        s["signal_ns"] = {"median": _f(sig["ns"].median(), 1), "min": _f(sig["ns"].min(), 1),
                          "max": _f(sig["ns"].max(), 1)}
        if part is not None:
            s["signal_ns"].update({k: _f(v, 1) for k, v in by_partition(sig, part).items()})
    at = tables.get("atomics")
    if at is not None and len(at):
        s["atomics_mops_per_s_max"] = _f(at["mops_per_s"].max(), 1)
    if "placement" in extras:
        p = extras["placement"]
        s["dispatch"] = dispatch_name(p.get("dispatch"))
        s["placement_stable_fraction"] = _f(p.get("stable_fraction"))
    if l2:
        s["l2map"] = {k: l2.get(k) for k in ("mode", "regions", "k", "gap", "silhouette", "sm_ghz",
                                             "sms_measured")}
    pen = s.get("l2_far_penalty") or {}
    s["comparison"] = [
        compare("l2_near_cycles", s["latency_cycles"]["l2_near"]),      # a load, as the published figure
        compare("l2_far_over_near", pen.get("ratio")),                  # the home-slice penalty (atomics)
        compare("hbm_cycles", s["latency_cycles"]["hbm"]),
        compare("barrier_us_all_ctas", s["barrier_us_all_ctas"]),
        compare("flag_oneway_us", s["flag_oneway_us"]),
        compare("launch_gpu_us", s["launch_gpu_us"]),
    ]
    s["cross_checks"] = cross_checks(s)
    if dev.get("partition"):      # AMD compute / memory partition modes (amdsmi)
        s["partition"] = dev["partition"]
    if dev.get("vendor") == "amd" or "xcd_latency" in tables:
        from kog.probe.probes.l2map_amd import summary_fields
        s["xcd"] = summary_fields(tables, extras)
        s["xcd"]["comparison_note"] = "the published figures above are Hopper's: not comparable on AMD"
    s["sm_clock_ghz"] = _f(ghz)
    s["scan_seconds"] = _f(scan_seconds, 1)
    if probe_seconds:
        s["probe_seconds"] = {k: _f(v, 2) for k, v in probe_seconds.items()}
    s["errors"] = dict(errors or {})
    return s


# the inventory's a-priori dispatch names, as the placement probe names what it measures
DISPATCH_NAMES = {"gpc-fill": "breadth-first"}


def dispatch_name(name: str | None) -> str | None:
    """One name per dispatch rule, in the inventory and the summary alike."""
    return DISPATCH_NAMES.get(name, name) if name else name


def headline_latency(lev: dict, levc: dict, l2: dict, ldcg: dict, ghz: float | None) -> dict[str, Any]:
    """latency_ns / latency_cycles from one access kind (dependent plain loads: the per-SM map's ld.cg cells
    for L2 near/far when measured, else the ladder's plateaus; the ladder for L1 and HBM), the method of
    each, the other methods' figures labelled, and the far-L2 penalty of home-slice atomics (plain loads
    hide it behind a near copy, so it is the figure a persistent kernel's flags and counters pay)."""
    if l2.get("near_ns") and l2.get("far_ns") and l2.get("mode") not in (None, "atomic"):
        # the map's own accesses are loads (AMD's cross-XCD map): it is the L2 figure of the one access kind
        ldcg = {"near_ns": l2["near_ns"], "far_ns": l2["far_ns"], "mode": l2["mode"]}
    use_map = bool(ldcg.get("near_ns")) and bool(ldcg.get("far_ns"))
    ns = {"l1": _f(lev.get("l1")),
          "l2_near": _f(ldcg["near_ns"] if use_map else lev.get("l2_near")),
          "l2_far": _f(ldcg["far_ns"] if use_map else lev.get("l2_far")),
          "hbm": _f(lev.get("hbm"))}
    cyc = {"l1": _f(levc.get("l1"), 1), "hbm": _f(levc.get("hbm"), 1),
           "l2_near": _f(ldcg["near_ns"] * ghz if use_map and ghz else levc.get("l2_near"), 1),
           "l2_far": _f(ldcg["far_ns"] * ghz if use_map and ghz else levc.get("l2_far"), 1)}
    if use_map and not ghz:
        cyc["l2_near"] = cyc["l2_far"] = None
    method = {"l1": LOAD_METHOD["l1"], "hbm": LOAD_METHOD["hbm"],
              "l2_near": LOAD_METHOD["l2_near" if use_map else "l2_near_ladder"],
              "l2_far": LOAD_METHOD["l2_far" if use_map else "l2_far_ladder"]}
    if use_map and ldcg.get("mode"):
        method.update(l2_near=f"per-SM L2 map: {ldcg['mode']} loads, near cells",
                      l2_far=f"per-SM L2 map: {ldcg['mode']} loads, far cells")
    method = {k: (v if ns[k] is not None else "not measured in this scan") for k, v in method.items()}
    other = []
    if use_map:
        for k in ("l2_near", "l2_far"):
            if lev.get(k) is not None:
                other.append({"figure": k, "method": LOAD_METHOD[f"{k}_ladder"], "ns": _f(lev[k])})
    if l2.get("mode") == "atomic" and l2.get("near_ns"):
        other += [{"figure": "l2_near", "method": ATOMIC_METHOD, "ns": _f(l2["near_ns"])},
                  {"figure": "l2_far", "method": ATOMIC_METHOD, "ns": _f(l2.get("far_ns"))}]
    pen = None
    if l2.get("near_ns") and l2.get("far_ns"):
        pen = {"near_ns": _f(l2["near_ns"]), "far_ns": _f(l2["far_ns"]), "ns": _f(l2["far_ns"] - l2["near_ns"]),
               "ratio": _f(l2["far_ns"] / l2["near_ns"]),
               "method": ATOMIC_METHOD if l2.get("mode") == "atomic" else f"per-SM L2 map ({l2.get('mode')})"}
    return {"latency_ns": ns, "latency_cycles": cyc, "latency_method": method, "latency_other_methods": other,
            "l2_far_penalty": pen, "l2_source": "one access kind: dependent plain loads"}


def cross_checks(s: dict) -> list[dict]:
    """Each headline against an independent measurement of the same run: ours / theirs."""
    rows = []
    bw = s.get("bandwidth") or {}

    def row(figure, ours, other, method):
        ratio = _f(ours / other) if isinstance(ours, (int, float)) and isinstance(other, (int, float)) and other \
            else None
        rows.append({"figure": figure, "ours": _f(ours, 3), "independent": _f(other, 3), "method": method,
                     "ratio": ratio, "note": "not measured in this scan" if ours is None or other is None else ""})
    row("HBM read peak (GB/s)", bw.get("read_peak_GBps"), bw.get("torch_copy_GBps"),
        "torch device-to-device copy (read + write bytes), same run")
    row("probe copy peak (GB/s)", bw.get("copy_peak_GBps"), bw.get("torch_copy_GBps"),
        "torch device-to-device copy, same run")
    row("GPU launch latency (us)", s.get("launch_gpu_us"), s.get("graph_launch_us"),
        "CUDA graph replay of empty kernels, same run")
    row("host launch cost (us)", s.get("launch_host_us"), s.get("launch_gpu_us"),
        "the GPU's own launch latency (CUDA events), same run")
    ln, other = s.get("latency_ns") or {}, s.get("latency_other_methods") or []
    for r in other:
        row(f"latency {r['figure']} (ns)", ln.get(r["figure"]), r["ns"], r["method"])
    return rows


def load_tables(run) -> dict:
    return {t: run.table(t) for t in run.tables if run.has_table(t)}


def _parse_probes(spec: str | None) -> list[str]:
    if not spec:
        return list(PROBES)
    names = [p.strip() for p in spec.split(",") if p.strip()]
    bad = [p for p in names if p not in PROBES]
    if bad:
        raise UsageError(f"unknown probe(s) {', '.join(bad)}; choose from {', '.join(PROBES)}")
    return [p for p in PROBES if p in names]      # dependency order (l2map before signal)


def run_scan(info, probes: list[str], quick: bool, runs_dir=None, argv=None, progress=None):
    """Run `probes` on the GPU `info` describes; returns (run, summary)."""
    import torch
    from kog.probe.probes.common import ProbeContext
    from kog.runstore import RunStore
    torch.cuda.set_device(info.index)
    ctx = ProbeContext(sms=info.sms, vendor=info.vendor, quick=quick, device_index=info.index,
                       l2_bytes=info.l2_bytes, dies=info.dies or 1, llc_bytes=info.llc_bytes)
    tables: dict = {}
    secs: dict = {}
    t_start = time.perf_counter()
    run = RunStore(runs_dir).create("scan", info, argv=argv,
                                    extra={"scan": {"quick": quick, "probes": probes}})
    summary = None

    def finish_summary():
        nonlocal summary
        summary = build_summary(tables, ctx.extras, info.to_dict(), time.perf_counter() - t_start,
                                run.meta.get("errors"), secs)
        run.write_json("summary", summary)
        run.write_json("probe_extras", ctx.extras)

    with run:
        try:
            for name in probes:
                if progress:
                    progress(name, "start")
                ctx.progress = (lambda msg, n=name: progress(n, msg)) if progress else None
                t0 = time.perf_counter()
                try:
                    mod = importlib.import_module(f"kog.probe.probes.{name}")
                    kw = {}
                    if name == "signal" and "l2map" in ctx.extras:
                        kw["sm_ghz"] = ctx.extras["l2map"].get("sm_ghz")
                    res = mod.measure(ctx, **kw)
                    torch.cuda.synchronize()
                    for tname, df in res.items():
                        run.write_table(tname, df)
                        tables[tname] = df
                except KeyboardInterrupt:
                    raise
                except Exception as e:  # a failed probe is recorded; the scan goes on
                    run.note_error(name, f"{type(e).__name__}: {e}"[:1000])
                    try:
                        torch.cuda.synchronize()
                    except Exception as e2:  # the CUDA context is gone: nothing else can run
                        run.note_error("scan", f"CUDA context lost after {name}: {e2}"[:500])
                        break
                secs[name] = time.perf_counter() - t0
                if progress:
                    progress(name, "done")
        finally:
            finish_summary()
    return run, summary


def print_summary(summary: dict, run_path, console=None) -> None:
    from rich.table import Table
    from kog.clitools import stdout_console
    c = console or stdout_console()
    t = Table(title=f"kogprobe scan: {summary.get('device')} ({summary.get('sms')} SMs)")
    t.add_column("measure")
    t.add_column("value", justify="right")
    ln, lc = summary.get("latency_ns") or {}, summary.get("latency_cycles") or {}
    lm = summary.get("latency_method") or {}
    for k in ("l1", "l2_near", "l2_far", "hbm"):
        t.add_row(f"latency {k}", f"{ln.get(k)} ns / {lc.get(k)} cyc ({lm.get(k, '')})")
    pen = summary.get("l2_far_penalty") or {}
    if pen:
        t.add_row("far-L2 penalty", f"+{pen.get('ns')} ns, x{pen.get('ratio')} ({pen.get('method')})")
    parts = summary.get("l2_partitions")
    t.add_row("L2 partitions", " + ".join(str(len(p)) for p in parts) + " SMs" if parts else "-")
    for k, unit in (("barrier_us_all_ctas", "us"), ("flag_oneway_us", "us"), ("launch_host_us", "us (host)"),
                    ("launch_gpu_us", "us (GPU)"), ("graph_launch_us", "us"), ("sms_to_saturate_hbm", "SMs"),
                    ("hbm_read_GBps", "GB/s"), ("hbm_copy_GBps", "GB/s"), ("scan_seconds", "s")):
        t.add_row(k, f"{summary.get(k)} {unit}")
    if summary.get("partition"):
        t.add_row("partition modes", ", ".join(f"{k} {v}" for k, v in summary["partition"].items()))
    xcd = summary.get("xcd") or {}
    if xcd.get("latency_ns") or xcd.get("cross_xcd_ns"):
        t.add_row("XCD latency (unverified)", f"{xcd.get('latency_ns')} ns; cross {xcd.get('cross_xcd_ns')}")
    sig = summary.get("signal_ns")
    if sig:
        t.add_row("SM->SM signal", f"median {sig.get('median')} ns (same part. {sig.get('same_partition_ns')},"
                                   f" cross {sig.get('cross_partition_ns')})")
    c.print(t)
    ct = Table(title="against published figures")
    for col in ("figure", "ours", "theirs", "ratio", "note"):
        ct.add_column(col)
    for r in summary.get("comparison", []):
        ct.add_row(r["figure"], str(r["ours"]), str(r["theirs"]), str(r["ratio"]), r["explanation"])
    c.print(ct)
    for k, v in (summary.get("errors") or {}).items():
        c.print(f"[red]error[/red] {k}: {v}")
    c.print(f"run: {run_path}")


def cli_scan(args, render_report: Callable[[Any], Any] | None = None) -> int:
    """`kogprobe scan`: run the probes, store the run, print its summary; render_report(run) -> path makes
    its report (unless --no-report). The probe layer renders nothing itself: the CLI passes the reports'."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from kog.probe.device import require_gpu
    info = require_gpu(args.device)
    probes = _parse_probes(args.probes)
    err = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=err,
                  transient=bool(args.json)) as prog:
        task = prog.add_task("scan", total=len(probes))

        def progress(name, msg):
            if msg == "done":
                prog.advance(task)
            else:
                prog.update(task, description=f"{name}: {msg}" if msg != "start" else name)
        run, summary = run_scan(info, probes, args.quick, args.runs_dir, argv=sys.argv, progress=progress)
    report = None
    if render_report is not None and not args.no_report:
        try:
            report = render_report(run)
        except Exception as e:  # the scan is stored either way
            err.print(f"report: failed ({type(e).__name__}: {e})")
    if args.json:
        print(json.dumps(summary, indent=1, default=str))
    else:
        print_summary(summary, run.path)
        if report:
            print(f"report: {report}")
    return 1 if summary.get("errors") and len(summary["errors"]) >= len(probes) else 0
