"""CPU diagnosis: emulate the TP monokernel's synchronisation with the REAL per-rank kernel tables (task table,
counter targets, rows per counter, flags) built as on an H200 (132 SMs), CTAs interleaved at random: waits,
deferred releases (flush when the release counter changes), attention arrivals and last-arriver merges,
exchange pushes/reduces, the token hand-off. A stall with work left would be a deadlock in the tables.

    python bench/tp_emulate.py

Result (2026-11-29): the configuration whose GPU test times out (tiny llama, hidden 512, G=2, 2 CTAs/SM) runs
to completion here for every seed, as does 1 CTA/SM: the timeout is not in the plan or the tables (see
bench/h200x4/TP_NOTES.md). Keep the emulated semantics in step with engine/kernel.py if you extend it."""
import os, sys, random
os.environ["TRITON_INTERPRET"] = "1"
import numpy as np, torch
from kog.engine.config import PRESETS
from kog.engine.engine_config import EngineConfig
from kog.engine import tp_monokernel as tm
from kog.engine.plan import make_plan
from kog.engine.tp import shard_config, tp_shape

def build(cfg, e, G, sms, max_seq, xr):
    owner = object.__new__(tm.TPMonokernel)
    owner.cfg, owner.G, owner.ecfg, owner.pad_vocab = cfg, G, e, False
    owner.shape = tp_shape(cfg, G, False); owner.exchange_rows = xr; owner._plans = {}
    shard = shard_config(cfg, G, False)
    ranks = []
    for r in range(G):
        k = object.__new__(tm._Rank)
        k._owner, k.rank = owner, r
        k.cfg, k.ecfg, k.vendor, k.device, k.sms = shard, e, 1, torch.device("cpu"), sms
        k.max_seq = max_seq
        k.attn_splits = -(-max_seq // e.attn_block)
        k.plan = make_plan(shard, e, sms, None, k.attn_splits)
        k.trace_tokens = 0
        k._woff_np = np.zeros((shard.num_layers + 1, 8), dtype=np.int64)
        k.wbuf = torch.zeros(1, dtype=torch.bfloat16)
        k._alloc()
        ranks.append(k)
    return ranks

def emulate(ranks, G, tokens=2, seed=0, max_steps=10_000_000, pos0=None, old_arrivals=False):
    """pos0: cache position of the launch's first token (None: every split has positions, as before);
    splits with p0 > pos skip the qkv wait, as the kernel does. old_arrivals: one arrival counter per KV head
    across layers (the kernel before the fix) instead of one per (layer, KV head)."""
    rng = random.Random(seed)
    xl = ranks[0]._xl
    L = ranks[0].cfg.num_layers
    H, I = ranks[0].cfg.hidden_size, ranks[0].cfg.intermediate_size
    QS = ranks[0].cfg.q_size
    G_ = ranks[0].cfg.num_heads // ranks[0].cfg.num_kv_heads
    HD = ranks[0].cfg.head_dim
    KVS = ranks[0].cfg.num_kv_heads * HD
    XR = xl.exchange_rows
    NKV = ranks[0].cfg.num_kv_heads
    BT = ranks[0].ecfg.attn_block
    st = []
    for k in ranks:
        tab = k.tasks.numpy(); cs = k.plan.cta_start; tgt = k.target.numpy(); rpc = k.rpc.numpy()
        st.append(dict(tab=tab, cs=cs, tgt=tgt, rpc=rpc, cnt=np.zeros(len(tgt), np.int64),
                       flags=np.zeros(xl.n_flags + 1, np.int64), arr=np.zeros(4096, np.int64), tok=0, done=0,
                       grid=k.plan.grid, S=k.attn_splits, dummy=k.dummy_base,
                       ctas=[dict(step=0, ti=None, pend_idx=-1, pend_n=0, started=False, fin=False, ph=0)
                             for _ in range(k.plan.grid)]))
    def rows_ready(s, cb, R, r0, r1, t1):
        for c in range(r0 // R, (r1 - 1) // R + 1):
            if s["cnt"][cb + c] < s["tgt"][cb + c] * t1:
                return False, cb + c
        return True, None
    live = [(r, c) for r in range(G) for c in range(st[r]["grid"])]
    steps = 0
    while live and steps < max_steps:
        steps += 1
        progressed = False
        rng.shuffle(live)
        for (r, c) in list(live):
            s = st[r]; cta = s["ctas"][c]; t1 = cta["step"] + 1
            if cta["ti"] is None:                      # token start: wait S_TOK >= step
                if s["tok"] < cta["step"]:
                    continue
                cta["ti"] = s["cs"][c]; cta["pend_idx"] = -1; cta["pend_n"] = 0; cta["ph"] = 0
                progressed = True
            lo, hi = s["cs"][c], s["cs"][c + 1]
            ti = cta["ti"]
            if ti < hi:
                row = s["tab"][ti]; typ, layer, tile, aux, woff, lines, rel, cb = (int(v) for v in row)
                if cta["ph"] == 0:                     # flush if the release counter changes
                    if rel != cta["pend_idx"]:
                        if cta["pend_n"] > 0 and cta["pend_idx"] >= 0:
                            s["cnt"][cta["pend_idx"]] += cta["pend_n"]
                        cta["pend_idx"], cta["pend_n"] = rel, 0
                    cta["ph"] = 1
                    progressed = True
                ok = True; why = None
                rpc = s["rpc"]
                if typ == 0:   ok, why = rows_ready(s, cb, rpc[4], 0, H, t1)
                elif typ == 1 and pos0 is not None and (tile % s["S"]) * BT > pos0 + cta["step"]:
                    ok = True                           # an empty split: no wait in the kernel
                elif typ == 1:
                    g = tile // s["S"]
                    for (a, b) in ((g * G_ * HD, (g + 1) * G_ * HD), (QS + g * HD, QS + (g + 1) * HD),
                                   (QS + KVS + g * HD, QS + KVS + (g + 1) * HD)):
                        ok, why = rows_ready(s, cb, rpc[0], a, b, t1)
                        if not ok: break
                elif typ == 2: ok, why = rows_ready(s, cb, rpc[1], 0, QS, t1)
                elif typ == 3: ok, why = rows_ready(s, cb, rpc[2], 0, H, t1)
                elif typ == 4: ok, why = rows_ready(s, cb, rpc[3], 0, I, t1)
                elif typ == 5: ok, why = rows_ready(s, cb, rpc[4], 0, H, t1)
                elif typ == 7: ok, why = rows_ready(s, cb, rpc[5 + aux], tile * XR, (tile + 1) * XR, t1)
                elif typ == 8:
                    f = int(row[4])
                    ok = s["flags"][f] >= t1 * G; why = ("flag", f)
                    if ok: ok, why = rows_ready(s, cb, rpc[4 - 2 * aux], tile * XR, (tile + 1) * XR, t1)
                if not ok:
                    cta["why"] = (typ, layer, tile, aux, why); continue
                # effects
                if typ in (0, 2, 3, 4, 8): cta["pend_n"] += 1
                elif typ == 1:
                    g = tile // s["S"]
                    if old_arrivals:
                        old = s["arr"][g]; s["arr"][g] += 1
                        last = old == (cta["step"] * L + layer + 1) * s["S"] - 1
                    else:
                        a = layer * NKV + g; old = s["arr"][a]; s["arr"][a] += 1
                        last = old == (cta["step"] + 1) * s["S"] - 1
                    if last: cta["pend_n"] += 1
                elif typ == 7:
                    f = int(row[4])
                    for p in range(G): st[p]["flags"][f] += 1
                cta["ti"] += 1; cta["ph"] = 0; progressed = True
                continue
            # end of token
            if cta["ph"] != 9:
                if cta["pend_n"] > 0 and cta["pend_idx"] >= 0:
                    s["cnt"][cta["pend_idx"]] += cta["pend_n"]; cta["pend_n"] = 0
                old = s["done"]; s["done"] += 1
                cta["last"] = old == t1 * s["grid"] - 1
                cta["ph"] = 9
                if cta["last"]:
                    for p in range(G): st[p]["flags"][xl.sample_flag] += 1
                progressed = True
            if cta["last"]:
                if st[r]["flags"][xl.sample_flag] < t1 * G:
                    cta["why"] = ("sample flag",); continue
                s["tok"] = t1
            cta["step"] += 1; cta["ti"] = None; cta["ph"] = 0; cta["last"] = False; progressed = True
            if cta["step"] >= tokens:
                live.remove((r, c))
        if not progressed:
            stuck = [(r, c, st[r]["ctas"][c].get("why")) for (r, c) in live]
            return False, stuck[:12], len(stuck)
    return True, None, 0

if __name__ == "__main__":
    cfg = PRESETS["tiny"].replace(hidden_size=512, intermediate_size=1024, num_heads=8, num_kv_heads=4, head_dim=64,
                                  vocab_size=4096, num_layers=4, eos_token_id=())
    for cps in (2, 1):
        e = EngineConfig(block_k=256, bn_qkv=8, bn_o=8, bn_gate_up=8, bn_down=8, bn_lm=8, ctas_per_sm=cps)
        ranks = build(cfg, e, 2, 132, 128, 256)
        for seed in range(3):
            # the GPU test's launch: 16-token prompt -> first decode position 15, so with 32-position blocks
            # splits 1-3 of every head are empty for the first tokens
            for old in (True, False):
                ok = emulate(ranks, 2, tokens=4, seed=seed, pos0=15, old_arrivals=old)
                print(f"{cps} CTAs/SM seed {seed} {'old' if old else 'new'} arrivals: "
                      f"{'completes' if ok[0] else 'DEADLOCK'} {'' if ok[0] else ok[1][:3]}")

def debug():
    cfg = PRESETS["tiny"].replace(hidden_size=512, intermediate_size=1024, num_heads=8, num_kv_heads=4, head_dim=64,
                                  vocab_size=4096, num_layers=4, eos_token_id=())
    e = EngineConfig(block_k=256, bn_qkv=8, bn_o=8, bn_gate_up=8, bn_down=8, bn_lm=8, ctas_per_sm=1)
    ranks = build(cfg, e, 2, 132, 128, 256)
    k = ranks[0]
    tab = k.tasks.numpy()
    print('attn rows', tab[tab[:, 0] == 1][:4].tolist())
    print('S', k.attn_splits, 'rpc', k.rpc.tolist(), 'targets', k.target[:12].tolist())
    print('qkv rows', tab[tab[:, 0] == 0][:2].tolist())
