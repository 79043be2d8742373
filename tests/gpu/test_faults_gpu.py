"""Faults injected on a real GPU (device machine: pytest -m gpu tests/gpu/test_faults_gpu.py; with
KOG_BENCH_OUT=path.json the results are written there as JSON):

Each case runs in its own process.

- a producer that never publishes: in targeted mode one counter's target raised past anything the kernel
  releases, in grid mode the barrier word started far below zero. The bounded wait gives up, the error names
  the wait and the task, the host raises, and the next launch on the same engine gives the clean tokens;
- NaN in the streamed weights after the build (every logit NaN): the launch aborts naming the step instead of
  emitting token 0, and the next launch is clean;
- a NaN or an Inf in a weight: refused at build, the tensor named;
- a KV cache position past the cache: refused before anything is compiled or launched;
- out of memory at engine build (the GPU filled to leave too little): one line, and every byte the build
  allocated is freed.

Runs in a subprocess without TRITON_INTERPRET (tests/conftest.py sets it for the CPU suite).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SCRIPT = r"""
import json, math, sys, time, torch
from kog.engine import layout as LY
from kog.engine.config import ConfigError, PRESETS
from kog.engine.engine_config import EngineConfig
from kog.engine.monokernel import EngineMemoryError, Monokernel, MonokernelError
from kog.engine.weights import random_weights

cfg = PRESETS["tiny"].replace(eos_token_id=(), hidden_size=512, intermediate_size=1024, num_heads=8,
                               num_kv_heads=2, head_dim=64, vocab_size=4096, num_layers=3)
TILES = dict(block_k=256, bn_qkv=8, bn_o=8, bn_gate_up=8, bn_down=8, bn_lm=8)
prompt, N = list(range(7, 27)), 12


def starve_the_barrier(mk):
    # grid mode's producer is every CTA's barrier arrival: start the arrival word far below what they add
    orig = mk._launch_args
    def launch_args(*a, **k):
        r = orig(*a, **k)
        mk.sync[LY.S_BAR] = -(1 << 30)
        return r
    mk._launch_args = launch_args
    return lambda: mk.__dict__.pop("_launch_args")


def raise_a_target(mk):
    # layer 1's first counter that something waits on (with the weight ring, qkv -> attention goes through
    # tagged words, not counters, so that one is the attention output's)
    lo, hi = int(mk.plan.layout[1, 0]), int(mk.plan.layout[2, 0])
    c = next(i for i in range(lo, hi) if int(mk.target[i]) > 0)
    old = int(mk.target[c])
    mk.target[c] = 1 << 20
    def restore():
        mk.target[c] = old
    return restore


def poison_the_weights(mk):
    # NaN in the streamed weights after the build: every logit NaN, no token to pick
    packed = mk.wbuf.clone()
    mk.wbuf.fill_(float("nan"))
    return lambda: mk.wbuf.copy_(packed)


def faulted_launch(mode, ring, inject):
    w = random_weights(cfg, "cuda", seed=4, dtype=torch.bfloat16)
    mk = Monokernel(cfg, w, EngineConfig(mode=mode, weight_ring=ring, wait_timeout_s=1.0, **TILES), max_seq=128)
    mk.n_eos = 0
    clean, _ = mk.generate(prompt, N)
    restore = inject(mk)
    t0 = time.perf_counter()
    try:
        mk.generate(prompt, N)
        err = None
    except MonokernelError as x:
        err = str(x)
    seconds = time.perf_counter() - t0
    restore()
    again, _ = mk.generate(prompt, N)
    return {"error": err, "seconds_to_error": seconds, "next_launch_same_tokens": again == clean}


def non_finite_weight(bad):
    w = random_weights(cfg, "cuda", seed=4, dtype=torch.bfloat16)
    w["layers.1.w_down"][3, 5] = bad
    try:
        Monokernel(cfg, w, EngineConfig(**TILES), max_seq=128)
        return "no error"
    except ConfigError as x:
        return str(x)


def past_the_cache():
    w = random_weights(cfg, "cuda", seed=4, dtype=torch.bfloat16)
    mk = Monokernel(cfg, w, EngineConfig(**TILES), max_seq=64)
    try:
        mk.generate(list(range(40)), 40)
        return {"error": None}
    except ConfigError as x:
        return {"error": str(x), "compiled": mk.compile_seconds is not None}


def oom_at_build():
    # fill the GPU to leave less than the engine's packed copy of the weights needs
    big = PRESETS["tiny"].replace(eos_token_id=(), hidden_size=2048, intermediate_size=8192, num_heads=16,
                                  num_kv_heads=4, head_dim=128, vocab_size=32768, num_layers=4)
    wb = random_weights(big, "cuda", seed=5, dtype=torch.bfloat16)
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    filler = torch.empty(max(free - (256 << 20), 0), dtype=torch.uint8, device="cuda")
    before = torch.cuda.memory_allocated()
    try:
        Monokernel(big, wb, EngineConfig(block_k=256), max_seq=256)
        return {"error": None}
    except EngineMemoryError as x:
        return {"error": str(x), "allocated_before": before, "allocated_after": torch.cuda.memory_allocated()}


case = sys.argv[1]
if case.startswith(("never_publishes/", "nan_logits/")):
    kind, mode, ring = case.split("/")
    inject = poison_the_weights if kind == "nan_logits" else raise_a_target if mode == "targeted" else starve_the_barrier
    got = faulted_launch(mode, int(ring[4:]), inject)
elif case.startswith("weight_"):
    got = non_finite_weight(float(case[7:]))
else:
    got = {"past_the_cache": past_the_cache, "oom_at_build": oom_at_build}[case]()
torch.cuda.synchronize()
print("RESULT " + json.dumps(got))
"""
CASES = ([f"never_publishes/{m}/ring{r}" for m in ("targeted", "grid") for r in (0, 3)] +
         [f"nan_logits/{m}/ring{r}" for m in ("targeted", "grid") for r in (0, 3)] +
         ["weight_nan", "weight_inf", "past_the_cache", "oom_at_build"])


@pytest.fixture(scope="module")
def faults():
    """Each case in its own process: a fault that broke the CUDA context cannot hide the others."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = {"device": torch.cuda.get_device_name(), "git_commit": os.environ.get("KOG_GIT_COMMIT")}
    for case in CASES:
        r = subprocess.run([sys.executable, "-c", SCRIPT, case], capture_output=True, text=True, env=env,
                           timeout=600)
        line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")]
        out[case] = json.loads(line[-1][7:]) if line else {"crashed": r.returncode,
                                                           "stderr": r.stderr.strip().splitlines()[-12:]}
    if os.environ.get("KOG_BENCH_OUT"):
        with open(os.environ["KOG_BENCH_OUT"], "w") as f:
            json.dump(out, f, indent=1)
    return out


def test_a_producer_that_never_publishes_aborts_and_the_engine_recovers(faults):
    for name in CASES:
        if not name.startswith("never_publishes/"):
            continue
        c = faults[name]
        assert c.get("error"), (name, c)
        if "/targeted/" in name:
            assert "of layer 1" in c["error"] and "task " in c["error"], (name, c)
        else:
            assert "grid barrier" in c["error"], (name, c)
        assert "\n" not in c["error"]
        assert c["next_launch_same_tokens"], (name, c)


def test_logits_that_pick_no_token_abort_and_the_engine_recovers(faults):
    for name in CASES:
        if name.startswith("nan_logits/"):
            c = faults[name]
            assert c.get("error") and "no token could be picked" in c["error"], (name, c)
            assert c["next_launch_same_tokens"], (name, c)


def test_non_finite_weights_are_refused_with_the_tensor_named(faults):
    for bad in ("nan", "inf"):
        msg = faults[f"weight_{bad}"]
        assert "layers.1.w_down" in msg and "[3, 5]" in msg and "\n" not in msg, msg


def test_a_position_past_the_cache_is_refused_before_launch(faults):
    c = faults["past_the_cache"]
    assert c["error"] and "max_seq" in c["error"] and not c["compiled"], c


def test_out_of_memory_at_build_is_one_line_and_frees_everything(faults):
    c = faults["oom_at_build"]
    assert c["error"] and "out of GPU memory" in c["error"] and "\n" not in c["error"], c
    assert c["allocated_after"] == c["allocated_before"], c
