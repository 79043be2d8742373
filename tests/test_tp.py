"""Tensor parallelism without a GPU: the sharding math (engine/tp.py) against the unsharded reference, and the
per-rank plan with its cross-GPU exchange (engine/tp_plan.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kog.engine.config import PRESETS, ConfigError, ModelConfig
from kog.engine.engine_config import EngineConfig
from kog.engine.reference import Reference
from kog.engine.tp import (TPReference, shard_config, shard_weights, tp_shape, vocab_parallel_pick)
from kog.engine.tp_plan import (T_XPUSH, T_XRED, T_XSAMPLE, XP_O, check_tp_plan, make_tp_plan, plan_summary,
                                task_deps)
from kog.engine.weights import random_weights

_ROPE3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
# Tiny models of each supported architecture, with 4 KV heads so that G = 1, 2, 4 all split them.
TINY = {
    "llama": ModelConfig("llama", 256, 64, 128, 2, 8, 4, 16, rope_scaling=_ROPE3, tie_word_embeddings=True,
                         name="t-llama"),
    "smollm2": ModelConfig("llama", 256, 64, 96, 2, 4, 4, 16, rope_theta=130000.0, tie_word_embeddings=True,
                           name="t-smollm2"),                                      # MHA: kv heads == heads
    "qwen2": ModelConfig("qwen2", 256, 64, 128, 2, 8, 4, 16, rms_norm_eps=1e-6, attention_bias=True,
                         name="t-qwen2"),
    "qwen3": ModelConfig("qwen3", 256, 64, 128, 2, 8, 4, 32, rms_norm_eps=1e-6, qk_norm=True,
                         tie_word_embeddings=True, name="t-qwen3"),               # q_size != hidden
    "mistral": ModelConfig("mistral", 256, 64, 128, 2, 8, 4, 16, sliding_window=5, name="t-mistral"),
}
PROMPT = [7, 101, 33, 250, 5]
FORCED = [12, 200, 77, 3]


def _model(arch):
    cfg = TINY[arch].replace(dtype="float32").validate()
    return cfg, random_weights(cfg, "cpu", seed=11, dtype="float32")


def _teacher_forced(m, cfg):
    """Logits of the prompt's last position, then of decode steps over FORCED tokens."""
    rows = [m.prefill(PROMPT)]
    for j, t in enumerate(FORCED):
        rows.append(m.decode_step(t, len(PROMPT) + j))
    return torch.stack(rows).float()


@pytest.mark.parametrize("G", [1, 2, 4])
@pytest.mark.parametrize("arch", list(TINY))
def test_tp_reference_equals_unsharded(arch, G):
    cfg, w = _model(arch)
    ref = Reference(cfg, w, max_seq=32)
    tp = TPReference(cfg, w, G, max_seq=32)
    a, b = _teacher_forced(ref, cfg), _teacher_forced(tp, cfg)
    assert a.shape == b.shape == (1 + len(FORCED), cfg.vocab_size)
    assert a.std() > 0.5                                                   # not degenerate
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-4)
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    ref.reset()
    tp.reset()
    assert tp.greedy(PROMPT, 6) == ref.greedy(PROMPT, 6)


def test_shards_are_disjoint_slices_that_rebuild_the_weights():
    cfg, w = _model("qwen2")
    G = 4
    sh = [shard_weights(cfg, w, G, r) for r in range(G)]
    sc = shard_config(cfg, G)
    for name in ("layers.1.w_gate", "layers.1.w_up", "lm_head"):
        torch.testing.assert_close(torch.cat([s[name] for s in sh]), w[name], rtol=0, atol=0)
    for name in ("layers.0.wo", "layers.0.w_down"):
        torch.testing.assert_close(torch.cat([s[name] for s in sh], 1), w[name], rtol=0, atol=0)
    # wqkv: each rank's q block then k block then v block; concatenating the blocks by kind rebuilds it
    q = torch.cat([s["layers.0.wqkv"][:sc.q_size] for s in sh])
    k = torch.cat([s["layers.0.wqkv"][sc.q_size:sc.q_size + sc.kv_size] for s in sh])
    v = torch.cat([s["layers.0.wqkv"][sc.q_size + sc.kv_size:] for s in sh])
    torch.testing.assert_close(torch.cat([q, k, v]), w["layers.0.wqkv"], rtol=0, atol=0)
    b = torch.cat([s["layers.0.bqkv"][:sc.q_size] for s in sh])
    torch.testing.assert_close(b, w["layers.0.bqkv"][:cfg.q_size], rtol=0, atol=0)
    assert sh[2]["layers.0.attn_norm"] is w["layers.0.attn_norm"]          # replicated
    assert sc.num_kv_heads == 1 and sc.num_heads == 2 and sc.intermediate_size == 32 and sc.vocab_size == 64


def test_sharding_errors_name_the_field():
    cfg = TINY["llama"]
    with pytest.raises(ConfigError, match="num_key_value_heads.*G=8"):
        tp_shape(cfg, 8)
    with pytest.raises(ConfigError, match="intermediate_size"):
        tp_shape(cfg.replace(intermediate_size=130), 4)
    with pytest.raises(ConfigError, match=r"vocab_size.*pad_vocab=True pads the LM head to 256"):
        tp_shape(cfg.replace(vocab_size=250), 4)
    with pytest.raises(ConfigError, match="positive integer"):
        tp_shape(cfg, 0)
    # the ~2B preset: 20 KV heads do not split over 8 GPUs (issue 7's headline setting)
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        tp_shape(PRESETS["sheared-llama-2.7b"], 8)
    for name in ("llama-3.2-1b", "llama-3.2-3b", "qwen3-1.7b", "smollm2-1.7b"):
        assert tp_shape(PRESETS[name], 8).vocab_per_rank * 8 == PRESETS[name].vocab_size


def test_padded_vocab_never_samples_a_pad_token():
    cfg, w = _model("mistral")
    cfg250 = cfg.replace(vocab_size=250)
    w250 = random_weights(cfg250, "cpu", seed=5, dtype="float32")
    ref = Reference(cfg250, w250, max_seq=32)
    tp = TPReference(cfg250, w250, 4, max_seq=32, pad_vocab=True)
    assert tp.shape.vocab_padded == 256 and tp.shards[3]["lm_head"].shape[0] == 64
    torch.testing.assert_close(tp.prefill([7, 101, 33, 249]), ref.prefill([7, 101, 33, 249]), rtol=1e-5, atol=1e-4)
    # the padded rows score -inf even when every real logit is very negative
    scores = [torch.full((1, 64), -1e30) for _ in range(4)]
    scores[3][0, 60:] = 0.0                              # ids 252..255: padding
    scores[1][0, 5] = -1e29
    assert int(vocab_parallel_pick(scores, tp.shape)[0]) == 64 + 5


def test_vocab_parallel_pick_ties_to_lowest_id():
    shape = tp_shape(TINY["llama"], 4)
    g = torch.Generator().manual_seed(0)
    full = torch.randn(3, 256, generator=g)
    full[1, 200] = full[1, 10] = full[1].max() + 1       # a tie across ranks 0 and 3
    picked = vocab_parallel_pick(list(full.split(64, -1)), shape)
    assert picked.tolist() == full.argmax(-1).tolist() and picked[1] == 10


# ---- the plan -------------------------------------------------------------------------------------------------
ECFG = EngineConfig(sync_rows=32, block_k=64)


@pytest.mark.parametrize("G", [1, 2, 4])
@pytest.mark.parametrize("arch", list(TINY))
def test_tp_plan_invariants(arch, G):
    cfg = TINY[arch]
    p = make_tp_plan(cfg, ECFG, G, sms=3, exchange_rows=16, attn_splits=2)
    check_tp_plan(p)
    xl = p.xl
    assert xl.n_chunks == 4 and (xl.flag_target == G).all()
    for rp in p.ranks:
        t = rp.tasks
        assert ((t[:, 0] == T_XPUSH).sum(), (t[:, 0] == T_XRED).sum(), (t[:, 0] == T_XSAMPLE).sum()) == \
            (2 * cfg.num_layers * 4, 2 * cfg.num_layers * 4, 1)
    # a reduce waits on exactly its own chunk's flag (not the whole vector); a push bumps that flag on every rank
    red = next(t for t in p.ranks[0].tasks if t[0] == T_XRED and t[2] == 2 and t[3] == XP_O and t[1] == 1)
    waits, bumps = task_deps(p, 0, red)
    assert [o for o, _, _ in waits if o[1] == "f"] == [(0, "f", int(xl.flag_layout[1, XP_O]) + 2)]
    push = next(t for t in p.ranks[0].tasks if t[0] == T_XPUSH and t[2] == 2 and t[3] == XP_O and t[1] == 1)
    assert task_deps(p, 0, push)[1] == [(r, "f", int(xl.flag_layout[1, XP_O]) + 2) for r in range(G)]
    bufs = xl.buffers(cfg.num_layers)
    assert bufs["recv"] == ((cfg.num_layers, 2, G, cfg.hidden_size), "float32")


def test_tp_plan_on_a_real_preset():
    p = make_tp_plan(PRESETS["llama-3.2-1b"], EngineConfig(), 2, sms=132, exchange_rows=256)
    check_tp_plan(p, tokens=1)
    s = plan_summary(p)
    assert s["grid"] == 264 and s["chunks_per_point"] == 8
    assert s["tasks_per_rank"]["lm"] == 128256 // 2 // 8


def test_tp_plan_errors():
    with pytest.raises(ConfigError, match="exchange_rows 24 does not divide hidden_size 64"):
        make_tp_plan(TINY["llama"], ECFG, 2, 3, exchange_rows=24)
    with pytest.raises(ConfigError, match="mode 'grid'"):
        make_tp_plan(TINY["llama"], ECFG.replace(mode="grid"), 2, 3, exchange_rows=16)
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        make_tp_plan(TINY["llama"], ECFG, 8, 3, exchange_rows=16)


def _plan():
    return make_tp_plan(TINY["qwen2"], ECFG, 2, sms=3, exchange_rows=16)


def _find(rp, ttype, **kw):
    cols = {"layer": 1, "tile": 2, "aux": 3}
    m = rp.tasks[:, 0] == ttype
    for k, v in kw.items():
        m &= rp.tasks[:, cols[k]] == v
    return int(np.flatnonzero(m)[0])


def test_check_catches_a_dropped_exchange_task():
    p = _plan()
    rp = p.ranks[1]
    i = _find(rp, T_XPUSH, layer=1, tile=3, aux=XP_O)
    rp.tasks = np.delete(rp.tasks, i, axis=0)
    c = int(np.searchsorted(rp.cta_start, i, side="right") - 1)
    rp.cta_start[c + 1:] -= 1
    with pytest.raises(AssertionError, match="rank 1: xpush layer 1 tile 3 point o planned 0 times"):
        check_tp_plan(p)


def test_check_catches_a_duplicated_task():
    p = _plan()
    rp = p.ranks[0]
    i = _find(rp, T_XRED, layer=0, tile=1, aux=XP_O)
    rp.tasks[i + 1 if rp.tasks[i + 1, 0] == T_XRED else i - 1] = rp.tasks[i]
    with pytest.raises(AssertionError, match="rank 0: xred layer 0 tile 1 point o planned 2 times"):
        check_tp_plan(p)


def test_check_catches_a_wrong_flag_target():
    p = _plan()
    p.xl.flag_target[int(p.xl.flag_layout[1, 1]) + 2] = 3        # would wait for a third rank that never comes
    with pytest.raises(AssertionError, match="flag layer 1 point down chunk 2: 2 arrivals a token, target 3"):
        check_tp_plan(p)


def test_check_catches_phase_order_deadlock():
    """A CTA that reduces a chunk before it pushes one of its own (on a CTA that also owns that chunk's O
    tiles) would wait forever with both ranks co-resident: the phase-order check refuses it."""
    p = _plan()
    rp = p.ranks[0]
    lst = rp.tasks_of(0).copy()
    lst = lst[::-1]                                               # reverse CTA 0's list
    rp.tasks[rp.cta_start[0]:rp.cta_start[1]] = lst
    with pytest.raises(AssertionError, match="rank 0 CTA 0: .* after a task of a later phase"):
        check_tp_plan(p)


def test_simulation_finds_a_cross_rank_deadlock():
    """Phase order cannot see a wrong dependency between ranks; the co-resident simulation does: a flag whose
    target counts one push per rank, but a push moved onto the wrong exchange point, never completes."""
    p = _plan()
    rp = p.ranks[1]
    i = _find(rp, T_XPUSH, layer=1, tile=0, aux=1)
    rp.tasks[i, 2] = 1                                            # down chunk 0 pushed as chunk 1: twice, 0 never
    j = _find(rp, T_XPUSH, layer=1, tile=1, aux=1)
    with pytest.raises(AssertionError):
        check_tp_plan(p)
    from kog.engine.tp_plan import simulate_tp
    with pytest.raises(AssertionError, match="deadlock: CTA .* stuck at token 0 on rank . .*waiting on rank . flag "
                                             "layer 1 point down chunk 0"):
        simulate_tp(p, 2)
