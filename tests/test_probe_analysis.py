"""The scan's analyses on synthetic data with known answers, and on the bundled H200 scan."""
import json

import numpy as np
import pandas as pd
import pytest

from kog.probe.probes import TABLE_COLUMNS, l2map, latency, placement, signal
from kog.probe.probes.common import HOPPER_LIMITS, co_resident_ctas
from kog.probe.probes.bandwidth import saturation_sms
from kog.probe.scan import build_summary, bundled_scan_path, compare, load_tables

MiB = 1 << 20


def ladder(levels, rng):
    """Synthetic ladder: (max bytes, ns) steps, with noise and one transition point between steps."""
    sizes = [int(16384 * 2 ** (k / 2)) for k in range(31)]
    ns = []
    for s in sizes:
        for lim, v in levels:
            if s <= lim:
                ns.append(v * rng.uniform(0.98, 1.02))
                break
    return sizes, ns


def test_plateaus_four_levels():
    rng = np.random.default_rng(1)
    sizes, ns = ladder([(200 * 1024, 20.0), (24 * MiB, 150.0), (60 * MiB, 260.0), (1 << 40, 560.0)], rng)
    df, lv = latency.analyse(pd.DataFrame({"bytes": sizes, "ns": ns, "cycles": np.array(ns) * 2}), 60 * MiB)
    assert set(lv) == {"l1", "l2_near", "l2_far", "hbm"}
    assert lv["l1"] == pytest.approx(20, rel=0.03) and lv["hbm"] == pytest.approx(560, rel=0.03)
    assert lv["l2_near"] == pytest.approx(150, rel=0.03) and lv["l2_far"] == pytest.approx(260, rel=0.03)
    assert df[df.bytes == 16384].level.item() == "l1"
    assert df[df.bytes == df.bytes.max()].level.item() == "hbm"


def test_plateaus_three_levels_and_no_hbm_when_small():
    rng = np.random.default_rng(2)
    sizes, ns = ladder([(128 * 1024, 30.0), (8 * MiB, 140.0), (1 << 40, 650.0)], rng)
    _, lv = latency.analyse(pd.DataFrame({"bytes": sizes, "ns": ns, "cycles": ns}), 50 * MiB)
    assert lv["l2_near"] == lv["l2_far"] and lv["hbm"] == pytest.approx(650, rel=0.03)
    small = [(s, n) for s, n in zip(sizes, ns) if s < 40 * MiB]
    _, lv2 = latency.analyse(pd.DataFrame({"bytes": [a for a, _ in small], "ns": [b for _, b in small],
                                           "cycles": 0.0}), 50 * MiB)
    assert "hbm" not in lv2


def synthetic_map(n_sm=132, n_reg=128, gap=60.0, noise=3.0, seed=0):
    """L = 140 + a(sm) + b(region) + gap * [partition(sm) != home(region)] + noise."""
    rng = np.random.default_rng(seed)
    part = rng.permutation(np.arange(n_sm) % 2)
    home = rng.integers(0, 2, n_reg)
    a, b = rng.normal(0, 5, n_sm), rng.normal(0, 3, n_reg)
    m = 140 + a[:, None] + b[None, :] + gap * (part[:, None] != home[None, :]) + rng.normal(0, noise, (n_sm, n_reg))
    sm, reg = np.meshgrid(np.arange(n_sm), np.arange(n_reg), indexing="ij")
    return pd.DataFrame({"sm": sm.ravel(), "region": reg.ravel(), "ns": m.ravel()}), part, home


def same_grouping(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return (a == b).all() or (a == 1 - b).all()


def test_clustering_recovers_partitions_and_homes():
    df, part, home = synthetic_map()
    res = l2map.cluster_partitions(l2map.to_matrix(df))
    assert res["k"] == 2
    assert same_grouping(res["sm_partition"].to_numpy(), part)
    # region home: the partition whose SMs are near it, in the same labels as the SMs
    lab = res["sm_partition"].to_numpy()
    flip = (lab != part).all()
    assert (res["region_home"].to_numpy() == (1 - home if flip else home)).all()
    assert res["far_ns"] - res["near_ns"] == pytest.approx(60, abs=8)
    assert res["sm_partition"].loc[0] == 0            # canonical label: SM 0 is in partition 0


def test_clustering_says_one_partition_when_uniform():
    df, _, _ = synthetic_map(gap=0.0, seed=3)
    res = l2map.cluster_partitions(l2map.to_matrix(df))
    assert res["k"] == 1 and res["sm_partition"].nunique() == 1


def test_compare_maps_repeatability():
    a, _, _ = synthetic_map(seed=4)
    b = a.copy()
    b["ns"] = b["ns"] + np.random.default_rng(5).normal(0, 1, len(b))
    pa, _ = l2map.partition_tables(l2map.cluster_partitions(l2map.to_matrix(a)))
    pb, _ = l2map.partition_tables(l2map.cluster_partitions(l2map.to_matrix(b)))
    r = l2map.compare_maps(a, b, pa, pb)
    assert r["corr"] > 0.9 and r["identical_partitions"]
    c, _, _ = synthetic_map(seed=9)
    pc, _ = l2map.partition_tables(l2map.cluster_partitions(l2map.to_matrix(c)))
    assert not l2map.compare_maps(a, c, pa, pc)["identical_partitions"]


def test_round_robin_covers_every_pair_once():
    for n in (6, 7, 132):
        rounds = signal.round_robin(n)
        pairs = [tuple(sorted(p)) for r in rounds for p in r]
        assert len(pairs) == len(set(pairs)) == n * (n - 1) // 2
        for r in rounds:     # disjoint within a round
            ids = [i for p in r for i in p]
            assert len(ids) == len(set(ids))
        t = signal.partner_table(rounds, n)
        assert all(t[r, t[r, s]] == s for r in range(len(rounds)) for s in range(n) if t[r, s] >= 0)


def test_signal_by_partition():
    sig = pd.DataFrame({"src_sm": [0, 1, 0, 2], "dst_sm": [1, 0, 2, 0], "ns": [500.0, 500.0, 700.0, 700.0]})
    part = pd.DataFrame({"sm": [0, 1, 2], "partition": [0, 0, 1]})
    r = signal.by_partition(sig, part)
    assert r == {"same_partition_ns": 500.0, "cross_partition_ns": 700.0}


def test_co_residency_hopper():
    assert co_resident_ctas(8, 1, 0) == 32          # CTA limit
    assert co_resident_ctas(8, 4, 0) == 16          # warp limit: 64 warps / 4
    assert co_resident_ctas(128, 8, 0) == 2         # 65536 / (128*32*8)
    assert co_resident_ctas(32, 4, 100 * 1024) == 2  # shared memory: 228 KiB / (100+1) KiB
    assert co_resident_ctas(255, 32, 0, HOPPER_LIMITS) == 0


def fake_mi300x_placement(launches=2, n=304 * 2, dies=8, cus_per_xcd=38):
    """A fake MI300X: workgroup i goes to XCD i % 8, then to the next free CU of that XCD."""
    rows = []
    for launch in range(launches):
        used = [0] * dies
        for pid in range(n):
            d = pid % dies
            cu = used[d] % cus_per_xcd
            used[d] += 1
            rows.append({"launch": launch, "pid": pid, "smid": d * cus_per_xcd + cu, "die": d})
    return pd.DataFrame(rows)


def test_amd_round_robin_dispatch_detected():
    df = fake_mi300x_placement()
    assert placement.infer_dispatch(df, dies=8, sms=304) == "round-robin-xcd"
    assert placement.stability(df, [0, 1]) == 1.0


def test_amd_hw_id_decoding():
    from kog.probe.probes import vendor_asm as va
    # XCC 5, SE 2, SH 1, CU 9 -> hw_id = cu<<8 | sh<<12 | se<<13
    hw = (9 << 8) | (1 << 12) | (2 << 13)
    d = va.decode_amd_hw_id((5 << 16) | hw, cus_per_se_sh=10)
    assert (d["xcc"], d["se"], d["sh"], d["cu"]) == (5, 2, 1, 9)
    assert d["cu_in_xcc"] == (2 * 2 + 1) * 10 + 9
    raw = np.array([(3 << 16) | (4 << 8), (0 << 16) | (1 << 8)])
    smid, die = placement.split_amd_ids(raw, 38)
    assert die.tolist() == [3, 0] and smid.tolist() == [3 * 38 + 4, 1]


def test_nvidia_dispatch_and_tpc_pairs():
    order = [124, 125, 0, 1, 16, 17, 2, 3]
    assert placement.tpc_pairs(order) == 1.0
    df = pd.DataFrame({"launch": 0, "pid": range(8), "smid": order, "die": 0})
    assert placement.infer_dispatch(df, dies=1, sms=8) == "breadth-first"
    assert placement.ctas_per_sm(df, 0) == {1: 8}


def test_saturation_sms():
    df = pd.DataFrame({"sms": [1, 32, 64, 96, 132], "kind": "read", "GBps": [40, 2000, 3500, 3900, 4000.0]})
    assert saturation_sms(df) == 96
    assert saturation_sms(df, peak=4200.0) == 132                   # against the copy's peak: later
    assert saturation_sms(df, peak=4500.0) is None                  # never reached: said, not faked


def test_peak_summary_against_the_torch_copy():
    from kog.probe.probes.bandwidth import peak_summary
    df = pd.DataFrame({"sms": [1, 64, 132, 1, 64, 132], "kind": ["read"] * 3 + ["copy"] * 3,
                       "GBps": [40, 4000, 4050, 60, 3600, 3700.0]})
    p = peak_summary(df, 4200.0)
    assert p["reference_peak_GBps"] == 4200.0 and p["read_over_torch_copy"] == pytest.approx(4050 / 4200)
    assert p["sms_to_saturate_hbm"] == 64                            # 4000 >= 0.95 x 4200
    q = peak_summary(df, None)
    assert q["reference"] == "best read of the probe" and q["sms_to_saturate_hbm"] == 64


def test_comparison_explains_big_gaps_only():
    assert compare("barrier_us_all_ctas", 0.95)["explanation"] == "within 30%"
    r = compare("hbm_cycles", 1000.0)
    assert r["gap"] > 0.3 and "TLB" in r["explanation"]
    assert compare("l2_far_over_near", 1.7)["gap"] == 0.0
    assert compare("flag_oneway_us", None)["ratio"] is None


# ---- the bundled H200 scan ---------------------------------------------------------------------------
bundled = bundled_scan_path()
needs_bundle = pytest.mark.skipif(not (bundled / "meta.json").exists(), reason="no bundled scan yet")


@needs_bundle
def test_bundled_scan_tables_have_the_schema():
    from kog.runstore import open_run
    run = open_run(bundled)
    assert run.kind == "scan"
    for name, cols in TABLE_COLUMNS.items():
        df = run.table(name)
        assert list(df.columns) == list(cols), name
        assert len(df) > 0, name


@needs_bundle
def test_bundled_scan_analyses_reproduce_its_summary():
    from kog.runstore import open_run
    run = open_run(bundled)
    t = load_tables(run)
    summ = run.json("summary")
    assert summ["sms"] == 132 and len(summ["l2_partitions"]) == 2
    assert sorted(sum(summ["l2_partitions"], [])) == list(range(132))
    res = l2map.cluster_partitions(l2map.to_matrix(t["l2map"]))
    got = l2map.partitions_as_lists(l2map.partition_tables(res)[0])
    assert got == summ["l2_partitions"]
    _, lv = latency.analyse(t["latency"].drop(columns="level"), run.meta["device"].get("l2_bytes"))
    assert set(lv) >= {"l1", "hbm"}
    assert lv["l1"] < summ["latency_ns"]["l2_near"] < summ["latency_ns"]["l2_far"] < lv["hbm"] * 1.5
    again = build_summary(t, run.json("probe_extras"), run.meta["device"], summ["scan_seconds"],
                          run.meta.get("errors"))
    for k in ("l2_partitions", "latency_ns", "barrier_us_all_ctas", "flag_oneway_us", "sms_to_saturate_hbm"):
        assert again[k] == summ[k], k
    assert summ["sms_to_saturate_hbm"] <= 132
    assert json.dumps(summ["comparison"])


# ---- where a scan is found (kog.probe.scan.find_scan: the search, the trials and the simulator use it) ------
def _scan_run(store, name, complete=True):
    run = store.create("scan", {"name": name, "sms": 132})
    run.finish("complete" if complete else "incomplete")
    return run.path


@needs_bundle
def test_find_scan_one_order(tmp_runs, tmp_path, monkeypatch):
    """A given directory; else this device's latest complete scan in the run store (any device's when none
    is named); else the bundled scan, for its own device only; else nothing."""
    import datetime as dt
    import itertools
    from kog import runstore
    from kog.errors import UsageError
    from kog.probe.scan import find_scan
    minutes = itertools.count()       # one run a minute: "latest" is the run store's time order
    t0 = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    monkeypatch.setattr(runstore, "_utc_now", lambda: t0 + dt.timedelta(minutes=next(minutes)))
    h200, a100 = "NVIDIA H200", "NVIDIA A100-SXM4-80GB"
    assert find_scan(None, h200) == bundled and find_scan() == bundled       # an empty store: the bundled
    assert find_scan(None, a100) is None                                      # ... only for its own device
    assert find_scan(tmp_path) == tmp_path and find_scan(str(tmp_path), a100) == tmp_path
    with pytest.raises(UsageError, match="no such scan directory"):
        find_scan(tmp_path / "absent")
    old = _scan_run(tmp_runs, h200)
    mine = _scan_run(tmp_runs, h200)
    _scan_run(tmp_runs, h200, complete=False)                                 # never an incomplete one
    assert find_scan(None, h200) == mine != old
    assert find_scan(None, a100) is None                                      # never another device's
    other = _scan_run(tmp_runs, a100)
    assert find_scan(None, a100) == other and find_scan() == other            # no device: the latest
    assert find_scan(tmp_path, h200) == tmp_path                              # a given one wins


@needs_bundle
def test_load_scan_reads_what_find_scan_finds(tmp_runs, tmp_path):
    from kog.tune.scan_model import load_scan, synthetic_h200, write_scan_dir
    assert load_scan(device_name="NVIDIA H200").source == str(bundled)
    assert load_scan(device_name="NVIDIA A100-SXM4-80GB").source == "synthetic"
    s = synthetic_h200()
    p = write_scan_dir(s.__class__(**{**s.to_dict(), "flag_us": 3.0}), tmp_path / "scan")
    assert load_scan(p).flag_us == 3.0
