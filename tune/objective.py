"""The objective: the engine's median tok/s behind a correctness gate, each trial in its own process.

Child side (run by kog.tune.worker): `gpu_trial` builds the monokernel for one EngineConfig, checks its
teacher-forced logits against the reference (max_rel_err <= 2e-2, else CorrectnessError: a wrong config is
a failed trial, never a best), reports a short measurement (for pruning), then returns the median tok/s of
`repeats` runs. `sim_trial` does the same with the simulator's prediction.

Parent side: `Objective(ctx)(trial)` samples a config, rejects impossible ones before any launch
(PRUNED, reason in user attr 'fail_reason'), runs the child through kog.tune.isolation, forwards the short
measurement to trial.report()/should_prune(), and turns every failure into a FAILED trial with its
'fail_reason' (raising TrialFailed, which the study catches).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

from kog.engine.engine_config import EngineConfig

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
    pr = predict(model, cfg, scan)
    if not pr.feasible:
        raise LaunchError(pr.reason)
    report(0, pr.tok_per_s)
    return {"value": pr.tok_per_s, "breakdown": pr.breakdown, "max_rel_err": 0.0, "simulated": True}


def _teacher_forced(mk, prompt: list[int], forced: list[int]):
    import inspect
    fn = mk.teacher_forced_logits
    try:
        n = len(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        n = 2
    return fn(prompt, forced) if n >= 2 else fn(prompt + forced)[-len(forced):]


def gpu_trial(payload: dict[str, Any], report: Callable[[int, float], None]) -> dict[str, Any]:
    import torch
    from kog.engine.monokernel import Monokernel   # the lead's engine (lazy: heavy, GPU only)
    from kog.engine.reference import Reference
    from kog.engine.weights import resolve_model
    seed = int(payload.get("seed", 0))
    device = payload.get("device", "cuda")
    model, weights = resolve_model(payload["model"], device=device, seed=seed)
    cfg = EngineConfig.from_dict(payload["config"])
    mk = Monokernel(model, weights, cfg, device)
    g = torch.Generator().manual_seed(seed)
    V = model.vocab_size
    prompt = torch.randint(0, V, (int(payload.get("prompt_tokens", 16)),), generator=g).tolist()
    forced = torch.randint(0, V, (int(payload.get("gate_tokens", 16)),), generator=g).tolist()
    # the gate: teacher-forced logits against the reference
    got = _teacher_forced(mk, prompt, forced).float()
    ref = Reference(model, weights).teacher_forced_logits(prompt, forced).float().to(got.device)
    rel = float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6))
    if not rel <= MAX_REL_ERR:   # NaN fails too
        raise CorrectnessError(f"max_rel_err {rel:.3g} > {MAX_REL_ERR:g} (teacher-forced logits vs reference)")
    n = int(payload.get("tokens", 128))
    mk.generate(prompt, min(n, 8))                          # warm-up
    _, s = mk.generate(prompt, max(8, n // 4))
    report(0, max(8, n // 4) / s)                           # short measurement: prunable
    speeds = []
    for _ in range(int(payload.get("repeats", 3))):
        _, s = mk.generate(prompt, n)
        speeds.append(n / s)
    out: dict[str, Any] = {"value": statistics.median(speeds), "max_rel_err": rel, "runs": speeds}
    try:
        out["breakdown"] = mk.breakdown()
    except Exception:
        pass
    return out


def precompile_one(payload: dict[str, Any], report: Callable[[int, float], None]) -> dict[str, Any]:
    """Compile one kernel variant (child side of search.precompile)."""
    from kog.engine import monokernel   # type: ignore[attr-defined]
    from kog.tune.space import resolve_model_config
    model = resolve_model_config(payload["model"])
    monokernel.precompile(model, EngineConfig.from_dict(payload["config"]))
    return {"value": 0.0}


TARGETS = {"gpu": "kog.tune.objective:gpu_trial", "sim": "kog.tune.objective:sim_trial"}


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


class Objective:
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

    def __call__(self, trial) -> float:
        import optuna
        from kog.tune.space import Infeasible, check
        cfg = self.space.suggest(trial)
        trial.set_user_attr("config", cfg.to_dict())
        try:
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

        def on_intermediate(step: int, value: float) -> bool:
            trial.report(value, step)
            return trial.should_prune()

        from kog.tune.isolation import run_isolated
        out = run_isolated(self.ctx.target or TARGETS[self.ctx.backend], payload, self.ctx.timeout,
                           on_intermediate, env=self.ctx.env)
        trial.set_user_attr("wall_s", round(out.wall_s, 3))
        if out.status == "pruned":
            trial.set_user_attr("fail_reason", out.reason)
            raise optuna.TrialPruned(out.reason)
        if not out.ok:
            trial.set_user_attr("fail_reason", out.reason)
            trial.set_user_attr("fail_kind", out.status)
            raise TrialFailed(out.reason)
        for k in ("breakdown", "max_rel_err", "simulated", "runs"):
            if k in out.data:
                trial.set_user_attr(k, out.data[k])
        return float(out.value)
