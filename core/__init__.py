"""kog: a GPU topology profiler (kog.probe), a batch-1 decode engine (kog.engine), its autotuner (kog.tune)
and their reports (kog.reports).

This package itself is the core every part builds on: the errors every command turns into one line and an
exit code (kog.errors), the run store every part writes through (kog.runstore) and what a run records of the
code and environment that made it (kog.provenance). It imports no subpackage, so `import kog.probe` stays
light: kog.Engine (kog.engine.api, the decode engine's Python API) is imported on first use.
"""


def __getattr__(name: str):
    # lazy: the installed version is read from package metadata only when asked for
    if name == "__version__":
        try:
            from importlib.metadata import version
            return version("kog")
        except Exception:  # running from a source tree that is not installed
            return "0+unknown"
    if name == "Engine":
        # lazy: the engine needs torch and Triton, which `import kog` must not load
        from kog.engine.api import Engine
        return Engine
    raise AttributeError(f"module 'kog' has no attribute {name!r}")
