"""`kogprobe`: measure the GPU (scan), render a scan's report, list stored runs.

Each subcommand's work lives in its own module; this file only parses arguments and dispatches,
so `kogprobe --help` stays fast (no torch import) and a missing GPU is one clear line.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kog import __version__
from kog.clitools import HelpFormatter, add_subparser, parse_args, plain_table, stdout_console
from kog.errors import cli_entry, import_command
from kog.probe.probes import PROBES as PROBE_NAMES      # names only: the package imports no probe module


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kogprobe", formatter_class=HelpFormatter,
        description="Measure what a persistent kernel sees of this GPU: placement, latency per SM and "
                    "L2 partition, SM-to-SM signal latency, barrier/flag/launch costs, bandwidth vs SMs.",
        epilog="Exit codes: 0 ok, 1 failure, 2 usage or environment error (e.g. no GPU).")
    p.add_argument("--version", action="version", version=f"kog {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    runs_help = "where runs are stored (default: $KOG_RUNS_DIR, else ./runs)"

    s = add_subparser(sub, "scan", help="run the probes on a GPU and store a scan run",
                      description="Run every probe (or --probes) on one GPU; write a run directory "
                                  "(meta.json, one Parquet table per probe, summary.json) and its HTML report.")
    s.add_argument("--quick", action="store_true", help="fewer repeats and sizes (<= 30 s on an H200)")
    s.add_argument("--probes", default=None,
                   help=f"comma-separated subset of probes to run (default: all of {','.join(PROBE_NAMES)})")
    s.add_argument("--device", type=int, default=0, help="GPU index")
    s.add_argument("--runs-dir", default=None, help=runs_help)
    s.add_argument("--no-report", action="store_true", help="do not render the HTML report")
    s.add_argument("--json", action="store_true", help="print summary.json to stdout instead of a table")

    r = add_subparser(sub, "report", help="render the HTML report of a scan run (newest by default)",
                      description="Render a self-contained HTML report of a scan run: RUN, else the newest "
                                  "scan in the run store; --bundled renders the scan recorded on the lent H200 "
                                  "that ships with kog.")
    r.add_argument("run", nargs="?", default=None,
                   help="scan run directory (default: the newest scan run in the run store)")
    r.add_argument("--bundled", action="store_true", help="the scan recorded on an H200, shipped with kog "
                                                          "(-> ./h200-scan-report.html)")
    r.add_argument("--runs-dir", default=None, help=runs_help)
    r.add_argument("--compare", default=None, metavar="RUN2",
                   help="a second scan to show side by side (default: none)")
    r.add_argument("-o", "--output", default=None, help="output HTML file (default: RUN/report.html)")

    d = add_subparser(sub, "device", help="show the inventory of every visible GPU",
                      description="What kog's device layer reads of each GPU: SMs/CUs, dies, caches, memory, "
                                  "clocks, driver, links. Exit 2 when there is no GPU.")
    d.add_argument("--json", action="store_true", help="JSON on stdout (a list, one entry per GPU)")

    ls = add_subparser(sub, "runs", aliases=["list"], help="list stored runs",
                       description="List the runs in the run store, newest last.")
    ls.add_argument("--runs-dir", default=None, help=runs_help)
    ls.add_argument("--kind", choices=["scan", "bench", "study", "sweep"], default=None,
                    help="only runs of this kind (default: every kind)")
    ls.add_argument("--json", action="store_true", help="JSON on stdout (a list, one entry per run)")
    return p


def cmd_device(args) -> int:
    from kog.probe.device import detect, require_gpu
    require_gpu()
    devs = detect()
    if args.json:
        print(json.dumps([d.to_dict() for d in devs], indent=1, default=str))
        return 0
    rows = [[d.index, d.name, d.arch, d.sms, d.dies, f"{d.l2_bytes / 2**20:g}" if d.l2_bytes else "?",
             f"{d.mem_bytes / 2**30:.1f}" if d.mem_bytes else "?", d.driver or "?", d.runtime or "?"]
            for d in devs]
    stdout_console().print(plain_table("kog devices", ["index", "name", "arch", "SMs/CUs", "dies", "L2 MiB",
                                                       "memory GiB", "driver", "runtime"], rows))
    return 0


def _scan_report(run):
    """A scan run's topology report (RUN/report.html): the CLI joins the probe and the reports."""
    from kog.reports.topology import render_scan_report
    return render_scan_report(run)


def cmd_runs(args) -> int:
    from kog.runstore import RunStore
    problems: list = []
    runs = RunStore(args.runs_dir).list(args.kind, problems=problems)
    for path, why in problems:       # named, and the others still listed
        print(f"kogprobe: warning: skipped {path}: {why}", file=sys.stderr)
    rows = [{"path": str(Path(r.path).resolve()), "kind": r.kind, "status": r.status,
             "device": (r.meta.get("device") or {}).get("name"), "started": r.meta.get("started")}
            for r in runs]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    root = RunStore(args.runs_dir).root.resolve()
    if not rows:
        print(f"no runs stored yet in {root}")
        return 0
    cols = ("started", "kind", "status", "device", "path")
    stdout_console().print(plain_table(f"kog runs in {root}", list(cols), [[row[c] for c in cols] for row in rows]))
    return 0


@cli_entry("kogprobe")
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.cmd is None:
        parser.print_help()
        return 2
    if args.cmd == "scan":
        # The GPU check comes before importing the scan module: with no GPU the answer is one clear
        # line and exit 2, whatever the scan module needs at import time.
        from kog.probe.device import require_gpu
        args.device_info = require_gpu(args.device)
        return import_command("kog.probe.scan", "cli_scan", "kogprobe scan")(args, render_report=_scan_report)
    if args.cmd == "report":
        return import_command("kog.reports.cli", "cli_probe_report", "kogprobe report")(args)
    if args.cmd == "device":
        return cmd_device(args)
    if args.cmd in ("runs", "list"):
        return cmd_runs(args)
    parser.error(f"unknown command {args.cmd}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
