"""In-kernel sampling (engine/kernel/sampling.py), run through the same Triton helpers the monokernel uses.

Top-k / top-p run the monokernel's search with several CTAs simulated by one program (sample_tokens' `ctas`):
each CTA counts over its own slice of the vocabulary and the rounds meet through the same sums and arrival
words as on the GPU. The reference is kog.engine.reference.sample_next."""
from __future__ import annotations

import pytest
import torch

from kog.engine import layout as LY
from kog.engine.kernel.sampling import SamplingTimeout, sample_tokens
from kog.engine.monokernel import Monokernel
from kog.engine.reference import sample_next


def logits(v=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(v, generator=g) * 1.5


def reference_probs(lg: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The distribution sample_next draws from (its rules, written out: test_reference_probs_are_sample_next's
    checks that they are the same)."""
    x = lg.double() / temperature
    if 0 < top_k < x.numel():
        x = x.masked_fill(x < torch.topk(x, top_k).values[-1], float("-inf"))
    if top_p < 1.0:
        p = torch.softmax(x, 0)
        order = p.argsort(descending=True)
        before = p[order].cumsum(0) - p[order]
        drop = order[before >= top_p]
        x[drop[drop != order[0]]] = float("-inf")
    return torch.softmax(x, 0)


def chi_square(draws: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """(Pearson statistic, degrees of freedom) of the draws against probs, over the tokens probs keeps."""
    keep = probs > 0
    counts = torch.bincount(draws.long(), minlength=probs.numel()).double()
    expected = probs * draws.numel()
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum()), int(keep.sum()) - 1


# chi-square 0.999 quantiles by degrees of freedom
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12, 9: 27.88, 10: 29.59,
            11: 31.26}


def test_greedy_is_argmax():
    lg = logits(100)
    assert sample_tokens(lg, 3).tolist() == [int(lg.argmax())] * 3


def test_temperature_to_zero_is_greedy():
    lg = logits(100, 1)
    assert set(sample_tokens(lg, 20, temperature=1e-4, seed=5).tolist()) == {int(lg.argmax())}


def test_same_seed_same_tokens():
    lg = logits(64, 2)
    a = sample_tokens(lg, 30, temperature=1.0, seed=7).tolist()
    assert a == sample_tokens(lg, 30, temperature=1.0, seed=7).tolist()
    assert a != sample_tokens(lg, 30, temperature=1.0, seed=8).tolist()


def test_filtered_draws_are_seeded_and_do_not_depend_on_the_grid():
    """The search's sums are integers added in any order: 1, 2 or 5 CTAs find the same threshold, so a seed
    gives the same tokens whatever the grid; another seed other tokens."""
    lg = logits(40, 6)
    a = sample_tokens(lg, 12, temperature=0.8, top_p=0.9, seed=3, ctas=1).tolist()
    assert a == sample_tokens(lg, 12, temperature=0.8, top_p=0.9, seed=3, ctas=2).tolist()
    assert a == sample_tokens(lg, 12, temperature=0.8, top_p=0.9, seed=3, ctas=5).tolist()
    assert a != sample_tokens(lg, 12, temperature=0.8, top_p=0.9, seed=4, ctas=5).tolist()


def test_top_k_never_leaves_the_top_k():
    lg = logits(64, 3)
    top = set(lg.topk(4).indices.tolist())
    got = set(sample_tokens(lg, 40, temperature=2.0, top_k=4, seed=1, ctas=4).tolist())
    assert got <= top and len(got) > 1


def test_top_p_keeps_the_smallest_set_with_the_mass():
    lg = logits(32, 4)
    keep = set(torch.nonzero(reference_probs(lg, 1.0, top_p=0.6)).flatten().tolist())
    got = set(sample_tokens(lg, 40, temperature=1.0, top_p=0.6, seed=2, ctas=3).tolist())
    assert got <= keep and len(got) > 1


def test_ties_at_the_top_k_boundary_stay():
    """As the reference's top-k (>= the k-th value), every token tied with the k-th is kept."""
    lg = torch.tensor([5.0, 4.0, 3.0, 3.0, 3.0, 1.0, 0.5, 0.0, -1.0, 3.0])
    keep = set(torch.nonzero(reference_probs(lg, 1.0, top_k=3)).flatten().tolist())
    assert keep == {0, 1, 2, 3, 4, 9}
    got = set(sample_tokens(lg, 60, temperature=4.0, top_k=3, seed=5, ctas=3).tolist())
    assert got == keep


def test_the_top_token_always_stays():
    lg = logits(24, 7)
    assert sample_tokens(lg, 4, temperature=1.0, top_p=1e-6, seed=1).tolist() == [int(lg.argmax())] * 4
    assert sample_tokens(lg, 4, temperature=1.0, top_k=1, seed=1).tolist() == [int(lg.argmax())] * 4


def test_reference_probs_are_sample_next_s():
    """The test's written-out rules against sample_next's own draws (torch, fast): top-k then top-p of the
    renormalised top-k set."""
    lg = logits(12, 8)
    probs = reference_probs(lg, 0.9, top_k=6, top_p=0.7)
    g = torch.Generator().manual_seed(0)
    draws = torch.tensor([sample_next(lg, 0.9, top_k=6, top_p=0.7, generator=g) for _ in range(4000)])
    stat, dof = chi_square(draws, probs)
    assert set(draws.tolist()) <= set(torch.nonzero(probs).flatten().tolist())
    assert stat < CHI2_999[dof], stat


@pytest.mark.parametrize("T, top_k, top_p, lg_seed, n", [(1.3, 0, 1.0, 8, 1200), (1.5, 4, 1.0, 8, 160),
                                                       (1.0, 0, 0.8, 8, 160), (0.9, 6, 0.8, 12, 160)])
def test_distribution_matches_the_reference_chi_square(T, top_k, top_p, lg_seed, n):
    """Draws (seeded Gumbel-max among the tokens the search keeps, 2 simulated CTAs) follow sample_next's
    distribution: nothing outside the tokens it keeps, Pearson chi-square below the 0.999 quantile over
    them. And it can fail: without filtering the untempered distribution is rejected; with it, a threshold
    one token too high would never draw the boundary token, which the draws contain (with top-k and top-p,
    top-p's mass counted over the whole vocabulary instead of the top-k set would keep two more tokens)."""
    lg = logits(12, lg_seed)
    s = sample_tokens(lg, n, temperature=T, top_k=top_k, top_p=top_p, seed=9, ctas=2)
    probs = reference_probs(lg, T, top_k, top_p)
    assert set(s.tolist()) <= set(torch.nonzero(probs).flatten().tolist())
    stat, dof = chi_square(s, probs)
    assert stat < CHI2_999[dof], stat
    if (top_k, top_p) == (0, 1.0):
        wrong = torch.softmax(lg.double(), 0)
        assert chi_square(s, wrong)[0] > CHI2_999[dof]
    else:
        boundary = int(torch.where(probs > 0, probs, 2.0).argmin())
        assert boundary in s.tolist()


def test_the_search_ends_in_few_rounds_on_model_like_logits():
    """A 1024-token vocabulary of bf16-rounded logits (ties, as the kernel's LM head rounds them): top-p 0.9
    and top-k 50 each find their threshold in a few rounds (one round is 32 candidates)."""
    g = torch.Generator().manual_seed(11)
    lg = (torch.randn(1024, generator=g) * 3).bfloat16().float()
    rounds = torch.zeros(2, dtype=torch.int32)
    for kw in (dict(top_p=0.9), dict(top_k=50)):
        sample_tokens(lg, 2, temperature=0.8, seed=1, ctas=4, rounds=rounds, **kw)
        assert 1 <= int(rounds.max()) <= 4, (kw, rounds.tolist())


def test_the_top_k_search_stops_once_no_token_value_lies_between_its_bounds():
    """Gaussian bf16-rounded logits (the bench's random weights give such flat ones), top-k 100: the round
    whose bracket [lo, hi) holds a single distinct value ends the search (the greatest value below hi is lo),
    three rounds here; waiting for lo's next float to fail took a fourth."""
    for seed, want in ((2, [599, 657]), (3, [508, 220])):
        lg = (torch.randn(1024, generator=torch.Generator().manual_seed(seed)) * 0.9).bfloat16().float()
        rounds = torch.zeros(2, dtype=torch.int32)
        out = sample_tokens(lg, 2, temperature=0.8, top_k=100, seed=1, ctas=4, rounds=rounds)
        assert rounds.tolist() == [3, 3], (seed, rounds.tolist())
        assert out.tolist() == want
        assert bool((reference_probs(lg, 0.8, top_k=100)[out.long()] > 0).all())


def test_top_p_mostly_accepts_the_first_draw():
    """Top-p 0.9 tests draws against the nucleus instead of searching for its threshold: on Gaussian
    bf16-rounded logits most draws are accepted in the first round (a search took three rounds a draw), and
    the tokens are the ones the search's threshold gave (the best score within the nucleus either way)."""
    for seed, first in ((2, [648, 657]), (3, [974, 220])):
        lg = (torch.randn(1024, generator=torch.Generator().manual_seed(seed)) * 0.9).bfloat16().float()
        rounds = torch.zeros(24, dtype=torch.int32)
        out = sample_tokens(lg, 24, temperature=0.8, top_p=0.9, seed=1, ctas=4, rounds=rounds)
        assert out.tolist()[:2] == first
        assert bool((reference_probs(lg, 0.8, top_p=0.9)[out.long()] > 0).all())
        assert int((rounds == 1).sum()) >= 20 and int(rounds.max()) <= 2, rounds.tolist()


def test_a_rejection_rules_out_more_than_the_draw():
    """Top-p 1e-6 keeps only the top token: each rejected draw rules out the tokens at or below the highest of
    the round's bounds with enough mass above it (the draw's value and three spread towards the max), so a flat
    1024-token vocabulary takes at most four rounds (the draw's value alone took up to eight here)."""
    lg = (torch.randn(1024, generator=torch.Generator().manual_seed(2)) * 0.9).bfloat16().float()
    rounds = torch.zeros(16, dtype=torch.int32)
    out = sample_tokens(lg, 16, temperature=0.8, top_p=1e-6, seed=1, ctas=4, rounds=rounds)
    assert out.tolist() == [int(lg.argmax())] * 16
    assert int(rounds.max()) <= 4, rounds.tolist()


def test_a_cta_that_never_meets_is_a_named_timeout_not_a_hang():
    """A grid of 3 where one CTA never arrives: the first meeting gives up, recording E_SAMPLE and the
    arrivals it saw (2 of 3); the launcher names the wait."""
    with pytest.raises(SamplingTimeout) as e:
        sample_tokens(logits(16, 2), 1, temperature=1.0, top_p=0.9, ctas=2, absent=1)
    assert e.value.record == [1, LY.E_SAMPLE, -1, 3, 2]
    assert "top-k / top-p search" in Monokernel._SPECIAL_WAITS[LY.E_SAMPLE]
