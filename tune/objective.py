"""The objective: the engine's median tok/s behind a correctness gate, each trial in an isolated process.

Child side (run by kog.tune.worker): `gpu_trial` builds the monokernel for one EngineConfig, checks its
teacher-forced logits against the reference computed in float32 (max_rel_err <= 2e-2, else CorrectnessError: a wrong config is
a failed trial, never a best; with payload "tp" {"G" > 1, "exchange_rows"} it builds the tensor-parallel
engine kog.engine.tp_monokernel.TPMonokernel over cuda:0..G-1 instead), reports a short measurement (for pruning), then returns the median tok/s of
`repeats` runs (TRIAL_DEFAULTS: 128 tokens x 3). In a warm worker (isolation.WarmWorker) the weights, the
prompt and the reference logits are made once per process (model_state, kept in kog.tune.worker.CACHE),
so a trial costs the Monokernel build, the gate and the timed runs. `precompile_one` compiles the kernel
variants of a config without running them (over placeholder weights: compile_state). `sim_trial` does the
same with the simulator's prediction.

Parent side: `Objective(ctx)(trial)` samples a config, rejects impossible ones before any launch
(PRUNED, reason in user attr 'fail_reason'), runs the child through kog.tune.isolation (ctx.runner: a warm
worker; else a fresh process per trial), forwards the short
measurement to trial.report()/should_prune(), and turns every failure into a FAILED trial with its
'fail_reason' (raising TrialFailed, which the study catches).
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

from kog.engine.engine_config import EngineConfig
from kog.tune.bench import DEFAULT_PROMPT_TOKENS, DEFAULT_TOKENS, run_positions
from kog.tune.systems import engine_max_seq

MAX_REL_ERR = 2e-2


class CorrectnessError(Exception):
    """Teacher-forced logits disagree with the reference."""


class LaunchError(Exception):
    """The config cannot be launched (e.g. too many co-resident CTAs)."""


class TrialFailed(Exception):
    """Raised by the objective so Optuna records a FAILED trial (the study catches it and goes on)."""


# ---- child side --------------------------------------------------------------------------------
def sim_trial(payload: dict[str, Any], report: Callable[[int, float], None]) -> dict[str, Any]:
    from kog.tune.scan_model import load_scan
    from kog.tune.simulator import predict
    from kog.tune.space import resolve_model_config
    model = resolve_model_config(payload["model"])
    cfg = EngineConfig.from_dict(payload["config"])
    scan = load_scan(payload.get("scan"))
    g, x = tp_of(payload)
    if g > 1:
        from kog.tune.simulator import predict_tp
        pr = predict_tp(model, cfg, g, x, scan)
    else:
        pr = predict(model, cfg, scan)
    if not pr.feasible:
        raise LaunchError(pr.reason)
    report(0, pr.tok_per_s)
    return {"value": pr.tok_per_s, "breakdown": pr.breakdown, "max_rel_err": 0.0, "simulated": True}


def tp_of(payload: dict[str, Any]) -> tuple[int, int | None]:
    """(G, exchange_rows) of a payload: (1, None) without tensor parallelism."""
    tp = payload.get("tp") or {}
    g = int(tp.get("G", 1))
    return g, (int(tp["exchange_rows"]) if g > 1 and tp.get("exchange_rows") else None)


def _teacher_forced(mk, prompt: list[int], forced: list[int]):
    import inspect
    fn = mk.teacher_forced_logits
    try:
        n = len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        n = 2
    return fn(prompt, forced) if n >= 2 else fn(prompt + forced)[-len(forced):]


# `kogtune bench`'s default run: the prompt and the new tokens it times; the search's closing confirmation times
# the same (search.CONFIRM_PROTOCOL)
BENCH_PROTOCOL: dict[str, int] = {"prompt_tokens": DEFAULT_PROMPT_TOKENS, "tokens": DEFAULT_TOKENS}


def bench_max_seq(prompt_tokens: int, tokens: int) -> int:
    """The KV cache `kogtune bench` builds for a run (kog.tune.systems.KogSystem). The cache's capacity sets the
    attention splits, so the plan (a task per split) and the kernel's merge tile, and a config's speed moves with
    them (docs/tuning.md): trials and the confirmation run the bench's cache."""
    return engine_max_seq(run_positions(prompt_tokens, tokens))


# Measurement defaults (payload keys override them). Every decode length is a multiple of 16 so that all of a
# trial's generate() launches share one Triton specialization (ints are specialized on divisibility by 16),
# and precompile_one compiles exactly the variants a trial launches. max_seq: the KV cache of `kogtune
# bench`'s default run, whatever the trial's own shorter protocol (_max_seq makes room for a longer one).
TRIAL_DEFAULTS: dict[str, Any] = {"prompt_tokens": 16, "gate_tokens": 16, "warmup_tokens": 16,
                                  "short_tokens": 32, "tokens": 128, "repeats": 3,
                                  "max_seq": bench_max_seq(**BENCH_PROTOCOL), "seed": 0}


def _opt(payload: dict[str, Any], k: str) -> Any:
    return payload.get(k, TRIAL_DEFAULTS[k])


def _max_seq(payload: dict[str, Any]) -> int:
    """The trial engine's KV cache: max_seq, or more where the payload's runs need more positions."""
    runs = max(int(_opt(payload, k)) for k in ("gate_tokens", "warmup_tokens", "short_tokens", "tokens"))
    return max(int(_opt(payload, "max_seq")), run_positions(int(_opt(payload, "prompt_tokens")), runs))


def model_state(payload: dict[str, Any], gate: bool = True) -> dict[str, Any]:
    """Weights, prompt, forced tokens and (gate=True) the reference's teacher-forced logits of the payload's
    model: generated once per worker process and kept in kog.tune.worker.CACHE, so a warm worker pays for
    them on its first trial only. One model at a time (GPU memory): another model replaces it."""
    import torch
    from kog.engine.weights import resolve_model
    from kog.tune.worker import CACHE
    seed, device = int(_opt(payload, "seed")), payload.get("device", "cuda")
    dtype = payload.get("dtype")          # None: the model's own (CPU interpreter tests use float32)
    key = ("model", payload["model"], seed, device, dtype, int(_opt(payload, "prompt_tokens")),
           int(_opt(payload, "gate_tokens")))
    st = CACHE.get(key)
    if st is None:
        _drop_cached(key[0])
        model, weights = resolve_model(payload["model"], device=device, seed=seed, dtype=dtype)
        st = CACHE[key] = {"model": model, "weights": weights, **_tokens(payload, model.vocab_size), "ref": None}
    if gate and st["ref"] is None:
        from kog.engine.reference import Reference
        # the oracle: the reference computed in float32 over the same weights (kog.tune.bench's max_rel_err)
        st["ref"] = Reference(st["model"], st["weights"], compute_dtype=torch.float32).teacher_forced_logits(
            st["prompt"], st["forced"]).float()
    return st


def _drop_cached(kind: str) -> None:
    """Forget the worker's cached state of this kind ("model", "shapes"): one model at a time (GPU memory)."""
    from kog.tune.worker import CACHE
    for k in [k for k in CACHE if isinstance(k, tuple) and k[:1] == (kind,)]:
        del CACHE[k]


def _tokens(payload: dict[str, Any], vocab_size: int) -> dict[str, list[int]]:
    """The prompt and the teacher-forced tokens of the payload's seed."""
    import torch
    g = torch.Generator().manual_seed(int(_opt(payload, "seed")))
    prompt = torch.randint(0, vocab_size, (int(_opt(payload, "prompt_tokens")),), generator=g).tolist()
    forced = torch.randint(0, vocab_size, (int(_opt(payload, "gate_tokens")),), generator=g).tolist()
    return {"prompt": prompt, "forced": forced}


def compile_state(payload: dict[str, Any]) -> dict[str, Any]:
    """What precompile_one builds its engines from: the payload's model config, placeholder weights
    (kog.engine.weights.placeholder_weights: the compile needs their shapes, dtype and alignment, not their
    bytes, so a compile process holds a CUDA context and the engine's small buffers, not a copy of the
    model), and the prompt and forced tokens of model_state. Kept in kog.tune.worker.CACHE as model_state."""
    from kog.engine.weights import placeholder_weights, resolve_config
    from kog.tune.worker import CACHE
    device, dtype = payload.get("device", "cuda"), payload.get("dtype")
    key = ("shapes", payload["model"], int(_opt(payload, "seed")), device, dtype,
           int(_opt(payload, "prompt_tokens")), int(_opt(payload, "gate_tokens")))
    if key not in CACHE:
        _drop_cached(key[0])
        model = resolve_config(payload["model"], dtype=dtype)
        CACHE[key] = {"model": model, "weights": placeholder_weights(model, device),
                      **_tokens(payload, model.vocab_size)}
    return CACHE[key]


def sm_partition(payload: dict[str, Any]) -> dict[int, int] | None:
    """SM id -> L2 partition from a kogprobe scan (kog.probe.scan.find_scan: the payload's 'scan' directory,
    else this GPU's): what mapping='topology' is built from. A scan of another unit of the same GPU model
    may map a few SMs differently (floorsweeping), which costs locality, never correctness. None without a
    scan (the engine then refuses topology with its own one-line ConfigError)."""
    from kog.tune.worker import CACHE
    key = ("sm_partition", payload.get("scan"))
    if key not in CACHE:
        CACHE[key] = None
        try:
            import torch
            from kog.probe.scan import find_scan
            name = torch.cuda.get_device_name() if torch.cuda.is_available() else None
            # without a GPU and without a given scan there is no device to find a scan of
            d = find_scan(payload.get("scan"), name) if payload.get("scan") or name else None
            parts = json.loads((d / "summary.json").read_text()).get("l2_partitions") if d else None
            if parts:
                CACHE[key] = {int(sm): i for i, lst in enumerate(parts) for sm in lst}
        except Exception:
            pass
    return CACHE[key]


def _build(payload: dict[str, Any], st: dict[str, Any], compile_only: bool = False):
    cfg = EngineConfig.from_dict(payload["config"])
    g, x = tp_of(payload)
    if g > 1:
        # the TP engine: rank r on cuda:r (the worker sees every GPU: search refuses --tp with --workers > 1)
        from kog.engine.tp_monokernel import TPMonokernel
        dev = str(payload.get("device", "cuda"))
        devices = None if dev.startswith("cuda") else [dev] * g   # CPU interpreter tests: every rank on cpu
        mk = TPMonokernel(st["model"], st["weights"], g, cfg, devices=devices,
                          max_seq=_max_seq(payload), exchange_rows=x)
        mk.n_eos = 0        # its setter sets every rank's n_eos (a rank's EOS ends the token stream)
        return mk
    from kog.engine.monokernel import Monokernel   # lazy: heavy, and only the GPU backend builds it
    part = sm_partition(payload) if cfg.mapping == "topology" else None
    mk = Monokernel(st["model"], st["weights"], cfg, payload.get("device", "cuda"),
                    max_seq=_max_seq(payload), sm_partition=part, compile_only=compile_only)
    mk.n_eos = 0            # as `kogtune bench`: an EOS drawn from random weights must not end a timed run
    return mk


def gpu_trial(payload: dict[str, Any], report: Callable[[int, float], None]) -> dict[str, Any]:
    """One measured trial: gate, warm-up, short (prunable) run, then `repeats` timed runs of `tokens`."""
    import time
    t0 = time.perf_counter()
    fresh = "model" not in {k[0] for k in _cache_keys()}
    st = model_state(payload)
    t_state = time.perf_counter() - t0
    # a warm worker's allocator keeps the earlier trials' freed packings cached; trials pack the weights at
    # different sizes, so that cache grows by about a model at each new size until Triton's own allocations
    # (outside it) run out of memory: handed back before each engine
    from kog.engine.monokernel import release_gpu_memory
    release_gpu_memory()
    mk = _build(payload, st)
    prompt, forced = st["prompt"], st["forced"]
    # the gate: teacher-forced logits against the reference (the first launch: loads the kernel)
    t1 = time.perf_counter()
    got = _teacher_forced(mk, prompt, forced).float()
    gate_s = time.perf_counter() - t1
    ref = st["ref"].to(got.device)
    rel = float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
    if not rel <= MAX_REL_ERR:   # NaN fails too
        raise CorrectnessError(f"max_rel_err {rel:.3g} > {MAX_REL_ERR:g} (teacher-forced logits vs reference)")
    n, short = int(_opt(payload, "tokens")), int(_opt(payload, "short_tokens"))
    t1 = time.perf_counter()
    mk.generate(prompt, int(_opt(payload, "warmup_tokens")))        # warm-up (the generate variant loads)
    warmup_s = time.perf_counter() - t1
    _, s = mk.generate(prompt, short)
    report(0, short / s)                                             # short measurement: prunable
    speeds = []
    for _ in range(int(_opt(payload, "repeats"))):
        _, s = mk.generate(prompt, n)
        speeds.append(n / s)
    out: dict[str, Any] = {"value": statistics.median(speeds), "max_rel_err": rel, "runs": speeds,
                           "setup_s": round(t_state, 3), "trial_s": round(time.perf_counter() - t0, 3),
                           "gate_s": round(gate_s, 3), "warmup_s": round(warmup_s, 3),
                           "warm": not fresh}
    for k in ("compile_seconds", "kernel_regs", "kernel_spills"):
        v = getattr(mk, k, None)
        if v is not None:
            out[k] = v
    return out


def _cache_keys():
    from kog.tune.worker import CACHE
    return [k for k in CACHE if isinstance(k, tuple)]


class _CompileOnly:
    """Stands in for the engine's Triton kernel during precompile_one: every launch becomes warmup()
    (compile + load, same specialization as the real launch) and nothing runs on the GPU, so compiling
    ahead in parallel never disturbs a measurement running on the same GPU."""

    def __init__(self, fn):
        self.fn = fn

    def warmup(self, *args, **kw):
        return self.fn.warmup(*args, **kw)

    def __getitem__(self, grid):
        return lambda *args, **kw: self.fn.warmup(*args, grid=grid, **kw)

    def __getattr__(self, name):
        return getattr(self.fn, name)


def precompile_one(payload: dict[str, Any], report: Callable[[int, float], None]) -> dict[str, Any]:
    """Compile the kernel variants gpu_trials of these configs launch (child side of search.precompile):
    payload 'configs' (or one 'config'), normally all with one kernel_key. Each is built as gpu_trial
    builds it (max_seq, EOS handling, SM partition) and driven through the same calls with the same decode
    lengths, launches replaced by warmup(): Triton specializes int arguments (== 1, divisible by 16), and
    some come from the plan (counter and trace-buffer sizes, the topology flag), so configs that share a
    compile_key() can still need their own variant. One worker does a group in order, so a variant is
    compiled once and the group's other configs are cache hits. A config that cannot be co-resident fails
    here already (ConfigError from the engine's residency check): it is counted, the rest go on."""
    import time
    from kog.engine import kernel as K
    from kog.engine.kernel.vendor import INTERPRET, vendor_code
    t0 = time.perf_counter()
    if tp_of(payload)[0] > 1:
        # the TP engine's G launches wait on each other's flags: warmup() stand-ins would leave its token
        # loop waiting; a TP trial compiles on its first (gate) launch instead (search skips it here too)
        return {"value": time.perf_counter() - t0, "compiled": 0, "failed": [], "kernel_regs": [],
                "skipped": "tensor-parallel config: compiled by its trial"}
    st = compile_state(payload)
    cfgs = payload.get("configs") or [payload["config"]]
    interp = vendor_code() == INTERPRET   # nothing to compile: the interpreter runs the Python source
    done, failed, regs = 0, [], []
    real = K.monokernel
    if not interp:
        K.monokernel = _CompileOnly(real)
    try:
        for c in cfgs:
            try:
                # compile_only: no packed weight copy in this process (kog.engine.monokernel)
                mk = _build({**payload, "config": c}, st, compile_only=not interp)
                if interp:
                    continue
                mk._prefill = lambda prompt: None   # the reference prefill would run GPU kernels
                _teacher_forced(mk, st["prompt"], st["forced"])
                for k in ("warmup_tokens", "short_tokens", "tokens"):
                    mk.generate(st["prompt"], int(_opt(payload, k)))
                done += 1
                regs.append(getattr(mk, "kernel_regs", None))
            except Exception as e:
                if type(e).__name__ not in ("ConfigError", "CompilationError") or len(cfgs) == 1:
                    raise
                failed.append(f"{type(e).__name__}: {e}"[:300])
            finally:
                mk = None
                if not interp:
                    import torch
                    torch.cuda.empty_cache()    # keep this process's GPU memory at one engine's, not its peak
    finally:
        K.monokernel = real
    return {"value": time.perf_counter() - t0, "compiled": done, "failed": failed, "kernel_regs": regs}


TARGETS = {"gpu": "kog.tune.objective:gpu_trial", "sim": "kog.tune.objective:sim_trial"}
COMPILE_TARGET = "kog.tune.objective:precompile_one"


# ---- parent side -------------------------------------------------------------------------------
@dataclass
class TrialContext:
    model_spec: str
    model: Any                      # ModelConfig
    sms: int
    backend: str = "sim"            # "gpu" | "sim"
    timeout: float = 120.0
    scan_path: str | None = None
    space: Any = None               # kog.tune.space.Space
    payload_extra: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] | None = None
    target: str | None = None       # override the child function (tests)
    runner: Any = None              # a kog.tune.isolation.WarmWorker; None: a fresh process per trial
    gpus: int = 1                   # GPUs a trial may use (tensor-parallel degrees above it are rejected)


class Objective:
    """prepare(trial) samples and checks a config (no launch); execute(trial, payload) runs it isolated.
    Calling the objective does both (what study.optimize wants); search.optimize_ahead calls them apart so
    the kernels of the next trials compile while the current ones are measured."""

    def __init__(self, ctx: TrialContext):
        from kog.tune.space import build_space, residency_fn
        self.ctx = ctx
        self.space = ctx.space or build_space(ctx.model, has_scan=True)
        self.max_ctas = residency_fn(ctx.backend)

    def _same_config(self, trial):
        """A finished trial of this study with the same params (COMPLETE, or FAIL other than a hang)."""
        import optuna
        TS = optuna.trial.TrialState
        for t in trial.study.get_trials(deepcopy=False, states=(TS.COMPLETE, TS.FAIL)):
            if t.number != trial.number and t.params == trial.params and (
                    t.state == TS.COMPLETE or t.user_attrs.get("fail_kind") not in (None, "hang")):
                return t
        return None

    def prepare(self, trial) -> dict[str, Any] | float:
        """The payload to run, or the value of an identical finished trial; raises optuna.TrialPruned for
        an impossible config and TrialFailed for one that failed before."""
        import optuna
        from kog.tune.space import Infeasible, check, check_tp, tp_from_params
        cfg = self.space.suggest(trial)
        trial.set_user_attr("config", cfg.to_dict())
        g, x = tp_from_params(trial.params)
        tp = {"G": g, "exchange_rows": x}
        if g > 1:
            trial.set_user_attr("tp", tp)
        try:
            # the TP reasons first (a grid-mode TP trial is refused for being grid mode, whatever else)
            check_tp(cfg, self.ctx.model, g, x, self.ctx.gpus, self.ctx.sms, self.max_ctas)
            check(cfg, self.ctx.model, self.ctx.sms, self.max_ctas)
        except Infeasible as e:
            trial.set_user_attr("fail_reason", f"invalid: {e}")
            raise optuna.TrialPruned(f"invalid: {e}") from None
        prev = self._same_config(trial)
        if prev is not None:      # measured already (another worker, an earlier run): no new launch
            if prev.state == optuna.trial.TrialState.COMPLETE:
                trial.set_user_attr("reused_from", prev.number)
                return float(prev.value)
            reason = f"same config failed in trial {prev.number}: {prev.user_attrs.get('fail_reason', '')}"
            trial.set_user_attr("fail_reason", reason[:500])
            trial.set_user_attr("fail_kind", prev.user_attrs.get("fail_kind", "error"))
            raise TrialFailed(reason)
        payload = {"model": self.ctx.model_spec, "config": cfg.to_dict(), "scan": self.ctx.scan_path,
                   **self.ctx.payload_extra}
        if g > 1:
            payload["tp"] = tp
        return payload

    def execute(self, trial, payload: dict[str, Any]) -> float:
        import optuna

        def on_intermediate(step: int, value: float) -> bool:
            trial.report(value, step)
            return trial.should_prune()

        target = self.ctx.target or TARGETS[self.ctx.backend]
        if self.ctx.runner is not None:
            out = self.ctx.runner.run(target, payload, self.ctx.timeout, on_intermediate)
        else:
            from kog.tune.isolation import run_isolated
            out = run_isolated(target, payload, self.ctx.timeout, on_intermediate, env=self.ctx.env)
        trial.set_user_attr("wall_s", round(out.wall_s, 3))
        trial.set_user_attr("fresh_worker", out.fresh_worker)
        if out.status == "pruned":
            trial.set_user_attr("fail_reason", out.reason)
            raise optuna.TrialPruned(out.reason)
        if not out.ok:
            trial.set_user_attr("fail_reason", out.reason)
            trial.set_user_attr("fail_kind", out.status)
            raise TrialFailed(out.reason)
        for k in ("breakdown", "max_rel_err", "simulated", "runs", "trial_s", "compile_seconds", "kernel_regs",
                  "kernel_spills", "gate_s", "warmup_s"):
            if k in out.data:
                trial.set_user_attr(k, out.data[k])
        return float(out.value)

    def __call__(self, trial) -> float:
        p = self.prepare(trial)
        return p if isinstance(p, float) else self.execute(trial, p)
