"""Probe kernels that do not spin across programs, run by Triton's CPU interpreter on tiny shapes
(tests/conftest.py sets TRITON_INTERPRET=1; %smid / clock asm is switched off by USE_ASM=False)."""
import numpy as np
import pytest
import torch

from kog.probe.probes import bandwidth, l2map, latency, placement
from kog.probe.probes.common import ProbeContext, interpreting

pytestmark = pytest.mark.skipif(not interpreting(), reason="interpreter tests")


def test_pointer_chase_follows_the_permutation():
    buf, start, perm = latency.build_chain(48, "cpu", seed=7)
    p = perm.tolist()
    assert sorted(p) == list(range(48))
    out = torch.zeros(4, dtype=torch.int64)
    for warm, steps in ((0, 5), (3, 100)):
        latency.chase_kernel[(1,)](buf, out, start, warm, steps, USE_ASM=False, AMD=False, CG=False, num_warps=1)
        assert out[2].item() // 32 == p[(p.index(start // 32) + warm + steps) % 48]
        assert out[0].item() == 0     # no clock without asm
    latency.chase_kernel[(1,)](buf, out, start, 0, 7, USE_ASM=False, AMD=False, CG=True, num_warps=1)
    assert out[2].item() // 32 == p[(p.index(start // 32) + 7) % 48]


def test_read_kernel_sums_random_data():
    x = torch.rand(5 * 256, generator=torch.Generator().manual_seed(3))
    s = bandwidth.read_sum(x, 3, block=256)
    assert s.shape == (3,)
    assert s.sum().item() == pytest.approx(x.sum().item(), rel=1e-5)
    assert s[0].item() == pytest.approx((x[:256].sum() + x[768:1024].sum()).item(), rel=1e-5)


def test_copy_kernel_copies():
    x = torch.rand(4 * 128)
    y = torch.zeros_like(x)
    bandwidth.copy_kernel[(3,)](x, y, 4, BLOCK=128)
    assert torch.equal(x, y)


def test_l2map_regions_and_claims():
    ctx = ProbeContext(sms=3, quick=True)
    for rb, lpr in ((128, 1), (1024, 4)):
        buf, starts = l2map.build_regions(5, rb, lpr, "cpu")
        # each region's lines form one cycle of length lpr inside the region
        for r, s in enumerate(starts.tolist()):
            seen, i = set(), s
            for _ in range(lpr):
                seen.add(i)
                i = buf[i].item()
            assert i == s and len(seen) == lpr
            assert all(r * rb // 4 <= j < (r + 1) * rb // 4 for j in seen)
        df, _ = l2map.run_map(ctx, "ld_cg", 5, rb, lpr, 2, 1)
        assert set(df.columns) == {"sm", "region", "ns"} and df["region"].nunique() == 5


def test_placement_without_asm_is_program_id():
    ctx = ProbeContext(sms=4, quick=True)
    df = placement.measure(ctx)["placement"]
    first = df[df.launch == 0]
    assert (first.smid.to_numpy() == np.arange(4)).all()
    assert ctx.extras["placement"]["dispatch"] == "breadth-first"
