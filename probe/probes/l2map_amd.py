"""The L2 map on AMD MI300X: per-XCD L2 vs Infinity Cache (MALL) vs HBM latency, and cross-XCD reads.

UNVERIFIED ON HARDWARE: no AMD GPU was available to kog. The kernels follow the CDNA3 ISA (s_getreg of
HW_REG_XCC_ID / HW_REG_HW_ID, s_memtime, s_memrealtime: kog.probe.probes.vendor_asm) and AMD's public
description of MI300X (8 XCDs of 38 CUs, a private 4 MiB L2 per XCD, a 256 MiB Infinity Cache shared by
all XCDs in front of HBM, workgroups dispatched to XCDs round-robin). On the CPU the kernels run only
under TRITON_INTERPRET=1, where the XCD is *simulated* as program_id % XCDs and every clock reads 0: the
tests check the addressing, the tables and the analyses (on synthetic MI300X-shaped data), never a
latency. Read every number a real run produces with that in mind until it has been checked on an MI300X.

Two measurements, one module (called by kog.probe.probes.l2map.measure when the device is AMD):

1. Per-XCD ladder (`xcd_ladder_kernel`): a grid of a few workgroups per XCD; each reads its XCC_ID and
   the first one on each XCD claims it and walks a dependent pointer chase over a random cycle of
   128-B lines, working sets from 16 KiB to 4x the Infinity Cache: sets <= the XCD's 4 MiB L2 hit its
   own L2 (after a full warm walk), sets up to 256 MiB hit the Infinity Cache (after a streaming warm
   pass), larger sets go to HBM. All XCDs chase the same read-only cycle at once from different
   starting points, so every XCD's L2 holds its own copy. Plateaus are found per XCD
   (`ladder_levels`) and named l1 / l2 / mall / hbm by where they end relative to each capacity.
2. Cross-XCD reads (`xcd_cross_kernel`): `regions_per_xcd` regions per XCD; region r is homed at XCD
   r % XCDs. Warm phase: every workgroup whose XCC_ID equals a region's home streams that region (vector
   loads, optionally stored back so the lines are dirty in the home XCD's L2), then streams 64 KiB of
   scratch to push them out of its CU's L1. After a grid barrier (relaxed atomics: an acquire would
   invalidate the L2 on gfx942; bounded spin; co-residency holds since the grid is 2 one-warp
   workgroups per CU), read phase: every
   workgroup times a dependent chase over its *own* slice of every region, touching each line once, so
   a reader on XCD b sees a line the home XCD a warmed and that no workgroup of b has touched. Expected
   on MI300X: the diagonal (a == b) is an L2 hit; off the diagonal there is no L2-to-L2 path, so the read
   is served by the Infinity Cache or HBM. Whether kernel-boundary or barrier cache maintenance
   (gfx942 writes back / invalidates L2 at agent-scope release / acquire) changes this is one of the
   things a hardware run has to show; the single launch with a barrier is used so that no kernel
   boundary sits between warm and read.

Tables (the NVIDIA l2map tables where they make sense, plus one AMD-only table):
    l2map           [sm, region, ns]      sm = dense CU id (xcd * CUs per XCD + rank of the CU in its XCD),
                                          ns = one first-touch read of that region (read phase)
    l2_partition    [sm, partition]       partition = the XCD the CU reported (XCC_ID)
    l2_region_home  [region, partition]   partition = the XCD that warmed the region
    xcd_latency     [src_xcd, dst_xcd, level, ns]
                    level l1 / l2 / mall / hbm: plateaus of XCD src's ladder (src == dst);
                    level cross: data warmed by XCD src, read by XCD dst (the diagonal is same-XCD).
The CUs are also assigned to XCDs from the latencies alone (`assign_cus_to_xcds`); the extras report how
often that agrees with XCC_ID, a check that needs no trust in the asm.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import triton
import triton.language as tl

from kog.probe.probes import vendor_asm as va
from kog.probe.probes.common import SPIN_CAP, ProbeContext, check_errors
from kog.probe.probes.latency import build_chain, find_plateaus, ladder_sizes
from kog.probe.probes.signal import _wait_geq

MiB = 1 << 20
LINE = 128
PER = LINE // 4                    # int32 per line
LEVELS = ("l1", "l2", "mall", "hbm")
# MI300X (gfx942) figures, used only when the device layer does not say: vL1D per CU, L2 per XCD,
# Infinity Cache per device.
MI300X_CAPS = {"l1": 32 * 1024, "l2": 4 * MiB, "mall": 256 * MiB}
WGS_PER_XCD_LADDER = 4             # a few per XCD, so every XCD gets one even if dispatch is not round-robin
XCD_SLOTS = 16                     # XCC_ID is 4 bits
FLUSH_BYTES = 64 * 1024            # 2x the vL1D: streamed after warming so the timed reads miss L1


# ---- kernels ----------------------------------------------------------------------------------------
# The grid barrier below polls with RELAXED atomic RMWs (performed where the counter is coherent for every
# XCD). Not acquire: on gfx942 an agent-scope acquire invalidates the L2 (buffer_inv sc1) and would throw away
# the lines the warm phase put there; the data read afterwards is read-only, so no ordering is needed beyond
# "the warm loads have returned", which their sum (stored before arriving) guarantees.


@triton.jit
def xcd_ladder_kernel(buf_ptr, start_ptr, claim_ptr, out_ptr, warm_steps, steps,
                      N_XCD: tl.constexpr, USE_ASM: tl.constexpr, AMD: tl.constexpr):
    pid = tl.program_id(0)
    x = va.xcd_id(USE_ASM, AMD, N_XCD)
    old = tl.atomic_cas(claim_ptr + x, 0, pid + 1)
    if old == 0:
        idx = tl.load(start_ptr + x)
        for _ in range(warm_steps):
            idx = tl.load(buf_ptr + idx)
        c0 = va.cycles(USE_ASM, AMD)
        t0 = va.nanoseconds(USE_ASM, AMD)
        for _ in range(steps):
            idx = tl.load(buf_ptr + idx)
        c1 = va.cycles(USE_ASM, AMD)
        t1 = va.nanoseconds(USE_ASM, AMD)
        tl.store(out_ptr + x * 4 + 0, c1 - c0)
        tl.store(out_ptr + x * 4 + 1, t1 - t0)
        tl.store(out_ptr + x * 4 + 2, idx.to(tl.int64))      # keeps the chase alive; the host checks it
        tl.store(out_ptr + x * 4 + 3, va.sm_id(USE_ASM, AMD).to(tl.int64))


@triton.jit
def xcd_cross_kernel(buf_ptr, home_ptr, slice_ptr, out_ptr, id_ptr, clk_ptr, bar_ptr, err_ptr, flush_ptr,
                     n_regions, region_elems, flush_elems, grid_size, cap,
                     N_XCD: tl.constexpr, SLICE_LINES: tl.constexpr, BLOCK: tl.constexpr,
                     PHASE: tl.constexpr, WRITE: tl.constexpr, USE_ASM: tl.constexpr, AMD: tl.constexpr):
    # PHASE 0: warm only; 1: read only; 2: warm, grid barrier, read (the hardware path: one launch,
    # no kernel boundary between warm and read). The interpreter runs 0 then 1: it cannot spin.
    pid = tl.program_id(0)
    x = va.xcd_id(USE_ASM, AMD, N_XCD)
    if PHASE != 1:
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros([BLOCK], dtype=tl.int32)
        for r in range(n_regions):
            h = tl.load(home_ptr + r)
            if h == x:
                for k in range(0, region_elems, BLOCK):
                    p = buf_ptr + r * region_elems + k + offs
                    m = k + offs < region_elems
                    v = tl.load(p, mask=m, other=0)
                    if WRITE:
                        tl.store(p, v, mask=m)       # same value back: the line is dirty in this XCD's L2
                    acc += v
        # stream a small shared scratch buffer (> the 32 KiB vL1D) so the reads below find nothing of
        # the warm phase in this CU's L1; it costs every XCD's L2 only flush_elems * 4 bytes
        for k in range(0, flush_elems, BLOCK):
            acc += tl.load(flush_ptr + k + offs, mask=k + offs < flush_elems, other=0)
        tl.store(clk_ptr + pid * 4 + 3, tl.sum(acc, axis=0).to(tl.int64))
    if PHASE == 2:
        tl.atomic_add(bar_ptr, 1, sem="relaxed", scope="gpu")
        v = _wait_geq(bar_ptr, grid_size, cap, 1, "relaxed", "gpu")
        fail = v < grid_size
        tl.store(err_ptr + pid * 4 + 0, 1, mask=fail)
        tl.store(err_ptr + pid * 4 + 2, v, mask=fail)
        tl.store(err_ptr + pid * 4 + 3, grid_size, mask=fail)
    if PHASE != 0:
        tl.store(id_ptr + pid * 2 + 0, x)
        tl.store(id_ptr + pid * 2 + 1, va.sm_id(USE_ASM, AMD))
        s0 = tl.load(slice_ptr + pid)
        g0 = va.nanoseconds(USE_ASM, AMD)
        k0 = va.cycles(USE_ASM, AMD)
        sink = pid * 0
        for j in range(n_regions):
            r = (j + pid) % n_regions          # staggered: the readers do not queue on one region
            base = r * region_elems
            off = s0
            c0 = va.cycles(USE_ASM, AMD)
            for _ in range(SLICE_LINES):
                off = tl.load(buf_ptr + base + off)      # offsets are region-relative
            c1 = va.cycles(USE_ASM, AMD)
            tl.store(out_ptr + pid * n_regions + r, c1 - c0)
            sink += off
        k1 = va.cycles(USE_ASM, AMD)
        g1 = va.nanoseconds(USE_ASM, AMD)
        tl.store(clk_ptr + pid * 4 + 0, k1 - k0)
        tl.store(clk_ptr + pid * 4 + 1, g1 - g0)
        tl.store(clk_ptr + pid * 4 + 2, sink.to(tl.int64))


# ---- buffers ----------------------------------------------------------------------------------------
def build_cross_regions(n_regions: int, readers: int, slice_lines: int, seed: int = 0):
    """int32 array of `n_regions` regions, each `readers * slice_lines` lines. Reader p owns lines
    [p*slice_lines, (p+1)*slice_lines) of every region; their first words form one random cycle (offsets
    relative to the region's start, so every region has the same layout). Returns (buf, slice start
    offset per reader, region_elems), numpy."""
    rng = np.random.default_rng(seed)
    lines = readers * slice_lines
    region = np.zeros(lines * PER, dtype=np.int32)
    starts = np.empty(readers, dtype=np.int32)
    for p in range(readers):
        own = p * slice_lines + rng.permutation(slice_lines)
        region[own * PER] = np.roll(own, -1) * PER
        starts[p] = own[0] * PER
    return np.tile(region, n_regions), starts, lines * PER


def region_homes(n_regions: int, n_xcd: int) -> np.ndarray:
    """Region r is warmed by (homed at) XCD r % n_xcd."""
    return np.arange(n_regions) % n_xcd


# ---- analysis (pure) --------------------------------------------------------------------------------
def dense_cu_ids(xcd, slot, cus_per_xcd: int) -> np.ndarray:
    """(XCD, CU slot inside the XCD) pairs -> CU ids: xcd * cus_per_xcd + rank of the slot among the
    distinct slots seen on that XCD. Slots (HW_ID bits 8-15) have gaps where CUs are harvested; the rank
    closes them, so a run that sees all 38 CUs of each XCD numbers them 0..303, XCD by XCD. Pass every
    observation of a run at once: ranks depend on which slots were seen."""
    xcd = np.asarray(xcd, dtype=np.int64)
    slot = np.asarray(slot, dtype=np.int64)
    out = np.empty(len(xcd), dtype=np.int64)
    for x in np.unique(xcd):
        m = xcd == x
        uniq = np.unique(slot[m])
        out[m] = x * cus_per_xcd + np.searchsorted(uniq, slot[m])
    return out


def ladder_levels(sizes, ns, caps: dict[str, int] | None = None, tol: float = 0.15) -> dict[str, dict]:
    """Plateaus of one XCD's latency-vs-working-set curve, named by where they end: a plateau whose last
    size is <= 1.5x the vL1D is l1, <= 1.5x the XCD's L2 is l2, <= 1.5x the Infinity Cache is mall,
    beyond is hbm. When several plateaus fall in one level (a TLB step inside the Infinity Cache range),
    the first (smallest sets) names it. A level whose latency does not differ from its neighbour's by
    more than `tol` merges with it and is not reported."""
    c = {**MI300X_CAPS, **(caps or {})}
    out: dict[str, dict] = {}
    for p in sorted(find_plateaus(sizes, ns, tol=tol), key=lambda p: p["first"]):
        last = p["last"]
        lv = next((name for name in ("l1", "l2", "mall") if last <= 1.5 * c[name]), "hbm")
        out.setdefault(lv, p)
    return out


def analyse_ladders(ladder: pd.DataFrame, caps: dict[str, int] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """ladder [xcd, bytes, ns, cycles] -> (ladder with a `level` column, xcd_latency rows of its plateaus
    [src_xcd = dst_xcd = xcd, level, ns])."""
    parts, rows = [], []
    for x, d in ladder.groupby("xcd", sort=True):
        d = d.sort_values("bytes").reset_index(drop=True)
        names = ladder_levels(d["bytes"].to_numpy(), d["ns"].to_numpy(), caps)
        lv = np.array(["transition"] * len(d), dtype=object)
        for name, p in names.items():
            lv[p["idx"]] = name
            rows.append({"src_xcd": int(x), "dst_xcd": int(x), "level": name, "ns": float(p["ns"])})
        parts.append(d.assign(level=lv))
    lad = pd.concat(parts, ignore_index=True) if parts else ladder.assign(level=pd.Series(dtype=str))
    return lad, pd.DataFrame(rows, columns=["src_xcd", "dst_xcd", "level", "ns"])


def assign_cus_to_xcds(l2map: pd.DataFrame, home: pd.DataFrame) -> pd.DataFrame:
    """Each CU's XCD from latency alone: the home XCD whose regions it reads fastest (median over them).
    l2map [sm, region, ns], home [region, partition] -> [sm, xcd, margin] (margin: how much slower the
    next-best XCD is, relative; near 0 means the latencies do not tell the XCDs apart)."""
    h = home.set_index("region")["partition"]
    d = l2map.assign(src=l2map["region"].map(h))
    per = d.pivot_table(index="sm", columns="src", values="ns", aggfunc="median").sort_index()
    m = per.to_numpy(dtype=float)
    m = np.where(np.isfinite(m), m, np.inf)
    best = np.argmin(m, axis=1)
    srt = np.sort(m, axis=1)
    margin = (srt[:, 1] - srt[:, 0]) / np.maximum(srt[:, 0], 1e-12) if m.shape[1] > 1 else np.zeros(len(m))
    return pd.DataFrame({"sm": per.index.astype(int), "xcd": per.columns.to_numpy()[best].astype(int),
                         "margin": margin.astype(float)})


def cross_matrix(l2map: pd.DataFrame, part: pd.DataFrame, home: pd.DataFrame) -> pd.DataFrame:
    """xcd_latency rows of level `cross`: median ns of reads by CUs of XCD dst of regions warmed by XCD src."""
    d = l2map.assign(dst_xcd=l2map["sm"].map(part.set_index("sm")["partition"]),
                     src_xcd=l2map["region"].map(home.set_index("region")["partition"])).dropna()
    g = d.groupby(["src_xcd", "dst_xcd"], as_index=False)["ns"].median()
    return g.assign(level="cross")[["src_xcd", "dst_xcd", "level", "ns"]].astype(
        {"src_xcd": int, "dst_xcd": int, "level": str, "ns": float})


def cross_same_other(xl: pd.DataFrame) -> dict[str, float | None]:
    """Median cross-XCD read latency with the data warmed on the reader's own XCD vs on another."""
    c = xl[xl["level"] == "cross"]
    same = c[c["src_xcd"] == c["dst_xcd"]]["ns"]
    other = c[c["src_xcd"] != c["dst_xcd"]]["ns"]
    return {"same_xcd_ns": float(same.median()) if len(same) else None,
            "other_xcd_ns": float(other.median()) if len(other) else None}


def level_medians(xl: pd.DataFrame) -> dict[str, float]:
    """Median over XCDs of each ladder level's plateau (l1 / l2 / mall / hbm)."""
    lad = xl[xl["level"].isin(LEVELS)]
    return {lv: float(lad[lad["level"] == lv]["ns"].median()) for lv in LEVELS if (lad["level"] == lv).any()}


def summary_fields(tables: dict, extras: dict) -> dict:
    """What the scan summary adds on AMD (key `xcd`), from the tables and this probe's extras (pure)."""
    xl = tables.get("xcd_latency")
    part = tables.get("l2_partition")
    info = extras.get("l2map", {}) if isinstance(extras.get("l2map"), dict) else {}
    out: dict = {"verified_on_hardware": False}
    if part is not None and len(part):
        out["xcds"] = int(part["partition"].nunique())
        out["cus_per_xcd"] = [int(n) for n in part.groupby("partition")["sm"].nunique().sort_index()]
    if xl is not None and len(xl):
        out["latency_ns"] = {k: round(v, 2) for k, v in level_medians(xl).items()}
        out["cross_xcd_ns"] = {k: (round(v, 2) if v is not None else None)
                               for k, v in cross_same_other(xl).items()}
    for k in ("cu_xcd_agreement", "round_robin_ladder", "ladder_error"):
        if k in info:
            out[k] = info[k]
    return out


# ---- measurement ------------------------------------------------------------------------------------
def run_xcd_ladder(ctx: ProbeContext, sizes: list[int], steps: int, n_xcd: int) -> pd.DataFrame:
    """One launch per working set; -> [xcd, bytes, ns, cycles, cu_id_raw] for every XCD that got a chaser."""
    import torch
    dev = ctx.torch_device
    grid = WGS_PER_XCD_LADDER * n_xcd
    rows = []
    for b in sizes:
        n_lines = max(n_xcd, b // LINE)
        buf, _start, perm = build_chain(n_lines, dev, seed=n_lines)
        # XCD x starts 1/n_xcd of the cycle after XCD x-1 (slots past n_xcd only guard a surprising XCC_ID)
        starts = torch.tensor([int(perm[((x % n_xcd) * n_lines) // n_xcd]) * PER for x in range(XCD_SLOTS)],
                              dtype=torch.int32, device=dev)
        l2 = ctx.l2_bytes or MI300X_CAPS["l2"]
        if ctx.use_asm and b > l2:
            buf.sum()        # one streaming pass: sets up to the Infinity Cache start resident there
        warm = n_lines if b <= l2 else min(n_lines, 64)
        claim = torch.zeros(XCD_SLOTS, dtype=torch.int32, device=dev)
        out = torch.zeros(XCD_SLOTS * 4, dtype=torch.int64, device=dev)
        xcd_ladder_kernel[(grid,)](buf, starts, claim, out, warm, steps, N_XCD=n_xcd, USE_ASM=ctx.use_asm,
                                   AMD=ctx.amd, num_warps=1)
        o = out.view(XCD_SLOTS, 4).cpu().numpy()
        for x in np.nonzero(claim.cpu().numpy())[0]:
            rows.append({"xcd": int(x), "bytes": int(n_lines * LINE), "ns": o[x, 1] / steps,
                         "cycles": o[x, 0] / steps, "cu_id_raw": int(o[x, 3])})
        del buf
        ctx.say(f"xcd ladder {b >> 10} KiB")
    return pd.DataFrame(rows, columns=["xcd", "bytes", "ns", "cycles", "cu_id_raw"])


def run_cross(ctx: ProbeContext, n_xcd: int, regions_per_xcd: int, slice_lines: int, grid: int,
              write: bool = False, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, float]:
    """The cross-XCD read map: (reads [pid, xcd, slot, region, cyc], per-reader ids, SM clock GHz)."""
    import torch
    dev = ctx.torch_device
    n_regions = regions_per_xcd * n_xcd
    buf_np, starts_np, region_elems = build_cross_regions(n_regions, grid, slice_lines, seed)
    buf = torch.from_numpy(buf_np).to(dev)
    starts = torch.from_numpy(starts_np).to(dev)
    home = torch.from_numpy(region_homes(n_regions, n_xcd).astype(np.int32)).to(dev)
    out = torch.full((grid * n_regions,), -1, dtype=torch.int64, device=dev)
    ids = torch.full((grid * 2,), -1, dtype=torch.int32, device=dev)
    clk = torch.zeros(grid * 4, dtype=torch.int64, device=dev)
    bar = torch.zeros(32, dtype=torch.int32, device=dev)
    err = torch.zeros(grid * 4, dtype=torch.int32, device=dev)
    flush = torch.randint(0, 64, ((FLUSH_BYTES if ctx.use_asm else 1024) // 4,), dtype=torch.int32, device=dev)
    kw = dict(N_XCD=n_xcd, SLICE_LINES=slice_lines, BLOCK=256, WRITE=write, USE_ASM=ctx.use_asm, AMD=ctx.amd,
              num_warps=1)
    args = (buf, home, starts, out, ids, clk, bar, err, flush, n_regions, region_elems, flush.numel(), grid,
            SPIN_CAP)
    if ctx.use_asm:
        xcd_cross_kernel[(grid,)](*args, PHASE=2, **kw)
        torch.cuda.synchronize()
        check_errors(err, "l2map (AMD cross-XCD)")
    else:
        xcd_cross_kernel[(grid,)](*args, PHASE=0, **kw)
        xcd_cross_kernel[(grid,)](*args, PHASE=1, **kw)
    o = out.view(grid, n_regions).cpu().numpy()
    idv = ids.view(grid, 2).cpu().numpy()
    c = clk.view(grid, 4).cpu().numpy()
    g = c[:, 0] / np.maximum(c[:, 1], 1)
    ghz = float(np.median(g[g > 0])) if (g > 0).any() else 1.0
    if ctx.use_asm:
        raw = idv[:, 1].astype(np.int64)
    else:     # no asm: the kernel's "id" is the program id; give it the shape a round-robin MI300X's has
        raw = np.array([va.simulated_amd_id(p, n_xcd, max(1, ctx.sms // n_xcd)) for p in range(grid)])
    slot = np.array([va.amd_cu_slot(r) for r in raw])
    pid_i, reg_i = np.meshgrid(np.arange(grid), np.arange(n_regions), indexing="ij")
    reads = pd.DataFrame({"pid": pid_i.ravel(), "xcd": idv[pid_i.ravel(), 0], "slot": slot[pid_i.ravel()],
                          "region": reg_i.ravel(), "cyc": o.ravel() / slice_lines})
    return reads, pd.DataFrame({"pid": np.arange(grid), "xcd": idv[:, 0], "slot": slot}), ghz


def cross_tables(reads: pd.DataFrame, n_xcd: int, cus_per_xcd: int, ghz: float):
    """reads [pid, xcd, slot, region, cyc] -> l2map [sm, region, ns], l2_partition, l2_region_home (pure)."""
    r = reads.assign(sm=dense_cu_ids(reads["xcd"], reads["slot"], cus_per_xcd))
    l2map = (r.groupby(["sm", "region"], as_index=False)["cyc"].median()
             .assign(ns=lambda d: d["cyc"] / ghz)[["sm", "region", "ns"]]
             .astype({"sm": int, "region": int, "ns": float}))
    part = (r.groupby("sm", as_index=False)["xcd"].first().rename(columns={"xcd": "partition"})
            .astype({"sm": int, "partition": int}))
    regions = np.sort(reads["region"].unique())
    home = pd.DataFrame({"region": regions, "partition": region_homes(int(regions.max()) + 1, n_xcd)[regions]}
                        ).astype({"region": int, "partition": int})
    return l2map, part, home


def measure_amd(ctx: ProbeContext, sizes: list[int] | None = None, steps: int | None = None,
                regions_per_xcd: int | None = None, slice_lines: int | None = None,
                grid: int | None = None) -> dict[str, pd.DataFrame]:
    """The AMD l2map probe (see the module docstring; unverified on hardware). Keyword arguments shrink
    it for the CPU interpreter's tests."""
    n_xcd = max(1, int(ctx.dies or 1))
    cus_per_xcd = max(1, ctx.sms // n_xcd)
    caps = {"l2": ctx.l2_bytes or MI300X_CAPS["l2"], "mall": ctx.llc_bytes or MI300X_CAPS["mall"]}
    if sizes is None:
        max_bytes = 4 * caps["mall"] if ctx.use_asm else 64 << 10
        sizes = ladder_sizes(ctx.quick, max_bytes)
    steps = steps or (1024 if ctx.quick else 2048)
    regions_per_xcd = regions_per_xcd or (1 if ctx.quick else 4)
    slice_lines = slice_lines or 4
    grid = grid or 2 * ctx.sms
    info: dict = {"mode": "amd-xcd", "verified_on_hardware": False, "simulated_xcd": not ctx.use_asm,
                  "xcds": n_xcd, "cus_per_xcd": cus_per_xcd, "caps_bytes": caps, "steps": steps,
                  "regions": regions_per_xcd * n_xcd, "slice_lines": slice_lines, "grid": grid}

    xl_parts = []
    try:
        ladder = run_xcd_ladder(ctx, sizes, steps, n_xcd)
        lad, lad_rows = analyse_ladders(ladder[["xcd", "bytes", "ns", "cycles"]], caps)
        xl_parts.append(lad_rows)
        info["ladder"] = {str(x): d[["bytes", "ns", "level"]].values.tolist() for x, d in lad.groupby("xcd")}
        info["ladder_xcds"] = sorted(int(x) for x in ladder["xcd"].unique())
    except Exception as e:   # the cross-XCD map still runs: it is what assigns CUs to XCDs
        info["ladder_error"] = f"{type(e).__name__}: {e}"[:300]

    reads, ids, ghz = run_cross(ctx, n_xcd, regions_per_xcd, slice_lines, grid)
    l2map, part, home = cross_tables(reads, n_xcd, cus_per_xcd, ghz)
    xl_parts.append(cross_matrix(l2map, part, home))
    xl = pd.concat([p for p in xl_parts if len(p)], ignore_index=True) if any(len(p) for p in xl_parts) else \
        pd.DataFrame(columns=["src_xcd", "dst_xcd", "level", "ns"])
    xl = xl.astype({"src_xcd": int, "dst_xcd": int, "level": str, "ns": float})

    so = cross_same_other(xl)
    by_lat = assign_cus_to_xcds(l2map, home)
    agree = by_lat.merge(part, on="sm")
    info.update({
        "sm_ghz": ghz, "k": int(part["partition"].nunique()),
        "near_ns": so["same_xcd_ns"], "far_ns": so["other_xcd_ns"],
        "near_cycles": so["same_xcd_ns"] * ghz if so["same_xcd_ns"] is not None else None,
        "far_cycles": so["other_xcd_ns"] * ghz if so["other_xcd_ns"] is not None else None,
        "gap": ((so["other_xcd_ns"] - so["same_xcd_ns"]) / so["same_xcd_ns"]
                if so["same_xcd_ns"] and so["other_xcd_ns"] is not None else None),
        "silhouette": None, "sms_measured": int(l2map["sm"].nunique()),
        "cu_xcd_agreement": float((agree["xcd"] == agree["partition"]).mean()) if len(agree) else None,
        "cu_xcd_margin_median": float(by_lat["margin"].median()) if len(by_lat) else None,
        "round_robin_cross": float((ids["xcd"].to_numpy() == ids["pid"].to_numpy() % n_xcd).mean()),
        "levels_ns": level_medians(xl),
    })
    ctx.extras["l2map"] = info
    return {"l2map": l2map, "l2_partition": part, "l2_region_home": home, "xcd_latency": xl}
