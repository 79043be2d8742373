"""The bundled H200 bench (`kogtune report --bundled`): a whole `kogtune bench` run directory of the
committed preset (its JSON, tables and the instrumented run's timeline), and its engine report shows every system against the bandwidth limit, the grid-sync vs targeted-wait
breakdown, the grid-sync share against the published 35%, and the per-phase table."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kog.reports.cli import BUNDLED_BENCH, BUNDLED_BENCH_RUN, bundled_bench

REPO = Path(__file__).resolve().parents[1]
COMMITTED = REPO / "bench" / "h200" / "llama-3.2-1b.json"


def sections(html: str) -> dict[str, str]:
    parts = re.split(r'<section id="', html)[1:]
    return {p.split('"', 1)[0]: p for p in parts}


def test_bundled_bench_is_a_whole_run_of_the_committed_preset():
    if not COMMITTED.exists():
        pytest.fail(f"{COMMITTED.relative_to(REPO)} is missing: the bundled bench is a run of its preset")
    committed = json.loads(COMMITTED.read_text())
    bundled = json.loads(BUNDLED_BENCH.read_text())
    # the JSON beside the run directory is that run's own bench.json: a report of either shows one run
    assert bundled == json.loads((BUNDLED_BENCH_RUN / "bench.json").read_text()), (
        f"cp reports/data/{BUNDLED_BENCH_RUN.name}/bench.json reports/data/{BUNDLED_BENCH.name}")
    # a run of the committed preset, on the same card, with every system the committed bench has; it
    # may trail the newest bench/h200 file when a bench did not bring its run directory back
    for key in ("model", "dtype", "prompt_tokens", "new_tokens", "weight_bytes_per_token", "model_shapes"):
        assert bundled[key] == committed[key], key
    assert bundled["device"]["name"] == committed["device"]["name"]
    assert set(bundled["systems"]) == set(committed["systems"])
    assert bundled_bench() == BUNDLED_BENCH_RUN
    from kog.runstore import open_run
    run = open_run(BUNDLED_BENCH_RUN)
    assert run.kind == "bench" and run.status == "complete" and run.has_table("timeline")


@pytest.fixture(scope="module")
def bundled_html(tmp_path_factory):
    import os

    from kog.tune.cli import main
    d = tmp_path_factory.mktemp("cwd")
    old = os.getcwd()
    os.chdir(d)
    try:
        import contextlib
        import io
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main(["report", "--bundled"]) == 0
    finally:
        os.chdir(old)
    out = d / "h200-bench-report.html"
    assert buf.getvalue().strip().splitlines()[-1] == str(out)     # the path, printed last
    # the traces (tens of MB of JSON) stay in the run folder, gzipped: only the report lands here
    assert sorted(p.name for p in d.iterdir()) == ["h200-bench-report.html"]
    return out, out.read_text()


def test_bundled_bench_report_shows_the_h200_numbers(bundled_html):
    path, html = bundled_html
    doc = json.loads(BUNDLED_BENCH.read_text())
    secs = sections(html)
    assert tuple(secs) == ("overview", "throughput", "breakdown", "critical-path", "sync-share", "timeline")
    assert "NVIDIA H200" in html and "llama-3.2-1b" in html
    # every system's tok/s and % of the limit (the table prints 4 significant figures)
    for name, s in doc["systems"].items():
        assert name in secs["throughput"]
        assert f"{s['tok_per_s']:,.4g}" in secs["throughput"], name
        assert f"{100 * s['tok_per_s'] / doc['limit_tok_per_s']:,.4g}" in secs["throughput"], name
        runs = s.get("runs_tok_per_s") or []
        if runs:        # the spread of its timed runs
            assert f"{min(runs):,.4g}" in secs["throughput"] and f"{max(runs):,.4g}" in secs["throughput"], name
    # ratios against the fastest baseline of the run, named
    base = max((k for k in doc["systems"] if not k.startswith("kog-") and doc["systems"][k].get("tok_per_s")),
               key=lambda k: doc["systems"][k]["tok_per_s"])
    assert f"x {base}" in secs["throughput"] and f"fastest baseline of this run, {base}" in secs["throughput"]
    assert f"{doc['limit_tok_per_s']:,.0f}" in secs["overview"]
    # grid-sync share: kog-grid's barrier seconds per token / its timed seconds per token, against 35%
    g = doc["systems"]["kog-grid"]
    share = g["breakdown"]["barrier"] * g["tok_per_s"]
    assert 0.05 < share < 0.6
    assert f"{share:.1%}" in secs["sync-share"] and "35%" in secs["sync-share"]
    # the per-layer critical path of both kog systems, from the bundled run's timeline
    cp = secs["critical-path"]
    assert "kog-targeted" in cp and "kog-grid" in cp and "o -&gt; gate_up" in cp and "layer (sum)" in cp
    # and why each phase's last CTA is last, per kog system (one traced token: no next-token column)
    assert "kog-targeted: the last CTA of each phase" in cp
    assert "began later (us)" in cp and "streamed longer (us)" in cp
    assert "kog-targeted: CTAs streaming, by phase" in cp and "at most 1/8 of the CTAs streaming (us)" in cp
    # per-phase table from breakdown_extra.phases: every phase, both kog systems, waiting split out
    bd = secs["breakdown"]
    for ph in g["breakdown_extra"]["phases"]:
        assert f"<td>{ph}</td>" in bd, ph
    assert "waiting (us)" in bd and "barrier (us)" in bd and "share of token" in bd
    o_wait = doc["systems"]["kog-targeted"]["breakdown_extra"]["phases"]["o"]["waiting"] * 1e6
    assert f"{o_wait:,.4g}" in bd
    assert bd.count("<img ") >= 2                    # per-phase bars and per-system bars
    # the bundled run carries the instrumented run: the per-SM timeline is drawn, nothing is missing
    assert "Missing:" not in html
    assert "<img" in secs["timeline"]
    assert path.stat().st_size < 5 * 1024 * 1024
    assert not list(BUNDLED_BENCH.parent.glob("*.html"))      # nothing written into package data


def test_bundled_bench_with_a_run_is_a_usage_error(tmp_path, capsys):
    from kog.tune.cli import main
    assert main(["report", "--bundled", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--bundled" in err[0]
