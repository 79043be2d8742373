"""Device script: how close the engine's own weight stream gets to the copy rate with no dependencies, against
the real engine in the same run (issue 24's "the stream itself").

For each preset: the device copy rate (bytes read + written) and a streaming read's (one pass over 2 GiB,
bytes read), then three engines on the same random bf16 weights and config (kog.tune.store.tuned_config):
targeted, grid, and `free` = grid mode's plan with its barriers taken out. `free` runs every task of the
token in the same order through the same ring and the same GEMV code with nothing ordering the phases (its
output is garbage); what still waits is attention's poll of its q / k / v words and the token's hand-off.
So free's tok/s is the ceiling of this kernel's stream; the gap from it to targeted is what the
dependencies cost, and the gap from it to the copy rate is what the stream itself loses. An instrumented
run of `free` and of targeted gives each phase's seconds a token against its weight bytes at the copy rate.

python3 bench/stream_ceiling.py OUT.json [--presets llama-3.2-1b ...]    (KOG_GIT_COMMIT names the commit)
Writes OUT.json after every preset (a timeout keeps what ran).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time

import numpy as np
import torch

from kog.engine.config import DTYPE_BYTES, PRESETS
from kog.engine.monokernel import Monokernel
from kog.engine.plan import T_BAR, Plan, make_plan, task_rows
from kog.engine.weights import random_weights
from kog.provenance import git_commit
from kog.tune.bench import copy_bandwidth_GBps
from kog.tune.store import tuned_config

PROMPT, NEW, RUNS, MAX_SEQ, TRACE_TOKENS, TRACED = list(range(100, 164)), 256, 5, 384, 8, 32


def without_barriers(plan: Plan, cfg, ecfg) -> Plan:
    """`plan` (grid mode), changed in place: every barrier task removed, each CTA's other tasks in their order,
    the task table rebuilt."""
    keep = plan.tasks[:, 0] != T_BAR
    per_cta = [int(keep[plan.cta_start[c]:plan.cta_start[c + 1]].sum()) for c in range(plan.grid)]
    plan.tasks = plan.tasks[keep]
    plan.cta_start = np.concatenate([[0], np.cumsum(per_cta)]).astype(np.int32)
    plan.rows = task_rows(plan, cfg, ecfg)
    return plan


class FreeStream(Monokernel):
    """The monokernel in grid mode without its barriers: a measurement of the stream, never an engine."""

    def _make_plan(self, sms: int, sm_partition) -> Plan:
        assert self.ecfg.mode == "grid"
        return without_barriers(make_plan(self.cfg, self.ecfg, sms, sm_partition, self.attn_splits), self.cfg,
                                self.ecfg)


def read_GBps(nbytes: int = 2 << 30, iters: int = 10) -> float:
    """A streaming read of nbytes by every SM (kogprobe's read probe, kog.probe.probes.bandwidth.launch_read:
    each CTA sums its chunks, nothing written back), bytes read per second / 1e9, median of CUDA-event timings.
    A torch reduction is no better a reader than the copy; this is the probe the scan's read figure comes from."""
    from kog.probe.probes.bandwidth import CTAS_PER_SM, launch_read
    from kog.probe.probes.common import cuda_time_ms
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x = torch.rand(nbytes // 4, dtype=torch.float32, device="cuda")
    grid = CTAS_PER_SM * sms
    out = torch.zeros(grid, dtype=torch.float32, device="cuda")
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    ms = cuda_time_ms(lambda: launch_read(x, out, counter, sms, grid, True), iters, 2)
    del x
    torch.cuda.empty_cache()
    return nbytes / (ms * 1e-3) / 1e9


def phase_bytes(cfg) -> dict[str, float]:
    """Weight bytes a token streams per phase (the breakdown's phase names)."""
    es = DTYPE_BYTES.get(cfg.dtype, 2)
    out: dict[str, float] = {}
    for name, n, k in cfg.matrices():
        ph = name.rsplit(".", 1)[-1] if name.startswith("layers.") else "lm"
        out[ph] = out.get(ph, 0.0) + n * k * es
    return out


def time_engine(mk) -> dict:
    mk.generate(PROMPT, NEW)
    runs = [NEW / mk.generate(PROMPT, NEW)[1] for _ in range(RUNS)]
    return {"tok_per_s": statistics.median(runs), "runs": runs}


def phase_table(mk, pb: dict, copy: float) -> dict:
    b = mk.breakdown(PROMPT, TRACED)
    ph = {p: {"us_per_token": round(d["seconds_per_token"] * 1e6, 2),
              "waiting_us": round((d.get("waiting") or 0.0) * 1e6, 2),
              "at_copy_us": round(pb[p] / (copy * 1e9) * 1e6, 2) if p in pb else None}
          for p, d in b["phases"].items()}
    return {"seconds_per_token_traced": b.get("seconds_per_token_traced"),
            **{c: round(b[c] * 1e6, 2) for c in ("streaming", "waiting", "barrier", "other") if b.get(c) is not None},
            "phases": ph}


def run_preset(name: str) -> dict:
    cfg = PRESETS[name].replace(eos_token_id=())
    w = random_weights(cfg, "cuda", seed=0, dtype=torch.bfloat16)
    base = tuned_config(cfg, torch.device("cuda"), MAX_SEQ)
    copy = copy_bandwidth_GBps(torch.device("cuda"))
    limit = copy * 1e9 / cfg.weight_bytes_per_token()
    pb = phase_bytes(cfg)
    out = {"config": dataclasses.asdict(base), "copy_GBps": copy,
           "read_GBps": read_GBps(), "limit_tok_per_s": limit, "weight_bytes_per_token": cfg.weight_bytes_per_token()}
    for label, cls, mode in (("free", FreeStream, "grid"), ("targeted", Monokernel, "targeted"),
                             ("grid", Monokernel, "grid")):
        t0 = time.time()
        mk = cls(cfg, w, base.replace(mode=mode), torch.device("cuda"), max_seq=MAX_SEQ,
                 trace_tokens=TRACE_TOKENS if label != "grid" else 0)
        mk.n_eos = 0
        r = time_engine(mk)
        r["of_limit"] = r["tok_per_s"] / limit
        if label != "grid":
            r["breakdown_us"] = phase_table(mk, pb, copy)
        r["seconds"] = round(time.time() - t0, 1)
        out[label] = r
        print(name, label, round(r["tok_per_s"], 1), f"{r['of_limit']:.1%}", flush=True)
        del mk
        torch.cuda.empty_cache()
    out["targeted_over_free"] = out["targeted"]["tok_per_s"] / out["free"]["tok_per_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--presets", nargs="+", default=["llama-3.2-1b"])
    a = ap.parse_args()
    doc = {"device": torch.cuda.get_device_name(), "git_commit": git_commit(), "prompt_tokens": len(PROMPT),
           "new_tokens": NEW, "max_seq": MAX_SEQ, "runs": RUNS,
           "note": "free = grid mode without barriers (the stream alone); tok/s medians of RUNS launches; "
                   "phases from an instrumented run of TRACED tokens (us a token, CTA-averaged)", "presets": {}}
    for name in a.presets:
        doc["presets"][name] = run_preset(name)
        with open(a.out, "w") as f:
            json.dump(doc, f, indent=1, default=str)


if __name__ == "__main__":
    main()
