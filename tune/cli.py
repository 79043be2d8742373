"""`kogtune`: tune the engine (search), benchmark it (bench), generate text, render and list results.

Argument parsing and dispatch only; the work lives in kog.tune.search, kog.tune.bench,
kog.tune.generate and kog.reports.
"""
from __future__ import annotations

import argparse
import sys

from kog import __version__
from kog.clitools import HelpFormatter, add_subparser, parse_args
from kog.errors import cli_entry, import_command
from kog.tune.bench import DEFAULT_PROMPT_TOKENS, DEFAULT_TOKENS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kogtune", formatter_class=HelpFormatter,
        description="Tune, benchmark and run kog's monokernel decode engine on this GPU.",
        epilog="Exit codes: 0 ok, 1 failure, 2 usage or environment error (e.g. no GPU, unknown model).")
    p.add_argument("--version", action="version", version=f"kog {__version__}")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    runs_help = "where runs are stored (default: $KOG_RUNS_DIR, else ./runs)"
    samplers = ["tpe", "gp", "cmaes", "random"]

    s = add_subparser(sub, "search", help="Optuna search over the engine's configuration",
                      description="Tune tiling, task-to-SM mapping and wait granularity with Optuna; every "
                                  "trial runs in its own process with a timeout, so a crash or hang only fails "
                                  "that trial. Resumes when run again with the same study and storage.")
    s.add_argument("--model", default="llama-3.2-1b", help="preset name or HF checkpoint directory")
    s.add_argument("--trials", type=int, default=60, help="trials the study holds when the search ends "
                                                          "(completed ones are kept across runs)")
    s.add_argument("--study", default=None,
                   help="study name (default: kog-<device>-<model>, with -sim for --backend sim)")
    s.add_argument("--storage", default=None,
                   help="Optuna storage URL; a relative sqlite path is made absolute (default: "
                        "sqlite:///<runs dir>/kog-studies.db)")
    s.add_argument("--sampler", choices=samplers, default="tpe", help="Optuna sampler")
    s.add_argument("--backend", choices=["gpu", "sim"], default="gpu",
                   help="gpu: measure on the GPU; sim: predict with the cost model from a probe scan")
    s.add_argument("--workers", type=int, default=1, help="worker processes (one per GPU on a multi-GPU host)")
    s.add_argument("--timeout", type=float, default=120.0, help="seconds before a trial is killed")
    s.add_argument("--confirm-rounds", type=int, default=None,
                   help="at the end, re-measure the best config and the engine default alternately this many "
                        "times each (what `python -m kog.tune.promote` claims; default: 3 on a GPU, 0 for sim)")
    s.add_argument("--tp", default=None, metavar="LIST",
                   help="tensor-parallel degrees to search, e.g. 1,2,4 (powers of two <= 8; default: 1 GPU, "
                        "no TP); the stored engine default stays the best single-GPU config")
    s.add_argument("--exchange-rows", default=None, metavar="LIST",
                   help="hidden rows per cross-GPU exchange chunk to search with --tp (default: 64,128,256)")
    s.add_argument("--gpus", type=int, default=None,
                   help="GPUs a TP trial may use (default: gpu, every visible one; sim, the simulated "
                        "host's 8)")
    s.add_argument("--runs-dir", default=None, help=runs_help)
    s.add_argument("--json", action="store_true", help="print the study summary as JSON on stdout")

    b = add_subparser(sub, "bench", help="benchmark the monokernel against torch.compile, CUDA graph and HF",
                      description="On the same weights in one process: the monokernel in each sync mode, the "
                                  "reference under torch.compile and under a CUDA graph, HF transformers "
                                  "generate; median of repeats; a device copy measured in the same run.")
    b.add_argument("--model", default="llama-3.2-1b", help="preset name or HF checkpoint directory")
    b.add_argument("--tokens", type=int, default=DEFAULT_TOKENS, help="new tokens per run")
    b.add_argument("--prompt-tokens", type=int, default=DEFAULT_PROMPT_TOKENS, help="prompt length in tokens")
    b.add_argument("--repeats", type=int, default=5, help="timed runs per system (the median is reported)")
    b.add_argument("--systems", default=None,
                   help="comma-separated subset of systems (default: all; kog-rule, the engine with the "
                        "platform's rule, only where kog-targeted runs a tuned config)")
    b.add_argument("--out", default=None, metavar="OUT",
                   help="also write the bench JSON to the file OUT (default: only RUN/bench.json)")
    b.add_argument("--json", action="store_true", help="print the bench JSON on stdout")
    b.add_argument("--runs-dir", default=None, help=runs_help)

    g = add_subparser(sub, "generate", help="generate text with the monokernel",
                      description="Prefill a prompt, then decode with the monokernel (kog.Engine), tokens "
                                  "streamed as the kernel produces them. --model takes a preset (random "
                                  "weights), an HF checkpoint directory or a Hub id in the local HF cache.")
    g.add_argument("--model", required=True, help="preset name, HF checkpoint directory or cached Hub id (required)")
    g.add_argument("--prompt", default="The quick brown fox", help="prompt text")
    g.add_argument("--tokens", type=int, default=64, help="new tokens to generate")
    g.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: all)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1.0: all)")
    g.add_argument("--seed", type=int, default=None, help="sampling seed (default: a fresh one, printed)")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop when the output contains TEXT (repeatable); the checkpoint's EOS always stops")
    g.add_argument("--stop-id", action="append", type=int, default=[], metavar="ID",
                   help="stop at token id ID (repeatable; with the EOS ids at most 8)")
    g.add_argument("--max-seq", type=int, default=None,
                   help="KV cache positions (default: the model's context, at most 4096)")
    g.add_argument("--mode", choices=["targeted", "grid", "reference"], default="targeted",
                   help="engine sync mode, or the PyTorch reference")
    g.add_argument("--json", action="store_true", help="print the result as JSON on stdout")

    r = add_subparser(sub, "report", help="render the HTML report of a bench or study run (newest by default)",
                      description="Render the report of RUN (a bench, study or sweep run, or a bench JSON "
                                  "file), else of the newest such run in the run store; --bundled renders "
                                  "the bench recorded on an H200 that ships with kog.")
    r.add_argument("run", nargs="?", default=None,
                   help="run directory or bench JSON file (default: the newest bench/study/sweep run)")
    r.add_argument("--bundled", action="store_true",
                   help="the bench recorded on an H200, shipped with kog (-> ./h200-bench-report.html)")
    r.add_argument("--study", default=None, help="an Optuna study name, with --storage (default: none)")
    r.add_argument("--storage", default=None, help="Optuna storage URL of --study (default: none)")
    r.add_argument("--runs-dir", default=None, help=runs_help)
    r.add_argument("--compare", default=None, metavar="RUN2",
                   help="a second run to compare with (default: none)")
    r.add_argument("-o", "--output", default=None, help="output HTML file (default: RUN/report.html)")

    rp = add_subparser(sub, "replay", help="replay samplers against a recorded exhaustive sweep table",
                       description="Look results up in SWEEP (Parquet/CSV: config columns -> tok_per_s) instead "
                                   "of measuring; prints, last, the median evaluations to within 2% of best.")
    rp.add_argument("sweep", metavar="SWEEP", help="sweep table (Parquet or CSV)")
    rp.add_argument("--seeds", type=int, default=10, help="replays per sampler, one seed each")
    rp.add_argument("--sampler", choices=samplers, default="tpe", help="the sampler whose median is printed last")
    rp.add_argument("--compare", default="random", help="comma-separated samplers to report beside it")
    rp.add_argument("--json", action="store_true", help="print only the result as JSON on stdout")

    sh = add_subparser(sub, "show", help="list tuned configurations stored for this machine",
                       description="The tuned configurations in this machine's store and kog's built-in ones.")
    sh.add_argument("--json", action="store_true", help="print the store as JSON on stdout")
    return p


@cli_entry("kogtune")
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.cmd is None:
        parser.print_help()
        return 2
    # Commands that measure on a GPU check for one before importing their module, so a machine
    # without one gets one clear line (exit 2) whatever that module needs at import time.
    if args.cmd == "search":
        from kog.tune.space import parse_exchange_rows, parse_tp_degrees
        args.tp_degrees = parse_tp_degrees(args.tp)           # bad --tp: one line before anything else
        parse_exchange_rows(args.exchange_rows)
        if args.backend == "gpu":
            from kog.probe.device import require_gpu
            args.device_info = require_gpu()
        return import_command("kog.tune.search", "cli_search", "kogtune search")(args)
    if args.cmd == "bench":
        from kog.probe.device import require_gpu
        args.device_info = require_gpu()
        return import_command("kog.tune.bench", "cli_bench", "kogtune bench")(args)
    if args.cmd == "generate":
        return import_command("kog.tune.generate", "cli_generate", "kogtune generate")(args)
    if args.cmd == "report":
        return import_command("kog.reports.cli", "cli_tune_report", "kogtune report")(args)
    if args.cmd == "replay":
        from kog.tune.replay import cli_replay
        return cli_replay(args)
    if args.cmd == "show":
        return import_command("kog.tune.store", "cli_show", "kogtune show")(args)
    parser.error(f"unknown command {args.cmd}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
