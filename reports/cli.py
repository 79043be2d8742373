"""`kogprobe report` and `kogtune report`: pick the run (RUN, else the newest of its kinds in the run store;
--bundled the H200 run shipped with kog; or an Optuna study), render its report (or a comparison with
--compare), print the output path last."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from kog.errors import KogError, UsageError


def bundled_scan() -> Path:
    """The scan recorded on the lent H200 that ships with kog (kog.probe.scan.bundled_scan_path)."""
    try:
        from kog.probe.scan import bundled_scan_path
    except ImportError:
        raise KogError("no bundled scan yet: this kog has no recorded H200 scan (kog.probe.scan.bundled_scan_path)") \
            from None
    try:
        p = Path(bundled_scan_path())
    except Exception as e:  # noqa: BLE001
        raise KogError(f"no bundled scan yet: {e}") from None
    if not (p / "meta.json").exists():
        raise KogError(f"no bundled scan yet: {p} has no meta.json")
    return p


BUNDLED_BENCH = Path(__file__).resolve().parent / "data" / "h200_bench_llama-3.2-1b.json"
# the whole run directory of that bench (its bench.json is the same file), with the instrumented run's
# per-task timeline: the bundled report then shows the per-SM timeline too
BUNDLED_BENCH_RUN = Path(__file__).resolve().parent / "data" / "h200_bench_run"


def bundled_bench() -> Path:
    """The `kogtune bench` run recorded on the lent H200 that ships with kog: its run directory when the
    package has it, else that run's bench JSON. It is a whole run of the llama-3.2-1b preset (the report
    names its commit); bench/h200/llama-3.2-1b.json can be a newer bench of the same preset."""
    if (BUNDLED_BENCH_RUN / "meta.json").is_file():
        return BUNDLED_BENCH_RUN
    if not BUNDLED_BENCH.is_file():
        raise KogError(f"no bundled bench: {BUNDLED_BENCH} is missing from this installation")
    return BUNDLED_BENCH


def _writable_dir(d: Path) -> bool:
    return d.is_dir() and os.access(d, os.W_OK)


def _default_out(run, name: str) -> Path:
    """RUN/<name>, or ./<run dir name>-<name> when the run directory is read-only (the bundled scan
    inside an installed package)."""
    base = Path(run.path)
    if base.is_file():
        return base.with_name(f"{base.stem}-{name}") if _writable_dir(base.parent) else Path.cwd() / f"{base.stem}-{name}"
    return base / name if _writable_dir(base) else Path.cwd() / f"{base.name}-{name}"


def _open(path: str | Path):
    p = Path(path)
    if p.is_file() and p.suffix == ".json":
        from kog.reports.engine_report import JsonBench
        return JsonBench(p)
    from kog.runstore import open_run
    return open_run(p)


def render_run(run, out: str | Path | None = None) -> Path:
    """The report of any run, by its kind."""
    kind = run.kind
    out = Path(out) if out else _default_out(run, "report.html")
    if kind == "scan":
        from kog.reports.topology import render_scan_report
        return render_scan_report(run, out)
    if kind == "bench":
        from kog.reports.engine_report import render_bench_report
        return render_bench_report(run, out)
    if kind in ("study", "sweep"):
        from kog.reports.tuning import render_study_report
        return render_study_report(run, out)
    raise UsageError(f"no report for {kind} runs: {run.path}")


def _compare(run, other: str, out) -> Path:
    from kog.reports.compare import render_compare
    b = _open(other)
    return render_compare(run, b, Path(out) if out else _default_out(run, "compare.html"))


def _check_output(args) -> None:
    """Refuse -o at a symlink, FIFO, device or folder before any rendering (the write refuses it too)."""
    if getattr(args, "output", None) is not None:
        from kog.fsutil import check_output_path
        check_output_path(args.output)


def _done(path: Path, *runs) -> int:
    """Print the report's path; then, if a run had corrupt files (the report names them and shows the rest),
    one line naming them and exit 2: a corrupt run is not a run whose parts did not run."""
    print(path)
    from kog.reports.html import corrupt_files
    bad = [f"{getattr(r, 'path', r)}/{f} ({why})" for r in runs for f, why in corrupt_files(r).items()]
    if bad:
        from kog.runstore import RunError
        raise RunError(f"corrupt: {'; '.join(bad)}"[:600] + " (the report shows the rest)")
    return 0


def newest_run(kinds: tuple[str, ...], runs_dir=None, tool: str = "kogtune"):
    """The newest run of one of `kinds` in the run store (any status: an interrupted run still has a
    report), or UsageError saying there is none and what to give instead."""
    from kog.runstore import RunStore
    store = RunStore(runs_dir)
    runs = [r for r in store.list() if r.kind in kinds]
    if not runs:
        raise UsageError(f"no {' or '.join(kinds)} run in {store.root.resolve()}: give a RUN directory "
                         f"(or --runs-dir, $KOG_RUNS_DIR), or --bundled for the run recorded on an H200")
    newest = max(runs, key=lambda r: (str(r.meta.get("started") or ""), Path(r.path).name))
    print(f"{tool} report: the newest {newest.kind} run, {Path(newest.path).resolve()}", file=sys.stderr)
    return newest


def cli_probe_report(args) -> int:
    """kogprobe report [RUN] [--bundled] [--compare RUN2] [-o OUT]; no RUN: the newest scan run."""
    _check_output(args)
    if getattr(args, "bundled", False):
        if getattr(args, "run", None):
            raise UsageError("give a RUN or --bundled, not both")
        run = _open(bundled_scan())
        # never write into the package's data folder: the bundled scan's report goes to the current one
        if not getattr(args, "output", None):
            args.output = str(Path.cwd() / ("h200-scan-compare.html" if getattr(args, "compare", None)
                                            else "h200-scan-report.html"))
    elif getattr(args, "run", None):
        run = _open(args.run)
    else:
        run = newest_run(("scan",), getattr(args, "runs_dir", None), "kogprobe")
    if run.kind != "scan":
        raise UsageError(f"{run.path} is a {run.kind} run; `kogprobe report` renders scans "
                         f"(use `kogtune report` for bench and study runs)")
    out = getattr(args, "output", None)
    path = _compare(run, args.compare, out) if getattr(args, "compare", None) else render_run(run, out)
    return _done(path, run)


def cli_tune_report(args) -> int:
    """kogtune report RUN | --bundled | --study NAME --storage URL [--compare RUN2] [-o OUT]; dispatches on the run's
    kind (bench -> engine report, study -> tuning report, scan -> topology report)."""
    _check_output(args)
    out = getattr(args, "output", None)
    if getattr(args, "bundled", False):
        if getattr(args, "run", None) or getattr(args, "study", None):
            raise UsageError("give a RUN, --study or --bundled, not more than one")
        run = _open(bundled_bench())
        # never beside the package's data file: the bundled bench's report goes to the current folder
        if not out:
            out = str(Path.cwd() / ("h200-bench-compare.html" if getattr(args, "compare", None)
                                    else "h200-bench-report.html"))
        path = _compare(run, args.compare, out) if getattr(args, "compare", None) else render_run(run, out)
        return _done(path, run)
    if getattr(args, "study", None) or (getattr(args, "storage", None) and not getattr(args, "run", None)):
        if not args.storage:
            raise UsageError("--study needs --storage URL (e.g. sqlite:///runs/.../study.db)")
        from kog.reports.tuning import load_study, render_study_report
        study = load_study(args.study, args.storage)
        path = render_study_report(study, Path(out) if out else Path.cwd() / f"{study.study_name}-report.html")
        print(path)
        return 0
    run = _open(args.run) if getattr(args, "run", None) else newest_run(("bench", "study", "sweep"),
                                                                         getattr(args, "runs_dir", None))
    if getattr(args, "compare", None):
        path = _compare(run, args.compare, out)
    elif run.kind in ("study", "sweep") and getattr(args, "storage", None):
        from kog.reports.tuning import render_study_report
        path = render_study_report(run, Path(out) if out else _default_out(run, "report.html"), storage=args.storage)
    else:
        path = render_run(run, out)
    return _done(path, run)
