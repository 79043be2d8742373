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


def test_read_kernel_reads_every_chunk_once():
    # the CTAs take chunks from an atomic counter: the per-CTA sums add up to the buffer's, whatever the
    # number of chunks against UNROLL (here 11 chunks of 256, taken 4 at a time: the last take is partial)
    x = torch.rand(11 * 256, generator=torch.Generator().manual_seed(3))
    s = bandwidth.read_sum(x, 3, block=256)
    assert s.shape == (3,)
    assert s.sum().item() == pytest.approx(x.sum().item(), rel=1e-5)


def test_read_kernel_skips_ctas_beyond_the_sms_used():
    # without asm the "SM" is the program id: CTAs 2.. stand for SMs beyond n_sms and must do nothing
    x = torch.rand(8 * 128, generator=torch.Generator().manual_seed(4))
    out = torch.full((5,), -1.0)
    counter = torch.zeros(1, dtype=torch.int32)
    bandwidth.launch_read(x, out, counter, n_sms=2, grid=5, use_asm=False, block=128, unroll=2, warps=1)
    assert out[2:].tolist() == [0.0, 0.0, 0.0]
    assert out[:2].sum().item() == pytest.approx(x.sum().item(), rel=1e-5)
    assert counter.item() >= 8


def test_copy_kernel_copies():
    x = torch.rand(9 * 128)
    y = torch.zeros_like(x)
    counter = torch.zeros(1, dtype=torch.int32)
    bandwidth.launch_copy(x, y, counter, n_sms=3, grid=3, use_asm=False, block=128, unroll=4, warps=1)
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
