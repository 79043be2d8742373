"""Fake trial targets for the isolation tests (CPU): each misbehaves in one way a real kernel can."""
from __future__ import annotations

import os
import time


def ok(payload, report):
    report(0, 10.0)
    return {"value": float(payload.get("value", 42.0)), "note": "fine"}


def segfault(payload, report):
    import ctypes
    ctypes.string_at(0)          # SIGSEGV


def abort(payload, report):
    os.abort()                   # SIGABRT


def hang(payload, report):
    time.sleep(3600)


def hang_child(payload, report):
    import subprocess
    import sys
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])   # killed with the group
    time.sleep(3600)


def raise_error(payload, report):
    raise ValueError("bad thing")


def oom(payload, report):
    class OutOfMemoryError(RuntimeError):
        pass
    raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def compile_error(payload, report):
    class CompilationError(Exception):
        pass
    raise CompilationError("at 3:4: unsupported layout")


def wrong(payload, report):
    from kog.tune.objective import CorrectnessError
    raise CorrectnessError("max_rel_err 0.5 > 0.02")


def exit3(payload, report):
    import sys
    sys.stderr.write("something went wrong\n")
    os._exit(3)


def slow_then_value(payload, report):
    report(0, float(payload.get("short", 1.0)))
    time.sleep(float(payload.get("sleep", 0.0)))
    return float(payload.get("value", 1.0))


def crash_if_bigwarps(payload, report):
    """Segfault for the contiguous mapping, else the simulator: a search must go on past crashing configs."""
    if payload["config"]["mapping"] == "contiguous":
        import ctypes
        ctypes.string_at(0)
    from kog.tune.objective import sim_trial
    return sim_trial(payload, report)
