"""The bench's baselines on the CPU: the gpt-fast-style fused step computes the reference model, the compiled
systems produce the reference's greedy tokens (torch.compile stood in by the identity: compiling is the GPU
bench's business), and the bench's bookkeeping (near-tie agreement, spread, GPU state)."""
from __future__ import annotations

import pytest
import torch

from kog.engine.config import PRESETS
from kog.engine.reference import Reference
from kog.engine.weights import random_weights
from kog.tune import baselines
from kog.tune.bench import gpu_state, near_tie_agreement
from kog.tune.gptfast import FusedDecoder

TINY = PRESETS["tiny"].replace(dtype="float32")
ARCHS = {"llama": TINY, "qwen2": TINY.replace(arch="qwen2", attention_bias=True),
         "qwen3": TINY.replace(arch="qwen3", qk_norm=True), "mistral": TINY.replace(arch="mistral", sliding_window=6)}
PROMPT = [5, 17, 33, 2, 9, 40, 41]


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_fused_decoder_computes_the_reference_model(arch):
    """Fused q/k/v and gate/up matrices, SDPA with grouped heads over the static cache, the same RoPE: the
    prompt's logits and each decode step's equal the Reference's (float32, so to rounding)."""
    cfg = ARCHS[arch]
    w = random_weights(cfg, "cpu", seed=5, dtype=torch.float32)
    ref, fused = Reference(cfg, w, 32), FusedDecoder(cfg, w, 32)
    with torch.no_grad():
        want = ref.forward_tokens(PROMPT)
        got = fused.forward(torch.tensor(PROMPT), torch.arange(len(PROMPT)))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        tok = torch.tensor([int(want[-1].argmax())])
        for j in range(3):
            pos = torch.tensor([len(PROMPT) + j])
            step_ref = ref.decode_step(tok, pos)
            nxt = fused.step(tok, pos)
            assert int(nxt) == int(step_ref.argmax())
            tok = nxt


@pytest.fixture
def no_compile(monkeypatch):
    """torch.compile as the identity: the systems' loops and caches run eagerly on the CPU."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)


def test_torch_compile_system_follows_the_reference(no_compile):
    cfg = ARCHS["qwen2"]
    w = random_weights(cfg, "cpu", seed=5, dtype=torch.float32)
    want = Reference(cfg, w, 64).greedy(PROMPT, 6)
    s = baselines.TorchCompile(cfg, w, "cpu")
    toks, secs = s.generate(PROMPT, 6)
    assert toks == want and secs > 0
    assert s.generate(PROMPT[:3], 2)[0] == Reference(cfg, w, 64).greedy(PROMPT[:3], 2)   # the cache reused, reset
    assert s.model.max_seq == 64


def test_hf_compile_system_follows_the_reference(no_compile):
    pytest.importorskip("transformers")
    cfg = ARCHS["llama"]
    w = random_weights(cfg, "cpu", seed=5, dtype=torch.float32)
    want = Reference(cfg, w, 64).greedy(PROMPT, 5)
    s = baselines.HFCompile(cfg, w, "cpu")
    assert s.cache_implementation == "static" and "compile_config" in s.generate_kw
    toks, secs = s.generate(PROMPT, 5)
    assert toks == want and secs >= 0


def test_hf_transformers_runs_generate_as_it_comes():
    pytest.importorskip("transformers")
    cfg = ARCHS["qwen3"]
    w = random_weights(cfg, "cpu", seed=5, dtype=torch.float32)
    s = baselines.HFTransformers(cfg, w, "cpu")
    assert s.cache_implementation is None and s.generate_kw == {"disable_compile": True}
    assert s.generate(PROMPT, 4)[0] == Reference(cfg, w, 64).greedy(PROMPT, 4)


def test_greedy_agreement_accepts_a_divergence_only_at_a_near_tie():
    logits = torch.zeros(4, 10)
    logits[:, 0] = 10.0
    logits[2, 1] = 9.99                                   # step 2: a near-tie (gap 1e-3 of the largest)
    ref = [0, 0, 0, 0]
    assert near_tie_agreement([0, 0, 0, 0], ref, logits) == {"first_divergence": None, "greedy_ok": True}
    tie = near_tie_agreement([0, 0, 1, 3], ref, logits)
    assert tie["first_divergence"] == 2 and tie["greedy_ok"] and tie["ref_top2_gap_at_divergence"] < 2e-2
    wrong = near_tie_agreement([0, 5, 0, 0], ref, logits)
    assert wrong["first_divergence"] == 1 and not wrong["greedy_ok"]


def test_gpu_state_is_none_off_the_gpu():
    assert gpu_state("cpu") is None
