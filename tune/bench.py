"""`kogtune bench`: the monokernel against the conventional stacks, in one process, on the same weights.

Systems come from a registry: register_system(name, factory) where factory(cfg, weights, device) returns an
object with

    generate(prompt_ids, n) -> (tokens, seconds)      n greedy tokens; seconds times the n decode steps only
    teacher_forced_logits(prompt_ids, forced_ids) -> [n, V]   optional: prefill the prompt but its last token,
                                                      then feed prompt[-1], forced[0..n-2]; row j predicts forced[j]
    breakdown() -> {category: seconds_per_token}      optional: streaming / waiting / barrier / other
                                                      (other JSON-able keys are kept as breakdown_extra)
A run that returns fewer than n tokens (stopped at EOS) is rated over the tokens it made and marked
stopped_early; a system should ignore EOS under the bench.

The baselines (kog.tune.baselines) and the monokernel's kog-targeted, kog-grid and kog-rule (kog.tune.systems)
are registered here; the latter show as 'error: not built' when kog.engine.monokernel does not import. kog-rule
(targeted mode with the platform's rule) is benched by default only where kog-targeted runs a tuned config.

Correctness gate: max_rel_err = max over teacher-forced steps j of max_v |a[j,v] - b[j,v]| / max_v |b[j,v]|,
b the oracle's logits for the model-dtype Reference's own greedy tokens. The oracle (top-level
max_rel_err_oracle) is the Reference computed in float32 over the same checkpoint weights (each bf16/fp16
matrix upcast for its product): the model's math without per-op rounding. Beside it, max_rel_err_model_dtype_ref
is the same measure against the Reference run in the model dtype (eager, as HF transformers computes), and the
top-level reference_max_rel_err_vs_fp32 is that model-dtype Reference's own distance from the oracle: on the
bf16 presets it is above 2e-2, so a model-dtype reference cannot serve as a 2e-2 yardstick (two correct bf16
implementations differ by about that much). With float32 weights the Reference itself is the oracle.
kog.reports.bench_tables.rel_errs reads these errors from a bench document of this layout or the older one.
"""
from __future__ import annotations

import datetime as _dt
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

from kog.errors import KogError, NotBuiltError, UsageError

_REGISTRY: dict[str, Callable] = {}
KOG_SYSTEMS = {"kog-targeted": "targeted", "kog-grid": "grid"}     # system -> sync mode
# targeted mode with the platform's rule, whatever config is stored or built in; benched by default only where
# kog-targeted runs another config (a tuned entry), so the run holds what the entry gains over the rule
RULE_SYSTEM = "kog-rule"
# the run a bench times by default: its prompt and its new tokens (the search's closing confirmation times the
# same, kog.tune.search.CONFIRM_PROTOCOL)
DEFAULT_PROMPT_TOKENS, DEFAULT_TOKENS = 64, 256


def run_positions(prompt_tokens: int, tokens: int) -> int:
    """KV cache positions a run of `tokens` new tokens after a prompt of `prompt_tokens` needs."""
    return prompt_tokens + tokens + 1


# Baselines first: a monokernel that faults the CUDA context then cannot take the baselines' numbers with it.
DEFAULT_SYSTEMS = ("torch-compile", "hf-compile", "cuda-graph", "hf-transformers", "kog-grid", "kog-targeted",
                   RULE_SYSTEM)
BREAKDOWN_CATEGORIES = ("streaming", "waiting", "barrier", "other")
# The instrumented run's trace goes into the run as table `timeline`: whole traced tokens, at most this
# many rows per system (at least one token), so a bench run stays a few MB and its report draws quickly.
TIMELINE_ROWS_PER_SYSTEM = 100_000
# HF generate without compile runs at a few dozen tok/s at batch 1: its rate is measured over fewer tokens and
# runs, so the whole bench of every preset stays short (the JSON's `reduced_runs` says so)
HF_MAX_TOKENS = 32
HF_MAX_REPEATS = 3
# a greedy token that leaves the reference's is accepted where the reference's top two logits there are
# closer than this share of its largest |logit| (a near-tie: rounding decides, not a wrong model)
NEAR_TIE = 2e-2
# NVML's clock event (throttle) reasons, by bit
CLOCK_REASONS = {0x1: "idle", 0x2: "applications clocks", 0x4: "software power cap", 0x8: "hardware slowdown",
                 0x10: "sync boost", 0x20: "software thermal", 0x40: "hardware thermal", 0x80: "power brake",
                 0x100: "display clock"}


def register_system(name: str, factory: Callable) -> None:
    """Make `name` benchable: factory(cfg, weights, device) -> system (see the module docstring)."""
    _REGISTRY[name] = factory


def _not_built(name: str, why: str) -> Callable:
    def factory(cfg, weights, device):
        raise NotBuiltError(why)
    factory.not_built_reason = why
    return factory


def _monokernel_missing() -> str | None:
    """Why the monokernel cannot run here (its module does not import), or None."""
    try:
        import kog.engine.monokernel  # noqa: F401
    except ModuleNotFoundError as e:
        return "not built" if e.name == "kog.engine.monokernel" else f"not built (missing module {e.name})"
    except Exception as e:  # a broken monokernel must not stop the baselines from being measured
        return f"monokernel import failed: {type(e).__name__}: {e}"
    return None


def _kog_factory(mode: str, rule: bool = False) -> Callable:
    def factory(cfg, weights, device):
        from kog.tune.systems import KogSystem
        return KogSystem(cfg, weights, device, mode, rule=rule)
    return factory


def available_systems() -> dict[str, Callable]:
    """The registry: the baselines, and kog-targeted / kog-grid / kog-rule (not-built stand-ins where the
    monokernel does not import)."""
    from kog.tune.baselines import BASELINES
    for name, cls in BASELINES.items():
        _REGISTRY.setdefault(name, cls)
    kog = {**{name: (mode, False) for name, mode in KOG_SYSTEMS.items()}, RULE_SYSTEM: ("targeted", True)}
    if not all(k in _REGISTRY for k in kog):
        why = _monokernel_missing()
        for name, (mode, rule) in kog.items():
            _REGISTRY.setdefault(name, _not_built(name, why) if why else _kog_factory(mode, rule))
    return dict(_REGISTRY)


# ---- measurements --------------------------------------------------------------------------------------------

def max_rel_err(logits, ref_logits) -> float:
    """max over steps j of max|a_j - b_j| / max|b_j| (float32); shapes [n, V]."""
    import torch
    a, b = torch.as_tensor(logits).float(), torch.as_tensor(ref_logits).float().to(torch.as_tensor(logits).device)
    if a.shape != b.shape:
        raise ValueError(f"logits shape {tuple(a.shape)} != reference {tuple(b.shape)}")
    a, b = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
    per_step = (a - b).abs().amax(-1) / b.abs().amax(-1).clamp_min(1e-30)
    return float(per_step.max())


def first_divergence(tokens: list[int], ref_tokens: list[int]) -> int | None:
    """Index of the first token that differs from the reference's (None when all n agree)."""
    for i, (a, b) in enumerate(zip(tokens, ref_tokens)):
        if a != b:
            return i
    return None if len(tokens) == len(ref_tokens) else min(len(tokens), len(ref_tokens))


def copy_bandwidth_GBps(device, nbytes: int = 2 << 30, iters: int = 20) -> float:
    """Device-to-device copy, bytes read + written per second / 1e9, median of `iters` CUDA-event timings."""
    import torch
    free, _ = torch.cuda.mem_get_info(device)
    nbytes = int(min(nbytes, max(free // 4, 1 << 30)))
    a = torch.empty(nbytes, dtype=torch.uint8, device=device)
    a.random_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize(device)
    ms = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        ms.append(s.elapsed_time(e))
    del a, b
    torch.cuda.empty_cache()
    return 2 * nbytes / (statistics.median(ms) * 1e-3) / 1e9


def gpu_state(device) -> dict | None:
    """The GPU's SM and memory clocks (MHz), clock event (throttle) reasons, temperature (C) and power (W) now,
    through NVML (nvidia-smi where the Python binding is missing); None off NVIDIA or when neither answers."""
    import torch
    dev = torch.device(device)
    if dev.type != "cuda" or getattr(torch.version, "hip", None):
        return None
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(index)
            get_reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
            mask = int(get_reasons(h))
            state = {"sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                     "mem_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
                     "temperature_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                     "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0}
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        state = _smi_state(index)
        if state is None:
            return None
        mask = state.pop("reasons_mask")
    state["clock_event_reasons"] = [name for bit, name in CLOCK_REASONS.items() if mask & bit]
    state["clock_event_mask"] = mask
    return state


def _smi_state(index: int) -> dict | None:
    import subprocess
    q = "clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_event_reasons.active"
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader,nounits", "-i", str(index)],
                           capture_output=True, text=True, timeout=20)
        sm, mem, temp, power, mask = (x.strip() for x in r.stdout.strip().split(","))
        return {"sm_mhz": int(float(sm)), "mem_mhz": int(float(mem)), "temperature_c": int(float(temp)),
                "power_w": float(power), "reasons_mask": int(mask, 16)}
    except Exception:
        return None


def near_tie_agreement(tokens: list[int], ref_tokens: list[int], ref_logits) -> dict:
    """Whether greedy `tokens` follow the reference's until its first near-tie: the first divergence, the
    reference's top-2 gap there (over its largest |logit|), and `greedy_ok` (no divergence, or one at a
    near-tie, gap < NEAR_TIE)."""
    j = first_divergence(tokens, ref_tokens[:len(tokens)])
    out: dict[str, Any] = {"first_divergence": j, "greedy_ok": j is None}
    if j is not None and ref_logits is not None and j < len(ref_logits):
        top2 = ref_logits[j].float().topk(2).values
        gap = float((top2[0] - top2[1]) / ref_logits[j].float().abs().max())
        out.update(ref_top2_gap_at_divergence=gap, greedy_ok=gap < NEAR_TIE)
    return out


def _host_copy_GBps(nbytes: int = 64 << 20) -> float:
    import torch
    a = torch.ones(nbytes, dtype=torch.uint8)
    b = torch.empty_like(a)
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        b.copy_(a)
        ts.append(time.perf_counter() - t0)
    return 2 * nbytes / statistics.median(ts) / 1e9


def _graphed_step(ref, tok, pos):
    """ref.decode_step(tok, pos) as float32 logits, captured once as a CUDA graph: a callable that replays it
    and returns the graph's output tensor (the same kernels as the eager step, without a launch per op)."""
    import torch
    dev = ref.device
    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s):          # warm up on a side stream before capture, as PyTorch advises
        for _ in range(2):
            ref.decode_step(tok, pos)
    torch.cuda.current_stream(dev).wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ref.decode_step(tok, pos).float()

    def step():
        graph.replay()
        return out
    return step


def decode_rows(ref, prompt: list[int], n: int, forced: list[int] | None = None):
    """The prompt prefilled but its last token, then n decode steps of `ref` (a Reference) fed prompt[-1] and
    then either its own greedy tokens (forced None) or forced[0..n-2] (teacher forcing): (greedy tokens [n],
    logits [n, V] float32), row j predicting token j. On CUDA the step runs as one captured CUDA graph and
    tokens stay on the device until the end."""
    import torch
    dev = ref.device
    with torch.no_grad():
        ref.reset()
        if len(prompt) > 1:
            ref.prefill(prompt[:-1])
        tok = torch.tensor([prompt[-1]], dtype=torch.long, device=dev)
        pos = torch.tensor([len(prompt) - 1], dtype=torch.long, device=dev)
        step = _graphed_step(ref, tok, pos) if dev.type == "cuda" else (lambda: ref.decode_step(tok, pos).float())
        feed = None if forced is None else torch.tensor(list(forced)[:n], dtype=torch.long, device=dev)
        rows = None
        for j in range(n):
            lg = step()
            if rows is None:
                rows = torch.empty(n, lg.shape[-1], dtype=torch.float32, device=dev)
            rows[j].copy_(lg)
            tok.copy_(torch.argmax(rows[j]).view(1) if feed is None else feed[j].view(1))
            pos.add_(1)
        toks = torch.argmax(rows, dim=-1).tolist()
    return toks, rows


def oracle_weights(weights):
    """The weights upcast to float32 once, for the float32 references, where the device has room for them
    (twice their float32 bytes free): every step then streams float32 matrices instead of converting each one
    again (the same products, ~3x fewer bytes a step). Elsewhere the weights as they are (the Reference
    upcasts each matrix for its product). A tied lm_head stays tied."""
    import torch
    from kog.engine.weights import Weights
    if weights.dtype == torch.float32 or weights.device.type != "cuda":
        return weights
    need = weights.nbytes() * 4 // weights["embed"].element_size()
    if torch.cuda.mem_get_info(weights.device)[0] < 2 * need:
        return weights
    up: dict[int, Any] = {}
    return Weights({k: up.setdefault(id(v), v.float()) for k, v in weights.items()})


def reference_greedy(cfg, weights, prompt: list[int], n: int, compute_dtype=None):
    """The Reference's greedy tokens and its logits for them, along the decode path (teacher_forced_logits
    semantics): (tokens [n], logits [n, V] float32). compute_dtype=torch.float32: the oracle's."""
    from kog.engine.reference import Reference
    ref = Reference(cfg, weights, len(prompt) + n, compute_dtype=compute_dtype)
    out = decode_rows(ref, list(prompt), n)
    del ref
    return out


def reference_fp32_logits(cfg, weights, prompt: list[int], forced: list[int]):
    """Teacher-forced logits [n, V] of the Reference in float32 over the same weights upcast (no per-op
    model-dtype rounding): the yardstick for how far any model-dtype implementation drifts."""
    import torch
    from kog.engine.reference import Reference
    ref = Reference(cfg, weights, len(prompt) + len(forced), compute_dtype=torch.float32)
    return decode_rows(ref, list(prompt), len(forced), forced=forced)[1]


def _jsonable(v) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


def sample_timeline(df, max_rows: int | None = None):
    """Whole traced tokens of a trace table (engine/trace.py trace_table), from the second token on (the
    first carries the launch's start-up) while they fit in max_rows (TIMELINE_ROWS_PER_SYSTEM); at least
    one token."""
    max_rows = TIMELINE_ROWS_PER_SYSTEM if max_rows is None else max_rows
    if df is None or len(df) == 0 or "step" not in df.columns:
        return df
    steps = sorted(df["step"].unique())
    if len(steps) > 1:
        steps = steps[1:]
    counts = df["step"].value_counts()
    keep, rows = [], 0
    for st in steps:
        if keep and rows + counts[st] > max_rows:
            break
        keep.append(st)
        rows += int(counts[st])
    return df[df["step"].isin(keep)].reset_index(drop=True)


def bench_system(name: str, factory: Callable, cfg, weights, device, prompt: list[int], n: int, repeats: int,
                 ref_tokens: list[int] | None, ref_logits, advance: Callable[[], None] = lambda: None,
                 traces: dict | None = None, ref32_logits=None, oracle_greedy=None) -> dict:
    """Build, warm up, then time `repeats` runs of one system; correctness against the reference.
    With `traces`, the instrumented run's trace table (sysobj.trace_table after breakdown(), sampled by
    sample_timeline) goes into traces[name]."""
    import torch
    rec: dict[str, Any] = {}
    sysobj = None
    t0 = time.perf_counter()
    try:
        sysobj = factory(cfg, weights, device)
        slow = name == "hf-transformers"
        n_sys, repeats = (min(n, HF_MAX_TOKENS), min(repeats, HF_MAX_REPEATS)) if slow else (n, repeats)
        sysobj.generate(prompt, n_sys)                       # warm-up: compile, capture, autotune
        rec["setup_seconds"] = round(time.perf_counter() - t0, 3)
        advance()
        rec["gpu_start"] = gpu_state(device)
        runs, tokens = [], None
        for _ in range(repeats):
            tokens, secs = sysobj.generate(prompt, n_sys)
            tokens = list(tokens)
            if not tokens:
                raise RuntimeError("generate returned no tokens")
            if len(tokens) != n_sys:      # a system that stopped at EOS: rate over what it made, noted
                rec["stopped_early"] = f"{len(tokens)} of {n_sys} tokens"
            runs.append(len(tokens) / secs)
            advance()
        rec["gpu_end"] = gpu_state(device)
        rec.update(tok_per_s=statistics.median(runs), tok_per_s_min=min(runs), tok_per_s_max=max(runs),
                   runs_tok_per_s=runs, new_tokens=n_sys, repeats=len(runs),
                   seconds_per_token=1.0 / statistics.median(runs))
        if ref_tokens is not None:
            rec.update(near_tie_agreement(tokens, ref_tokens, ref_logits))
        if oracle_greedy is not None:
            # against the float32 oracle's own greedy path, and how near a tie its step there was: the gap
            # between its top two logits over its largest |logit| (a gap under the error bound is a near-tie)
            o_tok, o_lg = oracle_greedy
            j = first_divergence(tokens, o_tok[:len(tokens)])
            rec["first_divergence_oracle"] = j
            if j is not None and j < len(o_tok):
                top2 = o_lg[j].float().topk(2).values
                rec["oracle_top2_gap_at_divergence"] = float((top2[0] - top2[1]) / o_lg[j].float().abs().max())
        # The gate and the breakdown are extras: their failure is recorded beside a valid speed.
        if hasattr(sysobj, "teacher_forced_logits") and ref_logits is not None:
            try:
                lg = sysobj.teacher_forced_logits(prompt, ref_tokens[:n_sys])
                oracle = ref32_logits if ref32_logits is not None else ref_logits
                rec["max_rel_err"] = max_rel_err(lg, oracle[:n_sys])
                if ref32_logits is not None:
                    rec["max_rel_err_model_dtype_ref"] = max_rel_err(lg, ref_logits[:n_sys])
            except Exception as e:
                rec["max_rel_err"] = None
                rec["max_rel_err_error"] = f"{type(e).__name__}: {e}"[:500]
        if hasattr(sysobj, "breakdown"):
            try:
                bd = dict(sysobj.breakdown())
                rec["breakdown"] = {k: float(bd[k]) for k in BREAKDOWN_CATEGORIES if k in bd}
                extra = {k: v for k, v in bd.items() if k not in BREAKDOWN_CATEGORIES and _jsonable(v)}
                if extra:
                    rec["breakdown_extra"] = extra
            except Exception as e:
                rec["breakdown_error"] = f"{type(e).__name__}: {e}"[:500]
            tt = getattr(sysobj, "trace_table", None)
            if traces is not None and tt is not None and hasattr(tt, "columns") and len(tt):
                try:
                    traces[name] = sample_timeline(tt)
                except Exception as e:
                    rec["timeline_error"] = f"{type(e).__name__}: {e}"[:500]
        for attr in ("compile_seconds", "note", "cache_implementation", "config_source"):
            if getattr(sysobj, attr, None) not in (None, ""):
                rec[attr] = getattr(sysobj, attr)
        ecfg = getattr(sysobj, "ecfg", None)
        if ecfg is not None and hasattr(ecfg, "to_dict"):
            rec["engine_config"] = ecfg.to_dict()       # which tiling/mapping the figure belongs to
    except Exception as e:
        msg = str(e) if isinstance(e, NotBuiltError) else f"{type(e).__name__}: {e}"
        rec = {"error": msg.splitlines()[0][:500] if msg else type(e).__name__, "tok_per_s": None,
               "runs_tok_per_s": [], **{k: v for k, v in rec.items() if k == "setup_seconds"}}
    finally:
        del sysobj
        from kog.engine.monokernel import release_gpu_memory
        release_gpu_memory()
    # build, warm-up, timed runs, correctness gate and breakdown: what this system adds to the bench's wall
    rec["wall_seconds"] = round(time.perf_counter() - t0, 3)
    return rec


# ---- the command ------------------------------------------------------------------------------------------

def _systems_arg(spec: str | None, known: dict[str, Callable]) -> list[str]:
    if not spec:
        return [s for s in DEFAULT_SYSTEMS if s in known]
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [s for s in names if s not in known]
    if bad or not names:
        raise UsageError(f"unknown system(s) {', '.join(bad) or '(none given)'}: choose from {', '.join(known)}")
    return names


def _rule_differs(cfg, device, need: int) -> bool:
    """Whether kog-targeted runs a tuned config other than kog-rule's (False where that cannot be told)."""
    try:
        from kog.tune.systems import tuned_differs_from_rule
        return tuned_differs_from_rule(cfg, device, need)
    except Exception:       # no monokernel here: kog-rule would only repeat kog-targeted's error
        return False


def run_bench(model: str, tokens: int = DEFAULT_TOKENS, prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
              repeats: int = 5, systems: str | None = None, runs_dir: str | None = None, json_out: str | None = None,
              argv: list[str] | None = None, progress: bool = True, seed: int = 0,
              cpu_for_tests: bool = False) -> tuple[dict, Path]:
    """The bench; returns (bench JSON, run directory). Needs a GPU (cpu_for_tests runs the same pipeline on
    the CPU with a host memcpy as the copy measurement: for CPU tests of the bookkeeping only)."""
    from kog.probe.device import DeviceInfo, require_gpu
    dev_info = DeviceInfo("cpu", 0, "cpu", "cpu", 1) if cpu_for_tests else require_gpu()
    if tokens < 1 or prompt_tokens < 1 or repeats < 1:
        raise UsageError("--tokens, --prompt-tokens and --repeats must be >= 1")
    import pandas as pd
    import torch

    from kog.engine.weights import resolve_model
    from kog.provenance import git_commit, package_versions, source_digest
    from kog.reports.bench_tables import ORACLE_FP32, ORACLE_SAME, phase_breakdown
    from kog.runstore import RunStore

    known = available_systems()
    names = _systems_arg(systems, known)
    device = torch.device("cpu") if cpu_for_tests else torch.device("cuda", dev_info.index)
    t_bench = time.perf_counter()
    cfg, w = resolve_model(model, device, seed=seed)
    wall = {"model": time.perf_counter() - t_bench}
    if not systems and RULE_SYSTEM in names and not _rule_differs(cfg, device, run_positions(prompt_tokens, tokens)):
        names.remove(RULE_SYSTEM)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, cfg.vocab_size, (prompt_tokens,), generator=g).tolist()

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    console = Console(stderr=True)
    store = RunStore(runs_dir)
    with store.create("bench", dev_info, argv, extra={"model": cfg.name}) as run, Progress(
            TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(), console=console, disable=not progress, transient=False) as bar:
        task = bar.add_task("copy bandwidth", total=2 + len(names) * (repeats + 1))
        t0 = time.perf_counter()
        copy = _host_copy_GBps() if cpu_for_tests else copy_bandwidth_GBps(device)
        wall["copy"] = time.perf_counter() - t0
        bar.advance(task)
        bar.update(task, description="reference tokens + logits")
        t0 = time.perf_counter()
        ref_tokens, ref_logits = reference_greedy(cfg, w, prompt, tokens)
        ref32_logits, ref_vs_fp32, oracle_greedy = None, None, None
        if w.dtype != torch.float32:
            w32 = oracle_weights(w)
            ref32_logits = reference_fp32_logits(cfg, w32, prompt, ref_tokens)
            ref_vs_fp32 = max_rel_err(ref_logits, ref32_logits)
            oracle_greedy = reference_greedy(cfg, w32, prompt, tokens, compute_dtype=torch.float32)
            del w32
            if device.type == "cuda":
                torch.cuda.empty_cache()
        wall["reference"] = time.perf_counter() - t0
        bar.advance(task)
        wbpt = cfg.weight_bytes_per_token()
        results: dict[str, dict] = {}
        traces: dict[str, Any] = {}
        for name in names:
            bar.update(task, description=name)
            done0 = bar.tasks[0].completed
            rec = bench_system(name, known[name], cfg, w, device, prompt, tokens, repeats, ref_tokens,
                               ref_logits, advance=lambda: bar.advance(task), traces=traces,
                               ref32_logits=ref32_logits, oracle_greedy=oracle_greedy)
            bar.update(task, completed=done0 + repeats + 1)
            if rec.get("error"):
                run.note_error(name, rec["error"])
            results[name] = rec
        bar.update(task, description="done")

        out = {
            "device": dev_info.to_dict(),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": git_commit(),
            "source_digest": source_digest(),
            "versions": package_versions(),
            "model": cfg.name,
            "dtype": cfg.dtype,
            "prompt_tokens": prompt_tokens,
            "new_tokens": tokens,
            "copy_GBps": copy,
            "weight_bytes_per_token": wbpt,
            "limit_tok_per_s": copy * 1e9 / wbpt,
            "max_rel_err_oracle": ORACLE_FP32 if ref32_logits is not None else ORACLE_SAME,
            "reference_max_rel_err_vs_fp32": ref_vs_fp32,
            # where the model-dtype Reference's own greedy tokens leave the oracle's (None: never, or no oracle)
            "reference_first_divergence_oracle": (None if oracle_greedy is None else
                                                  first_divergence(ref_tokens, oracle_greedy[0])),
            # what the report's per-layer critical path needs to price each phase's weight bytes
            "model_shapes": {"hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
                             "qkv_size": cfg.qkv_size, "q_size": cfg.q_size, "num_layers": cfg.num_layers,
                             "vocab_size": cfg.vocab_size, "bytes_per_weight": w["embed"].element_size()},
            "systems": results,
            # systems timed over fewer tokens / runs than asked, to keep the bench short
            "reduced_runs": {k: {"new_tokens": v["new_tokens"], "repeats": v["repeats"]} for k, v in results.items()
                             if v.get("tok_per_s") and (v["new_tokens"] < tokens or v["repeats"] < repeats)},
            # where the bench's wall time went (seconds): the model's weights, the copy, the references, each
            # system (its own wall_seconds), all of it; the report rendered afterwards is not included
            "wall_seconds": {**{k: round(v, 3) for k, v in wall.items()},
                             "systems": round(sum(r.get("wall_seconds", 0.0) for r in results.values()), 3),
                             "total": round(time.perf_counter() - t_bench, 3)},
        }
        rows = [{"system": k, "tok_per_s": v.get("tok_per_s"), "max_rel_err": v.get("max_rel_err"),
                 "new_tokens": v.get("new_tokens"), "first_divergence": v.get("first_divergence"),
                 "runs_tok_per_s": [float(x) for x in v.get("runs_tok_per_s", [])],
                 "error": v.get("error")} for k, v in results.items()]
        run.write_table("systems", pd.DataFrame(rows))
        run.write_table("breakdown", phase_breakdown(results))
        if traces:
            tl = pd.concat([t.drop(columns="system", errors="ignore").assign(system=k) for k, t in traces.items()],
                           ignore_index=True)
            run.write_table("timeline", tl[["system", *tl.columns.drop("system")]])
        run.write_json("bench", out)
        if json_out:
            from kog.fsutil import atomic_write_text
            atomic_write_text(json_out, json.dumps(out, indent=1, default=str) + "\n")
    return out, run.path


def _summary_lines(out: dict) -> list[str]:
    lines = [f"{out['model']} {out['dtype']} on {out['device'].get('name')}: copy {out['copy_GBps']:.0f} GB/s, "
             f"limit {out['limit_tok_per_s']:.0f} tok/s ({out['prompt_tokens']}-token prompt, "
             f"{out['new_tokens']} new tokens)"]
    for k, v in out["systems"].items():
        if v.get("error"):
            lines.append(f"  {k:16s} error: {v['error']}")
            continue
        extra = f"  max_rel_err {v['max_rel_err']:.2e}" if v.get("max_rel_err") is not None else ""
        frac = v["tok_per_s"] / out["limit_tok_per_s"]
        lines.append(f"  {k:16s} {v['tok_per_s']:9.1f} tok/s  {100 * frac:5.1f}% of limit{extra}")
    return lines


def render_report(path: Path) -> Path:
    """The engine report of a finished bench run, RUN/report.html (Chrome traces beside it)."""
    from kog.reports.engine_report import render_bench_report
    try:
        return render_bench_report(path, Path(path) / "report.html")
    except Exception as e:
        raise KogError(f"the bench is recorded in {path}, but its report failed: {type(e).__name__}: {e}") from e


def cli_bench(args) -> int:
    """`kogtune bench`: --out OUT also writes the bench JSON to a file; --json prints it (only it) on stdout."""
    out, path = run_bench(args.model, args.tokens, args.prompt_tokens, args.repeats, args.systems,
                          getattr(args, "runs_dir", None), getattr(args, "out", None), argv=list(sys.argv))
    report = render_report(path)
    if getattr(args, "json", False):
        print(json.dumps({**out, "run": str(Path(path).resolve()), "report": str(report)}, indent=1,
                         default=str))
        return 0
    for line in _summary_lines(out):
        print(line)
    print(path)
    print(report)     # last: the report a person opens
    return 0
