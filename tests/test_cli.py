"""The two CLIs as a person runs them: subprocesses, exit codes, one-line errors, no tracebacks."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kog import __version__
from kog.errors import NotBuiltError, import_command


def run(*args, env=None, timeout=120):
    """Run `python -m kog.<tool>.cli ARGS` (the console scripts' code, with no PATH assumptions)."""
    tool, rest = args[0], list(args[1:])
    mod = {"kogprobe": "kog.probe.cli", "kogtune": "kog.tune.cli"}[tool]
    e = {k: v for k, v in os.environ.items() if k not in ("KOG_FAKE_DEVICE", "KOG_DEBUG")}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", mod, *rest], capture_output=True, text=True,
                          timeout=timeout, env=e)


def _no_traceback(p):
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout


@pytest.mark.parametrize("tool,words", [("kogprobe", ["scan", "report", "runs"]),
                                        ("kogtune", ["search", "bench", "generate", "report", "show"])])
def test_help(tool, words):
    p = run(tool, "--help")
    assert p.returncode == 0, p.stderr
    for w in words:
        assert w in p.stdout
    assert "Exit codes" in p.stdout


@pytest.mark.parametrize("tool", ["kogprobe", "kogtune"])
def test_version(tool):
    p = run(tool, "--version")
    assert p.returncode == 0 and p.stdout.strip() == f"kog {__version__}"


@pytest.mark.parametrize("tool", ["kogprobe", "kogtune"])
def test_unknown_subcommand_is_usage_error(tool):
    p = run(tool, "frobnicate")
    assert p.returncode == 2 and "usage:" in p.stderr and "invalid choice" in p.stderr
    _no_traceback(p)


@pytest.mark.parametrize("tool", ["kogprobe", "kogtune"])
def test_no_subcommand_prints_help_and_exits_2(tool):
    p = run(tool)
    assert p.returncode == 2 and "usage:" in p.stdout


@pytest.mark.parametrize("argv,prog", [(["kogprobe", "scan"], "kogprobe"),
                                       (["kogprobe", "scan", "--quick"], "kogprobe"),
                                       (["kogprobe", "device"], "kogprobe"),
                                       (["kogtune", "bench"], "kogtune"),
                                       (["kogtune", "search", "--backend", "gpu"], "kogtune")])
def test_gpu_commands_without_gpu_exit_2_with_one_line(argv, prog):
    p = run(*argv, env={"KOG_FAKE_DEVICE": "none"})
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: no GPU"), p.stderr
    assert p.stdout == ""
    _no_traceback(p)


def test_scan_on_this_cpu_machine_names_what_is_missing():
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    p = run("kogprobe", "scan")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs a CUDA or ROCm GPU" in lines[0] and "CPU-only build" in lines[0]


def test_device_json_with_fake(tmp_path):
    p = run("kogprobe", "device", "--json", env={"KOG_FAKE_DEVICE": "mi300x"})
    assert p.returncode == 0, p.stderr
    (d,) = json.loads(p.stdout)
    assert d["sms"] == 304 and d["dies"] == 8


def test_python_m_device_prints_inventory_or_one_line():
    e = {k: v for k, v in os.environ.items() if k != "KOG_FAKE_DEVICE"}
    p = subprocess.run([sys.executable, "-m", "kog.probe.device"], capture_output=True, text=True,
                       env={**e, "KOG_FAKE_DEVICE": "h200"}, timeout=120)
    assert p.returncode == 0 and json.loads(p.stdout)[0]["l2_bytes"] == 60 << 20
    p = subprocess.run([sys.executable, "-m", "kog.probe.device"], capture_output=True, text=True,
                       env={**e, "KOG_FAKE_DEVICE": "none"}, timeout=120)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and p.stdout == ""


def test_runs_lists_the_store(tmp_runs):
    with tmp_runs.create("scan", None) as r:
        pass
    p = run("kogprobe", "runs", "--json", "--runs-dir", str(tmp_runs.root))
    assert p.returncode == 0, p.stderr
    (row,) = json.loads(p.stdout)
    assert row["path"] == str(r.path.resolve()) and row["status"] == "complete" and row["kind"] == "scan"
    p = run("kogprobe", "runs", "--runs-dir", str(tmp_runs.root / "empty"))
    assert p.returncode == 0 and "no runs" in p.stdout


def test_runs_piped_prints_whole_paths(tmp_path):
    # not a terminal (a pipe, as in `kogprobe runs | cat`): no 80-column cut, no wrapping, no ellipsis
    from kog.runstore import RunStore
    store = RunStore(tmp_path / ("a-rather-long-folder-name-" * 4) / "runs")
    with store.create("scan", {"name": "NVIDIA H200 with a long device name"}) as r:
        pass
    p = run("kogprobe", "runs", "--runs-dir", str(store.root))
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if "scan" in ln and "complete" in ln)
    assert str(r.path.resolve()) in line and "…" not in p.stdout


def _options(parser):
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sp in action.choices.items():
                yield from ((f"{name} {o}", a) for o, a in _options(sp))
        elif not isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            yield "/".join(action.option_strings) or action.dest, action


@pytest.mark.parametrize("tool", ["kogprobe", "kogtune"])
def test_every_option_has_help_and_shows_its_default(tool):
    from kog.clitools import HelpFormatter
    mod = {"kogprobe": "kog.probe.cli", "kogtune": "kog.tune.cli"}[tool]
    parser = __import__(mod, fromlist=["build_parser"]).build_parser()
    fmt = HelpFormatter(tool)
    bare = [name for name, a in _options(parser) if a.option_strings and not a.help]
    assert not bare, f"options without help: {bare}"
    hidden = [name for name, a in _options(parser) if a.option_strings and not a.required
              and "default" not in fmt._get_help_string(a).lower()]
    assert not hidden, f"options whose help does not show the default: {hidden}"
    p = run(tool, "report", "--help")
    assert p.returncode == 0 and "(default:" in p.stdout


@pytest.mark.parametrize("argv,usage", [(["kogprobe", "runs", "--jsn"], "usage: kogprobe runs"),
                                        (["kogtune", "replay", "x.parquet", "--sed", "3"], "usage: kogtune replay"),
                                        (["kogtune", "bench", "--json", "out.json"], "usage: kogtune bench")])
def test_mistyped_option_prints_the_subcommands_usage(argv, usage):
    p = run(*argv)
    assert p.returncode == 2 and p.stderr.startswith(usage), p.stderr
    assert "unrecognized arguments" in p.stderr
    _no_traceback(p)


@pytest.mark.parametrize("tool,kinds", [("kogprobe", "scan"), ("kogtune", "bench or study or sweep")])
def test_report_without_a_run_and_an_empty_store_is_one_line(tool, kinds, tmp_path):
    p = run(tool, "report", "--runs-dir", str(tmp_path / "runs"))
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and f"no {kinds} run in {tmp_path / 'runs'}" in lines[0], p.stderr


def test_report_without_a_run_renders_the_newest(tmp_path):
    from kog.reports import synthetic
    from kog.runstore import RunStore
    store = RunStore(tmp_path / "runs")
    synthetic.write_scan(store, drop=set(synthetic.SCAN_TABLES) - {"latency"})
    newest = synthetic.write_scan(store, drop=set(synthetic.SCAN_TABLES) - {"bandwidth"})
    bench = synthetic.write_bench(store, drop=("timeline",))
    p = run("kogprobe", "report", "--runs-dir", str(store.root))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == str(newest.path / "report.html")
    assert str(newest.path.resolve()) in p.stderr
    p = run("kogtune", "report", "--runs-dir", str(store.root))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip().splitlines()[-1] == str(bench.path / "report.html")


def test_replay_json_is_only_json():
    from pathlib import Path
    sweep = Path(__file__).resolve().parents[1] / "tune" / "data" / "sim-nvidia-h200-llama-3.2-1b-sweep.parquet"
    p = run("kogtune", "replay", str(sweep), "--seeds", "1", "--sampler", "random", "--compare", "", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)           # the whole of stdout is one JSON document
    assert doc["sampler"] == "random" and doc["median_evaluations"] >= 1


@pytest.mark.parametrize("name", ["tpe", "gp", "cmaes", "random"])
def test_every_offered_sampler_is_installed(name):
    # the README's install (pip install -e .) brings what each --sampler choice needs
    from kog.tune.search import make_sampler
    assert make_sampler(name, seed=0) is not None


# ---- dispatch: "not built yet" only for a missing module, never masking other import errors ----

def test_import_command_missing_module_is_not_built():
    with pytest.raises(NotBuiltError, match=r"^kogtune frob is not built yet$"):
        import_command("kog.tune.no_such_module_xyz", "cli", "kogtune frob")


def test_import_command_missing_function_is_not_built():
    with pytest.raises(NotBuiltError, match="not built yet"):
        import_command("kog.errors", "no_such_function", "kogprobe x")


def test_import_command_does_not_mask_inner_import_errors(tmp_path, monkeypatch):
    pkg = tmp_path / "kogtestpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "broken.py").write_text("import kog_dependency_that_does_not_exist\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError) as e:
        import_command("kogtestpkg.broken", "cli", "x")
    assert e.value.name == "kog_dependency_that_does_not_exist"


def test_unexpected_errors_are_one_line_without_traceback(tmp_path):
    # Any exception a command did not expect still reaches the user as one line and exit 1.
    code = ("from kog.errors import cli_entry\n"
            "@cli_entry('t')\n"
            "def main(argv=None):\n"
            "    raise ZeroDivisionError('boom')\n"
            "import sys; sys.exit(main())\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={k: v for k, v in os.environ.items() if k != "KOG_DEBUG"})
    assert p.returncode == 1 and p.stderr.strip() == (
        "t: error: ZeroDivisionError: boom (set KOG_DEBUG=1 for the traceback)")
