"""The monokernel under compute-sanitizer (device machine: pytest -m gpu tests/gpu/test_sanitizer_gpu.py; with
KOG_BENCH_OUT=path.json every summary is merged into that JSON).

memcheck, racecheck and synccheck, each over both sync modes with and without the weight ring, on a small
model (a 7-token prompt, 4 new tokens) and on llama-3.2-1b's shapes (random bf16 weights; a 2-token prompt, 2
new tokens: racecheck runs the kernel about a hundred times slower). Every case must report zero
errors and give the tokens of the same launch run without the sanitizer. The kernels are compiled once by
that plain run (Triton's cache), so the sanitized processes only load them. Waits are bounded at 600 s:
instrumented kernels run orders of magnitude slower, and a wait that ends early would be a false abort.

The command each case runs (also in docs/reliability.md):
    compute-sanitizer --tool TOOL --error-exitcode 97 python -c SCRIPT MODEL
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TOOLS = ("memcheck", "racecheck", "synccheck")
MODELS = ("small", "llama-3.2-1b")

SCRIPT = r"""
import json, sys, torch
from kog.engine.config import PRESETS
from kog.engine.engine_config import EngineConfig
from kog.engine.monokernel import Monokernel
from kog.engine.weights import random_weights

model = sys.argv[1]
if model == "small":
    cfg = PRESETS["tiny"].replace(eos_token_id=(), hidden_size=512, intermediate_size=1024, num_heads=8,
                                   num_kv_heads=2, head_dim=64, vocab_size=4096, num_layers=3)
    tiles = dict(block_k=256, bn_qkv=8, bn_o=8, bn_gate_up=8, bn_down=8, bn_lm=8)
    prompt, n = list(range(11, 19)), 4
else:     # a real model's shapes: one prefill step and two decode steps (racecheck runs them ~100x slower)
    cfg = PRESETS[model].replace(eos_token_id=())
    tiles = {}
    prompt, n = [11, 12], 2
w = random_weights(cfg, "cuda", seed=4, dtype=torch.bfloat16)
out = {}
for mode in ("targeted", "grid"):
    for ring in (0, 3):
        mk = Monokernel(cfg, w, EngineConfig(mode=mode, weight_ring=ring, wait_timeout_s=600.0, **tiles),
                        max_seq=64)
        mk.n_eos = 0
        out[f"{mode}/ring{ring}"] = mk.generate(prompt, n)[0]
        del mk
        torch.cuda.synchronize()
print("TOKENS " + json.dumps(out))
"""

SUMMARY = re.compile(r"^=========\s+((?:ERROR|RACECHECK|SYNCCHECK) SUMMARY:.*)$", re.M)


def sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "compute-sanitizer").is_file():
            return str(Path(home) / "bin" / "compute-sanitizer")
    return None


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def _tokens(stdout: str) -> dict | None:
    line = [x for x in stdout.splitlines() if x.startswith("TOKENS ")]
    return json.loads(line[-1][7:]) if line else None


def _record(key: str, value: dict) -> None:
    path = os.environ.get("KOG_BENCH_OUT")
    if not path:
        return
    doc = json.loads(Path(path).read_text()) if Path(path).is_file() else {}
    doc.setdefault("device", torch.cuda.get_device_name())
    doc.setdefault("git_commit", os.environ.get("KOG_GIT_COMMIT"))
    doc.setdefault("cases", {})[key] = value
    Path(path).write_text(json.dumps(doc, indent=1))


_PLAIN: dict[str, dict] = {}


def plain_tokens(model: str) -> dict:
    """The model's tokens without the sanitizer (this run also compiles every kernel variant), once a session."""
    if model not in _PLAIN:
        r = subprocess.run([sys.executable, "-c", SCRIPT, model], capture_output=True, text=True, env=_env(),
                           timeout=900)
        got = _tokens(r.stdout)
        assert got, r.stdout[-2000:] + r.stderr[-4000:]
        _PLAIN[model] = got
    return _PLAIN[model]


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("tool", TOOLS)
def test_the_monokernel_is_sanitizer_clean(tool, model):
    exe = sanitizer()
    if exe is None:
        pytest.skip("compute-sanitizer is not installed")
    plain = plain_tokens(model)
    env = dict(_env(), PYTORCH_NO_CUDA_MEMORY_CACHING="1")     # exact allocation bounds for memcheck
    t0 = time.perf_counter()
    r = subprocess.run([exe, "--tool", tool, "--error-exitcode", "97", "--print-limit", "20",
                        sys.executable, "-c", SCRIPT, model], capture_output=True, text=True, env=env, timeout=1800)
    text = r.stdout + r.stderr
    if "Device not supported" in text:
        pytest.skip(f"compute-sanitizer does not support this device: {text.strip().splitlines()[-1]}")
    summaries = SUMMARY.findall(text)
    tokens = _tokens(r.stdout)
    _record(f"{model}/{tool}", {"rc": r.returncode, "summaries": summaries, "seconds": time.perf_counter() - t0,
                                "same_tokens": tokens == plain,
                                "first_errors": [x for x in text.splitlines() if x.startswith("========= ")][:12]})
    assert summaries, text[-4000:]
    assert r.returncode == 0, text[-4000:]
    for s in summaries:
        assert re.search(r"\b0 errors\b", s), (s, text[-4000:])
    assert tokens == plain, (tokens, plain)
