"""The monokernel's schedule alone (engine/plan.py): no kernel runs here."""
from __future__ import annotations

import numpy as np
import pytest

from kog.engine.config import PRESETS, ConfigError
from kog.engine.engine_config import EngineConfig
from kog.engine.plan import (BUF_ATTN, BUF_HMID, BUF_QKV, T_ATTN, T_BAR, T_LM, T_QKV, check_plan, make_plan)

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


def test_attention_counters_by_sync_rows(monkeypatch):
    """O reads the whole attention output: with sync_rows >= q_size it polls ONE counter that all KV
    heads' merges bump (was one per KV head, polled one after another); sync_rows below a KV group still
    gets one counter per group; the per-group layout stays available for same-run comparisons."""
    from kog.engine import plan as plan_mod
    g = LLAMA.num_kv_heads
    group_rows = LLAMA.q_size // g
    p = make_plan(LLAMA, EngineConfig(sync_rows=4096), 132)
    a0 = p.layout[0, BUF_ATTN]
    assert p.layout[0, BUF_HMID] - a0 == 1 and p.target[a0] == g
    p = make_plan(LLAMA, EngineConfig(sync_rows=64, bn_qkv=8, bn_o=8, bn_gate_up=8, bn_down=8), 132)
    assert p.rows_per_counter[BUF_ATTN] == group_rows
    monkeypatch.setattr(plan_mod, "ATTN_COUNTER_PER_GROUP", True)
    p = make_plan(LLAMA, EngineConfig(sync_rows=4096), 132)
    assert p.rows_per_counter[BUF_ATTN] == group_rows


def test_topology_mapping_uses_the_probe_partitions():
    from kog.probe import bundled_scan_path
    from kog.reports.runstore import open_run
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


def test_topology_mapping_needs_a_scan():
    with pytest.raises(ConfigError, match="kogprobe scan"):
        make_plan(LLAMA, EngineConfig(mapping="topology"), 132)


@pytest.mark.parametrize("bad, match", [
    (dict(bn_qkv=3), "power of two"),
    (dict(bn_lm=4096), "does not divide"),
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


def test_sms_cap_plans_a_smaller_grid(monkeypatch):
    """plan.SMS_CAP (a bench toggle): the plan deals every task over the capped grid only; the topology
    mapping keeps every SM of its scan."""
    import kog.engine.plan as plan_mod
    cfg = PRESETS["tiny"]
    e = EngineConfig(ctas_per_sm=2)
    monkeypatch.setattr(plan_mod, "SMS_CAP", 3)
    p = make_plan(cfg, e, sms=8)
    assert p.grid == 6 and len(p.cta_start) == 7
    check_plan(p, cfg, e)
    topo = make_plan(cfg, e.replace(mapping="topology"), sms=4, sm_partition={s: s % 2 for s in range(4)})
    assert topo.grid == 8


def test_early_residual_marks_only_tasks_whose_residual_a_wait_proved_ready(monkeypatch):
    """plan.early_residual: an O task may load its residual (h) before its input wait only after a qkv task of
    its layer in its CTA's list (qkv waited for all of h), a down task only after a gate_up task of its layer
    (gate_up waited for all of O's output); nothing else is marked, and EARLY_RESIDUAL off marks nothing."""
    import kog.engine.plan as plan_mod
    from kog.engine.plan import T_DOWN, T_GU, T_O, early_residual
    tasks = np.array([[T_QKV, 0], [T_O, 0], [T_O, 1], [T_QKV, 1], [T_O, 1], [T_DOWN, 1], [T_GU, 1], [T_DOWN, 1],
                      [T_O, 0]])
    got = early_residual(tasks, np.array([0, 8, 9]))
    assert got.tolist() == [False, True, False, False, True, False, False, True, False]
    # a real plan: every CTA runs qkv and gate_up tiles of each layer (bench shapes), so all O / down tasks
    cfg = PRESETS["llama-3.2-1b"]
    p = make_plan(cfg, EngineConfig(weight_ring=3, row_prefetch=2, bn_gate_up=4, attn_block=64), 132, attn_splits=10)
    e = early_residual(p.tasks, p.cta_start)
    od = np.isin(p.tasks[:, 0], [T_O, T_DOWN])
    assert e[od].all() and not e[~od].any()
    # a grid larger than the qkv tiles: CTAs without a qkv task of the layer load after their wait
    small = make_plan(PRESETS["tiny"], EngineConfig(bn_qkv=64), 16)
    es = early_residual(small.tasks, small.cta_start)
    assert not es[small.tasks[:, 0] == T_QKV].any() and (~es[np.isin(small.tasks[:, 0], [T_O, T_DOWN])]).any()
    monkeypatch.setattr(plan_mod, "EARLY_RESIDUAL", False)
    assert not early_residual(p.tasks, p.cta_start).any()
