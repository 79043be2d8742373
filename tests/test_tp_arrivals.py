"""The TP monokernel's synchronisation, emulated on the REAL per-rank tables (bench/tp_emulate.py): the
attention arrival rule. An attention split with no cached positions yet skips its qkv wait and arrives at
once; with one arrival counter per KV head shared by all layers, such an early arrival of layer l+1 took the
previous layer's last split's turn (no merge, no release), which is how tests/gpu/test_tp_gpu.py timed out
on two H200s at 2 CTAs/SM. The kernel now counts arrivals per (layer, KV head)."""
import importlib.util
from pathlib import Path

import pytest

from kog.engine.config import PRESETS
from kog.engine.engine_config import EngineConfig

EMU = Path(__file__).resolve().parents[1] / "bench" / "tp_emulate.py"


@pytest.fixture(scope="module")
def emu():
    spec = importlib.util.spec_from_file_location("tp_emulate", EMU)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ranks(emu, cps):
    cfg = PRESETS["tiny"].replace(hidden_size=512, intermediate_size=1024, num_heads=8, num_kv_heads=4,
                                  head_dim=64, vocab_size=4096, num_layers=4, eos_token_id=())
    e = EngineConfig(block_k=256, bn_qkv=8, bn_o=8, bn_gate_up=8, bn_down=8, bn_lm=8, ctas_per_sm=cps)
    return emu.build(cfg, e, 2, 132, 128, 256)


def test_per_layer_arrivals_complete_where_shared_ones_deadlock(emu):
    ranks = _ranks(emu, 2)          # 264 CTAs per rank, as on the H200 pair
    old = emu.emulate(ranks, 2, tokens=4, seed=0, pos0=15, old_arrivals=True)
    assert not old[0], "the shared-counter rule should deadlock here (the emulation lost the empty-split path)"
    for seed in range(3):
        ok, stuck, n = emu.emulate(ranks, 2, tokens=4, seed=seed, pos0=15)
        assert ok, f"seed {seed}: {n} CTAs stuck, e.g. {stuck[:3]}"
