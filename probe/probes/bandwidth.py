"""Bandwidth: streaming read (and copy) GB/s vs the number of SMs used, against a device-to-device copy
(torch's) measured in the same run.

To reach the copy's peak a streaming read needs enough bytes in flight per SM: every SM runs CTAS_PER_SM
CTAs (8 warps each), each keeping UNROLL independent BLOCK-element loads in flight (16-byte vector loads:
contiguous, aligned fp32). "n SMs" means n physical SMs: the grid covers the whole GPU and a CTA whose
%smid is n or above exits at once; the others take chunks from an atomic work counter, so the chunks are
shared by whichever CTAs run, and every chunk is read exactly once (the per-CTA sums add up to the
buffer's: the host checks it). sms_to_saturate_hbm = fewest SMs whose read reaches 95% of the reference
peak: the torch copy of the same run (bytes read + written) when measured, else the best read.

Table `bandwidth` [sms:int, kind:str, GBps:float] (kind "read": bytes read; "copy": read + written).
"""
from __future__ import annotations

import pandas as pd
import triton
import triton.language as tl

from kog.probe.probes import vendor_asm as va
from kog.probe.probes.common import ProbeContext, cuda_time_ms

NAME = "bandwidth"
TABLES = ("bandwidth",)
BLOCK = 4096          # fp32 elements per load: 16 per thread of 8 warps, four 16-byte vectors
UNROLL = 4            # independent loads in flight per CTA (64 KiB)
CTAS_PER_SM = 4       # 256 KiB in flight per SM
SATURATE = 0.95


@triton.jit
def read_kernel(x_ptr, out_ptr, counter_ptr, n_chunks, n_sms, USE_ASM: tl.constexpr, BLOCK: tl.constexpr,
                UNROLL: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    if va.sm_id(USE_ASM, False) < n_sms:
        c = tl.atomic_add(counter_ptr, UNROLL)
        while c < n_chunks:
            for u in tl.static_range(UNROLL):
                # a whole chunk or none: a scalar mask keeps the loads 16-byte vectors
                offs = (c + u).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
                acc += tl.load(x_ptr + offs, mask=c + u < n_chunks, other=0.0, cache_modifier=".cg")
            c = tl.atomic_add(counter_ptr, UNROLL)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def copy_kernel(x_ptr, y_ptr, counter_ptr, n_chunks, n_sms, USE_ASM: tl.constexpr, BLOCK: tl.constexpr,
                UNROLL: tl.constexpr):
    if va.sm_id(USE_ASM, False) < n_sms:
        c = tl.atomic_add(counter_ptr, UNROLL)
        while c < n_chunks:
            for u in tl.static_range(UNROLL):
                offs = (c + u).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
                m = c + u < n_chunks
                tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m, cache_modifier=".cg"), mask=m,
                         cache_modifier=".cs")
            c = tl.atomic_add(counter_ptr, UNROLL)


# ---- analysis (pure) -------------------------------------------------------------------------------
def saturation_sms(df: pd.DataFrame, kind: str = "read", frac: float = SATURATE,
                   peak: float | None = None) -> int | None:
    """Fewest SMs whose `kind` bandwidth reaches frac x `peak` (default: the best of that kind); None when
    none does (the probe does not reach the reference peak)."""
    d = df[df["kind"] == kind].sort_values("sms")
    if d.empty:
        return None
    ref = d["GBps"].max() if peak is None else peak
    hit = d[d["GBps"] >= frac * ref]
    return int(hit["sms"].iloc[0]) if len(hit) else None


def peak_summary(df: pd.DataFrame, torch_copy_GBps: float | None) -> dict:
    """The probe's peaks against the same run's torch copy, and SMs to saturate HBM against the reference
    peak (the torch copy when measured, else the best read)."""
    read = float(df[df["kind"] == "read"]["GBps"].max()) if (df["kind"] == "read").any() else None
    copy = float(df[df["kind"] == "copy"]["GBps"].max()) if (df["kind"] == "copy").any() else None
    ref = torch_copy_GBps if torch_copy_GBps else read
    return {"read_peak_GBps": read, "copy_peak_GBps": copy, "torch_copy_GBps": torch_copy_GBps,
            "reference_peak_GBps": ref,
            "reference": "torch device-to-device copy, same run" if torch_copy_GBps else "best read of the probe",
            "read_over_torch_copy": read / torch_copy_GBps if read and torch_copy_GBps else None,
            "copy_over_torch_copy": copy / torch_copy_GBps if copy and torch_copy_GBps else None,
            "sms_to_saturate_hbm": saturation_sms(df, "read", SATURATE, ref)}


def sm_counts(sms: int, quick: bool) -> list[int]:
    base = [1, 4, 16, 32, 64, 96] if quick else [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96,
                                                  104, 112, 120, 128]
    return sorted({s for s in base if s < sms} | {sms})


def launch_read(x, out, counter, n_sms: int, grid: int, use_asm: bool, block: int = BLOCK, unroll: int = UNROLL,
                warps: int = 8):
    """One read pass over x (counter zeroed first): per-CTA partial sums in out[:grid]."""
    counter.zero_()
    read_kernel[(grid,)](x, out, counter, x.numel() // block, n_sms, USE_ASM=use_asm, BLOCK=block, UNROLL=unroll,
                         num_warps=warps)


def launch_copy(x, y, counter, n_sms: int, grid: int, use_asm: bool, block: int = BLOCK, unroll: int = UNROLL,
                warps: int = 8):
    counter.zero_()
    copy_kernel[(grid,)](x, y, counter, x.numel() // block, n_sms, USE_ASM=use_asm, BLOCK=block, UNROLL=unroll,
                         num_warps=warps)


def read_sum(x, n_ctas: int, block: int = BLOCK, interpret_warps: int = 8):
    """Every chunk of x read once by n_ctas CTAs (all counted as used SMs); returns the per-CTA sums
    (host helper, also for the interpreter tests: they must add up to x.sum())."""
    import torch
    out = torch.zeros(n_ctas, dtype=torch.float32, device=x.device)
    counter = torch.zeros(1, dtype=torch.int32, device=x.device)
    launch_read(x, out, counter, n_ctas, n_ctas, False, block, UNROLL, interpret_warps)
    return out


def measure(ctx: ProbeContext) -> dict[str, pd.DataFrame]:
    import torch
    if not ctx.use_asm or ctx.amd:
        raise RuntimeError("bandwidth needs an NVIDIA GPU (%smid picks the SMs used)")
    dev = ctx.torch_device
    nbytes = (256 << 20) if ctx.quick else (1 << 30)
    x = torch.rand(nbytes // 4, dtype=torch.float32, device=dev)
    y = torch.empty_like(x)
    grid = CTAS_PER_SM * ctx.sms
    out = torch.zeros(grid, dtype=torch.float32, device=dev)
    counter = torch.zeros(1, dtype=torch.int32, device=dev)
    reps = 3 if ctx.quick else 5
    expect = float(x.sum())
    rows = []
    for n in sm_counts(ctx.sms, ctx.quick):
        ms = cuda_time_ms(lambda: launch_read(x, out, counter, n, grid, True), reps, 1)
        got = float(out.sum())
        if abs(got - expect) > 1e-3 * abs(expect):   # a chunk read twice or not at all: the figure is wrong
            raise RuntimeError(f"bandwidth read with {n} SMs summed {got:.6g}, the buffer holds {expect:.6g}")
        rows.append({"sms": n, "kind": "read", "GBps": nbytes / ms / 1e6})
        ms = cuda_time_ms(lambda: launch_copy(x, y, counter, n, grid, True), reps, 1)
        rows.append({"sms": n, "kind": "copy", "GBps": 2 * nbytes / ms / 1e6})
        ctx.say(f"bandwidth {n} SMs: read {rows[-2]['GBps']:.0f} GB/s")
    ms = cuda_time_ms(lambda: y.copy_(x), reps, 1)
    df = pd.DataFrame(rows).astype({"sms": int, "kind": str, "GBps": float})
    torch_copy = 2 * nbytes / ms / 1e6
    ps = peak_summary(df, torch_copy)
    ctx.extras["bandwidth"] = {"buffer_bytes": nbytes, "ctas_per_sm": CTAS_PER_SM, "block": BLOCK, "unroll": UNROLL,
                               "bytes_in_flight_per_sm": CTAS_PER_SM * UNROLL * BLOCK * 4,
                               "torch_copy_GBps": torch_copy, "sms_to_saturate_hbm": ps["sms_to_saturate_hbm"],
                               "max_read_GBps": ps["read_peak_GBps"], "max_copy_GBps": ps["copy_peak_GBps"]}
    del x, y
    return {"bandwidth": df}
