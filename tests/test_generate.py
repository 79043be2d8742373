"""generate: sampling rules, the reference mode end to end (CPU), tokenizers, and the bench's CPU-side pieces."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd

import pytest
import torch

from kog.engine.config import preset
from kog.engine.reference import Reference, sample_next
from kog.engine.tokenizer import ByteTokenizer, HFTokenizer, StreamDecoder, load_tokenizer
from kog.engine.weights import random_weights, save_checkpoint
from kog.tune.cli import main as kogtune

V = 200


def _logits(seed=0):
    return torch.randn(V, generator=torch.Generator().manual_seed(seed)) * 2


def test_greedy_and_temperature_zero():
    lg = _logits()
    assert sample_next(lg, 0.0) == int(lg.argmax())
    # a tiny temperature is greedy in effect
    g = torch.Generator().manual_seed(0)
    assert all(sample_next(lg, 1e-4, generator=g) == int(lg.argmax()) for _ in range(20))


def test_top_k_never_leaves_top_k():
    lg = _logits(1)
    top = set(torch.topk(lg, 5).indices.tolist())
    g = torch.Generator().manual_seed(0)
    draws = {sample_next(lg, 5.0, top_k=5, generator=g) for _ in range(300)}
    assert draws <= top and len(draws) > 1


def test_top_p_keeps_the_nucleus():
    lg = _logits(2)
    p = torch.softmax(lg, -1)
    order = torch.argsort(p, descending=True)
    cum = torch.cumsum(p[order], -1)
    k = int((cum < 0.5).sum()) + 1                     # the smallest prefix with mass >= 0.5
    nucleus = set(order[:k].tolist())
    g = torch.Generator().manual_seed(0)
    draws = {sample_next(lg, 1.0, top_p=0.5, generator=g) for _ in range(400)}
    assert draws <= nucleus
    assert sample_next(lg, 1.0, top_p=1e-9, generator=g) == int(lg.argmax())


def test_sampling_matches_softmax_chi_square():
    lg = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.0, 0.2])
    p = torch.softmax(lg / 0.7, -1)
    g = torch.Generator().manual_seed(123)
    n = 6000
    counts = torch.zeros(6)
    for _ in range(n):
        counts[sample_next(lg, 0.7, generator=g)] += 1
    chi2 = float(((counts - n * p) ** 2 / (n * p)).sum())
    assert chi2 < 20.5          # chi-square, 5 degrees of freedom, p = 0.001


def test_reference_stream_seeded_and_greedy_equal():
    cfg = preset("tiny").replace(dtype="float32")
    w = random_weights(cfg, "cpu", 0)
    prompt = [1, 40, 41, 42]
    ref = Reference(cfg, w, 32)

    def run(n, **kw):
        return list(ref.stream(prompt, n, **kw))
    a, b = run(12, temperature=1.0, top_k=20, seed=7), run(12, temperature=1.0, top_k=20, seed=7)
    c = run(12, temperature=1.0, top_k=20, seed=8)
    assert a == b and a != c
    greedy = run(8)
    assert greedy == Reference(cfg, w, 32).greedy(prompt, 8)
    assert ref.last_stream["tokens"] == 8 and ref.last_stream["decode_s"] >= ref.last_stream["ttft_s"] > 0
    stop = greedy[2]
    assert run(8, stop_ids=(stop,)) == greedy[:greedy.index(stop) + 1]


def test_byte_tokenizer_round_trip():
    cfg = preset("tiny")
    tok = ByteTokenizer(cfg)
    text = "héllo, wörld ✓"
    ids = tok.encode(text)
    assert ids[0] == cfg.bos_token_id and max(ids) < cfg.vocab_size
    assert tok.decode(ids[1:]) == text
    s = StreamDecoder(tok)
    assert "".join(s.push(i) for i in ids[1:]) == text    # multi-byte characters held back until complete


def _write_wordlevel_tokenizer(d):
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate("the quick brown fox jumps".split())}}
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.save(str(d / "tokenizer.json"))


def test_cli_generate_reference_on_checkpoint_with_tokenizer(tmp_path, capsys):
    cfg = preset("tiny").replace(dtype="bfloat16")
    d = save_checkpoint(cfg, random_weights(cfg, "cpu", 0), tmp_path / "ck")
    _write_wordlevel_tokenizer(d)
    tok = load_tokenizer(d, cfg)
    assert isinstance(tok, HFTokenizer) and tok.encode("the quick fox") == [3, 4, 6]
    rc = kogtune(["generate", "--model", str(d), "--mode", "reference", "--prompt", "the quick fox",
                  "--tokens", "6", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompt_ids"] == [3, 4, 6] and out["tokenizer"] == "tokenizer.json"
    assert 1 <= len(out["tokens"]) <= 6 and all(0 <= t < cfg.vocab_size for t in out["tokens"])


def test_cli_generate_streams_on_preset(capsys):
    rc = kogtune(["generate", "--model", "tiny", "--mode", "reference", "--prompt", "hi", "--tokens", "5",
                  "--temperature", "0.9", "--top-p", "0.9", "--seed", "3"])
    cap = capsys.readouterr()
    assert rc == 0 and cap.out.startswith("hi") and "tok/s" in cap.err


def test_cli_generate_bad_args(capsys):
    assert kogtune(["generate", "--model", "tiny", "--mode", "reference", "--top-p", "0"]) == 2
    assert kogtune(["generate", "--model", "no-such-model", "--mode", "reference"]) == 2
    err = capsys.readouterr().err
    assert "top-p" in err and "llama-3.2-1b" in err and "Traceback" not in err


@pytest.mark.skipif(importlib.util.find_spec("kog.engine.monokernel") is not None,
                    reason="the monokernel exists: its own tests cover these modes")
def test_cli_generate_monokernel_not_built(capsys):
    assert kogtune(["generate", "--model", "tiny", "--mode", "targeted"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "not built" in err


# ---- bench pieces that need no GPU ---------------------------------------------------------------------------

def test_max_rel_err_definition():
    from kog.tune.bench import first_divergence, max_rel_err
    b = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    a = b.clone()
    assert max_rel_err(a, b) == 0.0
    a[2, 7] += 0.5 * b[2].abs().max()
    assert abs(max_rel_err(a, b) - 0.5) < 1e-6        # per step: max|a-b| / max|b|, max over steps
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 5, 3], [1, 2, 3]) == 1


def test_bench_without_gpu_is_one_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert kogtune(["bench", "--model", "tiny", "--tokens", "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no GPU" in err


def test_bench_system_records_errors_and_goes_on():
    from kog.tune.baselines import ReferenceEager
    from kog.tune.bench import bench_system, reference_fp32_logits, reference_greedy
    cfg = preset("tiny").replace(dtype="float32")
    w = random_weights(cfg, "cpu", 0)
    prompt = [1, 2, 3, 4]
    toks, logits = reference_greedy(cfg, w, prompt, 6)
    assert toks == Reference(cfg, w, 16).greedy(prompt, 6)
    # teacher forcing along other tokens: the Reference's own teacher_forced_logits, row for row
    forced = [7, 3, 9, 1, 4, 2]
    tf = reference_fp32_logits(cfg, w, prompt, forced)
    oracle = Reference(cfg, w, len(prompt) + len(forced), compute_dtype=torch.float32)
    assert torch.equal(tf, oracle.teacher_forced_logits(prompt, forced))

    class Broken:
        def __init__(self, *a):
            pass

        def generate(self, prompt_ids, n):
            raise RuntimeError("kernel fell over")

    rec = bench_system("broken", Broken, cfg, w, "cpu", prompt, 6, 2, toks, logits)
    assert rec["tok_per_s"] is None and "kernel fell over" in rec["error"]

    class WithLogits(ReferenceEager):
        def teacher_forced_logits(self, prompt_ids, forced):
            return Reference(cfg, w, 16).teacher_forced_logits(prompt_ids, forced) * 1.01

        def breakdown(self):
            return {"streaming": 1e-3, "other": 1e-4}

    rec = bench_system("eager", WithLogits, cfg, w, "cpu", prompt, 6, 2, toks, logits)
    assert rec["first_divergence"] is None and len(rec["runs_tok_per_s"]) == 2 and rec["tok_per_s"] > 0
    assert abs(rec["max_rel_err"] - 0.01) < 1e-4 and rec["breakdown"]["streaming"] == 1e-3


def test_run_bench_pipeline_on_cpu(tmp_path, monkeypatch):
    """The whole bench bookkeeping (systems, errors, run directory, JSON keys) with the CPU stand-in."""
    from kog.tune import bench
    from kog.runstore import open_run
    bench.available_systems()
    monkeypatch.setitem(bench._REGISTRY, "kog-grid", bench._not_built("kog-grid", "not built"))

    traces = {}

    class Traced(bench._REGISTRY["reference-eager"]):
        """A stand-in for KogSystem: per-phase breakdown and the instrumented run's trace table."""
        phases = {"qkv": {"seconds_per_token": 6e-4, "waiting": 1e-4, "tasks": 12},
                  "down": {"seconds_per_token": 1.5e-3, "waiting": 0.0, "tasks": 8}}

        def breakdown(self):
            self.trace_table = traces.setdefault(type(self).__name__, _trace_table(steps=6, rows_per_step=40))
            return {"streaming": 2e-3, "waiting": 1e-4, "barrier": 0.0, "other": 1e-5,
                    "phases": self.phases, "table": object()}

    class GridTraced(Traced):
        phases = {"qkv": {"seconds_per_token": 5e-4, "waiting": 0.0, "tasks": 12},
                  "barrier": {"seconds_per_token": 3e-4, "waiting": 3e-4, "tasks": 64}}

    class OddPhases(bench._REGISTRY["reference-eager"]):
        def breakdown(self):        # phases that are not {phase: {...}}: no per-phase rows, nothing breaks
            return {"streaming": 1e-3, "other": 1e-5, "phases": {"qkv": 1e-4}}
    monkeypatch.setitem(bench._REGISTRY, "traced", Traced)
    monkeypatch.setitem(bench._REGISTRY, "grid-traced", GridTraced)
    monkeypatch.setitem(bench._REGISTRY, "odd", OddPhases)
    monkeypatch.setattr(bench, "TIMELINE_ROWS_PER_SYSTEM", 100)
    monkeypatch.setattr(bench, "HF_MAX_TOKENS", 3)
    out, path = bench.run_bench("tiny", tokens=5, prompt_tokens=6, repeats=2,
                                systems="reference-eager,hf-transformers,kog-grid,traced,grid-traced,odd",
                                runs_dir=str(tmp_path / "runs"), json_out=str(tmp_path / "b.json"), progress=False,
                                cpu_for_tests=True)
    assert set(out) == {"device", "date", "git_commit", "source_digest", "versions", "model", "dtype", "prompt_tokens",
                        "new_tokens", "copy_GBps", "weight_bytes_per_token", "limit_tok_per_s",
                        "max_rel_err_oracle", "reference_max_rel_err_vs_fp32", "reference_first_divergence_oracle", "model_shapes", "systems", "wall_seconds",
                        "reduced_runs"}
    # the slow baseline is timed over fewer tokens, and the JSON says so
    assert out["reduced_runs"] == {"hf-transformers": {"new_tokens": 3, "repeats": 2}}
    ws = out["wall_seconds"]
    assert set(ws) == {"model", "copy", "reference", "systems", "total"} and all(v >= 0 for v in ws.values())
    assert ws["systems"] == pytest.approx(sum(r["wall_seconds"] for r in out["systems"].values()), abs=1e-2)
    assert ws["total"] >= ws["systems"] + ws["reference"] - 0.01     # each figure rounded to 1 ms
    assert out["limit_tok_per_s"] == pytest.approx(out["copy_GBps"] * 1e9 / out["weight_bytes_per_token"])
    s = out["systems"]
    assert s["reference-eager"]["tok_per_s"] > 0 and s["reference-eager"]["first_divergence"] is None
    assert len(s["reference-eager"]["runs_tok_per_s"]) == 2
    assert s["hf-transformers"]["tok_per_s"] > 0 and s["hf-transformers"]["first_divergence"] is None
    assert s["kog-grid"]["error"] == "not built" and s["kog-grid"]["tok_per_s"] is None
    assert s["traced"]["breakdown"]["streaming"] == 2e-3 and s["traced"]["breakdown_extra"] == {"phases": Traced.phases}
    assert s["odd"]["breakdown_extra"] == {"phases": {"qkv": 1e-4}}
    run = open_run(path)
    assert run.kind == "bench" and run.status == "complete" and "kog-grid" in run.meta["errors"]
    t = run.table("systems")
    assert list(t["system"]) == ["reference-eager", "hf-transformers", "kog-grid", "traced", "grid-traced", "odd"]
    assert run.json("bench") == json.loads((tmp_path / "b.json").read_text())

    # per-phase breakdown: waiting vs streaming per phase, barrier rows in grid mode, the token's remainder
    bd = run.table("breakdown")
    assert list(bd.columns) == ["system", "phase", "category", "seconds_per_token"]
    assert set(bd["system"]) == {"traced", "grid-traced"}
    got = {(r.system, r.phase, r.category): r.seconds_per_token for r in bd.itertuples()}
    assert got == pytest.approx({
        ("traced", "qkv", "streaming"): 5e-4, ("traced", "qkv", "waiting"): 1e-4,
        ("traced", "down", "streaming"): 1.5e-3, ("traced", "down", "waiting"): 0.0,
        ("traced", "other", "other"): 1e-5,
        ("grid-traced", "qkv", "streaming"): 5e-4, ("grid-traced", "qkv", "waiting"): 0.0,
        ("grid-traced", "barrier", "barrier"): 3e-4, ("grid-traced", "other", "other"): 1e-5})

    # the instrumented run's trace: whole tokens after the first, within the row budget, one 'system' column
    tl = run.table("timeline")
    assert list(tl.columns[:1]) == ["system"] and set(tl["system"]) == {"traced", "grid-traced"}
    for name, cls in (("traced", "Traced"), ("grid-traced", "GridTraced")):
        mine = tl[tl["system"] == name].drop(columns="system").reset_index(drop=True)
        assert len(mine) <= 100 and sorted(mine["step"].unique()) == [1, 2]
        src = traces[cls]
        pd.testing.assert_frame_equal(mine, src[src["step"].isin([1, 2])].reset_index(drop=True),
                                      check_dtype=False)


def _trace_table(steps: int, rows_per_step: int, seed: int = 0):
    """A trace table shaped like engine/trace.py trace_table, random times."""
    import numpy as np
    import pandas as pd
    rng = np.random.default_rng(seed)
    n = steps * rows_per_step
    start = np.sort(rng.integers(0, 10_000_000, n))
    return pd.DataFrame({"cta": rng.integers(0, 8, n), "sm": rng.integers(0, 8, n),
                         "step": np.repeat(np.arange(steps), rows_per_step), "task": rng.integers(0, 50, n),
                         "phase": rng.choice(["qkv", "o", "barrier"], n), "layer": rng.integers(0, 2, n),
                         "start_ns": start, "end_ns": start + rng.integers(1, 5000, n),
                         "wait_ns": rng.integers(0, 500, n)})


def test_sample_timeline_keeps_whole_tokens():
    from kog.tune.bench import sample_timeline
    df = _trace_table(steps=5, rows_per_step=30, seed=1)
    a = sample_timeline(df, max_rows=70)
    assert sorted(a["step"].unique()) == [1, 2] and len(a) == 60       # the start-up token is skipped
    b = sample_timeline(df, max_rows=10)                                # a token over the budget: still one
    assert sorted(b["step"].unique()) == [1] and len(b) == 30
    assert len(sample_timeline(df, max_rows=10_000)) == 4 * 30
    one = df[df["step"] == 0]
    assert len(sample_timeline(one, max_rows=10)) == 30               # a single traced token is kept


def test_cli_bench_prints_run_then_report_last(tmp_path, monkeypatch, capsys):
    """`kogtune bench` ends with the run directory, then the engine report's path (last line)."""
    import argparse
    import functools
    from kog.tune import bench
    bench.available_systems()

    class Traced(bench._REGISTRY["reference-eager"]):
        def breakdown(self):
            self.trace_table = _trace_table(steps=3, rows_per_step=20, seed=2)
            return {"streaming": 2e-3, "waiting": 2e-4, "barrier": 0.0, "other": 1e-4,
                    "phases": {"qkv": {"seconds_per_token": 2.2e-3, "waiting": 2e-4, "tasks": 4}}}
    monkeypatch.setitem(bench._REGISTRY, "kog-targeted", Traced)
    monkeypatch.setattr(bench, "run_bench", functools.partial(bench.run_bench, cpu_for_tests=True, progress=False))
    args = argparse.Namespace(model="tiny", tokens=3, prompt_tokens=4, repeats=1, systems="reference-eager,kog-targeted",
                              runs_dir=str(tmp_path / "runs"), json=False, out=None)
    assert bench.cli_bench(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    run_dir, report = Path(lines[-2]), Path(lines[-1])
    assert run_dir.is_dir() and (run_dir / "meta.json").is_file()
    assert report == run_dir / "report.html" and report.is_file()
    html = report.read_text()
    assert "kog-targeted" in html and "Per-SM timeline" in html and "data:image/png;base64," in html
    assert list(run_dir.glob("timeline*.trace.json.gz"))         # the Chrome trace, gzipped in the run folder


def test_kog_systems_run_the_monokernel_with_the_tuned_config(tmp_path, monkeypatch):
    """kog-targeted / kog-grid (kog.tune.systems.KogSystem) on the interpreter: the config the store gives
    for this device (here the user's stored one) in the system's sync mode, greedy tokens equal to the
    float32 reference's, teacher-forced logits within float32 rounding of it."""
    from kog.engine.engine_config import EngineConfig
    from kog.tune import bench, store
    from kog.tune.systems import KogSystem
    monkeypatch.setenv("KOG_TUNED_DIR", str(tmp_path))
    cfg = preset("tiny")
    w = random_weights(cfg, "cpu", seed=3, dtype=torch.float32)
    stored = EngineConfig(block_k=64, bn_qkv=16, bn_o=16, bn_gate_up=16, bn_down=16, bn_lm=64, attn_block=16,
                          sync_rows=32)
    assert store.save_best("cpu", cfg, stored, 1.0, {"backend": "gpu"})
    systems = bench.available_systems()
    for name, mode in (("kog-targeted", "targeted"), ("kog-grid", "grid")):
        s = systems[name](cfg, w, "cpu")
        assert isinstance(s, KogSystem) and s.ecfg == stored.replace(mode=mode)
    prompt = [5, 17, 33, 2, 9]
    oracle = Reference(cfg, w, 64, compute_dtype=torch.float32)
    want = oracle.greedy(prompt, 3)
    tokens, secs = s.generate(prompt, 3)
    assert list(tokens) == want and secs > 0 and s.mk.max_seq == 64
    got = s.teacher_forced_logits(prompt, want)
    ref = Reference(cfg, w, 64, compute_dtype=torch.float32).teacher_forced_logits(prompt, want)
    assert float((got.float() - ref).abs().max() / ref.abs().max()) < 1e-4


def test_kog_rule_runs_the_rule_whatever_is_stored(tmp_path, monkeypatch):
    """kog-rule: targeted mode with the platform's rule while kog-targeted runs the stored config, each naming
    where its config came from; the bench times kog-rule by default only where the two configs differ."""
    from kog.engine.engine_config import EngineConfig
    from kog.engine.monokernel import platform_default
    from kog.tune import bench, store
    from kog.tune.systems import tuned_differs_from_rule
    monkeypatch.setenv("KOG_TUNED_DIR", str(tmp_path / "tuned"))
    cfg = preset("tiny")
    w = random_weights(cfg, "cpu", seed=3, dtype=torch.float32)
    systems = bench.available_systems()
    monkeypatch.setattr(bench, "DEFAULT_SYSTEMS", ("reference-eager", bench.RULE_SYSTEM))
    # a stand-in for kog-rule: the selection is what this bench checks, the interpreter runs the real one below
    monkeypatch.setitem(bench._REGISTRY, bench.RULE_SYSTEM, bench._REGISTRY["reference-eager"])

    def benched() -> set[str]:
        out, _ = bench.run_bench("tiny", tokens=2, prompt_tokens=3, repeats=1, runs_dir=str(tmp_path / "runs"),
                                 progress=False, cpu_for_tests=True)
        return set(out["systems"])

    assert not tuned_differs_from_rule(cfg, "cpu", 70)
    assert benched() == {"reference-eager"}
    stored = EngineConfig(block_k=64, bn_qkv=16, bn_o=16, bn_gate_up=16, bn_down=16, bn_lm=64, attn_block=16,
                          sync_rows=32)
    assert store.save_best("cpu", cfg, stored, 1.0, {"backend": "gpu"})
    assert tuned_differs_from_rule(cfg, "cpu", 70)
    assert benched() == {"reference-eager", bench.RULE_SYSTEM}
    rule, tuned = systems["kog-rule"](cfg, w, "cpu"), systems["kog-targeted"](cfg, w, "cpu")
    assert rule.ecfg == platform_default(cfg, "cpu", None).replace(mode="targeted") != tuned.ecfg
    assert (rule.config_source, tuned.config_source) == ("rule", "stored")
    prompt = [5, 17, 33, 2, 9]
    want = Reference(cfg, w, 64, compute_dtype=torch.float32).greedy(prompt, 2)
    assert list(rule.generate(prompt, 2)[0]) == want


def test_tuned_choice_names_the_builtin_study(monkeypatch, tmp_path):
    """Where the built-in table answers, the source names the study behind the entry."""
    from kog.tune import store
    monkeypatch.setenv("KOG_TUNED_DIR", str(tmp_path))
    builtin = json.loads(store.BUILTIN.read_text())
    e = next(iter(builtin["entries"].values()))
    cfg = preset(e["model"])
    monkeypatch.setattr(store, "_device_name", lambda device=None: e["device"])
    ecfg, source = store.tuned_choice(cfg, None, None)
    assert ecfg == store.engine_config(e["config"]) and source == f"built-in entry, study {e['source']['study']}"


def _load_bench_script(name: str):
    """bench/<name>.py as a module (the bench scripts are not part of the package)."""
    repo = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location(name, repo / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_all_presets_script_benches_and_adds_up(tmp_path):
    """bench/all_presets.py's pieces on the CPU: a preset's bench JSON and run land in OUTDIR, and the summary
    keeps earlier calls' presets and sums every preset's seconds (the bench of all presets is split over
    several device commands)."""
    ap = _load_bench_script("all_presets")
    assert "tiny" not in ap.BENCHED and "llama-3.1-8b" in ap.BENCHED
    entry = ap.bench_preset("tiny", tmp_path, 3, 1, systems="reference-eager", cpu_for_tests=True)
    doc = json.loads((tmp_path / "tiny.json").read_text())
    assert doc["model"] == "tiny" and doc["new_tokens"] == 3
    assert entry["seconds"] >= entry["bench_wall_seconds"]["total"] > 0 and Path(entry["run"]).is_dir()
    ap.record(tmp_path, "tiny", entry)
    s = ap.record(tmp_path, "other", {"seconds": 2.5})
    assert set(s["presets"]) == {"tiny", "other"}
    assert s["total_seconds"] == pytest.approx(entry["seconds"] + 2.5, abs=2e-3)
    assert json.loads((tmp_path / "all_presets.json").read_text()) == s


def test_ab_trees_summarizes_rounds_and_keeps_a_failed_process(tmp_path):
    """bench/ab_trees.py's pieces on the CPU: the summary is the median over every timed launch of every round
    with its range and the first process's check; a process that fails (here: an unknown preset) is recorded as
    an error, not raised, so the other trees and presets still run."""
    ab = _load_bench_script("ab_trees")
    runs = {"a": [{"tok_per_s": [10.0, 12.0], "rel_err_vs_fp32_ref": 7e-3, "regs": 220}, {"tok_per_s": [11.0, 30.0]}],
            "b": [{"error": "exit 1: boom"}, {"tok_per_s": [5.0]}]}
    s = ab.summarize(runs)
    assert s["a"]["tok_per_s"] == pytest.approx(11.5) and (s["a"]["min"], s["a"]["max"], s["a"]["n"]) == (10.0, 30.0, 4)
    assert s["a"]["rel_err_vs_fp32_ref"] == 7e-3 and s["a"]["errors"] == []
    assert s["b"]["tok_per_s"] == 5.0 and s["b"]["errors"] == ["exit 1: boom"] and s["b"]["rel_err_vs_fp32_ref"] is None
    out = ab._run_worker(str(tmp_path), "no-such-preset", "targeted", False, timeout_s=300)
    assert set(out) == {"error"} and out["error"].startswith("exit 1") and "no-such-preset" in out["error"]


def test_ab_trees_unpacks_a_git_archive_as_an_importable_tree(tmp_path):
    """--tree NAME=X.tar: the archive of core/ and the subpackages (git archive) is unpacked and linked so that
    `import kog.engine...` in the tree's processes resolves to the archive's copy; an archive without core/ or a
    missing one is one clear usage line, not a traceback; a directory is used as it is."""
    import os
    import subprocess
    import sys
    import tarfile
    ab = _load_bench_script("ab_trees")
    repo = Path(__file__).resolve().parents[1]
    tar = tmp_path / "main.tar"
    with tarfile.open(tar, "w") as tf:
        for d in ("core",) + ab.PACKAGES:
            tf.add(repo / d, arcname=d, filter=lambda ti: None if "__pycache__" in ti.name else ti)
    root = ab.tree_dir("main", str(tar), str(tmp_path / "work"))
    code = "import kog.engine.config as c, kog.fsutil as f; print(c.__file__); print(f.__file__)"
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": root}, capture_output=True,
                       text=True, check=True)
    files = p.stdout.split()
    assert len(files) == 2 and all(f.startswith(root) for f in files), files
    assert ab.tree_dir("same", str(tmp_path), str(tmp_path / "work")) == str(tmp_path)
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tf:
        tf.add(repo / "engine" / "config.py", arcname="engine/config.py")
    with pytest.raises(SystemExit, match="no core/ in the archive"):
        ab.tree_dir("bad", str(bad), str(tmp_path / "work"))
    with pytest.raises(SystemExit, match="not a readable tar archive"):
        ab.tree_dir("gone", str(tmp_path / "gone.tar"), str(tmp_path / "work"))


def test_ab_trees_overrides_name_a_tree_and_hold_a_json_object():
    """--override NAME=JSON: accepted for a named tree with a JSON object; an unknown tree, JSON that does not
    parse or is not an object is a usage error (exit 2), not a traceback mid-run."""
    import argparse
    ab = _load_bench_script("ab_trees")
    trees = {"main": "/a", "wide": "/a"}
    ap = argparse.ArgumentParser()
    assert ab._parse_overrides(['wide={"attn_block": 32}'], trees, ap) == {"wide": {"attn_block": 32}}
    for bad in ['other={"attn_block": 32}', "wide={attn_block: 32}", "wide=[32]", "wide"]:
        with pytest.raises(SystemExit) as e:
            ab._parse_overrides([bad], trees, ap)
        assert e.value.code == 2


def test_engine_check_reads_its_arguments_before_it_runs_anything():
    """bench/engine_check.py runs on the GPU at import; --help, an unknown option or preset and a --grid-json that
    is not a list of objects end in a usage line and a non-zero exit (0 for --help) before any GPU work starts."""
    import subprocess
    import sys
    script = Path(__file__).resolve().parents[1] / "bench" / "engine_check.py"

    def run(*args):
        return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=600)
    assert run("--help").returncode == 0 and "--grid-json" in run("--help").stdout
    for args, what in [(("--bogus",), "unrecognized"), (("--grid-json", "{"), "not JSON"),
                       (("--grid-json", "[1]"), "list of objects"), (("--model", "nope"), "unknown preset")]:
        p = run(*args)
        assert p.returncode != 0 and what in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
