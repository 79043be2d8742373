"""kogtune bench and the baselines on a real GPU (device machine: pytest -m gpu tests/gpu/test_bench_gpu.py).

Everything runs in a subprocess without TRITON_INTERPRET (tests/conftest.py sets it for the CPU suite, and
torch.compile's Triton kernels must not run under the interpreter).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

KEYS = {"device", "date", "git_commit", "source_digest", "versions", "model", "dtype", "prompt_tokens", "new_tokens", "copy_GBps",
        "weight_bytes_per_token", "limit_tok_per_s", "max_rel_err_oracle", "reference_max_rel_err_vs_fp32", "reference_first_divergence_oracle", "model_shapes",
        "systems"}


def _env():
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    return env


def _bench(tmp_path, model, systems, tokens, prompt_tokens=8, repeats=2):
    out = tmp_path / f"{model}.json"
    p = subprocess.run([sys.executable, "-m", "kog.tune.cli", "bench", "--model", model, "--tokens", str(tokens),
                        "--prompt-tokens", str(prompt_tokens), "--repeats", str(repeats), "--systems", systems,
                        "--out", str(out), "--runs-dir", str(tmp_path / "runs")],
                       capture_output=True, text=True, env=_env(), timeout=480)
    assert p.returncode == 0, p.stderr[-3000:]
    *_, run_dir, report = p.stdout.strip().splitlines()  # the run path, then (last) its report
    assert os.path.isdir(run_dir)
    assert report.endswith("report.html") and os.path.isfile(report)
    return json.loads(out.read_text()), run_dir


def test_bench_tiny_all_baselines(tmp_path):
    b, run_dir = _bench(tmp_path, "tiny", "reference-eager,cuda-graph,torch-compile,hf-transformers,kog-grid", 24)
    assert set(b) == KEYS
    assert 500 < b["copy_GBps"] < 20000
    assert b["limit_tok_per_s"] == pytest.approx(b["copy_GBps"] * 1e9 / b["weight_bytes_per_token"])
    s = b["systems"]
    for name in ("reference-eager", "cuda-graph", "torch-compile", "hf-transformers"):
        assert s[name].get("error") is None, (name, s[name])
        assert s[name]["tok_per_s"] > 0 and len(s[name]["runs_tok_per_s"]) == 2
    # same kernels replayed: the graph's greedy tokens are the eager reference's, bit for bit
    assert s["reference-eager"]["first_divergence"] is None
    assert s["cuda-graph"]["first_divergence"] is None
    # inductor / HF's own kernels round differently in bf16: equal until a near-tie at the earliest
    for name in ("torch-compile", "hf-transformers"):
        fd = s[name]["first_divergence"]
        assert fd is None or fd >= 4, (name, fd)
    assert "kog-grid" in s          # measured or an error record, never missing


def test_bench_llama_1b_graph_and_compile(tmp_path):
    b, _ = _bench(tmp_path, "llama-3.2-1b", "reference-eager,cuda-graph,torch-compile", 16)
    s = b["systems"]
    assert b["weight_bytes_per_token"] == 2471632896
    for name in ("reference-eager", "cuda-graph", "torch-compile"):
        assert s[name].get("error") is None, (name, s[name])
    assert s["cuda-graph"]["first_divergence"] is None
    # inductor fuses differently in bf16: equal until a near-tie at the earliest
    fd = s["torch-compile"]["first_divergence"]
    assert fd is None or fd >= 4
    assert s["cuda-graph"]["tok_per_s"] > s["reference-eager"]["tok_per_s"]
    assert s["torch-compile"]["tok_per_s"] > s["reference-eager"]["tok_per_s"]


_COMPILE_LOGITS = r"""
import json, sys, torch
from kog.engine.reference import Reference
from kog.tune.bench import max_rel_err, reference_greedy
from kog.engine.weights import resolve_model
cfg, w = resolve_model("llama-3.2-1b", "cuda", seed=0)
prompt = list(range(100, 108)); n = 12
toks, ref_logits = reference_greedy(cfg, w, prompt, n)
ref = Reference(cfg, w, 64)
rows = []
with torch.no_grad():
    ref.reset(); ref.prefill(prompt[:-1])
    step = torch.compile(lambda t, p: ref._forward(t, p, ref.max_seq)[0].float(), mode="reduce-overhead",
                         fullgraph=True)
    for j, t in enumerate([prompt[-1]] + toks[:-1]):
        rows.append(step(torch.tensor([t], device="cuda"), torch.tensor([len(prompt) - 1 + j], device="cuda")).clone())
print(json.dumps({"err": max_rel_err(torch.stack(rows), ref_logits)}))
"""


def test_compiled_step_logits_match_eager():
    p = subprocess.run([sys.executable, "-c", _COMPILE_LOGITS], capture_output=True, text=True, env=_env(),
                       timeout=480)
    assert p.returncode == 0, p.stderr[-3000:]
    err = json.loads(p.stdout.strip().splitlines()[-1])["err"]
    assert err < 2e-2


_ORACLE_WEIGHTS = r"""
import json, torch
from kog.engine.weights import resolve_model
from kog.tune.bench import oracle_weights, reference_fp32_logits, reference_greedy
cfg, w = resolve_model("llama-3.2-1b", "cuda", seed=0)
prompt = list(range(100, 108)); n = 12
toks, _ = reference_greedy(cfg, w, prompt, n)
w32 = oracle_weights(w)
once = reference_fp32_logits(cfg, w32, prompt, toks)
per_step = reference_fp32_logits(cfg, w, prompt, toks)
print(json.dumps({"upcast": w32["embed"].dtype == torch.float32, "tied": w32["lm_head"] is w32["embed"],
                  "equal": bool(torch.equal(once, per_step))}))
"""


def test_oracle_weights_give_the_same_float32_logits():
    """Upcasting the weights once for the float32 references changes no logit: the same products."""
    p = subprocess.run([sys.executable, "-c", _ORACLE_WEIGHTS], capture_output=True, text=True, env=_env(),
                       timeout=480)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"upcast": True, "tied": True, "equal": True}
