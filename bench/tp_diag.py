"""Device diagnosis of the 2-GPU tiny-model TP timeout (tests/gpu/test_tp_gpu.py): after the timeout, read every
rank's counters, sync words and error record (the host can: the kernel aborted, it did not hang)."""
import json, os, sys
os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
import torch
from kog.engine.config import PRESETS
from kog.engine.engine_config import EngineConfig
from kog.engine.tp_monokernel import TPMonokernel
from kog.engine.weights import random_weights
out = {}
for cps in (2, 1):
    cfg = PRESETS["tiny"].replace(hidden_size=512, intermediate_size=1024, num_heads=8, num_kv_heads=4, head_dim=64,
                                  vocab_size=4096, num_layers=4, eos_token_id=())
    w = random_weights(cfg, "cuda:0", seed=5, dtype=torch.bfloat16)
    e = EngineConfig(block_k=256, bn_qkv=8, bn_o=8, bn_gate_up=8, bn_down=8, bn_lm=8, max_spin=200_000, ctas_per_sm=cps)
    tp = TPMonokernel(cfg, w, 2, e, devices=["cuda:0", "cuda:1"], max_seq=128)
    r = {}
    try:
        toks, _ = tp.generate(list(range(7, 23)), 4)
        r["ok"] = toks
    except Exception as ex:
        r["error"] = str(ex)[:800]
    for k, mk in enumerate(tp.ranks):
        r[f"rank{k}"] = {"cnt": mk.cnt[:40].tolist(), "target": mk.target[:40].tolist(),
                         "sync": mk.sync[:8].tolist(), "arr": mk.sync[1024:1024 + 4].tolist(), "err": mk.err.tolist(),
                         "grid": mk.plan.grid, "regs": getattr(mk, "kernel_regs", None),
                         "max_ctas_per_sm": getattr(mk, "max_ctas_per_sm", None),
                         "flags": tp.bufs[k]["flags"].view(-1)[::32][:12].tolist()}
    out[f"cps{cps}"] = r
    print(json.dumps(r)[:3000], flush=True)
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "tp_diag.json"), "w"), indent=1)
