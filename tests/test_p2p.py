"""kogprobe's GPU x GPU probe (probe/probes/p2p.py) without GPUs: its analysis on fake matrices, its clean skip,
multicast kept off, and the ping-pong kernel's control flow in the interpreter (one side, the partner's flag
pre-set, since two GPUs cannot be simulated). The measurement itself needs >= 2 GPUs and is not run here."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch

from kog.probe.probes import p2p
from kog.probe.probes.common import ProbeContext


def _long(m: np.ndarray, col: str, **extra) -> pd.DataFrame:
    n = len(m)
    return pd.DataFrame([{"src": a, "dst": b, col: float(m[a, b]), **extra} for a in range(n) for b in range(n)
                         if not np.isnan(m[a, b])])


def _fake_nvswitch(n=8, seed=0):
    rng = np.random.default_rng(seed)
    bw = 700 + rng.normal(0, 10, (n, n))          # GB/s read+write, every pair through the switch
    np.fill_diagonal(bw, 4000 + rng.normal(0, 50, n))
    lat = 1.6 + rng.normal(0, 0.03, (n, n))
    np.fill_diagonal(lat, np.nan)
    return bw, lat


def test_matrix_round_trip():
    bw, _ = _fake_nvswitch(4)
    m = p2p.to_matrix(_long(bw, "GBps"), "GBps")
    np.testing.assert_allclose(m, bw)
    part = _long(bw, "GBps").query("not (src == 1 and dst == 3)")
    assert np.isnan(p2p.to_matrix(part, "GBps")[1, 3])


def test_summary_of_a_uniform_fabric():
    bw, lat = _fake_nvswitch()
    s = p2p.summarize(_long(bw, "GBps"), _long(lat, "us", method="triton-flag"))
    assert s["gpus"] == 8 and s["uniform"]
    assert 650 < s["p2p_GBps_min"] <= s["p2p_GBps_median"] <= s["p2p_GBps_max"] < 750
    assert 3800 < s["local_GBps_median"] < 4200          # the diagonal is kept apart from the peer pairs
    assert s["slow_bandwidth_pairs"] == [] and s["slow_latency_pairs"] == []
    assert abs(s["oneway_us_median"] - 1.6) < 0.05 and s["latency_method"] == ["triton-flag"]


def test_summary_finds_slow_and_asymmetric_pairs():
    bw, lat = _fake_nvswitch(4, seed=1)
    bw[2, 3] = 200.0                                     # one degraded direction (e.g. a PCIe hop)
    lat[0, 1] = lat[1, 0] = 5.0
    s = p2p.summarize(_long(bw, "GBps"), _long(lat, "us", method="torch-copy-4B"))
    assert not s["uniform"]
    assert s["slow_bandwidth_pairs"] == [(2, 3)]
    assert s["p2p_asymmetry"] > 0.6
    assert s["slow_latency_pairs"] == [(0, 1), (1, 0)]


def test_skips_cleanly_without_two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    said = []
    ctx = ProbeContext(sms=132, progress=said.append)
    assert p2p.measure(ctx) == {}
    assert ctx.extras["p2p"]["skipped"] == "p2p: skipped, needs >= 2 GPUs and this host has 1"
    assert said == [ctx.extras["p2p"]["skipped"]]
    assert p2p.skip_reason(0).endswith("this host has 0") and p2p.skip_reason(2) is None


def test_multicast_is_off_after_import():
    for k, v in p2p.MULTICAST_OFF.items():
        assert os.environ[k] == v
    assert p2p.MULTICAST_OFF == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                 "NVSHMEM_DISABLE_NVLS": "1"}


@pytest.mark.parametrize("ping", [True, False])
def test_pingpong_kernel_one_side_in_the_interpreter(ping):
    """The partner has (as if) already answered every step: this side must run all iters without a timeout
    and leave the partner's flag at its last send."""
    iters = 5
    mine = torch.zeros(p2p.PAD, dtype=torch.int32)
    mine[0] = 2 * iters + 2
    peer = torch.zeros(p2p.PAD, dtype=torch.int32)
    out = torch.zeros(3, dtype=torch.int64)
    p2p.pingpong_kernel[(1,)](mine, peer, out, iters, 100, PING=ping, USE_ASM=False, num_warps=1)
    assert int(out[2]) == 0
    assert int(peer[0]) == (2 * iters - 1 if ping else 2 * iters)


def test_pingpong_kernel_times_out_instead_of_hanging():
    mine = torch.zeros(p2p.PAD, dtype=torch.int32)       # the partner never answers
    peer = torch.zeros(p2p.PAD, dtype=torch.int32)
    out = torch.zeros(3, dtype=torch.int64)
    p2p.pingpong_kernel[(1,)](mine, peer, out, 4, 50, PING=True, USE_ASM=False, num_warps=1)
    assert int(out[2]) == 1 and int(peer[0]) == 1        # gave up at step 1, sent nothing after
