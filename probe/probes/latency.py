"""Latency ladder: a dependent-load pointer chase over a random cyclic permutation of 128-byte lines,
working sets from 16 KiB to far beyond L2, timed inside the kernel in cycles (%clock64) and ns
(%globaltimer). Plateaus are found automatically and named l1 / l2_near / l2_far / hbm.

Table `latency` [bytes:int, ns:float, cycles:float, level:str] (level "transition" between plateaus).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import triton
import triton.language as tl

from kog.probe.probes import vendor_asm as va
from kog.probe.probes.common import ProbeContext

NAME = "latency"
TABLES = ("latency",)
LINE = 128


@triton.jit
def chase_kernel(buf_ptr, out_ptr, start, warm_steps, steps, USE_ASM: tl.constexpr, AMD: tl.constexpr,
                 CG: tl.constexpr):
    idx = start + tl.program_id(0) * 0
    for _ in range(warm_steps):
        idx = tl.load(buf_ptr + idx)
    c0 = va.cycles(USE_ASM, AMD)
    t0 = va.nanoseconds(USE_ASM, AMD)
    for _ in range(steps):
        if CG:
            idx = tl.load(buf_ptr + idx, cache_modifier=".cg")
        else:
            idx = tl.load(buf_ptr + idx)
    c1 = va.cycles(USE_ASM, AMD)
    t1 = va.nanoseconds(USE_ASM, AMD)
    tl.store(out_ptr + 0, c1 - c0)
    tl.store(out_ptr + 1, t1 - t0)
    tl.store(out_ptr + 2, idx.to(tl.int64))   # keeps the chase alive, and lets the host check it


def build_chain(n_lines: int, device: str, seed: int = 0):
    """int32 buffer of n_lines 128-B lines whose first words form one random cycle over all lines.
    Returns (buf, start element index, the permutation)."""
    import torch
    g = torch.Generator(device="cpu").manual_seed(seed)
    perm = torch.randperm(n_lines, generator=g).to(device)
    per = LINE // 4
    buf = torch.zeros(n_lines * per, dtype=torch.int32, device=device)
    buf[perm * per] = (torch.roll(perm, -1) * per).to(torch.int32)
    return buf, int(perm[0]) * per, perm


def ladder_sizes(quick: bool, max_bytes: int) -> list[int]:
    step = 1.0 if quick else 0.5
    out, k = [], 0.0
    while True:
        b = int(16 * 1024 * 2 ** k) // LINE * LINE
        if b > max_bytes:
            break
        out.append(b)
        k += step
    return out


# ---- analysis (pure) -------------------------------------------------------------------------------
def find_plateaus(sizes, ns, tol: float = 0.15, min_points: int = 2) -> list[dict]:
    """Split a latency-vs-size curve into flat runs. A point starts a new run when its latency differs
    from the running median of the current run by more than `tol` (relative). Runs of at least
    `min_points` points are plateaus: {first, last (bytes), ns (median), idx (row positions)}."""
    order = np.argsort(np.asarray(sizes))
    s = np.asarray(sizes, dtype=float)[order]
    y = np.log(np.asarray(ns, dtype=float)[order])
    runs, cur = [], [0]
    for i in range(1, len(s)):
        if abs(y[i] - np.median(y[cur])) > math.log1p(tol):
            runs.append(cur)
            cur = [i]
        else:
            cur.append(i)
    runs.append(cur)
    out = []
    for r in runs:
        if len(r) >= min_points:
            out.append({"first": int(s[r[0]]), "last": int(s[r[-1]]), "ns": float(np.exp(np.median(y[r]))),
                        "idx": [int(order[i]) for i in r]})
    return out


def label_plateaus(plateaus: list[dict], l2_bytes: int | None) -> dict[str, dict]:
    """Name the plateaus: the first (ending below 1 MiB) is l1; the last is hbm when it reaches at least
    twice L2's size (it may start below L2's size: one SM's chase sees less than the whole L2); the
    ones between are L2: the first l2_near, the last l2_far (the same when there is one)."""
    ps = sorted(plateaus, key=lambda p: p["first"])
    names: dict[str, dict] = {}
    if ps and ps[0]["last"] <= (1 << 20):
        names["l1"] = ps.pop(0)
    l2 = l2_bytes or 50 << 20
    if ps and ps[-1]["last"] >= 2 * l2 and ps[-1]["first"] > (1 << 20):
        names["hbm"] = ps.pop()
    if ps:
        names["l2_near"], names["l2_far"] = ps[0], ps[-1]
    return names


def level_column(n: int, names: dict[str, dict]) -> list[str]:
    lv = ["transition"] * n
    for name, p in names.items():
        for i in p["idx"]:
            if lv[i] == "transition":
                lv[i] = name
    return lv


def analyse(df: pd.DataFrame, l2_bytes: int | None) -> tuple[pd.DataFrame, dict[str, float]]:
    """Add the `level` column; return (table, {level: ns})."""
    df = df.sort_values("bytes").reset_index(drop=True)
    names = label_plateaus(find_plateaus(df["bytes"], df["ns"]), l2_bytes)
    df["level"] = level_column(len(df), names)
    return df, {k: round(v["ns"], 2) for k, v in names.items()}


# ---- measurement -----------------------------------------------------------------------------------
def measure(ctx: ProbeContext) -> dict[str, pd.DataFrame]:
    import torch
    dev = ctx.torch_device
    l2 = ctx.l2_bytes or (50 << 20)
    max_bytes = 64 << 10 if not ctx.use_asm else max(8 * l2, 256 << 20)
    if ctx.amd and ctx.use_asm:
        # MI300X: a 256 MiB Infinity Cache sits between the (per-XCD) L2 and HBM; the ladder has to pass
        # it to reach HBM (unverified on hardware)
        max_bytes = max(max_bytes, 4 * (ctx.llc_bytes or 256 << 20))
    sizes = ladder_sizes(ctx.quick, max_bytes)
    steps = 2048 if ctx.quick else 4096
    reps = 1 if ctx.quick else 2
    rows = []
    out = torch.zeros(4, dtype=torch.int64, device=dev)
    for b in sizes:
        n_lines = b // LINE
        buf, start, perm = build_chain(n_lines, dev, seed=n_lines)
        if ctx.use_asm:
            buf.sum()  # one streaming pass: L2-sized sets start L2-resident
        warm = min(n_lines, steps) if b <= (4 << 20) else 64
        got = []
        for rep in range(reps):
            # each repeat walks a fresh stretch of the cycle: re-walking the same lines would find
            # them in L2 and hide the memory latency
            s0 = start if rep == 0 else int(perm[(rep * (warm + steps + 1)) % n_lines]) * (LINE // 4)
            chase_kernel[(1,)](buf, out, s0, warm, steps, USE_ASM=ctx.use_asm, AMD=ctx.amd, CG=False,
                               num_warps=1)
            c, t, _idx, _ = out.tolist()
            got.append((c, t))
        c, t = sorted(got, key=lambda x: x[1])[len(got) // 2]
        rows.append({"bytes": b, "ns": t / steps, "cycles": c / steps})
        del buf
        ctx.say(f"latency {b >> 10} KiB: {t / steps:.0f} ns")
    df = pd.DataFrame(rows)
    df, levels = analyse(df, ctx.l2_bytes)
    hbm = df[df["level"] == "hbm"]
    ctx.extras["latency"] = {"levels_ns": levels, "steps": steps, "reps": reps,
                             # where one SM's random chase stops hitting in L2
                             "hbm_plateau_from_bytes": int(hbm["bytes"].min()) if len(hbm) else None,
                             "levels_cycles": {k: round(float(df[df["level"] == k]["cycles"].median()), 1)
                                               for k in levels}}
    return {"latency": df.astype({"bytes": int, "ns": float, "cycles": float, "level": str})}
