"""GPU x GPU: peer copy bandwidth and one-way signal latency between every ordered pair of GPUs of one host.

Bandwidth: torch peer copies (tensor.copy_ from a buffer on GPU src into one on GPU dst; over NVLink when the
pair has peer access), bytes counted read + written like the single-GPU `bandwidth` probe's copy, median of
repeats; the diagonal is a local device-to-device copy, for scale.

Latency: a flag ping-pong between two GPUs through peer-accessible memory, in Triton: one single-CTA kernel
per GPU, launched concurrently; each side polls a flag in its OWN memory and answers with a system-scope
release store into its partner's flag (a peer pointer: torch enables peer access with a warm-up copy, and
under UVA a Triton kernel on GPU a takes a torch tensor of GPU b as a plain pointer). One-way = the ping
side's %globaltimer span / (2 * iters). Every poll is bounded (SPIN_CAP); a timeout is an error, not a hang.
Fallback, when the Triton ping-pong cannot run on this host (no peer access, or Triton refuses a peer
pointer): the CUDA-event time of a 4-byte peer copy, which includes the copy engine's launch and is an
upper bound, not a signal latency; the table's `method` column says which one a row is.

Tables:
    p2p_bandwidth  [src:int, dst:int, GBps:float, peer:bool]
    p2p_latency    [src:int, dst:int, us:float, method:str]   (method: triton-flag | torch-copy-4B)

On a host with fewer than 2 GPUs, measure() returns no tables and one line in ctx.extras["p2p"]["skipped"].
Only the analysis (to_matrix, summarize) is tested on CPU (on fake matrices); the GPU part has not run yet.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1;
nothing here calls cuMulticastCreate): set at import, before any CUDA / NCCL initialisation this module does.
"""
from __future__ import annotations

import os

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(MULTICAST_OFF)      # forced, not setdefault: multicast must never be on (device README)

import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kog.probe.probes import vendor_asm as va  # noqa: E402
from kog.probe.probes.common import SPIN_CAP, ProbeContext  # noqa: E402
from kog.probe.probes.signal import _wait_geq  # noqa: E402

NAME = "p2p"
TABLES = ("p2p_bandwidth", "p2p_latency")
TABLE_COLUMNS = {"p2p_bandwidth": {"src": "int", "dst": "int", "GBps": "float", "peer": "bool"},
                 "p2p_latency": {"src": "int", "dst": "int", "us": "float", "method": "str"}}
PAD = 32   # int32 per flag: one 128-byte line


# ---- kernels ------------------------------------------------------------------------------------------------
@triton.jit
def pingpong_kernel(my_flag_ptr, peer_flag_ptr, out_ptr, iters, cap, PING: tl.constexpr, USE_ASM: tl.constexpr):
    """PING side: send 2i+1, wait for 2i+2. PONG side: wait for 2i+1, send 2i+2. out = [ns span, last seen,
    failed step + 1 (0 = ok)]."""
    t0 = va.nanoseconds(USE_ASM)
    fail = iters * 0
    for i in range(iters):
        if fail == 0:
            if PING:
                tl.atomic_xchg(peer_flag_ptr, 2 * i + 1, sem="release", scope="sys")
                v = _wait_geq(my_flag_ptr, 2 * i + 2, cap, 1, "acquire", "sys")
                fail = tl.where(v < 2 * i + 2, i + 1, 0)
            else:
                v = _wait_geq(my_flag_ptr, 2 * i + 1, cap, 1, "acquire", "sys")
                fail = tl.where(v < 2 * i + 1, i + 1, 0)
                tl.atomic_xchg(peer_flag_ptr, 2 * i + 2, sem="release", scope="sys")
    t1 = va.nanoseconds(USE_ASM)
    tl.store(out_ptr + 0, t1 - t0)
    tl.store(out_ptr + 1, tl.atomic_add(my_flag_ptr, 0, sem="relaxed", scope="sys").to(tl.int64))
    tl.store(out_ptr + 2, fail.to(tl.int64))


# ---- analysis (pure; tested on CPU) ----------------------------------------------------------------------
def ordered_pairs(n: int, diagonal: bool = False) -> list[tuple[int, int]]:
    return [(a, b) for a in range(n) for b in range(n) if diagonal or a != b]


def to_matrix(df: pd.DataFrame, value: str, n: int | None = None) -> np.ndarray:
    """Long table [src, dst, value] -> n x n matrix (NaN where a pair was not measured)."""
    n = int(max(df["src"].max(), df["dst"].max()) + 1) if n is None else n
    m = np.full((n, n), np.nan)
    m[df["src"].to_numpy(int), df["dst"].to_numpy(int)] = df[value].to_numpy(float)
    return m


def _off_diagonal(m: np.ndarray) -> np.ndarray:
    return m[~np.eye(len(m), dtype=bool)]


def summarize(bw: pd.DataFrame, lat: pd.DataFrame | None = None, slow_frac: float = 0.8) -> dict:
    """Facts for the summary and the TP planner: per-pair spread, asymmetry, the slow pairs.

    uniform: every off-diagonal pair within slow_frac of the median (one NVSwitch fabric: any TP rank order is
    as good as any other); slow_pairs: (src, dst) under slow_frac * median bandwidth or over median / slow_frac
    latency (a topology the rank mapping should route around)."""
    m = to_matrix(bw, "GBps")
    n = len(m)
    off = _off_diagonal(m)
    off = off[~np.isnan(off)]
    out: dict = {"gpus": n}
    if len(off):
        med = float(np.median(off))
        asym = np.abs(m - m.T)[~np.eye(n, dtype=bool)] / med
        slow = [(int(a), int(b)) for a, b in ordered_pairs(n) if m[a, b] < slow_frac * med]
        out.update(p2p_GBps_median=med, p2p_GBps_min=float(off.min()), p2p_GBps_max=float(off.max()),
                   p2p_asymmetry=float(np.nanmax(asym)), local_GBps_median=float(np.nanmedian(np.diag(m))),
                   slow_bandwidth_pairs=slow)
    if lat is not None and len(lat):
        lm = to_matrix(lat, "us", n)
        lo = _off_diagonal(lm)
        lo = lo[~np.isnan(lo)]
        if len(lo):
            med = float(np.median(lo))
            out.update(oneway_us_median=med, oneway_us_max=float(lo.max()),
                       latency_method=sorted(set(lat["method"])),
                       slow_latency_pairs=[(int(a), int(b)) for a, b in ordered_pairs(n) if lm[a, b] > med / slow_frac])
    out["uniform"] = not out.get("slow_bandwidth_pairs") and not out.get("slow_latency_pairs")
    return out


def skip_reason(n_gpus: int) -> str | None:
    if n_gpus < 2:
        return f"p2p: skipped, needs >= 2 GPUs and this host has {n_gpus}"
    return None


# ---- measurement (GPU; not run yet) -----------------------------------------------------------------------
def _copy_GBps(torch, src: int, dst: int, nbytes: int, reps: int) -> float:
    a = torch.empty(nbytes // 4, dtype=torch.float32, device=f"cuda:{src}").uniform_()
    b = torch.empty_like(a, device=f"cuda:{dst}")
    ts = []
    for i in range(reps + 2):
        torch.cuda.synchronize(src)
        torch.cuda.synchronize(dst)
        t0 = time.perf_counter()
        b.copy_(a, non_blocking=True)
        torch.cuda.synchronize(src)
        torch.cuda.synchronize(dst)
        if i >= 2:               # two warm-ups (peer-access enabling, first-touch)
            ts.append(time.perf_counter() - t0)
    return 2 * nbytes / statistics.median(ts) / 1e9


def _pingpong_us(torch, a: int, b: int, iters: int) -> float:
    """One-way us of a Triton flag ping-pong between GPUs a (ping) and b (pong); raises if it cannot run."""
    fa = torch.zeros(PAD, dtype=torch.int32, device=f"cuda:{a}")
    fb = torch.zeros(PAD, dtype=torch.int32, device=f"cuda:{b}")
    oa = torch.zeros(3, dtype=torch.int64, device=f"cuda:{a}")
    ob = torch.zeros(3, dtype=torch.int64, device=f"cuda:{b}")
    fa[:1].copy_(fb[:1])         # warm-up peer copies: torch enables peer access both ways
    fb[:1].copy_(fa[:1])
    with torch.cuda.device(b):   # pong first, so it is polling when the first ping lands
        pingpong_kernel[(1,)](fb, fa, ob, iters, SPIN_CAP, PING=False, USE_ASM=True, num_warps=1)
    with torch.cuda.device(a):
        pingpong_kernel[(1,)](fa, fb, oa, iters, SPIN_CAP, PING=True, USE_ASM=True, num_warps=1)
    torch.cuda.synchronize(a)
    torch.cuda.synchronize(b)
    ra, rb = oa.tolist(), ob.tolist()
    if ra[2] or rb[2]:
        raise RuntimeError(f"p2p ping-pong {a}<->{b} timed out at step {max(ra[2], rb[2])}")
    return ra[0] / (2 * iters) / 1e3


def _small_copy_us(torch, a: int, b: int, reps: int) -> float:
    x = torch.ones(1, dtype=torch.int32, device=f"cuda:{a}")
    y = torch.zeros(1, dtype=torch.int32, device=f"cuda:{b}")
    ts = []
    with torch.cuda.device(a):
        for i in range(reps + 2):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            y.copy_(x, non_blocking=True)
            e.record()
            e.synchronize()
            if i >= 2:
                ts.append(s.elapsed_time(e) * 1e3)
    return statistics.median(ts)


def measure(ctx: ProbeContext, nbytes: int | None = None) -> dict[str, pd.DataFrame]:
    import torch
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    why = skip_reason(n)
    if why:
        ctx.extras["p2p"] = {"skipped": why, "gpus": n}
        ctx.say(why)
        return {}
    nbytes = nbytes or ((64 if ctx.quick else 256) << 20)
    reps = 3 if ctx.quick else 7
    iters = 200 if ctx.quick else 1000
    bw_rows, lat_rows = [], []
    for a, b in ordered_pairs(n, diagonal=True):
        ctx.say(f"copy {a}->{b}")
        peer = a == b or bool(torch.cuda.can_device_access_peer(a, b))
        bw_rows.append({"src": a, "dst": b, "GBps": _copy_GBps(torch, a, b, nbytes, reps), "peer": peer})
    fallback_why = None
    for a, b in ordered_pairs(n):
        ctx.say(f"signal {a}->{b}")
        us, method = None, "triton-flag"
        if torch.cuda.can_device_access_peer(a, b) and torch.cuda.can_device_access_peer(b, a):
            try:
                us = _pingpong_us(torch, a, b, iters)
            except Exception as e:   # noqa: BLE001 -- recorded; the fallback still gives an upper bound
                fallback_why = f"{type(e).__name__}: {e}"[:300]
        else:
            fallback_why = f"no peer access between GPU {a} and GPU {b}"
        if us is None:
            us, method = _small_copy_us(torch, a, b, reps), "torch-copy-4B"
        lat_rows.append({"src": a, "dst": b, "us": us, "method": method})
    bw = pd.DataFrame(bw_rows, columns=list(TABLE_COLUMNS["p2p_bandwidth"])).astype(TABLE_COLUMNS["p2p_bandwidth"])
    lat = pd.DataFrame(lat_rows, columns=list(TABLE_COLUMNS["p2p_latency"])).astype(TABLE_COLUMNS["p2p_latency"])
    ctx.extras["p2p"] = {**summarize(bw, lat), "bytes": nbytes, "reps": reps, "iters": iters,
                         "fallback_reason": fallback_why, "env": dict(MULTICAST_OFF)}
    return {"p2p_bandwidth": bw, "p2p_latency": lat}
