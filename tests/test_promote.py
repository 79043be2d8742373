"""kog.tune.promote: a GPU study's best trial into the built-in table, naming the committed study export; the
refusals (simulated study, no engine-default trial, no gain, unknown study, bad storage) are one line each."""
from __future__ import annotations

import json

import optuna
import pytest

from kog.engine.config import PRESETS
from kog.engine.engine_config import EngineConfig
from kog.tune import promote as P
from kog.tune.store import shape_signature

MODEL = PRESETS["llama-3.2-3b"]
SHAPE = shape_signature(MODEL)


SEARCHED = object()        # make_study's confirm: the confirmation measured the search's own gain


def make_study(tmp_path, backend="gpu", values=(400.0, 430.0, 415.0), baseline=True, name="s", confirm=SEARCHED):
    """A study as `kogtune search` leaves it: its attributes, the engine default first (tagged), then trials
    with their configs; one failed trial; the closing confirmation of the best (confirm: its gain, None for
    none)."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    st = optuna.create_study(study_name=name, storage=url, direction="maximize")
    for k, v in {"model": MODEL.name, "model_shape": SHAPE, "dtype": "bfloat16", "device": "NVIDIA H200",
                 "backend": backend, "git_commit": "abc1234"}.items():
        st.set_user_attr(k, v)
    dist = {"bn_qkv": optuna.distributions.CategoricalDistribution([2, 4, 8])}
    for i, v in enumerate(values):
        bn = (8, 4, 2)[i % 3]
        attrs = {"config": EngineConfig(bn_qkv=bn).to_dict()}
        if i == 0 and baseline:
            attrs["baseline"] = "engine default"
        st.add_trial(optuna.trial.create_trial(params={"bn_qkv": bn}, distributions=dist, value=v, user_attrs=attrs))
    st.add_trial(optuna.trial.create_trial(params={"bn_qkv": 4}, distributions=dist,
                                           state=optuna.trial.TrialState.FAIL,
                                           user_attrs={"fail_reason": "timeout after 120 s"}))
    if confirm is not None:
        best = max(range(len(values)), key=lambda i: values[i])
        gain = values[best] / values[0] - 1 if confirm is SEARCHED else confirm
        st.set_user_attr("confirmation", {"best_trial": best, "default_trial": 0, "rounds": 3, "gain": gain,
                                          "best_tok_per_s": [], "default_tok_per_s": [], "errors": []})
    return url


def test_promote_writes_the_best_trial_naming_the_study(tmp_path, capsys):
    """The entry claims the confirmation's gain (+6.0%), not the search's single measurements' (+7.5%)."""
    url = make_study(tmp_path, confirm=0.06)
    builtin = tmp_path / "builtin.json"
    builtin.write_text(json.dumps({"format": "kog-tuned", "about": "kept", "entries": {"other": {"device": "x"}}}))
    assert P.main(["--storage", url, "--study", "s", "--builtin", str(builtin),
                   "--studies-dir", str(tmp_path / "studies")]) == 0
    table = json.loads(builtin.read_text())
    assert table["about"] == "kept" and "other" in table["entries"]
    e = table["entries"][f"NVIDIA H200|{SHAPE}|bfloat16"]
    assert e["config"] == EngineConfig(bn_qkv=4).to_dict() and e["tok_per_s"] == 430.0
    s = e["source"]
    assert (s["backend"], s["commit"], s["study"], s["trial"], s["engine_default_trial"]) == \
        ("gpu", "abc1234", "s", 1, 0)
    assert s["engine_default_tok_per_s"] == 400.0 and s["gain"] == pytest.approx(0.06)
    assert s["confirmation"]["rounds"] == 3
    doc = json.loads((tmp_path / "studies" / "s.json").read_text())
    assert s["from"] == str(tmp_path / "studies" / "s.json")      # outside the repository: the path as is
    assert [t["number"] for t in doc["trials"]] == [0, 1, 2, 3]
    assert doc["trials"][3]["state"] == "FAIL" and doc["trials"][3]["fail_reason"] == "timeout after 120 s"
    assert doc["trials"][0]["baseline"] == "engine default" and doc["attrs"]["model_shape"] == SHAPE
    assert "+6.0% over the engine default" in capsys.readouterr().out


@pytest.mark.parametrize("kw, argv, code, says", [
    ({"backend": "sim"}, [], 2, "not a GPU study"),
    ({"baseline": False}, [], 1, "no measured engine-default trial"),
    ({"values": (400.0, 402.0, 399.0)}, [], 1, "nothing to promote"),
    ({"confirm": -0.032}, [], 1, "-3.2% against the engine default (#0) in the confirmation"),
    ({"confirm": None}, [], 1, "no same-run confirmation of its best trial (#1)"),
    ({}, ["--study", "nope"], 2, "no study 'nope'"),
])
def test_promote_refusals_are_one_line(tmp_path, capsys, kw, argv, code, says):
    url = make_study(tmp_path, **kw)
    builtin = tmp_path / "builtin.json"
    args = ["--storage", url, "--study", "s", "--builtin", str(builtin), "--studies-dir", str(tmp_path / "st")]
    assert P.main(args + argv) == code
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and says in err
    assert not builtin.exists() and not (tmp_path / "st").exists()      # nothing written


def test_promote_bad_storage_url(tmp_path, capsys):
    assert P.main(["--storage", "sqlite:///no/such/dir/x.db", "--study", "s"]) == 2
    assert "bad storage URL" in capsys.readouterr().err
