"""kog.Engine on a real GPU (device machine: pytest -m gpu tests/gpu/test_api_gpu.py; KOG_BENCH_OUT=path.json
also writes the streaming / sampling measurements there).

One subprocess (without TRITON_INTERPRET, which tests/conftest.py sets for the CPU suite) loads llama-3.2-1b
(seeded random weights) once per sync mode and measures everything; the tests below assert on its JSON:
tokens stream long before the launch ends, every sampling mode behaves (greedy, temperature, top-k, top-p,
seeded), a longer request compiles and packs nothing again, and sampling costs little against greedy.
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

MODEL = "llama-3.2-1b"

_SCRIPT = r"""
import json, statistics, sys, time, torch
import kog
from kog.engine.kernel import monokernel

MODEL, REPEATS = sys.argv[1], 5
SHORT = list(range(100, 108))                 # TTFT: a short prompt, so the prefill is a small part
PROMPT = list(range(100, 164))                # the bench's 64-token prompt
SAMPLED = dict(temperature=0.8, top_p=0.9)


def kernels_compiled():
    # Triton's per-device cache of compiled variants (None where this Triton keeps it elsewhere)
    try:
        return sum(len(c[0]) for c in monokernel.device_caches.values())
    except Exception:
        return None


def streamed(eng, prompt, n, **kw):
    t0, arrivals = time.perf_counter(), []
    for piece in eng.stream(prompt, n, seed=kw.pop("seed", 1), **kw):
        arrivals.append(time.perf_counter() - t0)
    r = eng.last_result
    return dict(first_piece_s=arrivals[0], last_piece_s=arrivals[-1], ttft_s=r.ttft_s, seconds=r.seconds,
                tok_per_s=r.tok_per_s, tokens=len(r.token_ids), stop_reason=r.stop_reason)


def rate(runs):
    return dict(ttft_s=statistics.median(r["ttft_s"] for r in runs),
                tok_per_s=statistics.median(r["tok_per_s"] for r in runs),
                runs_tok_per_s=[r["tok_per_s"] for r in runs], tokens=[r["tokens"] for r in runs])


def nucleus_ok(lg, tok, temperature, top_k, top_p):
    # whether `tok` may be drawn from logits lg [V] under the rules (ties at the threshold allowed)
    x = lg.double() / temperature
    if top_k and (x > x[tok]).sum().item() >= top_k:
        return False
    if top_p < 1.0:
        p = torch.softmax(x, -1)
        if p[x > x[tok]].sum().item() >= top_p + 1e-4:
            return False
    return True


def sampling_checks(eng):
    mk, out = eng.backend, {}
    cases = dict(greedy=dict(), temperature=dict(temperature=0.8), top_k=dict(temperature=0.8, top_k=50),
                 top_p=dict(temperature=0.8, top_p=0.9), top_k_top_p=dict(temperature=1.0, top_k=40, top_p=0.8))
    for name, kw in cases.items():
        a = eng.generate(PROMPT, 48, seed=123, **kw)
        b = eng.generate(PROMPT, 48, seed=123, **kw)
        c = eng.generate(PROMPT, 48, seed=124, **kw)
        lg = mk.teacher_forced_logits(PROMPT, a.token_ids)
        ok = [nucleus_ok(lg[j], t, kw.get("temperature", 1.0), kw.get("top_k", 0), kw.get("top_p", 1.0))
              for j, t in enumerate(a.token_ids)] if kw else [int(lg[j].argmax()) == t for j, t in enumerate(a.token_ids)]
        out[name] = dict(same_seed_equal=a.token_ids == b.token_ids, other_seed_differs=a.token_ids != c.token_ids,
                         allowed=sum(ok), tokens=len(ok))
    # temperature + top-k over many one-token draws: chi-square against the renormalised top-5 softmax
    k, T, n = 5, 0.8, 400
    lg = mk.teacher_forced_logits(SHORT, [0])[0].double().cpu() / T     # counts live on the host
    top = torch.topk(lg, k)
    want = torch.softmax(top.values, -1)
    counts = torch.zeros(k, dtype=torch.float64)
    outside = 0
    for s in range(n):
        t = eng.generate(SHORT, 1, temperature=T, top_k=k, seed=s).token_ids[0]
        hit = (top.indices == t).nonzero()
        if len(hit):
            counts[hit[0, 0]] += 1
        else:
            outside += 1
    out["top_k_chi2"] = dict(chi2=float(((counts - n * want) ** 2 / (n * want)).sum()), outside=outside,
                             dof=k - 1)
    greedy = eng.generate(PROMPT, 64)
    toks, _ = mk.generate(PROMPT, 64)
    out["greedy_equals_generate"] = greedy.token_ids == list(toks)[:len(greedy.token_ids)]
    return out


res = {"model": MODEL, "device": torch.cuda.get_device_name(), "modes": {}}
for mode in ("targeted", "grid"):
    eng = kog.Engine.from_pretrained(MODEL, mode=mode)
    m = res["modes"][mode] = {"max_seq": eng.max_seq, "config": eng.config.to_dict()}
    for kw in (dict(), dict(temperature=0.8), SAMPLED, dict(temperature=0.8, top_k=50)):   # compile each variant
        eng.generate(PROMPT, 4, seed=0, **kw)
    m["compile_seconds"] = eng.compile_seconds
    mk, wbuf, before = eng.backend, eng.backend.wbuf.data_ptr(), kernels_compiled()
    short = streamed(eng, PROMPT, 128)
    long = streamed(eng, PROMPT, 256)
    m["reuse"] = dict(same_backend=eng.backend is mk, same_weights=mk.wbuf.data_ptr() == wbuf,
                      kernels_before=before, kernels_after=kernels_compiled(), tok_per_s_128=short["tok_per_s"],
                      tok_per_s_256=long["tok_per_s"])
    m["stream_short_prompt"] = [streamed(eng, SHORT, 256) for _ in range(3)]
    m["greedy"] = rate([streamed(eng, PROMPT, 256) for _ in range(REPEATS)])
    m["sampled"] = rate([streamed(eng, PROMPT, 256, seed=s, **SAMPLED) for s in range(REPEATS)])
    launches = [mk.generate(PROMPT, 256) for _ in range(REPEATS)]
    m["launch_tok_per_s"] = statistics.median(len(t) / s for t, s in launches)
    m["sampled_over_greedy"] = m["sampled"]["tok_per_s"] / m["greedy"]["tok_per_s"]
    m["stream_over_launch"] = m["greedy"]["tok_per_s"] / m["launch_tok_per_s"]
    m["sampling"] = sampling_checks(eng)
    del eng, mk
    torch.cuda.empty_cache()

ref = kog.Engine.from_pretrained(MODEL, mode="reference")
a, b = (ref.generate(PROMPT, 16, seed=5, **SAMPLED) for _ in range(2))
res["reference"] = dict(same_seed_equal=a.token_ids == b.token_ids, tokens=len(a.token_ids))
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    p = subprocess.run([sys.executable, "-c", _SCRIPT, MODEL], capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    out = os.environ.get("KOG_BENCH_OUT")
    if out:
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
    return res


@pytest.mark.parametrize("mode", ["targeted", "grid"])
def test_tokens_stream_while_the_kernel_runs(measured, mode):
    """The first token arrives long before the last: TTFT under a quarter of the whole 256-token request."""
    for run in measured["modes"][mode]["stream_short_prompt"]:
        assert run["tokens"] == 256 and run["stop_reason"] == "length", run
        assert run["ttft_s"] < run["seconds"] / 4, run
        assert run["first_piece_s"] < run["last_piece_s"] / 4, run


@pytest.mark.parametrize("mode", ["targeted", "grid"])
def test_a_longer_request_compiles_and_packs_nothing(measured, mode):
    r = measured["modes"][mode]["reuse"]
    assert r["same_backend"] and r["same_weights"], r
    assert r["kernels_before"] == r["kernels_after"], r
    assert r["tok_per_s_256"] > 0.8 * r["tok_per_s_128"], r      # no rebuild inside the longer call


@pytest.mark.parametrize("mode", ["targeted", "grid"])
def test_every_sampling_mode(measured, mode):
    s = measured["modes"][mode]["sampling"]
    assert s["greedy_equals_generate"]
    for name in ("greedy", "temperature", "top_k", "top_p", "top_k_top_p"):
        assert s[name]["same_seed_equal"], (name, s[name])
        assert s[name]["allowed"] == s[name]["tokens"], (name, s[name])    # never outside top-k / the nucleus
        if name != "greedy":
            assert s[name]["other_seed_differs"], (name, s[name])
    chi = s["top_k_chi2"]
    assert chi["outside"] == 0 and chi["chi2"] < 18.47, chi          # chi-square, 4 dof, p = 0.001
    assert measured["reference"]["same_seed_equal"]


@pytest.mark.parametrize("mode", ["targeted", "grid"])
def test_sampling_and_streaming_cost_little(measured, mode):
    """Targets of issue 25: sampling within 3% of greedy, streaming within 2% of a plain launch; asserted
    with some room for run-to-run spread (the JSON keeps the exact figures)."""
    m = measured["modes"][mode]
    assert m["sampled_over_greedy"] > 0.95, m
    assert m["stream_over_launch"] > 0.96, m
