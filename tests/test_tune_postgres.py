"""Several workers share one study through a real PostgreSQL server: no trial lost or duplicated.

Needs KOG_TEST_POSTGRES_URL (the CI script .ci/run starts a server on loopback and exports it)."""
import os
import uuid

import optuna
import pytest

URL = os.environ.get("KOG_TEST_POSTGRES_URL")
pytestmark = pytest.mark.skipif(not URL, reason="KOG_TEST_POSTGRES_URL is not set (no PostgreSQL server; "
                                                "the CI script .ci/run starts one)")


def test_two_workers_share_one_study(tmp_path, monkeypatch, capsys):
    pytest.importorskip("psycopg2", reason="psycopg2-binary (test extra) is not installed")
    monkeypatch.setenv("KOG_TUNED_DIR", str(tmp_path / "tuned"))
    from kog.tune.cli import main
    name = f"kog-ci-{uuid.uuid4().hex[:8]}"
    n = 10
    rc = main(["search", "--backend", "sim", "--trials", str(n), "--workers", "2", "--storage", URL,
               "--study", name, "--sampler", "random", "--runs-dir", str(tmp_path / "runs")])
    assert rc == 0
    from kog.tune.search import open_storage
    storage = open_storage(URL)
    st = optuna.load_study(study_name=name, storage=storage)
    ts = st.trials
    nums = sorted(t.number for t in ts)
    assert nums == list(range(len(ts)))                                 # contiguous: nothing lost
    assert len({t._trial_id for t in ts}) == len(ts)                   # no duplicate rows
    from kog.tune.search import REFUSED_FREE, finished_count, is_refused
    counted = finished_count(st, n)                                     # refused configs do not count
    assert n <= counted <= n + 1                                        # at most one overshoot per extra worker
    assert len(ts) == counted + min(sum(is_refused(t) for t in ts), REFUSED_FREE * n)
    assert not [t for t in ts if t.state == optuna.trial.TrialState.RUNNING]
    workers = {t.user_attrs.get("worker") for t in ts if "worker" in t.user_attrs}
    assert len(workers) == 2, workers                                   # both processes ran trials
    # every queued initial-design config ran exactly once
    queued = [t for t in ts if t.system_attrs.get("fixed_params")]
    keys = [tuple(sorted(t.params.items())) for t in queued]
    assert len(keys) == len(set(keys))
    optuna.delete_study(study_name=name, storage=storage)
