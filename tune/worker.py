"""The child side of kog.tune.isolation.

    python -m kog.tune.worker            one job: reads ONE JSON job on stdin, runs it, exits
    python -m kog.tune.worker --serve    warm: reads one JSON job per line, runs them one after another

Protocol (JSON lines on stdout, see isolation.py). Anything the target prints goes to stderr, so stdout
carries only protocol lines. In --serve mode every report() waits for the parent's one-line answer
({"prune": bool}); a prune raises TrialPruned inside the target, so a pruned trial ends with a clean
{"event": "pruned"} and the process (its CUDA context, its cached weights) serves the next job.

CACHE is a per-process dict the targets use to keep expensive state between the jobs of a warm worker
(random weights on the GPU, reference logits); in one-job mode it simply starts empty every time.
"""
from __future__ import annotations

import importlib
import json
import math
import os
import sys
import threading
from typing import Any, Callable

CACHE: dict[Any, Any] = {}


class TrialPruned(Exception):
    """The parent asked to stop this trial after an intermediate report (warm mode)."""


def run_job(job: dict[str, Any], emit: Callable[[dict], None],
            answer: Callable[[], dict] | None = None) -> bool:
    """Run one job; emit its intermediate and final lines. Returns True when it produced a result."""
    try:
        mod, fn = job["target"].split(":")
        target = getattr(importlib.import_module(mod), fn)

        def report(step: int, value: float) -> None:
            emit({"event": "intermediate", "step": int(step), "value": float(value)})
            if answer is not None and answer().get("prune"):
                raise TrialPruned(f"pruned after step {int(step)} ({float(value):.1f})")

        res = target(job.get("payload") or {}, report)
        if isinstance(res, dict):
            value = res.pop("value")
            extra = res
        else:
            value, extra = res, {}
        if value is None or not math.isfinite(float(value)):
            raise ValueError(f"objective returned a non-finite value {value!r}")
        emit({"event": "result", "value": float(value), **extra})
        return True
    except TrialPruned as e:
        emit({"event": "pruned", "message": str(e)})
        return False
    except BaseException as e:  # noqa: BLE001 - every failure becomes one protocol line
        emit({"event": "error", "type": type(e).__name__, "message": str(e)[:1000]})
        return False


PARENT_ENV = "KOG_PARENT_PID"          # set by kog.tune.isolation._spawn: the pid that started this worker
PDEATHSIG_ENV = "KOG_PDEATHSIG"        # "1": the spawning thread lives as long as its process (see below)


def die_with_parent(parent: int | None = None) -> bool:
    """Have Linux SIGKILL this process when its parent dies (prctl PR_SET_PDEATHSIG), and exit at once if
    `parent` is already gone (it died before the prctl). True where the signal is set.

    The signal fires when the *thread* that started the process ends, so it is only asked for where
    that thread is the parent's main thread (kog.tune.isolation sets KOG_PDEATHSIG then); elsewhere
    _exit_with_parent's watch does the same within a second."""
    if parent is not None and os.getppid() != parent:
        os._exit(0)
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        import signal
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        if libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if parent is not None and os.getppid() != parent:      # died between the check and the prctl
        os._exit(0)
    return True


def _exit_with_parent() -> None:
    """A warm worker lives in its own session (so a hang can be killed with its group): if the process
    that started it dies (kill -9), nothing else would stop it, so it stops itself."""
    ppid = int(os.environ.get(PARENT_ENV) or os.getppid())
    if os.environ.get(PDEATHSIG_ENV) == "1":
        die_with_parent(ppid)

    def watch() -> None:
        import time
        while True:
            if os.getppid() != ppid:
                os._exit(0)
            time.sleep(1.0)

    threading.Thread(target=watch, daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)                     # a library printing to stdout cannot break the protocol
    sys.stdout = sys.stderr

    def emit(obj) -> None:
        proto.write(json.dumps(obj, default=_jsonable) + "\n")
        proto.flush()

    _exit_with_parent()
    if "--serve" not in argv:
        try:
            job = json.loads(sys.stdin.read())
        except BaseException as e:  # noqa: BLE001
            emit({"event": "error", "type": type(e).__name__, "message": str(e)[:1000]})
            return 1
        return 0 if run_job(job, emit) else 1

    stdin = sys.stdin

    def answer() -> dict:
        ln = stdin.readline()
        if not ln:
            raise SystemExit(0)       # the parent went away
        return json.loads(ln)

    while True:
        ln = stdin.readline()
        if not ln:
            return 0                  # EOF: the parent closed us
        if not ln.strip():
            continue
        try:
            job = json.loads(ln)
        except ValueError as e:
            emit({"event": "error", "type": "ProtocolError", "message": str(e)[:300]})
            continue
        run_job(job, emit, answer)


def _jsonable(o):
    try:
        import numpy as np
        if isinstance(o, np.generic):
            return o.item()
    except Exception:
        pass
    return str(o)


if __name__ == "__main__":
    sys.exit(main())
