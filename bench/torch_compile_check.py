"""Device script: is the bench's `torch-compile` baseline as fast as a fused gpt-fast-style step, in one run?

Each variant runs in its own process with its own empty inductor cache (nothing compiled by one variant is
reused by another), on the same GPU, one after the other:

    torch-compile   kog.tune.baselines.TorchCompile: the bench's baseline, on the preset's seeded weights
    anchor          the plain fused decode step of ../shared/anchors/device_baseline.py (MiniLlama: q/k/v and
                    gate/up fused, SDPA with grouped heads over a static cache, argmax in the graph), copied
                    below with the preset's shapes, compiled as there: mode="reduce-overhead", fullgraph=True

the anchor under inductor's `default` settings or with `cdt` (coordinate-descent tuning, as gpt-fast sets).
Both are timed by the same loop (n steps between two device syncs, tokens kept on the device), median and
spread of `repeats` runs after one warm-up run, with the compile time (first calls until the CUDA graphs are
recorded).

python3 bench/torch_compile_check.py OUT.json [--model llama-3.2-1b] [--tokens 512] [--repeats 5]
    [--variants torch-compile,anchor:default]      (anchor:cdt: the anchor with coordinate-descent tuning)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

SETTINGS = {"cdt": {"coordinate_descent_tuning": True},     # gpt-fast's tuning of the generated kernels
            "default": {}}                                  # torch's own
VARIANTS = "torch-compile,anchor:default"     # anchor:cdt ran slower in every run (docs/baselines.md)
PROMPT_TOKENS = 64


class AnchorStep(torch.nn.Module):
    """The anchor's MiniLlama (../shared/anchors/device_baseline.py) with a ModelConfig's shapes and its own
    random weights (speed does not depend on their values): generate(prompt, n) as the baselines'. A module,
    as there: the tensors it holds (the caches among them) are then static inputs of the CUDA graphs."""

    def __init__(self, cfg, device, max_seq: int, settings: dict):
        super().__init__()
        H, I, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers
        self.nh, self.nkv, self.hd, self.I, self.eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, I, \
            cfg.rms_norm_eps
        dt, dev = torch.bfloat16, device
        g = torch.Generator(device=dev).manual_seed(0)

        def rnd(*shape):
            return torch.randn(*shape, dtype=dt, device=dev, generator=g) * 0.02
        self.emb = rnd(cfg.vocab_size, H)
        self.head = self.emb if cfg.tie_word_embeddings else rnd(cfg.vocab_size, H)
        self.layers = [dict(n1=torch.ones(H, dtype=dt, device=dev), n2=torch.ones(H, dtype=dt, device=dev),
                            qkv=rnd((self.nh + 2 * self.nkv) * self.hd, H), o=rnd(H, self.nh * self.hd),
                            gu=rnd(2 * I, H), d=rnd(H, I),
                            k=torch.zeros(1, self.nkv, max_seq, self.hd, dtype=dt, device=dev),
                            v=torch.zeros(1, self.nkv, max_seq, self.hd, dtype=dt, device=dev)) for _ in range(L)]
        self.nf = torch.ones(H, dtype=dt, device=dev)
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, self.hd, 2, device=dev).float() / self.hd))
        f = torch.outer(torch.arange(max_seq, device=dev).float(), inv)
        self.cos, self.sin = f.cos().to(dt), f.sin().to(dt)
        self.device, self.settings = device, settings
        self.step = torch.compile(self.forward, mode="reduce-overhead", fullgraph=True)

    def rope(self, x, pos):
        c, s = self.cos[pos], self.sin[pos]
        x1, x2 = x[..., : self.hd // 2], x[..., self.hd // 2:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    def forward(self, tok, pos):
        F = torch.nn.functional
        x = self.emb[tok]
        for layer in self.layers:
            h = F.rms_norm(x, (x.shape[-1],), layer["n1"], self.eps)
            q, k, v = (h @ layer["qkv"].t()).split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)
            q = self.rope(q.view(1, self.nh, 1, self.hd), pos)
            k = self.rope(k.view(1, self.nkv, 1, self.hd), pos)
            layer["k"].index_copy_(2, pos, k)
            layer["v"].index_copy_(2, pos, v.view(1, self.nkv, 1, self.hd))
            mask = torch.arange(layer["k"].shape[2], device=self.device) <= pos
            a = F.scaled_dot_product_attention(q, layer["k"], layer["v"], attn_mask=mask.view(1, 1, 1, -1),
                                               enable_gqa=self.nkv != self.nh)
            x = x + a.reshape(1, -1) @ layer["o"].t()
            h = F.rms_norm(x, (x.shape[-1],), layer["n2"], self.eps)
            g, u = (h @ layer["gu"].t()).split([self.I, self.I], -1)
            x = x + (F.silu(g) * u) @ layer["d"].t()
        return torch.argmax(F.rms_norm(x, (x.shape[-1],), self.nf, self.eps) @ self.head.t(), -1)

    def generate(self, prompt_ids, n: int):
        import torch._inductor.config as ic
        tok = torch.tensor([prompt_ids[-1]], dtype=torch.long, device=self.device)
        pos = torch.tensor([len(prompt_ids) - 1], dtype=torch.long, device=self.device)
        out = torch.empty(n, dtype=torch.long, device=self.device)
        with torch.no_grad(), ic.patch(self.settings):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for j in range(n):
                nxt = self.step(tok, pos)
                out[j:j + 1].copy_(nxt)
                tok.copy_(nxt)
                pos.add_(1)
            torch.cuda.synchronize()
        return out.tolist(), time.perf_counter() - t0


def run_variant(model: str, variant: str, tokens: int, repeats: int) -> dict:
    """One variant in this process: compile (timed), a warm-up run, `repeats` timed runs."""
    from kog.engine.weights import resolve_model
    from kog.tune.baselines import TorchCompile, _round_up
    from kog.tune.bench import gpu_state
    system, _, settings = variant.partition(":")
    dev = torch.device("cuda")
    cfg, w = resolve_model(model, dev, seed=0)
    prompt = list(range(100, 100 + PROMPT_TOKENS))
    t0 = time.perf_counter()
    if system == "torch-compile":
        sysobj = TorchCompile(cfg, w, dev)
    else:
        sysobj = AnchorStep(cfg, dev, _round_up(PROMPT_TOKENS + tokens), SETTINGS[settings])
    sysobj.generate(prompt, tokens)                 # compile, record the graphs, warm up
    setup = time.perf_counter() - t0
    start = gpu_state(dev)
    runs = [tokens / sysobj.generate(prompt, tokens)[1] for _ in range(repeats)]
    return {"system": system, "inductor_settings": SETTINGS.get(settings, {}),
            "tok_per_s": statistics.median(runs), "tok_per_s_min": min(runs), "tok_per_s_max": max(runs),
            "runs_tok_per_s": runs, "setup_seconds": setup, "gpu_start": start, "gpu_end": gpu_state(dev)}


def run_in_child(model: str, variant: str, tokens: int, repeats: int) -> dict:
    code = (f"import json, sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            f"import torch_compile_check as c; "
            f"print('RESULT', json.dumps(c.run_variant({model!r}, {variant!r}, {tokens}, {repeats})))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
        env["TORCHINDUCTOR_CACHE_DIR"] = cache
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        return {"variant": variant, "error": (p.stderr.strip().splitlines() or ["no output"])[-1][:500],
                "wall_seconds": wall}
    return {"variant": variant, **json.loads(lines[-1][7:]), "wall_seconds": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--variants", default=VARIANTS)
    a = ap.parse_args()
    from kog.provenance import git_commit, package_versions
    results = []
    for v in a.variants.split(","):
        results.append(run_in_child(a.model, v, a.tokens, a.repeats))
        print(json.dumps({k: results[-1].get(k) for k in ("variant", "tok_per_s", "setup_seconds", "error")}),
              flush=True)
    ok = [r for r in results if r.get("tok_per_s")]
    anchors = [r for r in ok if r["system"] == "anchor"]
    ours = [r for r in ok if r["system"] == "torch-compile"]
    out = {"model": a.model, "new_tokens": a.tokens, "prompt_tokens": PROMPT_TOKENS, "repeats": a.repeats,
           "device": torch.cuda.get_device_name(0), "git_commit": git_commit(), "versions": package_versions(),
           "variants": results,
           # the bench's baseline over the fastest anchor variant of this run
           "torch_compile_over_best_anchor": (ours[0]["tok_per_s"] / max(r["tok_per_s"] for r in anchors)
                                              if ours and anchors else None)}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1, default=str)
        f.write("\n")


if __name__ == "__main__":
    main()
