"""The monokernel's schedule alone (engine/plan.py, engine/schedule.py): no kernel runs here."""
from __future__ import annotations

import numpy as np
import pytest

from kog.engine.config import PRESETS, ConfigError
from kog.engine.engine_config import EngineConfig, sm90_default
from kog.engine.layout import (BUF_ATTN, BUF_HMID, BUF_QKV, HEAD_EARLY_BIT, HEAD_LAYER_SHIFT, ROW_HEAD, ROW_RELEASE,
                               ROW_TILE, ROW_WAIT, T_ATTN, T_BAR, T_DOWN, T_GU, T_LM, T_O, T_QKV)
from kog.engine.plan import check_plan, early_residual, make_plan
from kog.engine.schedule import ScheduleError, Step, simulate

LLAMA = PRESETS["llama-3.2-1b"]


@pytest.mark.parametrize("mapping", ["round-robin", "contiguous"])
@pytest.mark.parametrize("mode", ["targeted", "grid"])
def test_every_task_once_in_phase_order(mapping, mode):
    e = EngineConfig(mode=mode, mapping=mapping)
    p = make_plan(LLAMA, e, 132, attn_splits=3)
    check_plan(p, LLAMA, e)
    counts = p.phase_counts()
    assert counts["qkv"] == LLAMA.num_layers * LLAMA.qkv_size // e.bn_qkv
    assert counts["attn"] == LLAMA.num_layers * LLAMA.num_kv_heads * 3
    assert counts["lm"] == LLAMA.vocab_size // e.bn_lm
    assert p.grid == 132 * e.ctas_per_sm
    # grid mode: every CTA meets every barrier; targeted mode has none
    nbar = int((p.tasks[:, 0] == T_BAR).sum())
    assert nbar == (p.grid * 5 * LLAMA.num_layers if mode == "grid" else 0)


def test_round_robin_spreads_small_phases():
    """Attention has only num_kv_heads tasks a layer: the dealing cursor moves them to other CTAs each
    layer instead of piling them on CTAs 0..7."""
    p = make_plan(LLAMA, EngineConfig(), 132)
    owners = [int(np.searchsorted(p.cta_start, i, side="right") - 1) for i in np.flatnonzero(p.tasks[:, 0] == T_ATTN)]
    assert len(set(owners)) > 4 * LLAMA.num_kv_heads


def test_counters_cover_each_buffer():
    e = EngineConfig(sync_rows=512)
    p = make_plan(LLAMA, e, 132)
    # qkv: 3072 rows in counters of 512 rows, each counting 512 / bn_qkv tiles per token
    q0 = p.layout[0, BUF_QKV]
    assert list(p.target[q0:q0 + 6]) == [512 // e.bn_qkv] * 6
    # attention: the last split of a KV head publishes its group's rows once per token; a counter covers
    # sync_rows rows in whole KV groups (llama-3.2-1b: 256 rows a group, so two groups a counter)
    group_rows = (LLAMA.num_heads // LLAMA.num_kv_heads) * LLAMA.head_dim
    a0 = p.layout[0, BUF_ATTN]
    assert p.rows_per_counter[BUF_ATTN] == 2 * group_rows
    assert list(p.target[a0:a0 + LLAMA.num_kv_heads // 2]) == [2] * (LLAMA.num_kv_heads // 2)
    assert p.layout[0, BUF_HMID] - a0 == LLAMA.num_kv_heads // 2


def test_attention_counters_by_sync_rows():
    """O reads the whole attention output: with sync_rows >= q_size it polls ONE counter that all KV heads'
    merges bump; sync_rows below a KV group still gets one counter per group."""
    g = LLAMA.num_kv_heads
    group_rows = LLAMA.q_size // g
    p = make_plan(LLAMA, EngineConfig(sync_rows=4096), 132)
    a0 = p.layout[0, BUF_ATTN]
    assert p.layout[0, BUF_HMID] - a0 == 1 and p.target[a0] == g
    p = make_plan(LLAMA, EngineConfig(sync_rows=64, bn_qkv=8, bn_o=8, bn_gate_up=8, bn_down=8), 132)
    assert p.rows_per_counter[BUF_ATTN] == group_rows


def test_topology_mapping_uses_the_probe_partitions():
    from kog.probe import bundled_scan_path
    from kog.runstore import open_run
    part = open_run(bundled_scan_path()).table("l2_partition")
    sm_partition = dict(zip(part["sm"].astype(int), part["partition"].astype(int)))
    e = EngineConfig(mapping="topology")
    p = make_plan(LLAMA, e, 132, sm_partition)
    check_plan(p, LLAMA, e)
    # each die streams one contiguous block of every matrix: qkv tiles of the first half on die 0's CTAs
    qkv = np.flatnonzero((p.tasks[:, 0] == T_QKV) & (p.tasks[:, 1] == 0))
    owner = np.searchsorted(p.cta_start, qkv, side="right") - 1
    tiles = p.tasks[qkv, 2]
    dies = p.cta_die[owner]
    first = tiles < (LLAMA.qkv_size // e.bn_qkv) // 2
    assert len(set(dies[first])) == 1 and len(set(dies[~first])) == 1 and set(dies[first]) != set(dies[~first])


def test_a_vocabulary_bn_lm_does_not_divide_ends_on_a_ragged_tile():
    """A vocabulary such as 32,001 (a pad token added to Llama 2's): the LM head's last tile is ragged, not
    refused; the plan covers every row with ceil(V / bn_lm) tasks. Tensor parallelism keeps whole tiles."""
    from kog.engine.engine_config import lm_tiles
    from kog.engine.tp_plan import make_tp_plan
    m = LLAMA.replace(vocab_size=32001)
    e = EngineConfig(bn_lm=64).validate(m)
    p = make_plan(m, e, 132)
    check_plan(p, m, e)
    assert p.phase_counts()["lm"] == lm_tiles(32001, 64) == 501 and 500 * 64 < 32001 <= 501 * 64
    with pytest.raises(ConfigError, match="bn_lm 64 does not divide a rank's"):
        make_tp_plan(m.replace(vocab_size=32002), e, 2, 132)


def test_topology_mapping_needs_a_scan():
    with pytest.raises(ConfigError, match="kogprobe scan"):
        make_plan(LLAMA, EngineConfig(mapping="topology"), 132)


@pytest.mark.parametrize("bad, match", [
    (dict(bn_qkv=3), "power of two"),
    (dict(bn_down=4096), "does not divide"),
    (dict(mode="async"), "mode"),
    (dict(ctas_per_sm=9), "ctas_per_sm"),
    (dict(sync_rows=4, bn_qkv=8), "multiple of bn_qkv"),
])
def test_impossible_configs_are_refused(bad, match):
    with pytest.raises(ConfigError, match=match):
        EngineConfig(**bad).validate(LLAMA)


def test_residency_bound():
    with pytest.raises(ConfigError, match="fit on one SM"):
        EngineConfig(ctas_per_sm=4).validate(LLAMA, max_ctas_per_sm=2)


def test_lm_head_is_last_everywhere():
    p = make_plan(LLAMA, EngineConfig(), 132)
    for c in range(p.grid):
        t = p.tasks_of(c)
        lm = np.flatnonzero(t[:, 0] == T_LM)
        if len(lm):
            assert lm[0] == len(t) - len(lm)


def test_early_residual_marks_only_tasks_whose_residual_a_wait_proved_ready():
    """plan.early_residual: an O task may load its residual (h) before its input wait only after a qkv task of
    its layer in its CTA's list (qkv waited for all of h), a down task only after a gate_up task of its layer
    (gate_up waited for all of O's output); nothing else is marked."""
    tasks = np.array([[T_QKV, 0], [T_O, 0], [T_O, 1], [T_QKV, 1], [T_O, 1], [T_DOWN, 1], [T_GU, 1], [T_DOWN, 1],
                      [T_O, 0]])
    got = early_residual(tasks, np.array([0, 8, 9]))
    assert got.tolist() == [False, True, False, False, True, False, False, True, False]
    # a real plan: every CTA runs qkv and gate_up tiles of each layer (bench shapes), so all O / down tasks
    cfg = PRESETS["llama-3.2-1b"]
    p = make_plan(cfg, EngineConfig(weight_ring=3, bn_gate_up=4, attn_block=64), 132, attn_splits=10)
    e = early_residual(p.tasks, p.cta_start)
    od = np.isin(p.tasks[:, 0], [T_O, T_DOWN])
    assert e[od].all() and not e[~od].any()
    assert (((p.rows[:, ROW_HEAD] >> HEAD_EARLY_BIT) & 1).astype(bool) == e).all()
    # a grid larger than the qkv tiles: CTAs without a qkv task of the layer load after their wait
    small = make_plan(PRESETS["tiny"], EngineConfig(bn_qkv=64), 16)
    es = early_residual(small.tasks, small.cta_start)
    assert not es[small.tasks[:, 0] == T_QKV].any() and (~es[np.isin(small.tasks[:, 0], [T_O, T_DOWN])]).any()


def test_task_rows_state_every_dependency():
    """The kernel's table: head = type | early | layer, the tile (a barrier's number), the counter a task
    releases, the first counter of the buffer it reads (layer 0 reads the embedding: the always-ready ones)."""
    cfg = PRESETS["tiny"]
    e = EngineConfig(bn_qkv=16, bn_o=16, bn_gate_up=16, bn_down=16, bn_lm=64, sync_rows=32)
    p = make_plan(cfg, e, 2)
    t, r = p.tasks, p.rows
    assert ((r[:, ROW_HEAD] & 63) == t[:, 0]).all() and ((r[:, ROW_HEAD] >> HEAD_LAYER_SHIFT) == t[:, 1]).all()
    assert (r[:, ROW_TILE] == t[:, 2]).all()
    q0 = (t[:, 0] == T_QKV) & (t[:, 1] == 0)
    assert (r[q0, ROW_WAIT] == p.dummy_base).all() and (r[q0, ROW_RELEASE] == p.layout[0, BUF_QKV]
                                                      + t[q0, 2] * 16 // 32).all()
    lm = t[:, 0] == T_LM
    assert (r[lm, ROW_RELEASE] == -1).all()
    g = make_plan(cfg, e.replace(mode="grid"), 2)
    bars = g.tasks[:, 0] == T_BAR
    assert (g.rows[:, ROW_RELEASE] == -1).all() and (g.rows[bars, ROW_TILE] == g.tasks[bars, 3]).all()


CHECK_CONFIGS = [dict(), dict(mode="grid"), dict(sync_rows=0, bn_qkv=16), dict(mapping="contiguous", ctas_per_sm=1),
                 dict(bn_o=32, bn_down=32, bn_lm=32, sync_rows=1024)]


@pytest.mark.parametrize("preset", sorted(p for p in PRESETS if p != "tiny"))
def test_the_checker_passes_every_preset_mode_and_config(preset):
    """check_plan over every preset, both sync modes and a spread of configs (the sm_90 default with the ring,
    grid mode, one counter per block_k, contiguous mapping, wider tiles): table, targets, early residuals and
    a two-token run with every CTA co-resident."""
    m = PRESETS[preset]
    for kw in CHECK_CONFIGS:
        for base in (EngineConfig(), sm90_default(m)):
            e, splits = base.replace(**kw).attn_layout(576)
            try:
                e.validate(m)
            except ConfigError:
                continue
            check_plan(make_plan(m, e, 132, attn_splits=splits), m, e)


def _tiny_plan(sms: int = 3):
    cfg = PRESETS["tiny"]
    e = EngineConfig(bn_qkv=16, bn_o=16, bn_gate_up=16, bn_down=16, bn_lm=64, sync_rows=32)
    return cfg, e, make_plan(cfg, e, sms, attn_splits=2)


@pytest.mark.parametrize("corrupt, match", [
    ("release", "releases counter"),
    ("wait", "waits from counter"),
    ("target", "releases a token, target"),
    ("early", "loads its residual before its wait"),
    ("order", "after a task of a later phase"),
])
def test_the_checker_names_each_broken_invariant(corrupt, match):
    """Each corruption of a valid plan is caught, with the task or counter named (16 SMs: more CTAs than qkv
    tiles, so some O tasks load their residual after their wait)."""
    cfg, e, p = _tiny_plan(16)
    check_plan(p, cfg, e)
    gu = np.flatnonzero(p.tasks[:, 0] == T_GU)[0]
    if corrupt == "release":
        p.rows[gu, ROW_RELEASE] += 1
    elif corrupt == "wait":
        p.rows[gu, ROW_WAIT] = p.layout[0, BUF_QKV]
    elif corrupt == "target":
        p.target[p.layout[1, BUF_HMID]] += 1
    elif corrupt == "early":
        o = np.flatnonzero((p.tasks[:, 0] == T_O) & ~((p.rows[:, ROW_HEAD] >> HEAD_EARLY_BIT) & 1).astype(bool))[0]
        p.rows[o, ROW_HEAD] |= 1 << HEAD_EARLY_BIT
    else:
        lo, hi = int(p.cta_start[0]), int(p.cta_start[1])
        p.tasks[lo:hi] = p.tasks[lo:hi][::-1].copy()
        p.rows[lo:hi] = p.rows[lo:hi][::-1].copy()
    with pytest.raises(ScheduleError, match=match):
        check_plan(p, cfg, e)


def test_the_simulation_finds_a_deadlock_and_names_the_stuck_wait():
    """Two CTAs each releasing what the other waits for only after its own wait: the run stalls, and the
    error names the earliest stuck step and the object short of its target."""
    a = [Step("a waits", waits=(("y", 1, 0),), actions=(("add", "x", 1),))]
    b = [Step("b waits", waits=(("x", 1, 0),), actions=(("add", "y", 1),))]
    with pytest.raises(ScheduleError, match=r"deadlock: CTA 0 stuck at token 0 on a waits, waiting on y \(0 < 1\)"):
        simulate([a, b])
    # a deferred release is published when the CTA reaches a task that releases elsewhere, before its wait
    c = [Step("c1", actions=(("tile",),), release="x"), Step("c2", waits=(("y", 1, 0),), release=None)]
    d = [Step("d", waits=(("x", 1, 0),), actions=(("add", "y", 1),))]
    assert simulate([c, d], tokens=1) == {"x": 1, "y": 1}


def test_live_splits_merge_at_the_last_live_arrival():
    """Only splits holding cached positions arrive (kernel/attention.py): token t's merge runs at the arrival
    that brings the word to live(0) + ... + live(t). Three splits (one CTA each), live 1, 2, 3 over three
    tokens: one merge a token, each once that token's live splits arrived; a count that expects a split which
    never arrives (live above the splits the CTAs run) stalls the next token's consumer."""
    def programs(n_splits):
        merge = [Step("merge", actions=(("add", "merged", 1),))]
        return [[Step(f"split {s}", actions=(("arrive_live", "arr", s, live, merge),)),
                 Step("o", waits=(("merged", 1, 0),))] for s in range(n_splits)]

    def live(t):
        return [1, 2, 3][t]
    assert simulate(programs(3), tokens=3) == {"arr": 6, "merged": 3}
    with pytest.raises(ScheduleError, match=r"stuck at token 1 on o, waiting on merged \(1 < 2\)"):
        simulate(programs(1), tokens=3)


@pytest.mark.parametrize("mode", ["targeted", "grid"])
def test_the_checker_runs_a_cache_filling_up(mode):
    """check_plan with the splits that hold positions growing token by token (1, 2, 3 of 3, the kernel's
    live_splits as a cache fills) passes; in targeted mode, counting a split the plan does not have leaves a
    merge undone and its O waiting (grid mode's O waits on a barrier, not on the merge)."""
    cfg = PRESETS["tiny"]
    e = EngineConfig(mode=mode, bn_qkv=16, bn_o=16, bn_gate_up=16, bn_down=16, bn_lm=64, sync_rows=32)
    p = make_plan(cfg, e, 3, attn_splits=3)
    check_plan(p, cfg, e, tokens=3, live_splits=lambda t: t + 1)
    if mode == "targeted":
        with pytest.raises(ScheduleError, match=r"deadlock: .* on o layer 0"):
            check_plan(p, cfg, e, tokens=3, live_splits=lambda t: t + 2)


def test_arrival_words_per_layer_keep_an_empty_split_from_taking_an_earlier_layer_merge():
    """The kernel counts attention arrivals per (layer, KV head). When a split with no cached positions still
    arrived (at once, with no input wait: the kernel before live_splits), one word per KV head across layers
    let layer 1's empty split land while layer 0's real last split was still waiting, so the arrival that
    completed a count was the wrong layer's: layer 0's attention output was never released and its O task
    waited forever. Two CTAs: one runs the empty splits, the other layer 0's splits and O."""
    def programs(key):
        def split(layer, waits):
            merge = [Step(f"merge layer {layer}", actions=(("add", ("attn", layer), 1),))]
            return Step(f"split layer {layer}", waits=waits, actions=(("arrive", key(layer), 2, merge),))
        empty = [split(0, ()), split(1, ())]                                   # no positions yet: no wait
        real = [Step("qkv", actions=(("add", "qkv0", 1),)), split(0, (("qkv0", 1, 0),)),
                Step("o layer 0", waits=((("attn", 0), 1, 0),))]
        return [empty, real]

    simulate(programs(lambda layer: ("arrivals", layer, 0)), tokens=1)
    with pytest.raises(ScheduleError, match=r"o layer 0, waiting on \('attn', 0\)"):
        simulate(programs(lambda layer: ("arrivals", 0)), tokens=1)


def test_the_stream_ceiling_plan_is_grid_mode_without_its_barriers():
    """bench/stream_ceiling.py's `free` plan: each CTA's grid-mode tasks but the barriers, in the same order,
    with a task table row for each."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("stream_ceiling",
                                                  Path(__file__).resolve().parents[1] / "bench" / "stream_ceiling.py")
    sc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sc)
    cfg = PRESETS["tiny"]
    e = EngineConfig(mode="grid", bn_qkv=16, bn_o=16, bn_gate_up=16, bn_down=16, bn_lm=64, sync_rows=32)
    grid = make_plan(cfg, e, 3, attn_splits=2)
    kept = [grid.tasks_of(c)[grid.tasks_of(c)[:, 0] != T_BAR] for c in range(grid.grid)]
    assert (grid.tasks[:, 0] == T_BAR).sum() == grid.grid * grid.barriers_per_token > 0
    free = sc.without_barriers(make_plan(cfg, e, 3, attn_splits=2), cfg, e)
    assert not (free.tasks[:, 0] == T_BAR).any()
    for c in range(grid.grid):
        np.testing.assert_array_equal(free.tasks_of(c), kept[c])
    assert len(free.rows) == len(free.tasks)
