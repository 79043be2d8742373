"""CPU emulation of the monokernel's numerics with the plain-torch Reference: how far a float32 decode over the
bf16 KV cache is from the float32 oracle after a bf16 prefill vs a float32 one (the question behind the
engine's float32 prefill). No GPU, no Triton: the Reference in float32 over the bf16 weights, its K/V rounded
to bf16 as the engine's cache stores them.

    python bench/numerics_emulation.py [--model llama-3.2-1b] [--steps 48] [--json bench/cpu/numerics_emulation.json]

Prints and writes max_rel_err (kog.engine.bench's measure) of each variant against the oracle and against the
bf16 Reference, over `steps` teacher-forced steps after a 64-token random prompt (the bench's seed 0).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import time

import torch

from kog.engine.bench import max_rel_err
from kog.engine.reference import Reference
from kog.engine.weights import resolve_model


class Bf16CacheReference(Reference):
    """The Reference in float32 whose K/V cache entries are rounded to bf16 once written, as the engine stores
    them; the step that writes a position attends to it unrounded (the engine's split holding the new position
    takes its k/v from registers). Not emulated: the engine's bf16 q in the tensor-core dot against the cache."""

    def attention_block(self, L, h, i, pos, kv_len, cos, sin):
        out = super().attention_block(L, h, i, pos, kv_len, cos, sin)
        self.cache[i, :, :, pos] = self.cache[i, :, :, pos].to(torch.bfloat16).float()
        return out


def decode(ref: Reference, prompt: list[int], forced: list[int]) -> torch.Tensor:
    feed = [prompt[-1]] + forced[:-1]
    return torch.stack([ref.decode_step(t, len(prompt) - 1 + j).float() for j, t in enumerate(feed)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    t0 = time.time()
    cfg, w = resolve_model(a.model, "cpu", seed=0)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, cfg.vocab_size, (64,), generator=g).tolist()
    n, S = a.steps, 64 + a.steps + 1
    forced = Reference(cfg, w, S).greedy(prompt, n)
    bf16 = Reference(cfg, w, S).teacher_forced_logits(prompt, forced).float()
    oracle = Reference(cfg, w, S, compute_dtype=torch.float32).teacher_forced_logits(prompt, forced).float()
    out = {}
    for name, prefill_fp32 in (("float32 decode, bf16 prefill", False), ("float32 decode, float32 prefill", True)):
        k = Bf16CacheReference(cfg, w, S, compute_dtype=torch.float32)
        if prefill_fp32:
            k.prefill(prompt[:-1])
        else:
            p = Reference(cfg, w, S)
            p.prefill(prompt[:-1])
            k.cache.copy_(p.cache.float())
        k.cache.copy_(k.cache.to(torch.bfloat16).float())
        lg = decode(k, prompt, forced)
        out[name] = {"vs_float32_oracle": max_rel_err(lg, oracle), "vs_bf16_reference": max_rel_err(lg, bf16)}
    out["bf16 reference"] = {"vs_float32_oracle": max_rel_err(bf16, oracle), "vs_bf16_reference": 0.0}
    for k, v in out.items():
        print(f"{k:34s} vs float32 oracle {v['vs_float32_oracle']:.3e}   vs bf16 reference {v['vs_bf16_reference']:.3e}")
    if a.json:
        from kog.reports.runstore import git_commit
        doc = {"what": __doc__.splitlines()[0], "model": cfg.name, "steps": n, "prompt_tokens": 64, "seed": 0,
               "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "git_commit": git_commit(),
               "torch": torch.__version__, "seconds": round(time.time() - t0, 1), "max_rel_err": out}
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
