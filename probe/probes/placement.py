"""Placement: which SM (and die) each program id lands on, over repeated launches.

Table `placement` [launch:int, pid:int, smid:int, die:int]. Launches 0..L-1 use a grid of one CTA per
SM; the last launch uses two per SM (who shares an SM with whom). Extras: the dispatch order, how stable
it is, the dispatch rule (breadth-first over SMs on NVIDIA, round-robin over XCDs on MI300X) and the
co-resident CTAs per SM for a few kernel footprints.

On AMD (unverified on hardware): smid is a dense CU id (XCD * CUs per XCD + the CU's rank in its XCD,
from HW_REG_HW_ID), die is the XCD (HW_REG_XCC_ID), and the extras add the round-robin check: the
fraction of workgroups whose XCD is wg % XCDs (1.0 on an MI300X in SPX mode, ~1/8 if contiguous).
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import triton
import triton.language as tl

from kog.probe.probes import vendor_asm as va
from kog.probe.probes.common import CDNA3_LIMITS, ProbeContext, co_resident_ctas, kernel_footprint

NAME = "placement"
TABLES = ("placement",)


@triton.jit
def placement_kernel(out_ptr, USE_ASM: tl.constexpr, AMD: tl.constexpr):
    pid = tl.program_id(0)
    tl.store(out_ptr + pid, va.sm_id(USE_ASM, AMD))


# ---- analysis (pure) -------------------------------------------------------------------------------
def split_amd_ids(raw: np.ndarray, cus_per_xcc: int) -> tuple[np.ndarray, np.ndarray]:
    """Packed AMD ids -> (global CU index, XCD)."""
    dec = [va.decode_amd_hw_id(int(r)) for r in raw]
    die = np.array([d["xcc"] for d in dec])
    cu = np.array([d["cu_in_xcc"] for d in dec])
    return die * cus_per_xcc + cu, die


def amd_placement_ids(raws: list[np.ndarray], n_xcd: int, cus_per_xcd: int,
                      simulated: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
    """Packed AMD ids of several launches -> per launch (CU id, XCD), the CU ids dense (0..CUs-1, XCD by
    XCD) and consistent across the launches (kog.probe.probes.l2map_amd.dense_cu_ids over all of them).
    simulated: the ids are program ids (CPU interpreter, no asm); they get the packed form a round-robin
    MI300X would give (vendor_asm.simulated_amd_id). Unverified on hardware."""
    from kog.probe.probes.l2map_amd import dense_cu_ids
    if simulated:
        raws = [np.array([va.simulated_amd_id(int(p), n_xcd, cus_per_xcd) for p in r]) for r in raws]
    xcd = [np.array([va.decode_amd_hw_id(int(v))["xcc"] for v in r], dtype=np.int64) for r in raws]
    slot = [np.array([va.amd_cu_slot(int(v)) for v in r], dtype=np.int64) for r in raws]
    if not raws:
        return []
    ids = dense_cu_ids(np.concatenate(xcd), np.concatenate(slot), cus_per_xcd)
    out, i = [], 0
    for x in xcd:
        out.append((ids[i:i + len(x)], x))
        i += len(x)
    return out


def round_robin_fraction(df: pd.DataFrame, dies: int, launch: int | None = 0) -> float:
    """Fraction of workgroups whose die (XCD) is wg % dies: 1.0 under MI300X's round-robin dispatch,
    about 1/dies under contiguous dispatch. launch=None: over every launch."""
    d = df if launch is None else df[df["launch"] == launch]
    if not len(d) or dies < 1:
        return float("nan")
    return float((d["die"].to_numpy() == d["pid"].to_numpy() % dies).mean())


def dispatch_order(df: pd.DataFrame, launch: int = 0) -> list[int]:
    d = df[df["launch"] == launch].sort_values("pid")
    return d["smid"].astype(int).tolist()


def stability(df: pd.DataFrame, launches: list[int]) -> float:
    """Fraction of program ids that land on the same SM in every one of `launches`."""
    piv = df[df["launch"].isin(launches)].pivot(index="pid", columns="launch", values="smid").dropna()
    if piv.empty:
        return float("nan")
    return float((piv.nunique(axis=1) == 1).mean())


def infer_dispatch(df: pd.DataFrame, dies: int, sms: int) -> str:
    """'round-robin-xcd' when workgroup i runs on die i % dies; 'breadth-first' when the first `sms`
    programs cover distinct SMs (NVIDIA's block scheduler); else 'irregular'."""
    d = df[df["launch"] == 0].sort_values("pid")
    if dies > 1 and len(d) and float((d["die"].to_numpy() == d["pid"].to_numpy() % dies).mean()) >= 0.95:
        return "round-robin-xcd"
    first = d["smid"].to_numpy()[:sms]
    if len(first) and len(set(first.tolist())) == len(first):
        return "breadth-first"
    return "irregular"


def tpc_pairs(order: list[int]) -> float:
    """Fraction of consecutive program pairs (2k, 2k+1) that land on SMs 2j, 2j+1: the TPC pairing."""
    pairs = [(order[i], order[i + 1]) for i in range(0, len(order) - 1, 2)]
    if not pairs:
        return float("nan")
    return float(np.mean([a // 2 == b // 2 and a != b for a, b in pairs]))


def ctas_per_sm(df: pd.DataFrame, launch: int) -> dict[int, int]:
    """How many CTAs of one launch ran on each SM -> histogram {ctas: number of SMs}."""
    c = Counter(df[df["launch"] == launch]["smid"].astype(int).tolist())
    return dict(sorted(Counter(c.values()).items()))


# ---- measurement -----------------------------------------------------------------------------------
def measure(ctx: ProbeContext) -> dict[str, pd.DataFrame]:
    import torch
    dev = ctx.torch_device
    launches = 2 if ctx.quick else 5
    rows = []
    kern = None
    raws = []
    for launch in range(launches + 1):
        grid = ctx.sms if launch < launches else 2 * ctx.sms
        out = torch.full((grid,), -1, dtype=torch.int32, device=dev)
        kern = placement_kernel[(grid,)](out, USE_ASM=ctx.use_asm, AMD=ctx.amd, num_warps=1)
        raws.append(out.cpu().numpy())
    if ctx.amd:
        # die = XCD (XCC_ID); CU ids dense and consistent over all launches (unverified on hardware)
        n_xcd = max(ctx.dies, 1)
        per_launch = amd_placement_ids(raws, n_xcd, max(1, ctx.sms // n_xcd), simulated=not ctx.use_asm)
    else:
        per_launch = [(raw, np.zeros_like(raw)) for raw in raws]
    for launch, (smid, die) in enumerate(per_launch):
        rows += [{"launch": launch, "pid": p, "smid": int(s), "die": int(d)}
                 for p, (s, d) in enumerate(zip(smid, die))]
    df = pd.DataFrame(rows).astype({"launch": int, "pid": int, "smid": int, "die": int})

    # co-residency per footprint: computed from the compiled kernel's resources, then checked with a
    # cooperative launch of exactly that many CTAs (the launch fails if they cannot all be resident)
    cores = {}
    for warps in (1, 4, 8):
        out = torch.zeros(ctx.sms * 64, dtype=torch.int32, device=dev)
        k = placement_kernel[(1,)](out, USE_ASM=ctx.use_asm, AMD=ctx.amd, num_warps=warps)
        fp = kernel_footprint(k)
        per_sm = co_resident_ctas(fp["regs"], warps, fp["smem"], CDNA3_LIMITS if ctx.amd else None)
        entry = {**fp, "warps": warps, "ctas_per_sm": per_sm}
        if not ctx.amd and ctx.use_asm and per_sm:
            try:
                g = min(per_sm * ctx.sms, out.numel())
                placement_kernel[(g,)](out, USE_ASM=True, AMD=False, num_warps=warps,
                                       launch_cooperative_grid=True)
                torch.cuda.synchronize()
                entry["cooperative_launch_ok"] = True
            except Exception as e:  # the calculation over-estimated: record, do not fail the probe
                entry["cooperative_launch_ok"] = False
                entry["cooperative_error"] = str(e)[:200]
        cores[f"w{warps}"] = entry
    order = dispatch_order(df, 0)
    ctx.extras["placement"] = {
        "dispatch": infer_dispatch(df, ctx.dies, ctx.sms),
        "dispatch_order": order,
        "stable_fraction": stability(df, list(range(launches))),
        "tpc_pair_fraction": tpc_pairs(order),
        "distinct_sms_one_per_sm_grid": int(df[df["launch"] == 0]["smid"].nunique()),
        "ctas_per_sm_two_per_sm_grid": {str(k): v for k, v in ctas_per_sm(df, launches).items()},
        "co_resident": cores,
    }
    if ctx.amd:
        n_xcd = max(ctx.dies, 1)
        ctx.extras["placement"].update({
            "die": "xcd",
            "round_robin_xcd_fraction": round_robin_fraction(df, n_xcd, 0),
            "round_robin_xcd_fraction_all_launches": round_robin_fraction(df, n_xcd, None),
            "workgroups_per_xcd": {str(k): int(v) for k, v in
                                   df[df["launch"] == 0]["die"].value_counts().sort_index().items()},
            "simulated_xcd": not ctx.use_asm,
            "verified_on_hardware": False,
        })
    return {"placement": df}
