"""Launcher of the tensor-parallel monokernel: G ranks (GPUs of one host), one persistent launch per rank.

    tp = TPMonokernel(cfg, weights, G=2)                       # devices cuda:0, cuda:1
    tokens, seconds = tp.generate(prompt_ids, 512)              # greedy (or temperature + seed)
    logits = tp.teacher_forced_logits(prompt_ids, forced_ids)   # [n, V], gathered from the ranks

Each rank is a Monokernel (kog.engine.monokernel) over its Megatron shard (kog.engine.tp.shard_weights): the
same weight packing, activation and counter buffers, with the plan replaced by the rank's part of
kog.engine.tp_plan.make_tp_plan and the kernel compiled with TP=True (kog.engine.kernel: O and down write
partial sums; XPUSH stores a chunk of them straight into every rank's receive buffer and bumps that rank's
chunk flag with a system-scope release; XRED waits for the chunk's G arrivals, sums in rank order, adds the
residual; the token's last CTA exchanges the ranks' best (score, id) and all take the same max).

Peer addresses reach the kernel as one int64 table per rank (data_ptr()s, cast to pointers in-kernel): the
kernel signature does not depend on G, and with TP off the argument is None (a constexpr), so the single-GPU
kernel compiles to exactly its old code. Peer access is enabled by a warm-up peer copy between every pair
(torch enables it, as kogprobe's p2p probe does); NVLink multicast stays off (the variables below, and
nothing here calls cuMulticastCreate).

The G launches are issued back to back (each cooperative, on its own device's current stream) after every
rank's buffers were reset and synchronized; only then is any device synchronized. A wait that can never
complete ends the kernel with an error record; the host raises MonokernelError naming the rank, the flag or
counter, and the task. Under TRITON_INTERPRET=1 (CPU tests) the ranks' 1-CTA launches run in one Python
thread each (_interpreted_together); G = 1 sends the exchange to the rank itself.

Differences from the plan's spec (kog.engine.tp_plan.task_deps), both equivalent dependencies:
  * XSAMPLE is not a task of the table: the token's last CTA (the one that already reduces the CTAs' picks)
    pushes the rank's pick and waits for the G picks before it releases the next token (S_TOK), which every
    CTA of the rank waits for, layer-0 QKV tiles included.
  * attention counters: the kernel's last-arriving split merges the splits and bumps once, so their target
    is the plan's divided by attn_splits.
Prefill (the prompt before its last token) runs on the ranks' plain-torch references, sharded the same way.
"""
from __future__ import annotations

import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from kog.engine.config import ConfigError, ModelConfig
from kog.engine.engine_config import EngineConfig
from kog.engine.kernel.sampling import sample_mode
from kog.engine.kernel.vendor import INTERPRET, vendor_code
from kog.engine.layout import BUF_ATTN, E_FLAG, TP_PEERS
from kog.engine.monokernel import Monokernel, MonokernelError, kernel_constants
from kog.engine.plan import Plan
from kog.engine.reference import rms_norm
from kog.engine.tp import TPReference, all_reduce_partials, shard_config, shard_weights, tp_shape
from kog.engine.tp_plan import T_XSAMPLE, TPPlan, _name, _obj_name, check_tp_plan, make_tp_plan, rank_rows
from kog.engine.weights import Weights
from kog.errors import KogError

# NVLink multicast stays off for anything this process starts (NCCL, torch symmetric memory, NVSHMEM)
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"



def default_exchange_rows(cfg: ModelConfig, ecfg: EngineConfig) -> int:
    """The largest power of two <= 256 that satisfies every exchange_rows constraint (or 0 if none does)."""
    for x in (256, 128, 64, 32, 16, 8):
        try:
            check_exchange_rows(cfg, ecfg, x)
            return x
        except ConfigError:
            pass
    return 0


def check_exchange_rows(cfg: ModelConfig, ecfg: EngineConfig, x: int) -> None:
    """What the kernel needs of exchange_rows (one line naming the conflict otherwise)."""
    R = ecfg.sync_rows or ecfg.block_k
    if x <= 0 or x & (x - 1):
        raise ConfigError(f"exchange_rows {x} is not a power of two")
    if cfg.hidden_size % x:
        raise ConfigError(f"exchange_rows {x} does not divide hidden_size {cfg.hidden_size}")
    if x % ecfg.bn_o or x % ecfg.bn_down:
        raise ConfigError(f"exchange_rows {x} is not a multiple of bn_o {ecfg.bn_o} and bn_down {ecfg.bn_down} "
                          f"(a chunk's partial rows come from whole O / down tiles)")
    if R % x:
        raise ConfigError(f"exchange_rows {x} does not divide the {R} rows per readiness counter (sync_rows): "
                          f"a reduce task publishes into one counter")


def tp_devices(G: int, devices=None) -> list[torch.device]:
    if devices is not None:
        devs = [torch.device(d) for d in devices]
        if len(devs) != G:
            raise ConfigError(f"{len(devs)} devices given for G={G} ranks")
        return devs
    if vendor_code() == INTERPRET:
        return [torch.device("cpu")] * G
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < G:
        raise ConfigError(f"tensor parallelism over G={G} GPUs needs {G} visible GPUs; this host has {n}")
    return [torch.device("cuda", r) for r in range(G)]


class _Rank(Monokernel):
    """One rank: a Monokernel over its shard whose plan and task table come from the TP plan."""
    EXACT_PREFILL = False       # the ranks' prefill and RoPE tables stay in the model dtype (tp_compat matches it)
    CHECK_WEIGHTS = False       # TPMonokernel checked the whole model before sharding it

    def __init__(self, owner: "TPMonokernel", rank: int, shard_cfg: ModelConfig, w: Weights, ecfg: EngineConfig,
                 device, max_seq):
        self._owner, self.rank = owner, rank
        super().__init__(shard_cfg, w, ecfg, device, max_seq)

    def _make_plan(self, sms: int, sm_partition) -> Plan:
        """This rank's part of the (checked) TP plan, with XSAMPLE left out: the token's last CTA picks (module
        docstring); the attention splits' last arriver bumps once, so their targets are divided by the splits."""
        tp = self._owner._plan_for(sms, self.ecfg, self.attn_splits)
        xl, rp = tp.xl, tp.ranks[self.rank]
        keep = rp.tasks[:, 0] != T_XSAMPLE
        owner_cta = np.searchsorted(rp.cta_start, np.arange(len(rp.tasks)), side="right") - 1
        tasks = rp.tasks[keep]
        cta_start = np.zeros(rp.grid + 1, dtype=np.int32)
        cta_start[1:] = np.cumsum(np.bincount(owner_cta[keep], minlength=rp.grid))
        target = xl.counter_target.copy()
        for layer in range(self.cfg.num_layers):
            a, b = int(xl.layout[layer, BUF_ATTN]), int(xl.layout[layer, BUF_ATTN + 1])
            target[a:b] //= self.attn_splits
        self.tp_plan, self._xl = tp, xl
        plan = Plan(grid=rp.grid, tasks=tasks, cta_start=cta_start, layout=xl.layout.copy(),
                    rows_per_counter=xl.rows_per_counter.copy(), target=target, n_counters=xl.n_counters,
                    barriers_per_token=0, meta={"mapping": self.ecfg.mapping, "mode": self.ecfg.mode, "sms": sms,
                                                "attn_splits": self.attn_splits})
        plan.rows = rank_rows(tp, self.rank, tasks, plan.dummy_base)
        return plan

    def _alloc(self, partials: bool = True) -> None:
        super()._alloc(partials=True)       # O's and down's partial sums get activation columns

    def constants(self, sample: int, trace: bool) -> tuple:
        o = self._owner
        return kernel_constants(self.cfg, self.ecfg, attn_splits=self.attn_splits, grid=self.plan.grid,
                                rows_per_counter=self.plan.rows_per_counter, vendor=self.vendor, sample=sample,
                                trace=trace, tp=(o.G, o.exchange_rows, o.cfg.vocab_size))

    def _check_error(self) -> None:
        err = self.err.cpu().tolist()
        if err[0] == 0:
            return
        what, task, target, value = err[1:5]
        raise MonokernelError(f"TP monokernel rank {self.rank}: a wait timed out on {self._describe_sync(what)} in "
                              f"{self._describe_tp_task(task)} (value {value} < target {target}); the kernel "
                              f"aborted instead of hanging")

    def _describe_sync(self, what: int) -> str:
        if what <= E_FLAG:
            return _obj_name(self.tp_plan, (self.rank, "f", E_FLAG - what))
        if what >= self.plan.n_counters:
            return f"rank {self.rank} always-ready counter {what}"
        if what >= 0:
            return _obj_name(self.tp_plan, (self.rank, "c", what))
        return f"rank {self.rank} " + self._describe_counter(what)

    def _describe_tp_task(self, ti: int) -> str:
        if ti < 0:
            return "the token's cross-rank pick" if ti == -1 else "the token start"
        t = [int(v) for v in self.plan.tasks[ti]]
        cta = int(np.searchsorted(self.plan.cta_start, ti, side="right") - 1)
        return f"task {ti} ({_name(*t)}, CTA {cta})"


class TPMonokernel:
    def __init__(self, cfg: ModelConfig, weights: Weights, G: int, ecfg: EngineConfig | None = None, devices=None,
                 max_seq: int | None = None, exchange_rows: int | None = None, pad_vocab: bool = False):
        from kog.engine.weights import check_weights
        check_weights(cfg, weights)
        self.cfg, self.G = cfg, G
        self.ecfg = ecfg or EngineConfig()
        self.shape = tp_shape(cfg, G, pad_vocab)
        self.pad_vocab = pad_vocab
        if self.ecfg.mode != "targeted":
            raise ConfigError(f"engine config: mode {self.ecfg.mode!r} is not supported with tensor parallelism "
                              f"(only 'targeted')")
        if self.ecfg.weight_ring:
            raise ConfigError("engine config: weight_ring is not supported with tensor parallelism yet")
        if G & (G - 1):
            raise ConfigError(f"tensor-parallel degree G={G} is not a power of two (1, 2, 4, 8)")
        self.devices = tp_devices(G, devices)
        self.vendor = vendor_code()
        shard = shard_config(cfg, G, pad_vocab)
        ex_cfg = self.ecfg.replace(ctas_per_sm=1) if self.vendor == INTERPRET else self.ecfg
        if exchange_rows is None:
            exchange_rows = default_exchange_rows(cfg, ex_cfg)
            if exchange_rows == 0:
                raise ConfigError(f"no exchange_rows fits this engine config: it must be a power of two dividing "
                                  f"hidden_size {cfg.hidden_size} and sync_rows, and a multiple of bn_o and bn_down")
        check_exchange_rows(cfg, ex_cfg, exchange_rows)
        self.exchange_rows = exchange_rows
        self._plans: dict[tuple, TPPlan] = {}
        self.ranks: list[_Rank] = []
        for r, dev in enumerate(self.devices):
            w = Weights({k: v.to(dev) for k, v in shard_weights(cfg, weights, G, r, pad_vocab).items()})
            self.ranks.append(_Rank(self, r, shard, w, self.ecfg, dev, max_seq))
        self.max_seq = self.ranks[0].max_seq
        self.plan = self.ranks[0].tp_plan
        self._enable_peer_access()
        self._alloc_exchange()
        self.compile_seconds: float | None = None

    def _plan_for(self, sms: int, ecfg: EngineConfig, attn_splits: int) -> TPPlan:
        key = (sms, ecfg, attn_splits)
        if key not in self._plans:
            p = make_tp_plan(self.cfg, ecfg, self.G, sms, self.exchange_rows, self.pad_vocab, attn_splits)
            check_tp_plan(p)
            self._plans[key] = p
        return self._plans[key]

    # ---- exchange buffers --------------------------------------------------------------------------------
    def _enable_peer_access(self) -> None:
        devs = self.devices
        if any(d.type != "cuda" for d in devs) or len(set(devs)) == 1:
            return
        for a in devs:
            for b in devs:
                if a != b and not torch.cuda.can_device_access_peer(a.index, b.index):
                    raise ConfigError(f"GPU {a.index} cannot access GPU {b.index}'s memory (no peer access): the "
                                      f"in-kernel exchange needs NVLink / PCIe peer access between all ranks")
        for a in devs:       # a peer copy makes torch enable peer access both ways (as kogprobe's p2p probe)
            for b in devs:
                if a != b:
                    torch.zeros(1, device=a).copy_(torch.ones(1, device=b))
        for d in devs:
            torch.cuda.synchronize(d)

    def _alloc_exchange(self) -> None:
        xl, L = self.plan.xl, self.cfg.num_layers
        self.bufs = []
        for dev in self.devices:
            b = {}
            for name, (shape, dt) in xl.buffers(L).items():
                if name == "counters":
                    continue           # the rank's Monokernel owns its local counters
                b[name] = torch.zeros(shape, dtype=getattr(torch, dt), device=dev)
            self.bufs.append(b)
        G = self.G
        for r, (mk, dev) in enumerate(zip(self.ranks, self.devices)):
            lo, _ = self.shape.vocab_range(r)
            tab = [r, lo, xl.sample_flag, 0, 0, 0, 0, 0]
            for name in ("recv", "flags", "sample_score", "sample_token"):
                tab += [self.bufs[p][name].data_ptr() for p in range(G)]
            assert len(tab) == TP_PEERS + 4 * G
            mk.peers = torch.tensor(tab, dtype=torch.int64, device=dev)

    # ---- launching ---------------------------------------------------------------------------------------
    def _sync(self) -> None:
        for d in self.devices:
            if d.type == "cuda":
                torch.cuda.synchronize(d)

    def _launch(self, first_token: int, pos0: int, n: int, forced: list[int] | None, temperature: float,
                seed: int, write_logits: bool) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        if sample_mode(temperature, 0, 1.0) == 2:
            raise ConfigError("top-k / top-p sampling is not supported with tensor parallelism")
        launches = []
        for r, mk in enumerate(self.ranks):
            with _on(mk.device):
                for b in self.bufs[r].values():
                    b.zero_()
                f = (torch.tensor(forced, dtype=torch.int32, device=mk.device) if forced is not None else None)
                args, opts = mk._launch_args(first_token, pos0, n, f, temperature, 0, 1.0, seed, write_logits,
                                             False)
                launches.append((mk.out, mk.logits, args, opts))
        self._sync()                       # every rank's flags are zero before any rank can bump a peer's
        t0 = time.perf_counter()
        for mk, (_, _, args, meta) in zip(self.ranks, launches):
            with _on(mk.device):
                mk._compile(args, meta)
        if self.compile_seconds is None and self.vendor != INTERPRET:
            self.compile_seconds = time.perf_counter() - t0
        if self.vendor == INTERPRET and self.G > 1:
            _interpreted_together(self.ranks, launches)
        else:
            for mk, (_, _, args, meta) in zip(self.ranks, launches):   # back to back, then synchronize
                with _on(mk.device):
                    mk._start(args, meta)
        self._sync()
        errs = []
        for mk in self.ranks:         # every rank's record: the first to time out is the cause, the rest wait on it
            try:
                mk._check_error()
            except MonokernelError as e:
                errs.append(str(e))
        if errs:
            raise MonokernelError("; ".join(errs))
        return [(o, lg if write_logits else None) for o, lg, _, _ in launches]

    # ---- prefill: the prompt's KV caches on every rank ------------------------------------------------------
    @torch.no_grad()
    def _prefill(self, prompt: list[int]) -> None:
        if not prompt:
            raise ConfigError("the prompt is empty")
        for mk in self.ranks:
            mk.ref.reset()
        if len(prompt) < 2:
            return
        toks = prompt[:-1]
        T, r0 = len(toks), self.ranks[0]
        eps, d0 = self.cfg.rms_norm_eps, r0.device
        x = r0.embed[torch.tensor(toks, device=d0)]
        for i in range(self.cfg.num_layers):
            h = rms_norm(x, r0.ref.layers[i]["attn_norm"], eps)
            parts = []
            for mk in self.ranks:
                ref, pos = mk.ref, torch.arange(T, device=mk.device)
                cos, sin = ref.cos[pos][:, None, :], ref.sin[pos][:, None, :]
                parts.append(TPReference._rank_attention_partial(None, ref, ref.layers[i], h.to(mk.device), i, pos,
                                                                 T, cos, sin).to(d0))
            x = (x.float() + all_reduce_partials(parts)).to(x.dtype)
            h = rms_norm(x, r0.ref.layers[i]["ffn_norm"], eps)
            parts = []
            for mk in self.ranks:
                Lw, hd = mk.ref.layers[i], h.to(mk.device)
                parts.append(F.linear(F.silu(F.linear(hd, Lw["w_gate"])) * F.linear(hd, Lw["w_up"]),
                                      Lw["w_down"]).to(d0))
            x = (x.float() + all_reduce_partials(parts)).to(x.dtype)

    # ---- public API ----------------------------------------------------------------------------------------
    def generate(self, prompt_ids, n: int, temperature: float = 0.0, seed: int = 0) -> tuple[list[int], float]:
        """n new tokens after the prompt (fewer at EOS) and the seconds of the decode launches."""
        prompt = [int(t) for t in prompt_ids]
        self._prefill(prompt)
        self._sync()
        t0 = time.perf_counter()
        res = self._launch(prompt[-1], len(prompt) - 1, n, None, temperature, seed, False)
        dt = time.perf_counter() - t0
        per_rank = []
        for mk, (out, _) in zip(self.ranks, res):
            ntok = int(mk.sync[5].item())
            per_rank.append(out.cpu().tolist()[:ntok])
        for r, toks in enumerate(per_rank[1:], 1):
            if toks != per_rank[0]:
                raise KogError(f"TP monokernel: rank {r}'s tokens differ from rank 0's (the ranks must agree "
                               f"bitwise): {toks[:8]} vs {per_rank[0][:8]}")
        return per_rank[0], dt

    def teacher_forced_logits(self, prompt_ids, forced_ids) -> torch.Tensor:
        """[n, V] float32 logits (gathered from the ranks' vocab slices onto rank 0's device)."""
        prompt, forced = [int(t) for t in prompt_ids], [int(t) for t in forced_ids]
        self._prefill(prompt)
        saved = [mk.n_eos for mk in self.ranks]
        for mk in self.ranks:
            mk.n_eos = 0
        try:
            res = self._launch(prompt[-1], len(prompt) - 1, len(forced), [prompt[-1]] + forced, 0.0, 0, True)
        finally:
            for mk, s in zip(self.ranks, saved):
                mk.n_eos = s
        d0 = self.ranks[0].device
        return torch.cat([lg.to(d0) for _, lg in res], dim=-1)[:, :self.cfg.vocab_size]

    @property
    def n_eos(self) -> int:
        return self.ranks[0].n_eos

    @n_eos.setter
    def n_eos(self, v: int) -> None:
        for mk in self.ranks:
            mk.n_eos = v


def _interpreted_together(ranks: list[_Rank], launches: list) -> None:
    """CPU only (TRITON_INTERPRET=1): run the G ranks' 1-CTA launches at the same time, one Python thread
    each, so they can wait on each other's flags (plain CPU memory; the GIL serializes the interpreter's
    atomics). The interpreter patches triton.language for the length of a launch and restores it at the
    end, which would pull the patch from under a rank still running: an outer patch held here keeps it in
    place until every rank has finished. Every spin in the kernel is bounded, and so is each join."""
    import threading

    from triton.runtime.interpreter import _patch_lang

    from kog.engine.kernel import monokernel
    errors: list[BaseException | None] = [None] * len(ranks)

    def run(i: int) -> None:
        try:
            ranks[i]._start(launches[i][2], launches[i][3])
        except BaseException as e:          # reported below, on the caller's thread
            errors[i] = e

    scope = _patch_lang(monokernel.fn)
    try:
        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(ranks))]
        for t in threads:
            t.start()
        for i, t in enumerate(threads):
            t.join(timeout=600)
            if t.is_alive():
                raise KogError(f"TP monokernel (interpreted): rank {i} still running after 600 s")
    finally:
        scope.restore()
    for i, e in enumerate(errors):
        if e is not None:
            raise KogError(f"TP monokernel (interpreted): rank {i} failed: {_innermost(e)}") from e


def _innermost(e: BaseException) -> str:
    """The exception a chain of InterpreterErrors wraps: the interpreter re-raises each nested device call's
    error as InterpreterError(repr(inner)), so the outer message is the root's repr escaped once a level."""
    while e.__cause__ is not None:
        e = e.__cause__
    return f"{type(e).__name__}: {e}"


class _on:
    """torch.cuda.device(d) for a CUDA device, nothing for the CPU."""

    def __init__(self, d: torch.device):
        self.ctx = torch.cuda.device(d) if d.type == "cuda" else None

    def __enter__(self):
        if self.ctx is not None:
            self.ctx.__enter__()

    def __exit__(self, *a):
        if self.ctx is not None:
            self.ctx.__exit__(*a)
