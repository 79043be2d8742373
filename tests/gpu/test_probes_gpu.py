"""Probe kernels on a real GPU (run on the device machine: pytest tests/gpu/test_probes_gpu.py).

tests/conftest.py sets TRITON_INTERPRET=1 for the CPU suite, so each check here runs in a child Python
without it (Triton decides interpreter-or-GPU when a kernel is defined).
"""
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PRELUDE = """
import torch
from kog.probe.probes.common import ProbeContext
p = torch.cuda.get_device_properties(0)
ctx = ProbeContext(sms=p.multi_processor_count, l2_bytes=getattr(p, "L2_cache_size", None), quick=True)
"""


def on_gpu(code: str, timeout: int = 120) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]


def test_placement_covers_every_sm():
    on_gpu("""
    from kog.probe.probes import placement
    df = placement.measure(ctx)["placement"]
    first = df[df.launch == 0]
    assert first.smid.nunique() == ctx.sms, first.smid.nunique()
    assert first.smid.between(0, ctx.sms - 1).all()
    """)


def test_chase_levels_ordered():
    on_gpu("""
    from kog.probe.probes import latency
    out = torch.zeros(4, dtype=torch.int64, device="cuda")
    ns = []
    for b in (32 << 10, 4 << 20, 1 << 30):
        buf, start, perm = latency.build_chain(b // 128, "cuda", seed=3)
        buf.sum()
        latency.chase_kernel[(1,)](buf, out, start, 512, 2048, USE_ASM=True, AMD=False, CG=False, num_warps=1)
        c, t, idx, _ = out.tolist()
        p = perm.tolist()
        assert idx // 32 == p[(p.index(start // 32) + 2048 + 512) % len(p)]   # the chase really chased
        ns.append(t / 2048)
    assert ns[0] < ns[1] < ns[2], ns
    """)


def test_barrier_timeout_is_reported_not_hung():
    on_gpu("""
    import time
    from kog.probe.probes import sync
    from kog.probe.probes.common import ProbeTimeout, check_errors
    c = torch.zeros(1, dtype=torch.int32, device="cuda")
    err = torch.zeros(2 * 4, dtype=torch.int32, device="cuda")
    t0 = time.time()
    # NPROG=3 with only 2 programs: the barrier can never complete and must give up after 2000 polls
    sync.barrier_kernel[(2,)](c, err, 3, 2000, NPROG=3, num_warps=1, launch_cooperative_grid=True)
    torch.cuda.synchronize()
    assert time.time() - t0 < 10
    try:
        check_errors(err, "barrier")
        raise AssertionError("no timeout recorded")
    except ProbeTimeout as e:
        assert "grid-barrier" in str(e), e
    """)


def test_signal_subset():
    on_gpu("""
    from kog.probe.probes import signal
    df = signal.measure(ctx)["signal"]
    assert len(df) > 0 and (df.ns > 50).all() and (df.ns < 20000).all(), df.ns.describe()
    """)


def test_read_kernel_sums_correctly():
    on_gpu("""
    from kog.probe.probes import bandwidth
    x = torch.rand(64 * bandwidth.BLOCK, device="cuda")
    s = bandwidth.read_sum(x, 7)
    assert torch.allclose(s.sum(), x.sum(), rtol=1e-4)
    """)


def test_bandwidth_reaches_the_copy_peak():
    # the bar: the probe's read peak within 5% of a device-to-device copy measured in the same run
    on_gpu("""
    from kog.probe.probes import bandwidth
    c = ProbeContext(sms=ctx.sms, l2_bytes=ctx.l2_bytes, quick=False)
    df = bandwidth.measure(c)["bandwidth"]
    ps = bandwidth.peak_summary(df, c.extras["bandwidth"]["torch_copy_GBps"])
    print(ps)
    assert ps["read_over_torch_copy"] >= 0.95, ps
    assert ps["sms_to_saturate_hbm"] is not None and ps["sms_to_saturate_hbm"] <= ctx.sms, ps
    """, timeout=300)


def test_launch_host_and_gpu_are_two_figures():
    on_gpu("""
    from kog.probe.probes import sync
    la = sync.measure(ctx)["launch"].set_index("mode")["us"]
    print(la.to_dict())
    assert {"plain", "plain_sync", "graph", "gpu_queued"} <= set(la.index)
    assert 0.3 < la["gpu_queued"] < 10 and la["gpu_queued"] < la["plain"], la.to_dict()
    """, timeout=300)
