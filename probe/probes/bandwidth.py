"""Bandwidth: streaming read (and copy) GB/s vs the number of SMs used, one CTA per SM (8 warps, 64 KiB
in flight each) over a buffer many times the L2; sms_to_saturate_hbm = fewest SMs reaching 95% of the
best read bandwidth.

Table `bandwidth` [sms:int, kind:str, GBps:float] (kind "read": bytes read; "copy": read + written).
"""
from __future__ import annotations

import pandas as pd
import triton
import triton.language as tl

from kog.probe.probes.common import ProbeContext, cuda_time_ms

NAME = "bandwidth"
TABLES = ("bandwidth",)
BLOCK = 16384


@triton.jit
def read_kernel(x_ptr, out_ptr, n_chunks, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    g = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for c in range(pid, n_chunks, g):
        acc += tl.load(x_ptr + c * BLOCK + offs)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def copy_kernel(x_ptr, y_ptr, n_chunks, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    g = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    for c in range(pid, n_chunks, g):
        tl.store(y_ptr + c * BLOCK + offs, tl.load(x_ptr + c * BLOCK + offs))


def saturation_sms(df: pd.DataFrame, kind: str = "read", frac: float = 0.95) -> int | None:
    d = df[df["kind"] == kind].sort_values("sms")
    if d.empty:
        return None
    best = d["GBps"].max()
    return int(d[d["GBps"] >= frac * best]["sms"].iloc[0])


def sm_counts(sms: int, quick: bool) -> list[int]:
    base = [1, 4, 16, 32, 64, 96] if quick else [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96,
                                                  104, 112, 120, 128]
    return sorted({s for s in base if s < sms} | {sms})


def read_sum(x, n_ctas: int, block: int = BLOCK, interpret_warps: int = 8):
    """Launch the read kernel (host helper, also for the interpreter tests); returns per-CTA sums."""
    import torch
    out = torch.zeros(n_ctas, dtype=torch.float32, device=x.device)
    read_kernel[(n_ctas,)](x, out, x.numel() // block, BLOCK=block, num_warps=interpret_warps)
    return out


def measure(ctx: ProbeContext) -> dict[str, pd.DataFrame]:
    import torch
    if not ctx.use_asm:
        raise RuntimeError("bandwidth needs a GPU")
    dev = ctx.torch_device
    nbytes = (256 << 20) if ctx.quick else (1 << 30)
    x = torch.rand(nbytes // 4, dtype=torch.float32, device=dev)
    y = torch.empty_like(x)
    n_chunks = x.numel() // BLOCK
    out = torch.zeros(2 * ctx.sms, dtype=torch.float32, device=dev)
    reps = 3 if ctx.quick else 5
    rows = []
    for n in sm_counts(ctx.sms, ctx.quick):
        ms = cuda_time_ms(lambda: read_kernel[(n,)](x, out, n_chunks, BLOCK=BLOCK, num_warps=8), reps, 1)
        rows.append({"sms": n, "kind": "read", "GBps": nbytes / ms / 1e6})
        ms = cuda_time_ms(lambda: copy_kernel[(n,)](x, y, n_chunks, BLOCK=BLOCK, num_warps=8), reps, 1)
        rows.append({"sms": n, "kind": "copy", "GBps": 2 * nbytes / ms / 1e6})
        ctx.say(f"bandwidth {n} SMs: read {rows[-2]['GBps']:.0f} GB/s")
    ms = cuda_time_ms(lambda: y.copy_(x), reps, 1)
    df = pd.DataFrame(rows).astype({"sms": int, "kind": str, "GBps": float})
    ctx.extras["bandwidth"] = {"buffer_bytes": nbytes, "torch_copy_GBps": 2 * nbytes / ms / 1e6,
                               "sms_to_saturate_hbm": saturation_sms(df, "read"),
                               "max_read_GBps": float(df[df.kind == "read"]["GBps"].max()),
                               "max_copy_GBps": float(df[df.kind == "copy"]["GBps"].max())}
    del x, y
    return {"bandwidth": df}
