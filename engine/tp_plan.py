"""The tensor-parallel monokernel's schedule, planned in Python: per rank, which CTA runs which task, who waits on
what, and the cross-GPU exchange buffers. Kept apart from any kernel (no kernel executes it yet).

Each of the G ranks runs the single-GPU plan of its shard (kog.engine.plan.make_plan on
kog.engine.tp.shard_config: qkv/attn/o/gate_up/down/lm tiles dealt to its CTAs) with three task kinds added:

    XPUSH (layer, chunk, point)  after O (point 0) and after down (point 1): wait for the local partial rows of
                                 one chunk (exchange_rows rows of H), write them straight into every rank's
                                 receive buffer recv[layer, point, <this rank>, rows] (peer stores over NVLink;
                                 the own rank's slot is a local store), then bump that rank's chunk flag.
    XRED  (layer, chunk, point)  wait for the chunk's flag to reach G arrivals (and the residual rows), sum the G
                                 partials in rank order 0..G-1 in float32, add the residual, store the new hidden
                                 rows and bump the local counter the single-GPU consumers wait on.
    XSAMPLE                      after all local LM tiles: push this rank's best (score, token id) into every
                                 rank's sample slot [token parity, rank] and bump its sample flag; the next
                                 token's layer-0 QKV tiles wait for G arrivals and take the max themselves.

So a consumer waits only on the chunks it reads (per-dependency flags, like the single-GPU targeted mode's
counters), and no NCCL call or host step sits between tokens. Only `targeted` mode is planned: grid mode
would need a cross-GPU barrier after every phase.

Synchronisation objects (int32, monotonic over a launch: a waiter at token t wants (t+1) * target, except the
sample flag, produced by the previous token: t * G):
    counters  per rank, written only by that rank's CTAs: layout [L, N_BUF] -> first counter of each local
              buffer (layout.BUF_*), rows_per_counter [N_BUF], counter_target [n_counters]; plus one LM-done
              counter last.
    flags     per rank, written by all ranks (peer atomics, system scope): flag_layout [L, 2] -> first chunk
              flag of each exchange point, then the sample flag; flag_target [n_flags] (= G: one arrival per
              rank per token). Each flag sits on its own 128-byte line (flag_stride int32).
    recv      per rank: float32 [L, 2, G, H] partials (exchange point, source rank, hidden row);
    sample    per rank: float32 [2, G] best scores and int32 [2, G] token ids (double-buffered by token parity).
Reuse across tokens is safe without double buffering of recv: a rank starts token t+1 only after the sample
flag holds every rank's token-t pick, which each rank pushes after its LM tiles, which (every hidden vector
being read whole by the next QKV / gate_up / LM) come after all of its token-t reductions.

check_tp_plan verifies the invariants (tasks exactly once, targets = what producers bump, no wait on a
chunk nobody produces) and simulates all ranks' CTAs co-resident over two tokens: a stall is a deadlock.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kog.engine.config import ConfigError, ModelConfig
from kog.engine.engine_config import EngineConfig
from kog.engine.layout import (BUF_ACT, BUF_ATTN, BUF_DPART, BUF_HMID, BUF_HOUT, BUF_NAMES, BUF_OPART, BUF_QKV,
                               FLAG_STRIDE, HEAD_LAYER_SHIFT, HEAD_POINT_BIT, N_BUF, ROW_HEAD, ROW_RELEASE, ROW_TILE,
                               ROW_WAIT, ROW_WORDS, T_ATTN, T_BAR, T_DOWN, T_GU, T_LM, T_O, T_QKV, T_XPUSH, T_XRED,
                               TASK_NAMES)
from kog.engine.plan import make_plan
from kog.engine.schedule import ScheduleError, Step, simulate
from kog.engine.tp import TPShape, check_lm_tiles, shard_config, tp_shape

# the rank's pick of the token: a task of the plan; the kernel runs it in the token's last CTA (tp_monokernel)
T_XSAMPLE = 9
TP_TASK_NAMES = {**TASK_NAMES, T_XSAMPLE: "xsample"}
XP_O, XP_DOWN = 0, 1                 # exchange points of a layer (task column 3 of XPUSH / XRED)


@dataclass
class RankPlan:
    rank: int
    grid: int
    tasks: np.ndarray          # int32 [T, 4]: type, layer, tile (or chunk), aux (exchange point; 0 otherwise)
    cta_start: np.ndarray      # int32 [grid + 1]

    def tasks_of(self, cta: int) -> np.ndarray:
        return self.tasks[self.cta_start[cta]:self.cta_start[cta + 1]]


@dataclass
class ExchangeLayout:
    """Sizes and plain-data tables of the synchronisation objects; identical on every rank."""
    G: int
    hidden: int
    exchange_rows: int
    n_chunks: int
    layout: np.ndarray            # int32 [L, N_BUF]: first local counter of each buffer of each layer
    rows_per_counter: np.ndarray  # int32 [N_BUF]
    counter_target: np.ndarray    # int32 [n_counters]: bumps per token
    lm_counter: int               # index of the LM-done counter
    flag_layout: np.ndarray       # int32 [L, 2]: first chunk flag of each exchange point
    sample_flag: int
    flag_target: np.ndarray       # int32 [n_flags]: arrivals per token (G)
    flag_stride: int = FLAG_STRIDE
    recv_dtype: str = "float32"

    @property
    def n_counters(self) -> int:
        return len(self.counter_target)

    @property
    def n_flags(self) -> int:
        return len(self.flag_target)

    def recv_shape(self, num_layers: int) -> tuple[int, ...]:
        return (num_layers, 2, self.G, self.hidden)

    def buffers(self, num_layers: int) -> dict[str, tuple[tuple[int, ...], str]]:
        """name -> (shape, dtype) of what each rank allocates (flags and recv must be peer-addressable)."""
        return {"counters": ((self.n_counters,), "int32"),
                "flags": ((self.n_flags * self.flag_stride,), "int32"),
                "recv": (self.recv_shape(num_layers), self.recv_dtype),
                "sample_score": ((2, self.G), "float32"),
                "sample_token": ((2, self.G), "int32")}


@dataclass
class TPPlan:
    G: int
    model: ModelConfig
    shard: ModelConfig
    shape: TPShape
    ranks: list[RankPlan]
    xl: ExchangeLayout
    meta: dict = field(default_factory=dict)


# ---- phases -------------------------------------------------------------------------------------------------
def _phase_key(ttype: int, layer: int, aux: int) -> tuple[int, int]:
    """Position of a task's phase in one decode step: (layer, step within the layer). Each CTA must run its
    tasks in non-decreasing phase order: a task then only waits on work of strictly earlier phases."""
    step = {T_QKV: 0, T_ATTN: 1, T_O: 2, T_GU: 5, T_DOWN: 6, T_LM: 0, T_XSAMPLE: 1}
    if ttype == T_XPUSH:
        return layer, 3 if aux == XP_O else 7
    if ttype == T_XRED:
        return layer, 4 if aux == XP_O else 8
    return layer, step[ttype]


def _expected_phases(model: ModelConfig, shard: ModelConfig, ecfg: EngineConfig, n_chunks: int,
                     attn_splits: int) -> dict[tuple[int, int, int], int]:
    """(type, layer, aux) -> number of tasks of that phase on each rank."""
    out: dict[tuple[int, int, int], int] = {}
    for l in range(model.num_layers):
        out[(T_QKV, l, 0)] = shard.qkv_size // ecfg.bn_qkv
        out[(T_ATTN, l, 0)] = shard.num_kv_heads * attn_splits
        out[(T_O, l, 0)] = model.hidden_size // ecfg.bn_o
        out[(T_GU, l, 0)] = shard.intermediate_size // ecfg.bn_gate_up
        out[(T_DOWN, l, 0)] = model.hidden_size // ecfg.bn_down
        for pt in (XP_O, XP_DOWN):
            out[(T_XPUSH, l, pt)] = n_chunks
            out[(T_XRED, l, pt)] = n_chunks
    out[(T_LM, model.num_layers, 0)] = shard.vocab_size // ecfg.bn_lm
    out[(T_XSAMPLE, model.num_layers, 0)] = 1
    return out


# ---- counters -----------------------------------------------------------------------------------------------
def _units_hitting(lo: int, hi: int, unit: int) -> range:
    """Indices of the unit-row blocks that intersect rows [lo, hi)."""
    return range(lo // unit, -(-hi // unit))


def _local_buffers(model: ModelConfig, shard: ModelConfig, ecfg: EngineConfig, xrows: int) -> dict[int, tuple[int, int, int]]:
    """buffer -> (rows, rows per counter, rows per producer task)."""
    R = ecfg.sync_rows or ecfg.block_k
    H = model.hidden_size
    group_rows = (shard.num_heads // shard.num_kv_heads) * shard.head_dim
    return {BUF_QKV: (shard.qkv_size, R, ecfg.bn_qkv), BUF_ATTN: (shard.q_size, group_rows, group_rows),
            BUF_OPART: (H, xrows, ecfg.bn_o), BUF_HMID: (H, R, xrows), BUF_ACT: (shard.intermediate_size, R,
                                                                                   ecfg.bn_gate_up),
            BUF_DPART: (H, xrows, ecfg.bn_down), BUF_HOUT: (H, R, xrows)}


def _exchange_layout(model: ModelConfig, shard: ModelConfig, ecfg: EngineConfig, G: int, xrows: int,
                     attn_splits: int) -> ExchangeLayout:
    L, H = model.num_layers, model.hidden_size
    bufs = _local_buffers(model, shard, ecfg, xrows)
    layout = np.zeros((L, N_BUF), dtype=np.int32)
    targets: list[int] = []
    for l in range(L):
        for b in range(N_BUF):
            n, R, unit = bufs[b]
            layout[l, b] = len(targets)
            for c0 in range(0, n, R):
                hits = len(_units_hitting(c0, min(c0 + R, n), unit))
                # attention: each split of a KV head bumps the head's counter (the kernel's last-arriver merge
                # is the same dependency with one bump; it would use target 1)
                targets.append(hits * (attn_splits if b == BUF_ATTN else 1))
    lm_counter = len(targets)
    targets.append(shard.vocab_size // ecfg.bn_lm)
    n_chunks = H // xrows
    flag_layout = np.arange(L * 2, dtype=np.int32).reshape(L, 2) * n_chunks
    sample_flag = L * 2 * n_chunks
    return ExchangeLayout(G=G, hidden=H, exchange_rows=xrows, n_chunks=n_chunks, layout=layout,
                          rows_per_counter=np.array([bufs[b][1] for b in range(N_BUF)], dtype=np.int32),
                          counter_target=np.array(targets, dtype=np.int32), lm_counter=lm_counter,
                          flag_layout=flag_layout, sample_flag=sample_flag,
                          flag_target=np.full(sample_flag + 1, G, dtype=np.int32))


# ---- planning -----------------------------------------------------------------------------------------------
def make_tp_plan(model: ModelConfig, ecfg: EngineConfig, G: int, sms: int, exchange_rows: int = 256,
                 pad_vocab: bool = False, attn_splits: int = 1,
                 sm_partition: dict[int, int] | None = None) -> TPPlan:
    """Plan one decode step on each of G ranks (sms SMs each, ecfg.ctas_per_sm CTAs per SM).

    exchange_rows: hidden rows per exchange chunk (one flag, one push and one reduce task each): the
    exchange granularity the tuner searches. ConfigError names the first impossible choice.
    """
    shape = tp_shape(model, G, pad_vocab)
    shard = shard_config(model, G, pad_vocab)
    check_lm_tiles(ecfg.bn_lm, shard)
    if ecfg.mode != "targeted":
        raise ConfigError(f"engine config: mode {ecfg.mode!r} is not planned for tensor parallelism "
                          f"(only 'targeted': grid mode would need a cross-GPU barrier per phase)")
    H = model.hidden_size
    if exchange_rows <= 0 or H % exchange_rows:
        raise ConfigError(f"exchange_rows {exchange_rows} does not divide hidden_size {H}")
    xl = _exchange_layout(model, shard, ecfg, G, exchange_rows, attn_splits)
    ranks = []
    for r in range(G):
        base = make_plan(shard, ecfg, sms, sm_partition=sm_partition, attn_splits=attn_splits)
        per_cta = [[tuple(int(v) for v in t) for t in base.tasks_of(c) if t[0] != T_BAR] for c in range(base.grid)]
        # exchange tasks, dealt round-robin with a moving cursor (push and reduce of a chunk on different
        # CTAs; each CTA gets a few, so no CTA's weight stream stalls long behind a wait)
        cursor = (r * 7) % base.grid
        extra: list[tuple[int, tuple[int, int, int, int]]] = []
        for l in range(model.num_layers):
            for pt in (XP_O, XP_DOWN):
                for ttype in (T_XPUSH, T_XRED):
                    for c in range(xl.n_chunks):
                        extra.append((cursor, (ttype, l, c, pt)))
                        cursor = (cursor + 1) % base.grid
        extra.append((cursor, (T_XSAMPLE, model.num_layers, 0, 0)))
        for cta, t in extra:
            per_cta[cta].append(t)
        for lst in per_cta:        # stable: keeps the base plan's order within a phase
            lst.sort(key=lambda t: _phase_key(t[0], t[1], t[3]))
        tasks = np.array([t for lst in per_cta for t in lst], dtype=np.int32).reshape(-1, 4)
        cta_start = np.zeros(base.grid + 1, dtype=np.int32)
        cta_start[1:] = np.cumsum([len(lst) for lst in per_cta])
        ranks.append(RankPlan(rank=r, grid=base.grid, tasks=tasks, cta_start=cta_start))
    return TPPlan(G=G, model=model, shard=shard, shape=shape, ranks=ranks, xl=xl,
                  meta={"exchange_rows": exchange_rows, "attn_splits": attn_splits, "sms": sms,
                        "mapping": ecfg.mapping, "pad_vocab": pad_vocab,
                        "bn": {T_QKV: ecfg.bn_qkv, T_O: ecfg.bn_o, T_GU: ecfg.bn_gate_up, T_DOWN: ecfg.bn_down,
                               T_LM: ecfg.bn_lm}})


# ---- dependencies: the executable spec of what the kernel waits on and bumps --------------------------------
# A sync object is (rank, kind, index) with kind "c" (local counter) or "f" (flag).
# A wait is (object, per-token target, token offset): satisfied at token t when value >= (t + 1 + offset) * target.

def _counters_over(p: TPPlan, layer: int, buf: int, lo: int, hi: int) -> list[int]:
    first, R = int(p.xl.layout[layer, buf]), int(p.xl.rows_per_counter[buf])
    return [first + i for i in _units_hitting(lo, hi, R)]


def task_deps(p: TPPlan, rank: int, task) -> tuple[list[tuple[tuple[int, str, int], int, int]],
                                                    list[tuple[int, str, int]]]:
    """(waits, bumps) of one task on one rank."""
    ttype, layer, tile, aux = (int(v) for v in task)
    xl, sh, H = p.xl, p.shard, p.model.hidden_size
    ct = xl.counter_target

    def wc(buf, lo, hi, lyr=layer):
        return [((rank, "c", i), int(ct[i]), 0) for i in _counters_over(p, lyr, buf, lo, hi)]

    def bc(buf, lo, hi, lyr=layer):
        return [(rank, "c", i) for i in _counters_over(p, lyr, buf, lo, hi)]

    def hidden_in(lyr):          # the layer's input hidden vector: the previous layer's output (or the embedding)
        return wc(BUF_HOUT, 0, H, lyr - 1) if lyr > 0 else []

    e = p.meta.get("exchange_rows")
    if ttype == T_QKV:
        waits = hidden_in(layer)
        if layer == 0:           # the token: every rank's pick of the previous step (none before token 0)
            waits = [((rank, "f", xl.sample_flag), int(xl.flag_target[xl.sample_flag]), -1)]
        return waits, bc(BUF_QKV, tile * _bn(p, T_QKV), (tile + 1) * _bn(p, T_QKV))
    if ttype == T_ATTN:
        g = tile // p.meta["attn_splits"]
        gq = (sh.num_heads // sh.num_kv_heads) * sh.head_dim
        waits = (wc(BUF_QKV, g * gq, (g + 1) * gq) + wc(BUF_QKV, sh.q_size + g * sh.head_dim, sh.q_size + (g + 1) * sh.head_dim)
                 + wc(BUF_QKV, sh.q_size + sh.kv_size + g * sh.head_dim, sh.q_size + sh.kv_size + (g + 1) * sh.head_dim))
        return waits, bc(BUF_ATTN, g * gq, (g + 1) * gq)
    if ttype == T_O:
        return wc(BUF_ATTN, 0, sh.q_size), bc(BUF_OPART, tile * _bn(p, T_O), (tile + 1) * _bn(p, T_O))
    if ttype == T_GU:
        return wc(BUF_HMID, 0, H), bc(BUF_ACT, tile * _bn(p, T_GU), (tile + 1) * _bn(p, T_GU))
    if ttype == T_DOWN:
        return wc(BUF_ACT, 0, sh.intermediate_size), bc(BUF_DPART, tile * _bn(p, T_DOWN), (tile + 1) * _bn(p, T_DOWN))
    if ttype == T_XPUSH:
        src = BUF_OPART if aux == XP_O else BUF_DPART
        f = int(xl.flag_layout[layer, aux]) + tile
        return wc(src, tile * e, (tile + 1) * e), [(peer, "f", f) for peer in range(p.G)]
    if ttype == T_XRED:
        f = int(xl.flag_layout[layer, aux]) + tile
        lo, hi = tile * e, (tile + 1) * e
        if aux == XP_O:          # residual: the layer's input rows (the embedding row at layer 0: no wait)
            resid = wc(BUF_HOUT, lo, hi, layer - 1) if layer > 0 else []
        else:
            resid = wc(BUF_HMID, lo, hi)
        out = BUF_HMID if aux == XP_O else BUF_HOUT
        return [((rank, "f", f), int(xl.flag_target[f]), 0)] + resid, bc(out, lo, hi)
    if ttype == T_LM:
        return wc(BUF_HOUT, 0, H, p.model.num_layers - 1), [(rank, "c", xl.lm_counter)]
    if ttype == T_XSAMPLE:
        return ([((rank, "c", xl.lm_counter), int(ct[xl.lm_counter]), 0)],
                [(peer, "f", xl.sample_flag) for peer in range(p.G)])
    raise AssertionError(f"rank {rank}: unknown task type {ttype}")


def _bn(p: TPPlan, ttype: int) -> int:
    return p.meta["bn"][ttype]


# ---- checks -------------------------------------------------------------------------------------------------
def _name(ttype: int, layer: int, tile: int, aux: int) -> str:
    pt = f" point {'o' if aux == XP_O else 'down'}" if ttype in (T_XPUSH, T_XRED) else ""
    return f"{TP_TASK_NAMES.get(ttype, ttype)} layer {layer} tile {tile}{pt}"


def _obj_name(p: TPPlan, obj: tuple[int, str, int]) -> str:
    rank, kind, i = obj
    if kind == "f":
        if i == p.xl.sample_flag:
            return f"rank {rank} sample flag"
        l, rest = divmod(i, 2 * p.xl.n_chunks)
        return f"rank {rank} flag layer {l} point {'o' if rest < p.xl.n_chunks else 'down'} chunk {rest % p.xl.n_chunks}"
    if i == p.xl.lm_counter:
        return f"rank {rank} LM-done counter"
    l, b = np.unravel_index(np.searchsorted(p.xl.layout.ravel(), i, side="right") - 1, p.xl.layout.shape)
    return f"rank {rank} counter {i} ({BUF_NAMES[b]} of layer {l})"


def check_tp_plan(p: TPPlan, tokens: int = 2) -> None:
    """ScheduleError (an AssertionError) naming the first broken invariant of a TP plan:
    1. every rank runs every task of its shard's step exactly once, each CTA's list in phase order;
    2. every counter and flag is bumped per token exactly as often as its target says (flags: once per rank);
    3. no task waits on a counter or flag that nothing bumps, or for more than its target;
    4. all ranks' CTAs, all co-resident, complete `tokens` decode steps (engine/schedule.py): local releases
       deferred as the kernel defers them, peer flags bumped at once; a stall is a deadlock."""
    expected = _expected_phases(p.model, p.shard, _BNView(p.meta["bn"]), p.xl.n_chunks, p.meta["attn_splits"])
    bumps: dict[tuple[int, str, int], int] = {}
    programs: list[list[Step]] = []
    for rp in p.ranks:
        seen: dict[tuple[int, int, int, int], int] = {}
        for c in range(rp.grid):
            last = (-1, -1)
            steps: list[Step] = []
            for t in rp.tasks_of(c):
                ttype, layer, tile, aux = (int(v) for v in t)
                if ttype not in TP_TASK_NAMES or ttype == T_BAR:
                    raise ScheduleError(f"rank {rp.rank} CTA {c}: task type {ttype}")
                key = _phase_key(ttype, layer, aux)
                if key < last:
                    raise ScheduleError(f"rank {rp.rank} CTA {c}: {_name(ttype, layer, tile, aux)} after a task of a "
                                        f"later phase (deadlock risk)")
                last = key
                seen[(ttype, layer, tile, aux)] = seen.get((ttype, layer, tile, aux), 0) + 1
                waits, bumped = task_deps(p, rp.rank, t)
                for o in bumped:
                    bumps[o] = bumps.get(o, 0) + 1
                steps.append(_step(p, rp.rank, t, waits, bumped))
            programs.append(steps)
        dup = next((k for k, n in seen.items() if n > 1), None)
        if dup is not None:
            raise ScheduleError(f"rank {rp.rank}: {_name(*dup)} planned {seen[dup]} times, want once")
        for (ttype, layer, aux), n in expected.items():
            for tile in range(n):
                k = seen.pop((ttype, layer, tile, aux), 0)
                if k != 1:
                    raise ScheduleError(f"rank {rp.rank}: {_name(ttype, layer, tile, aux)} planned {k} times, want once")
        if seen:
            raise ScheduleError(f"rank {rp.rank}: unexpected task {_name(*next(iter(seen)))}")
    for r in range(p.G):
        for i, tgt in enumerate(p.xl.counter_target):
            got = bumps.get((r, "c", i), 0)
            if got != tgt:
                raise ScheduleError(f"{_obj_name(p, (r, 'c', i))}: producers bump it {got} times a token, target {tgt}")
        for i, tgt in enumerate(p.xl.flag_target):
            got = bumps.get((r, "f", i), 0)
            if got != tgt:
                raise ScheduleError(f"{_obj_name(p, (r, 'f', i))}: {got} arrivals a token, target {tgt}")
    for prog in programs:
        for st in prog:
            for obj, tgt, _off in st.waits:
                if not bumps.get(obj, 0) >= tgt > 0:
                    raise ScheduleError(f"{st.label} waits on {_obj_name(p, obj)} for {tgt} a token, which is never "
                                        f"produced")
    simulate_tp(p, tokens)


def tp_programs(p: TPPlan) -> list[list[Step]]:
    """Every rank's CTAs' steps for one token (engine/schedule.py), from task_deps."""
    programs = []
    for rp in p.ranks:
        for c in range(rp.grid):
            steps = [_step(p, rp.rank, t, *task_deps(p, rp.rank, t)) for t in rp.tasks_of(c)]
            programs.append(steps + [Step("token end", actions=(("flush",),))])
    return programs


def simulate_tp(p: TPPlan, tokens: int = 2) -> dict:
    """All ranks' CTAs co-resident for `tokens` decode steps; ScheduleError on a deadlock."""
    return simulate(tp_programs(p), tokens, describe=lambda o: _obj_name(p, o))


def _step(p: TPPlan, rank: int, task, waits, bumped) -> Step:
    """One task as the simulator runs it: its local counter bump deferred (a release), flags bumped at once."""
    ttype, layer, tile, aux = (int(v) for v in task)
    local = [o for o in bumped if o[1] == "c" and o[0] == rank]
    flags = [o for o in bumped if o[1] == "f"]
    if len(local) > 1:
        raise ScheduleError(f"rank {rank}: {_name(ttype, layer, tile, aux)} releases {len(local)} counters (one "
                            f"release covers one counter)")
    actions = tuple(("add", f, 1) for f in flags) + ((("tile",),) if local else ())
    # task_deps' (object, target, token offset): value >= (t + 1 + offset) * target
    return Step(f"rank {rank} {_name(ttype, layer, tile, aux)}", waits=tuple((o, n, off * n) for o, n, off in waits),
                actions=actions, release=local[0] if local else None, order=_phase_key(ttype, layer, aux))


def rank_rows(p: TPPlan, rank: int, tasks: np.ndarray, dummy_base: int) -> np.ndarray:
    """The kernel's task table of one rank (layout.ROW_*) from task_deps: each task's release is the local
    counter it bumps (-1: none, or only peer flags), its wait base the first counter of the local buffer its
    counter waits fall in (layer 0's layer input: the always-ready counters at dummy_base); exchange tasks
    carry their point in the head and their chunk as the tile."""
    xl = p.xl
    out = np.zeros((len(tasks), ROW_WORDS), dtype=np.int64)
    firsts = np.sort(xl.layout.ravel())
    for i, t in enumerate(tasks):
        ttype, layer, tile, aux = (int(v) for v in t)
        waits, bumped = task_deps(p, rank, t)
        local = [o[2] for o in bumped if o[1] == "c" and o[0] == rank and o[2] != xl.lm_counter]
        counters = [o[2] for o, _, _ in waits if o[1] == "c" and o[2] != xl.lm_counter]
        wait = dummy_base
        if counters:       # the first counter of the buffer the first waited counter belongs to
            wait = int(firsts[np.searchsorted(firsts, min(counters), side="right") - 1])
        point = aux if ttype in (T_XPUSH, T_XRED) else 0
        out[i, ROW_HEAD] = ttype | (point << HEAD_POINT_BIT) | (layer << HEAD_LAYER_SHIFT)
        out[i, ROW_TILE] = tile
        out[i, ROW_RELEASE] = local[0] if local else -1
        out[i, ROW_WAIT] = wait
    return out.astype(np.int32)


class _BNView:
    """The tile sizes _expected_phases reads, from the plan's meta (the plan keeps no EngineConfig)."""

    def __init__(self, bn: dict[int, int]):
        self.bn_qkv, self.bn_o, self.bn_gate_up, self.bn_down, self.bn_lm = (bn[T_QKV], bn[T_O], bn[T_GU],
                                                                            bn[T_DOWN], bn[T_LM])


def plan_summary(p: TPPlan) -> dict:
    """Small JSON facts about a TP plan (for the bench / tuner records)."""
    xl = p.xl
    per = [{TP_TASK_NAMES[int(k)]: int(v) for k, v in zip(*np.unique(rp.tasks[:, 0], return_counts=True))}
           for rp in p.ranks]
    es = 4 if xl.recv_dtype == "float32" else 2
    return {"G": p.G, "grid": p.ranks[0].grid, "exchange_rows": xl.exchange_rows, "chunks_per_point": xl.n_chunks,
            "tasks_per_rank": per[0], "counters": xl.n_counters, "flags": xl.n_flags,
            # bytes one rank pushes to its peers per token: 2 points a layer, H rows each, G-1 peers
            "peer_bytes_per_token": 2 * p.model.num_layers * p.model.hidden_size * es * (p.G - 1),
            "weight_bytes_per_token_per_rank": p.shard.replace(vocab_size=p.shape.vocab_per_rank)
            .weight_bytes_per_token()}
