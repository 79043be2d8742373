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

WarmWorker is the same isolation with one process kept alive across trials (`python -m kog.tune.worker
--serve`: one JSON job per line): importing torch, creating a CUDA context and generating the random
weights happen once per worker, not once per trial. A trial still never runs in the parent. After a
crash, hang (the whole process group is killed), OOM or any exception that may have poisoned the CUDA
context, the worker is killed and the next trial starts a fresh one; only clean Python exceptions that
cannot touch the context (CLEAN_ERRORS: a refused config, a failed correctness gate, the engine's bounded
wait timing out, a compile error, a cooperative prune) keep it. Outcomes are the same as run_isolated's.
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
    fresh_worker: bool = True         # the trial paid for a process start (always, for run_isolated)

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


def _spawn(args: list[str], env: dict[str, str] | None):
    """Start `python -m kog.tune.worker ARGS` in its own session (killing its group kills its children too);
    stderr goes to a temporary file (for the reason of a crash), stdout lines to a queue (None at EOF)."""
    err = tempfile.TemporaryFile(mode="w+b")
    child_env = {**os.environ, **(env or {})}
    child_env.setdefault("PYTHONFAULTHANDLER", "1")
    # the worker dies with this process (kog.tune.worker.die_with_parent); the parent-death signal only where
    # the spawning thread is the main one (it fires when that thread ends, not the process)
    child_env["KOG_PARENT_PID"] = str(os.getpid())
    child_env["KOG_PDEATHSIG"] = "1" if threading.current_thread() is threading.main_thread() else "0"
    proc = subprocess.Popen([sys.executable, "-m", "kog.tune.worker", *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=err, env=child_env, start_new_session=True)
    lines: "queue.Queue[bytes | None]" = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for ln in proc.stdout:
            lines.put(ln)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines, err


def _exit_reason(rc: int, err) -> tuple[str, str]:
    """(status, reason) of a child that exited with code rc without a result: a signal is a crash; a
    non-zero exit is a crash or, when its last stderr line says so, out of memory."""
    if rc < 0:
        return "crash", f"crash: killed by {_signal_name(-rc)}"
    tail = _tail(err) if err is not None else ""
    low = tail.lower()
    status = "oom" if "out of memory" in low or "memoryerror" in low else "crash"
    reason = f"{status}: exit code {rc}" + (f": {tail}" if tail else "")
    if rc == 137:
        reason += " (killed: out of memory?)"
    return status, reason


_HANG, _EOF = object(), object()


def _messages(lines: "queue.Queue[str | None]", deadline: float):
    """The child's JSON messages as they arrive on `lines` (a reader thread's queue; None = its output
    closed), then _EOF when the output closes, or _HANG once `deadline` (time.monotonic) has passed. Lines
    that are not JSON are a library's stray output: not ours, skipped."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            yield _HANG
            return
        try:
            ln = lines.get(timeout=min(left, 0.5))
        except queue.Empty:
            continue
        if ln is None:
            yield _EOF
            return
        try:
            msg = json.loads(ln)
        except ValueError:
            continue
        yield msg


def run_isolated(target: str, payload: dict[str, Any], timeout: float,
                 on_intermediate: Callable[[int, float], bool] | None = None,
                 env: dict[str, str] | None = None) -> Outcome:
    """Run target(payload, report) in a fresh process; never raises for anything the child does."""
    t0 = time.monotonic()
    job = json.dumps({"target": target, "payload": payload})
    proc, lines, err = _spawn([], env)
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
        for msg in _messages(lines, deadline):
            if msg is _HANG:
                _kill_group(proc)
                out.status, out.reason = "hang", f"hang: no result after {timeout:g} s (process group killed)"
                break
            if msg is _EOF:
                eof = True
                break
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
                out.status, out.reason = "hang", "hang: no exit after closing its output (killed)"
            else:
                out.status, out.reason = _exit_reason(rc, err)
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


# ---- warm workers -----------------------------------------------------------------------------------
# Exceptions raised in Python before or after a kernel ran to completion: the CUDA context is intact.
# MonokernelError is the engine's bounded spin-wait timing out: the kernel aborted itself and returned.
CLEAN_ERRORS = frozenset({"ConfigError", "Infeasible", "CorrectnessError", "LaunchError", "MonokernelError",
                          "CompilationError", "CompileTimeAssertionFailure", "ProtocolError"})


class WarmWorker:
    """One long-lived `python -m kog.tune.worker --serve` process that runs trials one after another.

    run(target, payload, timeout, on_intermediate) -> Outcome, exactly like run_isolated, and never raises
    for anything the child does. The process is (re)started lazily; `starts` counts them. One thread drives
    one worker's trials (a pool is a list of them); close() and kill() may come from another thread while a
    trial runs (a search's deadline closing its compile pool): the trial then ends as a crash, and a closed
    worker starts no process again (its trials end as errors)."""

    def __init__(self, env: dict[str, str] | None = None, name: str = "worker"):
        self.env = env
        self.name = name
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.jobs = 0
        self._err = None
        self._lines: "queue.Queue[bytes | None]" = queue.Queue()
        self._lock = threading.Lock()       # the process's start and end, from any thread
        self.closed = False

    # -- process management
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _start(self) -> bool:
        """A fresh process; False once the worker is closed."""
        self.kill()
        with self._lock:
            if self.closed:
                return False
            self.proc, self._lines, self._err = _spawn(["--serve"], self.env)
            self.starts += 1
            return True

    def kill(self) -> None:
        with self._lock:
            proc, self.proc = self.proc, None
            err, self._err = self._err, None
        if proc is not None:
            if proc.poll() is None:
                _kill_group(proc)
            for f in (proc.stdin, proc.stdout):
                try:
                    if f is not None:
                        f.close()
                except OSError:
                    pass
        if err is not None:
            err.close()

    def close(self) -> None:
        """Let the worker exit on EOF (its group is killed if it does not within a few seconds); no process
        starts after this."""
        with self._lock:
            self.closed = True
            proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.wait(timeout=5)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                pass
        self.kill()

    def __enter__(self) -> "WarmWorker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def _send(proc: subprocess.Popen, obj: dict[str, Any]) -> bool:
        try:
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(obj) + "\n").encode())
            proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    # -- one trial
    def run(self, target: str, payload: dict[str, Any], timeout: float,
            on_intermediate: Callable[[int, float], bool] | None = None) -> Outcome:
        t0 = time.monotonic()
        out = Outcome("crash", fresh_worker=not self.alive())
        if not self.alive() and not self._start():
            out.status, out.reason = "error", "error: the worker was closed before the trial started"
            return out
        self.jobs += 1
        with self._lock:
            proc, lines, err = self.proc, self._lines, self._err
        if proc is None:                                     # closed between the start and here
            out.status, out.reason = "error", "error: the worker was closed before the trial started"
            return out
        self._send(proc, {"target": target, "payload": payload})
        deadline = t0 + timeout
        keep = False
        for msg in _messages(lines, deadline):
            if msg is _HANG:
                out.status, out.reason = "hang", f"hang: no result after {timeout:g} s (process group killed)"
                break
            if msg is _EOF:                                  # the worker died mid-trial (or was closed)
                out.status, out.reason = self._death_reason(proc, err, deadline)
                break
            ev = msg.get("event")
            if ev == "intermediate":
                step, val = int(msg["step"]), float(msg["value"])
                out.intermediates.append((step, val))
                prune = bool(on_intermediate(step, val)) if on_intermediate is not None else False
                self._send(proc, {"prune": prune})           # the child waits for this answer
            elif ev == "pruned":
                out.status, out.reason, keep = "pruned", msg.get("message", "pruned"), True
                break
            elif ev == "result":
                out.status, out.value, keep = "ok", float(msg["value"]), True
                out.data = {k: v for k, v in msg.items() if k not in ("event", "value")}
                break
            elif ev == "error":
                etype, m = msg.get("type", ""), msg.get("message", "")
                out.status = classify_error(etype, m)
                out.reason = f"{out.status}: {etype}: {m}"[:500]
                keep = etype in CLEAN_ERRORS and out.status != "oom"
                break
        if not keep:
            self.kill()                                      # a fresh process for the next trial
        out.wall_s = time.monotonic() - t0
        return out

    @staticmethod
    def _death_reason(proc: subprocess.Popen, err, deadline: float) -> tuple[str, str]:
        try:
            rc = proc.wait(timeout=max(1.0, min(10.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            return "hang", "hang: no exit after closing its output (killed)"
        return _exit_reason(rc, err)


class WorkerPool:
    """`n` warm workers driven by `n` threads: map(jobs) runs (target, payload) jobs in parallel, each in
    whichever worker is free. envs[i] is worker i's environment (e.g. CUDA_VISIBLE_DEVICES)."""

    def __init__(self, n: int, envs: list[dict[str, str] | None] | None = None, name: str = "pool"):
        self.workers = [WarmWorker((envs or [None] * n)[i], f"{name}-{i}") for i in range(n)]
        self._free: "queue.Queue[WarmWorker]" = queue.Queue()
        for w in self.workers:
            self._free.put(w)

    def run(self, target: str, payload: dict[str, Any], timeout: float, **kw) -> Outcome:
        w = self._free.get()
        try:
            return w.run(target, payload, timeout, **kw)
        finally:
            self._free.put(w)

    def submit_all(self, jobs, timeout: float, on_done: Callable[[Any, Outcome], None] | None = None):
        """Run [(key, target, payload)] in parallel; call on_done(key, outcome) as each ends (from the
        pool's threads). Returns a list of futures."""
        from concurrent.futures import ThreadPoolExecutor
        ex = ThreadPoolExecutor(max_workers=len(self.workers))

        def one(job):
            key, target, payload = job
            try:
                o = self.run(target, payload, timeout)
            except Exception as e:  # noqa: BLE001 - on_done must be called for every job
                o = Outcome("error", reason=f"error: {type(e).__name__}: {e}"[:500])
            if on_done is not None:
                on_done(key, o)
            return key, o

        futs = [ex.submit(one, j) for j in jobs]
        ex.shutdown(wait=False)
        return futs

    def close(self) -> None:
        for w in self.workers:
            w.close()

    @property
    def starts(self) -> int:
        return sum(w.starts for w in self.workers)

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
