"""The monokernel's schedule, planned in Python: which CTA runs which task, and who waits on what.

A decode step is a fixed list of tasks (row tiles of each matrix, attention splits per KV head), in phase
order: per layer  qkv -> attn -> o -> gate_up -> down,  then the LM head tiles. The plan deals those tasks to
G persistent CTAs (the mapping), keeps each CTA's list in phase order (a CTA only ever waits on work of an
earlier phase: no deadlock while all CTAs are co-resident), and owns every dependency:

  data flow   task_io(): the rows each task reads (its input, and O's / down's residual) and writes.
  counters    each produced buffer (qkv, attn, hmid, act, h) of each layer has one int32 readiness counter per
              R output rows (sync_rows); producers bump the counter covering their tile, and a consumer waits
              until the counters covering the rows it reads reach (token + 1) * target. Counters only grow
              during a launch, so nothing is reset between tokens.
  the table   rows: one row per task (layout.ROW_*): type and flags, tile, the counter it releases, the first
              counter of the buffer it reads. The kernel reads nothing else about dependencies.
  special     with the weight ring, qkv reaches attention as token-tagged words (no counter: the split
              polls the words); grid mode replaces every counter by a barrier after each phase; layer 0
              reads the embedding, released with the token (its wait base: always-ready counters).

check_plan() verifies a plan before it is launched: the table against the data flow (each task releases the
counter of the rows it writes and waits on the buffer it reads), the counter targets against their producers,
and a run of two tokens with every CTA co-resident (engine/schedule.py) in which every task, when it runs,
finds every row it reads written for this token, and no CTA stalls.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable
import numpy as np

from kog.engine.config import ConfigError, ModelConfig
from kog.engine.engine_config import EngineConfig, lm_tiles
from kog.engine.layout import (BUF_ACT, BUF_ATTN, BUF_HMID, BUF_HOUT, BUF_NAMES, BUF_QKV, HEAD_EARLY_BIT,
                               HEAD_LAYER_SHIFT, N_BUF_SINGLE, ROW_HEAD, ROW_RELEASE, ROW_TILE, ROW_WAIT, ROW_WORDS,
                               T_ATTN, T_BAR, T_DOWN, T_GU, T_LM, T_O, T_QKV, TASK_NAMES)
from kog.engine.schedule import ScheduleError, Step, simulate


@dataclass
class Plan:
    grid: int                      # number of persistent CTAs
    tasks: np.ndarray              # int32 [T, 4]: type, layer, tile, barrier number within the token
    cta_start: np.ndarray          # int32 [grid + 1]: CTA c runs tasks[cta_start[c]:cta_start[c+1]]
    layout: np.ndarray             # int32 [L, N_BUF_SINGLE]: first counter of each buffer of each layer
    rows_per_counter: np.ndarray   # int32 [N_BUF_SINGLE]: R of each buffer
    target: np.ndarray             # int32 [n_counters]: producer releases per counter per token
    n_counters: int
    barriers_per_token: int
    rows: np.ndarray | None = None  # int32 [T, ROW_WORDS]: the kernel's task table (task_rows)
    tagged_qkv: bool = False       # qkv -> attention through token-tagged words, not counters
    cta_die: np.ndarray | None = None    # die / L2 partition each CTA was planned for (topology mapping)
    meta: dict = field(default_factory=dict)

    @property
    def dummy_base(self) -> int:
        """First of the always-ready counters (target 0) that layer 0's qkv tasks wait on."""
        return self.n_counters

    def tasks_of(self, cta: int) -> np.ndarray:
        return self.tasks[self.cta_start[cta]:self.cta_start[cta + 1]]

    def phase_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tasks[:, 0]:
            out[TASK_NAMES[int(t)]] = out.get(TASK_NAMES[int(t)], 0) + 1
        return out


def tagged_qkv(ecfg: EngineConfig) -> bool:
    """Whether qkv reaches attention as token-tagged words: on the ring's path."""
    return bool(ecfg.weight_ring)


def _phase_tasks(model: ModelConfig, ecfg: EngineConfig, attn_splits: int = 1) -> list[tuple[int, int, int]]:
    """(type, layer, n_tiles) of every phase of one decode step, in execution order."""
    ph = []
    for layer in range(model.num_layers):
        ph += [(T_QKV, layer, model.qkv_size // ecfg.bn_qkv), (T_ATTN, layer, model.num_kv_heads * attn_splits),
               (T_O, layer, model.hidden_size // ecfg.bn_o),
               (T_GU, layer, model.intermediate_size // ecfg.bn_gate_up),
               (T_DOWN, layer, model.hidden_size // ecfg.bn_down)]
    ph.append((T_LM, model.num_layers, lm_tiles(model.vocab_size, ecfg.bn_lm)))
    return ph


def _deal(n: int, grid: int, mapping: str, cursor: int, die_of_cta: np.ndarray | None) -> tuple[np.ndarray, int]:
    """Owner CTA of each of n tiles of one phase. `cursor` carries the round-robin position across phases
    so short phases (attention: a few tasks per KV head) do not always land on the same CTAs."""
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
    """Plan one decode step for `sms` SMs with ecfg.ctas_per_sm CTAs each, its task table included.

    sm_partition (SM id -> L2 partition / die, from kogprobe) is required by mapping="topology"; the
    kernel then finds its CTA number from %smid instead of program_id. attn_splits: attention tasks per KV
    head (each covers attn_block cache positions; the last to finish merges them).
    """
    ecfg.validate(model)
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
        die_of_cta = np.repeat(np.array([sm_partition[s] for s in sm_ids]), ecfg.ctas_per_sm)

    per_cta: list[list[tuple[int, int, int, int]]] = [[] for _ in range(grid)]
    cursor = 0
    nbar = 0
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
    layout, R, target = _counters(model, ecfg)
    if tagged_qkv(ecfg):     # nothing releases or waits on the qkv counters
        for layer in range(model.num_layers):
            target[layout[layer, BUF_QKV]:layout[layer, BUF_QKV + 1]] = 0
    plan = Plan(grid=grid, tasks=tasks, cta_start=cta_start, layout=layout, rows_per_counter=R, target=target,
                n_counters=len(target), barriers_per_token=nbar, tagged_qkv=tagged_qkv(ecfg), cta_die=die_of_cta,
                meta={"mapping": ecfg.mapping, "mode": ecfg.mode, "sms": sms, "attn_splits": attn_splits})
    plan.rows = task_rows(plan, model, ecfg)
    return plan


def _producer_rows(model: ModelConfig, ecfg: EngineConfig) -> dict[int, tuple[int, int]]:
    """buffer -> (rows, rows one producer release covers) for the single-GPU buffers."""
    group_rows = (model.num_heads // model.num_kv_heads) * model.head_dim
    H = model.hidden_size
    return {BUF_QKV: (model.qkv_size, ecfg.bn_qkv), BUF_ATTN: (model.q_size, group_rows),
            BUF_HMID: (H, ecfg.bn_o), BUF_ACT: (model.intermediate_size, ecfg.bn_gate_up), BUF_HOUT: (H, ecfg.bn_down)}


def _counters(model: ModelConfig, ecfg: EngineConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(layout [L, N_BUF_SINGLE], rows per counter [N_BUF_SINGLE], target per counter)."""
    R_default = ecfg.sync_rows or ecfg.block_k
    group_rows = (model.num_heads // model.num_kv_heads) * model.head_dim
    # The attention output is published per KV group (the last split of a KV head merges and releases its
    # group_rows rows), and O reads all of it: one counter per KV group would make every O task poll
    # num_kv_heads counters one after another, so its counters cover sync_rows rows too, in whole KV groups.
    R_attn = group_rows * max(1, int(R_default) // group_rows)
    R = np.array([R_default, R_attn, R_default, R_default, R_default], dtype=np.int32)
    sizes = _producer_rows(model, ecfg)
    for b, (n_rows, bn) in sizes.items():
        if R[b] % bn:
            raise ConfigError(f"wait granularity: {R[b]} rows per counter is not a multiple of the "
                              f"producer's {bn} rows per task")
    layout = np.zeros((model.num_layers, N_BUF_SINGLE), dtype=np.int32)
    targets: list[int] = []
    for layer in range(model.num_layers):
        for b, (n_rows, bn) in sizes.items():
            layout[layer, b] = len(targets)
            for c0 in range(0, n_rows, int(R[b])):
                targets.append(-(-min(int(R[b]), n_rows - c0) // bn))
    return layout, R, np.array(targets, dtype=np.int32)


def counters_over(plan: Plan, buf: int, layer: int, lo: int, hi: int) -> range:
    """The counters covering rows [lo, hi) of buffer `buf` of `layer`: the rule the kernel applies to a task's
    wait base (kernel/sync.py wait_rows: base + row // rows_per_counter)."""
    first, R = int(plan.layout[layer, buf]), int(plan.rows_per_counter[buf])
    return range(first + lo // R, first + (hi - 1) // R + 1)


def early_residual(tasks: np.ndarray, cta_start: np.ndarray) -> np.ndarray:
    """Per task, whether its residual rows are proven ready before its input wait: an O task after a qkv task
    of its layer in its CTA's list (qkv waited for the whole layer input, O's residual), a down task after a
    gate_up task of its layer (gate_up waited for all of hmid, down's residual). The kernel then loads them
    before the wait, so their L2 latency leaves the task's epilogue."""
    out = np.zeros(len(tasks), dtype=bool)
    needs = {T_O: T_QKV, T_DOWN: T_GU}
    for c in range(len(cta_start) - 1):
        seen: set[tuple[int, int]] = set()
        for i in range(int(cta_start[c]), int(cta_start[c + 1])):
            typ, layer = int(tasks[i, 0]), int(tasks[i, 1])
            if typ in needs:
                out[i] = (needs[typ], layer) in seen
            seen.add((typ, layer))
    return out


def task_rows(plan: Plan, model: ModelConfig, ecfg: EngineConfig) -> np.ndarray:
    """The kernel's task table (layout.ROW_*), one row per task: head (type | early << HEAD_EARLY_BIT | layer <<
    HEAD_LAYER_SHIFT), tile (a barrier: its number within the token), the counter the task releases (-1:
    none), the first counter of the buffer it reads (layer 0's qkv: the always-ready counters)."""
    lay, R = plan.layout, plan.rows_per_counter
    t = plan.tasks.astype(np.int64)
    typ, layer, tile = t[:, 0], t[:, 1], t[:, 2]
    L = model.num_layers
    lc = np.minimum(layer, L - 1)                      # the LM head's "layer" is L
    rel = np.full(len(t), -1, dtype=np.int64)
    wait = np.zeros(len(t), dtype=np.int64)
    prev_h = np.where(layer > 0, lay[np.maximum(layer - 1, 0), BUF_HOUT], plan.dummy_base)
    for ty, (bn, out_buf, wait_base) in {
            T_QKV: (ecfg.bn_qkv, BUF_QKV, prev_h), T_O: (ecfg.bn_o, BUF_HMID, lay[lc, BUF_ATTN]),
            T_GU: (ecfg.bn_gate_up, BUF_ACT, lay[lc, BUF_HMID]), T_DOWN: (ecfg.bn_down, BUF_HOUT, lay[lc, BUF_ACT])
    }.items():
        m = typ == ty
        rel[m] = lay[layer[m], out_buf] + (tile[m] * bn) // R[out_buf]
        wait[m] = wait_base[m]
    m = typ == T_ATTN
    group_rows = model.q_size // model.num_kv_heads   # tile = kv head * splits + split
    rel[m] = lay[layer[m], BUF_ATTN] + (tile[m] // plan.meta["attn_splits"]) * group_rows // R[BUF_ATTN]
    wait[m] = lay[layer[m], BUF_QKV]
    wait[typ == T_LM] = lay[L - 1, BUF_HOUT]
    if ecfg.mode != "targeted":
        rel[:] = -1                                    # grid mode publishes nothing: barriers order phases
    if plan.tagged_qkv:
        rel[typ == T_QKV] = -1                         # attention polls the tagged words instead
    early = early_residual(plan.tasks, plan.cta_start)
    out = np.zeros((len(t), ROW_WORDS), dtype=np.int64)
    out[:, ROW_HEAD] = typ | (early.astype(np.int64) << HEAD_EARLY_BIT) | (layer << HEAD_LAYER_SHIFT)
    out[:, ROW_TILE] = np.where(typ == T_BAR, t[:, 3], tile)
    out[:, ROW_RELEASE] = rel
    out[:, ROW_WAIT] = wait
    return out.astype(np.int32)


# ---- the data flow, stated once per task type ------------------------------------------------------------------

def task_io(model: ModelConfig, ecfg: EngineConfig, typ: int, layer: int, tile: int, attn_splits: int):
    """(reads, residual, writes) of one task, each a (buffer, layer, row lo, row hi) or None: the rows its GEMV
    or attention reads, the residual rows O / down add, the rows it produces. The layer input of layer l is
    buffer h of layer l - 1 (layer -1: the embedding, written when the token is handed over)."""
    H, QS, KVS, HD = model.hidden_size, model.q_size, model.kv_size, model.head_dim
    G = model.num_heads // model.num_kv_heads
    reads, residual, writes = [], None, None
    if typ == T_QKV:
        reads = [(BUF_HOUT, layer - 1, 0, H)]
        writes = (BUF_QKV, layer, tile * ecfg.bn_qkv, (tile + 1) * ecfg.bn_qkv)
    elif typ == T_ATTN:
        g = tile // attn_splits
        reads = [(BUF_QKV, layer, g * G * HD, (g + 1) * G * HD), (BUF_QKV, layer, QS + g * HD, QS + (g + 1) * HD),
                 (BUF_QKV, layer, QS + KVS + g * HD, QS + KVS + (g + 1) * HD)]
        writes = (BUF_ATTN, layer, g * G * HD, (g + 1) * G * HD)
    elif typ == T_O:
        rows = (tile * ecfg.bn_o, (tile + 1) * ecfg.bn_o)
        reads, residual, writes = [(BUF_ATTN, layer, 0, QS)], (BUF_HOUT, layer - 1, *rows), (BUF_HMID, layer, *rows)
    elif typ == T_GU:
        reads = [(BUF_HMID, layer, 0, H)]
        writes = (BUF_ACT, layer, tile * ecfg.bn_gate_up, (tile + 1) * ecfg.bn_gate_up)
    elif typ == T_DOWN:
        rows = (tile * ecfg.bn_down, (tile + 1) * ecfg.bn_down)
        reads = [(BUF_ACT, layer, 0, model.intermediate_size)]
        residual, writes = (BUF_HMID, layer, *rows), (BUF_HOUT, layer, *rows)
    elif typ == T_LM:
        reads = [(BUF_HOUT, model.num_layers - 1, 0, H)]
    return reads, residual, writes


# ---- the checker -----------------------------------------------------------------------------------------------

def _label(typ: int, layer: int, tile: int) -> str:
    return f"{TASK_NAMES[typ]} layer {layer} tile {tile}"


def check_plan(plan: Plan, model: ModelConfig, ecfg: EngineConfig, tokens: int = 2,
               live_splits: Callable[[int], int] | None = None) -> None:
    """ScheduleError (an AssertionError) naming the first broken invariant:
    1. every task exactly once, each CTA's list in phase order (grid mode: every CTA meets every barrier, each
       between its phase's tasks and the next phase's);
    2. the table against the data flow (task_io): each task releases the one counter covering the rows it
       writes and waits from the first counter of the buffer it reads, and each counter's target is the
       releases it gets a token; so a wait that completes covers every row the task reads. A residual read
       before the wait is covered by an earlier wait of the same CTA on that buffer;
    3. `tokens` decode steps with every CTA co-resident, releases deferred as the kernel defers them, the
       attention merges and the token hand-off as the kernel does them: no CTA stalls (engine/schedule.py).
    live_splits(token): the attention splits of each KV head that hold cached positions at that token (only
    they arrive; kernel/attention.live_splits); default every split, the full cache, which waits the most."""
    splits = plan.meta.get("attn_splits", 1)
    _check_tasks(plan, model, ecfg, splits)
    io = [task_io(model, ecfg, int(t[0]), int(t[1]), int(t[2]), splits) if t[0] != T_BAR else None
          for t in plan.tasks]
    _check_table(plan, model, ecfg, splits, io)
    _check_early_residuals(plan, io)
    live = live_splits or (lambda t: splits)
    simulate(_programs(plan, model, ecfg, splits, io, live), tokens, describe=lambda o: _describe(plan, o))


def _check_tasks(plan: Plan, model: ModelConfig, ecfg: EngineConfig, splits: int) -> None:
    expected = _phase_tasks(model, ecfg, splits)
    order = {(t, layer): i for i, (t, layer, _) in enumerate(expected)}
    seen = {(t, layer): 0 for t, layer, _ in expected}
    nbar = plan.barriers_per_token
    for c in range(plan.grid):
        last, bars = -1, []
        for ttype, layer, tile, bar in plan.tasks_of(c).tolist():
            if ttype == T_BAR:       # barrier k follows phase k (every phase but the LM head has one)
                if bar != len(bars):
                    raise ScheduleError(f"CTA {c}: barrier {bar} where barrier {len(bars)} is due")
                bars.append(bar)
                continue
            k = order[(ttype, layer)]
            if k < last:
                raise ScheduleError(f"CTA {c}: {_label(ttype, layer, tile)} after a task of a later phase "
                                    f"(deadlock risk)")
            if nbar and k != len(bars):
                raise ScheduleError(f"CTA {c}: {_label(ttype, layer, tile)} after {len(bars)} barriers, want {k}")
            last = k
            seen[(ttype, layer)] += 1
        if bars != list(range(nbar)):
            raise ScheduleError(f"CTA {c}: barriers {bars[:8]}..., want 0..{nbar - 1} once each")
    for t, layer, n in expected:
        if seen[(t, layer)] != n:
            raise ScheduleError(f"phase {TASK_NAMES[t]} layer {layer}: {seen[(t, layer)]} tasks, want {n}")


def _check_table(plan: Plan, model: ModelConfig, ecfg: EngineConfig, splits: int, io: list) -> None:
    """Each task releases the one counter covering the rows it writes and waits on the buffer it reads (stated
    by task_io, independently of task_rows); each counter's target is the releases it gets per token."""
    releases = np.zeros(plan.n_counters, dtype=np.int64)
    targeted = ecfg.mode == "targeted"
    for i, (typ, layer, tile, _) in enumerate(plan.tasks.tolist()):
        if typ == T_BAR:
            continue
        reads, _, writes = io[i]
        row = plan.rows[i]
        want_rel = -1
        if targeted and writes is not None and not (typ == T_QKV and plan.tagged_qkv):
            cs = counters_over(plan, *writes)
            if len(cs) != 1:
                raise ScheduleError(f"{_label(typ, layer, tile)} writes rows {writes[2]}..{writes[3] - 1} across "
                                    f"{len(cs)} counters (one release covers one counter)")
            want_rel = cs[0]
            # attention: only the split that merges releases (once per KV head)
            releases[want_rel] += 1 if typ != T_ATTN or tile % splits == 0 else 0
        if row[ROW_RELEASE] != want_rel:
            raise ScheduleError(f"{_label(typ, layer, tile)} releases counter {row[ROW_RELEASE]}, its rows' is "
                                f"{want_rel}")
        buf, src_layer = reads[0][0], reads[0][1]
        want_wait = plan.dummy_base if src_layer < 0 else int(plan.layout[src_layer, buf])
        if row[ROW_WAIT] != want_wait:
            raise ScheduleError(f"{_label(typ, layer, tile)} waits from counter {row[ROW_WAIT]}, the first of "
                                f"{BUF_NAMES[buf]} of layer {src_layer} is {want_wait}")
    if targeted:
        bad = np.flatnonzero(releases != plan.target)
        if len(bad):
            c = int(bad[0])
            raise ScheduleError(f"{_describe(plan, c)}: {releases[c]} releases a token, target {plan.target[c]}")


def _check_early_residuals(plan: Plan, io: list) -> None:
    """A task marked early (its residual rows loaded before its input wait) must follow, in its CTA, a task
    that waited for all of that residual's buffer in the same token."""
    for c in range(plan.grid):
        covered: set[tuple[int, int]] = set()
        for i in range(int(plan.cta_start[c]), int(plan.cta_start[c + 1])):
            if io[i] is None:
                continue
            reads, residual, _ = io[i]
            if (plan.rows[i, ROW_HEAD] >> HEAD_EARLY_BIT) & 1:
                if residual is None or (residual[0], residual[1]) not in covered:
                    typ, layer, tile = (int(x) for x in plan.tasks[i, :3])
                    raise ScheduleError(f"CTA {c}: {_label(typ, layer, tile)} loads its residual before its wait, "
                                        f"but no earlier task of the CTA waited for those rows")
            for (buf, layer, lo, hi) in reads:
                if lo == 0 and int(plan.tasks[i, 0]) != T_ATTN:     # a GEMV waits for its whole input
                    covered.add((buf, layer))


def _describe(plan: Plan, obj) -> str:
    if not isinstance(obj, (int, np.integer)):
        return " ".join(str(x) for x in (obj if isinstance(obj, tuple) else (obj,)))
    for layer in range(plan.layout.shape[0] - 1, -1, -1):
        for b in range(plan.layout.shape[1] - 1, -1, -1):
            if plan.layout[layer, b] <= obj:
                r = int(plan.rows_per_counter[b])
                c = obj - int(plan.layout[layer, b])
                return f"counter {obj} ({BUF_NAMES[b]} of layer {layer}, rows {c * r}..{(c + 1) * r - 1})"
    return f"counter {obj}"


def _programs(plan: Plan, model: ModelConfig, ecfg: EngineConfig, splits: int, io: list,
              live: Callable[[int], int]) -> list[list[Step]]:
    """Each CTA's steps for one token, as the kernel executes its table (kernel/entry.py): wait for the token,
    then its tasks (waits, releases), then publish, meet the others (top-k / top-p), arrive, and the last
    CTA hands over. Consecutive GEMV
    tasks of one phase run as one step: they read the same input, so once the first task's waits hold the
    others' do too, and the kernel runs them back to back."""
    targeted = ecfg.mode == "targeted"
    tags = _TagRanges(model, ecfg)
    handoff = [Step("hand-off", actions=(("add", "tok", 1),))]
    rel_col = plan.rows[:, ROW_RELEASE]
    programs = []
    for c in range(plan.grid):
        steps = [Step("token start", waits=(("tok", 1, -1),))]
        lo, hi = int(plan.cta_start[c]), int(plan.cta_start[c + 1])
        t = plan.tasks[lo:hi]
        # runs: consecutive tasks of one (type, layer); attention and barriers one task each
        cut = np.flatnonzero((t[1:, 0] != t[:-1, 0]) | (t[1:, 1] != t[:-1, 1]) | np.isin(t[1:, 0], (T_ATTN, T_BAR)))
        bounds = np.concatenate([[0], cut + 1, [len(t)]]) + lo
        for i, j in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            if j > i:
                steps += _task_steps(plan, ecfg, splits, i, j, io, rel_col, targeted, tags, live)
        steps += _sampling_meeting(plan.grid)
        steps.append(Step("token end", actions=(("flush",), ("arrive", "done", plan.grid, handoff))))
        programs.append(steps)
    return programs


def _sampling_meeting(grid: int) -> list[Step]:
    """Top-k / top-p (kernel/sampling.py): after its tasks, each CTA publishes what it holds back and meets
    every other CTA (round 0, then the search's rounds: the same meeting again, with nothing in between
    that waits on a task). Stated for every plan: the sampling mode is chosen per launch, and a plan that
    runs with the meeting runs without it."""
    return [Step("sampling meeting", actions=(("flush",), ("add", "sample", 1))),
            Step("sampling meeting wait", waits=(("sample", grid, 0),))]


def _task_steps(plan: Plan, ecfg: EngineConfig, splits: int, i: int, j: int, io: list, rel_col: np.ndarray,
                targeted: bool, tags: "_TagRanges", live: Callable[[int], int]) -> list[Step]:
    """The steps of tasks i..j-1 of a CTA (one task, or consecutive GEMV tasks of one phase and layer)."""
    typ, layer, tile, bar = (int(x) for x in plan.tasks[i])
    if typ == T_BAR:
        nbar, grid = plan.barriers_per_token, plan.grid
        return [Step(f"barrier {bar}", actions=(("add", "bar", 1),)),
                Step(f"barrier {bar} wait", waits=(("bar", nbar * grid, -(nbar - bar - 1) * grid),), release=None)]
    reads = io[i][0]
    waits = _waits(plan, typ, reads, int(plan.rows[i, ROW_WAIT]), tags) if targeted else ()
    rels = rel_col[i:j].tolist()
    actions: list[tuple] = []
    if typ == T_ATTN:
        merge = [Step(f"merge {_label(typ, layer, tile)}", actions=(("tile",),) if targeted else ())]
        actions.append(("arrive_live", ("arrivals", layer, tile // splits), tile % splits, live, merge))
    elif typ == T_QKV and plan.tagged_qkv:
        for k in range(i, j):        # each tile's tagged words count toward every read range they overlap
            w = io[k][2]
            actions += [("add", ("tags", layer, s), 1) for s in tags.ranges_of(w[2], w[3])]
    elif targeted and io[i][2] is not None:
        for n, r in enumerate(rels):
            if n and r != rels[n - 1]:
                actions.append(("release", r if r >= 0 else None))
            actions.append(("tile",))
    label = _label(typ, layer, tile) if j - i == 1 else f"{TASK_NAMES[typ]} layer {layer} ({j - i} tiles)"
    return [Step(label, waits=tuple(waits), actions=tuple(actions), release=rels[0] if rels[0] >= 0 else None,
                 order=(layer, typ))]


class _TagRanges:
    """The tagged qkv words as the checker counts them: an attention split polls the words of three row ranges
    (its KV head's q rows, k row, v row) until every one carries the token's tag, i.e. until every qkv tile
    overlapping the range stored this token's words; one object per range, bumped by each such tile."""

    def __init__(self, model: ModelConfig, ecfg: EngineConfig):
        G, HD, QS, KVS = model.num_heads // model.num_kv_heads, model.head_dim, model.q_size, model.kv_size
        self.ranges = sorted([(g * G * HD, (g + 1) * G * HD) for g in range(model.num_kv_heads)]
                             + [(QS + g * HD, QS + (g + 1) * HD) for g in range(model.num_kv_heads)]
                             + [(QS + KVS + g * HD, QS + KVS + (g + 1) * HD) for g in range(model.num_kv_heads)])
        self.starts = np.array([lo for lo, _ in self.ranges])
        self.bn = ecfg.bn_qkv

    def ranges_of(self, lo: int, hi: int) -> list[int]:
        """Starts of the read ranges rows [lo, hi) overlap."""
        i = int(np.searchsorted(self.starts, lo, side="right")) - 1
        out = []
        while i < len(self.ranges) and self.ranges[i][0] < hi:
            if self.ranges[i][1] > lo:
                out.append(self.ranges[i][0])
            i += 1
        return out

    def tiles_over(self, lo: int, hi: int) -> int:
        return (hi - 1) // self.bn - lo // self.bn + 1


def _waits(plan: Plan, typ: int, reads, wait_base: int, tags: _TagRanges) -> list[tuple]:
    """A task's waits as the kernel performs them for the rows it reads: the tagged qkv words of each read
    range, or the counters from its wait base (the always-ready counters past n_counters need no wait)."""
    if typ == T_ATTN and plan.tagged_qkv:
        return [(("tags", lyr, lo), tags.tiles_over(lo, hi), 0) for (_, lyr, lo, hi) in reads]
    R = plan.rows_per_counter
    return [(k, int(plan.target[k]), 0) for (buf, _, lo, hi) in reads
            for k in range(wait_base + lo // R[buf], wait_base + (hi - 1) // R[buf] + 1) if k < plan.n_counters]
