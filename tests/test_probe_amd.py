"""The AMD (MI300X) side of kogprobe scan on a fake MI300X: XCD / CU ids, round-robin dispatch, the
per-XCD L2 / Infinity Cache / HBM ladder analysis, the cross-XCD map, partition modes and the scan
summary. No AMD GPU was available: these check the host code, the kernels' addressing under the CPU
interpreter (XCD simulated as program_id % 8) and the analyses on synthetic MI300X-shaped data; none of
it says the kernels behave on hardware."""
from __future__ import annotations

import sys
import types
from enum import Enum

import numpy as np
import pandas as pd
import pytest
import torch

from kog.probe.device import amd, fake
from kog.probe.probes import AMD_TABLE_COLUMNS, TABLE_COLUMNS, l2map, l2map_amd, placement
from kog.probe.probes import vendor_asm as va
from kog.probe.probes.common import ProbeContext, interpreting
from kog.probe.scan import build_summary

MiB = 1 << 20
N_XCD, CUS = 8, 38

needs_interp = pytest.mark.skipif(not interpreting(), reason="interpreter tests")


# ---- ids: XCC_ID, HW_ID slots, dense CU ids ----------------------------------------------------------
def test_xcc_id_reads_only_the_xcc_field():
    assert va.AMD_XCC_ID == "s_getreg_b32 $0, hwreg(HW_REG_XCC_ID, 0, 4)"
    import inspect
    src = inspect.getsource(va)
    assert "HW_REG_XCC_ID, 0, 16" not in src      # every reader masks to XCC_ID[3:0]


def test_fake_topology_has_38_active_cus_per_xcd():
    slots = fake.mi300x_cu_slots(seed=3)
    assert len(slots) == N_XCD and all(len(s) == CUS and len(set(s)) == CUS for s in slots)
    assert all(max(s) < 4 << 5 for s in slots)                  # 4 shader engines
    assert slots[0] != slots[1]                                 # harvested CUs differ per XCD


def test_dense_cu_ids_close_harvesting_gaps():
    ids = fake.mi300x_packed_ids(2 * 304, "round-robin", seed=5)
    xcd = [va.decode_amd_hw_id(p)["xcc"] for p in ids]
    slot = [va.amd_cu_slot(p) for p in ids]
    cu = l2map_amd.dense_cu_ids(xcd, slot, CUS)
    assert sorted(set(cu.tolist())) == list(range(304))
    assert (cu // CUS == np.array(xcd)).all()                   # CU ids are grouped XCD by XCD
    # the same physical CU always gets the same id, whatever the wave/SIMD bits say
    key = {}
    for c, x, s in zip(cu, xcd, slot):
        assert key.setdefault((x, s), c) == c
    # the rank is by slot: the lowest slot of XCD 3 is CU 3 * 38
    low = min(s for x, s in zip(xcd, slot) if x == 3)
    assert cu[[i for i, (x, s) in enumerate(zip(xcd, slot)) if x == 3 and s == low][0]] == 3 * CUS


def test_simulated_ids_decode_to_round_robin():
    for pid in (0, 1, 7, 8, 303, 607):
        p = va.simulated_amd_id(pid, N_XCD, CUS)
        assert va.decode_amd_hw_id(p)["xcc"] == pid % N_XCD
        assert va.amd_cu_slot(p) == (pid // N_XCD) % CUS


# ---- placement: die = XCD, round-robin check ---------------------------------------------------------
def placement_df(dispatch: str, launches: int = 3, seed: int = 0) -> pd.DataFrame:
    raws = [np.array(fake.mi300x_packed_ids(304 if lch < launches - 1 else 608, dispatch, seed=seed))
            for lch in range(launches)]
    rows = []
    for lch, (cu, die) in enumerate(placement.amd_placement_ids(raws, N_XCD, CUS)):
        rows += [{"launch": lch, "pid": p, "smid": int(c), "die": int(d)} for p, (c, d) in enumerate(zip(cu, die))]
    return pd.DataFrame(rows)


def test_round_robin_dispatch_detected():
    df = placement_df("round-robin")
    assert placement.round_robin_fraction(df, N_XCD) == 1.0
    assert placement.round_robin_fraction(df, N_XCD, launch=None) == 1.0
    assert placement.infer_dispatch(df, N_XCD, 304) == "round-robin-xcd"
    assert placement.stability(df, [0, 1]) == 1.0
    assert df[df.launch == 0]["smid"].nunique() == 304 and df["smid"].max() == 303


def test_contiguous_dispatch_is_not_round_robin():
    df = placement_df("contiguous")
    frac = placement.round_robin_fraction(df, N_XCD)
    assert frac == pytest.approx(1 / N_XCD, abs=0.03)
    assert placement.infer_dispatch(df, N_XCD, 304) != "round-robin-xcd"
    # XCD d holds workgroups d*38 .. d*38+37
    first = df[df.launch == 0].sort_values("pid")
    assert (first["die"].to_numpy() == first["pid"].to_numpy() // CUS).all()


@needs_interp
def test_placement_probe_on_fake_mi300x(fake_device):
    info = fake_device("mi300x")
    ctx = ProbeContext(sms=info.sms, vendor=info.vendor, dies=info.dies, quick=True)
    df = placement.measure(ctx)["placement"]
    assert list(df.columns) == list(TABLE_COLUMNS["placement"])
    first = df[df.launch == 0]
    assert sorted(first["smid"]) == list(range(304)) and first["die"].nunique() == N_XCD
    ex = ctx.extras["placement"]
    assert ex["die"] == "xcd" and ex["round_robin_xcd_fraction"] == 1.0 and ex["simulated_xcd"] is True
    assert ex["dispatch"] == "round-robin-xcd" and ex["verified_on_hardware"] is False
    assert ex["workgroups_per_xcd"] == {str(x): 38 for x in range(N_XCD)}


# ---- per-XCD ladder: L2 / Infinity Cache / HBM plateaus ----------------------------------------------
SIZES = [int(16384 * 2 ** (k / 2)) // 128 * 128 for k in range(33)]      # 16 KiB .. 1 GiB


def synth_ladder(rng, l1=60.0, l2=180.0, mall=420.0, hbm=700.0, tlb_step=None, xcds=N_XCD):
    """ns per access of one chase on each XCD: plateaus at the vL1D (32 KiB), the XCD's L2 (4 MiB), the
    Infinity Cache (256 MiB) and HBM, one half-octave of transition after each, per-XCD offsets, noise."""
    rows = []
    for x in range(xcds):
        off = rng.uniform(-0.03, 0.03)
        for b in SIZES:
            if b <= 32 * 1024:
                v = l1
            elif b <= 48 * 1024:
                v = (l1 + l2) / 2
            elif b <= 4 * MiB:
                v = l2
            elif b <= 6 * MiB:
                v = (l2 + mall) / 2
            elif b <= 256 * MiB:
                v = mall * (tlb_step if tlb_step and b > 64 * MiB else 1.0)
            elif b <= 384 * MiB:
                v = (mall + hbm) / 2
            else:
                v = hbm
            v *= (1 + off + x * 0.01) * rng.uniform(0.985, 1.015)
            rows.append({"xcd": x, "bytes": b, "ns": v, "cycles": v * 2.1})
    return pd.DataFrame(rows)


def test_ladder_levels_find_l2_mall_hbm():
    rng = np.random.default_rng(11)
    d = synth_ladder(rng, xcds=1)
    lv = l2map_amd.ladder_levels(d["bytes"], d["ns"])
    assert set(lv) == {"l1", "l2", "mall", "hbm"}
    got = {k: v["ns"] for k, v in lv.items()}
    for k, want in (("l1", 60), ("l2", 180), ("mall", 420), ("hbm", 700)):
        assert got[k] == pytest.approx(want, rel=0.05), k
    assert lv["l2"]["last"] <= 4 * MiB and lv["mall"]["last"] <= 256 * MiB and lv["hbm"]["first"] > 256 * MiB


def test_ladder_tlb_step_keeps_the_first_mall_plateau_and_merged_levels_are_not_invented():
    rng = np.random.default_rng(12)
    d = synth_ladder(rng, tlb_step=1.3, xcds=1)
    lv = l2map_amd.ladder_levels(d["bytes"], d["ns"])
    assert lv["mall"]["ns"] == pytest.approx(420, rel=0.05) and lv["mall"]["last"] <= 64 * MiB
    # an Infinity Cache no faster than HBM (within tol) is not reported as a level of its own
    d2 = synth_ladder(rng, mall=690.0, xcds=1)
    lv2 = l2map_amd.ladder_levels(d2["bytes"], d2["ns"])
    assert "mall" not in lv2 and lv2["hbm"]["ns"] == pytest.approx(695, rel=0.05)


def test_analyse_ladders_per_xcd():
    rng = np.random.default_rng(13)
    lad, rows = l2map_amd.analyse_ladders(synth_ladder(rng))
    assert set(lad["level"]) == {"l1", "l2", "mall", "hbm", "transition"}
    assert len(rows) == 4 * N_XCD and (rows["src_xcd"] == rows["dst_xcd"]).all()
    l2 = rows[rows.level == "l2"].set_index("src_xcd")["ns"]
    assert l2.index.tolist() == list(range(N_XCD))
    assert l2.loc[7] > l2.loc[0]              # the per-XCD offsets survive (x * 1%)
    med = l2map_amd.level_medians(rows)
    assert med["l1"] < med["l2"] < med["mall"] < med["hbm"]


# ---- cross-XCD map ------------------------------------------------------------------------------------
def synth_cross(rng, n_regions=32, near=180.0, far=420.0, uniform=False, seed=0):
    """reads [pid, xcd, slot, region, cyc] of 2 x 304 workgroups of a fake round-robin MI300X: a read of
    a region warmed by the reader's own XCD costs `near`, of another XCD's `far` (+ a per-pair offset),
    all x 2.1 GHz, with noise."""
    ids = fake.mi300x_packed_ids(608, "round-robin", seed=seed)
    pair = rng.uniform(0, 30, (N_XCD, N_XCD))
    rows = []
    for pid, p in enumerate(ids):
        x = va.decode_amd_hw_id(p)["xcc"]
        for r in range(n_regions):
            h = r % N_XCD
            ns = near if (h == x or uniform) else far + pair[h, x]
            rows.append((pid, x, va.amd_cu_slot(p), r, ns * 2.1 * rng.uniform(0.97, 1.03)))
    return pd.DataFrame(rows, columns=["pid", "xcd", "slot", "region", "cyc"])


def test_cross_tables_partition_cus_into_xcds():
    rng = np.random.default_rng(21)
    m, part, home = l2map_amd.cross_tables(synth_cross(rng), N_XCD, CUS, ghz=2.1)
    for name, df in (("l2map", m), ("l2_partition", part), ("l2_region_home", home)):
        assert list(df.columns) == list(TABLE_COLUMNS[name]), name
    assert sorted(m["sm"].unique()) == list(range(304)) and m["region"].nunique() == 32
    assert l2map.partitions_as_lists(part) == [list(range(x * CUS, (x + 1) * CUS)) for x in range(N_XCD)]
    assert home["partition"].tolist() == [r % N_XCD for r in range(32)]
    near = m.merge(part, on="sm").merge(home.rename(columns={"partition": "home"}), on="region")
    same = near[near.partition == near.home]["ns"]
    assert same.median() == pytest.approx(180, rel=0.03)


def test_cus_assigned_to_xcds_from_latency_alone():
    rng = np.random.default_rng(22)
    m, part, home = l2map_amd.cross_tables(synth_cross(rng), N_XCD, CUS, ghz=2.1)
    a = l2map_amd.assign_cus_to_xcds(m, home)
    got = a.set_index("sm")["xcd"]
    assert (got == part.set_index("sm")["partition"].loc[got.index]).all()
    assert a["margin"].min() > 0.5                   # MALL vs L2: far apart
    # a uniform map carries no XCD information: the margin says so
    mu, _, hu = l2map_amd.cross_tables(synth_cross(rng, uniform=True), N_XCD, CUS, ghz=2.1)
    assert l2map_amd.assign_cus_to_xcds(mu, hu)["margin"].median() < 0.05


def test_cross_matrix_and_same_vs_other():
    rng = np.random.default_rng(23)
    m, part, home = l2map_amd.cross_tables(synth_cross(rng), N_XCD, CUS, ghz=2.1)
    xl = l2map_amd.cross_matrix(m, part, home)
    assert list(xl.columns) == list(AMD_TABLE_COLUMNS["xcd_latency"])
    assert len(xl) == N_XCD * N_XCD and set(xl["level"]) == {"cross"}
    piv = xl.pivot(index="src_xcd", columns="dst_xcd", values="ns").to_numpy()
    assert (np.diag(piv) < piv.min(axis=1, where=~np.eye(N_XCD, dtype=bool), initial=1e9)).all()
    so = l2map_amd.cross_same_other(xl)
    assert so["same_xcd_ns"] == pytest.approx(180, rel=0.03)
    assert 420 < so["other_xcd_ns"] < 450


# ---- the scan summary from synthetic AMD tables -------------------------------------------------------
def synthetic_amd_scan(seed=31):
    rng = np.random.default_rng(seed)
    m, part, home = l2map_amd.cross_tables(synth_cross(rng), N_XCD, CUS, ghz=2.1)
    _, lad_rows = l2map_amd.analyse_ladders(synth_ladder(rng))
    xl = pd.concat([lad_rows, l2map_amd.cross_matrix(m, part, home)], ignore_index=True)
    so = l2map_amd.cross_same_other(xl)
    tables = {"l2map": m, "l2_partition": part, "l2_region_home": home, "xcd_latency": xl,
              "placement": placement_df("round-robin")}
    extras = {"l2map": {"mode": "amd-xcd", "near_ns": so["same_xcd_ns"], "far_ns": so["other_xcd_ns"],
                        "near_cycles": so["same_xcd_ns"] * 2.1, "far_cycles": so["other_xcd_ns"] * 2.1,
                        "sm_ghz": 2.1, "k": 8, "cu_xcd_agreement": 1.0},
              "placement": {"dispatch": "round-robin-xcd", "stable_fraction": 1.0,
                            "round_robin_xcd_fraction": 1.0}}
    return tables, extras


def test_summary_has_8_l2_partitions_of_38_cus_and_partition_modes(fake_device):
    info = fake_device("mi300x")
    tables, extras = synthetic_amd_scan()
    s = build_summary(tables, extras, info.to_dict(), 12.0)
    assert s["vendor"] == "amd" and s["sms"] == 304
    assert len(s["l2_partitions"]) == N_XCD and all(len(p) == CUS for p in s["l2_partitions"])
    assert sorted(sum(s["l2_partitions"], [])) == list(range(304))
    assert s["partition"] == {"compute": "SPX", "memory": "NPS1"}
    x = s["xcd"]
    assert x["xcds"] == N_XCD and x["cus_per_xcd"] == [CUS] * N_XCD and x["verified_on_hardware"] is False
    assert x["latency_ns"]["l2"] < x["latency_ns"]["mall"] < x["latency_ns"]["hbm"]
    assert x["cross_xcd_ns"]["same_xcd_ns"] < x["cross_xcd_ns"]["other_xcd_ns"]
    assert s["latency_ns"]["l2_near"] == pytest.approx(180, rel=0.03)     # own XCD's L2
    assert s["latency_ns"]["l2_far"] > 400                                # another XCD's data
    assert s["dispatch"] == "round-robin-xcd" and "Hopper" in x["comparison_note"]


def test_summary_without_partition_has_no_partition_key():
    tables, extras = synthetic_amd_scan(seed=32)
    dev = fake.h200().to_dict()
    s = build_summary({k: tables[k] for k in ("l2map", "l2_partition", "l2_region_home")}, {}, dev, 1.0)
    assert "partition" not in s and "xcd" not in s
    cpx = fake.mi300x(compute="CPX", memory="NPS4")
    s2 = build_summary({}, {}, cpx.to_dict(), 1.0)
    assert s2["partition"] == {"compute": "CPX", "memory": "NPS4"} and s2["sms"] == 38


# ---- the kernels under the CPU interpreter (simulated XCDs, no clocks) --------------------------------
def test_cross_regions_layout():
    buf, starts, relems = l2map_amd.build_cross_regions(3, readers=5, slice_lines=4, seed=2)
    assert relems == 5 * 4 * 32 and len(buf) == 3 * relems
    assert (buf[:relems] == buf[relems:2 * relems]).all()          # every region has the same layout
    for p, s in enumerate(starts):
        seen, off = [], int(s)
        for _ in range(4):
            seen.append(off // 32)
            off = int(buf[relems + off])
        assert off == s and sorted(seen) == list(range(p * 4, p * 4 + 4))   # own slice, one cycle


@needs_interp
@pytest.mark.parametrize("write", [False, True])
def test_cross_kernel_warms_home_regions_and_chases_own_slices(write):
    grid, n_reg, sl, n_xcd = 16, 8, 3, 8
    buf_np, st_np, relems = l2map_amd.build_cross_regions(n_reg, grid, sl, seed=4)
    filler = np.arange(buf_np.size) % 32 != 0                      # words other than a line's pointer
    buf_np = buf_np + (np.random.default_rng(4).integers(1, 9, buf_np.shape) * filler).astype(np.int32)
    buf0 = torch.from_numpy(buf_np.copy())
    buf = torch.from_numpy(buf_np)
    home = torch.from_numpy(l2map_amd.region_homes(n_reg, n_xcd).astype(np.int32))
    out = torch.full((grid * n_reg,), -1, dtype=torch.int64)
    ids = torch.full((grid * 2,), -1, dtype=torch.int32)
    clk = torch.zeros(grid * 4, dtype=torch.int64)
    bar, err = torch.zeros(32, dtype=torch.int32), torch.zeros(grid * 4, dtype=torch.int32)
    flush = torch.randint(1, 100, (300,), dtype=torch.int32)
    args = (buf, home, torch.from_numpy(st_np), out, ids, clk, bar, err, flush, n_reg, relems, 300, grid, 10)
    kw = dict(N_XCD=n_xcd, SLICE_LINES=sl, BLOCK=64, WRITE=write, USE_ASM=False, AMD=True, num_warps=1)
    l2map_amd.xcd_cross_kernel[(grid,)](*args, PHASE=0, **kw)
    l2map_amd.xcd_cross_kernel[(grid,)](*args, PHASE=1, **kw)
    assert torch.equal(buf, buf0)                                  # warming never changes the data
    c = clk.view(grid, 4)
    for pid in range(grid):
        x = pid % n_xcd
        want = int(buf_np.reshape(n_reg, relems)[[r for r in range(n_reg) if r % n_xcd == x]].sum()) + \
            int(flush.sum())
        assert c[pid, 3].item() == want                            # warmed exactly its XCD's regions
        assert c[pid, 2].item() == n_reg * int(st_np[pid])         # each slice chased once round
    assert ids.view(grid, 2)[:, 0].tolist() == [p % n_xcd for p in range(grid)]
    assert (out >= 0).all() and (err == 0).all()


@needs_interp
def test_measure_amd_end_to_end_in_the_interpreter():
    ctx = ProbeContext(sms=16, vendor="amd", dies=8, quick=True, l2_bytes=4 * MiB, llc_bytes=256 * MiB)
    res = l2map_amd.measure_amd(ctx, sizes=[16384, 32768], steps=4, regions_per_xcd=1, slice_lines=2, grid=32)
    assert set(res) == {"l2map", "l2_partition", "l2_region_home", "xcd_latency"}
    for name, df in res.items():
        cols = TABLE_COLUMNS.get(name) or AMD_TABLE_COLUMNS[name]
        assert list(df.columns) == list(cols), name
    assert l2map.partitions_as_lists(res["l2_partition"]) == [[2 * x, 2 * x + 1] for x in range(8)]
    assert res["l2_region_home"]["partition"].tolist() == list(range(8))
    xl = res["xcd_latency"]
    assert len(xl[xl.level == "cross"]) == 64
    info = ctx.extras["l2map"]
    assert info["ladder_xcds"] == list(range(8)) and info["simulated_xcd"] is True
    assert info["round_robin_cross"] == 1.0 and info["verified_on_hardware"] is False
    assert "ladder_error" not in info


def test_l2map_measure_hands_amd_to_l2map_amd(monkeypatch):
    seen = {}
    monkeypatch.setattr(l2map_amd, "measure_amd", lambda ctx: seen.setdefault("ctx", ctx) and {"ok": 1})
    ctx = ProbeContext(sms=304, vendor="amd", dies=8)
    assert l2map.measure(ctx) == {"ok": 1} and seen["ctx"] is ctx
    with pytest.raises(NotImplementedError, match="l2map_amd"):
        l2map.run_map(ctx, "atomic", 4, 128, 1, 2, 1)


# ---- partition modes (amdsmi) ------------------------------------------------------------------------
class _Compute(Enum):
    AMDSMI_COMPUTE_PARTITION_DPX = 2


@pytest.mark.parametrize("raw,want", [("SPX", "SPX"), ("cpx", "CPX"), (b"QPX", "QPX"),
                                      (_Compute.AMDSMI_COMPUTE_PARTITION_DPX, "DPX"),
                                      ({"partition_type": "TPX"}, "TPX"), ("SPXX", None), ("N/A", None)])
def test_compute_mode_normalised(raw, want):
    assert amd.compute_mode(raw) == want


@pytest.mark.parametrize("raw,want", [("NPS1", "NPS1"), ("AMDSMI_MEMORY_PARTITION_NPS4", "NPS4"),
                                      ({"mp_mode": "nps2"}, "NPS2"), ("NPS16", None), (None, None)])
def test_memory_mode_normalised(raw, want):
    assert amd.memory_mode(raw) == want


def test_partition_modes_and_xcds():
    assert amd.partition_modes(None, "") is None
    assert amd.partition_modes("SPX", "NPS1") == {"compute": "SPX", "memory": "NPS1"}
    odd = amd.partition_modes("MODE_7", "NPS1")
    assert odd["compute"] is None and odd["compute_raw"] == "MODE_7"
    assert [amd.xcds_per_device(m) for m in ("SPX", "DPX", "QPX", "CPX", "TPX", "XYZ", None)] == \
        [8, 4, 2, 1, None, None, None]


def test_amd_inventory_reads_partition_modes_from_amdsmi_enums(monkeypatch):
    import torch as _t
    props = types.SimpleNamespace(name="AMD Instinct MI300X", gcnArchName="gfx942", multi_processor_count=152,
                                  total_memory=96 * 2**30, pci_bus_id=0x0b, L2_cache_size=4 * MiB)
    monkeypatch.setattr(_t.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(_t.version, "hip", "6.4.0", raising=False)
    smi = types.ModuleType("amdsmi")
    smi.amdsmi_init = smi.amdsmi_shut_down = lambda: None
    smi.amdsmi_get_processor_handles = lambda: ["A"]
    smi.amdsmi_get_gpu_device_bdf = lambda h: "0000:0b:00.0"
    smi.amdsmi_get_gpu_xcd_counter = lambda h: 8                 # counts the whole GPU, not this device
    smi.amdsmi_get_gpu_compute_partition = lambda h: _Compute.AMDSMI_COMPUTE_PARTITION_DPX
    smi.amdsmi_get_gpu_memory_partition = lambda h: "AMDSMI_MEMORY_PARTITION_NPS4"
    monkeypatch.setitem(sys.modules, "amdsmi", smi)
    info = amd.inventory(0)
    assert info.partition == {"compute": "DPX", "memory": "NPS4"}
    assert (info.sms, info.dies, info.sms_per_die) == (152, 4, 38) and info.extra["xcds_reported"] == 8


def test_fake_mi300x_modes(fake_device):
    info = fake_device("mi300x")
    assert info.partition == {"compute": "SPX", "memory": "NPS1"} and info.dies == 8
    q = fake.mi300x(compute="QPX")
    assert (q.sms, q.dies, q.llc_bytes) == (76, 2, 64 * MiB)
    from kog.errors import UsageError
    with pytest.raises(UsageError, match="compute partition"):
        fake.mi300x(compute="TPX")


# ---- the AMD kernels compile for gfx942 (compiler only: Triton's AMD backend runs on the CPU) ---------
_COMPILE = r'''
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kog.probe.probes import l2map_amd, placement
tgt = GPUTarget("hip", "gfx942", 64)
def asm(fn, sig, consts):
    sig = {**sig, **{c: "constexpr" for c in consts}}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=tgt,
                          options={"num_warps": 1}).asm["amdgcn"]
out = {}
out["placement"] = asm(placement.placement_kernel, {"out_ptr": "*i32"}, {"USE_ASM": True, "AMD": True})
out["ladder"] = asm(l2map_amd.xcd_ladder_kernel, dict(buf_ptr="*i32", start_ptr="*i32", claim_ptr="*i32",
                    out_ptr="*i64", warm_steps="i32", steps="i32"), {"N_XCD": 8, "USE_ASM": True, "AMD": True})
names = "buf_ptr home_ptr slice_ptr out_ptr id_ptr clk_ptr bar_ptr err_ptr flush_ptr".split()
sig = {**{n: "*i32" for n in names}, "out_ptr": "*i64", "clk_ptr": "*i64",
       **{n: "i32" for n in "n_regions region_elems flush_elems grid_size cap".split()}}
out["cross"] = asm(l2map_amd.xcd_cross_kernel, sig, {"N_XCD": 8, "SLICE_LINES": 4, "BLOCK": 256, "PHASE": 2,
                   "WRITE": True, "USE_ASM": True, "AMD": True})
json.dump(out, sys.stdout)
'''


def test_amd_kernels_compile_for_gfx942(tmp_path):
    import json
    import os
    import subprocess
    import importlib.util
    if importlib.util.find_spec("triton.backends.amd") is None:
        pytest.skip("this Triton has no AMD backend")
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    a = json.loads(r.stdout)
    assert "s_getreg_b32" in a["placement"] and "hwreg(HW_REG_XCC_ID, 0, 4)" in a["placement"]
    assert "hwreg(HW_REG_HW_ID)" in a["placement"]
    assert "HW_REG_XCC_ID" in a["ladder"] and "s_memtime" in a["ladder"] and "s_memrealtime" in a["ladder"]
    # the barrier between warm and read must not invalidate or write back the L2 (gfx942 acquire/release)
    assert "HW_REG_XCC_ID" in a["cross"] and "global_atomic_add" in a["cross"]
    assert "buffer_inv" not in a["cross"] and "buffer_wbl2" not in a["cross"]


def test_signal_refuses_amd_instead_of_writing_out_of_bounds(monkeypatch):
    from kog.probe.probes import signal
    monkeypatch.setattr(ProbeContext, "use_asm", property(lambda self: True))
    with pytest.raises(NotImplementedError, match="signal on AMD"):
        signal.measure(ProbeContext(sms=304, vendor="amd", dies=8))


@needs_interp
def test_ladder_kernel_one_chaser_per_xcd_follows_the_cycle():
    from kog.probe.probes.latency import build_chain
    n, warm, steps = 96, 5, 37
    buf, _, perm = build_chain(n, "cpu", seed=9)
    p = perm.tolist()
    starts = torch.tensor([p[(x % 8) * n // 8] * 32 for x in range(16)], dtype=torch.int32)
    claim = torch.zeros(16, dtype=torch.int32)
    out = torch.zeros(64, dtype=torch.int64)
    l2map_amd.xcd_ladder_kernel[(32,)](buf, starts, claim, out, warm, steps, N_XCD=8, USE_ASM=False, AMD=True,
                                       num_warps=1)
    assert claim[:8].tolist() == [x + 1 for x in range(8)] and claim[8:].sum() == 0   # first wg of each XCD
    o = out.view(16, 4)
    for x in range(8):
        assert o[x, 2].item() // 32 == p[(x * n // 8 + warm + steps) % n]
        assert o[x, 3].item() == x                    # the claiming program's id (no asm: program id)
