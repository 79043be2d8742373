"""The critical path per layer (kog.reports.bench_tables.layer_segments / critical_path_table and the
bench/layer_anatomy.py CLI) on the bundled H200 bench run (reports/data/h200_bench_run)."""
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

from kog.reports.bench_tables import critical_path_table, layer_segments, phase_weight_bytes

REPO = Path(__file__).resolve().parents[1]
RUN = REPO / "reports" / "data" / "h200_bench_run"


@pytest.fixture(scope="module")
def la():
    spec = importlib.util.spec_from_file_location("layer_anatomy", REPO / "bench" / "layer_anatomy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_segments_of_the_bundled_run(la, tmp_path, capsys):
    out = tmp_path / "a.json"
    assert la.main([str(RUN), "--json", str(out)]) == 0
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


def test_not_a_run_directory_is_one_line(la, tmp_path, capsys):
    assert la.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert la.main([str(RUN), "--system", "no-such"]) == 2
