"""The tensor-parallel monokernel (engine/tp_monokernel.py, kernel TP=True) under TRITON_INTERPRET=1.

G = 1: the rank's exchange goes to itself (XPUSH stores into its own receive buffer and bumps its own flags,
XRED waits on them, the token's pick goes through the sample slots). G = 2: the two ranks' 1-CTA launches run
in two Python threads, polling each other's CPU buffers (tp_monokernel._interpreted_together); every spin is
bounded and so is every join, and pytest's timeout caps each test.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from kog.engine.config import ConfigError, ModelConfig
from kog.engine.engine_config import EngineConfig
from kog.engine.monokernel import Monokernel, MonokernelError
from kog.engine.reference import Reference
from kog.engine.tp_monokernel import TPMonokernel, check_exchange_rows
from kog.engine.layout import HEAD_LAYER_SHIFT, ROW_HEAD, T_XRED
from kog.engine.tp_plan import XP_O
from kog.engine.weights import random_weights

assert os.environ.get("TRITON_INTERPRET") == "1"

E = EngineConfig(block_k=64, bn_qkv=16, bn_o=16, bn_gate_up=16, bn_down=16, bn_lm=64, attn_block=16,
                 sync_rows=32)
TINY = {
    "llama": ModelConfig("llama", 256, 64, 128, 2, 8, 4, 16, name="t-llama"),
    "qwen2": ModelConfig("qwen2", 256, 64, 128, 2, 8, 4, 16, rms_norm_eps=1e-6, attention_bias=True,
                         name="t-qwen2"),
    "qwen3": ModelConfig("qwen3", 256, 64, 128, 2, 8, 4, 32, rms_norm_eps=1e-6, qk_norm=True,
                         tie_word_embeddings=True, name="t-qwen3"),
}
PROMPT = [7, 101, 33, 250, 5, 19]


def rel_err(a, b):
    a, b = a.float(), b.float()
    return float(((a - b).abs().max(-1).values / b.abs().max(-1).values).max())


@pytest.mark.parametrize("arch, dtype, tol", [("llama", torch.float32, 1e-5), ("qwen2", torch.float16, 5e-3),
                                              ("qwen3", torch.float16, 5e-3)])
def test_g1_exchange_to_itself_matches_the_unsharded_reference(arch, dtype, tol):
    cfg = TINY[arch].replace(dtype="float32" if dtype == torch.float32 else "float16").validate()
    w = random_weights(cfg, "cpu", seed=5, dtype=dtype)
    ref_tokens = Reference(cfg, w, 64).greedy(PROMPT, 4)
    ref_logits = Reference(cfg, w, 64).teacher_forced_logits(PROMPT, ref_tokens)
    tp = TPMonokernel(cfg, w, 1, E, max_seq=64)
    tp.n_eos = 0
    logits = tp.teacher_forced_logits(PROMPT, ref_tokens)
    assert logits.shape == ref_logits.shape == (4, cfg.vocab_size)
    assert ref_logits.float().std() > 0.1                       # not degenerate
    assert rel_err(logits, ref_logits) < tol
    tokens, _ = tp.generate(PROMPT, 4)
    assert tokens == ref_tokens
    # the exchange really ran: every reduce chunk's flag counted one arrival per decode step
    fl = tp.bufs[0]["flags"].view(-1, tp.plan.xl.flag_stride)[:, 0]
    assert torch.equal(fl, torch.full_like(fl, 4))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("arch, dtype, tol, vocab", [("llama", torch.float32, 1e-5, 256),
                                                     ("qwen3", torch.float16, 5e-3, 256),
                                                     ("llama", torch.float32, 1e-5, 255)])
def test_g2_two_threaded_ranks_match_the_unsharded_reference(arch, dtype, tol, vocab):
    """Real cross-rank traffic: each rank's partial sums land in the other's receive buffer, the sums and the
    picks agree on both ranks (generate raises if their tokens differ). vocab 255 does not
    split over 2 ranks, so the LM head is padded to 256 rows whose logits the kernel masks."""
    cfg = TINY[arch].replace(dtype="float32" if dtype == torch.float32 else "float16", vocab_size=vocab).validate()
    w = random_weights(cfg, "cpu", seed=5, dtype=dtype)
    prompt = [t % vocab for t in PROMPT]
    ref_tokens = Reference(cfg, w, 64).greedy(prompt, 3)
    ref_logits = Reference(cfg, w, 64).teacher_forced_logits(prompt, ref_tokens)
    tp = TPMonokernel(cfg, w, 2, E, max_seq=64, pad_vocab=vocab % 2 != 0)
    tp.n_eos = 0
    assert rel_err(tp.teacher_forced_logits(prompt, ref_tokens), ref_logits) < tol
    tokens, _ = tp.generate(prompt, 3)
    assert tokens == ref_tokens
    for b in tp.bufs:     # both ranks' chunk flags saw 2 arrivals per token
        fl = b["flags"].view(-1, tp.plan.xl.flag_stride)[:, 0]
        assert torch.equal(fl, torch.full_like(fl, 2 * 3))
    # rank 1's receive buffer holds rank 0's partials (nonzero) next to its own
    assert b["recv"][:, :, 0].abs().sum() > 0 and b["recv"][:, :, 1].abs().sum() > 0


def test_g1_seeded_sampling_equals_the_single_gpu_kernel():
    """Gumbel noise is keyed by the global token id and the real vocabulary: G=1 draws what Monokernel draws."""
    cfg = TINY["llama"].replace(dtype="float32").validate()
    w = random_weights(cfg, "cpu", seed=2, dtype=torch.float32)
    mk = Monokernel(cfg, w, E, max_seq=64)
    mk.n_eos = 0
    tp = TPMonokernel(cfg, w, 1, E, max_seq=64)
    tp.n_eos = 0
    a, _ = mk.generate(PROMPT, 4, temperature=1.3, seed=9)
    b, _ = tp.generate(PROMPT, 4, temperature=1.3, seed=9)
    assert a == b


def test_a_flag_that_never_fills_is_an_error_naming_rank_flag_and_task():
    """Point a reduce task at a flag nobody bumps in time (layer 1's, from layer 0): the bounded spin gives up
    and the host raises one line naming the rank, the flag and the task, instead of hanging."""
    cfg = TINY["llama"].replace(dtype="float32").validate()
    w = random_weights(cfg, "cpu", seed=3, dtype=torch.float32)
    tp = TPMonokernel(cfg, w, 1, E.replace(wait_timeout_s=1.0), max_seq=64)
    rk = tp.ranks[0]
    t = rk.plan.tasks
    row = int(np.flatnonzero((t[:, 0] == T_XRED) & (t[:, 1] == 0) & (t[:, 2] == 0) & (t[:, 3] == XP_O))[0])
    rk.rows[row, ROW_HEAD] += 1 << HEAD_LAYER_SHIFT        # its row now says layer 1: it polls layer 1's flag
    with pytest.raises(MonokernelError, match=r"rank 0: a wait timed out on rank 0 flag layer 1 point o chunk 0 "
                                              r"in task \d+ \(xred layer 0 tile 0 point o"):
        tp.generate(PROMPT, 2)


def test_configuration_errors_are_one_line():
    cfg = TINY["llama"].replace(dtype="float32").validate()
    w = random_weights(cfg, "cpu", seed=3, dtype=torch.float32)
    with pytest.raises(ConfigError, match="not supported with tensor parallelism"):
        TPMonokernel(cfg, w, 1, E.replace(mode="grid"), max_seq=64)
    with pytest.raises(ConfigError, match="KV heads do not split"):
        TPMonokernel(cfg, w, 8, E, max_seq=64)
    with pytest.raises(ConfigError, match="exchange_rows 64 does not divide the 32 rows"):
        check_exchange_rows(cfg, E, 64)
    with pytest.raises(ConfigError, match="multiple of bn_o"):
        check_exchange_rows(cfg, E, 8)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("arch, dtype", [("llama", torch.float32), ("qwen3", torch.float16)])
def test_single_gpu_tp_compat_equals_two_ranks_bit_for_bit(arch, dtype):
    """EngineConfig.tp_compat=G: the single-GPU kernel reduces O and down as G ranks do (each rank's K slice
    rounded, the slices added in rank order), so its logits and tokens equal TPMonokernel's with G ranks
    exactly; without it they differ in the last bits (one K loop), which is what breaks greedy-token identity
    on long bf16 runs (docs/tp-notes.md)."""
    cfg = TINY[arch].replace(dtype="float32" if dtype == torch.float32 else "float16").validate()
    w = random_weights(cfg, "cpu", seed=11, dtype=dtype)
    ref_tokens = Reference(cfg, w, 64).greedy(PROMPT, 3)
    e = E.replace(block_k=32)          # two chunks per rank slice: the slice loop matters
    tp = TPMonokernel(cfg, w, 2, e, max_seq=64)
    tp.n_eos = 0
    want = tp.teacher_forced_logits(PROMPT, ref_tokens)
    tp_tokens, _ = tp.generate(PROMPT, 3)
    one = Monokernel(cfg, w, e.replace(tp_compat=2), max_seq=64)
    one.n_eos = 0
    got = one.teacher_forced_logits(PROMPT, ref_tokens)
    assert torch.equal(got, want)
    assert one.generate(PROMPT, 3)[0] == tp_tokens
    plain = Monokernel(cfg, w, e, max_seq=64)
    plain.n_eos = 0
    assert not torch.equal(plain.teacher_forced_logits(PROMPT, ref_tokens), want)


def test_tp_compat_must_divide_the_heads():
    cfg = TINY["llama"].replace(dtype="float32").validate()
    with pytest.raises(ConfigError, match="tp_compat 8 must divide the KV heads"):
        E.replace(tp_compat=8).validate(cfg)


def test_interpreted_rank_failure_names_the_root_error():
    """The interpreter wraps each nested device call's error in InterpreterError(repr(inner)): a failing rank's
    message names the innermost error, not a repr escaped once a level and cut in the middle."""
    from triton.runtime.interpreter import InterpreterError

    from kog.engine.tp_monokernel import _innermost

    try:
        try:
            try:
                raise ValueError("the root")
            except ValueError as e:
                raise InterpreterError(repr(e)) from e
        except InterpreterError as e:
            raise InterpreterError(repr(e)) from e
    except InterpreterError as e:
        assert _innermost(e) == "ValueError: the root"
