"""bench/layer_anatomy.py on the bundled H200 bench run (reports/data/h200_bench_run): the per-layer critical
path segments of one traced token, and what streaming alone would take."""
import importlib.util
import json
from pathlib import Path

import pytest

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
    d = json.loads(out.read_text())
    segs = {r["segment"]: r for r in d["median_us"]}
    assert set(segs) == {"down->qkv", "qkv->attn", "attn->o", "o->gate_up", "gate_up->down"}
    # the biggest phase streams the most bytes; no segment is faster than its bytes allow at the copy rate
    assert max(segs, key=lambda k: segs[k]["stream_us"]) == "o->gate_up"
    assert all(r["us"] > 0.9 * r["stream_us"] for r in segs.values())
    # the layer span adds the five segments; a llama-3.2-1b layer's weights take ~29 us at ~4.2 TB/s
    assert 29 < d["layer_span_median_us"] < 200
    assert "layer span median" in capsys.readouterr().out


def test_unknown_system_is_one_line(la, capsys):
    assert la.main([str(RUN), "--system", "no-such"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
