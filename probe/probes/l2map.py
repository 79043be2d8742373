"""Per-SM L2 map: every SM times an L2 hit to each region of an L2-resident buffer; clustering then
assigns every SM to an L2 partition and every region to its home partition.

Each region is `region_bytes` of the buffer, probed at `lines_per_region` lines that form a small
pointer cycle (one line: a self-loop). One CTA per SM (the first CTA that lands on an SM claims it;
the others exit) walks all regions, starting at a region that depends on its SM id so the SMs do not
queue on one L2 slice, and times `reps` dependent accesses per region with %clock64.

Access modes: "atomic" (atom.add of a runtime 0: served at the line's home L2 slice, the point of
coherence, so it sees the home partition even where a near copy exists; Triton issues a scalar atomic
from one thread and broadcasts the result through shared memory, which adds a bar.sync per access),
"ld_cg" (L2 load, L1 bypassed), "ld_volatile" and "ld_relaxed" (ld.relaxed.gpu).

Measured on the H200: SM partitions (66 + 66 SMs) are identical in every scan; region homes are a
property of the buffer's physical addresses, so scans in one process layout repeat them (r = 0.99997)
while a buffer placed elsewhere can flip every home (r = -0.97, same SM partitions): a kernel that wants
near data must map its own buffer's homes at run time. Plain loads (ld.cg) show a smaller near/far gap
(~11%) and split the SMs differently from the home-slice atomics (~45%); the main map uses atomics.

Tables `l2map` [sm:int, region:int, ns:float], `l2_partition` [sm:int, partition:int],
`l2_region_home` [region:int, partition:int].

On AMD, measure() hands over to kog.probe.probes.l2map_amd (per-XCD L2 vs Infinity Cache vs HBM, and
cross-XCD reads; same three tables with sm = CU and partition = XCD, plus `xcd_latency`). Unverified on
hardware.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import triton
import triton.language as tl

from kog.probe.probes import vendor_asm as va
from kog.probe.probes.common import ProbeContext

NAME = "l2map"
TABLES = ("l2map", "l2_partition", "l2_region_home")
LINE = 128
MODES = {"ld_cg": 0, "atomic": 1, "ld_volatile": 2, "ld_relaxed": 3}


@triton.jit
def _access(ptr, zero, MODE: tl.constexpr):
    if MODE == 0:
        v = tl.load(ptr, cache_modifier=".cg")
    elif MODE == 1:
        # `zero` is a runtime 0: Triton turns an atomic add of the constant 0 into a relaxed load
        v = tl.atomic_add(ptr, zero, sem="relaxed", scope="gpu")
    elif MODE == 2:
        v = tl.load(ptr, volatile=True)
    else:
        v = tl.atomic_add(ptr, 0, sem="relaxed", scope="gpu")   # compiles to ld.relaxed.gpu
    return v


@triton.jit
def l2map_kernel(buf_ptr, start_ptr, claim_ptr, out_ptr, clk_ptr, n_regions, reps, zero,
                 USE_ASM: tl.constexpr, AMD: tl.constexpr, MODE: tl.constexpr):
    pid = tl.program_id(0)
    sm = va.sm_id(USE_ASM, AMD)
    old = tl.atomic_cas(claim_ptr + sm, 0, pid + 1)
    if old == 0:
        g0 = va.nanoseconds(USE_ASM, AMD)
        k0 = va.cycles(USE_ASM, AMD)
        sink = pid * 0
        for j in range(n_regions):
            r = (j + sm * 7) % n_regions
            idx = tl.load(start_ptr + r)
            idx = _access(buf_ptr + idx, zero, MODE)          # untimed: the first touch
            c0 = va.cycles(USE_ASM, AMD)
            for _ in range(reps):
                idx = _access(buf_ptr + idx, zero, MODE)
            c1 = va.cycles(USE_ASM, AMD)
            tl.store(out_ptr + sm * n_regions + r, c1 - c0)
            sink += idx
        k1 = va.cycles(USE_ASM, AMD)
        g1 = va.nanoseconds(USE_ASM, AMD)
        tl.store(clk_ptr + sm * 4 + 0, k1 - k0)
        tl.store(clk_ptr + sm * 4 + 1, g1 - g0)
        tl.store(clk_ptr + sm * 4 + 2, sink.to(tl.int64))


def build_regions(n_regions: int, region_bytes: int, lines_per_region: int, device: str):
    """int32 buffer holding, per region, a pointer cycle over `lines_per_region` of its lines
    (spread evenly over the region); returns (buf, start element index per region)."""
    import torch
    per = LINE // 4
    lines_in_region = max(1, region_bytes // LINE)
    lpr = max(1, min(lines_per_region, lines_in_region))
    step = lines_in_region // lpr
    buf = torch.zeros(n_regions * lines_in_region * per, dtype=torch.int32)
    starts = []
    for r in range(n_regions):
        lines = [r * lines_in_region + j * step for j in range(lpr)]
        for a, b in zip(lines, lines[1:] + lines[:1]):
            buf[a * per] = b * per
        starts.append(lines[0] * per)
    return buf.to(device), torch.tensor(starts, dtype=torch.int32, device=device)


# ---- analysis (pure) -------------------------------------------------------------------------------
def to_matrix(df: pd.DataFrame) -> pd.DataFrame:
    return df.pivot_table(index="sm", columns="region", values="ns", aggfunc="median").sort_index()


def _kmeans(x: np.ndarray, k: int, seed: int = 0, iters: int = 50, inits: int = 8) -> tuple[np.ndarray, float]:
    rng = np.random.default_rng(seed)
    best, best_in = None, np.inf
    for _ in range(inits):
        c = x[rng.choice(len(x), k, replace=False)]
        for _ in range(iters):
            lab = np.argmin(((x[:, None, :] - c[None]) ** 2).sum(-1), axis=1)
            new = np.array([x[lab == j].mean(0) if (lab == j).any() else c[j] for j in range(k)])
            if np.allclose(new, c):
                break
            c = new
        inertia = float(((x - c[lab]) ** 2).sum())
        if inertia < best_in:
            best, best_in = lab, inertia
    return best, best_in


def _silhouette(x: np.ndarray, lab: np.ndarray) -> float:
    d = np.sqrt(((x[:, None, :] - x[None]) ** 2).sum(-1))
    ks = np.unique(lab)
    if len(ks) < 2:
        return -1.0
    s = []
    for i in range(len(x)):
        same = lab == lab[i]
        a = d[i, same].sum() / max(same.sum() - 1, 1)
        b = min(d[i, lab == k].mean() for k in ks if k != lab[i])
        s.append((b - a) / max(a, b, 1e-12))
    return float(np.mean(s))


def cluster_partitions(mat: pd.DataFrame, max_k: int = 2, min_gap: float = 0.05) -> dict:
    """Cluster SMs by their latency profile over regions; home of a region = the partition whose SMs
    reach it fastest. Returns {sm_partition: Series, region_home: Series, k, near_ns, far_ns, gap,
    silhouette}. One partition when the best split's near/far gap is below `min_gap` (relative)."""
    m = mat.to_numpy(dtype=float)
    m = np.where(np.isfinite(m), m, np.nanmedian(m))
    # double centring removes each SM's own offset (its distance to the crossbar) and each region's
    # (its slice): what is left is the SM x region interaction, i.e. near vs far
    r = m - m.mean(1, keepdims=True) - m.mean(0, keepdims=True) + m.mean()
    best = None
    for k in range(2, max(2, max_k) + 1):
        if len(r) < k:
            break
        lab, _ = _kmeans(r, k)
        sil = _silhouette(r, lab) if len(r) <= 4096 else 0.0
        if best is None or sil > best[1]:
            best = (lab, sil, k)
    if best is None:
        lab, sil, k = np.zeros(len(m), int), -1.0, 1
    else:
        lab, sil, k = best
    # canonical labels: partition 0 holds the lowest SM id, then by first appearance
    sms = mat.index.to_numpy()
    remap, nxt = {}, 0
    for l in lab[np.argsort(sms)]:
        if l not in remap:
            remap[l], nxt = nxt, nxt + 1
    lab = np.array([remap[l] for l in lab])
    per_part = np.array([m[lab == p].mean(0) for p in range(k)])      # [k, regions]
    home = np.argmin(per_part, axis=0)
    near_mask = lab[:, None] == home[None, :]
    near = float(np.median(m[near_mask])) if near_mask.any() else float(np.median(m))
    far = float(np.median(m[~near_mask])) if (~near_mask).any() else near
    gap = (far - near) / near if near else 0.0
    if k > 1 and gap < min_gap:
        lab, home, k, far, gap = np.zeros(len(m), int), np.zeros(m.shape[1], int), 1, near, 0.0
        near = float(np.median(m))
        far = near
    return {"sm_partition": pd.Series(lab, index=mat.index, name="partition"),
            "region_home": pd.Series(home, index=mat.columns, name="partition"),
            "k": int(k), "near_ns": near, "far_ns": far, "gap": float(gap), "silhouette": float(sil)}


def partition_tables(res: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    p = res["sm_partition"].rename_axis("sm").reset_index().astype({"sm": int, "partition": int})
    h = res["region_home"].rename_axis("region").reset_index().astype({"region": int, "partition": int})
    return p, h


def partitions_as_lists(part: pd.DataFrame) -> list[list[int]]:
    return [sorted(g["sm"].astype(int).tolist()) for _, g in part.groupby("partition")]


def compare_maps(a: pd.DataFrame, b: pd.DataFrame, pa: pd.DataFrame | None = None,
                 pb: pd.DataFrame | None = None) -> dict:
    """Repeatability of two l2map tables: Pearson r over common (sm, region) cells, and whether the two
    l2_partition tables group the SMs identically (labels may differ)."""
    ma, mb = to_matrix(a), to_matrix(b)
    common_i = ma.index.intersection(mb.index)
    common_c = ma.columns.intersection(mb.columns)
    x = ma.loc[common_i, common_c].to_numpy().ravel()
    y = mb.loc[common_i, common_c].to_numpy().ravel()
    ok = np.isfinite(x) & np.isfinite(y)
    r = float(np.corrcoef(x[ok], y[ok])[0, 1]) if ok.sum() > 2 else float("nan")
    out = {"corr": r, "cells": int(ok.sum())}
    if pa is not None and pb is not None:
        la = {tuple(s) for s in partitions_as_lists(pa)}
        lb = {tuple(s) for s in partitions_as_lists(pb)}
        out["identical_partitions"] = la == lb
    return out


# ---- measurement -----------------------------------------------------------------------------------
def run_map(ctx: ProbeContext, mode: str, n_regions: int, region_bytes: int, lines_per_region: int,
            reps: int, passes: int) -> tuple[pd.DataFrame, float]:
    """One map: long table [sm, region, ns] (median over passes) and the SM clock in GHz."""
    import torch
    dev = ctx.torch_device
    buf, starts = build_regions(n_regions, region_bytes, lines_per_region, dev)
    if ctx.amd:
        raise NotImplementedError("run_map is the NVIDIA map; on AMD, measure() runs "
                                  "kog.probe.probes.l2map_amd (per-XCD L2 / Infinity Cache / HBM)")
    slots = 2 * ctx.sms          # %smid is below the SM count on NVIDIA; the interpreter uses program ids
    grid = 2 * ctx.sms
    frames, ghz = [], []
    for _ in range(passes):
        claim = torch.zeros(slots, dtype=torch.int32, device=dev)
        out = torch.full((slots * n_regions,), -1, dtype=torch.int64, device=dev)
        clk = torch.zeros(slots * 4, dtype=torch.int64, device=dev)
        kw = {"launch_cooperative_grid": True} if ctx.use_asm else {}
        l2map_kernel[(grid,)](buf, starts, claim, out, clk, n_regions, reps, 0, USE_ASM=ctx.use_asm,
                              AMD=ctx.amd, MODE=MODES[mode], num_warps=1, **kw)
        o = out.view(slots, n_regions).cpu().numpy()
        c = clk.view(slots, 4).cpu().numpy()
        got = np.nonzero(claim.cpu().numpy())[0]
        g = c[got, 0] / np.maximum(c[got, 1], 1)
        g = float(np.median(g[g > 0])) if (g > 0).any() else 1.0
        ghz.append(g)
        sm_i, reg_i = np.meshgrid(got, np.arange(n_regions), indexing="ij")
        frames.append(pd.DataFrame({"sm": sm_i.ravel(), "region": reg_i.ravel(),
                                    "cyc": o[got].ravel() / reps}))
    df = pd.concat(frames).groupby(["sm", "region"], as_index=False)["cyc"].median()
    g = float(np.median(ghz))
    df["ns"] = df["cyc"] / g
    return df[["sm", "region", "ns"]].astype({"sm": int, "region": int, "ns": float}), g


def measure(ctx: ProbeContext) -> dict[str, pd.DataFrame]:
    import os
    if ctx.amd:   # MI300X: XCDs with private L2s, not partitions of one L2 (unverified on hardware)
        from kog.probe.probes.l2map_amd import measure_amd
        return measure_amd(ctx)
    n_regions = 64 if ctx.quick else 256
    reps = 16 if ctx.quick else 32
    passes = 1 if ctx.quick else 3
    mode = os.environ.get("KOG_L2MAP_MODE", "atomic")
    region_bytes = int(os.environ.get("KOG_L2MAP_REGION_BYTES", 128))
    lpr = int(os.environ.get("KOG_L2MAP_LINES", 1))
    df, ghz = run_map(ctx, mode, n_regions, region_bytes, lpr, reps, passes)
    res = cluster_partitions(to_matrix(df))
    part, home = partition_tables(res)
    info = {"mode": mode, "regions": n_regions, "region_bytes": region_bytes, "lines_per_region": lpr,
            "reps": reps, "passes": passes, "sm_ghz": ghz, "k": res["k"], "near_ns": res["near_ns"],
            "far_ns": res["far_ns"], "gap": res["gap"], "silhouette": res["silhouette"],
            "near_cycles": res["near_ns"] * ghz, "far_cycles": res["far_ns"] * ghz,
            "sms_measured": int(df["sm"].nunique())}
    # the other access modes, as a cross-check (full scan only; about a millisecond each)
    if not ctx.quick and os.environ.get("KOG_L2MAP_ALT", "1") == "1":
        alt = {}
        for m in MODES:
            if m == mode:
                continue
            try:
                d2, g2 = run_map(ctx, m, n_regions, region_bytes, lpr, reps, 1)
                r2 = cluster_partitions(to_matrix(d2))
                p2, _ = partition_tables(r2)
                alt[m] = {"k": r2["k"], "near_ns": r2["near_ns"], "far_ns": r2["far_ns"], "gap": r2["gap"],
                          "median_ns": float(d2["ns"].median()),
                          "same_partitions_as_main": compare_maps(df, d2, part, p2).get("identical_partitions"),
                          "corr_with_main": compare_maps(df, d2)["corr"]}
            except Exception as e:
                alt[m] = {"error": f"{type(e).__name__}: {e}"[:300]}
        info["other_modes"] = alt
    ctx.extras["l2map"] = info
    return {"l2map": df, "l2_partition": part, "l2_region_home": home}
