"""The monokernel as the `kogtune bench` systems kog-targeted, kog-grid and kog-rule (kog.tune.bench registers
them).

Built on the engine's public API only (kog.engine.monokernel.Monokernel); the config comes from
kog.tune.store.tuned_config unless one is given, or for kog-rule from the platform's rule
(kog.engine.monokernel.platform_default) whatever the store and the built-in table hold: the same run then
shows what a tuned entry gains over the rule it replaced.
"""
from __future__ import annotations

from typing import Any

from kog.tune.bench import BREAKDOWN_CATEGORIES, run_positions

MIN_MAX_SEQ = 64             # smallest cache an engine is built for, so short runs share one build
BREAKDOWN_TOKENS = 48        # tokens of the instrumented run behind breakdown()
TRACE_TOKENS = 8             # tokens the instrumented run records per task


def engine_max_seq(need: int) -> int:
    """The KV cache KogSystem builds for a run of `need` positions."""
    return max(need, MIN_MAX_SEQ)


def engine_span(cfg, need: int) -> int:
    """The attention span of the engine KogSystem builds for a run of `need` positions."""
    return cfg.attention_span(engine_max_seq(need))


def config_for(cfg, device, span: int | None, rule: bool = False):
    """(config, where it came from): what kog-targeted runs (kog.tune.store.tuned_choice), or with `rule` the
    platform's rule for that span."""
    if rule:
        from kog.engine.monokernel import platform_default
        return platform_default(cfg, device, span), "rule"
    from kog.tune.store import tuned_choice
    return tuned_choice(cfg, device, span)


def tuned_differs_from_rule(cfg, device, need: int) -> bool:
    """Whether a run of `need` positions gets a stored or built-in config other than the rule's (the mode
    and the wait bound aside): only then has kog-rule anything of its own to measure."""
    span = engine_span(cfg, need)
    a, b = (config_for(cfg, device, span, rule)[0].replace(mode="targeted", wait_timeout_s=0.0)
            for rule in (False, True))
    return a != b


class KogSystem:
    """The monokernel in one sync mode: greedy, EOS ignored (the bench times a fixed token count), the tuned
    config for this GPU and model unless `ecfg` is given (`rule`: the platform's rule instead of the tuned
    config). The engine is built for the longest cache asked for so far, and rebuilt (with the config for
    that span) when a run needs a longer one."""

    def __init__(self, cfg, weights, device, mode: str, ecfg=None, rule: bool = False):
        self.cfg, self.weights, self.device, self.mode = cfg, weights, device, mode
        self._given, self._rule = ecfg, rule
        self.ecfg = self._config(None)
        self.mk = None
        self._last_prompt: list[int] | None = None

    def _config(self, span: int | None):
        if self._given is not None:
            self.config_source = "given"
            return self._given.replace(mode=self.mode)
        ecfg, self.config_source = config_for(self.cfg, self.device, span, self._rule)
        return ecfg.replace(mode=self.mode)

    def _engine(self, need: int):
        if self.mk is not None and self.mk.max_seq >= need:
            return self.mk
        from kog.engine.monokernel import Monokernel
        max_seq = engine_max_seq(need)
        span = engine_span(self.cfg, need)
        self.ecfg = self._config(span)          # a long cache may need another config (fewer ring slots)
        self.mk = Monokernel(self.cfg, self.weights, self.ecfg, self.device, max_seq=max_seq,
                             trace_tokens=TRACE_TOKENS)
        self.mk.n_eos = 0
        return self.mk

    def generate(self, prompt_ids, n: int):
        self._last_prompt = list(prompt_ids)
        return self._engine(run_positions(len(self._last_prompt), n)).generate(self._last_prompt, n)

    def teacher_forced_logits(self, prompt_ids, forced_ids):
        need = run_positions(len(prompt_ids), len(forced_ids))      # the forced tokens are the run's
        return self._engine(need).teacher_forced_logits(prompt_ids, forced_ids)

    def breakdown(self) -> dict[str, Any]:
        """The bench's categories per token, plus the traced rate, the per-phase numbers and the compile time;
        the instrumented run's trace table is kept as self.trace_table."""
        prompt = self._last_prompt or [1, 2, 3, 4]
        mk = self._engine(run_positions(len(prompt), BREAKDOWN_TOKENS))
        b = mk.breakdown(prompt, n=BREAKDOWN_TOKENS)
        self.trace_table = b.pop("table", None)
        out: dict[str, Any] = {k: b[k] for k in BREAKDOWN_CATEGORIES}
        out.update(seconds_per_token_traced=b["seconds_per_token"], phases=b.pop("phases", {}),
                   compile_seconds=mk.compile_seconds)
        return out
