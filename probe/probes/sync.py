"""Sync costs: atomic grid barrier vs CTAs and warps, flag wait latency, contended atomic throughput,
kernel launch cost: on the host (a Triton launch from Python: "plain", and "plain_sync" with the wait) and
on the GPU (CUDA-event timed empty launches queued behind a sleep: "gpu_queued"; CUDA graph replay: "graph").

Every spin is bounded (SPIN_CAP polls); a barrier that times out writes an error record and the host
raises ProbeTimeout naming it. Grids never exceed co-residency: at most 2 CTAs of <= 4 warps per SM, and
the spinning kernels are launched cooperatively (the launch fails instead of deadlocking).

Tables `barrier` [ctas:int, warps:int, us:float], `flag` [kind:str, us:float],
`atomics` [ctas:int, mops_per_s:float], `launch` [mode:str, us:float] (plain, plain_sync, graph, gpu_queued).
"""
from __future__ import annotations

import time

import pandas as pd
import triton
import triton.language as tl

from kog.probe.probes.common import SPIN_CAP, ProbeContext, check_errors, cuda_time_ms
from kog.probe.probes.signal import _wait_geq

NAME = "sync"
TABLES = ("barrier", "flag", "atomics", "launch")


@triton.jit
def barrier_kernel(counter_ptr, err_ptr, n_iters, cap, NPROG: tl.constexpr):
    pid = tl.program_id(0)
    ok = pid * 0 + 1
    for i in range(n_iters):
        tl.atomic_add(counter_ptr, ok, sem="release", scope="gpu")
        target = (i + 1) * NPROG
        v = _wait_geq(counter_ptr, target, cap, ok, "acquire", "gpu")
        fail = (v < target) & (ok == 1)
        tl.store(err_ptr + pid * 4 + 0, 1, mask=fail)
        tl.store(err_ptr + pid * 4 + 1, i, mask=fail)
        tl.store(err_ptr + pid * 4 + 2, v, mask=fail)
        tl.store(err_ptr + pid * 4 + 3, target, mask=fail)
        ok = tl.where(fail, 0, ok)


@triton.jit
def pingpong_kernel(flag_ptr, err_ptr, n_iters, cap):
    pid = tl.program_id(0)
    ok = pid * 0 + 1
    for i in range(n_iters):
        if pid == 0:
            w = _wait_geq(flag_ptr, 2 * i, cap, ok, "acquire", "gpu")
            bad = w < 2 * i
            tl.atomic_xchg(flag_ptr, 2 * i + 1, sem="release", scope="gpu")
        else:
            w = _wait_geq(flag_ptr, 2 * i + 1, cap, ok, "acquire", "gpu")
            bad = w < 2 * i + 1
            tl.atomic_xchg(flag_ptr, 2 * i + 2, sem="release", scope="gpu")
        tl.store(err_ptr + pid * 4 + 0, 2, mask=bad & (ok == 1))
        tl.store(err_ptr + pid * 4 + 1, i, mask=bad & (ok == 1))
        tl.store(err_ptr + pid * 4 + 2, w, mask=bad & (ok == 1))
        ok = tl.where(bad, 0, ok)


@triton.jit
def poll_kernel(flag_ptr, polls):
    # waits for a value that never comes, `polls` times: the cost of one acquire poll of a set flag
    pid = tl.program_id(0)
    ok = pid * 0 + 1
    v = _wait_geq(flag_ptr, 1 << 30, polls, ok, "acquire", "gpu")
    tl.store(flag_ptr + 32, v)


@triton.jit
def atomic_kernel(counter_ptr, n):
    for _ in range(n):
        tl.atomic_add(counter_ptr, 1, sem="relaxed", scope="gpu")


@triton.jit
def noop_kernel(x_ptr):
    pass


def _per_iter_us(run, n1: int, n2: int, reps: int) -> float:
    """(time of n2 iterations - time of n1) / (n2 - n1): launch cost cancels."""
    t1 = cuda_time_ms(lambda: run(n1), reps, 1)
    t2 = cuda_time_ms(lambda: run(n2), reps, 1)
    return (t2 - t1) * 1e3 / (n2 - n1)


def gpu_launch_us(launch, n: int, sleep_cycles: int = 50_000_000) -> float:
    """The GPU's own launch latency: `n` empty launches queued behind a sleeping kernel (so the host has
    enqueued them all before the GPU reaches them) and timed by CUDA events from the end of the sleep to
    the end of the last one; per launch, in us. The host's launch cost (a Triton launch from Python, ~15 us)
    is hidden behind the sleep: this is what the GPU spends per kernel, back to back."""
    import torch
    for _ in range(3):
        launch()
    torch.cuda.synchronize()
    e1, e2 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(sleep_cycles)
    e1.record()
    for _ in range(n):
        launch()
    e2.record()
    torch.cuda.synchronize()
    return e1.elapsed_time(e2) * 1e3 / n


def measure(ctx: ProbeContext) -> dict[str, pd.DataFrame]:
    import torch
    if not ctx.use_asm:
        raise RuntimeError("sync probes spin across programs: they cannot run in the CPU interpreter")
    dev = ctx.torch_device
    nsm = ctx.sms
    q = ctx.quick
    n1, n2, reps = (20, 220, 3) if q else (50, 550, 5)

    # --- barrier vs CTAs and warps
    ctas_list = [1, 8, nsm] if q else sorted({1, 2, 4, 8, 16, 32, 64, nsm // 2, nsm, 2 * nsm})
    rows = []
    for warps in (1, 4):
        for ctas in ctas_list:
            counter = torch.zeros(1, dtype=torch.int32, device=dev)
            err = torch.zeros(ctas * 4, dtype=torch.int32, device=dev)

            def run(iters, ctas=ctas, warps=warps, counter=counter, err=err):
                counter.zero_()
                barrier_kernel[(ctas,)](counter, err, iters, SPIN_CAP, NPROG=ctas, num_warps=warps,
                                        launch_cooperative_grid=True)
            run(5)
            torch.cuda.synchronize()
            us = _per_iter_us(run, n1, n2, reps)
            check_errors(err, f"barrier ({ctas} CTAs, {warps} warps)")
            rows.append({"ctas": ctas, "warps": warps, "us": us})
    barrier = pd.DataFrame(rows).astype({"ctas": int, "warps": int, "us": float})

    # --- flag: ping-pong one-way (two CTAs where the scheduler puts them) and one poll
    flag = torch.zeros(64, dtype=torch.int32, device=dev)
    err = torch.zeros(8, dtype=torch.int32, device=dev)

    def pp(iters):
        flag.zero_()
        pingpong_kernel[(2,)](flag, err, iters, SPIN_CAP, num_warps=1, launch_cooperative_grid=True)
    pp(5)
    torch.cuda.synchronize()
    oneway = _per_iter_us(pp, n1, 4 * n2, reps) / 2
    check_errors(err, "flag ping-pong")
    pf = torch.zeros(64, dtype=torch.int32, device=dev)
    poll = _per_iter_us(lambda n: poll_kernel[(1,)](pf, n, num_warps=1), 100, 100 + 20 * (n2 - n1), reps)
    flags = pd.DataFrame([{"kind": "pingpong_oneway", "us": oneway}, {"kind": "poll_acquire", "us": poll}])

    # --- contended atomics on one counter
    arows = []
    per = 500 if q else 2000
    for ctas in ([1, 8, nsm] if q else sorted({1, 2, 4, 8, 16, 32, 64, nsm, 2 * nsm})):
        c = torch.zeros(1, dtype=torch.int32, device=dev)

        def ar(c=c, ctas=ctas):
            atomic_kernel[(ctas,)](c, per, num_warps=1)
        ms = cuda_time_ms(ar, reps, 1)
        ops = int(c.item()) / (reps + 1)       # the counter says how many adds really happened
        arows.append({"ctas": ctas, "mops_per_s": ops / (ms * 1e-3) / 1e6})
    atomics = pd.DataFrame(arows).astype({"ctas": int, "mops_per_s": float})

    # --- launch overhead
    x = torch.zeros(1, device=dev)
    n = 200 if q else 1000
    for _ in range(20):
        noop_kernel[(1,)](x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        noop_kernel[(1,)](x)
    torch.cuda.synchronize()
    plain = (time.perf_counter() - t0) / n * 1e6
    lat = []
    for _ in range(50):
        t0 = time.perf_counter()
        noop_kernel[(1,)](x)
        torch.cuda.synchronize()
        lat.append((time.perf_counter() - t0) * 1e6)
    lat.sort()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    k = 100
    with torch.cuda.stream(s):
        noop_kernel[(1,)](x)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for _ in range(k):
            noop_kernel[(1,)](x)
    graph_ms = cuda_time_ms(g.replay, reps=10, warm=2)
    gpu = gpu_launch_us(lambda: noop_kernel[(1,)](x), 100 if q else 400)
    launch = pd.DataFrame([{"mode": "plain", "us": plain}, {"mode": "plain_sync", "us": lat[len(lat) // 2]},
                           {"mode": "graph", "us": graph_ms * 1e3 / k}, {"mode": "gpu_queued", "us": gpu}])
    ctx.extras["sync"] = {"barrier_iters": [n1, n2], "atomic_adds_per_cta": per, "graph_kernels": k}
    return {"barrier": barrier, "flag": flags, "atomics": atomics,
            "launch": launch.astype({"mode": str, "us": float})}
