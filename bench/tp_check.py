"""Device script: the tensor-parallel monokernel on a host with G >= 2 GPUs (nvidia-h200-x2 / -x4 / -x8).

    pip install --no-deps --no-build-isolation -e . && \
    KOG_GIT_COMMIT=<sha> python3 bench/tp_check.py [--model sheared-llama-2.7b,llama-3.2-1b] [--gs 1,2,4]
                                                   [--tokens 512] [--repeats 5] [--deadline 540]

For each model and each G in --gs (default: 1, 2 and 4, those the host has): correctness against the
single-GPU engine (Monokernel, same weights, same seed: greedy tokens over 64 tokens must be identical;
teacher-forced max_rel_err of the TP logits against the reference's and the single-GPU kernel's), then tok/s
(median of --repeats greedy runs of --tokens tokens after a 64-token prompt, EOS ignored), with the same-run
single-GPU copy bandwidth and GPU0 -> GPUr peer-copy bandwidth. Writes $OUT/tp_check.json after every step
(partial results survive a timeout): bench format where it applies (device, date, git_commit from
KOG_GIT_COMMIT, versions, model, dtype, prompt_tokens, new_tokens, copy_GBps, weight_bytes_per_token,
limit_tok_per_s, systems{kog-targeted, kog-tp<G>: tok_per_s, runs_tok_per_s, max_rel_err, ...}).

`--smoke` runs the whole script on the CPU (TRITON_INTERPRET=1, the tiny preset in float32, G = 1 and 2 as
threads, 4 tokens): a check of the script itself, not a measurement.

Every wait is bounded: the kernel's spins (EngineConfig.wait_timeout_s; a timeout is an error naming rank / flag /
task, never a hang), and --deadline (seconds of wall clock) skips whatever would start after it.

Which preset for the 8-GPU target (issue 7, ~2B model on 8xH200): qwen3-1.7b (2.0B parameters, 8 KV heads:
splits over G = 2, 4 and 8). sheared-llama-2.7b, the ~2B preset of the single-GPU bench, has 20 KV heads:
it splits over 2 and 4 GPUs but not over 8 (KV heads are never replicated). llama-3.2-1b (8 KV heads) splits
over 8 too. Vocabularies: 128256 and 151936 split over 8; 32000 splits over 2, 4 and 8.

NVLink multicast stays off (kog.engine.tp_monokernel sets NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 at import; nothing calls cuMulticastCreate).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time
import traceback

if "--smoke" in sys.argv:      # CPU dry run of this script (tiny model, interpreter): before triton is imported
    os.environ["TRITON_INTERPRET"] = "1"
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402

from kog.tune.bench import copy_bandwidth_GBps, first_divergence, max_rel_err  # noqa: E402
from kog.engine.config import preset  # noqa: E402
from kog.engine.engine_config import EngineConfig  # noqa: E402
from kog.engine.monokernel import Monokernel  # noqa: E402
from kog.tune.store import tuned_config  # noqa: E402
from kog.engine.reference import Reference  # noqa: E402
from kog.engine.tp_monokernel import TPMonokernel  # noqa: E402
from kog.engine.tp_plan import plan_summary  # noqa: E402
from kog.engine.weights import random_weights  # noqa: E402

OUT = os.environ.get("OUT", "/tmp")
T0 = time.time()
R: dict = {}


def save() -> None:
    from kog.fsutil import atomic_write_text
    atomic_write_text(f"{OUT}/tp_check.json", json.dumps(R, indent=1, default=str))


def step(where: dict, name: str, fn, deadline: float):
    """Run fn() into where[name] unless past the deadline; errors are recorded, never fatal."""
    if time.time() - T0 > deadline:
        where[name] = {"skipped": f"past the {deadline:.0f} s deadline"}
        save()
        return None
    t = time.time()
    try:
        where[name] = fn()
    except Exception as e:       # record and go on: the next G / model still runs
        where[name] = {"error": f"{type(e).__name__}: {e}"[:2000], "tb": traceback.format_exc()[-3000:]}
    if isinstance(where[name], dict):
        where[name]["seconds"] = round(time.time() - t, 1)
    print(name, json.dumps(where[name], default=str)[:800], flush=True)
    save()
    return where[name]


def timed_runs(engine, prompt, n, repeats):
    engine.generate(prompt, 8)                   # compile + warm
    runs = []
    for _ in range(repeats):
        toks, dt = engine.generate(prompt, n)
        runs.append(len(toks) / dt)
    return {"tok_per_s": statistics.median(runs), "runs_tok_per_s": runs, "new_tokens": len(toks)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="sheared-llama-2.7b,llama-3.2-1b")
    ap.add_argument("--gs", default=None, help="comma list of TP degrees (default 1,2,4 as available)")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--check-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--exchange-rows", type=int, default=None)
    ap.add_argument("--deadline", type=float, default=540.0)
    ap.add_argument("--smoke", action="store_true", help="CPU dry run (tiny model, interpreter)")
    a = ap.parse_args()
    if a.smoke:
        a.model, a.tokens, a.check_tokens, a.repeats = "tiny", 4, 4, 1
    ngpu = 2 if a.smoke else torch.cuda.device_count()
    gs = [int(g) for g in a.gs.split(",")] if a.gs else [g for g in (1, 2, 4) if g <= ngpu]
    from kog.probe.device import detect
    from kog.provenance import git_commit, package_versions
    try:
        devs = [d.to_dict() for d in detect()]
    except Exception as e:
        devs = [{"error": repr(e)}]
    R.update(device=devs[0] if devs else None, devices=devs, gpus=ngpu,
             date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), git_commit=git_commit(),
             versions=package_versions(), argv=sys.argv[1:], gs=gs,
             multicast_env={k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                            "NVSHMEM_DISABLE_NVLS")})
    save()
    if not a.smoke:
        step(R, "copy_GBps", lambda: copy_bandwidth_GBps(torch.device("cuda", 0)), a.deadline)
    if ngpu > 1 and not a.smoke:
        from kog.probe.probes.p2p import _copy_GBps
        step(R, "p2p_GBps", lambda: {f"0->{r}": _copy_GBps(torch, 0, r, 1 << 30, 5) for r in range(1, ngpu)},
             a.deadline)
    R["models"] = {}
    for model in a.model.split(","):
        M: dict = {}
        R["models"][model] = M
        cfg = preset(model)
        dev0 = torch.device("cpu") if a.smoke else torch.device("cuda", 0)
        if a.smoke:
            cfg = cfg.replace(dtype="float32").validate()
        w = random_weights(cfg, dev0, seed=0, dtype=torch.float32 if a.smoke else None)
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(0, cfg.vocab_size, (64,), generator=g).tolist()
        max_seq = len(prompt) + max(a.tokens, a.check_tokens, 8) + 1
        copy = R.get("copy_GBps") if isinstance(R.get("copy_GBps"), float) else None
        wbpt = cfg.weight_bytes_per_token()
        M.update(model=cfg.name, dtype=cfg.dtype, prompt_tokens=len(prompt), new_tokens=a.tokens, copy_GBps=copy,
                 weight_bytes_per_token=wbpt, limit_tok_per_s=(copy * 1e9 / wbpt) if copy else None,
                 num_kv_heads=cfg.num_kv_heads, systems={})
        S = M["systems"]
        ecfg = tuned_config(cfg, dev0).replace(mode="targeted")
        if ecfg.mapping == "topology":     # needs a kogprobe scan's SM map, which this script does not load
            ecfg = ecfg.replace(mapping="round-robin")
        if a.smoke:
            ecfg = EngineConfig(block_k=64, bn_qkv=16, bn_o=16, bn_gate_up=16, bn_down=16, bn_lm=64, attn_block=16,
                                sync_rows=32)
        M["engine_config"] = ecfg.to_dict()
        base: dict = {}

        def reference():
            ref = Reference(cfg, w, max_seq)
            base["ref_tokens"] = ref.greedy(prompt, a.check_tokens)
            base["ref_logits"] = Reference(cfg, w, max_seq).teacher_forced_logits(prompt, base["ref_tokens"])
            return {"tokens": base["ref_tokens"][:16]}

        step(M, "reference", reference, a.deadline)

        def single():
            mk = Monokernel(cfg, w, ecfg, dev0, max_seq=max_seq)
            mk.n_eos = 0
            out = {}
            if "ref_tokens" in base:
                lg = mk.teacher_forced_logits(prompt, base["ref_tokens"])
                base["mk_logits"] = lg
                out["max_rel_err"] = max_rel_err(lg, base["ref_logits"])
            toks, _ = mk.generate(prompt, a.check_tokens)
            base["mk_tokens"] = toks
            out["first_divergence_vs_reference"] = first_divergence(toks, base.get("ref_tokens", toks))
            out.update(timed_runs(mk, prompt, a.tokens, a.repeats))
            out["compile_seconds"] = mk.compile_seconds
            del mk
            torch.cuda.empty_cache()
            return out

        step(S, "kog-targeted", single, a.deadline)
        for G in gs:
            def tp_run(G=G):
                if G > ngpu:
                    return {"error": f"G={G} > {ngpu} GPUs"}
                tp = TPMonokernel(cfg, w, G, ecfg, max_seq=max_seq, exchange_rows=a.exchange_rows)
                tp.n_eos = 0
                out = {"G": G, "exchange_rows": tp.exchange_rows, "plan": plan_summary(tp.plan)}
                if copy:      # each GPU streams only its shard: the per-rank copy-bandwidth limit
                    out["limit_tok_per_s"] = copy * 1e9 / out["plan"]["weight_bytes_per_token_per_rank"]
                if "ref_tokens" in base:
                    lg = tp.teacher_forced_logits(prompt, base["ref_tokens"]).to(dev0)
                    out["max_rel_err"] = max_rel_err(lg, base["ref_logits"])
                    if "mk_logits" in base:
                        out["max_rel_err_vs_single_gpu"] = max_rel_err(lg, base["mk_logits"])
                toks, _ = tp.generate(prompt, a.check_tokens)
                mk_t = base.get("mk_tokens")
                out["tokens_equal_single_gpu"] = (toks == mk_t) if mk_t is not None else None
                out["first_divergence_vs_single_gpu"] = first_divergence(toks, mk_t) if mk_t is not None else None
                out["tokens"] = toks[:16]
                # the single-GPU engine with the TP reduction order (EngineConfig.tp_compat=G): issue 7's token
                # identity, bit for bit; its tok/s beside the default's shows what the order costs one GPU
                lg_tp = lg if "ref_tokens" in base else None
                if G > 1:
                    mkc = Monokernel(cfg, w, ecfg.replace(tp_compat=G), dev0, max_seq=max_seq)
                    mkc.n_eos = 0
                    toks_c, _ = mkc.generate(prompt, a.check_tokens)
                    out["tokens_equal_single_gpu_tp_compat"] = toks == toks_c
                    out["first_divergence_vs_single_gpu_tp_compat"] = first_divergence(toks, toks_c)
                    if lg_tp is not None:
                        lgc = mkc.teacher_forced_logits(prompt, base["ref_tokens"]).to(dev0)
                        out["logits_equal_single_gpu_tp_compat"] = bool(torch.equal(lgc, lg_tp))
                    out["single_gpu_tp_compat_tok_per_s"] = timed_runs(mkc, prompt, a.tokens, a.repeats)["tok_per_s"]
                    del mkc
                out.update(timed_runs(tp, prompt, a.tokens, a.repeats))
                out["compile_seconds"] = tp.compile_seconds
                del tp
                torch.cuda.empty_cache()
                return out

            step(S, f"kog-tp{G}", tp_run, a.deadline)
        del w
        torch.cuda.empty_cache()
    R["total_seconds"] = round(time.time() - T0, 1)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
