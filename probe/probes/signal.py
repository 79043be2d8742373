"""SM x SM signal latency: one-way flag latency between every pair of SMs.

One CTA per SM (the first CTA to land on an SM claims it), pinned by role: the host's round-robin
schedule pairs SM ids so every round measures SM-disjoint pairs concurrently; the lower SM of a pair
starts a flag ping-pong, the higher answers; one-way latency = round trip / 2. Rounds are separated by
an atomic grid barrier over the claiming CTAs. Every wait is bounded (SPIN_CAP polls) and a timeout
writes an error record (which flag, which round) and stops that CTA's remaining work.

Table `signal` [src_sm:int, dst_sm:int, ns:float] (both directions of a pair carry its one-way time).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import triton
import triton.language as tl

from kog.probe.probes import vendor_asm as va
from kog.probe.probes.common import SPIN_CAP, ProbeContext, check_errors

# error codes written by the kernels (literals there: Triton kernels read no Python globals):
# 1 = grid-barrier counter, 2 = signal flag (kog.probe.probes.common.ERR_NAMES)

NAME = "signal"
TABLES = ("signal",)
PAD = 32   # int32 per flag: one 128-B line each


@triton.jit
def _wait_geq(ptr, target, cap, ok, SEM: tl.constexpr, SCOPE: tl.constexpr):
    """Poll *ptr with atomic RMWs (SEM, SCOPE) until it reaches target, at most cap polls, while ok == 1.
    Returns the last value seen (the caller turns a shortfall into an error record). Shared by the probes."""
    v = tl.atomic_add(ptr, 0, sem=SEM, scope=SCOPE)
    it = v * 0
    while (v < target) & (it < cap) & (ok == 1):
        v = tl.atomic_add(ptr, 0, sem=SEM, scope=SCOPE)
        it += 1
    return v


@triton.jit
def signal_kernel(partner_ptr, claim_ptr, count_ptr, bar_ptr, flag_ptr, out_ptr, err_ptr,
                  n_rounds, n_slots, iters, cap, grid_size,
                  USE_ASM: tl.constexpr, AMD: tl.constexpr):
    pid = tl.program_id(0)
    sm = va.sm_id(USE_ASM, AMD)
    old = tl.atomic_cas(claim_ptr + sm, 0, pid + 1)
    mine = old == 0
    tl.atomic_add(count_ptr, mine.to(tl.int32), sem="release", scope="gpu")
    # barrier 0 over the whole grid: afterwards the number of claiming CTAs is final
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    ok = pid * 0 + 1
    v = _wait_geq(bar_ptr, grid_size, cap, ok, "acquire", "gpu")
    fail = v < grid_size
    tl.store(err_ptr + pid * 4 + 0, 1, mask=fail)
    tl.store(err_ptr + pid * 4 + 2, v, mask=fail)
    tl.store(err_ptr + pid * 4 + 3, grid_size, mask=fail)
    ok = tl.where(fail, 0, ok)
    if mine:
        n = tl.atomic_add(count_ptr, 0, sem="acquire", scope="gpu")
        for r in range(n_rounds):
            partner = tl.load(partner_ptr + r * n_slots + sm)
            # a partner SM that no CTA claimed: skip the pair rather than wait for nobody
            pclaim = tl.atomic_add(claim_ptr + tl.maximum(partner, 0), 0, sem="relaxed", scope="gpu")
            active = (partner >= 0) & (pclaim != 0) & (ok == 1)
            lo = tl.minimum(sm, partner)
            fl = flag_ptr + (r * n_slots + tl.maximum(lo, 0)) * 32
            if active:
                t0 = va.nanoseconds(USE_ASM, AMD)
                c0 = va.cycles(USE_ASM, AMD)
                for i in range(iters):
                    if sm < partner:
                        tl.atomic_xchg(fl, 2 * i + 1, sem="release", scope="gpu")
                        w = _wait_geq(fl, 2 * i + 2, cap, ok, "acquire", "gpu")
                        bad = w < 2 * i + 2
                    else:
                        w = _wait_geq(fl, 2 * i + 1, cap, ok, "acquire", "gpu")
                        bad = w < 2 * i + 1
                        tl.atomic_xchg(fl, 2 * i + 2, sem="release", scope="gpu")
                    tl.store(err_ptr + pid * 4 + 0, 2, mask=bad & (ok == 1))
                    tl.store(err_ptr + pid * 4 + 1, r, mask=bad & (ok == 1))
                    tl.store(err_ptr + pid * 4 + 2, w, mask=bad & (ok == 1))
                    tl.store(err_ptr + pid * 4 + 3, sm * 1000 + partner, mask=bad & (ok == 1))
                    ok = tl.where(bad, 0, ok)
                c1 = va.cycles(USE_ASM, AMD)
                t1 = va.nanoseconds(USE_ASM, AMD)
                if sm < partner:
                    tl.store(out_ptr + (r * n_slots + sm) * 2 + 0, c1 - c0)
                    tl.store(out_ptr + (r * n_slots + sm) * 2 + 1, t1 - t0)
            # grid barrier over the claiming CTAs between rounds
            tl.atomic_add(bar_ptr + 32, ok, sem="release", scope="gpu")
            tgt = (r + 1) * n
            v = _wait_geq(bar_ptr + 32, tgt, cap, ok, "acquire", "gpu")
            fail = (v < tgt) & (ok == 1)
            tl.store(err_ptr + pid * 4 + 0, 1, mask=fail)
            tl.store(err_ptr + pid * 4 + 1, r, mask=fail)
            tl.store(err_ptr + pid * 4 + 2, v, mask=fail)
            tl.store(err_ptr + pid * 4 + 3, tgt, mask=fail)
            ok = tl.where(fail, 0, ok)


# ---- schedule and analysis (pure) -----------------------------------------------------------------
def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """Circle-method tournament: n-1 rounds (n even; odd n gets a bye) of disjoint pairs covering every
    unordered pair exactly once."""
    ids = list(range(n)) + ([-1] if n % 2 else [])
    m = len(ids)
    rounds = []
    for _ in range(m - 1):
        pairs = [(ids[i], ids[m - 1 - i]) for i in range(m // 2)]
        rounds.append([(a, b) for a, b in pairs if a >= 0 and b >= 0])
        ids = [ids[0]] + [ids[-1]] + ids[1:-1]
    return rounds


def partner_table(rounds: list[list[tuple[int, int]]], n_slots: int) -> np.ndarray:
    t = np.full((len(rounds), n_slots), -1, dtype=np.int32)
    for r, pairs in enumerate(rounds):
        for a, b in pairs:
            t[r, a], t[r, b] = b, a
    return t


def to_table(rounds, out: np.ndarray, iters: int, ghz: float | None) -> pd.DataFrame:
    """out[r, slot, (cycles, ns)] of the lower SM of each pair -> long table, both directions."""
    rows = []
    if not ghz:
        # calibrate the SM clock over every pair's span together: long enough for %globaltimer
        c, t = out[..., 0].astype(float), out[..., 1].astype(float)
        ok = (c > 0) & (t > 0)
        ghz = float(c[ok].sum() / t[ok].sum()) if ok.any() else None
    for r, pairs in enumerate(rounds):
        for a, b in pairs:
            lo, hi = min(a, b), max(a, b)
            cyc, ns = out[r, lo]
            if cyc <= 0:
                continue
            one_way = (cyc / ghz if ghz else ns) / (2 * iters)
            rows += [{"src_sm": lo, "dst_sm": hi, "ns": one_way}, {"src_sm": hi, "dst_sm": lo, "ns": one_way}]
    return pd.DataFrame(rows, columns=["src_sm", "dst_sm", "ns"]).astype({"src_sm": int, "dst_sm": int,
                                                                           "ns": float})


def by_partition(sig: pd.DataFrame, part: pd.DataFrame) -> dict[str, float]:
    """Median one-way latency within an L2 partition vs across partitions."""
    p = dict(zip(part["sm"], part["partition"]))
    s = sig[sig["src_sm"].isin(p) & sig["dst_sm"].isin(p)]
    same = s[s["src_sm"].map(p) == s["dst_sm"].map(p)]["ns"]
    cross = s[s["src_sm"].map(p) != s["dst_sm"].map(p)]["ns"]
    return {"same_partition_ns": float(same.median()) if len(same) else float("nan"),
            "cross_partition_ns": float(cross.median()) if len(cross) else float("nan")}


# ---- measurement -----------------------------------------------------------------------------------
def measure(ctx: ProbeContext, sm_ghz: float | None = None) -> dict[str, pd.DataFrame]:
    import torch
    if not ctx.use_asm:
        raise RuntimeError("signal spins across programs: it cannot run in the CPU interpreter")
    if ctx.amd:
        # the kernel indexes its claim slots by the id sm_id returns, which on AMD is the packed
        # XCC_ID << 16 | HW_ID, far beyond ctx.sms slots: refuse rather than write out of bounds
        raise NotImplementedError("signal on AMD: per-CU claim slots (dense CU ids in the kernel) are not "
                                  "built yet")
    dev = ctx.torch_device
    n_slots = ctx.sms
    rounds = round_robin(n_slots)
    if ctx.quick:
        rounds = rounds[:: max(1, len(rounds) // 16)]
    iters = 8 if ctx.quick else 16
    part = torch.tensor(partner_table(rounds, n_slots), device=dev)
    grid = 2 * ctx.sms
    claim = torch.zeros(n_slots, dtype=torch.int32, device=dev)
    count = torch.zeros(1, dtype=torch.int32, device=dev)
    bar = torch.zeros(64, dtype=torch.int32, device=dev)
    flags = torch.zeros(len(rounds) * n_slots * PAD, dtype=torch.int32, device=dev)
    out = torch.zeros(len(rounds) * n_slots * 2, dtype=torch.int64, device=dev)
    err = torch.zeros(grid * 4, dtype=torch.int32, device=dev)
    signal_kernel[(grid,)](part, claim, count, bar, flags, out, err, len(rounds), n_slots, iters, SPIN_CAP,
                           grid, USE_ASM=True, AMD=ctx.amd, num_warps=1, launch_cooperative_grid=True)
    torch.cuda.synchronize()
    check_errors(err, "signal")
    o = out.view(len(rounds), n_slots, 2).cpu().numpy()
    df = to_table(rounds, o, iters, sm_ghz)
    ctx.extras["signal"] = {"rounds": len(rounds), "iters": iters, "pairs": int(len(df) // 2),
                            "claimed_sms": int((claim.cpu() != 0).sum()),
                            "median_ns": float(df["ns"].median()) if len(df) else None,
                            "min_ns": float(df["ns"].min()) if len(df) else None,
                            "max_ns": float(df["ns"].max()) if len(df) else None}
    return {"signal": df}
