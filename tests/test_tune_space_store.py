"""Search space constraints and the tuned-config store."""
import json
import statistics
from pathlib import Path

import optuna
import pytest

from kog.engine.config import preset
from kog.engine.engine_config import EngineConfig
from kog.tune import store
from kog.tune.space import Infeasible, build_space, check, residency_fn

# a measured-looking config for sheared-llama-2.7b's shape that the sm_90 rule would not give (grid mode), so
# a lookup that found the table is told from one that fell through to the rule
TABLE_SHEARED = dict(mode="grid", weight_ring=3, attn_block=64, attn_tile=32, block_k=4096, bn_qkv=4, bn_o=4,
                     bn_gate_up=2, bn_down=2, bn_lm=4)


@pytest.fixture
def builtin_table(tmp_path, monkeypatch):
    """A built-in table with one H200 entry for sheared-llama-2.7b's shape, in place of kog's own
    (tune/data/builtin_tuned.json, which holds entries only where a promoted study beat the rule)."""
    m = preset("sheared-llama-2.7b")
    entry = {"device": "NVIDIA H200", "model": m.name, "shape": store.shape_signature(m), "dtype": m.dtype,
             "config": EngineConfig(**TABLE_SHEARED).to_dict(), "tok_per_s": 1.0, "mode_measured": "grid",
             "source": {"backend": "gpu", "from": "bench/h200/engine_check_sheared_qkv_span_2026-12-01.json"}}
    path = tmp_path / "builtin_tuned.json"
    path.write_text(json.dumps({"format": "kog-tuned", "about": "test", "entries": {"sheared": entry}}))
    monkeypatch.setattr(store, "BUILTIN", path)
    return path

optuna.logging.set_verbosity(optuna.logging.ERROR)


@pytest.mark.parametrize("name", ["llama-3.2-1b", "qwen2.5-1.5b", "tiny"])
def test_every_sample_is_valid_or_rejected_with_reason(name):
    m = preset(name)
    sp = build_space(m)
    st = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    n_ok = n_bad = 0
    for _ in range(60):
        cfg = sp.suggest(st.ask())
        try:
            check(cfg, m, 132, residency_fn("sim"))
            cfg.validate(m, 132)
            n_ok += 1
        except Infeasible as e:
            assert str(e).startswith("engine config:")
            n_bad += 1
    assert n_ok > 0
    for ph, rows in (("qkv", m.qkv_size), ("lm", m.vocab_size)):
        assert all(rows % b == 0 for b in sp.bn[ph])


def test_grid_mode_has_no_sync_rows_param():
    sp = build_space(preset("tiny"))
    t = optuna.trial.FixedTrial({"mode": "grid", "ctas_per_sm": 2, "num_warps": 4, "block_k": 256,
                                 **{f"bn_{p}": 2 for p in ("qkv", "o", "gate_up", "down", "lm")},
                                 "mapping": "topology", "attn_block": 64})
    assert sp.suggest(t).sync_rows == 0


def test_residency_rejects_before_launch():
    m = preset("llama-3.2-1b")
    with pytest.raises(Infeasible, match="CTAs that fit"):
        check(EngineConfig(num_warps=8, ctas_per_sm=4), m, 132, residency_fn("sim"))


def test_store_roundtrip(tmp_path, monkeypatch, capsys, builtin_table):
    monkeypatch.setenv("KOG_TUNED_DIR", str(tmp_path))
    m = preset("llama-3.2-1b")
    assert store.best_config("NVIDIA H200", m) is None
    cfg = EngineConfig(ctas_per_sm=3, mapping="topology")
    assert store.save_best("NVIDIA H200", m, cfg, 1234.0, {"backend": "gpu"})
    assert store.best_config("NVIDIA H200", m) == cfg
    assert store.best_config("NVIDIA H100", m) is None
    assert store.best_config("NVIDIA H200", preset("llama-3.2-3b")) is None
    # a worse measurement and any prediction never replace the stored measurement
    assert not store.save_best("NVIDIA H200", m, EngineConfig(), 1000.0, {"backend": "gpu"})
    assert not store.save_best("NVIDIA H200", m, EngineConfig(), 9999.0, {"backend": "sim"})
    assert store.save_best("NVIDIA H200", m, EngineConfig(ctas_per_sm=2), 1300.0, {"backend": "gpu"})
    assert store.best_config("NVIDIA H200", m).ctas_per_sm == 2
    # same shape under another name shares the entry
    assert store.best_config("NVIDIA H200", m.replace(name="my-ckpt")).ctas_per_sm == 2
    from kog.tune.cli import main
    assert main(["show", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["entries"]) == 1 and d["entries"][0]["tok_per_s"] == 1300.0
    assert [e["model"] for e in d["builtin"]] == ["sheared-llama-2.7b"]     # kog's own table, listed beside


def test_simulated_entry_not_used_by_default(tmp_path, monkeypatch):
    monkeypatch.setenv("KOG_TUNED_DIR", str(tmp_path))
    m = preset("tiny")
    store.save_best("NVIDIA H200", m, EngineConfig(), 5.0, {"backend": "sim"})
    assert store.best_config("NVIDIA H200", m) is None
    assert store.best_config("NVIDIA H200", m, include_simulated=True) == EngineConfig()
    (tmp_path / "tuned.json").write_text("{corrupt")
    assert store.best_config("NVIDIA H200", m) is None


def test_weight_ring_is_a_parameter_only_where_the_ring_runs():
    from kog.tune.space import WEIGHT_RING_CHOICES, check_tp, ring_capable
    from types import SimpleNamespace as NS
    assert ring_capable(NS(vendor="nvidia", arch="sm_90")) and ring_capable(NS(vendor="nvidia", arch="sm_90a"))
    assert not ring_capable(NS(vendor="nvidia", arch="sm_80"))
    assert not ring_capable(NS(vendor="amd", arch="gfx942")) and not ring_capable(None)
    m = preset("llama-3.2-1b")
    assert build_space(m).weight_ring == (0,)
    sp = build_space(m, ring=True)
    assert sp.weight_ring == WEIGHT_RING_CHOICES
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(30):
        t = study.ask()
        seen.add(sp.suggest(t).weight_ring)
        study.tell(t, 1.0)
    assert seen == set(WEIGHT_RING_CHOICES)
    # attn_tile only where the ring runs, and only asked for splits wider than the tile
    assert build_space(m).attn_tile == (0,) and sp.attn_tile == (0, 32)
    for t in study.trials:
        assert ("attn_tile" in t.params) == (t.params["attn_block"] > 32)
    with pytest.raises(Infeasible, match="weight_ring"):
        check_tp(EngineConfig(weight_ring=3), m, 2, 64, 8, 132)


def test_builtin_table_gives_the_measured_tiling_for_its_device_and_shape_only(tmp_path, monkeypatch,
                                                                              builtin_table):
    """The built-in table (kog.tune.store.builtin_config): a valid config for its device and shape, nothing
    for another GPU, another model, another dtype. kog's own table: every entry names the committed study or
    measurement behind it."""
    own = json.loads(Path(store.__file__).resolve().parent.joinpath("data", "builtin_tuned.json").read_text())
    assert own["format"] == "kog-tuned"
    for e in own["entries"].values():
        assert (Path(__file__).resolve().parents[1] / e["source"]["from"]).exists()
    monkeypatch.setenv("KOG_TUNED_DIR", str(tmp_path))
    m = preset("sheared-llama-2.7b")
    got = store.builtin_config("NVIDIA H200", m)
    assert got == EngineConfig(**TABLE_SHEARED)
    got.validate(m)
    assert store.builtin_config("NVIDIA H100 80GB HBM3", m) is None
    assert store.builtin_config("NVIDIA H200", preset("llama-3.2-1b")) is None
    assert store.builtin_config("NVIDIA H200", m.replace(dtype="float16")) is None


def test_search_baseline_is_what_the_engine_runs_there(builtin_table):
    """The search's first trial (kog.tune.search.engine_default): on a ring-capable GPU kog's measured table
    for that GPU and shape, else the sm_90 rule, measured or simulated (the simulator models the engine as it
    runs); elsewhere EngineConfig()."""
    from types import SimpleNamespace as NS
    from kog.engine.engine_config import sm90_default
    from kog.tune.search import engine_default
    h200 = NS(vendor="nvidia", arch="sm_90", name="NVIDIA H200")
    sheared, llama = preset("sheared-llama-2.7b"), preset("llama-3.2-1b")
    assert engine_default("gpu", "NVIDIA H200", h200, sheared) == store.builtin_config("NVIDIA H200", sheared)
    assert engine_default("gpu", "NVIDIA H200", h200, llama) == sm90_default(llama)
    assert engine_default("gpu", "NVIDIA H100", h200, sheared) == sm90_default(sheared)     # not in the table
    assert engine_default("gpu", "NVIDIA A100", NS(vendor="nvidia", arch="sm_80"), llama) == EngineConfig()
    assert engine_default("sim", "NVIDIA H200", h200, sheared) == store.builtin_config("NVIDIA H200", sheared)
    assert engine_default("sim", "AMD Instinct MI300X", NS(vendor="amd", arch="gfx942"), llama) == EngineConfig()


def test_tuned_config_takes_the_store_then_the_builtin_table_then_the_platform_default(tmp_path, monkeypatch,
                                                                                        builtin_table):
    """kog.tune.store.tuned_config, what kogtune bench / generate run: the user's stored config, else kog's
    measured table, the first that fits the cache span; else the platform default (EngineConfig() here)."""
    from kog.engine.engine_config import fits
    monkeypatch.setenv("KOG_TUNED_DIR", str(tmp_path))
    monkeypatch.setattr(store, "_device_name", lambda device=None: "NVIDIA H200")
    sheared, llama = preset("sheared-llama-2.7b"), preset("llama-3.2-1b")
    builtin = store.builtin_config("NVIDIA H200", sheared)
    assert store.tuned_config(sheared) == builtin
    assert store.tuned_config(llama) == EngineConfig()           # the interpreter's platform default
    mine = EngineConfig(weight_ring=2, attn_block=64)            # its shared memory fits up to 8,192 positions
    assert fits(mine, sheared, 8192) and not fits(mine, sheared, 16384) and fits(builtin, sheared, 16384)
    assert store.save_best("NVIDIA H200", sheared, mine, 1.0, {"backend": "gpu"})
    assert store.tuned_config(sheared) == mine and store.tuned_config(sheared, span=8192) == mine
    assert store.tuned_config(sheared, span=16384) == builtin
    assert store.tuned_config(llama, span=16384) == EngineConfig()


def test_retired_engine_fields_are_dropped_when_read(tmp_path, monkeypatch):
    """A tuned.json written by an older kog holds the fields of engine paths that were removed: reading
    drops exactly those (RETIRED_FIELDS) and keeps the rest of the config; any other unknown field is still
    refused, so the entry is skipped."""
    from kog.engine.config import ConfigError
    assert store.RETIRED_FIELDS == ("prefetch", "blocked_prefetch", "row_prefetch", "pipeline_stages", "flat_loop",
                                   "max_spin")
    monkeypatch.setenv("KOG_TUNED_DIR", str(tmp_path))
    m = preset("llama-3.2-1b")
    cfg = EngineConfig(ctas_per_sm=3, mapping="topology")
    assert store.save_best("NVIDIA H200", m, cfg, 900.0, {"backend": "gpu"})
    doc = json.loads(store.store_path().read_text())
    (entry,) = doc["entries"].values()
    entry["config"].update(prefetch=2, blocked_prefetch=1, row_prefetch=2, pipeline_stages=3, flat_loop=1,
                           max_spin=20_000_000)
    store.store_path().write_text(json.dumps(doc))
    assert store.best_config("NVIDIA H200", m) == cfg
    assert store.engine_config({**cfg.to_dict(), "prefetch": 1}) == cfg
    with pytest.raises(ConfigError, match="no_such_knob"):
        store.engine_config({**cfg.to_dict(), "no_such_knob": 1})
    entry["config"]["no_such_knob"] = 1
    store.store_path().write_text(json.dumps(doc))
    assert store.best_config("NVIDIA H200", m) is None
    for e in json.loads(store.BUILTIN.read_text())["entries"].values():     # kog's own table is current
        assert not set(e["config"]) & set(store.RETIRED_FIELDS)



@pytest.mark.parametrize("name", ["qwen3-1.7b", "llama-3.2-1b"])
def test_neighbors_move_one_knob_of_the_default(name):
    """Space.neighbors: each config one knob away, the knob's neighbouring choices (both sides), the knobs that
    depend on it replayed (grid mode asks no sync_rows; a 32-position split no attn_tile); none twice."""
    from kog.engine.engine_config import sm90_default
    m = preset(name)
    sp = build_space(m, has_scan=False, ring=True)
    _, base, choices = sp.replay(sm90_default(m, 640).to_dict())
    near = sp.neighbors(base)
    assert len({json.dumps(p, sort_keys=True) for p in near}) == len(near) and base not in near
    moved = []
    for p in near:
        diff = {k for k in set(base) | set(p) if base.get(k) != p.get(k)}
        knob = [k for k in diff if k in base and k in p]
        assert len(knob) == 1 and diff - set(knob) <= {"sync_rows", "attn_tile"}, (p, diff)
        k = knob[0]
        opts = choices[k]
        if isinstance(base[k], int):
            assert abs(opts.index(p[k]) - opts.index(base[k])) == 1
        moved.append((k, p[k]))
        assert sp.replay(p)[1] == p                  # already what suggest() asks for
    assert ("attn_block", base["attn_block"] // 2) in moved and ("attn_block", base["attn_block"] * 2) in moved
    assert ("mode", "grid") in moved and all(("bn_" + ph, base["bn_" + ph] * 2) in moved for ph in ("qkv", "o"))
    grid = next(p for p in near if p["mode"] == "grid")
    assert "sync_rows" not in grid


def test_initial_design_is_the_default_then_its_valid_neighbors(tmp_path, monkeypatch):
    """The search's queued trials: the engine default, every neighbor the constraints accept, then random
    configs only to reach n."""
    import argparse
    from kog.tune.search import _feasible, _is_default, initial_design, prepare
    from kog.tune.space import residency_fn
    monkeypatch.setenv("KOG_RUNS_DIR", str(tmp_path / "runs"))
    a = argparse.Namespace(model="qwen3-1.7b", trials=8, study=None, storage=None, sampler="tpe", backend="sim",
                           workers=1, timeout=30.0, runs_dir=str(tmp_path / "runs"), json=False, seed=0, tp=None,
                           exchange_rows=None, gpus=None)
    s = prepare(a)
    sp = s.space()
    design = initial_design(s, 8)
    assert _is_default(s, design[0])
    base = sp.replay(design[0])[1]
    near = [p for p in sp.neighbors(base) if _feasible(sp.replay(p)[0], p, s, residency_fn(s.backend))]
    assert len(near) >= 10 and design[1:1 + len(near)] == near and len(design) == max(8, 1 + len(near))


def _stated_gain(src, best, dflt):
    """The gain an entry must state: its study's confirmation (medians of the best and the default re-measured
    in alternation) where the search ran one, else the two trials' single measurements."""
    conf = src.get("confirmation")
    if conf:
        assert conf["best_trial"] == src["trial"] and conf["default_trial"] == src["engine_default_trial"]
        return statistics.median(conf["best_tok_per_s"]) / statistics.median(conf["default_tok_per_s"]) - 1.0
    return best["value"] / dflt["value"] - 1.0


def test_every_builtin_entry_names_its_committed_study():
    """kog's own table (tune/data/builtin_tuned.json): each entry comes from a GPU study whose export is
    committed, is that study's measured trial (same config, same tok/s), beats the study's engine-default
    trial by the gain it states (>= 1%; the confirmation's where the search confirmed its best), and is the
    config builtin_config gives for its device and shape."""
    from kog.engine.config import PRESETS
    from kog.tune.store import engine_config
    repo = Path(__file__).resolve().parents[1]
    entries = json.loads(store.BUILTIN.read_text())["entries"]
    for key, e in entries.items():
        src = e["source"]
        assert src["backend"] == "gpu" and src["study"], key
        doc = json.loads((repo / src["from"]).read_text())
        trials = {t["number"]: t for t in doc["trials"]}
        best, dflt = trials[src["trial"]], trials[src["engine_default_trial"]]
        assert best["state"] == "COMPLETE" and dflt["state"] == "COMPLETE", key
        assert abs(best["value"] - e["tok_per_s"]) < 0.01 and abs(dflt["value"] - src["engine_default_tok_per_s"]) < 0.01
        assert engine_config(best["config"]) == engine_config(e["config"]), key
        assert src["gain"] >= 0.01 and abs(_stated_gain(src, best, dflt) - src["gain"]) < 1e-3, key
        m = PRESETS[e["model"]]
        assert store.shape_signature(m) == e["shape"] and store.builtin_config(e["device"], m) == engine_config(
            e["config"]), key
