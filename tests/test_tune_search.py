"""kogtune search (simulator backend): resume, kill -9, failing trials, bad input; replay of a sweep."""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from kog.tune.cli import main

SWEEP = Path(__file__).resolve().parents[1] / "tune" / "data" / "sim-nvidia-h200-llama-3.2-1b-sweep.parquet"


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("KOG_TUNED_DIR", str(tmp_path / "tuned"))
    monkeypatch.setenv("KOG_RUNS_DIR", str(tmp_path / "runs"))
    return tmp_path


def _study(tmp, name="kog-nvidia-h200-llama-3.2-1b-sim"):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp / 'runs' / 'kog-studies.db'}")


def test_search_stores_best_and_resumes(env, capsys):
    assert main(["search", "--backend", "sim", "--trials", "4", "--json", "--runs-dir", str(env / "runs")]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["trials"] == 4 and out["best"]["tok_per_s"] > 500 and out["stored"]
    first = {t.number: t.params for t in _study(env).trials}
    assert main(["search", "--backend", "sim", "--trials", "6", "--runs-dir", str(env / "runs")]) == 0
    st = _study(env)
    from kog.tune.search import finished_count, is_refused
    # refused configs (no launch) do not count toward --trials
    assert finished_count(st, 6) == 6 and len(st.trials) == 6 + min(sum(is_refused(t) for t in st.trials), 12)
    assert all(st.trials[n].params == p for n, p in first.items())      # nothing lost
    assert json.loads((env / "tuned" / "tuned.json").read_text())["entries"]


def test_crashing_configs_fail_and_the_study_goes_on(env):
    from kog.tune.search import cli_search
    a = argparse.Namespace(model="llama-3.2-1b", trials=30, study="crashy", storage=None, sampler="random",
                           backend="sim", workers=1, timeout=30.0, runs_dir=str(env / "runs"), json=True,
                           seed=3, target="kog.tune._fakes:crash_if_bigwarps")
    assert cli_search(a) == 0
    ts = _study(env, "crashy").trials
    failed = [t for t in ts if t.state == optuna.trial.TrialState.FAIL]
    assert failed and all("SIGSEGV" in t.user_attrs["fail_reason"] or "same config failed" in
                          t.user_attrs["fail_reason"] for t in failed)
    assert all(t.params["mapping"] == "contiguous" for t in failed)
    assert any(t.state == optuna.trial.TrialState.COMPLETE for t in ts)


def test_kill_9_then_resume(env, monkeypatch):
    runs = env / "runs"
    cmd = [sys.executable, "-m", "kog.tune.cli", "search", "--backend", "sim", "--trials", "400",
           "--runs-dir", str(runs), "--study", "k9", "--sampler", "random"]
    db = runs / "kog-studies.db"
    # kill -9 until one kill lands while a trial is RUNNING (a simulated trial takes milliseconds, so the
    # one seen running may finish between the look and the kill: that attempt then proves nothing)
    for _attempt in range(5):
        p = subprocess.Popen(cmd, env={**os.environ}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
        deadline = time.time() + 60
        try:      # trials finished by earlier attempts (none, or no study yet, on the first)
            start = sum(t.state.is_finished() for t in _study(env, "k9").trials)
        except Exception:
            start = 0
        while time.time() < deadline:
            time.sleep(0.2)
            if db.exists():
                try:
                    st = _study(env, "k9")
                    n_done = sum(t.state.is_finished() for t in st.trials)
                    running = [t for t in st.trials if t.state == optuna.trial.TrialState.RUNNING]
                except Exception:
                    continue
                if n_done >= start + 2 and running:
                    break
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        try:
            if [t for t in _study(env, "k9").trials if t.state == optuna.trial.TrialState.RUNNING]:
                break
        except Exception:       # killed before it created the study: try again
            continue
    before = {t.number: (t.state, t.value) for t in _study(env, "k9").trials if t.state.is_finished()}
    assert len(before) >= 2
    # the kill may land between a trial's creation and its claim by the worker: resume right away reaps it
    monkeypatch.setenv("KOG_UNCLAIMED_GRACE_S", "0")
    a = ["search", "--backend", "sim", "--trials", str(len(before) + 2), "--runs-dir", str(runs),
         "--study", "k9", "--sampler", "random"]
    assert main(a) == 0
    st = _study(env, "k9")
    assert not [t for t in st.trials if t.state == optuna.trial.TrialState.RUNNING]
    for n, (s, v) in before.items():
        assert (st.trials[n].state, st.trials[n].value) == (s, v)
    zombies = [t for t in st.trials if "died" in t.user_attrs.get("fail_reason", "")]
    assert zombies, "the RUNNING trial of the killed process must be marked FAILED with a reason"


def test_bad_inputs_one_line_exit_2(env, capsys):
    r = str(env / "runs")
    assert main(["search", "--backend", "sim", "--model", "nope-7b", "--runs-dir", r]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown model" in err[0]
    for url in ("notaurl", "mongodb://x/y", "sqlite:////nonexistent/dir/x.db",
                "postgresql://u:secret@127.0.0.1:1/db"):
        assert main(["search", "--backend", "sim", "--storage", url, "--runs-dir", r]) == 2, url
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "storage" in err[0] and "secret" not in err[0], err
    assert main(["search", "--backend", "sim", "--trials", "2", "--study", "shared", "--runs-dir", r]) == 0
    capsys.readouterr()
    assert main(["search", "--backend", "sim", "--trials", "2", "--study", "shared", "--model", "qwen3-1.7b",
                 "--runs-dir", r]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "llama-3.2-1b" in err[0] and "qwen3-1.7b" in err[0]
    try:
        import cmaes  # noqa: F401
    except ImportError:
        assert main(["search", "--backend", "sim", "--sampler", "cmaes", "--runs-dir", r]) == 2
        assert "cmaes" in capsys.readouterr().err


def test_replay_simulated_sweep(capsys):
    assert SWEEP.exists()
    assert main(["replay", str(SWEEP), "--seeds", "10", "--compare", "random"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert "SIMULATED" in lines[0]
    last = lines[-1]
    assert last.startswith("median evaluations to within 2% of best: ")
    k, n = last.rsplit(" ", 1)[1].split("/")
    assert int(n) >= 200 and float(k) / int(n) <= 0.15


def test_replay_bad_input(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "missing.parquet")]) == 2
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    assert main(["replay", str(bad)]) == 2


def test_search_compiles_ahead_in_warm_workers(env):
    """The gpu path of `kogtune search` (ask a few, compile their kernels in a pool, measure in one warm
    worker) with the simulator: a trial whose kernel was not compiled before it is measured fails."""
    from kog.tune.search import cli_search
    log = env / "compiled.jsonl"
    log.write_text("")
    a = argparse.Namespace(model="llama-3.2-1b", trials=10, study="ahead", storage=None, sampler="tpe",
                           backend="sim", workers=1, timeout=30.0, runs_dir=str(env / "runs"), json=True, seed=1,
                           target="kog.tune._fakes:sim_if_compiled", payload_extra={"log": str(log)},
                           ahead=3, compile_processes=2, compile_target="kog.tune._fakes:record_compile")
    assert cli_search(a) == 0
    from kog.tune.search import finished_count, is_refused
    ts = _study(env, "ahead").trials
    assert finished_count(_study(env, "ahead"), 10) == 10 and len(ts) == 10 + min(sum(is_refused(t) for t in ts), 20)
    assert not [t for t in ts if t.state == optuna.trial.TrialState.RUNNING]
    assert not [t for t in ts if t.state == optuna.trial.TrialState.FAIL], [t.user_attrs for t in ts]
    measured = [t for t in ts if "wall_s" in t.user_attrs]
    assert len(measured) >= 5
    assert sum(t.user_attrs["fresh_worker"] for t in measured) == 1     # one warm worker served them all
    jobs = log.read_text().splitlines()
    assert 0 < len(jobs) <= len(measured)          # one job per new kernel of a batch, never per trial twice


def test_sweep_warm_overlapped_with_compile_and_checkpointed(tmp_path):
    """record_sweep's gpu path with the simulator: every config measured after its kernel compiled, the
    table checkpointed as it goes, and a wall budget that stops it cleanly with 'skipped' rows."""
    import pandas as pd
    from kog.tune.sweep import record_sweep
    log = tmp_path / "compiled.jsonl"
    log.write_text("")
    sub = {"mode": ["targeted", "grid"], "ctas_per_sm": [2, 3], "block_k": [1024, 2048], "mapping":
           ["round-robin", "contiguous"]}
    stats: dict = {}
    path, df = record_sweep("llama-3.2-1b", "sim", tmp_path / "s.parquet", 30, isolate=True, sub=sub,
                            payload_extra={"log": str(log), "compile_s": 0.2}, progress=False,
                            checkpoint_every=4, compile_processes=2, target="kog.tune._fakes:sim_if_compiled",
                            compile_target="kog.tune._fakes:record_compile", stats=stats)
    assert len(df) == 16 and (df["status"] == "ok").all(), df[["status", "fail_reason"]]
    assert stats["kernels"] == 8 and stats["worker_starts"] == 1 and len(stats["trial_wall_s"]) == 16
    assert pd.read_parquet(path)["tok_per_s"].notna().sum() == 16
    # a simulated clock: 0.4 s per measured config, so the 3 s budget ends after the same work on any machine
    from kog.tune.deadline import Deadline
    st2: dict = {}
    path, df = record_sweep("llama-3.2-1b", "sim", tmp_path / "b.parquet", 30, isolate=True, sub=sub,
                            payload_extra={"log": str(log)}, progress=False, stats=st2,
                            compile_processes=2, target="kog.tune._fakes:sim_if_compiled",
                            compile_target="kog.tune._fakes:record_compile",
                            deadline=Deadline(3.0, lambda: 0.4 * len(st2.get("trial_wall_s", []))))
    assert len(df) == 16 and 0 < (df["status"] == "skipped").sum() < 16
    assert (df.loc[df["status"] != "skipped", "status"] == "ok").all()


def test_precompile_compiles_each_kernel_once_in_parallel(tmp_path):
    from kog.engine.engine_config import EngineConfig
    from kog.tune.search import kernel_key, precompile
    base = EngineConfig()
    # mapping / sync_rows / ctas 1-vs-2 (same register cap at 4 warps) share the default's kernel;
    # ctas 4 (a lower register cap) and block_k 1024 (a constexpr) are kernels of their own
    cfgs = [base, base.replace(mapping="contiguous"), base.replace(sync_rows=64), base.replace(ctas_per_sm=1),
            base.replace(ctas_per_sm=4), base.replace(block_k=1024)]
    assert len({kernel_key(c) for c in cfgs}) == 3
    log = tmp_path / "c.jsonl"
    log.write_text("")
    # the three kernels compile at once: each job waits at a barrier for the other two (one after another,
    # the first would wait out the bound and fail)
    res = precompile("llama-3.2-1b", cfgs, processes=3, payload_extra={"log": str(log), "barrier": str(
                     tmp_path / "barrier"), "parties": 3}, target="kog.tune._fakes:record_compile")
    assert sorted(res) == sorted({kernel_key(c) for c in cfgs}) and set(res.values()) == {"ok"}
    assert len(log.read_text().splitlines()) == 3


def test_search_deadline_stops_cleanly(env):
    """A 3 s budget of simulated 0.3 s trials: the clock is the count of finished trials x 0.3 s, so the search
    stops after the same work however loaded the machine is (a wall-clock budget let no trial finish)."""
    from kog.tune.deadline import Deadline
    from kog.tune.search import cli_search
    log = env / "compiled.jsonl"
    log.write_text("")

    def clock() -> float:
        try:
            return 0.3 * sum(x.state.is_finished() for x in _study(env, "late").get_trials(deepcopy=False))
        except KeyError:              # no study yet
            return 0.0

    a = argparse.Namespace(model="llama-3.2-1b", trials=200, study="late", storage=None, sampler="random",
                           backend="sim", workers=1, timeout=30.0, runs_dir=str(env / "runs"), json=True, seed=2,
                           target="kog.tune._fakes:sim_if_compiled", payload_extra={"log": str(log)},
                           ahead=4, compile_processes=2, compile_target="kog.tune._fakes:record_compile",
                           deadline=Deadline(3.0, clock))
    assert cli_search(a) == 0
    ts = _study(env, "late").trials
    assert not [x for x in ts if x.state == optuna.trial.TrialState.RUNNING]
    done = [x for x in ts if x.state == optuna.trial.TrialState.COMPLETE]
    assert 1 <= len(done) < 40
    for x in ts:
        if x.state == optuna.trial.TrialState.FAIL:
            assert "out of time" in x.user_attrs["fail_reason"], x.user_attrs


def test_topology_partition_from_the_bundled_scan():
    from kog.probe.scan import bundled_scan_path
    from kog.tune.objective import sm_partition
    part = sm_partition({"scan": str(bundled_scan_path())})
    assert len(part) == 132 and sorted(set(part.values())) == [0, 1]


def test_unclaimed_running_trial_is_reaped_after_the_grace(monkeypatch):
    """study.ask() makes a trial RUNNING before the worker claims it; a process killed in between leaves a
    trial with no owner: kept while younger than KOG_UNCLAIMED_GRACE_S, failed with a reason after."""
    from kog.tune.search import fail_dead_local_trials, register_searcher
    st = optuna.create_study()
    register_searcher(st)          # a search of the study that may be alive: its young trial is kept
    t = st.ask()
    monkeypatch.setenv("KOG_UNCLAIMED_GRACE_S", "3600")
    assert fail_dead_local_trials(st) == 0
    assert st.trials[t.number].state == optuna.trial.TrialState.RUNNING
    monkeypatch.setenv("KOG_UNCLAIMED_GRACE_S", "0")
    assert fail_dead_local_trials(st) == 1
    assert st.trials[t.number].state == optuna.trial.TrialState.FAIL
    assert "unclaimed" in st.trials[t.number].user_attrs["fail_reason"]


def test_compile_processes_bounded_by_gpu_memory(monkeypatch):
    """Each compile process holds a CUDA context and an engine's small buffers (~1 GiB, no weights): the pool
    is no larger than the free memory holds after the measuring worker's ~4x the weights (an H200 search
    with 14 processes beside the ring engine's packing ran out of memory); without NVML the CPU count
    alone decides."""
    from kog.engine.config import preset
    from kog.tune import search
    monkeypatch.setattr(search.os, "cpu_count", lambda: 16)
    m = preset("llama-3.2-1b")
    measuring, gib = 4 * m.num_params() * 2, 1 << 30
    monkeypatch.setattr(search, "gpu_free_bytes", lambda index=0: None)
    assert search.default_compile_processes(m) == 14
    monkeypatch.setattr(search, "gpu_free_bytes", lambda index=0: 140 * 10**9)
    assert search.default_compile_processes(m) == 14
    monkeypatch.setattr(search, "gpu_free_bytes", lambda index=0: measuring + 4 * gib + gib // 2)
    assert search.default_compile_processes(m) == 4
    monkeypatch.setattr(search, "gpu_free_bytes", lambda index=0: measuring)
    assert search.default_compile_processes(m) == 1
    assert search.default_compile_processes() == 14      # no model: cores only


def test_refused_configs_do_not_count_but_a_search_of_refusals_ends(env):
    """A config the constraints refuse costs no launch: it does not count toward --trials, up to REFUSED_FREE
    per trial asked for; past that they count, so a search whose space is all refusals still ends."""
    import optuna
    from kog.tune.search import REFUSED_FREE, finished_count, is_refused
    st = optuna.create_study(direction="maximize")
    dist = optuna.distributions.FloatDistribution(0, 1)
    def add(state, reason=None, value=None):
        st.add_trial(optuna.trial.create_trial(state=state, value=value, params={"x": 0.5}, distributions={"x": dist},
                                               user_attrs={"fail_reason": reason} if reason else {}))
    add(optuna.trial.TrialState.COMPLETE, value=1.0)
    add(optuna.trial.TrialState.PRUNED, "slowest quarter after the short run")
    for _ in range(3):
        add(optuna.trial.TrialState.PRUNED, "invalid: engine config: weight_ring 4 does not fit")
    assert sum(is_refused(t) for t in st.trials) == 3
    assert finished_count(st) == 5                      # without a total: every finished trial
    assert finished_count(st, 10) == 2                  # the 3 refusals are free
    assert finished_count(st, 1) == 5 - REFUSED_FREE    # only REFUSED_FREE x 1 of them are
    a = argparse.Namespace(model="llama-3.2-1b", trials=5, study="refusals", storage=None, sampler="random",
                           backend="sim", workers=1, timeout=30.0, runs_dir=str(env / "runs"), json=True, seed=5,
                           target=None)
    from kog.tune.search import cli_search
    assert cli_search(a) == 0
    ts = _study(env, "refusals").trials
    assert finished_count(_study(env, "refusals"), 5) == 5
    assert len(ts) == 5 + min(sum(is_refused(t) for t in ts), REFUSED_FREE * 5)


def test_search_climbs_one_knob_at_a_time_from_the_default(env):
    """After the default and its neighbors, the search queues the neighbors of each new best (search.climb)
    until none improves: on a landscape two steps of two knobs from the default it reaches the top, queues
    nothing tried before, and stays within --trials."""
    from kog.tune.search import cli_search
    a = argparse.Namespace(model="llama-3.2-1b", trials=40, study="hill", storage=None, sampler="random",
                           backend="sim", workers=1, timeout=30.0, runs_dir=str(env / "runs"), json=True,
                           seed=0, target="kog.tune._fakes:two_knob_hill")
    assert cli_search(a) == 0
    st = _study(env, "hill")
    from kog.tune.search import finished_count
    assert finished_count(st, 40) == 40
    assert st.best_value == 1000.0 and st.best_params["block_k"] == 512 and st.best_params["bn_qkv"] == 32
    climbed = [t for t in st.trials if "climb_from" in t.user_attrs]
    assert climbed and all(st.trials[t.user_attrs["climb_from"]].value is not None for t in climbed)
    keys = [json.dumps(t.params, sort_keys=True) for t in st.trials if t.state.is_finished()]
    assert len(keys) == len(set(keys))       # no config measured twice


def test_pruner_cuts_only_configs_clearly_behind_the_best():
    """A short measurement within PRUNE_MARGIN of the best completed trial's gets its full measurement, however
    many completed trials sit between them (a percentile bar over the completed trials, the survivors, rose
    until the best's one-knob neighbors were cut on noise); one further behind is pruned; none before the
    startup trials."""
    import optuna
    from kog.tune.search import PRUNE_MARGIN, make_pruner
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", pruner=make_pruner())

    def objective(t):
        v = t.suggest_float("v", 0.0, 200.0)
        t.report(v, 0)
        if t.should_prune():
            raise optuna.TrialPruned()
        return v

    first = [50.0, 100.0] + [99.0 - i for i in range(10)]      # the startup trials complete, slow ones too
    close, behind = 100.0 * (1 - PRUNE_MARGIN / 2), 100.0 * (1 - 2 * PRUNE_MARGIN)
    for v in first + [close, behind]:
        study.enqueue_trial({"v": v})
    study.optimize(objective, n_trials=len(first) + 2)
    state = {t.params["v"]: t.state.name for t in study.trials}
    assert state[50.0] == "COMPLETE" and state[close] == "COMPLETE" and state[behind] == "PRUNED"


def test_search_takes_a_cached_hub_id_as_the_engine_does(env, tmp_path, monkeypatch, capsys):
    """`kogtune search --model org/name` resolves a Hub id from the local Hugging Face cache, offline, as
    Engine.from_pretrained and `kogtune bench` do (it refused every Hub id as an unknown preset), with the
    config the engine loads; one that is not cached is one line and exit 2."""
    import shutil
    from huggingface_hub import constants
    from kog.engine.config import preset
    from kog.engine.weights import random_weights, save_checkpoint
    from kog.tune.space import resolve_model_config
    cfg = preset("tiny").replace(dtype="float32")
    ckpt = save_checkpoint(cfg, random_weights(cfg, "cpu", 0), tmp_path / "ckpt")
    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))          # the trial processes read the cache from the env
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--acme--tiny-llama"
    shutil.copytree(ckpt, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    got = resolve_model_config("acme/tiny-llama")
    assert (got.hidden_size, got.num_layers, got.vocab_size) == (cfg.hidden_size, cfg.num_layers, cfg.vocab_size)
    # named by the Hub id; a float32 checkpoint is searched in the bfloat16 the engine loads it in (the search
    # space and its constraints followed the file's float32, where the weight ring is refused)
    assert got.name == "acme/tiny-llama" and got.dtype == "bfloat16"
    assert resolve_model_config(str(ckpt)).dtype == "bfloat16"
    assert main(["search", "--backend", "sim", "--model", "acme/tiny-llama", "--trials", "2", "--json",
                 "--runs-dir", str(env / "runs")]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["trials"] == 2
    assert main(["search", "--backend", "sim", "--model", "acme/not-cached", "--trials", "2",
                 "--runs-dir", str(env / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert "acme/not-cached" in err and "\n" not in err


def test_the_confirmation_remeasures_best_and_default_and_a_lucky_best_is_not_stored(tmp_path):
    """confirm_best runs the best single-GPU trial's config and the engine default's alternately in one warm
    worker; a best that won by its noise (430 once, 380 when measured again against 400) gets a negative
    gain, and the search then stores the engine default's config, not the lucky one."""
    import types

    from kog.engine.engine_config import EngineConfig
    from kog.tune.search import CONFIRMATION, _confirmed_best, confirm_best
    st = optuna.create_study(study_name="lucky", storage=f"sqlite:///{tmp_path / 's.db'}", direction="maximize")
    dist = {"bn_qkv": optuna.distributions.CategoricalDistribution([2, 4, 8])}
    for bn, v, attrs in ((8, 400.0, {"baseline": "engine default"}), (4, 430.0, {}), (2, 390.0, {})):
        st.add_trial(optuna.trial.create_trial(params={"bn_qkv": bn}, distributions=dist, value=v,
                                               user_attrs={"config": EngineConfig(bn_qkv=bn).to_dict(), **attrs}))
    s = types.SimpleNamespace(model_spec="llama-3.2-1b", scan_path=None, backend="gpu")
    conf = confirm_best(s, st, 2, 60.0, target="kog.tune._fakes:value_by_bn_qkv",
                        payload_extra={"values": {"8": 400.0, "4": 380.0}})
    assert conf == st.user_attrs[CONFIRMATION]
    assert (conf["best_trial"], conf["default_trial"], conf["rounds"]) == (1, 0, 2)
    assert conf["best_tok_per_s"] == [380.0, 380.0] and conf["default_tok_per_s"] == [400.0, 400.0]
    assert conf["gain"] == pytest.approx(-0.05) and not conf["errors"]
    # kogtune bench's, not the trials': its prompt, its run and the KV cache it builds for them
    assert conf["protocol"] == {"prompt_tokens": 64, "tokens": 256, "max_seq": 321}
    stored = _confirmed_best(st, {"number": 1, "tok_per_s": 430.0, "config": EngineConfig(bn_qkv=4).to_dict()})
    assert stored["number"] == 0 and stored["config"] == EngineConfig(bn_qkv=8).to_dict()
    # a best that holds is stored as it is
    conf = confirm_best(s, st, 1, 60.0, target="kog.tune._fakes:value_by_bn_qkv",
                        payload_extra={"values": {"8": 400.0, "4": 424.0}})
    assert conf["gain"] == pytest.approx(0.06)
    assert _confirmed_best(st, {"number": 1, "config": {}})["number"] == 1
    # a search's own protocol fields (payload_extra) are the confirmation's too
    assert confirm_best(s, st, 1, 60.0, target="kog.tune._fakes:value_by_bn_qkv",
                        payload_extra={"values": {"8": 1, "4": 2}, "tokens": 32})["protocol"] == {
        "prompt_tokens": 64, "tokens": 32, "max_seq": 97}


def test_trials_run_the_kv_cache_kogtune_bench_builds():
    """The cache's capacity is a compile-time constant of the kernel, so a trial builds the engine with the cache
    of `kogtune bench`'s default run (its prompt + new tokens + 1, as KogSystem sizes it), and more only where the
    trial's own runs need it."""
    import inspect

    from kog.tune import objective as ob
    from kog.tune.bench import run_bench
    sig = inspect.signature(run_bench).parameters
    assert {k: sig[k].default for k in ob.BENCH_PROTOCOL} == ob.BENCH_PROTOCOL
    assert ob._max_seq({}) == ob.bench_max_seq(64, 256) == 321
    assert ob._max_seq({"tokens": 512}) == 16 + 512 + 1          # a longer trial run gets its positions
    assert ob._max_seq({"max_seq": 32, "prompt_tokens": 1, "gate_tokens": 1, "warmup_tokens": 1,
                        "short_tokens": 1, "tokens": 1}) == 32


def test_a_search_ends_with_its_confirmation(env):
    """--confirm-rounds N: the search's closing measurements are in the study and its JSON summary."""
    from kog.tune.search import cli_search
    a = argparse.Namespace(model="llama-3.2-1b", trials=4, study="confirmed", storage=None, sampler="random",
                           backend="sim", workers=1, timeout=30.0, runs_dir=str(env / "runs"), json=True,
                           seed=0, confirm_rounds=2)
    assert cli_search(a) == 0
    conf = _study(env, "confirmed").user_attrs["confirmation"]
    assert conf["rounds"] in (0, 2) and conf["gain"] is not None and not conf["errors"]
    if conf["rounds"]:     # the simulator is deterministic: the confirmation measures what the search did
        assert len(conf["best_tok_per_s"]) == 2 and conf["gain"] >= 0
