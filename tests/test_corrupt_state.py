"""Stored state that cannot be parsed: kept aside and named (tuned.json), reported as corrupt (run folders),
never overwritten, never stopping the listing of the rest."""
from __future__ import annotations

import json
import os

import pandas as pd
import pytest

from kog.engine.config import preset
from kog.engine.engine_config import EngineConfig
from kog.reports import synthetic
from kog.runstore import RunError, RunStore, open_run


@pytest.fixture
def tuned(tmp_path, monkeypatch):
    monkeypatch.setenv("KOG_TUNED_DIR", str(tmp_path / "tuned"))
    return tmp_path / "tuned" / "tuned.json"


def test_a_truncated_tuned_json_is_kept_aside_not_overwritten(tuned, capsys):
    from kog.tune import store
    m1, m2 = preset("llama-3.2-1b"), preset("qwen3-1.7b")
    assert store.save_best("gpu-a", m1, EngineConfig(), 100.0, {"backend": "gpu"})
    assert store.save_best("gpu-a", m2, EngineConfig(), 90.0, {"backend": "gpu"})
    whole = tuned.read_text()
    tuned.write_text(whole[: len(whole) // 2])           # a disk that filled up, an editor that crashed
    truncated = tuned.read_text()
    assert store.save_best("gpu-b", m1, EngineConfig(), 80.0, {"backend": "gpu"})
    err = capsys.readouterr().err.strip().splitlines()
    aside = tuned.with_name("tuned.json.corrupt-1")
    assert len(err) == 1 and str(tuned) in err[0] and str(aside) in err[0]
    assert aside.read_text() == truncated                  # what was there is kept, byte for byte
    assert [e["device"] for e in store.entries()] == ["gpu-b"]


def test_a_corrupt_store_reads_as_empty_once_and_says_so(tuned, capsys):
    from kog.tune import store
    tuned.parent.mkdir(parents=True)
    tuned.write_text('{"format": "kog-tuned", "entries": [')
    assert store.best_config("gpu-a", preset("llama-3.2-1b")) is None
    assert "kept aside" in capsys.readouterr().err
    assert store.best_config("gpu-a", preset("llama-3.2-1b")) is None
    assert capsys.readouterr().err == ""                   # set aside once, not on every read
    assert tuned.with_name("tuned.json.corrupt-1").exists()


def test_two_saves_in_a_row_keep_both_entries(tuned):
    from kog.tune import store
    assert store.save_best("gpu-a", preset("llama-3.2-1b"), EngineConfig(), 1.0, {"backend": "gpu"})
    assert store.save_best("gpu-a", preset("qwen3-1.7b"), EngineConfig(), 1.0, {"backend": "gpu"})
    assert len(store.entries()) == 2


# ---- run folders -----------------------------------------------------------------------------------
def _bad_meta(store: RunStore, name: str, text: str):
    d = store.root / name
    d.mkdir(parents=True)
    (d / "meta.json").write_text(text)
    return d


@pytest.mark.parametrize("text", [
    '{"format": "kog-run", "format_version": "1", "kind": "scan"}',       # a string version
    '{"format": "kog-run", "format_version": 1, "kind": ["scan"]}',      # an unhashable kind
    '[1, 2]',
    '\xff\xfe not utf-8',
])
def test_one_corrupt_run_does_not_stop_the_listing(tmp_path, capsys, text):
    store = RunStore(tmp_path / "runs")
    with store.create("scan", None):
        pass
    bad = _bad_meta(store, "20990101T000000Z-x-scan", text)
    problems: list = []
    assert len(store.list(problems=problems)) == 1
    assert [p for p, _ in problems] == [bad]
    with pytest.raises(RunError):
        open_run(bad)
    from kog.probe.cli import main
    assert main(["runs", "--runs-dir", str(store.root), "--json"]) == 0
    out, err = capsys.readouterr()
    assert len(json.loads(out)) == 1 and str(bad) in err and len(err.strip().splitlines()) == 1


def test_a_fifo_meta_json_is_refused_not_read(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    os.mkfifo(d / "meta.json")                  # reading it would block forever
    with pytest.raises(RunError, match="not a regular file"):
        open_run(d)


def test_an_unreadable_run_folder_does_not_stop_the_listing(tmp_path, capsys):
    store = RunStore(tmp_path / "runs")
    with store.create("scan", None):
        pass
    bad = store.root / "20990101T000000Z-x-scan"
    bad.mkdir()
    (bad / "meta.json").mkdir()                  # unreadable as a file, whoever runs the test
    problems: list = []
    assert len(store.list(problems=problems)) == 1 and problems[0][0] == bad


def test_a_corrupt_table_or_document_is_named_as_corrupt(tmp_path):
    store = RunStore(tmp_path / "runs")
    run = synthetic.write_bench(store)
    assert run.corrupt_files() == {}
    (run.path / "bench.json").write_text('{"systems": {')
    p = run.path / "timeline.parquet"
    p.write_bytes(p.read_bytes()[:100])
    bad = open_run(run.path).corrupt_files()
    assert set(bad) == {"bench.json", "timeline.parquet"}


def test_a_bench_report_of_a_corrupt_run_says_corrupt_and_exits_2(tmp_path, capsys):
    from kog.reports.engine_report import render_bench_report
    from kog.tune.cli import main
    store = RunStore(tmp_path / "runs")
    run = synthetic.write_bench(store)
    (run.path / "bench.json").write_text('{"systems": {')
    html = render_bench_report(open_run(run.path), tmp_path / "b.html").read_text()
    assert "corrupt" in html and "did not finish" not in html
    assert main(["report", str(run.path), "-o", str(tmp_path / "c.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bench.json" in err[0] and "corrupt" in err[0]
    assert (tmp_path / "c.html").exists()           # the rest of the run is still shown


def test_a_scan_report_names_a_corrupt_table(tmp_path):
    from kog.reports.topology import render_scan_report
    store = RunStore(tmp_path / "runs")
    run = synthetic.write_scan(store)
    (run.path / "latency.parquet").write_bytes(b"PAR1 truncated")
    html = render_scan_report(open_run(run.path), tmp_path / "s.html").read_text()
    assert "latency.parquet is corrupt" in html


def test_table_reading_keeps_working_for_good_tables(tmp_path):
    store = RunStore(tmp_path / "runs")
    with store.create("scan", None) as run:
        run.write_table("t", pd.DataFrame({"a": [1]}))
    assert open_run(run.path).table("t")["a"].tolist() == [1]
