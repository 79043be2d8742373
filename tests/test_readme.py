"""The README cannot drift from what is committed: its results table equals the bench JSON (every figure
parsed and compared with the file it names), its generated block equals what kog.reports.readme_table
prints, its status line agrees with the target, and its two fresh-machine commands are the ones CI and
a person run."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kog.reports import readme_table as RT
from kog.reports.bench_tables import rel_errs

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
TEST_CMD = "pip install -e '.[test]' && python -m pytest -q -x --timeout=900 tests"
MAIN_CMD = "pip install -e . && kogprobe report --bundled && kogtune report --bundled"


def committed_benches() -> dict[str, dict]:
    """Every bench document under bench/ (sweeps and scan summaries are not bench documents)."""
    out = {}
    for p in sorted((REPO / "bench").rglob("*.json")):
        doc = json.loads(p.read_text())
        if RT.is_bench(doc):
            out[p.relative_to(REPO).as_posix()] = doc
    return out


def readme_rows(text: str) -> list[dict[str, str]]:
    """The rows of the results table in the README's generated block, as {column: cell}."""
    i, j = text.find(RT.BEGIN), text.find(RT.END)
    assert 0 <= i < j, "README has no results block"
    lines = [ln.strip() for ln in text[i:j].splitlines() if ln.strip().startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    header, rule, body = cells[0], cells[1], cells[2:]
    assert all(set(c) <= set("-: ") for c in rule)
    return [dict(zip(header, r)) for r in body]


def num(cell: str) -> float | None:
    cell = cell.strip()
    return None if cell in ("–", "-", "") else float(cell.replace(",", "").rstrip("%"))


def test_there_is_a_committed_bench():
    benches = committed_benches()
    assert "bench/h200/llama-3.2-1b.json" in benches, "the H200 bench JSON is not in bench/h200/"


def test_table_figures_equal_the_bench_json():
    """One row per committed bench: kog-targeted's median and spread, its share of the limit, the fastest
    non-kog system of the same run and kog's ratio to it, kog-grid, the error against float32."""
    benches = committed_benches()
    rows = readme_rows(README)
    assert rows, "the results table is empty"
    for col in RT.COLUMNS:
        assert col in rows[0], f"results table has no '{col}' column"
    seen = set()
    for r in rows:
        src = r["source"].strip("`")
        assert src in benches, f"README row names {src}, which is not a committed bench JSON"
        doc = benches[src]
        seen.add(src)
        assert r["model"] == doc["model"]
        tg, limit = doc["systems"]["kog-targeted"], doc["limit_tok_per_s"]
        assert num(r["limit tok/s"]) == pytest.approx(limit, abs=0.5), r
        assert num(r["kog-targeted tok/s"]) == pytest.approx(tg["tok_per_s"], abs=0.05 + 1e-9), r
        assert num(r["% of limit"]) == pytest.approx(100 * tg["tok_per_s"] / limit, abs=0.05 + 1e-9), r
        runs = tg["runs_tok_per_s"]
        lo, hi = (num(x) for x in r["spread"].split("–"))
        assert lo == pytest.approx(min(runs), abs=0.05) and hi == pytest.approx(max(runs), abs=0.05), r
        base = {k: v["tok_per_s"] for k, v in doc["systems"].items()
                if k not in RT.KOG and v.get("tok_per_s") is not None}
        name, tps = r["fastest baseline"].rsplit(" ", 1)
        assert name == max(base, key=base.get) and num(tps) == pytest.approx(max(base.values()), abs=0.05), r
        assert num(r["kog / fastest"].rstrip("x")) == pytest.approx(tg["tok_per_s"] / max(base.values()), abs=0.005)
        assert num(r["kog-grid tok/s"]) == pytest.approx(doc["systems"]["kog-grid"]["tok_per_s"], abs=0.05), r
        assert num(r["max_rel_err"]) == pytest.approx(rel_errs(doc, tg)[0], rel=6e-3), r
        assert r["commit"] == doc["git_commit"][:7], r
    assert seen == set(benches), f"README table lacks {sorted(set(benches) - seen)}: run python -m " \
                                 "kog.reports.readme_table --write README.md bench/h200/*.json"


def test_generated_block_is_current():
    benches = RT.load_benches([REPO / p for p in committed_benches()])
    block = RT.results_block([(Path(p).relative_to(REPO).as_posix(), d) for p, d in benches])
    i, j = README.find(RT.BEGIN), README.find(RT.END)
    assert README[i:j + len(RT.END)] == block, \
        "README's results block is stale: python -m kog.reports.readme_table --write README.md bench/h200/*.json"


def test_the_readme_says_plainly_that_mi300x_is_unverified():
    assert re.search(r"MI300X[^.]*unverified", README), "README must say MI300X is unverified"


def test_fresh_machine_commands():
    lines = README.splitlines()
    assert TEST_CMD in lines          # .ci/run greps for this exact line
    assert MAIN_CMD in lines


def test_readme_table_cli(tmp_path, capsys):
    """The command the README gives: prints the block, skips non-bench JSON, --write replaces it."""
    junk = tmp_path / "sweep.json"
    junk.write_text(json.dumps({"rows": [1, 2]}))
    src = tmp_path / "b.json"
    doc = json.loads((REPO / "bench/h200/llama-3.2-1b.json").read_text())
    doc["systems"]["kog-targeted"]["tok_per_s"] = 1234.5678
    doc["systems"]["torch-compile"]["tok_per_s"] = 691.4
    src.write_text(json.dumps(doc))
    assert RT.main([str(src), str(junk)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(RT.BEGIN) and "| 1,234.6 |" in out and "sweep.json" not in out
    assert "`kog-targeted` >= 85% of the limit: **not met** (1,234.6 tok/s" in out
    assert "`kog-targeted` >= 1.50x the fastest baseline of the run: met (1,234.6 vs torch-compile's 691.4" in out
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{RT.BEGIN}\nold\n{RT.END}\n\ntail\n")
    assert RT.main(["--write", str(readme), str(src)]) == 0
    text = readme.read_text()
    assert "old" not in text and text.endswith("\n\ntail\n") and "| 1,234.6 |" in text
    assert RT.main([str(junk)]) == 2


def test_tuned_config_against_the_rule_line():
    """A bench that timed kog-rule beside a tuned kog-targeted gets one line with both rates and the gain."""
    doc = json.loads((REPO / "bench/h200/llama-3.2-1b.json").read_text())
    doc["systems"]["kog-targeted"].update(tok_per_s=1100.0, config_source="built-in entry, study s")
    doc["systems"]["kog-rule"] = {"tok_per_s": 1000.0, "max_rel_err": 1e-3}
    assert RT.tuned_against_rule([("b.json", doc)]) == [
        "- llama-3.2-1b: 1,100.0 tok/s (built-in entry, study s) against the rule's 1,000.0, +10.0%."]
    assert RT.fastest_baseline(doc)[0] != "kog-rule"
    assert "the rule's 1,000.0" in RT.results_block([("b.json", doc)])
    del doc["systems"]["kog-rule"]
    assert RT.tuned_against_rule([("b.json", doc)]) == []


def test_the_search_target_is_judged_on_the_presets_furthest_from_their_limit():
    """The search's target names the two presets with the lowest share of their limit and is met only where
    both ran a tuned config >= 5% over kog-rule in the same run."""
    base = json.loads((REPO / "bench/h200/llama-3.2-1b.json").read_text())

    def doc(model, share, tuned=None):
        d = json.loads(json.dumps(base))
        d["model"] = model
        d["systems"]["kog-targeted"]["tok_per_s"] = share * d["limit_tok_per_s"]
        if tuned is not None:
            d["systems"]["kog-rule"] = {"tok_per_s": share * d["limit_tok_per_s"] / (1 + tuned)}
        return (f"{model}.json", d)

    ok, what = RT.tuned_target([doc("a", 0.9), doc("b", 0.6, 0.06), doc("c", 0.7, 0.051)])
    assert ok and "(b +6.0%, c +5.1%)" in what
    ok, what = RT.tuned_target([doc("a", 0.5), doc("b", 0.6, 0.06)])
    assert not ok and "a no tuned config benched" in what
    ok, _ = RT.tuned_target([doc("a", 0.9, 0.2), doc("b", 0.6, 0.06), doc("c", 0.7, 0.04)])
    assert not ok
    assert RT.tuned_target([doc("a", 0.9)]) is None
