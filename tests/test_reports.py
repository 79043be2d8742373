"""Reports rendered from synthetic runs: every section there, missing probes reported instead of failing,
user strings escaped, no network resource, size limit, the Chrome trace, comparisons and the CLIs."""
from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kog.errors import KogError, UsageError
from kog.reports import synthetic
from kog.reports.compare import change_class, render_compare
from kog.reports.engine_report import render_bench_report
from kog.runstore import RunStore
from kog.reports.topology import render_scan_report
from kog.reports.tuning import mask_url, render_study_report

EVIL = "<script>alert(1)</script>"
SCAN_SECTIONS = ("card", "inventory", "placement", "latency", "l2map", "signal", "sync", "bandwidth", "crosscheck",
                 "comparison")


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return RunStore(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def scan_run(store):
    return synthetic.write_scan(store)


@pytest.fixture(scope="module")
def scan_html(scan_run, tmp_path_factory):
    p = render_scan_report(scan_run, tmp_path_factory.mktemp("out") / "scan.html")
    return p, p.read_text()


@pytest.fixture(scope="module")
def small_scan(store):
    """A scan with two tables: quick to render, for the CLI tests."""
    return synthetic.write_scan(store, drop=set(synthetic.SCAN_TABLES) - {"latency", "bandwidth"})


@pytest.fixture(scope="module")
def bench_run(store):
    return synthetic.write_bench(store, model=EVIL)


@pytest.fixture(scope="module")
def bench_html(bench_run, tmp_path_factory):
    p = render_bench_report(bench_run, tmp_path_factory.mktemp("out") / "bench.html")
    return p, p.read_text()


@pytest.fixture(scope="module")
def study_run(store):
    return synthetic.write_study(store, n_trials=30, n_failed=4)


def resource_refs(html: str) -> list[str]:
    return re.findall(r"""(?:src|href)\s*=\s*["']?([^"'\s>]+)""", html)


def assert_offline(html: str) -> None:
    refs = resource_refs(html)
    assert refs, "no src/href at all: the check would be vacuous"
    remote = [r for r in refs if re.match(r"(?i)(https?:|//|ftp:|ws:)", r)]
    assert remote == []
    assert "<link" not in html and "<script" not in html.lower().replace("&lt;script", "")
    assert "@import" not in html and "url(" not in html
    for m in re.finditer(r"data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)", html):
        svg = base64.b64decode(m.group(1)).decode()
        assert not re.search(r"""(?:xlink:)?href=["'](?!#|data:)""", svg), "an SVG figure references a resource"


def sections(html: str) -> dict[str, str]:
    parts = re.split(r'<section id="', html)[1:]
    return {p.split('"', 1)[0]: p for p in parts}


# ---- topology ------------------------------------------------------------------------------------
def test_scan_report_has_every_section_and_figure(scan_html):
    path, html = scan_html
    secs = sections(html)
    assert tuple(secs) == SCAN_SECTIONS
    assert "Missing:" not in html
    for sid in ("placement", "latency", "l2map", "signal", "sync", "bandwidth"):
        assert "<img " in secs[sid], sid
    assert html.count("<img ") >= 7
    # every figure decodes to a real image of non-trivial size
    for m in re.finditer(r'src="data:image/(png|svg\+xml);base64,([^"]+)"', html):
        data = base64.b64decode(m.group(2))
        assert len(data) > 2000
        assert data[:8] == b"\x89PNG\r\n\x1a\n" if m.group(1) == "png" else b"<svg" in data[:400]
    assert "132" in secs["inventory"] and "sm_90" in secs["inventory"]
    assert "gap &gt; 30%" in secs["comparison"]


def test_scan_report_card_and_labelled_figures(scan_html):
    path, html = scan_html
    secs = sections(html)
    assert next(iter(secs)) == "card"                               # the card comes first
    card = secs["card"]
    tiles = dict(re.findall(r'<div class="tile-label">([^<]+)</div><div class="tile-value[^"]*">([^<]+)</div>', card))
    assert set(tiles) == {"L2 partitions x SMs", "far-L2 penalty", "SMs to saturate HBM", "grid barrier, all CTAs",
                          "flag one-way", "launch, GPU", "launch, host"}
    assert re.fullmatch(r"\d+ \+ \d+ \(2 x\)", tiles["L2 partitions x SMs"]) and tiles["SMs to saturate HBM"] == "64 of 132"
    assert "Triton launch from Python, host side" in card and "CUDA-event timed" in card
    assert "breadth-first (measured)" in secs["inventory"]          # one dispatch name
    assert "one access kind" in secs["inventory"] and "home-slice atomics" in secs["inventory"]
    assert "torch device-to-device copy" in secs["crosscheck"] and "ratio" in secs["crosscheck"]
    assert "read peak / torch copy" in secs["bandwidth"]


def test_scan_report_of_an_old_scan_says_what_it_lacks(store, tmp_path):
    run = synthetic.write_scan(store, summary_drop=("launch_gpu_us", "l2_far_penalty", "cross_checks",
                                                    "latency_method", "bandwidth"))
    html = render_scan_report(run, tmp_path / "old.html").read_text()
    secs = sections(html)
    card = secs["card"]
    assert card.count("not measured in this scan") == 2              # GPU launch, far-L2 penalty
    assert "Missing:" in secs["crosscheck"]


def test_scan_report_offline_and_small(scan_html):
    path, html = scan_html
    assert_offline(html)
    assert path.stat().st_size <= 5 * 1024 * 1024
    assert path.stat().st_size > 100_000


def test_scan_report_missing_probes_say_what_is_missing(store, tmp_path):
    run = synthetic.write_scan(store, drop=("signal", "l2map", "barrier", "flag", "placement"),
                               errors={"signal": "timeout after 30 s <b>hung</b>"}, summary_drop=("comparison",))
    html = render_scan_report(run, tmp_path / "r.html").read_text()
    secs = sections(html)
    assert tuple(secs) == SCAN_SECTIONS
    assert "Missing:" in secs["signal"] and "&#39;signal&#39;" in secs["signal"]
    assert "timeout after 30 s &lt;b&gt;hung&lt;/b&gt;" in secs["signal"]
    assert "<b>hung" not in html
    assert "Missing:" in secs["placement"] and "Missing:" in secs["comparison"]
    # the L2 section keeps the partition map (from l2_partition) though the heatmap is gone
    assert "Missing:" in secs["l2map"] and "<img " in secs["l2map"]
    # sync costs: atomics and launch still drawn, barrier and flag reported missing
    assert "<img " in secs["sync"] and "barrier" in secs["sync"] and "Missing:" in secs["sync"]
    assert "Missing:" not in secs["latency"] and "Missing:" not in secs["bandwidth"]


def test_scan_report_from_an_empty_run(store, tmp_path):
    run = synthetic.write_scan(store, drop=synthetic.SCAN_TABLES, summary_drop=("*",))
    html = render_scan_report(run, tmp_path / "r.html").read_text()
    assert html.count("Missing:") >= len(SCAN_SECTIONS)
    assert "<img " not in html


def test_scan_report_with_bad_table_reports_it(store, tmp_path):
    run = synthetic.write_scan(store, drop=set(synthetic.SCAN_TABLES) - {"bandwidth"})
    run.write_table("latency", pd.DataFrame({"size": [1, 2], "x": [3.0, 4.0]}))   # wrong columns
    html = render_scan_report(run, tmp_path / "r.html").read_text()
    assert "could not be drawn" in sections(html)["latency"]
    assert "<img " in sections(html)["bandwidth"]


def test_scan_report_escapes_device_name(store, tmp_path):
    run = synthetic.write_scan(store, device_name=EVIL, drop=set(synthetic.SCAN_TABLES) - {"latency"})
    html = render_scan_report(run, tmp_path / "r.html").read_text()
    assert EVIL not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_scan_report_accepts_the_probes_comparison_spelling(store, tmp_path):
    run = synthetic.write_scan(store, summary_drop=("comparison",), drop=synthetic.SCAN_TABLES)
    s = run.json("summary")
    s["comparison"] = [{"figure": "hbm_cycles", "ours": 900.0, "theirs": [480, 650], "source": "H100 papers",
                        "explanation": "TLB misses"},
                       {"figure": "flag_oneway_us", "ours": 0.7, "theirs": 0.71, "source": "anchor"}]
    run.write_json("summary", s)
    sec = sections(render_scan_report(run, tmp_path / "r.html").read_text())["comparison"]
    assert "480–650" in sec and "TLB misses" in sec and "+38%" in sec and "yes" in sec
    assert "1 figure(s) differ by more than 30%" in sec


def test_cluster_order_groups_similar_sms():
    from kog.reports.figures import cluster_order
    rng = np.random.default_rng(3)
    groups = rng.permutation(np.repeat(np.arange(4), 10))
    m = 500 + 80 * (groups[:, None] != groups[None, :]) + rng.normal(0, 5, (40, 40))
    order = cluster_order(m)
    runs = np.count_nonzero(np.diff(groups[order]))   # group changes along the order
    assert runs == 3, groups[order]


def test_reports_leave_no_pyplot_figures(small_scan, study_run, tmp_path):
    import matplotlib.pyplot as plt
    before = set(plt.get_fignums())
    render_scan_report(small_scan, tmp_path / "a.html")
    render_study_report(study_run, tmp_path / "b.html")      # optuna's plots draw through pyplot
    assert set(plt.get_fignums()) == before


# ---- engine --------------------------------------------------------------------------------------
def test_bench_report_sections_and_escaping(bench_html):
    path, html = bench_html
    secs = sections(html)
    assert tuple(secs) == ("overview", "throughput", "breakdown", "critical-path", "sync-share", "timeline")
    assert "Missing:" not in html
    assert EVIL not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    for name in ("kog-targeted", "kog-grid", "torch-compile", "cuda-graph", "hf-transformers"):
        assert name in secs["throughput"]
    assert "<th>config</th>" in secs["throughput"] and "<td>rule</td>" in secs["throughput"]
    assert "35%" in secs["sync-share"] and "30.0%" in secs["sync-share"]
    assert_offline(html)


def test_bench_report_writes_gzipped_chrome_traces_into_the_run(bench_run, bench_html):
    import gzip
    path, html = bench_html
    tl = bench_run.table("timeline")
    links = re.findall(r'href="([^"#]+\.trace[^"]*\.json\.gz)"', html)
    assert len(links) == tl["system"].nunique() == 2
    total = 0
    for href in links:
        trace = (path.parent / href).resolve()
        assert trace.parent == Path(bench_run.path).resolve()       # inside the run folder, not beside the HTML
        doc = json.loads(gzip.decompress(trace.read_bytes()))
        ev = [e for e in doc["traceEvents"] if e["ph"] == "X"]
        sysname = doc["otherData"]["system"]
        rows = tl[tl["system"] == sysname]
        assert len(ev) == len(rows)
        total += len(ev)
        # the earliest event is one of the earliest rows (several CTAs may share the first stamp: which of
        # them a sort puts first is up to pandas' sort, which changed in pandas 3)
        firsts = rows[rows["start_ns"] == rows["start_ns"].min()]
        e0 = min(ev, key=lambda e: e["ts"])
        assert e0["ts"] == 0 and (e0["pid"], e0["tid"]) in set(zip(firsts["sm"], firsts["cta"]))
        assert all(e["dur"] >= 0 for e in ev)
        assert {e["cat"] for e in ev} <= {"streaming", "waiting", "barrier", "other"}
    assert total == len(tl)
    assert not list(path.parent.glob("*.trace.json")) and not list(path.parent.glob("*.json.gz"))


def test_bench_report_missing_parts(store, tmp_path):
    run = synthetic.write_bench(store, drop=("breakdown", "timeline", "system-breakdowns", "hf-transformers"),
                                errors={"hf-transformers": "CUDA out of memory"})
    html = render_bench_report(run, tmp_path / "b.html").read_text()
    secs = sections(html)
    assert "Missing:" in secs["timeline"] and "timeline" in secs["timeline"]
    assert "Missing:" in secs["breakdown"] and "Missing:" in secs["sync-share"]
    assert "CUDA out of memory" in secs["overview"]
    assert "<img " in secs["throughput"]
    assert not list(tmp_path.glob("*.trace.json"))
    run2 = synthetic.write_bench(store, drop=("bench",))
    html2 = render_bench_report(run2, tmp_path / "b2.html").read_text()
    assert "bench.json" in sections(html2)["overview"]
    assert "<img " in sections(html2)["breakdown"]          # still drawn from the breakdown table


def test_bench_report_from_a_bench_json_file(tmp_path):
    doc = synthetic.bench_document()
    p = tmp_path / "llama-3.2-1b.json"
    p.write_text(json.dumps(doc))
    out = render_bench_report(p)
    assert out == tmp_path / "llama-3.2-1b.html"
    html = out.read_text()
    assert "Missing:" in sections(html)["timeline"] and "<img " in sections(html)["breakdown"]


# ---- tuning --------------------------------------------------------------------------------------
def test_study_report(study_run, tmp_path):
    html = render_study_report(study_run, tmp_path / "s.html").read_text()
    secs = sections(html)
    assert tuple(secs) == ("overview", "default", "history", "importance", "parallel", "top", "trials", "failed")
    assert "Missing:" not in html, re.findall(r"Missing:</strong>[^<]*", html)
    for sid in ("history", "importance", "parallel", "default"):
        assert "<img " in secs[sid]
    assert secs["parallel"].count("<img ") == 2                    # Optuna's parallel coordinates and slices
    assert "4 trial(s) failed" in secs["failed"]
    assert "compile error: out of shared memory" in secs["failed"]
    assert secs["top"].count("<tr>") >= 10
    assert "SIMULATED" not in html
    assert_offline(html)


def _table_rows(sec: str) -> list[list[str]]:
    return [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", r, re.S) for r in re.findall(r"<tr[^>]*>(.*?)</tr>", sec, re.S)]


def test_study_report_parameters_are_columns_and_every_trial_is_listed(study_run, tmp_path):
    html = render_study_report(study_run, tmp_path / "s.html").read_text()
    secs = sections(html)
    top = _table_rows(secs["top"])
    header = top[0]
    for p in ("rows_per_task", "k_chunk", "warps", "weight_ring", "mapping"):
        assert p in header                                           # one column per parameter
    assert "config" not in header and "breakdown" not in header     # dict attributes are no cells
    assert not any("{" in cell or "}" in cell for row in top for cell in row)
    every = _table_rows(secs["trials"])
    assert len(every) - 1 == 30 and "more rows not shown" not in secs["trials"]
    assert "all 30 trials" in secs["history"]


def test_study_report_separates_pruned_refused_and_failed(study_run, tmp_path):
    html = render_study_report(study_run, tmp_path / "s.html").read_text()
    secs = sections(html)
    assert "3 trial(s) pruned" in secs["failed"] and "3 trial(s) refused before launch" in secs["failed"]
    assert "4 trial(s) failed" in secs["failed"]
    kv = dict(re.findall(r"<tr><th>([^<]+)</th><td>([^<]*)</td></tr>", secs["overview"]))
    assert (kv["pruned trials"], kv["refused trials"], kv["failed trials"], kv["complete trials"]) == ("3", "3", "4", "20")


def test_study_report_best_against_the_default(study_run, tmp_path):
    html = render_study_report(study_run, tmp_path / "s.html").read_text()
    sec = sections(html)["default"]
    assert "speed-up over the default" in sec and re.search(r"\d\.\d{3}x", sec)
    assert "time per token by part" in sec and "streaming" in sec
    assert "engine default (trial)</th><td>0<" in sec


def test_simulated_study_report_has_the_banner_and_the_error(store, tmp_path):
    run = synthetic.write_study(store, n_trials=16, simulated=True, name="sim-study")
    html = render_study_report(run, tmp_path / "sim.html").read_text()
    assert '<div class="banner" role="alert">SIMULATED study' in html
    assert "median 5.9 %" in html and "max 58 %" in html
    assert "<title>kog tuning report: sim-study (SIMULATED)</title>" in html


def test_study_report_from_a_study_object_and_from_a_trials_table(store, tmp_path):
    study = synthetic.make_study(None, name=EVIL, n_trials=8, n_failed=1)
    html = render_study_report(study, tmp_path / "s.html").read_text()
    assert EVIL not in html and "&lt;script&gt;" in html
    with store.create("study", synthetic.h200_device(), argv=["x"]) as run:
        run.write_table("trials", study.trials_dataframe().assign(state=lambda d: d["state"].astype(str)))
    html = render_study_report(run, tmp_path / "t.html").read_text()
    secs = sections(html)
    assert "<img " in secs["history"] and "Missing:" in secs["importance"] and "1 trial(s) failed" in secs["failed"]
    assert "Missing:" not in secs["default"] and "speed-up" in secs["default"]


def test_mask_url_hides_passwords():
    assert mask_url("postgresql://kog:s3cret@db:5432/optuna") == "postgresql://kog:***@db:5432/optuna"
    assert mask_url("sqlite:///x.db") == "sqlite:///x.db"


# ---- compare -------------------------------------------------------------------------------------
def test_change_class_marks_changes_over_5_percent():
    assert change_class(100, 104, "higher") == ("+4.0%", "")
    assert change_class(100, 110, "higher") == ("+10.0%", "changed-up")
    assert change_class(100, 110, "lower") == ("+10.0%", "changed-down")
    assert change_class(100, 90, None) == ("-10.0%", "flag")
    assert change_class("sm_90", "gfx942", None) == ("differs", "flag")


def test_compare_scans_marks_differences(store, scan_run, tmp_path):
    slower = synthetic.write_scan(store, seed=1, scale=1.2, device_name="NVIDIA H100 80GB HBM3")
    html = render_compare(scan_run, slower, tmp_path / "c.html").read_text()
    head = sections(html)["headline"]
    row = re.search(r"<tr><td>latency hbm \(ns\)</td>.*?</tr>", head, re.S).group(0)
    assert 'class="changed-down"' in row and "+20." in row
    assert re.search(r"<tr><td>L2 partitions</td><td>2</td><td>2</td><td>\+0.0%</td></tr>", head)
    same = render_compare(scan_run, scan_run, tmp_path / "same.html").read_text()
    assert "changed-" not in same.split("<main>")[1]
    assert_offline(html)


def test_compare_benches_and_studies(store, bench_run, study_run, tmp_path):
    faster = synthetic.write_bench(store, speed=1.25, seed=5)
    html = render_compare(bench_run, faster, tmp_path / "b.html").read_text()
    assert html.count('class="changed-up"') >= 4 and EVIL not in html
    other = synthetic.write_study(store, n_trials=12, seed=4)
    html = render_compare(study_run, other, tmp_path / "s.html").read_text()
    assert "best value" in html and "<img " in html
    with pytest.raises(UsageError, match="cannot compare a bench run with a study run"):
        render_compare(bench_run, study_run, tmp_path / "x.html")


# ---- CLIs ----------------------------------------------------------------------------------------
def test_kogprobe_report_prints_the_path_last(small_scan, tmp_path, capsys):
    scan_run = small_scan
    from kog.probe.cli import main
    out = tmp_path / "r.html"
    assert main(["report", str(scan_run.path), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out)
    assert out.exists()
    assert main(["report", str(scan_run.path), "--compare", str(scan_run.path), "-o", str(tmp_path / "c.html")]) == 0
    assert "comparison" in (tmp_path / "c.html").read_text()


def test_kogprobe_report_without_bundled_scan_is_one_line(monkeypatch, tmp_path, capsys):
    import kog.probe.scan as scan
    from kog.probe.cli import main
    from kog.reports.cli import bundled_scan
    monkeypatch.setattr(scan, "bundled_scan_path", lambda: tmp_path / "nothing")
    with pytest.raises(KogError, match="no bundled scan yet"):
        bundled_scan()
    assert main(["report", "--bundled"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no bundled scan yet" in err[0]


def test_kogprobe_report_renders_the_bundled_scan(monkeypatch, small_scan, tmp_path, capsys):
    scan_run = small_scan
    import kog.probe.scan as scan
    from kog.probe.cli import main
    monkeypatch.setattr(scan, "bundled_scan_path", lambda: Path(scan_run.path))
    out = tmp_path / "b.html"
    assert main(["report", "--bundled", "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(out)
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--bundled"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(tmp_path / "h200-scan-report.html")
    assert not (Path(scan_run.path) / "report.html").exists()


def test_kogprobe_report_refuses_a_bench_run(bench_run, capsys):
    from kog.probe.cli import main
    assert main(["report", str(bench_run.path)]) == 2
    assert "kogtune report" in capsys.readouterr().err


def test_kogtune_report_dispatches_on_kind(store, study_run, tmp_path, capsys):
    from kog.tune.cli import main
    bench_run = synthetic.write_bench(store, drop=("timeline",))
    for run, marker in ((bench_run, "kog engine report"), (study_run, "kog tuning report")):
        out = tmp_path / f"{run.kind}.html"
        assert main(["report", str(run.path), "-o", str(out)]) == 0
        assert capsys.readouterr().out.strip().splitlines()[-1] == str(out)
        assert marker in out.read_text()
    url = f"sqlite:///{study_run.path / 'study.db'}"
    out = tmp_path / "by-name.html"
    assert main(["report", "--study", study_run.meta["study_name"], "--storage", url, "-o", str(out)]) == 0
    assert "kog tuning report" in out.read_text()
    assert main(["report", "--study", "no-such-study", "--storage", url]) == 2
    assert "no study named" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing-run")]) == 2


# ---- the shapes the other commands really write --------------------------------------------------
def test_bench_report_with_the_engines_table_shapes(store, tmp_path):
    """kogtune bench writes `breakdown` without a phase column and may record a failed system."""
    run = synthetic.write_bench(store, drop=("breakdown", "timeline"))
    doc = run.json("bench")
    doc["systems"]["cuda-graph"] = {"tok_per_s": None, "error": "RuntimeError: graph capture failed"}
    doc["systems"]["kog-grid"]["breakdown_error"] = "no instrumented run"
    run.write_json("bench", doc)
    bd = synthetic.breakdown_table(doc).groupby(["system", "category"], as_index=False)["seconds_per_token"].sum()
    run.write_table("breakdown", bd)
    secs = sections(render_bench_report(run, tmp_path / "b.html").read_text())
    assert "no per-phase split" in secs["breakdown"] and "<img " in secs["breakdown"]
    assert "graph capture failed" in secs["throughput"]
    assert "<img " in secs["sync-share"]


def test_study_report_for_search_callers(store, study_run, tmp_path):
    """kogtune search calls render_study_report(study, run_dir); a run whose storage cannot be opened
    (a redacted PostgreSQL URL) falls back to its trials table."""
    import optuna
    study = optuna.load_study(study_name=study_run.meta["study_name"],
                              storage=f"sqlite:///{study_run.path / 'study.db'}")
    d = tmp_path / "rundir"
    d.mkdir()
    assert render_study_report(study, d) == d / "report.html"
    with store.create("study", synthetic.h200_device(), argv=["x"],
                      extra={"study": "s", "storage": "postgresql://kog:***@127.0.0.1:9/optuna"}) as run:
        run.write_table("trials", study.trials_dataframe().assign(state=lambda f: f["state"].astype(str)))
    html = render_study_report(run, tmp_path / "t.html").read_text()
    assert "storage not opened" in html and "<img " in sections(html)["history"]


def test_bundled_scan_renders_when_present(tmp_path):
    from kog.probe.scan import bundled_scan_path
    from kog.runstore import open_run
    p = bundled_scan_path()
    if not (p / "meta.json").exists():
        pytest.skip("no bundled H200 scan in this checkout yet")
    out = render_scan_report(open_run(p), tmp_path / "h200.html")
    html = out.read_text()
    assert out.stat().st_size <= 5 * 1024 * 1024
    assert "could not be drawn" not in html, re.findall(r"Recorded error: <code>[^<]*", html)
    assert_offline(html)


def test_bench_report_accepts_the_engines_raw_trace_table(store, tmp_path):
    """The engine's trace table: one row per task with wait_ns, phase 'barrier' for grid barriers."""
    rng = np.random.default_rng(7)
    rows, t = [], 1_000_000
    for step in range(2):
        for task, phase in enumerate(["qkv", "attn", "barrier", "o", "gate_up", "down"]):
            for cta in range(6):
                d, w = int(rng.integers(500, 3000)), int(rng.integers(0, 400))
                rows.append((cta, 100 + cta, step, task, phase, 0, t, t + d, 0 if phase == "barrier" else w))
            t += 3500
    raw = pd.DataFrame(rows, columns=["cta", "sm", "step", "task", "phase", "layer", "start_ns", "end_ns", "wait_ns"])
    run = synthetic.write_bench(store, drop=("timeline",))
    run.write_table("timeline", raw)
    path = render_bench_report(run, tmp_path / "b.html")
    sec = sections(path.read_text())["timeline"]
    assert "Missing:" not in sec and "<img " in sec
    import gzip
    doc = json.loads(gzip.decompress((Path(run.path) / "timeline.trace.json.gz").read_bytes()))
    ev = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    waits = int((raw["wait_ns"] > 0).sum())
    assert len(ev) == len(raw) + waits
    assert sum(e["cat"] == "barrier" for e in ev) == int((raw["phase"] == "barrier").sum())
    assert {e["pid"] for e in ev} == set(range(100, 106))


def test_paths_in_reports_are_escaped(tmp_path):
    store = RunStore(tmp_path / "<b>runs</b>")
    a = synthetic.write_scan(store, drop=set(synthetic.SCAN_TABLES) - {"latency"})
    html = render_compare(a, a, tmp_path / "c.html").read_text()
    assert "<b>runs</b>" not in html and "&lt;b&gt;runs&lt;/b&gt;" in html


@pytest.mark.parametrize("conf, says", [
    ({"best_trial": 1, "default_trial": 0, "rounds": 3, "best_tok_per_s": [380.0, 381.0, 379.0],
      "default_tok_per_s": [400.0, 401.0, 399.0], "gain": -0.05, "errors": []},
     ["confirmed gain</th><td>-5.0%", "best tok/s (median)</th><td>380", "the search stored the engine default"]),
    (None, ["No same-run confirmation"]),
])
def test_study_report_shows_the_confirmation_of_the_best(tmp_path, conf, says):
    """The best against the default section carries the search's closing same-run measurements, and says
    when the best did not hold."""
    import optuna

    from kog.engine.engine_config import EngineConfig
    st = optuna.create_study(study_name="c", direction="maximize")
    dist = {"bn_qkv": optuna.distributions.CategoricalDistribution([2, 4, 8])}
    for bn, v, a in ((8, 400.0, {"baseline": "engine default"}), (4, 430.0, {})):
        st.add_trial(optuna.trial.create_trial(params={"bn_qkv": bn}, distributions=dist, value=v,
                                               user_attrs={"config": EngineConfig(bn_qkv=bn).to_dict(), **a}))
    st.set_user_attr("backend", "gpu")
    if conf is not None:
        st.set_user_attr("confirmation", conf)
    sec = sections(render_study_report(st, tmp_path / "c.html").read_text())["default"]
    assert all(s in sec for s in says), sec[-1500:]
