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
    assert row["path"] == str(r.path) and row["status"] == "complete" and row["kind"] == "scan"
    p = run("kogprobe", "runs", "--runs-dir", str(tmp_runs.root / "empty"))
    assert p.returncode == 0 and "no runs" in p.stdout


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
