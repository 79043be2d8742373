"""Layering one way: the core (kog itself: errors, run store, provenance) <- probe, engine <- tune, reports,
the CLIs. Every module's imports are read with `ast`, those inside functions included, and so are the
modules named to importlib.import_module and kog.errors.import_command:

    core     imports no kog subpackage
    probe    kog core and kog.probe (probe/cli.py, a CLI, may import anything)
    engine   kog core and kog.engine: a library that imports neither the tuner nor the reports
    reports  kog core, kog.probe, kog.engine and kog.reports (reports/cli.py may import anything)
    tune     anything (as the CLIs)

LAZY_EXPORTS lists the one import the core makes of a subpackage: kog.Engine, imported by the module's
__getattr__ on first use (so `import kog` stays free of torch), a public name rather than a dependency.

KNOWN lists the imports that still break a rule, in files whose owner changes them in another branch;
delete an entry when its import is gone (the test fails on any import not allowed and not listed, and on
an entry that no longer matches an import, so the list only shrinks).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"core": "kog", "probe": "kog.probe", "engine": "kog.engine", "tune": "kog.tune", "reports": "kog.reports"}
CLIS = {"probe/cli.py", "tune/cli.py", "reports/cli.py"}
MAY_IMPORT = {
    "core": {"core"},
    "probe": {"core", "probe"},
    "engine": {"core", "engine"},
    "reports": {"core", "probe", "engine", "reports"},
    "tune": set(FOLDERS),
}
DYNAMIC = {"import_module", "import_command"}      # calls whose first argument names a module to import

# (file, imported module): known exceptions, each with its reason; the test fails on an entry whose import is gone
KNOWN: set[tuple[str, str]] = set()
# (file, imported module): public names the core re-exports lazily (module __getattr__), on purpose
LAZY_EXPORTS: set[tuple[str, str]] = {("core/__init__.py", "kog.engine.api")}


def part_of(module: str) -> str | None:
    """The part a module belongs to ('core' for kog itself and its own modules), None outside kog."""
    if module != "kog" and not module.startswith("kog."):
        return None
    top = ".".join(module.split(".")[:2])
    return next((folder for folder, pkg in FOLDERS.items() if pkg == top and folder != "core"), "core")


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO)
    parts = [FOLDERS[rel.parts[0]], *rel.parts[1:-1]]
    return ".".join(parts if rel.stem == "__init__" else [*parts, rel.stem])


def imports(path: Path, text: str | None = None) -> set[str]:
    """Every module `path` imports: import statements anywhere in it (relative ones resolved; `from M import
    n` names M, and M.n where that is another part: `from kog import tune`) and the string argument of
    importlib.import_module / import_command (of an f-string, its constant start)."""
    tree = ast.parse(path.read_text() if text is None else text, str(path))
    here = module_name(path).split(".")
    package = here if path.stem == "__init__" else here[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module
            out |= {base} | {f"{base}.{a.name}" for a in node.names
                             if part_of(f"{base}.{a.name}") != part_of(base)}
        elif isinstance(node, ast.Call) and node.args:
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
            arg = node.args[0]
            if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
                arg = arg.values[0]
            if name in DYNAMIC and isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                out.add(arg.value.rstrip("."))
    return out


def sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def violations() -> set[tuple[str, str]]:
    """(file, module) of every import a file makes against its part's rule."""
    bad = set()
    for path in sources():
        rel = path.relative_to(REPO).as_posix()
        if rel not in CLIS:
            allowed = MAY_IMPORT[rel.split("/")[0]]
            bad |= {(rel, m) for m in imports(path) if part_of(m) not in (None, *allowed)}
    return bad


def test_imports_run_one_way():
    new = violations() - KNOWN - LAZY_EXPORTS
    assert not new, "imports against the layering (core <- probe, engine <- tune, reports, CLIs):\n" + "\n".join(
        f"  {f}: {m}" for f, m in sorted(new))


def test_known_violations_are_still_there():
    """An entry of KNOWN whose import is gone is deleted, so the list only shrinks."""
    gone = KNOWN - violations()
    assert not gone, "delete from KNOWN (the import is gone): " + ", ".join(f"{f}: {m}" for f, m in sorted(gone))


@pytest.mark.parametrize("source, expect", [
    ("import kog.tune.store\n", {"kog.tune.store"}),
    ("def f():\n    from kog.reports.html import Section\n", {"kog.reports.html"}),
    ("from kog import runstore, __version__\nfrom kog import tune\n", {"kog", "kog.tune"}),
    ("from . import plan\nfrom .ring import *\n", {"kog.engine", "kog.engine.ring"}),
    ("importlib.import_module(f'kog.probe.probes.{name}')\nimport_command('kog.tune.bench', 'f', 'c')\n",
     {"kog.probe.probes", "kog.tune.bench"}),
])
def test_the_checker_sees_every_kind_of_import(source, expect):
    assert imports(REPO / "engine" / "example.py", source) == expect


def test_lazy_exports_are_lazy():
    """kog.Engine is there, and `import kog` alone loads neither torch nor the engine."""
    import subprocess
    import sys
    code = ("import sys, kog; assert 'torch' not in sys.modules and 'kog.engine' not in sys.modules; "
            "assert kog.Engine.__module__ == 'kog.engine.api'")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert LAZY_EXPORTS <= violations()


def test_parts():
    assert part_of("kog") == part_of("kog.errors") == part_of("kog.runstore") == "core"
    assert part_of("kog.engine.kernel") == "engine" and part_of("kog.probe") == "probe"
    assert part_of("torch") is None and part_of("kogx") is None
    assert module_name(REPO / "core" / "__init__.py") == "kog"
    assert module_name(REPO / "probe" / "device" / "base.py") == "kog.probe.device.base"
