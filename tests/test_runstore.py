"""Run store: layout, atomic writes, interrupted and killed runs, and readers refusing bad directories."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

from kog.probe.device import DeviceInfo
from kog.probe.device.fake import h200
from kog.provenance import source_digest
from kog.runstore import FORMAT, RunError, RunStore, atomic_write_bytes, atomic_write_json, open_run


def _df(n=50, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"sm": rng.integers(0, 132, n), "ns": rng.normal(600.0, 40.0, n)})


def test_complete_run_layout(tmp_runs):
    df = _df()
    with tmp_runs.create("scan", h200(), argv=["kogprobe", "scan"]) as run:
        assert run.status == "running"
        run.write_table("latency", df)
        run.write_json("summary", {"barrier_us": 0.92})
    assert run.path.parent == tmp_runs.root
    assert run.path.name.endswith("-nvidia-h200-scan") and run.path.name[:8].isdigit()
    r = open_run(run.path)
    assert r.status == "complete" and r.complete and r.kind == "scan"
    assert r.meta["format"] == FORMAT and r.meta["argv"] == ["kogprobe", "scan"]
    assert r.meta["started"] and r.meta["finished"] and "torch" in r.meta["versions"]
    assert r.meta["source_digest"] == source_digest()
    assert DeviceInfo.from_dict(r.meta["device"]).sms == 132 and r.tables == ["latency"] and r.meta["documents"] == ["summary"]
    pd.testing.assert_frame_equal(r.table("latency"), df)
    assert r.json("summary") == {"barrier_us": 0.92}
    assert [x.path for x in tmp_runs.list("scan")] == [run.path]
    assert tmp_runs.latest("scan").path == run.path and tmp_runs.latest("bench") is None


def test_two_runs_in_one_second_get_distinct_directories(tmp_runs):
    a, b = tmp_runs.create("bench", None), tmp_runs.create("bench", None)
    assert a.path != b.path and "nodevice" in a.path.name


def test_exception_marks_incomplete_and_keeps_finished_tables(tmp_runs):
    df = _df(seed=1)
    with pytest.raises(RuntimeError):
        with tmp_runs.create("scan", h200()) as run:
            run.write_table("placement", df)
            raise RuntimeError("probe 'latency' exploded")
    r = open_run(run.path)
    assert r.status == "incomplete" and not r.complete
    assert r.meta["interrupted_by"] == "RuntimeError" and "exploded" in r.meta["interrupted_message"]
    pd.testing.assert_frame_equal(r.table("placement"), df)
    assert tmp_runs.latest("scan") is None and tmp_runs.latest("scan", complete_only=False).path == run.path


def test_ctrl_c_marks_incomplete(tmp_runs):
    with pytest.raises(KeyboardInterrupt):
        with tmp_runs.create("study", None) as run:
            raise KeyboardInterrupt
    assert open_run(run.path).status == "incomplete"


def test_explicit_failed_status_survives_the_with_block(tmp_runs):
    with tmp_runs.create("bench", None) as run:
        run.note_error("hf", "out of memory")
        run.finish("failed")
    r = open_run(run.path)
    assert r.status == "failed" and r.meta["errors"] == {"hf": "out of memory"}
    with pytest.raises(ValueError):
        run.finish("running")


def test_killed_run_reads_as_incomplete(tmp_runs):
    """A writer killed with SIGKILL leaves status 'running'; with its pid gone, readers say incomplete."""
    code = textwrap.dedent(f"""
        import os, sys, time, pandas as pd
        from kog.runstore import RunStore
        run = RunStore({str(tmp_runs.root)!r}).create("scan", None)
        run.write_table("done", pd.DataFrame({{"x": [1.5, 2.5]}}))
        print(run.path, flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        path = p.stdout.readline().strip()
        assert open_run(path).status == "running"  # the writer is alive
    finally:
        p.kill()
        p.wait(timeout=30)
    r = open_run(path)
    assert r.meta["status"] == "running" and r.status == "incomplete"
    assert list(r.table("done")["x"]) == [1.5, 2.5]


def test_sigterm_through_cli_entry_marks_incomplete(tmp_runs):
    """cli_entry turns SIGTERM into an exception so the `with` block records an incomplete run."""
    code = textwrap.dedent(f"""
        import sys, time, pandas as pd
        from kog.errors import cli_entry
        from kog.runstore import RunStore

        @cli_entry("t")
        def main(argv=None):
            with RunStore({str(tmp_runs.root)!r}).create("scan", None) as run:
                run.write_table("done", pd.DataFrame({{"x": [3.25]}}))
                print(run.path, flush=True)
                time.sleep(60)
            return 0
        sys.exit(main())
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    path = p.stdout.readline().strip()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 143 and err.strip() == "t: terminated"
    r = open_run(path)
    assert r.status == "incomplete" and r.meta["interrupted_by"] == "Terminated"
    assert r.table("done")["x"].tolist() == [3.25]


def test_a_reused_pid_does_not_look_alive(tmp_runs):
    run = tmp_runs.create("scan", None)
    assert run.status == "running"  # this very process
    run.meta["pid_start"] = -1      # same pid, but a different process start time
    assert run.status == "incomplete"
    run.meta["host"] = "another-host"
    run.meta["pid_start"] = None
    assert run.status == "incomplete"


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    p = tmp_path / "a.json"
    atomic_write_json(p, {"v": 1})

    class Boom:
        def __len__(self):
            raise OSError("disk full")

    with pytest.raises(TypeError):
        atomic_write_bytes(p, Boom())  # the write fails midway
    assert json.loads(p.read_text()) == {"v": 1}
    assert [x.name for x in tmp_path.iterdir()] == ["a.json"]  # no temp file left behind


def test_json_is_strict(tmp_runs):
    run = tmp_runs.create("bench", None)
    p = run.write_json("summary", {"nan": float("nan"), "inf": float("inf"), "np": np.float32(0.5),
                                   "i": np.int64(7), "arr": np.arange(3), "t": (1, 2)})
    text = p.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"nan": None, "inf": None, "np": 0.5, "i": 7, "arr": [0, 1, 2], "t": [1, 2]}


@pytest.mark.parametrize("name", ["../evil", "a/b", "", "meta", ".hidden"])
def test_bad_names_are_refused(tmp_runs, name):
    run = tmp_runs.create("scan", None)
    with pytest.raises(ValueError):
        run.write_table(name, _df(3))
    with pytest.raises(ValueError):
        run.write_json(name, {})


# ---- readers refuse what is not a kog run ------------------------------------------------------

def _one_line(e: pytest.ExceptionInfo) -> str:
    msg = str(e.value)
    assert "\n" not in msg and msg
    return msg


def test_refuses_missing_directory(tmp_path):
    with pytest.raises(RunError) as e:
        open_run(tmp_path / "nope")
    assert "no such run directory" in _one_line(e)


def test_refuses_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(RunError) as e:
        open_run(tmp_path / "f")
    assert "a file" in _one_line(e)


def test_refuses_directory_without_meta(tmp_path):
    with pytest.raises(RunError) as e:
        open_run(tmp_path)
    assert "has no meta.json" in _one_line(e)


def test_refuses_a_run_store_with_a_hint(tmp_runs):
    tmp_runs.create("scan", None)
    with pytest.raises(RunError) as e:
        open_run(tmp_runs.root)
    assert "run store" in _one_line(e)


@pytest.mark.parametrize("meta,words", [
    ("{not json", "not valid JSON"),
    ('{"format": "something-else", "kind": "scan"}', "format marker"),
    ('[1, 2]', "format marker"),
    ('{"format": "kog-run", "format_version": 99, "kind": "scan"}', "newer kog"),
    ('{"format": "kog-run", "format_version": 1, "kind": "party"}', "unknown kind"),
    ('{"format": "kog-run", "format_version": 1, "kind": "scan", "tables": "x"}', "tables"),
    ('{"format": "kog-run", "format_version": 1, "kind": "scan", "device": 3}', "device"),
])
def test_refuses_corrupt_or_foreign_meta(tmp_path, meta, words):
    (tmp_path / "meta.json").write_text(meta)
    with pytest.raises(RunError) as e:
        open_run(tmp_path)
    assert words in _one_line(e)


def test_corrupt_or_missing_table_is_a_run_error(tmp_runs):
    with tmp_runs.create("scan", None) as run:
        run.write_table("t", _df(5))
    (run.path / "t.parquet").write_bytes(b"PAR1 garbage")
    r = open_run(run.path)
    with pytest.raises(RunError) as e:
        r.table("t")
    assert "corrupt" in _one_line(e)
    with pytest.raises(RunError) as e:
        r.table("absent")
    assert "no table 'absent'" in _one_line(e)
    (run.path / "s.json").write_text("{")
    with pytest.raises(RunError):
        r.json("s")


def test_list_skips_unreadable_directories(tmp_runs):
    with tmp_runs.create("scan", None) as good:
        pass
    (tmp_runs.root / "junk").mkdir()
    (tmp_runs.root / "junk" / "meta.json").write_text("{")
    (tmp_runs.root / "README").write_text("not a run")
    assert [r.path for r in tmp_runs.list()] == [good.path]
    assert RunStore(tmp_runs.root / "absent").list() == []


def test_runs_dir_env(tmp_runs):
    assert str(RunStore().root) == os.environ["KOG_RUNS_DIR"]


def test_create_rejects_unknown_kind(tmp_runs):
    with pytest.raises(ValueError):
        tmp_runs.create("party", None)


def test_source_digest_names_the_code_not_the_checkout(tmp_path, monkeypatch):
    """source_digest hashes kog's sources by path and content: a run's meta.json carries it, and one changed
    byte in the core or any subpackage changes it (a device copy's stale git metadata cannot). The core
    counts its own files only: an installed `kog` folder holds the subpackages too."""
    import importlib.util
    import types
    from kog.provenance import PARTS
    d = source_digest()
    assert len(d) == 16 and int(d, 16) >= 0 and source_digest() == d
    specs = {}
    for label, module in PARTS:
        (tmp_path / label / "sub").mkdir(parents=True)
        (tmp_path / label / "__init__.py").write_text("")
        (tmp_path / label / "sub" / "m.py").write_text(f"X = '{label}'\n")
        specs[module] = types.SimpleNamespace(origin=str(tmp_path / label / "__init__.py"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: specs.get(n) or real(n, *a))
    fake = source_digest()
    assert fake != d
    for label in ("engine", "core"):
        changed = tmp_path / label / ("sub/m.py" if label == "engine" else "__init__.py")
        before = changed.read_text()
        changed.write_text(before + "Y = 1\n")
        assert source_digest() not in (fake, d), label
        changed.write_text(before)
        assert source_digest() == fake
    (tmp_path / "core" / "sub" / "m.py").write_text("X = 'a subpackage folder inside kog'\n")
    assert source_digest() == fake
