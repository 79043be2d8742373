"""Simulator: calibrated to the H200 anchors, deterministic, sensible, reads scan directories."""
import math

import pytest

from kog.engine.config import preset
from kog.engine.engine_config import EngineConfig
from kog.tune import simulator as sim
from kog.tune.scan_model import load_scan, scan_from_dir, synthetic_h200, write_scan_dir

M = preset("llama-3.2-1b")


@pytest.mark.skipif(sim.anchor_path() is None, reason="anchor file not present (set KOG_ANCHORS_DIR)")
def test_calibration_error_against_anchors():
    e = sim.calibration_error()
    assert e["rows"] >= 20
    assert e["median_abs_pct"] < 8.0, e
    # a wrong parameter set must show up as a large error (the check can fail)
    bad = sim.calibration_error(sim.SimParams(lat_us=5.0, cta_gbps=5.0))
    assert bad["median_abs_pct"] > 30


def test_deterministic_and_breakdown_adds_up():
    scan = synthetic_h200()
    a = sim.predict(M, EngineConfig(), scan)
    b = sim.predict(M, EngineConfig(), scan)
    assert a == b and a.feasible
    assert math.isclose(sum(a.breakdown.values()), a.seconds_per_token, rel_tol=1e-9)
    limit = scan.peak_gbps * 1e9 / M.weight_bytes_per_token()
    assert 0.3 * limit < a.tok_per_s < limit


def test_grid_pays_barriers_targeted_pays_waits():
    scan = synthetic_h200()
    g = sim.predict(M, EngineConfig(mode="grid"), scan)
    t = sim.predict(M, EngineConfig(mode="targeted"), scan)
    assert g.breakdown["barrier"] > 0 and g.breakdown["waiting"] == 0
    assert t.breakdown["barrier"] == 0 and t.breakdown["waiting"] > 0
    assert t.tok_per_s > g.tok_per_s


def test_tiny_tiles_underfill_and_residency_fails():
    scan = synthetic_h200()
    small = sim.predict(M, EngineConfig(block_k=256, bn_qkv=1, bn_o=1, bn_gate_up=1, bn_down=1, bn_lm=1,
                                        ctas_per_sm=1), scan)
    assert small.tok_per_s < 0.6 * sim.predict(M, EngineConfig(ctas_per_sm=2), scan).tok_per_s
    big = sim.predict(M, EngineConfig(num_warps=8, ctas_per_sm=4), scan)
    assert not big.feasible and "cooperative launch" in big.reason


def test_scan_dir_roundtrip(tmp_path):
    s = synthetic_h200()
    p = write_scan_dir(s.__class__(**{**s.to_dict(), "flag_us": 2.5}), tmp_path / "scan")
    r = scan_from_dir(p)
    assert r.flag_us == 2.5 and r.sms == 132 and r.source == str(p)
    assert abs(r.bandwidth_gbps(132) - s.bandwidth_gbps(132)) < 1e-6
    # a slower flag costs targeted mode time
    assert sim.predict(M, EngineConfig(), r).tok_per_s < sim.predict(M, EngineConfig(), s).tok_per_s
    assert load_scan(p).flag_us == 2.5


def test_trial_error_measures_against_rows():
    scan = synthetic_h200()
    cfg = EngineConfig(ctas_per_sm=2)
    pred = sim.predict(M, cfg, scan).tok_per_s
    rows = [{**cfg.to_dict(), "tok_per_s": pred * 1.1}, {**cfg.to_dict(), "tok_per_s": float("nan")}]
    e = sim.trial_error(rows, M, scan)
    assert e["n"] == 1 and abs(e["median_abs_pct"] - 100 * (1 - 1 / 1.1)) < 1e-6
