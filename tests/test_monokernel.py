"""The monokernel under TRITON_INTERPRET=1: one CTA runs every task of a tiny model, so the waits are
always satisfied in order and the kernel's math is checked against the plain-torch reference."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from kog.engine.config import PRESETS, ConfigError
from kog.engine.engine_config import EngineConfig
from kog.engine.monokernel import Monokernel, MonokernelError
from kog.engine.reference import Reference
from kog.engine.weights import random_weights

assert os.environ.get("TRITON_INTERPRET") == "1"

TINY = PRESETS["tiny"]          # 2 layers, hidden 64, 4 heads / 2 KV heads (GQA), vocab 512
SMALL_TILES = EngineConfig(block_k=64, bn_qkv=16, bn_o=16, bn_gate_up=16, bn_down=16, bn_lm=64,
                           attn_block=16, sync_rows=32, wait_timeout_s=1.0)


def rel_err(a, b):
    a, b = a.float(), b.float()
    return float(((a - b).abs().max(-1).values / b.abs().max(-1).values).max())


def run_both(cfg, dtype, ecfg, prompt, n=5, max_seq=64):
    """(reference tokens, kernel tokens, max_rel_err) against the oracle: the reference computed in float32
    over the same weights (the kernel prefills with it and keeps float32 activations; kog.engine.kernel)."""
    w = random_weights(cfg, "cpu", seed=3, dtype=dtype)
    ref_tokens = Reference(cfg, w, max_seq, compute_dtype=torch.float32).greedy(prompt, n)
    ref_logits = Reference(cfg, w, max_seq, compute_dtype=torch.float32).teacher_forced_logits(prompt, ref_tokens)
    mk = Monokernel(cfg, w, ecfg, max_seq=max_seq)
    mk.n_eos = 0
    logits = mk.teacher_forced_logits(prompt, ref_tokens)
    tokens, _ = mk.generate(prompt, n)
    return ref_tokens, tokens, rel_err(logits, ref_logits)


@pytest.mark.parametrize("mode", ["targeted", "grid"])
def test_matches_reference_fp32(mode):
    ref, got, err = run_both(TINY, torch.float32, SMALL_TILES.replace(mode=mode), [5, 17, 33, 2, 9])
    assert got == ref
    assert err < 1e-4


@pytest.mark.parametrize("arch, extra", [("qwen3", dict(qk_norm=True)), ("qwen2", dict(attention_bias=True))])
def test_matches_reference_fp16_architectures(arch, extra):
    """fp16 (the interpreter has no bf16): float32 activations over fp16 weights, the fp16 KV cache the only
    rounding: logits within fp16 ulps of the float32 oracle."""
    cfg = TINY.replace(arch=arch, **extra)
    ref, got, err = run_both(cfg, torch.float16, SMALL_TILES, list(range(3, 23)))
    assert got == ref
    assert err < 5e-3
    if arch == "qwen3":     # 7.8e-4 measured; with KOG_HF_ROUNDING=1 (HF's fp16 roundings) 1.6e-3
        assert err < 1.2e-3


def test_long_context_spans_several_attention_splits():
    # 40-token prompt, 16 positions per split: the softmax partials of 3+ splits are merged
    ref, got, err = run_both(TINY, torch.float32, SMALL_TILES, list(range(3, 43)), n=4)
    assert got == ref and err < 1e-4


def test_stops_at_eos():
    w = random_weights(TINY, "cpu", seed=3, dtype=torch.float32)
    prompt = [5, 17, 33]
    first = Reference(TINY, w, 64).greedy(prompt, 1)[0]
    mk = Monokernel(TINY.replace(eos_token_id=(first,)), w, SMALL_TILES, max_seq=64)
    tokens, _ = mk.generate(prompt, 6)
    assert tokens == [first]


def test_sampling_is_seeded():
    w = random_weights(TINY, "cpu", seed=3, dtype=torch.float32)
    mk = Monokernel(TINY, w, SMALL_TILES, max_seq=64)
    mk.n_eos = 0
    a, _ = mk.generate([5, 6, 7], 4, temperature=1.5, seed=11)
    b, _ = mk.generate([5, 6, 7], 4, temperature=1.5, seed=11)
    c, _ = mk.generate([5, 6, 7], 4, temperature=1.5, seed=12)
    assert a == b
    assert a != c


@pytest.mark.parametrize("mode, top_k, top_p", [("targeted", 20, 0.9), ("grid", 20, 0.9), ("targeted", 0, 0.9)])
def test_top_k_top_p_tokens_are_seeded_and_kept_by_the_reference(mode, top_k, top_p):
    """Top-k then top-p inside the kernel (every CTA's search, sampling.filtered_pick), and top-p alone (round
    0's draw tested first): seeded, and each token is one sample_next could draw from the logits it was drawn
    from (teacher-forced along the tokens): test_sampling.reference_probs gives it a positive probability."""
    from test_sampling import reference_probs
    w = random_weights(TINY, "cpu", seed=3, dtype=torch.float32)
    mk = Monokernel(TINY, w, SMALL_TILES.replace(mode=mode), max_seq=64)
    mk.n_eos = 0
    opts = dict(temperature=0.8, top_k=top_k, top_p=top_p)
    a, _ = mk.generate([5, 6, 7], 3, seed=11, **opts)
    assert a == mk.generate([5, 6, 7], 3, seed=11, **opts)[0]
    assert a != mk.generate([5, 6, 7], 3, seed=12, **opts)[0]
    for row, tok in zip(mk.teacher_forced_logits([5, 6, 7], a), a):
        assert reference_probs(row, **opts)[tok] > 0


@pytest.mark.parametrize("ring", [0, 2])
def test_a_vocabulary_bn_lm_does_not_divide(ring):
    """A vocabulary of 1,001 with 64-row LM tiles (as 32,001 with 8: a pad token added): the last tile is
    ragged, the packed head padded with zero rows. Greedy and teacher-forced logits as the reference's; a
    top-k / top-p draw is one the reference could make and never a padded row (their logits would be 0)."""
    from test_sampling import reference_probs
    cfg = TINY.replace(vocab_size=1001, tie_word_embeddings=False)
    e = SMALL_TILES.replace(weight_ring=ring, block_k=128 if ring else SMALL_TILES.block_k)
    ref, got, err = run_both(cfg, torch.float32, e, [5, 17, 33, 2, 9])
    assert got == ref and err < 1e-4
    w = random_weights(cfg, "cpu", seed=4, dtype=torch.float32)
    w["lm_head"][-1].fill_(0.0)            # the last real row: logit 0 like the padding's, so only a mask saves it
    mk = Monokernel(cfg, w, e, max_seq=64)
    mk.n_eos = 0
    opts = dict(temperature=5.0, top_k=0, top_p=0.99)
    drawn, _ = mk.generate([5, 6, 7], 4, seed=2, **opts)
    assert all(0 <= t < 1001 for t in drawn)
    for row, tok in zip(mk.teacher_forced_logits([5, 6, 7], drawn), drawn):
        assert row.shape == (1001,) and reference_probs(row, **opts)[tok] > 0


def test_a_wait_that_can_never_complete_is_an_error_not_a_hang():
    """Corrupt one counter's target: the bounded spin gives up, names the counter and the task."""
    w = random_weights(TINY, "cpu", seed=3, dtype=torch.float32)
    mk = Monokernel(TINY, w, SMALL_TILES, max_seq=64)
    mk.target[mk.plan.layout[1, 0]] = 10_000          # layer 1's first qkv counter
    with pytest.raises(MonokernelError, match=r"qkv of layer 1.*task \d+ \(attn layer 1"):
        mk.generate([5, 6, 7], 2)


@pytest.mark.parametrize("mode, opts", [("targeted", {}), ("grid", {}),
                                        ("targeted", {"temperature": 0.8, "top_p": 0.9})])
def test_logits_that_pick_no_token_abort_instead_of_indexing_past_the_embedding(mode, opts):
    """NaN in the streamed weights after the build (garbage activations do the same): every logit is NaN, and
    each tile's best stays its initial (-inf, id 0), a silent token 0 (top-p: no draw is ever kept). The
    kernel records it and aborts; the host names the step."""
    w = random_weights(TINY, "cpu", seed=3, dtype=torch.float32)
    mk = Monokernel(TINY, w, SMALL_TILES.replace(mode=mode), max_seq=64)
    mk.n_eos = 0
    clean, _ = mk.generate([5, 6, 7], 3)
    packed = mk.wbuf.clone()
    mk.wbuf.fill_(float("nan"))
    with pytest.raises(MonokernelError, match=r"no token could be picked at step 0 .*not finite"):
        mk.generate([5, 6, 7], 3, **opts)
    mk.wbuf.copy_(packed)
    assert mk.generate([5, 6, 7], 3)[0] == clean          # the next launch on the same engine is clean


def test_out_of_memory_at_build_is_one_line_and_frees_what_the_build_allocated(monkeypatch):
    """The GPU running out of memory half way through a build (faked after the weights are packed): one line
    naming it, and no buffer the build allocated stays reachable (tests/gpu/test_faults_gpu.py does it for real)."""
    import gc
    import weakref

    from kog.engine.monokernel import EngineMemoryError
    packed = []

    def alloc_then_fail(self, partials=False):
        packed.append(weakref.ref(self.wbuf))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB.\nmore detail")

    monkeypatch.setattr(Monokernel, "_alloc", alloc_then_fail)
    w = random_weights(TINY, "cpu", seed=3, dtype=torch.float32)
    with pytest.raises(EngineMemoryError) as err:
        Monokernel(TINY, w, SMALL_TILES, max_seq=64)
    msg = str(err.value)
    assert "\n" not in msg and "out of GPU memory" in msg and "Tried to allocate 20.00 GiB" in msg
    assert "out of memory" in msg            # what kogtune's trial isolation files as an "oom" trial
    del err
    gc.collect()
    assert packed and packed[0]() is None


def test_block_k_not_dividing_the_rows():
    """K chunks that overhang the matrices (block_k 128 > hidden 64): the masked first-chunk and in-task
    loads must read nothing past a row."""
    ref, got, err = run_both(TINY, torch.float32, SMALL_TILES.replace(block_k=128, bn_lm=16), [5, 17, 33, 2])
    assert got == ref and err < 1e-4


# K that are multiples of the 128-column chunk (the ring's plain path, the H200 default's), and down's
# K = 320 = 128 + 128 + 64 (a short last step: tight packing, per-chunk copy sizes)
RING_WHOLE = TINY.replace(hidden_size=128, intermediate_size=256, head_dim=32)
RING_SHORT = TINY.replace(intermediate_size=320)
# K = 256 in 128-column chunks for every phase: RMS-normed inputs over two or more K steps (each step's input
# loaded one step ahead, the sum of squares reduced once), with sync_rows 32 waits along K
RING_MULTI = TINY.replace(hidden_size=256, intermediate_size=256, head_dim=64)


EQUAL_BN = dict(bn_qkv=16, bn_o=16, bn_gate_up=16, bn_down=16, bn_lm=16)
WIDE_GU = dict(EQUAL_BN, bn_gate_up=8)        # gate_up's 2 x 8 rows fill a slot as [16, 128]: one chunk per task


@pytest.mark.parametrize("cfg, mode, slots, bns", [(RING_SHORT, "targeted", 2, EQUAL_BN),
                                                   (RING_SHORT, "grid", 3, WIDE_GU),
                                                   (RING_WHOLE, "targeted", 3, WIDE_GU),
                                                   (RING_WHOLE, "grid", 2, EQUAL_BN),
                                                   (RING_MULTI, "targeted", 2, EQUAL_BN)])
def test_weight_ring_matches_reference(cfg, mode, slots, bns):
    """weight_ring: every GEMV reads its weights from the CTA's ring of slots, filled ahead across tasks,
    phases, layers and tokens (interpreter: the ring emulated in global memory, same cursors). down has
    K = 256 or 320 = 2 or 3 chunks of 128, so chunks of one task also follow each other through the slots.
    The task rows come in blocks of 16 through shared memory (the interpreter: a global stand-in), crossing
    blocks and tokens. WIDE_GU: gate_up has half the rows of the other phases, so its chunks are twice as wide
    (chunk_shape): one chunk spans RING_WHOLE's K = 128."""
    from kog.engine.layout import T_DOWN, T_GU, T_LM, T_O, T_QKV
    from kog.engine.ring import chunk_shape, padded_fraction
    bn = {T_QKV: bns["bn_qkv"], T_O: bns["bn_o"], T_GU: bns["bn_gate_up"], T_DOWN: bns["bn_down"],
          T_LM: bns["bn_lm"]}
    dims = dict(H=cfg.hidden_size, I=cfg.intermediate_size, QS=cfg.q_size, block_k=128, bn=bn)
    short = padded_fraction(**dims) > 0
    assert short == (cfg is RING_SHORT)
    assert chunk_shape(T_DOWN, **dims)[1] == 128
    assert chunk_shape(T_GU, **dims)[1] == (64 if bns is EQUAL_BN else min(128, cfg.hidden_size))
    if cfg is RING_MULTI:
        assert chunk_shape(T_QKV, **dims)[1] == 128 < cfg.hidden_size
    e = SMALL_TILES.replace(mode=mode, weight_ring=slots, block_k=128, **bns)
    ref, got, err = run_both(cfg, torch.float32, e, [5, 17, 33, 2, 9])
    assert got == ref and err < 1e-4


@pytest.mark.parametrize("mode", ["targeted", "grid"])
def test_weight_ring_down_input_cache_matches_reference(mode):
    """Down's one chunk spans the intermediate (I = 96 in a 128-column chunk, as sheared-llama-2.7b's 6912 in
    8192): its input is loaded by a CTA's first down task of a layer and kept in registers as fp16 words for
    the others (_gemv_ring's XW). Two layers and several down tasks per CTA: a cache keyed wrongly (another
    layer's or token's input) moves the logits far past this bound."""
    from kog.engine.layout import T_DOWN, T_GU, T_LM, T_O, T_QKV
    from kog.engine.ring import chunk_shape
    cfg = TINY.replace(intermediate_size=96)
    bns = dict(EQUAL_BN, bn_down=4)
    bn = {T_QKV: 16, T_O: 16, T_GU: 16, T_DOWN: 4, T_LM: 16}
    assert chunk_shape(T_DOWN, H=64, I=96, QS=cfg.q_size, block_k=128, bn=bn)[1] >= 96
    e = SMALL_TILES.replace(mode=mode, weight_ring=2, block_k=128, **bns)
    ref, got, err = run_both(cfg, torch.float16, e, list(range(3, 23)))
    assert got == ref and err < 5e-3


def test_six_ring_slots_at_one_cta_per_sm_match_the_reference():
    """The search's largest ring (6 slots, which fit one CTA per SM): more slots than any CTA's chunks of a
    phase, so the ring runs ahead across phases and layers; greedy tokens and logits as the reference's."""
    e = SMALL_TILES.replace(weight_ring=6, block_k=128, ctas_per_sm=1)
    ref, got, err = run_both(TINY, torch.float32, e, [5, 17, 33, 2, 9])
    assert got == ref and err < 1e-4


def test_attn_stamps_record_every_split_of_the_traced_tokens():
    """Monokernel(attn_stamps=True): a traced launch records each attention split's sub-steps for its first
    trace_tokens tokens (kernel._attn_stamp; kog.engine.trace.attn_stamps_table): every split of every layer
    and KV head once per traced token, exactly one of each (token, layer, head) merged, durations >= 0 (the
    interpreter's clocks read 0); the default Monokernel keeps the stamps off."""
    from kog.engine.trace import ATTN_STEPS, attn_stamps_table
    w = random_weights(TINY, "cpu", seed=3, dtype=torch.float32)
    e = SMALL_TILES.replace(attn_block=16)
    mk = Monokernel(TINY, w, e, max_seq=64, trace_tokens=2, attn_stamps=True)
    mk.n_eos = 0
    mk.generate(list(range(5, 25)), 3, trace=True)
    t = attn_stamps_table(mk._last_atr, mk.plan)
    S = mk.attn_splits
    assert len(t) == 2 * TINY.num_layers * TINY.num_kv_heads * S
    assert sorted(t["step"].unique().tolist()) == [0, 1]
    assert (t.groupby(["step", "layer", "kv_head"])["merged"].sum() == 1).all()
    assert (t[[f"{k}_ns" for k in ATTN_STEPS]] >= 0).all().all()
    assert set(t["split"]) == set(range(S))
    assert not Monokernel(TINY, w, e, max_seq=64).attn_stamps


def test_trace_table_times_the_publish_before_each_task():
    """A task record's last two fields (kernel/trace.py trace_task) time the publish right before the task: the
    table gives its length (start - publish start) and its CTA barrier's (barrier end - publish start); a
    record whose barrier end is 0 published nothing. The interpreter's clocks read 0, so the records are built
    here; a traced launch allocates records of TASK_RECORD fields."""
    from kog.engine.kernel.trace import TASK_RECORD
    from kog.engine.plan import make_plan
    from kog.engine.trace import TABLE_COLUMNS, trace_table
    plan = make_plan(TINY, SMALL_TILES, 2)
    rec = np.zeros((plan.grid, 2, TASK_RECORD.value), dtype=np.int64)
    rec[0, 0] = [1_000, 2_000, 0, 0, 900, 0]                      # task 0: nothing published before it
    rec[0, 1] = [5_000, 6_000, 100, 1, 2_000, 2_400]              # task 1: a 3 us publish, 0.4 us of barrier
    t = trace_table(rec, plan)
    assert list(t.columns) == TABLE_COLUMNS
    assert t["publish_ns"].tolist() == [0, 3_000] and t["publish_barrier_ns"].tolist() == [0, 400]
    w = random_weights(TINY, "cpu", seed=3, dtype=torch.float32)
    assert Monokernel(TINY, w, SMALL_TILES, max_seq=64, trace_tokens=1).trace.shape[-1] == TASK_RECORD.value


@pytest.mark.parametrize("mode, block, tile, prompt", [("targeted", 32, 16, list(range(5, 25))),
                                                       ("grid", 64, 16, list(range(3, 40)))])
def test_attn_tile_splits_walk_tiles(mode, block, tile, prompt):
    """attn_tile: a split covers attn_block positions in tiles of attn_tile (the next tile's K/V loaded during
    the current one). Positions 20-24 and 37-41: a full first tile, then the new position in the second or
    third of the split's tiles: same tokens and logits as the float32 reference."""
    ref, got, err = run_both(TINY, torch.float32, SMALL_TILES.replace(mode=mode, attn_block=block, attn_tile=tile),
                             prompt)
    assert got == ref and err < 1e-4
    with pytest.raises(ConfigError, match="attn_tile"):
        EngineConfig(attn_block=32, attn_tile=64).validate(TINY)
    with pytest.raises(ConfigError, match="attn_tile"):
        EngineConfig(attn_block=32, attn_tile=24).validate(TINY)


@pytest.mark.parametrize("window", [None, 24])
def test_splits_join_the_merge_as_the_cache_fills(window):
    """Only splits holding cached positions arrive on the merge's word; the rest of the cache's splits do
    nothing. Positions 13-26 cross a split boundary inside one launch (with a sliding window of 24 the window
    then slides), so the number of arrivals per token changes mid-launch: the last live split must still
    merge every token (a miscount hangs the merge until the bounded wait aborts, or merges too early): same
    tokens and logits as the float32 reference."""
    cfg = TINY.replace(arch="mistral", sliding_window=window) if window else TINY
    for mode in ("targeted", "grid"):
        ref, got, err = run_both(cfg, torch.float32, SMALL_TILES.replace(mode=mode, attn_block=16),
                                 [(3 * i) % 200 for i in range(14)], n=14)
        assert got == ref and err < 1e-4, mode


def test_many_splits_merge_in_groups():
    """A cache of more splits than the merge holds at once (20 splits of 16 positions, over COMBINE_SPLITS):
    the last split to arrive folds the partials group by group with a running max. Positions 279-281 make 18
    splits hold positions, so the second group is partial: same tokens and logits as the float32 reference."""
    from kog.engine.kernel.attention import COMBINE_SPLITS
    e = SMALL_TILES.replace(attn_block=16)
    assert e.attn_layout(320)[1] > COMBINE_SPLITS
    ref, got, err = run_both(TINY, torch.float32, e, [(7 * i) % 500 for i in range(280)], n=2, max_seq=320)
    assert got == ref and err < 1e-4


def test_ring_chunk_width_fills_a_slot():
    """A chunk is a slot's worth of the phase's rows, at most the power of two covering K: with every bn
    equal, block_k (gate_up, whose chunk holds gate and up rows: block_k / 2), as before; a phase with fewer
    rows gets wider chunks (llama-3.2-1b at bn_gate_up 4: one [8, 2048] chunk per gate_up task)."""
    from kog.engine.layout import T_DOWN, T_GU, T_LM, T_O, T_QKV
    from kog.engine.ring import chunk_shape, kernel_chunk_cols
    m = PRESETS["llama-3.2-1b"]
    dims = dict(H=m.hidden_size, I=m.intermediate_size, QS=m.q_size, block_k=2048)
    eq = {t: 8 for t in (T_QKV, T_O, T_GU, T_DOWN, T_LM)}
    assert kernel_chunk_cols(**dims, bn=eq) == dict(BKC_QKV=2048, BKC_O=2048, BKC_GU=1024, BKC_DOWN=2048, BKC_X=2048,
                                                    BKC_LM=2048)
    assert chunk_shape(T_GU, **dims, bn={**eq, T_GU: 4}) == (2048, 2048, 8)
    assert chunk_shape(T_DOWN, **dims, bn={**eq, T_DOWN: 4}) == (8192, 4096, 4)
    assert chunk_shape(T_O, **dims, bn={**eq, T_O: 2}) == (2048, 2048, 2)       # capped at K
    q = PRESETS["qwen2.5-1.5b"]                                                       # K = 1536: one short step
    assert chunk_shape(T_QKV, H=q.hidden_size, I=q.intermediate_size, QS=q.q_size, block_k=2048, bn=eq)[:2] == \
        (1536, 2048)


def test_weight_ring_order_packing_and_validation():
    """ring_order lists each CTA's chunks in consumption order (attention tasks have none); the packed weights
    hold natural chunk order[i] at slot i: the tile's rows x one K step (gate_up: gate rows then up rows),
    zero-padded to whole K steps and to one slot."""
    from kog.engine.layout import T_ATTN, T_DOWN, T_GU, T_LM, T_O, T_QKV
    from kog.engine.ring import natural_bases, pack_ring_weights, ring_bytes, ring_chunk_bytes, ring_order, slot_elems
    cfg = TINY.replace(intermediate_size=320)          # down: K = 320 = 128 + 128 + a 64-column tail
    w = random_weights(cfg, "cpu", seed=1)
    bn = {T_QKV: 8, T_O: 8, T_GU: 8, T_DOWN: 8, T_LM: 8}
    H, I, QS = cfg.hidden_size, cfg.intermediate_size, cfg.q_size
    tiles = {T_QKV: cfg.qkv_size // 8, T_O: H // 8, T_GU: I // 8, T_DOWN: H // 8, T_LM: cfg.vocab_size // 8}
    tasks = np.array([[T_QKV, 1, 3], [T_ATTN, 1, 0], [T_GU, 0, 5], [T_DOWN, 1, 2], [T_LM, 2, 1]])
    order, lo = ring_order(tasks, np.array([0, 3, 5]), num_layers=2, n_tiles=tiles, H=H, I=I, QS=QS, block_k=128,
                           bn=bn)
    base = natural_bases(2, tiles, dict(H=H, I=I, QS=QS), 128, bn)
    assert lo.tolist() == [0, 2, 6]
    assert order.tolist() == [base[(1, T_QKV)] + 3, base[(0, T_GU)] + 5, base[(1, T_DOWN)] + 6,
                              base[(1, T_DOWN)] + 7, base[(1, T_DOWN)] + 8, base[(2, T_LM)] + 1]
    slot = slot_elems(block_k=128, bn=bn)
    assert slot == 8 * 128
    packed = pack_ring_weights(w, 2, order, block_k=128, bn=bn).view(len(order), slot)
    L0, L1 = w.layer(0), w.layer(1)
    q = packed[0, :8 * 64].view(8, 64)               # K = 64: a 64-column chunk (the power of two covering K)
    assert torch.equal(q, L1["wqkv"][24:32]) and not packed[0, 8 * 64:].any()
    gu = torch.cat([L0["w_gate"][40:48], L0["w_up"][40:48]])                    # bk / 2 = 64 = H
    assert torch.equal(packed[1, :16 * 64], gu.reshape(-1))
    assert torch.equal(packed[4, :8 * 128].view(8, 128)[:, :64], L1["w_down"][16:24, 256:])   # the tail
    assert not packed[4, :8 * 128].view(8, 128)[:, 64:].any()
    assert torch.equal(packed[5, :8 * 64].view(8, 64), w["lm_head"][8:16])
    # tight: a short last K step is stored densely ([rows, ne] at the chunk's start) and copied at its size
    tight = pack_ring_weights(w, 2, order, block_k=128, bn=bn, tight=True).view(len(order), slot)
    assert torch.equal(tight[4, :8 * 64].view(8, 64), L1["w_down"][16:24, 256:]) and not tight[4, 8 * 64:].any()
    assert torch.equal(tight[2], packed[2]) and torch.equal(tight[0], packed[0])      # whole steps: unchanged
    sizes = ring_chunk_bytes(tasks, np.array([0, 3, 5]), H=H, I=I, QS=QS, block_k=128, bn=bn)
    assert sizes.tolist() == [8 * 64 * 2, 16 * 64 * 2, 8 * 128 * 2, 8 * 128 * 2, 8 * 64 * 2, 8 * 64 * 2]
    assert ring_bytes(3, block_k=128, bn=bn) == 1024 + 3 * slot * 2
    with pytest.raises(ConfigError, match="weight_ring"):
        EngineConfig(weight_ring=2, block_k=64).validate(TINY)
    assert EngineConfig(weight_ring=3, block_k=128).validate(TINY).weight_ring == 3


def test_weight_ring_defaults_and_shared_memory_budget():
    """sm90_default takes the ring with as many slots (3, else 2) as the SM's shared memory holds for two CTAs
    (Triton's own grows with attn_block x head_dim: sheared-llama-2.7b's 3 slots failed at launch on the
    H200); validate() refuses a ring that cannot fit."""
    from kog.engine.engine_config import SM90_DEFAULT, sm90_default
    from kog.engine.ring import padded_fraction
    assert sm90_default(PRESETS["llama-3.2-1b"]) == EngineConfig(**SM90_DEFAULT)
    sheared = PRESETS["sheared-llama-2.7b"]
    # sheared's K = 2560 leaves a short step in 2048-column chunks: one chunk spanning K in every phase
    assert sm90_default(sheared) == EngineConfig(**dict(SM90_DEFAULT, weight_ring=3, attn_tile=32, block_k=4096,
                                                        bn_qkv=4, bn_o=4, bn_gate_up=2, bn_down=2, bn_lm=4))
    assert sm90_default(PRESETS["qwen2.5-1.5b"]).bn_gate_up == 4                  # K = 1536: one chunk
    with pytest.raises(ConfigError, match="does not fit"):
        EngineConfig(**SM90_DEFAULT).validate(sheared)
    assert sm90_default(PRESETS["tiny"].replace(head_dim=4096)) == EngineConfig()   # not even 2 slots
    # a long cache widens the attention block (64 splits at most), and Triton's tile with it: 2 slots then
    m1 = PRESETS["llama-3.2-1b"]
    assert sm90_default(m1, span=4096).weight_ring == 3 and sm90_default(m1, span=8192).weight_ring == 2
    with pytest.raises(ConfigError, match="does not fit"):
        EngineConfig(**SM90_DEFAULT).attn_layout(8192)[0].validate(m1)
    bn = {t: 8 for t in range(6)}
    assert padded_fraction(H=sheared.hidden_size, I=sheared.intermediate_size, QS=sheared.q_size, block_k=2048,
                           bn=bn) == pytest.approx(0.25)
    m = PRESETS["llama-3.2-1b"]
    EngineConfig(weight_ring=3).validate(m)                       # 2 CTAs x ~106 KiB
    with pytest.raises(ConfigError, match="does not fit"):
        EngineConfig(weight_ring=3, ctas_per_sm=3).validate(m)
    with pytest.raises(ConfigError, match="does not fit"):
        EngineConfig(weight_ring=8).validate(m)


def test_span_k_tiling_where_the_hidden_size_leaves_a_short_step():
    """sm90_default changes the tiling only where a hidden-wide phase's chunks leave a partial last step; there
    each phase whose K a chunk of 2+ rows can span gets that chunk (the slot keeps its size); a K no 2-row
    chunk spans keeps its steps. Every config it gives for shapes nobody benched validates."""
    from kog.engine.engine_config import SM90_DEFAULT, fits, sm90_default
    llama8b = PRESETS["llama-3.1-8b"]
    for H, I, heads in [(4096, 14336, 32), (2048, 8192, 16), (1536, 8960, 12), (8192, 28672, 64)]:
        m = llama8b.replace(hidden_size=H, intermediate_size=I, num_heads=heads)
        assert sm90_default(m).block_k == 2048 and sm90_default(m).attn_tile == 0      # whole steps: unchanged
    q7 = llama8b.replace(hidden_size=3584, intermediate_size=18944, num_heads=28, num_kv_heads=4)
    e = sm90_default(q7)
    # qkv / o / gate_up / LM head span 3584 columns; down's 18944 would need one-row chunks: 8 rows, steps
    assert (e.bn_qkv, e.bn_o, e.bn_gate_up, e.bn_down, e.bn_lm, e.block_k) == (4, 4, 2, 8, 4, 2048)
    for H, I, heads in [(3584, 18944, 28), (5120, 13824, 40), (2304, 9216, 18), (2560, 10240, 20), (3072, 8192, 24)]:
        m = llama8b.replace(hidden_size=H, intermediate_size=I, num_heads=heads)
        for span in (None, 320, 8192, 32768):
            e = sm90_default(m, span)
            assert fits(e, m, span) and min(e.bn_qkv, e.bn_o, e.bn_down, e.bn_lm, 2 * e.bn_gate_up) >= 2
    assert sm90_default(PRESETS["llama-3.2-1b"]) == EngineConfig(**SM90_DEFAULT)


def _committed_sweep(name: str) -> dict[str, float]:
    """tok/s of each config of a committed engine A/B (bench/h200/<name>), keyed by its config as the file
    names it (field=value pairs)."""
    import json
    from pathlib import Path
    sweep = json.loads((Path(__file__).resolve().parents[1] / "bench" / "h200" / name).read_text())["sweep"]
    return {k: r["tok_s"] for k, r in sweep.items() if "tok_s" in r}


def _config_key(e: EngineConfig) -> dict[str, str]:
    return {f: str(v) for f, v in e.to_dict().items()}


def _parsed_key(key: str) -> dict[str, str]:
    """A committed sweep's config key (field=value pairs) as _config_key gives it."""
    return dict(kv.split("=", 1) for kv in key.split(","))


@pytest.mark.parametrize("name", ["llama-3.2-3b", "llama-3.1-8b"])
def test_sm90_default_is_the_fastest_config_its_committed_check_measured(name):
    """The committed same-run A/B on the H200 (bench/h200/engine_check_span_*): the rule's config for the
    preset is the fastest one measured there (one chunk spanning K on llama-3.2-3b; the whole-step default
    on llama-3.1-8b, where the span tiling's one-row down chunks spilled registers)."""
    from kog.engine.engine_config import sm90_default
    sweep = _committed_sweep(f"engine_check_span_{name}_2026-12-04.json")
    best = max(sweep, key=sweep.get)
    assert _config_key(sm90_default(PRESETS[name], 640)) == _parsed_key(best)


@pytest.mark.parametrize("name", ["qwen2.5-1.5b", "qwen3-1.7b", "qwen2.5-3b"])
def test_sm90_default_is_within_1pct_of_every_one_knob_change_measured(name):
    """The committed one-knob grids on the H200 (bench/h200/engine_check_knobs_*: ring slots, attention tiles,
    rows per task of each phase halved, block_k, sync_rows, attention splits, the span tiling): the rule's
    config is among them and none measured more than 1% faster."""
    from kog.engine.engine_config import sm90_default
    sweep = _committed_sweep(f"engine_check_knobs_{name}_2026-12-04.json")
    mine = next(k for k in sweep if _parsed_key(k) == _config_key(sm90_default(PRESETS[name], 640)))
    assert len(sweep) >= 8 and max(sweep.values()) <= 1.01 * sweep[mine]


def test_span_k_tiling_matches_reference():
    """A hidden size that is not a multiple of the chunk (160 in 128-column chunks, as 3072 in 2048): the span-K
    tiling's one chunk per task, [4, 256] for qkv / o, gate_up's 2 x 2 rows, down's [4, 256], on the ring,
    gives the reference's tokens."""
    from kog.engine.engine_config import _short_hidden_steps, span_k_tiling
    cfg = TINY.replace(hidden_size=160, num_heads=10, intermediate_size=256, num_layers=1, vocab_size=128)
    e = SMALL_TILES.replace(weight_ring=2, block_k=128, bn_qkv=8, bn_o=8, bn_gate_up=8, bn_down=8, bn_lm=8)
    assert _short_hidden_steps(e, cfg)
    span = span_k_tiling(e, cfg)
    assert span == dict(bn_qkv=4, bn_o=4, bn_gate_up=2, bn_down=4, bn_lm=4, block_k=256)
    ref, got, err = run_both(cfg, torch.float32, e.replace(**span), [5, 17, 33], n=3)
    assert got == ref and err < 1e-4


def test_tagged_qkv_handoff_replaces_the_qkv_counters():
    """With the ring, qkv tasks publish token-tagged words instead of releasing a counter (their release column
    is -1 and nothing waits on the qkv counters: target 0), and the buffer starts every launch zeroed. A tag wait
    that times out is described as such."""
    from kog.engine.layout import BUF_QKV, E_TAG, ROW_RELEASE, T_QKV
    e = SMALL_TILES.replace(weight_ring=2, block_k=128)
    w = random_weights(RING_WHOLE, "cpu", seed=3, dtype=torch.float32)
    mk = Monokernel(RING_WHOLE, w, e, max_seq=64)
    qkv = mk.plan.tasks[:, 0] == T_QKV
    assert mk.tag_qkv and (mk.plan.rows[qkv, ROW_RELEASE] == -1).all()
    lay = mk.plan.layout
    assert not mk.plan.target[lay[0, BUF_QKV]:lay[0, BUF_QKV + 1]].any()
    assert mk.qkvt.numel() == RING_WHOLE.num_layers * RING_WHOLE.qkv_size
    mk.qkvt.fill_(7)
    mk._launch_args(1, 0, 2, None, 0.0, 0, 1.0, 0, False, False)
    assert not mk.qkvt.any()
    assert "tagged qkv" in mk._describe_counter(E_TAG)
    plain = Monokernel(RING_WHOLE, w, e.replace(weight_ring=0), max_seq=64)
    assert not plain.tag_qkv and (plain.plan.rows[plain.plan.tasks[:, 0] == T_QKV, ROW_RELEASE] >= 0).all()


@pytest.mark.parametrize("ring", [0, 2])
def test_bfloat16_weights_in_the_interpreter(ring):
    """bfloat16 weights, the presets' dtype, through the Triton interpreter: within the correctness gate of the
    float32 reference and the same greedy tokens. The interpreter's tl.dot multiplied bfloat16 bit patterns
    (triton-lang/triton#11584), so the attention of every bfloat16 model on the CPU was garbage (rel. error
    1.7, other tokens) while the float32 tests passed; kernel.vendor.dot upcasts there."""
    w = random_weights(TINY, "cpu", seed=0)
    assert w.dtype == torch.bfloat16
    e = SMALL_TILES.replace(weight_ring=ring, block_k=128 if ring else SMALL_TILES.block_k)
    prompt, forced = [1, 2, 3], [5, 6, 7]
    ref = Reference(TINY, w, 32, compute_dtype=torch.float32)
    want = ref.teacher_forced_logits(prompt, forced).float()
    mk = Monokernel(TINY, w, e, max_seq=32)
    got = mk.teacher_forced_logits(prompt, forced).float()
    assert float((got - want).abs().max() / want.abs().max()) < 2e-2
    mk.n_eos = 0
    assert mk.generate(prompt, 3)[0] == Reference(TINY, w, 32, compute_dtype=torch.float32).greedy(prompt, 3)


@pytest.mark.parametrize("ring", [0, 2])
def test_compile_only_engine_differs_only_in_its_weight_buffer(ring):
    """compile_only (what kogtune's parallel compile processes build): the streamed weight buffer is a
    128-byte placeholder of the weights' dtype, every other launch argument and every constexpr is the real
    engine's, so the compiled variant is the one the measured trial launches."""
    w = random_weights(TINY, "cpu", seed=3, dtype=torch.float32)
    e = SMALL_TILES.replace(weight_ring=ring, block_k=128)
    real = Monokernel(TINY, w, e, max_seq=64)
    stub = Monokernel(TINY, w, e, max_seq=64, compile_only=True)
    assert stub.wbuf.numel() * stub.wbuf.element_size() == 128 and stub.wbuf.dtype == real.wbuf.dtype
    assert real.wbuf.numel() > 1000
    a_real, o_real = real._launch_args(5, 3, 4, None, 0.0, 0, 1.0, 0, True, False)
    a_stub, o_stub = stub._launch_args(5, 3, 4, None, 0.0, 0, 1.0, 0, True, False)
    assert o_real == o_stub

    def same(x, y):
        if isinstance(x, tuple):
            return type(x) is type(y) and all(same(a, b) for a, b in zip(x, y))
        if isinstance(x, torch.Tensor):    # the logits output is uninitialized memory: its shape only
            return x.dtype == y.dtype and x.shape == y.shape and (x is real.logits or torch.equal(x, y))
        return x == y

    assert len(a_real) == len(a_stub)
    assert same(a_real[0][1:], a_stub[0][1:])            # the model group but its weight buffer
    assert all(same(x, y) for x, y in zip(a_real[1:], a_stub[1:]))


@pytest.mark.parametrize("ring", [0, 2])
def test_compile_only_engine_over_placeholder_weights_has_the_real_signature(ring):
    """What kogtune's compile processes build (kog.tune.objective.compile_state): a compile_only engine over
    placeholder_weights, one 128-byte line for the whole model. Every launch argument has the real engine's
    dtype and shape and every constexpr and integer its value, so the variant compiled is the one the
    measured trial launches."""
    from kog.engine.weights import placeholder_weights, resolve_config
    cfg = resolve_config("tiny", dtype="float32")
    pw = placeholder_weights(cfg)
    assert len({t.untyped_storage().data_ptr() for t in pw.values()}) == 1
    assert pw["lm_head"] is pw["embed"] if cfg.tie_word_embeddings else pw["lm_head"].shape[0] == cfg.vocab_size
    e = SMALL_TILES.replace(weight_ring=ring, block_k=128)
    real = Monokernel(cfg, random_weights(cfg, "cpu", seed=3), e, max_seq=64)
    stub = Monokernel(cfg, pw, e, max_seq=64, compile_only=True)
    a_real, o_real = real._launch_args(5, 3, 4, None, 0.0, 0, 1.0, 0, True, False)
    a_stub, o_stub = stub._launch_args(5, 3, 4, None, 0.0, 0, 1.0, 0, True, False)
    assert o_real == o_stub

    def alike(x, y):
        if isinstance(x, tuple):
            return type(x) is type(y) and len(x) == len(y) and all(alike(a, b) for a, b in zip(x, y))
        if isinstance(x, torch.Tensor):
            return x.dtype == y.dtype and (x is real.wbuf or x.shape == y.shape)
        return x == y

    assert alike(a_real, a_stub)


def test_ctas_per_sm_fit_counts_allocation_granularity():
    """The fallback occupancy estimate (no driver call: the interpreter, AMD) rounds registers to the
    per-warp allocation unit and adds the driver's 1 KiB per CTA of shared memory: the plain n_regs x threads
    formula let 5 CTAs/SM x 2 warps through where the cooperative launch refused them."""
    from types import SimpleNamespace
    from kog.engine.kernel.vendor import ctas_per_sm_fit

    def kern(regs, shared):
        return SimpleNamespace(n_regs=regs, metadata=SimpleNamespace(shared=shared))

    assert 65536 // (204 * 64) == 5 and ctas_per_sm_fit(kern(204, 0), 2) == 4       # 6528 -> 6656 regs/warp
    assert ctas_per_sm_fit(kern(200, 0), 2) == 5                                       # 6400: a whole unit
    assert 233472 // 46080 == 5 and ctas_per_sm_fit(kern(64, 46080), 2, smem_per_sm=233472) == 4
    assert ctas_per_sm_fit(kern(32, 0), 1) == 32                                       # the CTA cap
    assert ctas_per_sm_fit(kern(32, 0), 4) == 16                                       # 2048 threads


# ---- streaming: the host reads each token while the launch runs --------------------------------------------------

def test_stream_yields_the_tokens_generate_makes_and_stops_at_a_stop_id():
    w = random_weights(TINY, "cpu", seed=3, dtype=torch.float32)
    mk = Monokernel(TINY, w, SMALL_TILES, max_seq=64)
    mk.set_stop_ids([])
    full, _ = mk.generate([5, 6, 7], 6)
    assert list(mk.stream([5, 6, 7], 6)) == full
    assert mk.last_stream["tokens"] == 6 and mk.last_stream["ttft_s"] is not None
    mk.set_stop_ids([full[2]])                # the launch ends after the first stop id it produces
    stop_at = full.index(full[2])
    assert list(mk.stream([5, 6, 7], 6)) == full[:stop_at + 1]
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        mk.set_stop_ids([TINY.vocab_size])


def test_stream_hands_over_each_token_as_the_buffer_fills(monkeypatch):
    """The polling loop, without the kernel: a stand-in launch writes one token per poll of the host, and
    reports the launch ended only once all are written; the stream must yield each as it appears."""
    import kog.engine.monokernel as M
    w = random_weights(TINY, "cpu", seed=3, dtype=torch.float32)
    mk = Monokernel(TINY, w, SMALL_TILES, max_seq=64)
    seen_at: list[int] = []

    class FakeLaunch:
        errors: list = []

        def __init__(self):
            self.written = 0

        def is_alive(self):
            if self.written < 4:                 # each poll of the host lets the "kernel" write one token
                mk.out[self.written] = 100 + self.written
                self.written += 1
                return True
            return False

        def join(self):
            pass

    monkeypatch.setattr(M, "_launch_thread", lambda mk_, args, opts: FakeLaunch())
    monkeypatch.setattr(Monokernel, "_check_error", lambda self: None)
    for t in mk.stream([5, 6, 7], 8, poll_s=0.0):
        seen_at.append((t, mk._running.written))
    # token i was yielded right after the poll that wrote it, before the later ones existed
    assert seen_at == [(100, 1), (101, 2), (102, 3), (103, 4)]
    assert mk.last_stream["tokens"] == 4


def test_breakdown_runs_the_sampling_asked_for():
    """breakdown(..., temperature, top_k, top_p, seed): the compile, the plain and the traced launch all sample
    as asked (the sampling search's time then shows in the breakdown), and the categories add up."""
    w = random_weights(TINY, "cpu", seed=3, dtype=torch.float32)
    mk = Monokernel(TINY, w, SMALL_TILES, max_seq=64, trace_tokens=2)
    mk.n_eos = 0
    calls, real = [], mk.generate

    def generate(prompt, n, **kw):
        calls.append(kw)
        return real(prompt, n, **kw)
    mk.generate = generate
    b = mk.breakdown(list(range(5, 15)), 3, temperature=0.8, top_k=5, top_p=0.9, seed=7)
    opts = {"temperature": 0.8, "top_k": 5, "top_p": 0.9, "seed": 7}
    assert [{k: c[k] for k in opts} for c in calls] == [opts] * 3
    assert [c.get("trace", False) for c in calls] == [True, False, True]
    assert {"streaming", "waiting", "barrier", "other", "phases"} <= set(b)
