"""The monokernel's schedule, planned in Python: which CTA runs which task, and who waits on what.

A decode step is a fixed list of tasks (row tiles of each matrix, one attention task per KV head), in
phase order: per layer  qkv -> attn -> o -> gate_up -> down,  then the LM head tiles. The plan deals
those tasks to G persistent CTAs (the mapping), keeps each CTA's list in phase order (so a CTA only ever
waits on work of an earlier phase: no deadlock while all CTAs are co-resident), and lays out the
readiness counters: each produced buffer (qkv, attn, hmid, act, h) has one int32 counter per
`R` output rows, bumped once per finished producer tile; a consumer waits until the counters covering
the rows it reads reach (token+1) * tiles_per_counter. Counters only grow during a launch, so no reset
is needed between tokens.

Everything here is plain data (numpy int32 arrays) the kernel reads at run time: changing the mapping or
the wait granularity never recompiles the kernel. kernel.py executes the plan; tests check the plan alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kog.engine.config import ConfigError, ModelConfig
from kog.engine.engine_config import EngineConfig

# task types (kept in sync with kernel.py)
T_QKV, T_ATTN, T_O, T_GU, T_DOWN, T_LM, T_BAR = range(7)
TASK_NAMES = {T_QKV: "qkv", T_ATTN: "attn", T_O: "o", T_GU: "gate_up", T_DOWN: "down", T_LM: "lm",
              T_BAR: "barrier"}
# True: one attention-output counter per KV group whatever sync_rows is (the layout before 2026-12-01; kept
# for same-run comparisons in bench scripts)
ATTN_COUNTER_PER_GROUP = False
# With the weight ring, qkv reaches attention as token-tagged 64-bit words the attention split polls
# (kernel._tag_store / _tag_wait): no release fence and counter on the qkv -> attention hop. False: the
# counters, as before 2026-12-01 (bench/engine_check.py can set it per sweep entry: "_TAGGED_QKV")
TAGGED_QKV = True


def tagged_qkv(ecfg: EngineConfig) -> bool:
    """Whether qkv reaches attention as token-tagged words for this config (the ring's path, TAGGED_QKV): the
    launcher's buffers and regreport's launch both ask here."""
    return bool(ecfg.weight_ring) and TAGGED_QKV

# O and down tasks load their residual rows (h for O, O's output for down) BEFORE they wait for their input,
# where the plan proves those rows ready: the CTA ran a qkv (for O) or gate_up (for down) task of the same
# layer earlier in the token, and those wait for their whole RMS-normed input, which is that residual. The
# load's L2 latency then leaves the task's epilogue (kog.engine.ring.compact_rows carries the mark; the ring's
# row_prefetch 2 path reads it). False: every residual loads after the GEMV, as before 2026-12-02
# (bench/engine_check.py: "_EARLY_RESIDUAL")
EARLY_RESIDUAL = True


def early_residual(tasks: np.ndarray, cta_start: np.ndarray) -> np.ndarray:
    """Per task (rows of `tasks`: type, layer, ...), whether its residual rows are ready before its input wait
    (EARLY_RESIDUAL above): an O task after a qkv task of its layer in its CTA's list, a down task after a
    gate_up task of its layer. All False when EARLY_RESIDUAL is off."""
    out = np.zeros(len(tasks), dtype=bool)
    if not EARLY_RESIDUAL:
        return out
    needs = {T_O: T_QKV, T_DOWN: T_GU}
    for c in range(len(cta_start) - 1):
        seen: set[tuple[int, int]] = set()
        for i in range(int(cta_start[c]), int(cta_start[c + 1])):
            typ, layer = int(tasks[i, 0]), int(tasks[i, 1])
            if typ in needs:
                out[i] = (needs[typ], layer) in seen
            seen.add((typ, layer))
    return out


# Plan for at most this many SMs (None: all): the grid then holds fewer CTAs than the GPU could run, so phases
# whose tile counts divide the smaller grid end evenly (bench/engine_check.py sets it per sweep entry:
# "_SMS_CAP"; the topology mapping always plans every SM of its scan)
SMS_CAP: int | None = None
# counter buffers per layer, in the order of the `layout` table
BUF_QKV, BUF_ATTN, BUF_HMID, BUF_ACT, BUF_HOUT = range(5)
N_BUF = 5


@dataclass
class Plan:
    grid: int                      # number of persistent CTAs
    tasks: np.ndarray              # int32 [T, 4]: type, layer, tile, barrier number within the token
    cta_start: np.ndarray          # int32 [grid + 1]: CTA c runs tasks[cta_start[c]:cta_start[c+1]]
    layout: np.ndarray             # int32 [L, N_BUF]: first counter of each buffer of each layer
    rows_per_counter: np.ndarray   # int32 [N_BUF]: R of each buffer kind
    target: np.ndarray             # int32 [n_counters]: producer tiles per counter per token
    n_counters: int
    barriers_per_token: int
    cta_die: np.ndarray | None = None    # die / L2 partition each CTA was planned for (topology mapping)
    meta: dict = field(default_factory=dict)

    def tasks_of(self, cta: int) -> np.ndarray:
        return self.tasks[self.cta_start[cta]:self.cta_start[cta + 1]]

    def phase_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tasks[:, 0]:
            out[TASK_NAMES[int(t)]] = out.get(TASK_NAMES[int(t)], 0) + 1
        return out


def _phase_tasks(model: ModelConfig, ecfg: EngineConfig, attn_splits: int = 1) -> list[tuple[int, int, int]]:
    """(type, layer, n_tiles) of every phase of one decode step, in execution order."""
    ph = []
    for layer in range(model.num_layers):
        ph += [(T_QKV, layer, model.qkv_size // ecfg.bn_qkv), (T_ATTN, layer, model.num_kv_heads * attn_splits),
               (T_O, layer, model.hidden_size // ecfg.bn_o),
               (T_GU, layer, model.intermediate_size // ecfg.bn_gate_up),
               (T_DOWN, layer, model.hidden_size // ecfg.bn_down)]
    ph.append((T_LM, model.num_layers, model.vocab_size // ecfg.bn_lm))
    return ph


def _deal(n: int, grid: int, mapping: str, cursor: int, die_of_cta: np.ndarray | None) -> tuple[np.ndarray, int]:
    """Owner CTA of each of n tiles of one phase. `cursor` carries the round-robin position across phases
    so short phases (attention: one task per KV head) do not always land on the same CTAs."""
    idx = np.arange(n)
    if mapping == "round-robin":
        return (cursor + idx) % grid, (cursor + n) % grid
    if mapping == "contiguous":
        return (idx * grid) // n, cursor
    # topology: split the tiles into one contiguous block per die (weights a die streams are adjacent),
    # round-robin inside the die over its CTAs.
    assert die_of_cta is not None
    dies = np.unique(die_of_cta)
    owner = np.empty(n, dtype=np.int64)
    block = (idx * len(dies)) // n
    for j, d in enumerate(dies):
        ctas = np.flatnonzero(die_of_cta == d)
        sel = np.flatnonzero(block == j)
        owner[sel] = ctas[(cursor + np.arange(len(sel))) % len(ctas)]
    return owner, (cursor + n) % grid


def make_plan(model: ModelConfig, ecfg: EngineConfig, sms: int,
              sm_partition: dict[int, int] | None = None, attn_splits: int = 1) -> Plan:
    """Plan one decode step for `sms` SMs with ecfg.ctas_per_sm CTAs each.

    sm_partition (SM id -> L2 partition / die, from kogprobe) is required by mapping="topology"; the
    kernel then finds its CTA number from %smid instead of program_id. attn_splits: attention tasks per KV
    head (each covers attn_block cache positions; the last to finish merges them).
    """
    ecfg.validate(model)
    if SMS_CAP and ecfg.mapping != "topology":
        sms = min(sms, SMS_CAP)
    if model.head_dim & (model.head_dim - 1):
        raise ConfigError(f"head_dim {model.head_dim} is not a power of two (the monokernel needs one)")
    grid = sms * ecfg.ctas_per_sm
    die_of_cta = None
    if ecfg.mapping == "topology":
        if not sm_partition:
            raise ConfigError("mapping 'topology' needs a kogprobe scan of this GPU (its L2 partition map)")
        sm_ids = sorted(sm_partition)
        if len(sm_ids) != sms:
            raise ConfigError(f"the probe scan maps {len(sm_ids)} SMs but this GPU has {sms}")
        # CTA numbering: SM-major. The kernel ranks its programs by (%smid, program id), so plan-CTA
        # i * cps + slot runs on the i-th SM of the scan when every SM holds cps programs
        cps = ecfg.ctas_per_sm
        die_of_cta = np.repeat(np.array([sm_partition[s] for s in sm_ids]), cps)

    per_cta: list[list[tuple[int, int, int, int]]] = [[] for _ in range(grid)]
    cursor = 0
    nbar = 0
    R_default = ecfg.sync_rows or ecfg.block_k
    for ttype, layer, n in _phase_tasks(model, ecfg, attn_splits):
        owner, cursor = _deal(n, grid, ecfg.mapping, cursor, die_of_cta)
        for tile, c in enumerate(owner):
            per_cta[int(c)].append((ttype, layer, tile, 0))
        if ecfg.mode == "grid" and ttype != T_LM:
            # conventional monokernel: every CTA meets at a barrier after each phase
            for lst in per_cta:
                lst.append((T_BAR, layer, 0, nbar))
            nbar += 1

    tasks = np.array([t for lst in per_cta for t in lst], dtype=np.int32).reshape(-1, 4)
    cta_start = np.zeros(grid + 1, dtype=np.int32)
    cta_start[1:] = np.cumsum([len(lst) for lst in per_cta])

    # readiness counters
    L, H, I = model.num_layers, model.hidden_size, model.intermediate_size
    group_rows = (model.num_heads // model.num_kv_heads) * model.head_dim
    # The attention output is published per KV group (the last split of a KV head merges and releases its
    # group_rows rows), and O reads all of it: one counter per KV group made every O task poll
    # num_kv_heads counters one after another (an L2 round trip each, ~3 us per layer on the H200,
    # bench/h200/ENGINE_NOTES.md session 6), so its counters cover sync_rows rows too, in whole KV groups.
    R_attn = group_rows if ATTN_COUNTER_PER_GROUP else group_rows * max(1, int(R_default) // group_rows)
    R = np.array([R_default, R_attn, R_default, R_default, R_default], dtype=np.int32)
    sizes = {BUF_QKV: (model.qkv_size, ecfg.bn_qkv), BUF_ATTN: (model.q_size, group_rows),
             BUF_HMID: (H, ecfg.bn_o), BUF_ACT: (I, ecfg.bn_gate_up), BUF_HOUT: (H, ecfg.bn_down)}
    for b, (n_rows, bn) in sizes.items():
        if R[b] % bn:
            raise ConfigError(f"wait granularity: {R[b]} rows per counter is not a multiple of the "
                              f"producer's {bn} rows per task")
    layout = np.zeros((L, N_BUF), dtype=np.int32)
    targets: list[int] = []
    for layer in range(L):
        for b, (n_rows, bn) in sizes.items():
            layout[layer, b] = len(targets)
            for c0 in range(0, n_rows, int(R[b])):
                targets.append(-(-min(int(R[b]), n_rows - c0) // bn))
    target = np.array(targets, dtype=np.int32)
    return Plan(grid=grid, tasks=tasks, cta_start=cta_start, layout=layout, rows_per_counter=R,
                target=target, n_counters=len(target), barriers_per_token=nbar,
                cta_die=die_of_cta, meta={"mapping": ecfg.mapping, "mode": ecfg.mode, "sms": sms,
                                          "attn_splits": attn_splits})


def check_plan(plan: Plan, model: ModelConfig, ecfg: EngineConfig) -> None:
    """Invariants the kernel relies on (used by the tests and before every launch in debug mode):
    every task exactly once, each CTA's list in phase order, counters' targets sum to the producer tiles."""
    expected = _phase_tasks(model, ecfg, plan.meta.get("attn_splits", 1))
    seen = {(t, layer): 0 for t, layer, _ in expected}
    order = {(t, layer): i for i, (t, layer, _) in enumerate(expected)}
    for c in range(plan.grid):
        last = -1
        for ttype, layer, tile, _ in plan.tasks_of(c):
            if ttype == T_BAR:
                continue
            k = order[(int(ttype), int(layer))]
            assert k >= last, f"CTA {c}: task of phase {k} after phase {last}"
            last = k
            seen[(int(ttype), int(layer))] += 1
    for t, layer, n in expected:
        assert seen[(t, layer)] == n, f"phase {TASK_NAMES[t]} layer {layer}: {seen[(t, layer)]} tasks, want {n}"
