"""Run one trial in its own process, with a timeout: a faulted kernel poisons its CUDA context, so nothing
of a trial may run in the process that owns the study.

The child is `python -m kog.tune.worker` in a new session (its own process group). It reads one JSON job
on stdin ({"target": "module:function", "payload": {...}}), calls target(payload, report), and writes JSON
lines on stdout: {"event": "intermediate", "step", "value"} for every report() and finally
{"event": "result", "value", ...} or {"event": "error", "type", "message"}. The parent turns whatever
happens into an Outcome:

    ok            a result line
    crash         killed by a signal (segfault, abort) or a non-zero exit with no result
    hang          no result before the timeout: the whole process group is killed
    oom           an out-of-memory error (torch OutOfMemoryError, "out of memory")
    compile       a compile error (Triton CompilationError, "compil..." in the message)
    wrong         a correctness-gate failure (CorrectnessError)
    invalid       a config the engine refused (ConfigError)
    error         any other exception
    pruned        the parent's on_intermediate callback asked to stop (the child is killed)
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Outcome:
    status: str                       # ok | crash | hang | oom | compile | wrong | invalid | error | pruned
    value: float | None = None
    reason: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    intermediates: list[tuple[int, float]] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def classify_error(etype: str, message: str) -> str:
    m = message.lower()
    if etype in ("OutOfMemoryError",) or "out of memory" in m or "outofmemory" in m:
        return "oom"
    if etype == "CorrectnessError":
        return "wrong"
    if etype in ("ConfigError", "Infeasible"):
        return "invalid"
    if etype in ("CompilationError", "CompileTimeAssertionFailure") or "compil" in m:
        return "compile"
    return "error"


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)   # the worker's own group: its children too
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def run_isolated(target: str, payload: dict[str, Any], timeout: float,
                 on_intermediate: Callable[[int, float], bool] | None = None,
                 env: dict[str, str] | None = None) -> Outcome:
    """Run target(payload, report) in a fresh process; never raises for anything the child does."""
    t0 = time.monotonic()
    job = json.dumps({"target": target, "payload": payload})
    err = tempfile.TemporaryFile(mode="w+b")
    child_env = {**os.environ, **(env or {})}
    child_env.setdefault("PYTHONFAULTHANDLER", "1")
    proc = subprocess.Popen([sys.executable, "-m", "kog.tune.worker"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=err, env=child_env, start_new_session=True)
    lines: "queue.Queue[bytes | None]" = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for ln in proc.stdout:
            lines.put(ln)
        lines.put(None)

    th = threading.Thread(target=pump, daemon=True)
    th.start()
    try:
        assert proc.stdin is not None
        proc.stdin.write(job.encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass

    out = Outcome("crash")
    final: dict[str, Any] | None = None
    deadline = t0 + timeout
    eof = False
    try:
        while not eof:
            left = deadline - time.monotonic()
            if left <= 0:
                _kill_group(proc)
                out.status, out.reason = "hang", f"hang: no result after {timeout:g} s (process group killed)"
                break
            try:
                ln = lines.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if ln is None:
                eof = True
                break
            try:
                msg = json.loads(ln)
            except ValueError:
                continue   # stray output of a library: not ours
            ev = msg.get("event")
            if ev == "intermediate":
                step, val = int(msg["step"]), float(msg["value"])
                out.intermediates.append((step, val))
                if on_intermediate is not None and on_intermediate(step, val):
                    _kill_group(proc)
                    out.status, out.reason = "pruned", f"pruned after step {step} ({val:.1f})"
                    break
            elif ev in ("result", "error"):
                final = msg
        if eof:
            try:
                rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                rc = None
            if final is not None and final.get("event") == "result":
                out.status, out.value = "ok", float(final["value"])
                out.data = {k: v for k, v in final.items() if k not in ("event", "value")}
            elif final is not None:
                out.status = classify_error(final.get("type", ""), final.get("message", ""))
                out.reason = f"{out.status}: {final.get('type')}: {final.get('message')}"[:500]
            elif rc is None:
                out.status, out.reason = "hang", f"hang: no exit after closing its output (killed)"
            elif rc < 0:
                out.status, out.reason = "crash", f"crash: killed by {_signal_name(-rc)}"
            else:
                tail = _tail(err)
                low = tail.lower()
                out.status = "oom" if "out of memory" in low or "memoryerror" in low else "crash"
                out.reason = f"{out.status}: exit code {rc}" + (f": {tail}" if tail else "")
                if rc == 137 or rc == -9:
                    out.reason += " (killed: out of memory?)"
    finally:
        if proc.poll() is None:
            _kill_group(proc)
        err.close()
    out.wall_s = time.monotonic() - t0
    return out


def _tail(f, n: int = 300) -> str:
    try:
        f.seek(0)
        lines = [ln for ln in f.read().decode(errors="replace").strip().splitlines() if ln.strip()]
        return lines[-1][-n:] if lines else ""
    except Exception:
        return ""
