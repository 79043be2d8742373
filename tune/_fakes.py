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


HOLD_CAP_S = 300.0      # a held trial gives up waiting after this long (a test that forgot the file)


def slow_then_value(payload, report):
    """Sleep `sleep` seconds, and while the file `hold_while` exists (a test releases the trial by deleting
    it, so the trial's length never depends on the machine's speed), then return `value`."""
    report(0, float(payload.get("short", 1.0)))
    time.sleep(float(payload.get("sleep", 0.0)))
    hold = payload.get("hold_while")
    t0 = time.monotonic()
    while hold and os.path.exists(hold) and time.monotonic() - t0 < HOLD_CAP_S:
        time.sleep(0.02)
    return float(payload.get("value", 1.0))


def crash_if_bigwarps(payload, report):
    """Segfault for the contiguous mapping, else the simulator: a search must go on past crashing configs."""
    if payload["config"]["mapping"] == "contiguous":
        import ctypes
        ctypes.string_at(0)
    from kog.tune.objective import sim_trial
    return sim_trial(payload, report)


# ---- warm-worker fakes: what a trial can leave behind in a process that serves the next one ------------
def pid(payload, report):
    """Which process served this job, and how many jobs it served (kog.tune.worker.CACHE persists)."""
    from kog.tune.worker import CACHE
    CACHE["jobs"] = CACHE.get("jobs", 0) + 1
    report(0, 1.0)
    return {"value": float(payload.get("value", 1.0)), "pid": os.getpid(), "jobs": CACHE["jobs"]}


def cuda_error(payload, report):
    """What torch raises after an illegal address: the context is poisoned, the worker must go."""
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def config_error(payload, report):
    from kog.engine.config import ConfigError
    raise ConfigError("ctas_per_sm 4 does not fit: the kernel uses 255 registers/thread")


def monokernel_timeout(payload, report):
    """The engine's bounded spin-wait timing out: a clean exception after the kernel returned."""
    from kog.engine.monokernel import MonokernelError
    raise MonokernelError("monokernel: a wait timed out on counter 3; the kernel aborted instead of hanging")


def await_parties(payload) -> None:
    """A file barrier: wait until payload['parties'] jobs sharing payload['barrier'] (a folder) have started.
    Proves jobs run at the same time without timing them: run one after another, the first would wait
    out the bound and fail."""
    import uuid
    from pathlib import Path
    d = Path(payload["barrier"])
    d.mkdir(parents=True, exist_ok=True)
    (d / uuid.uuid4().hex).touch()
    end = time.monotonic() + float(payload.get("bound_s", 300.0))
    while sum(1 for _ in d.iterdir()) < int(payload["parties"]):
        if time.monotonic() > end:
            raise RuntimeError(f"barrier {d}: {payload['parties']} parties never met (jobs not parallel)")
        time.sleep(0.05)


def together(payload, report):
    """await_parties, then payload['value']."""
    await_parties(payload)
    return float(payload.get("value", 1.0))


def record_compile(payload, report):
    """Stands in for precompile_one: appends the config's kernel key to payload['log']."""
    import json
    from kog.engine.engine_config import EngineConfig
    from kog.tune.search import kernel_key
    keys = {json.dumps(list(kernel_key(EngineConfig.from_dict(c)))) for c in payload.get("configs") or
            [payload["config"]]}
    assert len(keys) == 1, "precompile groups one kernel per job"
    if payload.get("barrier"):
        await_parties(payload)
    with open(payload["log"], "a") as f:
        f.write(keys.pop() + "\n")
    time.sleep(float(payload.get("compile_s", 0.0)))
    return {"value": 0.0}


def sim_if_compiled(payload, report):
    """The simulator's trial, but only for a config whose kernel record_compile compiled before: a trial
    that would have compiled on the fly fails (LaunchError), so a test sees compile-ahead being skipped."""
    import json
    from kog.engine.engine_config import EngineConfig
    from kog.tune.objective import LaunchError, sim_trial
    from kog.tune.search import kernel_key
    key = list(kernel_key(EngineConfig.from_dict(payload["config"])))
    with open(payload["log"]) as f:
        done = [json.loads(ln) for ln in f if ln.strip()]
    if key not in done:
        raise LaunchError(f"kernel {key} was not compiled ahead")
    time.sleep(float(payload.get("trial_s", 0.0)))
    out = sim_trial(payload, report)
    out["pid"] = os.getpid()
    return out


HILL_TOP = dict(mode="targeted", ctas_per_sm=2, num_warps=4, block_k=512, bn_qkv=32, bn_o=8, bn_gate_up=4,
                bn_down=8, bn_lm=8, sync_rows=4096, mapping="round-robin", attn_block=64, weight_ring=3)


def two_knob_hill(payload, report):
    """tok/s 1000 at HILL_TOP (the sm_90 rule for llama-3.2-1b with block_k 512 and bn_qkv 32: four choice
    steps from it), 50 less per power of two any knob is away from it (per other choice for mode and mapping):
    a local search walks there one knob at a time, random configs land far below."""
    import math
    c = payload["config"]
    steps = sum(abs(math.log2(max(c[k], 1) / max(v, 1))) if isinstance(v, int) else float(c[k] != v)
                for k, v in HILL_TOP.items())
    v = 1000.0 - 50.0 * steps
    report(0, v)
    return {"value": v, "breakdown": {}, "max_rel_err": 0.0, "simulated": True}


def value_by_bn_qkv(payload, report):
    """payload["values"][str(bn_qkv)]: a measurement that depends on the config alone (no noise); a payload
    without the bench's protocol fields (prompt_tokens, tokens) fails."""
    assert {"prompt_tokens", "tokens"} <= set(payload), "no protocol in the payload"
    v = float(payload["values"][str(payload["config"]["bn_qkv"])])
    report(0, v)
    return v
