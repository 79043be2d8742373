"""Device bisect of the 2-GPU tiny-model TP timeout (tests/gpu/test_tp_gpu.py), one subprocess per variant (a
timeout in one cannot take the others down): python3 bench/tp_bisect.py -> $OUT/tp_bisect.json.
Result on nvidia-h200-x2 (bench/h200x2/tp_bisect_2026-11-29.json): fails at 2 CTAs/SM (264 CTAs) with hidden 512,
whether or not the single-GPU engine ran first, for max_seq 128 or 640 and block_k 256 or 512; passes with
1 CTA/SM, with G=1, and with hidden 2048 (and the llama-3.2-1b / qwen3-1.7b presets in bench/tp_check.py)."""
import json, os, subprocess, sys, time
os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
BODY = r"""
import json, torch, sys
from kog.engine.config import PRESETS
from kog.engine.engine_config import EngineConfig
from kog.engine.monokernel import Monokernel
from kog.engine.reference import Reference
from kog.engine.tp_monokernel import TPMonokernel
from kog.engine.weights import random_weights
v = json.loads(sys.argv[1])
cfg = PRESETS["tiny"].replace(hidden_size=v.get("H", 512), intermediate_size=v.get("I", 1024), num_heads=8, num_kv_heads=4,
                              head_dim=64, vocab_size=4096, num_layers=v.get("L", 4), eos_token_id=())
w = random_weights(cfg, "cuda:0", seed=5, dtype=torch.bfloat16)
prompt = list(range(7, 23))
ref = Reference(cfg, w, v.get("max_seq", 128)).greedy(prompt, 24)
e = EngineConfig(**v.get("e", dict(block_k=256, bn_qkv=8, bn_o=8, bn_gate_up=8, bn_down=8, bn_lm=8)), max_spin=2_000_000)
if v.get("single", True):
    one = Monokernel(cfg, w, e, max_seq=v.get("max_seq", 128)); t1, _ = one.generate(prompt, 24)
else:
    t1 = None
tp = TPMonokernel(cfg, w, v.get("G", 2), e, devices=[f"cuda:{i}" for i in range(v.get("G", 2))], max_seq=v.get("max_seq", 128),
                  exchange_rows=v.get("xr"))
t2, _ = tp.generate(prompt, 24)
print("RESULT", json.dumps({"ok": True, "tp": t2, "single": t1, "ref": ref}))
"""
variants = [
    {}, {"single": False}, {"max_seq": 640}, {"e": dict(block_k=512, bn_qkv=8, bn_o=8, bn_gate_up=8, bn_down=8, bn_lm=8)},
    {"e": dict(block_k=256, bn_qkv=8, bn_o=8, bn_gate_up=8, bn_down=8, bn_lm=8, ctas_per_sm=1)},
    {"G": 1}, {"H": 2048, "I": 4096},
]
out = []
for v in variants:
    t0 = time.time()
    env = dict(os.environ); env.pop("TRITON_INTERPRET", None)
    try:
        p = subprocess.run([sys.executable, "-c", BODY, json.dumps(v)], capture_output=True, text=True, timeout=90, env=env)
        line = [l for l in p.stdout.splitlines() if l.startswith("RESULT")]
        r = json.loads(line[-1][7:]) if line else {"ok": False, "err": (p.stderr or "")[-600:]}
    except subprocess.TimeoutExpired:
        r = {"ok": False, "err": "timeout 90 s"}
    r["variant"], r["s"] = v, round(time.time() - t0, 1)
    out.append(r)
    print(json.dumps(r)[:700], flush=True)
    json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "tp_bisect.json"), "w"), indent=1)
