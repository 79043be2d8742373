"""Each trial runs in its own process: crashes, hangs, OOM, compile errors, wrong results become reasons."""
import os
import time

import pytest

from kog.tune.isolation import run_isolated

F = "kog.tune._fakes:"


def test_ok_with_intermediate_and_data():
    o = run_isolated(F + "ok", {"value": 7.5}, 30)
    assert o.status == "ok" and o.value == 7.5 and o.data["note"] == "fine"
    assert o.intermediates == [(0, 10.0)]


@pytest.mark.parametrize("fn,status,needle", [
    ("segfault", "crash", "SIGSEGV"),
    ("abort", "crash", "SIGABRT"),
    ("raise_error", "error", "bad thing"),
    ("oom", "oom", "out of memory"),
    ("compile_error", "compile", "unsupported layout"),
    ("wrong", "wrong", "max_rel_err"),
    ("exit3", "crash", "exit code 3"),
])
def test_failures_become_reasons(fn, status, needle):
    o = run_isolated(F + fn, {}, 30)
    assert o.status == status, o
    assert needle in o.reason


def test_hang_is_killed_with_its_group():
    t = time.monotonic()
    o = run_isolated(F + "hang_child", {}, 2.0)
    assert o.status == "hang" and "2 s" in o.reason
    assert time.monotonic() - t < 600          # a safety bound far below the 3600 s hang, not a speed test


def test_prune_kills_the_child():
    o = run_isolated(F + "slow_then_value", {"short": 3.0, "sleep": 60}, 30, on_intermediate=lambda s, v: v < 5)
    assert o.status == "pruned" and o.wall_s < 20


def test_unknown_target_is_an_error():
    o = run_isolated("kog.tune._fakes:nope", {}, 30)
    assert o.status == "error" and "nope" in o.reason


# ---- warm workers: one process serves trial after trial; anything that may have poisoned it replaces it --
from kog.tune.isolation import WarmWorker, WorkerPool  # noqa: E402


def _pid(w):
    o = w.run(F + "pid", {}, 30)
    assert o.ok, o
    return o.data["pid"], o.data["jobs"]


def test_warm_worker_keeps_its_process_through_clean_errors():
    with WarmWorker() as w:
        p0, j0 = _pid(w)
        assert j0 == 1
        for fn, status in (("config_error", "invalid"), ("wrong", "wrong"), ("monokernel_timeout", "error"),
                           ("compile_error", "compile")):
            o = w.run(F + fn, {}, 30)
            assert o.status == status and not o.fresh_worker, o
            assert _pid(w)[0] == p0, f"{fn} must keep the worker"
        p, jobs = _pid(w)
        assert p == p0 and jobs == 6 and w.starts == 1        # CACHE persisted across the jobs


@pytest.mark.parametrize("fn,status,needle", [
    ("segfault", "crash", "SIGSEGV"),
    ("exit3", "crash", "exit code 3"),
    ("oom", "oom", "out of memory"),
    ("cuda_error", "error", "illegal memory access"),
    ("raise_error", "error", "bad thing"),
])
def test_warm_worker_is_replaced_after_a_poisoning_failure(fn, status, needle):
    with WarmWorker() as w:
        p0, _ = _pid(w)
        o = w.run(F + fn, {}, 30)
        assert o.status == status and needle in o.reason, o
        p1, jobs = _pid(w)
        assert p1 != p0 and jobs == 1 and w.starts == 2


def test_warm_hang_kills_the_group_and_the_next_trial_gets_a_fresh_worker():
    with WarmWorker() as w:
        p0, _ = _pid(w)
        t = time.monotonic()
        o = w.run(F + "hang_child", {}, 2.0)
        assert o.status == "hang" and "2 s" in o.reason and time.monotonic() - t < 600   # not the 3600 s sleep
        assert _pid(w)[0] != p0


def test_warm_prune_is_cooperative_and_keeps_the_worker():
    with WarmWorker() as w:
        p0, _ = _pid(w)
        t = time.monotonic()
        o = w.run(F + "slow_then_value", {"short": 3.0, "sleep": 3600}, 1200, on_intermediate=lambda s, v: v < 5)
        assert o.status == "pruned" and time.monotonic() - t < 600 and o.intermediates == [(0, 3.0)]
        assert _pid(w)[0] == p0
        o = w.run(F + "slow_then_value", {"short": 9.0, "value": 5.0}, 30, on_intermediate=lambda s, v: v < 5)
        assert o.status == "ok" and o.value == 5.0


def test_warm_worker_exits_when_its_parent_is_killed(tmp_path):
    import signal
    import subprocess
    import sys
    code = ("import sys, time; from kog.tune.isolation import WarmWorker; w = WarmWorker(); "
            "o = w.run('kog.tune._fakes:pid', {}, 30); print(o.data['pid'], flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(p.stdout.readline())
    p.send_signal(signal.SIGKILL)
    p.wait()
    end = time.monotonic() + 120             # polls the process state; a bound, not a race
    while time.monotonic() < end:
        try:
            if open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0] == "Z":
                break                        # dead, waiting for a reaper
        except OSError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("an orphaned warm worker kept running")


def test_pool_runs_jobs_in_parallel_and_reports_each(tmp_path):
    seen = []
    with WorkerPool(2) as pool:
        # each job waits at a barrier for a second one: run one after another, the first would fail
        futs = pool.submit_all([(i, F + "together", {"barrier": str(tmp_path / "b"), "parties": 2,
                                                     "value": float(i)}) for i in range(4)],
                               600, on_done=lambda k, o: seen.append((k, o.value)))
        res = dict(f.result() for f in futs)
    assert sorted(seen) == [(i, float(i)) for i in range(4)] and all(o.ok for o in res.values())


def test_gpu_trial_code_path_in_a_warm_worker_interpreted():
    """The real gpu_trial (monokernel + reference gate + timed runs) on the tiny preset, through the Triton
    interpreter on the CPU: the second trial reuses the worker's weights and reference logits."""
    from kog.engine.engine_config import EngineConfig
    cfg = EngineConfig(block_k=64, bn_qkv=16, bn_o=16, bn_gate_up=16, bn_down=16, bn_lm=64, attn_block=16,
                       sync_rows=32)
    payload = {"model": "tiny", "device": "cpu", "dtype": "float16", "prompt_tokens": 3, "gate_tokens": 1,
               "warmup_tokens": 1, "short_tokens": 1, "tokens": 1, "repeats": 1, "max_seq": 32}
    with WarmWorker({"TRITON_INTERPRET": "1"}) as w:
        a = w.run("kog.tune.objective:gpu_trial", {**payload, "config": cfg.to_dict()}, 120)
        assert a.ok, a
        assert a.data["max_rel_err"] < 1e-2 and not a.data["warm"] and len(a.intermediates) == 1
        b = w.run("kog.tune.objective:gpu_trial", {**payload, "config": cfg.replace(mapping="contiguous",
                                                                                     sync_rows=16).to_dict()}, 120)
        assert b.ok and b.data["warm"] and b.data["setup_s"] < 0.05 and w.starts == 1, b
        c = w.run("kog.tune.objective:precompile_one", {**payload, "config": cfg.to_dict()}, 120)
        assert c.ok and c.data["compiled"] == 0 and w.starts == 1, c     # the interpreter compiles nothing


def test_a_trial_hands_the_earlier_trials_memory_back_before_its_engine(monkeypatch):
    """gpu_trial releases the allocator's cached blocks (kog.engine.monokernel.release_gpu_memory) before it
    builds its engine: a warm worker's earlier trials left their packed weights cached at other sizes."""
    import kog.engine.monokernel as mk_mod
    from kog.tune import objective
    calls = []

    def build(payload, st, compile_only=False):
        calls.append("build")
        raise RuntimeError("stop here")

    monkeypatch.setattr(mk_mod, "release_gpu_memory", lambda: calls.append("release"))
    monkeypatch.setattr(objective, "_build", build)
    payload = {"model": "tiny", "device": "cpu", "dtype": "float16", "prompt_tokens": 3, "gate_tokens": 1,
               "max_seq": 32, "config": {}}
    with pytest.raises(RuntimeError, match="stop here"):
        objective.gpu_trial(payload, lambda step, value: None)
    assert calls == ["release", "build"]


def test_closing_a_pool_while_its_trial_runs_ends_the_trial_and_starts_nothing(tmp_path):
    """A search's deadline closes its compile pool while a pool thread still runs a trial: the trial ends as
    a crash (no exception in either thread), and the closed worker starts no process for a later job."""
    pool = WorkerPool(1)
    bar = tmp_path / "b"
    futs = pool.submit_all([(0, F + "together", {"barrier": str(bar), "parties": 2, "bound_s": 3600})], 3600)
    t0 = time.monotonic()
    while not (bar.exists() and any(bar.iterdir())):        # the trial is running (its child reached the barrier)
        assert time.monotonic() - t0 < 600, "the trial never started"
        time.sleep(0.05)
    pool.close()
    key, o = futs[0].result(timeout=600)
    assert key == 0 and o.status in ("crash", "hang") and not o.ok, o
    w = pool.workers[0]
    assert w.closed and w.proc is None and w.starts == 1
    later = w.run(F + "ok", {}, 30)
    assert later.status == "error" and "closed" in later.reason and w.starts == 1
