"""Device script: the monokernel on the H200: correctness on small configs of every architecture, then
llama-3.2-1b in both sync modes (compile time, teacher-forced error, greedy agreement, tok/s, breakdown)
and a small tiling sweep. Writes $OUT/engine_check.json as it goes (partial results survive a timeout).

python3 bench/engine_check.py [--quick] [--model PRESET (the sweep's model; default llama-3.2-1b)]
    [--sweep-only --grid-json '[{...}]' [--check --ref-fp32] [--save-timeline [--attn-stamps]]] [--tag NAME]

Same-run comparisons of two versions of the code: run this script from each checkout in one device call
(each installed in its own --target folder, PYTHONPATH pointing at it), --tag naming the output file.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import traceback

from kog.engine.config import PRESETS      # no torch: --model is checked before the GPU stack loads


def preset_name(name: str) -> str:
    """--model: a preset's name, or a usage error."""
    if name not in PRESETS:
        raise argparse.ArgumentTypeError(f"unknown preset {name!r} (one of {', '.join(PRESETS)})")
    return name


def sweep_grid(text: str) -> list[dict]:
    """--grid-json: a JSON list of objects (EngineConfig fields), or a usage error."""
    try:
        grid = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e})") from None
    if not isinstance(grid, list) or not all(isinstance(g, dict) for g in grid):
        raise argparse.ArgumentTypeError("want a JSON list of objects (EngineConfig fields)")
    return grid


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="no tiling sweep")
    ap.add_argument("--model", type=preset_name, default="llama-3.2-1b",
                    help="the preset the perf runs and the sweep use")
    ap.add_argument("--tag", default="engine_check", help="the output file: $OUT/TAG.json")
    ap.add_argument("--sweep-only", action="store_true", help="the sweep alone (no small configs, no defaults)")
    ap.add_argument("--no-small", action="store_true", help="skip the small configs of every architecture")
    ap.add_argument("--no-perf", action="store_true", help="skip the default's timing in both modes")
    ap.add_argument("--short-sweep", action="store_true", help="the sweep without the default configs")
    ap.add_argument("--grid-json", type=sweep_grid, default=None,
                    help="the configs to sweep: a JSON list of EngineConfig fields")
    ap.add_argument("--repeats", type=int, default=2, help="timed launches per swept config")
    ap.add_argument("--check", action="store_true", help="teacher-forced error and greedy agreement per config")
    ap.add_argument("--ref-fp32", action="store_true", help="the error against the float32 reference too")
    ap.add_argument("--save-timeline", action="store_true", help="each swept config's traced timeline")
    ap.add_argument("--attn-stamps", action="store_true", help="traced runs stamp attention's sub-steps")
    ap.add_argument("--no-best", action="store_true", help="no re-run of the sweep's best per mode")
    ap.add_argument("--store-best", metavar="DIR", default=None,
                    help="store the sweep's best targeted config in a tuned-config store at DIR")
    return ap.parse_args(argv)


A = parse_args()

import torch  # noqa: E402 - after the arguments, so --help and bad arguments need no GPU stack

from kog.engine.engine_config import EngineConfig  # noqa: E402
from kog.engine.monokernel import Monokernel  # noqa: E402
from kog.fsutil import atomic_write_table  # noqa: E402
from kog.engine.reference import Reference  # noqa: E402
from kog.engine.weights import random_weights  # noqa: E402
from kog.provenance import git_commit, package_versions, source_digest  # noqa: E402
from kog.tune.bench import first_divergence, max_rel_err as rel_err, reference_fp32_logits  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")

# provenance of every file this writes: the date, the device, the commit (KOG_GIT_COMMIT on a device copy),
# the versions
R: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
           "git_commit": git_commit(), "source_digest": source_digest(), "versions": package_versions()}


def save():
    from kog.fsutil import atomic_write_text
    atomic_write_text(f"{OUT}/{A.tag}.json", json.dumps(R, indent=1, default=str))


def section(name):
    def deco(fn):
        t0 = time.time()
        try:
            R[name] = fn()
        except Exception as e:
            R[name] = {"error": repr(e)[:2000], "tb": traceback.format_exc()[-3000:]}
        R[name + "_s"] = round(time.time() - t0, 1)
        print(name, json.dumps(R[name], default=str)[:1500], flush=True)
        save()
    return deco


def check(cfg, ecfg, n=8, prompt=None):
    w = random_weights(cfg, "cuda", seed=1)
    prompt = prompt or list(range(3, 3 + 12))
    ref = Reference(cfg, w, 128)
    rt = ref.greedy(prompt, n)
    rl = Reference(cfg, w, 128).teacher_forced_logits(prompt, rt)
    mk = Monokernel(cfg, w, ecfg, max_seq=128)
    mk.n_eos = 0
    ml = mk.teacher_forced_logits(prompt, rt)
    toks, _ = mk.generate(prompt, n)
    return {"rel_err": rel_err(ml, rl), "tokens_equal": toks == rt, "ref": rt, "mk": toks,
            "compile_s": mk.compile_seconds}


@section("small")
def _():
    if A.sweep_only or A.no_small:
        return {}
    out = {}
    base = PRESETS["tiny"]
    variants = {
        "llama-tiny": base.replace(hidden_size=256, intermediate_size=512, num_heads=8, num_kv_heads=2, head_dim=32,
                                   vocab_size=1024, num_layers=2),
        "qwen2-tiny": base.replace(arch="qwen2", attention_bias=True, hidden_size=256, intermediate_size=384,
                                   num_heads=6, num_kv_heads=2, head_dim=64, vocab_size=1024),
        "qwen3-tiny": base.replace(arch="qwen3", qk_norm=True, hidden_size=256, intermediate_size=512, num_heads=4,
                                   num_kv_heads=2, head_dim=64, vocab_size=1024),
    }
    e = EngineConfig(block_k=128, bn_qkv=4, bn_o=4, bn_gate_up=4, bn_down=4, bn_lm=8, ctas_per_sm=2)
    for name, cfg in variants.items():
        for mode in ("targeted", "grid"):
            out[f"{name}/{mode}"] = check(cfg, e.replace(mode=mode))
    return out


W1B = {}


def llama_1b():
    """The sweep's model and random weights: llama-3.2-1b, or the preset after --model."""
    if not W1B:
        cfg = PRESETS[A.model]
        W1B["cfg"], W1B["w"] = cfg, random_weights(cfg, "cuda", seed=0)
    return W1B["cfg"], W1B["w"]


def copy_GBps():
    a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
    for _ in range(3): b.copy_(a)
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); b.copy_(a); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    return 2 * a.numel() / statistics.median(ts) / 1e6


@section("copy")
def _():
    return {"GBps": copy_GBps()}


def perf(ecfg, n=512, repeats=3, trace=True, timeline=None):
    cfg, w = llama_1b()
    prompt = list(range(100, 164))
    # --attn-stamps: traced runs also stamp each attention split's sub-steps (kog.engine.trace.attn_stamps_table)
    mk = Monokernel(cfg, w, ecfg, max_seq=640, trace_tokens=8 if trace else 0,
                    attn_stamps=A.attn_stamps)
    mk.n_eos = 0
    mk.generate(prompt, n)            # warm-up: compile (n's integer specialization too), module load, first touch
    rates = []
    for _ in range(repeats):
        toks, dt = mk.generate(prompt, n)
        rates.append(len(toks) / dt)
    res = {"tok_s": statistics.median(rates), "runs": rates, "compile_s": mk.compile_seconds,
           "regs": mk.kernel_regs, "spills": mk.kernel_spills,
           "limit_pct": statistics.median(rates) / (R["copy"]["GBps"] * 1e9 / cfg.weight_bytes_per_token()) * 100}
    if trace:
        b = mk.breakdown(prompt, n=32)
        table = b.pop("table", None)
        attn = b.pop("attn_table", None)
        if timeline and table is not None:     # the raw per-task trace, for kog.reports.layer_anatomy
            atomic_write_table(f"{OUT}/timeline_{timeline}.parquet", table.assign(system=timeline))
        if timeline and attn is not None:
            atomic_write_table(f"{OUT}/attn_{timeline}.parquet", attn)
        res["breakdown"] = b
    return res


REF32 = {}


def teacher_check(ecfg, n=32):
    cfg, w = llama_1b()
    prompt = list(range(100, 164))
    if not REF32:
        REF32["tokens"] = Reference(cfg, w, 640).greedy(prompt, n)
        REF32["logits"] = Reference(cfg, w, 640).teacher_forced_logits(prompt, REF32["tokens"])
    if A.ref_fp32 and "fp32_logits" not in REF32:
        # the same bf16 weights, upcast: the reference's math without its per-op bf16 rounding
        REF32["fp32_logits"] = reference_fp32_logits(cfg, w, prompt, REF32["tokens"])
        REF32["ref_bf16_vs_fp32"] = rel_err(REF32["logits"], REF32["fp32_logits"])
    mk = Monokernel(cfg, w, ecfg, max_seq=640)
    mk.n_eos = 0
    ml = mk.teacher_forced_logits(prompt, REF32["tokens"])
    toks, _ = mk.generate(prompt, n)
    res = {"rel_err": rel_err(ml, REF32["logits"]), "first_divergence": first_divergence(toks, REF32["tokens"]),
           "compile_s": mk.compile_seconds}
    if "fp32_logits" in REF32:
        res.update(rel_err_vs_fp32_ref=rel_err(ml, REF32["fp32_logits"]), ref_bf16_vs_fp32=REF32["ref_bf16_vs_fp32"])
    return res


@section("llama1b_correct")
def _():
    if A.sweep_only:
        return {}
    out = {}
    for mode in ("targeted", "grid"):
        out[mode] = teacher_check(EngineConfig(mode=mode))
    return out


@section("llama1b_perf")
def _():
    if A.sweep_only or A.no_perf:
        return {}
    return {mode: perf(EngineConfig(mode=mode)) for mode in ("targeted", "grid")}


@section("sweep")
def _():
    if A.quick:
        return {}
    out = {}
    B4 = dict(bn_qkv=4, bn_o=4, bn_gate_up=4, bn_down=4, bn_lm=4)
    B16 = dict(bn_qkv=16, bn_o=16, bn_gate_up=16, bn_down=16, bn_lm=16)
    grid = [dict(), dict(mode="grid"), dict(block_k=1024), dict(B4), dict(B4, ctas_per_sm=3), dict(B4, mode="grid")]
    if A.short_sweep:
        grid = grid[2:]                 # the defaults were measured by llama1b_perf
    if A.grid_json is not None:        # the configs to sweep, as a JSON list of EngineConfig overrides
        grid = A.grid_json
    for g in grid:
        key = ",".join(f"{k}={v}" for k, v in g.items())
        tl_name = ("t%d" % len(out)) if A.save_timeline else None
        try:
            out[key] = perf(EngineConfig(**g), n=256, repeats=A.repeats, trace=tl_name is not None, timeline=tl_name)
            if A.check:  # teacher-forced error and greedy agreement over 32 tokens, per config
                out[key].update(teacher_check(EngineConfig(**g)))
        except Exception as e:
            out[key] = {"error": repr(e)[:500]}
        print(key, out[key], flush=True)
        save()
    ok = {k: v for k, v in out.items() if "tok_s" in v and not A.no_best}
    for mode in ("targeted", "grid"):
        cand = {k: v for k, v in ok.items() if ("mode=grid" in k) == (mode == "grid")}
        if cand:
            best = max(cand, key=lambda k: cand[k]["tok_s"])
            g = grid[list(out).index(best)]
            try:
                out["best-" + mode] = {"config": g, **perf(EngineConfig(**g), n=256, repeats=3, trace=True)}
            except Exception as e:
                out["best-" + mode] = {"error": repr(e)[:500]}
            print("best", mode, json.dumps(out["best-" + mode], default=str)[:1500], flush=True)
            save()
    # --store-best DIR: the best targeted config goes to a tuned-config store there (when it beats the
    # default measured in this sweep), so a `kogtune bench` run with KOG_TUNED_DIR=DIR uses it
    if A.store_best and "best-targeted" in out and "config" in out["best-targeted"]:
        import torch as _t
        from kog.tune.store import save_best
        os.environ["KOG_TUNED_DIR"] = A.store_best
        g = out["best-targeted"]["config"]
        cfg, _ = llama_1b()
        save_best(_t.cuda.get_device_name(0), cfg, EngineConfig(**g), out["best-targeted"]["tok_s"],
                  source={"backend": "gpu", "from": "bench/engine_check.py sweep"}, only_if_better=False)
        out["stored"] = g
    return out


print("SUMMARY", json.dumps({k: R[k] for k in ("copy", "llama1b_correct")}, default=str))
for m, v in (R.get("llama1b_perf") or {}).items():
    if isinstance(v, dict):
        print(m, round(v.get("tok_s", 0)), "tok/s", round(v.get("limit_pct", 0), 1), "% of limit")
