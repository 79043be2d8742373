"""The critical path per layer (kog.reports.bench_tables.layer_segments / critical_path_table and the
kog.reports.layer_anatomy CLI) on the bundled H200 bench run (reports/data/h200_bench_run)."""
import json
from pathlib import Path

import pandas as pd
import pytest

from kog.reports import layer_anatomy as la
from kog.reports.bench_tables import (GAP_COLUMNS, attn_split_timing, critical_path_table, gap_table, hop_table, layer_segments,
                                      phase_weight_bytes, streaming_table, tail_table)

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "reports" / "data" / "h200_bench_run"


def test_segments_of_the_bundled_run(tmp_path, capsys):
    out = tmp_path / "a.json"
    assert la.main(["--json", str(out)]) == 0            # RUN_DIR defaults to the bundled run
    segs = {r["segment"]: r for r in json.loads(out.read_text())["median_us"]}
    assert list(segs) == ["down -> qkv", "qkv -> attn", "attn -> o", "o -> gate_up", "gate_up -> down",
                          "layer (sum)"]
    # the biggest phase streams the most bytes; no segment is faster than its bytes allow at the copy rate
    assert max(list(segs)[:5], key=lambda k: segs[k]["stream_us"]) == "o -> gate_up"
    assert all(r["us"] > 0.9 * r["stream_us"] for r in segs.values())
    # a llama-3.2-1b layer's weights take ~29 us at ~4.2 TB/s; the measured layer is longer
    assert 28 < segs["layer (sum)"]["stream_us"] < 31 < segs["layer (sum)"]["us"] < 200
    assert "layer (sum)" in capsys.readouterr().out


def test_a_synthetic_trace_gives_the_segments_it_was_built_with():
    # one layer, phases ending 1 us apart after the previous layer's down; 1 MB per phase at 1,000 GB/s = 1 us
    rows = [dict(system="s", step=s, layer=0, phase=p, end_ns=1000 * (i + 1)) for s in (0, 1)
            for i, p in enumerate(("qkv", "attn", "o", "gate_up", "down"))]
    rows += [dict(system="s", step=s, layer=-1, phase="down", end_ns=0) for s in (0, 1)]
    mb = {"hidden_size": 500, "intermediate_size": 250, "qkv_size": 1000, "q_size": 1000, "bytes_per_weight": 2}
    seg = layer_segments(pd.DataFrame(rows), "s", 1000.0, phase_weight_bytes(mb))
    assert list(seg["segment"])[:1] == ["down -> qkv"] and (seg["us"] == 1.0).all()
    assert seg.set_index("segment").loc["qkv -> attn", "stream_us"] == 0.0
    tab = critical_path_table(seg[seg["layer"] == 0]).set_index("segment")
    assert tab.loc["layer (sum)", "us"] == pytest.approx(5.0)
    assert layer_segments(pd.DataFrame(rows), "other", 1000.0, None).empty


def test_not_a_run_directory_is_one_line(tmp_path, capsys):
    assert la.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert la.main([str(RUN), "--system", "no-such"]) == 2


def test_hop_table_of_a_synthetic_trace():
    # qkv: CTA 0 runs two tasks (ends 1 and 2 us), CTAs 1 and 2 one each (end 1 us): the last ends 1 us after
    # the median CTA. attention: each CTA's one task is 0.5 us busy after its input is ready at 2.5, 2.6,
    # 2.4 us: ready 0.5 us after qkv's last end (median), the phase's last end 1.1 us after it
    def task(cta, phase, start, end, wait=0):
        return dict(system="s", step=1, layer=0, phase=phase, cta=cta, start_ns=start, end_ns=end, wait_ns=wait)
    rows = [task(0, "qkv", 0, 1000), task(0, "qkv", 1000, 2000), task(1, "qkv", 0, 1000), task(2, "qkv", 0, 1000),
            task(0, "attn", 2000, 3000, 500), task(1, "attn", 1000, 3100, 1600), task(2, "attn", 1000, 2900, 1400)]
    tab = hop_table(pd.DataFrame(rows), "s").set_index("segment")
    assert list(tab.index) == ["qkv -> attn"]       # the other segments have no tasks on one side
    r = tab.loc["qkv -> attn"]
    assert (r.tail_us, r.ready_us, r.first_task_us, r.tasks_max, r.span_us) == pytest.approx((1.0, 0.5, 0.5, 1, 1.1))
    assert pd.isna(r.task_us)                        # no CTA ran a second attention task
    assert hop_table(pd.DataFrame(rows).drop(columns="wait_ns"), "s").empty


def test_tail_table_tells_a_slow_cta_from_a_late_one():
    # 4 CTAs, 3 tokens, 2 layers, two tasks of 1 us each. o: CTA 3's take 1.2 us, 0.4 us more in all, every
    # token (the same CTA last every time, a persistent rate). down: the last is CTA (token + layer) % 4, which began
    # the phase 0.8 us late and waited 0.1 us more (transient: never the same CTA the next token).
    rows = []
    for step in range(3):
        for layer in range(2):
            for cta in range(4):
                late = 800 if cta == (step + layer) % 4 else 0
                for k in range(2):
                    t0 = 1000 * k + late
                    d = 1200 if cta == 3 else 1000
                    rows.append(dict(system="s", step=step, layer=layer, phase="o", cta=cta, start_ns=d * k,
                                     end_ns=d * (k + 1), wait_ns=0))
                    rows.append(dict(system="s", step=step, layer=layer, phase="down", cta=cta, start_ns=t0,
                                     end_ns=t0 + 1000 + (50 if late else 0), wait_ns=50 if late else 0))
    tab = tail_table(pd.DataFrame(rows), "s").set_index("phase")
    assert list(tab.index) == ["o", "down"]
    o, down = tab.loc["o"], tab.loc["down"]
    assert (o.tail_us, o.late_start_us, o.more_busy_us, o.more_tasks) == pytest.approx((0.4, 0.0, 0.4, 0.0))
    assert (o.same_last_next, o.distinct_last, o.groups) == (1.0, 1, 6)
    assert (down.tail_us, down.late_start_us, down.more_wait_us, down.more_busy_us) == pytest.approx(
        (0.85, 0.8, 0.1, 0.0))
    assert (down.same_last_next, down.distinct_last) == (0.0, 4)
    assert tail_table(pd.DataFrame(rows).drop(columns="wait_ns"), "s").empty
    assert tail_table(pd.DataFrame(rows), "other").empty


def test_streaming_table_counts_the_ctas_that_stream_at_each_instant():
    # 16 CTAs: all stream gate_up for 10 us, then CTA 0 alone for 2 us; nothing streams for 1 us (CTA 1's
    # attention split waiting), then the split alone for 2 us. CTA 2 sits at a grid barrier throughout (not
    # streaming). Two tokens the same: the table is a mean over tokens.
    rows = []
    for step in range(2):
        z = 100_000 * step
        for cta in range(16):
            rows.append(dict(system="s", step=step, phase="gate_up", cta=cta, start_ns=z, end_ns=z + 10_000, wait_ns=0))
        rows.append(dict(system="s", step=step, phase="gate_up", cta=0, start_ns=z + 10_000, end_ns=z + 12_000,
                         wait_ns=0))
        rows.append(dict(system="s", step=step, phase="attn", cta=1, start_ns=z + 12_000, end_ns=z + 15_000,
                         wait_ns=1_000))
        rows.append(dict(system="s", step=step, phase="barrier", cta=2, start_ns=z, end_ns=z + 15_000, wait_ns=0))
    tab = streaming_table(pd.DataFrame(rows), "s").set_index("phase")
    assert list(tab.index) == ["attn", "gate_up", "none"]
    assert tuple(tab.loc["gate_up", ["few_us", "half_us", "most_us"]]) == pytest.approx((2.0, 0.0, 10.0))
    assert tuple(tab.loc["attn", ["few_us", "most_us"]]) == pytest.approx((2.0, 0.0))
    assert tab.loc["none", "few_us"] == pytest.approx(1.0)
    assert tab.loc["gate_up", "token_share_few"] == pytest.approx(2 / 15)
    assert streaming_table(pd.DataFrame(rows).drop(columns="wait_ns"), "s").empty


def test_an_engine_check_timeline_with_hops(tmp_path, capsys):
    # bench/engine_check.py --save-timeline writes timeline_t<i>.parquet (its system column is the entry's
    # name): layer_anatomy reads it as one system, without a bench.json (no streaming columns)
    tl = pd.read_parquet(RUN / "timeline.parquet")
    f = tmp_path / "timeline_t0.parquet"
    tl[tl["system"] == "kog-targeted"].assign(system="t0").to_parquet(f)
    assert la.main([str(f), "--hops", "--tails", "--streaming"]) == 0
    out = capsys.readouterr().out
    assert "what each segment is made of" in out and "o -> gate_up" in out.split("made of")[1]
    assert "gate_up" in out.split("against the median CTA")[1]
    assert "attn" in out.split("CTAs streaming")[1]


def test_attn_split_timing_of_a_synthetic_trace(tmp_path, capsys):
    # one traced token, one layer: qkv ends at 10 us; split 0 starts at 8, waits 2.5 us, ends at 14 and merges;
    # split 1 starts at 9, waits 0, ends at 10.5. Times are relative to the qkv end: (-2, 0.5, 4) and (-1, -1, 0.5)
    tl = pd.DataFrame([dict(system="s", step=1, task=0, layer=0, phase="qkv", cta=0, start_ns=0, end_ns=10000,
                            wait_ns=0),
                       dict(system="s", step=1, task=1, layer=0, phase="attn", cta=1, start_ns=8000, end_ns=14000,
                            wait_ns=2500),
                       dict(system="s", step=1, task=2, layer=0, phase="attn", cta=2, start_ns=9000, end_ns=10500,
                            wait_ns=0)])
    attn = pd.DataFrame([dict(cta=1, step=1, task=1, layer=0, kv_head=0, split=0, merged=True, wait_ns=2500),
                         dict(cta=2, step=1, task=2, layer=0, kv_head=0, split=1, merged=False, wait_ns=0)])
    t = attn_split_timing(tl, attn, "s").set_index("split")
    assert t.loc[0, ["start_us", "wait_end_us", "end_us", "merged"]].tolist() == pytest.approx([-2, 0.5, 4, 1])
    assert t.loc[1, ["start_us", "wait_end_us", "end_us", "merged"]].tolist() == pytest.approx([-1, -1, 0.5, 0])
    assert attn_split_timing(tl, attn.assign(step=0), "s").empty      # stamps of another token
    f, g = tmp_path / "timeline_t0.parquet", tmp_path / "attn_t0.parquet"
    tl.to_parquet(f)
    attn.to_parquet(g)
    assert la.main([str(f), "--system", "s", "--attn", str(g)]) == 0
    assert "attention splits against" in capsys.readouterr().out
    assert la.main([str(f), "--system", "s", "--attn", str(tmp_path / "none.parquet")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_gap_table_sums_the_gaps_between_a_ctas_tasks_by_the_phases_around_them():
    # 2 CTAs, 2 tokens: gate_up, gate_up (0.1 us apart), down 2 us after the second gate_up; CTA 1's down
    # comes 3 us after. Per CTA a token: one gate_up -> gate_up gap of 0.1, one gate_up -> down of 2 or 3 us
    rows = []
    for step in range(2):
        z = 100_000 * step
        for cta, hold in ((0, 2_000), (1, 3_000)):
            rows += [dict(system="s", step=step, cta=cta, phase="gate_up", start_ns=z, end_ns=z + 1_000),
                     dict(system="s", step=step, cta=cta, phase="gate_up", start_ns=z + 1_100, end_ns=z + 2_100),
                     dict(system="s", step=step, cta=cta, phase="down", start_ns=z + 2_100 + hold, end_ns=z + 9_000)]
    tab = gap_table(pd.DataFrame(rows), "s").set_index(["phase", "next_phase"])
    assert list(tab.index) == [("gate_up", "gate_up"), ("gate_up", "down"), ("all", "")]
    assert tab.loc[("gate_up", "gate_up"), GAP_COLUMNS[2:6]].tolist() == pytest.approx([1.0, 0.1, 0.1, 0.1])
    assert tab[["barrier_us", "fence_us"]].isna().all().all()     # no publish stamps in this timeline
    assert tab.loc[("gate_up", "down"), ["per_cta", "median_us", "us_per_cta"]].tolist() == pytest.approx([1, 2.5, 2.5])
    assert tab.loc[("all", ""), ["per_cta", "us_per_cta"]].tolist() == pytest.approx([2.0, 2.6])
    assert gap_table(pd.DataFrame(rows).drop(columns="cta"), "s").empty
    assert gap_table(pd.DataFrame(rows), "other").empty


def test_gap_table_splits_a_stamped_publish_into_its_barrier_and_its_fence():
    # each CTA: gate_up, then down after a 3 us gap of which the publish before down took 2.5 us (0.5 of it its
    # barrier); gate_up -> gate_up published nothing (publish_ns 0)
    rows = []
    for cta in range(2):
        rows += [dict(system="s", step=0, cta=cta, phase="gate_up", start_ns=0, end_ns=1_000, publish_ns=0,
                      publish_barrier_ns=0),
                 dict(system="s", step=0, cta=cta, phase="gate_up", start_ns=1_100, end_ns=2_000, publish_ns=0,
                      publish_barrier_ns=0),
                 dict(system="s", step=0, cta=cta, phase="down", start_ns=5_000, end_ns=9_000, publish_ns=2_500,
                      publish_barrier_ns=500 + 100 * cta)]
    tab = gap_table(pd.DataFrame(rows), "s").set_index(["phase", "next_phase"])
    assert tab.loc[("gate_up", "down"), ["median_us", "barrier_us", "fence_us"]].tolist() == pytest.approx(
        [3.0, 0.55, 1.95])
    assert tab.loc[("gate_up", "gate_up"), ["barrier_us", "fence_us"]].isna().all()
    assert tab.loc[("all", ""), "barrier_us"] == pytest.approx(0.55)


def test_the_bundled_runs_gaps_name_the_slow_publish(capsys):
    """In the bundled llama-3.2-1b run the publish after a gate_up task costs several times the others."""
    tl = pd.read_parquet(RUN / "timeline.parquet")
    tab = gap_table(tl, "kog-targeted").set_index(["phase", "next_phase"])
    assert tab.loc[("gate_up", "down"), "median_us"] > 3 * tab.loc[("o", "gate_up"), "median_us"]
    assert 50 < tab.loc[("all", ""), "us_per_cta"] < 300
    assert la.main(["--gaps"]) == 0 and "next_phase" in capsys.readouterr().out
