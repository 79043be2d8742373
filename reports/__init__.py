"""kog.reports: self-contained HTML reports of the runs in the run store (kog.runstore).

    from kog.reports import render_scan_report, render_bench_report, render_study_report, render_compare
"""

_LAZY = {"render_scan_report": "kog.reports.topology", "render_bench_report": "kog.reports.engine_report",
         "render_study_report": "kog.reports.tuning", "render_compare": "kog.reports.compare"}


def __getattr__(name):
    # lazy: importing kog.reports must not pull in matplotlib, pandas or optuna
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kog.reports' has no attribute {name!r}")
