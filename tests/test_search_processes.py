"""A search's processes: its workers die with it (kill -9), SIGTERM fails the running trial with a reason and
writes the run folder marked incomplete, a trial created but never claimed by a dead search is failed on the
next start, and two searches sharing one study (one killed mid-trial) lose and duplicate nothing.

Every wait here polls a state (process table, study) with a generous bound; none races a sleep."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import optuna
import pytest

from kog.tune.search import open_storage

RUNNING, WAITING = optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING
BOUND_S = 600          # a generous bound for a loaded 2-core machine: polls end as soon as the state is reached
POLL_S = 0.25          # between polls: the searches under test need the (maybe two) cores more than the test

DRIVER = textwrap.dedent("""
    import argparse, json, sys
    from kog.errors import cli_entry
    from kog.tune.search import cli_search
    a = argparse.Namespace(**json.loads(sys.argv[1]))
    sys.exit(cli_entry("kogtune")(lambda argv: cli_search(a))(None))
""")


def _args(tmp: Path, study: str, storage: str | None = None, **kw) -> dict:
    d = dict(model="llama-3.2-1b", trials=400, study=study, storage=storage, sampler="random", backend="sim",
             workers=1, timeout=600.0, runs_dir=str(tmp / "runs"), json=True, seed=None)
    d.update(kw)
    return d


def _start(tmp: Path, args: dict) -> subprocess.Popen:
    env = {**os.environ, "KOG_TUNED_DIR": str(tmp / "tuned"), "KOG_RUNS_DIR": str(tmp / "runs")}
    return subprocess.Popen([sys.executable, "-c", DRIVER, json.dumps(args)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _ppids() -> dict[int, int]:
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    return out


def _descendants(pid: int) -> set[int]:
    kids, found, todo = _ppids(), set(), [pid]
    while todo:
        p = todo.pop()
        for c, pp in kids.items():
            if pp == p and c not in found:
                found.add(c)
                todo.append(c)
    return found


def _trial_workers(pids: set[int]) -> set[int]:
    """The `python -m kog.tune.worker` processes among `pids`."""
    out = set()
    for q in pids:
        try:
            if b"kog.tune.worker" in Path(f"/proc/{q}/cmdline").read_bytes():
                out.add(q)
        except OSError:
            pass
    return out


def _alive(pid: int) -> bool:
    """Alive and not a zombie (a container's PID 1 may never reap an orphan)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _poll(cond, what: str, bound: float = BOUND_S, proc: subprocess.Popen | None = None):
    end = time.monotonic() + bound
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the search ended (rc {proc.returncode}) before {what}: {err[-2000:]}")
        time.sleep(POLL_S)
    pytest.fail(f"not reached within {bound} s: {what}")


_STORAGES: dict[str, object] = {}


def _trials(storage: str, study: str):
    # one storage per URL: opening one per poll (engine, schema check) took a loaded machine's CPU from the
    # searches being watched
    try:
        if storage not in _STORAGES:
            _STORAGES[storage] = open_storage(storage)
        return optuna.load_study(study_name=study, storage=_STORAGES[storage]).get_trials(deepcopy=False)
    except Exception:        # not created yet, or the database is busy: poll again
        return []


def _claimed_running(storage: str, study: str, pid: int | None = None):
    return [t for t in _trials(storage, study) if t.state == RUNNING and t.user_attrs.get("worker") and (
        pid is None or t.user_attrs["worker"].endswith(f":{pid}"))]


def _sqlite(tmp: Path) -> str:
    (tmp / "runs").mkdir(exist_ok=True)
    return f"sqlite:///{tmp / 'runs' / 'kog-studies.db'}"


def test_workers_die_with_a_killed_search(tmp_path):
    """kill -9 of `kogtune search --workers 2`: its worker processes (and theirs) go too, none finishes the
    study alone."""
    storage = _sqlite(tmp_path)
    p = _start(tmp_path, _args(tmp_path, "orphans", storage, workers=2, target="kog.tune._fakes:hang"))
    tree: set[int] = set()
    try:
        _poll(lambda: len(_claimed_running(storage, "orphans")) >= 2, "both workers run a trial", proc=p)
        # a trial is claimed a moment before its worker process starts: wait for both trial workers
        _poll(lambda: len(_trial_workers(_descendants(p.pid))) >= 2, "both trial worker processes", proc=p)
        tree = _descendants(p.pid)
        assert len(tree) >= 4, tree                 # 2 search workers + their trial workers
        os.kill(p.pid, signal.SIGKILL)              # the search alone, not its group
        p.wait()
        _poll(lambda: not [c for c in tree if _alive(c)], "every worker of the killed search is gone", 60)
    finally:
        _kill_tree(p, tree)


def _kill_tree(p: subprocess.Popen, known: set[int] = frozenset()) -> None:
    """Test cleanup: SIGKILL the search and every process it started (`known`: seen before it died)."""
    for c in _descendants(p.pid) | set(known) | {p.pid}:
        try:
            os.kill(c, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        p.communicate(timeout=30)
    except Exception:
        pass


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_fails_the_running_trial_and_writes_an_incomplete_run(tmp_path, workers):
    storage = _sqlite(tmp_path)
    p = _start(tmp_path, _args(tmp_path, "term", storage, workers=workers, target="kog.tune._fakes:hang"))
    try:
        running = _poll(lambda: len(_claimed_running(storage, "term")) >= workers and
                        _claimed_running(storage, "term"), "a trial is running", proc=p)
        _poll(lambda: len(_trial_workers(_descendants(p.pid))) >= workers, "the trial worker processes", proc=p)
        tree = _descendants(p.pid)
        os.kill(p.pid, signal.SIGTERM)
        out, err = p.communicate(timeout=BOUND_S)
    finally:
        _kill_tree(p, locals().get("tree", set()))
    assert p.returncode == 143, err
    assert "Traceback" not in err and "marked incomplete" in err
    ts = _trials(storage, "term")
    assert not [t for t in ts if t.state == RUNNING]
    for r in running:
        t = ts[r.number]
        assert t.state == optuna.trial.TrialState.FAIL and "interrupted (SIGTERM)" in t.user_attrs["fail_reason"]
    from kog.runstore import RunStore
    runs = RunStore(tmp_path / "runs").list("study")
    assert len(runs) == 1 and runs[0].status == "incomplete"
    assert "SIGTERM" in runs[0].meta["interrupted_message"] and runs[0].json("summary")["trials"] == len(ts)
    _poll(lambda: not [c for c in tree if _alive(c)], "the search's workers are gone", 60)


def test_an_unclaimed_trial_of_a_dead_search_is_failed_on_the_next_start(monkeypatch):
    """study.ask() makes a trial RUNNING before the worker claims it: killed in between, it belongs to no
    one. When every registered searcher of the study is dead it is failed at once, whatever its age."""
    from kog.tune.search import SEARCHER_ATTR, fail_dead_local_trials, register_searcher, worker_tag
    monkeypatch.setenv("KOG_UNCLAIMED_GRACE_S", "3600")
    st = optuna.create_study()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = worker_tag().rpartition(":")[0]
    st._storage.set_study_system_attr(st._study_id, f"{SEARCHER_ATTR}{host}:{dead.pid}", {"start": None})
    t = st.ask()
    assert fail_dead_local_trials(st) == 1
    assert st.trials[t.number].state == optuna.trial.TrialState.FAIL
    assert "unclaimed" in st.trials[t.number].user_attrs["fail_reason"]
    # a searcher that may still be alive (this process) keeps its young unclaimed trial
    register_searcher(st)
    t2 = st.ask()
    assert fail_dead_local_trials(st) == 0 and st.trials[t2.number].state == RUNNING


STORAGES = ["sqlite"] + (["postgresql"] if os.environ.get("KOG_TEST_POSTGRES_URL") else [])


@pytest.mark.parametrize("backend", STORAGES)
def test_two_searches_on_one_study_one_killed_mid_trial(tmp_path, monkeypatch, backend):
    """Two searches share a study; one is killed -9 while it runs a trial. The other fails that trial (its
    process is gone) and runs its config again; after the next start nothing is RUNNING or WAITING, trial
    numbers are unique and contiguous, and every trial finished before the kill is unchanged."""
    storage = _sqlite(tmp_path) if backend == "sqlite" else os.environ["KOG_TEST_POSTGRES_URL"]
    study = f"pair-{uuid.uuid4().hex[:8]}"
    n = 16
    # every trial holds while the file exists: B's trial is still running when B is killed, however slow
    # the machine; deleting the file lets A finish the study
    hold = tmp_path / "hold"
    hold.write_text("")
    extra = {"payload_extra": {"sleep": 0.05, "value": 1.0, "hold_while": str(hold)},
             "target": "kog.tune._fakes:slow_then_value"}
    a = _start(tmp_path, _args(tmp_path, study, storage, trials=n, **extra))
    b, b_tree = None, set()
    try:
        _poll(lambda: _claimed_running(storage, study, a.pid), "search A runs a trial", proc=a)
        b = _start(tmp_path, _args(tmp_path, study, storage, trials=n, **extra))
        _poll(lambda: _claimed_running(storage, study, b.pid), "search B runs a trial", proc=b)
        b_tree = _descendants(b.pid)
        os.kill(b.pid, signal.SIGKILL)
        b.wait()
        hold.unlink()
        before = {t.number: (t.state, t.value) for t in _trials(storage, study) if t.state.is_finished()}
        out, err = a.communicate(timeout=BOUND_S)
        assert a.returncode == 0, err
    finally:
        _kill_tree(a)
        if b is not None:
            _kill_tree(b, b_tree)
    _poll(lambda: not [c for c in b_tree if _alive(c)], "the killed search's worker is gone", 60)
    monkeypatch.setenv("KOG_TUNED_DIR", str(tmp_path / "tuned"))
    from kog.tune.cli import main
    assert main(["search", "--backend", "sim", "--trials", str(n), "--study", study, "--storage", storage,
                 "--sampler", "random", "--runs-dir", str(tmp_path / "runs")]) in (0, 1)
    ts = _trials(storage, study)
    assert not [t for t in ts if t.state in (RUNNING, WAITING)], [(t.number, t.state) for t in ts]
    assert sorted(t.number for t in ts) == list(range(len(ts)))
    assert len({t._trial_id for t in ts}) == len(ts)
    for num, (state, value) in before.items():
        assert (ts[num].state, ts[num].value) == (state, value)
    killed = [t for t in ts if f":{b.pid}" in t.user_attrs.get("worker", "") and t.state.name == "FAIL"]
    assert killed and all("died" in t.user_attrs["fail_reason"] for t in killed)
    retried = {t.user_attrs.get("retry_of") for t in ts}
    assert all(t.number in retried for t in killed)              # its config ran again
