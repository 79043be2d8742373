"""kog.engine.regreport: the monokernel compiled for sm_90 on the CPU machine, and its resource report.

The signature test runs in this (interpreted) process and checks that launch_spec still builds what
Monokernel._launch passes to the kernel; the compile test runs the CLI in a subprocess without
TRITON_INTERPRET (conftest sets it globally) and needs the ptxas shipped in the triton wheel.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from kog.engine import regreport as rr
from kog.engine.config import preset
from kog.engine.engine_config import EngineConfig


def _ptxas_runs() -> bool:
    try:
        p = rr.ptxas_path()
        return subprocess.run([str(p), "--version"], capture_output=True, timeout=30).returncode == 0
    except Exception:
        return False


class _Recorder:
    """Stands in for the jitted kernel: records what the launcher passes."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        return lambda *a, **kw: self.calls.append((grid, a, kw))


def _compare(launched, spec):
    (_, a, kw), (sa, smeta) = launched, spec

    def same(x, y, where):
        if isinstance(x, tuple):           # an argument group: field by field
            assert type(x) is type(y), f"{where}: {type(x).__name__} vs {type(y).__name__}"
            for f, xv, yv in zip(getattr(x, "_fields", range(len(x))), x, y):
                same(xv, yv, f"{where}.{f}")
        elif isinstance(x, torch.Tensor):
            assert type(y).__name__ == "MockTensor" and y.dtype == x.dtype, f"{where}: {x.dtype} vs {y!r}"
        else:
            assert type(x) is type(y) and x == y, f"{where}: launcher {x!r}, launch_spec {y!r}"

    assert len(a) == len(sa)
    for i, (x, y) in enumerate(zip(a, sa)):
        same(x, y, f"argument {i}")
    assert kw == smeta


@pytest.mark.parametrize("teacher", [False, True])
def test_launch_spec_matches_the_launcher(monkeypatch, teacher):
    from kog.engine import kernel
    from kog.engine.monokernel import Monokernel
    from kog.engine.weights import random_weights
    cfg = preset("tiny")
    ecfg = EngineConfig(mode="grid" if teacher else "targeted", bn_lm=16, attn_block=16)
    mk = Monokernel(cfg, random_weights(cfg, seed=3), ecfg, max_seq=70, trace_tokens=8)
    mk.n_eos = 0                                  # as KogSystem (the bench)
    rec = _Recorder()
    monkeypatch.setattr(kernel, "monokernel", rec)
    rng = np.random.default_rng(7)
    prompt = rng.integers(0, cfg.vocab_size, 9).tolist()
    n = int(rng.integers(3, 20))
    if teacher:
        mk.teacher_forced_logits(prompt, rng.integers(0, cfg.vocab_size, n).tolist())
    else:
        mk.generate(prompt, n)
    assert len(rec.calls) == 1
    spec = rr.launch_spec(cfg, ecfg, vendor=0, prompt_len=len(prompt), tokens=n, max_seq=mk.max_seq,
                          n_eos=0, write_logits=teacher, forced=teacher)
    _compare(rec.calls[0], spec)


def test_occupancy_hopper_rules():
    assert rr.occupancy(255, 10272, 4)["ctas_per_sm_fit"] == 2
    assert rr.occupancy(254, 10272, 4)["limited_by"] == "registers"
    assert rr.occupancy(168, 10272, 4)["ctas_per_sm_fit"] == 3
    assert rr.occupancy(128, 10272, 4)["ctas_per_sm_fit"] == 4
    assert rr.occupancy(129, 0, 4)["ctas_per_sm_fit"] == 3          # 136 after rounding to the allocation unit
    assert rr.occupancy(128, 0, 8)["ctas_per_sm_fit"] == 2
    assert rr.occupancy(24, 0, 4)["limited_by"] == "threads"
    o = rr.occupancy(40, 100 * 1024, 4)
    assert o["ctas_per_sm_fit"] == 2 and o["limited_by"] == "smem"
    assert rr.occupancy(64, 0, 4)["regs_for_ctas"][4] == 128


def test_parse_ptxas_log_reads_the_entry_function():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'helper' for 'sm_90a'
ptxas info    : Function properties for helper
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers
ptxas info    : Compiling entry function 'monokernel' for 'sm_90a'
ptxas info    : Function properties for monokernel
    576 bytes stack frame, 958 bytes spill stores, 1428 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 576 bytes cumulative stack size, 16 bytes smem, 380 bytes cmem[0]
"""
    s = rr.parse_ptxas_log(log, "monokernel")
    assert s == {"stack_frame_bytes": 576, "spill_store_bytes": 958, "spill_load_bytes": 1428,
                 "registers": 128, "ptxas_smem_bytes": 16}
    with pytest.raises(Exception):
        rr.parse_ptxas_log("ptxas info    : 0 bytes gmem\n")


def test_sass_counts():
    sass = """
        /*0090*/                   LDG.E.128 R4, desc[UR4][R2.64] ;   /* 0x0000000402047981 */
        /*00a0*/              @!P0 LDG.E.128.STRONG.GPU R8, desc[UR4][R2.64] ;
        /*00b0*/               @P1 LDG.E R9, desc[UR4][R6.64] ;
        /*00c0*/                   LDG.E.STRONG.SYS R10, desc[UR4][R6.64] ;
        /*00d0*/                   STL [R1+0x10], R4 ;
        /*00e0*/                   LDL R5, [R1+0x10] ;
        /*00f0*/                   LDL.64 R6, [R1+0x18] ;
        /*0100*/                   FFMA R1, R2, R3, R4 ;
"""
    c = rr.sass_counts(sass)
    assert (c["ldg_128"], c["ldg_narrower"], c["ldg_narrower_weak"]) == (2, 2, 1)
    assert (c["ldl"], c["stl"], c["instructions"]) == (2, 1, 8)


def test_shared_load_blocks_split_at_branches():
    """Basic blocks start at branch targets and after a branch; only blocks of >= STREAM_BLOCK_LDS shared loads
    (the GEMV chunk blocks) are listed."""
    lds = "".join(f"        /*{0x100 + 16 * i:04x}*/                   LDS R{i}, [R2] ;\n" for i in range(20))
    sass = ("        /*0000*/                   MOV R1, R2 ;\n" + lds +
            "        /*0240*/               @P0 BRA 0x280 ;\n" + lds.replace("/*01", "/*05").replace("/*02", "/*06") +
            "        /*0280*/                   LDS R3, [R2] ;\n")
    assert rr.shared_load_blocks(sass) == [20, 20]
    assert rr.sass_counts(sass)["shared_load_blocks"] == [20, 20]
    # a function the kernel calls is placed after it: its blocks are not the kernel's
    called = lds.replace("/*01", "/*09").replace("/*02", "/*0a")
    sass = sass.replace("/*0280*/                   LDS", "/*0280*/                   CALL.REL.NOINC 0x900 ;\n"
                        "        /*0290*/                   EXIT ;\n        /*02a0*/                   LDS") + called
    assert rr.shared_load_blocks(sass) == [20, 20]


def test_exposed_loads_are_the_loads_read_right_away_by_source_line():
    """A load read within the window counts (also through the high register of a 64-bit load and as a store's
    address); one read later, or overwritten before any read, does not."""
    def ins(addr, text):
        return f"        /*{addr:04x}*/                   {text} ;\n"
    f = '\t//## File "/src/kog/engine/kernel/{}", line {}\n'
    filler = "".join(ins(0x300 + 16 * i, "IADD3 R90, R91, R92, RZ") for i in range(20))
    sass = (f.format("sync.py", 104) + ins(0x000, "LDG.E R14, desc[UR36][R14.64]")
            + f.format("sync.py", 105) + ins(0x010, "IMAD R52, R14, UR27, RZ")
            + f.format("tasks.py", 56) + ins(0x020, "LDG.E.64 R50, desc[UR36][R48.64]")
            + f.format("tasks.py", 57) + ins(0x030, "STG.E desc[UR36][R50.64], R9")
            + ins(0x040, "LDG.E R20, desc[UR36][R2.64]") + filler + ins(0x200, "FADD R21, R20, R20")
            + ins(0x210, "LDG.E R30, desc[UR36][R2.64]") + ins(0x220, "MOV R30, RZ") + ins(0x230, "FADD R31, R30, R30")
            + ins(0x240, "LDG.E.64 R40, desc[UR36][R2.64]") + ins(0x250, "FADD R44, R41, R41"))
    got = {(e["load"], e["use"]): e["count"] for e in rr.exposed_loads(sass)}
    assert got == {("sync.py:104", "sync.py:105"): 1, ("tasks.py:56", "tasks.py:57"): 1,   # a store's address
                   ("tasks.py:57", "tasks.py:57"): 1}                                       # R41 of LDG.E.64 R40


def test_set_parsing_and_usage_errors():
    assert rr.parse_sets(["ctas_per_sm=4", "mode=grid", "wait-timeout-s=1.5"]) == \
        {"ctas_per_sm": 4, "mode": "grid", "wait_timeout_s": 1.5}
    for bad in (["nope=1"], ["ctas_per_sm"], ["num_warps=four"]):
        with pytest.raises(rr.UsageError):
            rr.parse_sets(bad)
    # a usage error is one line and exit 2, decided before any compile
    assert rr.main(["--model", "tiny", "--set", "bn_lm=3"]) == 2


@pytest.mark.skipif(not _ptxas_runs(), reason="the ptxas of the triton wheel cannot run here")
def test_compiles_tiny_for_sm90_without_a_gpu(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "kog.engine.regreport", "--model", "tiny", "--json", "--sass",
                        "--exposed", "--keep", str(tmp_path)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert 0 < rep["registers"] <= 255
    assert rep["maxnreg"] == 255 and rep["grid"] == 132 * 2
    assert min(rep["spill_store_bytes"], rep["spill_load_bytes"], rep["stack_frame_bytes"]) >= 0
    assert rep["triton_n_spills"] == rep["stack_frame_bytes"] // 4
    assert 1 <= rep["ctas_per_sm_fit"] <= 16 and rep["shared_bytes"] >= 0
    assert rep["compile_seconds"] > 0
    # a counter poll's result is compared right away: the wait's own round trip, by its source line
    assert any(e["load"].startswith("vendor.py:") and e["use"].startswith("sync.py:") for e in rep["exposed_loads"])
    assert rep["constexprs"]["H"] == 64 and rep["constexprs"]["VENDOR"] == 1
    assert rep["sass"]["ldg_128"] > 0 and rep["sass"]["instructions"] > 1000
    assert ".target sm_90a" in (tmp_path / "monokernel.ptx").read_text()
    assert "Used" in (tmp_path / "ptxas.log").read_text()


@pytest.mark.skipif(not _ptxas_runs(), reason="the ptxas of the triton wheel cannot run here")
def test_top_p_compiles_the_gemv_loops_as_greedy_does():
    """The top-k / top-p search is a call (sampling.filtered_pick): inlined, ptxas laid out every GEMV chunk
    loop of the kernel differently from greedy's (each chunk block of 74 shared loads split at branches around
    the reduction's stores: 64 + 10), and top-p streamed slower on the H200 (docs/engine-notes.md). llama-3.2-1b's
    sm_90 config: the top-p variant's chunk blocks are greedy's."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    blocks = []
    for sampling in ([], ["--temperature", "0.8", "--top-p", "0.9"]):
        r = subprocess.run([sys.executable, "-m", "kog.engine.regreport", "--model", "llama-3.2-1b", "--max-seq",
                            "384", "--json", "--sass", *sampling], capture_output=True, text=True, env=env,
                           timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        blocks.append(json.loads(r.stdout)["sass"]["shared_load_blocks"])
    assert len(blocks[0]) >= 4 and blocks[1] == blocks[0], blocks


@pytest.mark.skipif(not _ptxas_runs(), reason="the ptxas of the triton wheel cannot run here")
def test_a_long_cache_compiles_without_spills():
    """llama-3.1-8b's sm_90 config (the report's default base) over a 4,096-position cache (the API's default:
    64 attention splits): the merge folds the splits' partials in groups (attention.COMBINE_SPLITS), so the
    kernel keeps every value in registers, as it does for the bench's 640 positions (one [64, 4, 128] merge
    tile spilled 608 bytes)."""
    from kog.engine.engine_config import sm90_default
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-m", "kog.engine.regreport", "--model", "llama-3.1-8b", "--max-seq", "4096",
                        "--tokens", "256", "--json"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout)
    assert rep["engine_config"] == sm90_default(preset("llama-3.1-8b"), 4096).to_dict()
    assert rep["constexprs"]["SP"] == 64 and rep["constexprs"]["RING"] > 0
    assert rep["spill_store_bytes"] == 0 and rep["spill_load_bytes"] == 0
