"""Probe kernels on a real GPU (run on the device machine: pytest -m gpu tests/gpu/test_probes_gpu.py)."""
import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def ctx():
    from kog.probe.probes.common import ProbeContext
    p = torch.cuda.get_device_properties(0)
    return ProbeContext(sms=p.multi_processor_count, l2_bytes=getattr(p, "L2_cache_size", None), quick=True)


def test_placement_covers_every_sm(ctx):
    from kog.probe.probes import placement
    df = placement.measure(ctx)["placement"]
    first = df[df.launch == 0]
    assert first.smid.nunique() == ctx.sms
    assert first.smid.between(0, ctx.sms - 1).all()


def test_chase_levels_ordered(ctx):
    from kog.probe.probes import latency
    out = torch.zeros(4, dtype=torch.int64, device="cuda")
    ns = []
    for b in (32 << 10, 8 << 20, 512 << 20):
        buf, start, perm = latency.build_chain(b // 128, "cuda", seed=3)
        buf.sum()
        latency.chase_kernel[(1,)](buf, out, start, 512, 2048, USE_ASM=True, AMD=False, CG=False, num_warps=1)
        c, t, idx, _ = out.tolist()
        p = perm.tolist()
        assert idx // 32 == p[(p.index(start // 32) + 2048 + 512) % len(p)]   # the chase really chased
        ns.append(t / 2048)
    assert ns[0] < ns[1] < ns[2], ns


def test_barrier_timeout_is_reported_not_hung(ctx):
    from kog.probe.probes import sync
    from kog.probe.probes.common import ProbeTimeout, check_errors
    import time
    c = torch.zeros(1, dtype=torch.int32, device="cuda")
    err = torch.zeros(2 * 4, dtype=torch.int32, device="cuda")
    t0 = time.time()
    # NPROG=3 with only 2 programs: the barrier can never complete and must give up after 2000 polls
    sync.barrier_kernel[(2,)](c, err, 3, 2000, NPROG=3, num_warps=1, launch_cooperative_grid=True)
    torch.cuda.synchronize()
    assert time.time() - t0 < 10
    with pytest.raises(ProbeTimeout, match="grid-barrier"):
        check_errors(err, "barrier")


def test_signal_subset(ctx):
    from kog.probe.probes import signal
    from kog.probe.probes.common import ProbeContext
    df = signal.measure(ProbeContext(sms=ctx.sms, quick=True))["signal"]
    assert len(df) > 0 and (df.ns > 50).all() and (df.ns < 20000).all()


def test_read_kernel_sums_correctly():
    from kog.probe.probes import bandwidth
    x = torch.rand(64 * bandwidth.BLOCK, device="cuda")
    s = bandwidth.read_sum(x, 7)
    assert torch.allclose(s.sum(), x.sum(), rtol=1e-4)
