"""Device script: can Triton 3.6's software pipeliner keep Llama-3.2-1B's weights in flight ACROSS task
boundaries, when each CTA walks ONE flat loop over all its (task, k-chunk) chunks?

    python3 bench/stream_pipelined.py [--deadline SECONDS]    # on the H200: JSON to $OUT/stream_pipelined.json
    python3 bench/stream_pipelined.py --compile-only           # no GPU: sm_90 compile report of B and C

Kernels (same weights and phases as shared/anchors/stream_ceiling.py: per layer qkv, o, gate_up, down, then
the LM head; bf16 random weights in one buffer, random bf16 x):
  A  the anchor's register kernel, copied (tile loop -> k loop; loads drain at every task boundary).
  B  flat pipelined: the host lists each CTA's chunks (tasks round-robin per phase, like the anchor) in an
     int32 table, 4 words a chunk: weight offset/64, K/64 | (k0/64)<<8, flags | phase<<8, output row.
     The kernel is one `for c in tl.range(c_lo, c_hi, num_stages=S)` per pass: table words (scalars), the
     [BN, BK] weight chunk, the x chunk, acc = where(first, 0, acc) + sum(w*x, 1), `if last: store`.
  C  B plus a grid barrier per phase: at a CTA's first chunk of a phase it waits with ONE inline-asm PTX
     loop (bounded ld.acquire.gpu spin) on the previous phase's arrival counter; after its last chunk of a
     phase it arrives. CTAs without a task in a phase get one dummy chunk (no store) so every CTA arrives.

Release: one inline asm `bar.sync 0; thread 0: red.release.gpu.global.add.s32 [cnt], 1`. The bar.sync
makes every thread's y stores happen-before thread 0's release (release is cumulative over what the
releasing thread has observed, and bar.sync is that observation), the same pattern as cooperative groups'
grid sync. Per-thread release atomics would be correct too, but 128-256 atomics per CTA per phase on one
word (33k+ per phase at 264 CTAs) would serialize in L2. tl.debug_barrier would also be correct but it
disables the pipeliner (gpu.barrier in the loop); the asm bar.sync is opaque to it. The wait: every
thread spins itself (ld.acquire.gpu), so every thread has its own acquire before its x loads: no barrier
after the wait is needed. The spin returns the last value: < target -> the CTA writes an error word
(global phase + 1) and stops waiting for later phases (never hangs: max_spin polls, default 2e6).

x in C: a plain tl.load of x would be a pipelining candidate (>= 32 bits contiguous per thread) and be
copied S-1 chunks ahead, i.e. above the wait of its phase (stale activations in a real engine). XMODE
chooses how x is loaded: 0 plain tl.load, 1 tl.load(volatile=True), 2 inline-asm ld.relaxed.gpu (b32 of
two bf16). The compile report shows which ones the pipeliner turns into async copies.

PACKED=1 (device grid runs both): the weights copied chunk-major (chunk c's tile at c*BN*BK, the order the
CTAs read them), so the weight address depends on c only, not on a table word.

FINDINGS of --compile-only (Triton 3.6, GPUTarget("cuda", 90, 32), CPU machine; GPU numbers: see the JSON):
- B's weight load IS pipelined for S >= 3: ttg.async_copy_global_to_local of the [BN, BK] tile, 16-byte
  cp.async.cg, async_wait in the flat loop, prologue before it. The ring holds S-1 tiles (w_bufs 2 at S=3,
  3 at S=4, 5 at S=6): up to S-1 chunks in flight while one is reduced, across task boundaries. The four
  table words are pipelined too (4-byte cp.async.ca, one stage earlier: the weight load is "indirect").
  PACKED does not deepen the ring (still S-1). S=1: plain 16-byte ld.global.v4 (no smem ring).
- K and k0 must be visibly multiples of 64 ((word & 255) * 64): with K straight from a table the row stride
  has unknown divisibility and the loads are 2 bytes wide, which the pipeliner refuses (< 32 bits). The
  copied anchor kernel A has exactly that: 64 ld.global.b16 per k-step (its K is a loaded int64).
- regs/smem (4 warps unless said): B S=3 BN8 BK512 56 regs 18.5 KB; S=4 64 regs 27.8 KB; BN8 BK1024 S=3
  68 regs 37 KB, S=4 70 regs 55 KB; BN16 BK1024 8 warps S=3 80 regs (8 B spill) 70 KB, S=4 89 regs 105 KB;
  packed BN16 BK1024 gets 150-180 regs (1 CTA/SM). C XMODE2: S=3 BN8 BK512 48 regs 16.5 KB; S=4 64 regs
  24.7 KB; BN16 BK1024 S=4 80 regs (20 B spill) 99 KB. A: 133 regs (3 CTAs/SM by registers).
- C, first version (spin asm inside `if first-of-phase`, x loaded after it): the pipeliner's scheduler put
  the x load of an iteration ABOVE that iteration's spin scf.if (it reorders top-level ops of one iteration
  into clusters; side effects of inline asm do not pin the order). A plain or volatile=True x tl.load also
  became a cp.async issued S-1 chunks ahead (volatile does not stop the pipeliner). Fix used here: the spin
  asm is unconditional (the wait is predicated inside the asm by an operand) and has a 2nd output, an
  opaque 0 that the x address adds; the data dependency keeps the x load below the wait, and a load whose
  address comes from the asm is not pipelined (XMODE 0/1 then compile to plain ld.global, XMODE 2 to the
  inline-asm ld.relaxed.gpu.b32). The arrive asm is nested inside the store's `if last` region (program
  order inside a region is kept). Verified in the TTGIR: spin -> x load -> reduce -> store -> arrive, and
  the weight cp.async of later chunks (other phases too) issued before the spin, which is the point.
- the spin asm (labels in { }) and the bar.sync/red.release arrive assemble with the wheel's ptxas.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

import numpy as np

import triton
import triton.language as tl

H, I, L, V = 2048, 8192, 16, 128256
QKV = (32 + 2 * 8) * 64


def llama_phases(layers: int = L, h: int = H, i: int = I, v: int = V, qkv: int = QKV) -> list[tuple[int, int]]:
    ph = []
    for _ in range(layers):
        ph += [(qkv, h), (h, h), (2 * i, h), (h, i)]
    ph.append((v, h))
    return ph


# ---- kernel A: the anchor's register kernel, copied ----------------------------------------------------------

@triton.jit
def stream(w_ptr, x_ptr, y_ptr, tab_ptr, cnt_ptr, n_phases, passes,
           BN: tl.constexpr, BK: tl.constexpr, SYNC: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    step = 0
    for _ in range(passes):
        for p in range(n_phases):
            off = tl.load(tab_ptr + 3 * p).to(tl.int64)
            N = tl.load(tab_ptr + 3 * p + 1)
            K = tl.load(tab_ptr + 3 * p + 2)
            ntiles = N // BN
            for t in range(pid, ntiles, G):
                rows = t * BN + rn
                acc = tl.zeros([BN], dtype=tl.float32)
                for k0 in tl.range(0, K, BK, num_stages=STAGES):
                    w = tl.load(w_ptr + off + rows[:, None].to(tl.int64) * K + (k0 + rk)[None, :])
                    x = tl.load(x_ptr + k0 + rk)
                    acc += tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
                tl.store(y_ptr + rows, acc)
            if SYNC:
                step += 1
                tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")
                v = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
                while v < step * G:
                    v = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")


# ---- kernels B and C: one flat pipelined loop over the CTA's chunks ------------------------------------------

F_FIRST, F_LAST, F_WAIT, F_ARRIVE, F_DUMMY = 1, 2, 4, 8, 16

# bounded spin, unconditional asm whose wait is predicated by $5 (need): $0 = last value seen (= target when
# no wait was needed), $1 = an opaque 0 that the x address adds (the data dependency that keeps the x load
# below the wait: the pipeliner's scheduler reorders side-effecting ops of one iteration, see FINDINGS),
# $2 = counter address, $3 = target, $4 = max polls. Labels inside { } are local to that block in PTX.
SPIN_PTX = tl.constexpr("{\n.reg .pred %sp;\n.reg .u32 %sn;\nmov.u32 $1, 0;\nmov.u32 $0, $3;\n"
                        "setp.eq.u32 %sp, $5, 0;\n@%sp bra SPIN_DONE;\nmov.u32 %sn, 0;\nSPIN_LOOP:\n"
                        "ld.acquire.gpu.global.b32 $0, [$2];\nsetp.ge.s32 %sp, $0, $3;\n@%sp bra SPIN_DONE;\n"
                        "add.u32 %sn, %sn, 1;\nsetp.lt.u32 %sp, %sn, $4;\n@%sp bra SPIN_LOOP;\nSPIN_DONE:\n}")
# arrive: all threads' earlier stores -> bar.sync -> thread 0's release add at gpu scope
ARRIVE_PTX = tl.constexpr("{\n.reg .pred %ap;\n.reg .u32 %at;\nbar.sync 0;\nmov.u32 %at, %tid.x;\nsetp.eq.u32 %ap, %at, 0;\n"
              "@%ap red.release.gpu.global.add.s32 [$1], 1;\nmov.u32 $0, 0;\n}")


@triton.jit
def _load_x(x_ptr, k0, BK: tl.constexpr, XMODE: tl.constexpr):
    rk = tl.arange(0, BK)
    if XMODE == 0:
        x = tl.load(x_ptr + k0 + rk).to(tl.float32)
    elif XMODE == 1:
        x = tl.load(x_ptr + k0 + rk, volatile=True).to(tl.float32)
    else:
        # x as pairs of bf16 in one b32 word: an inline asm is never a pipelining candidate, and as a
        # side-effecting op it stays below the wait asm
        pair = tl.arange(0, BK // 2)
        wd = tl.inline_asm_elementwise("ld.relaxed.gpu.global.b32 $0, [$1];", "=r,l",
                                       [x_ptr.to(tl.pointer_type(tl.int32)) + k0 // 2 + pair],
                                       dtype=tl.int32, is_pure=False, pack=1)
        lo = (wd << 16).to(tl.float32, bitcast=True)
        hi = (wd & -65536).to(tl.float32, bitcast=True)
        x = tl.reshape(tl.join(lo, hi), [BK])
    return x


@triton.jit
def flat(w_ptr, x_ptr, y_ptr, tab_ptr, start_ptr, cnt_ptr, err_ptr, n_phases, passes, max_spin,
         BN: tl.constexpr, BK: tl.constexpr, S: tl.constexpr, WAIT: tl.constexpr, XMODE: tl.constexpr,
         PACKED: tl.constexpr):
    pid = tl.program_id(0)
    c_lo = tl.load(start_ptr + pid)
    c_hi = tl.load(start_ptr + pid + 1)
    rn = tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros([BN], dtype=tl.float32)
    ok = c_lo * 0 + 1          # 0 after a timed-out wait: stop waiting (never hang)
    for ps in range(passes):
        for c in tl.range(c_lo, c_hi, num_stages=S):
            e = tab_ptr + c * 4
            woff = tl.load(e).to(tl.int64) * 64
            kk = tl.load(e + 1)
            fl = tl.load(e + 2)
            yrow = tl.load(e + 3)
            K = (kk & 255) * 64          # multiples of 64 the compiler can see: 16-byte vector copies
            k0 = (kk >> 8) * 64
            gph = ps * n_phases + (fl >> 8)
            dep = 0
            if WAIT:
                need = (((fl & 4) != 0) & (gph > 0) & (ok == 1)).to(tl.int32)
                v, dep = tl.inline_asm_elementwise(SPIN_PTX, "=r,=r,l,r,r,r",
                                                   [cnt_ptr + tl.maximum(gph - 1, 0), tl.num_programs(0),
                                                    max_spin, need],
                                                   dtype=(tl.int32, tl.int32), is_pure=False, pack=1)
                bad = v < tl.num_programs(0)
                tl.store(err_ptr + pid, gph, mask=bad)
                ok = tl.where(bad, 0, ok)
            if PACKED:
                # chunk-major copy of the weights: the address depends on c only (a direct load)
                w = tl.load(w_ptr + tl.cast(c, tl.int64) * (BN * BK) + (rn[:, None] * BK + rk[None, :]))
            else:
                w = tl.load(w_ptr + woff + (rn[:, None] * K + rk[None, :]))
            x = _load_x(x_ptr + dep, k0, BK, XMODE)
            part = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            acc = tl.where((fl & 1) != 0, 0.0, acc) + part
            if (fl & 2) != 0:
                tl.store(y_ptr + yrow + rn, acc)
                if WAIT:
                    # nested in the store's branch: program order inside a region is kept, while top-level
                    # ops of one iteration may be reordered by the pipeliner's scheduler
                    if (fl & 8) != 0:
                        tl.inline_asm_elementwise(ARRIVE_PTX, "=r,l", [cnt_ptr + gph], dtype=tl.int32,
                                                  is_pure=False, pack=1)


# ---- host: chunk tables ----------------------------------------------------------------------------------------

def build_table(phases, BN: int, BK: int, G: int, dummies: bool):
    """(table int32 [n, 4], start int32 [G+1], y offsets per phase): each CTA's chunks contiguous, in phase
    order, tasks round-robin over CTAs per phase, k chunks of a task consecutive. With dummies, a CTA that
    has no task in a phase gets one chunk that only waits and arrives."""
    cols = {k: [] for k in ("cta", "woff", "kk", "fl", "yrow")}
    woff0 = yoff0 = 0
    ybase = []
    for p, (N, K) in enumerate(phases):
        assert N % BN == 0 and K % BK == 0 and K % 64 == 0 and BK % 64 == 0
        T, nk = N // BN, K // BK
        t = np.repeat(np.arange(T, dtype=np.int64), nk)
        kc = np.tile(np.arange(nk, dtype=np.int64), T)
        cta = t % G
        woff = woff0 + t * BN * K + kc * BK
        fl = np.where(kc == 0, F_FIRST, 0) | np.where(kc == nk - 1, F_LAST, 0) | (p << 8)
        parts = [(cta, woff // 64, (K // 64) | ((kc * BK // 64) << 8), fl, yoff0 + t * BN)]
        if dummies and T < G:
            d = np.arange(T, G, dtype=np.int64)
            z = np.zeros_like(d)
            parts.append((d, z, z + ((BK // 64) & 255), z + (F_FIRST | F_LAST | F_DUMMY | (p << 8)), z - 1))
        for a in parts:
            for k_, v in zip(("cta", "woff", "kk", "fl", "yrow"), a):
                cols[k_].append(v)
        ybase.append(yoff0)
        woff0 += N * K
        yoff0 += N
    c = {k: np.concatenate(v) for k, v in cols.items()}
    order = np.argsort(c["cta"], kind="stable")
    c = {k: v[order] for k, v in c.items()}
    n = len(order)
    ph = c["fl"] >> 8
    newgrp = np.ones(n, bool)
    newgrp[1:] = (c["cta"][1:] != c["cta"][:-1]) | (ph[1:] != ph[:-1])
    endgrp = np.ones(n, bool)
    endgrp[:-1] = newgrp[1:]
    fl = c["fl"] | np.where(newgrp, F_WAIT, 0) | np.where(endgrp, F_ARRIVE, 0)
    c["yrow"] = np.where(c["yrow"] < 0, yoff0, c["yrow"])     # dummies store into scratch rows past the outputs
    assert ((fl & F_ARRIVE) == 0).__or__((fl & F_LAST) != 0).all()
    tab = np.stack([c["woff"], c["kk"], fl, c["yrow"]], axis=1).astype(np.int32)
    assert c["woff"].max() < 2**31 and (c["kk"] & 255).min() > 0
    counts = np.bincount(c["cta"], minlength=G)
    start = np.zeros(G + 1, np.int64)
    start[1:] = np.cumsum(counts)
    return tab, start.astype(np.int32), ybase, yoff0


# ---- compile-only: what the pipeliner did ---------------------------------------------------------------------

def _mock_args(kind: str):
    import torch
    from triton.runtime.jit import MockTensor as T
    bf, f32, i32, i64 = torch.bfloat16, torch.float32, torch.int32, torch.int64
    if kind == "A":
        return (T(bf), T(bf), T(f32), T(i64), T(i32), 65, 5)
    return (T(bf), T(bf), T(f32), T(i32), T(i32), T(i32), T(i32), 65, 5, 2_000_000)


def _loop_ops(ttgir: str) -> dict:
    """Counts of the pipeliner's ops in the TTGIR, and whether they sit inside an scf.for body."""
    lines = ttgir.splitlines()
    depth = 0
    in_for = []
    counts = {"async_copy": 0, "async_copy_in_loop": 0, "async_wait_in_loop": 0, "local_alloc": 0,
              "scf_for": 0, "tt_load_in_loop": 0}
    stack = []
    for ln in lines:
        s = ln.strip()
        opens, closes = ln.count("{"), ln.count("}")
        inside = any(stack)
        if "scf.for" in s:
            counts["scf_for"] += 1
        if "ttg.async_copy_global_to_local" in s:
            counts["async_copy"] += 1
            counts["async_copy_in_loop"] += inside
        if "ttg.async_wait" in s:
            counts["async_wait_in_loop"] += inside
        if "ttg.local_alloc" in s:
            counts["local_alloc"] += 1
        if re.search(r"= tt\.load ", s) and inside:
            counts["tt_load_in_loop"] += 1
        # keep a stack of "is this brace an scf.for region"
        for _ in range(closes):
            if stack:
                stack.pop()
        for j in range(opens):
            stack.append("scf.for" in s and j == 0)
    return counts


def _ptx_loads(ptx: str) -> dict:
    out: dict[str, int] = {}
    for m in re.finditer(r"\b(cp\.async\.[a-z.]+|ld\.global[a-z0-9.]*)", ptx):
        k = m.group(1)
        out[k] = out.get(k, 0) + 1
    return dict(sorted(out.items()))


def compile_report(variants, keep: str | None = None) -> list[dict]:
    from kog.engine.regreport import compile_monokernel, occupancy, parse_ptxas_log, run_ptxas
    rows = []
    for v in variants:
        kind = v["kind"]
        fn = stream if kind == "A" else flat
        meta = {k: v[k] for k in v if k not in ("kind",)}
        if kind != "A":
            meta["WAIT"] = 1 if kind == "C" else 0
            meta.setdefault("PACKED", 0)
            meta.setdefault("XMODE", 0)
        t0 = time.time()
        try:
            k, log, _ = compile_monokernel(_mock_args(kind), meta, fn=fn)
        except Exception as e:      # a variant that does not compile is a finding, not a crash
            rows.append({**v, "error": repr(e)[:600]})
            print(rows[-1], flush=True)
            continue
        ptx = k.asm["ptx"]
        if not log.strip():
            log = run_ptxas(ptx)
        st = parse_ptxas_log(log, k.metadata.name)
        ttgir = k.asm["ttgir"]
        occ = occupancy(st["registers"], int(k.metadata.shared or 0), v["num_warps"])
        r = {**v, "regs": st["registers"], "spill_st": st["spill_store_bytes"], "spill_ld": st["spill_load_bytes"],
             "smem": int(k.metadata.shared or 0), "ctas_fit": occ["ctas_per_sm_fit"], "limit": occ["limited_by"],
             **_loop_ops(ttgir),
             "w_bufs": max([int(m) for m in re.findall(rf"memdesc<(\d+)x{v['BN']}x{v['BK']}xbf16", ttgir)] or [0]),
             "ptx_loads": _ptx_loads(ptx), "secs": round(time.time() - t0, 1)}
        rows.append(r)
        print(r, flush=True)
        if keep:
            os.makedirs(keep, exist_ok=True)
            tag = "_".join(f"{a}{b}" for a, b in v.items())
            for ext in ("ttgir", "ptx"):
                with open(os.path.join(keep, f"{tag}.{ext}"), "w") as f:
                    f.write(k.asm[ext])
    return rows


def compile_only(a) -> None:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("--compile-only needs TRITON_INTERPRET unset")
    vs = []
    if a.variants == "default":
        vs.append(dict(kind="A", BN=8, BK=1024, SYNC=0, STAGES=1, num_warps=4))
        for kind in ("B", "C"):
            for S in (1, 3, 4):
                for BN, BK, nw in ((8, 512, 4), (8, 1024, 4), (16, 1024, 8)):
                    for packed in (0, 1):
                        vs.append(dict(kind=kind, BN=BN, BK=BK, S=S, XMODE=2 if kind == "C" else 0,
                                       PACKED=packed, num_warps=nw))
        for xm in (0, 1):
            vs.append(dict(kind="C", BN=8, BK=512, S=3, XMODE=xm, PACKED=0, num_warps=4))
    else:
        for spec in a.variants.split(";"):
            d = dict(kv.split("=") for kv in spec.split(","))
            vs.append({k: (v if k == "kind" else int(v)) for k, v in d.items()})
    rows = compile_report(vs, keep=a.keep)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"\n{'kind':4} {'S':>2} {'BN':>3} {'BK':>5} {'nw':>2} {'xm':>2} {'pk':>2} {'regs':>4} {'spill':>5} {'smem':>6} "
          f"{'fit':>3} {'wbuf':>4} {'acp':>3}  ptx loads")
    for r in rows:
        if "error" in r:
            print(r["kind"], r, sep="  ")
            continue
        print(f"{r['kind']:4} {r.get('S', r.get('STAGES')):>2} {r['BN']:>3} {r['BK']:>5} {r['num_warps']:>2} "
              f"{r.get('XMODE', '-'):>2} {r.get('PACKED', '-'):>2} {r['regs']:>4} {r['spill_st']:>5} {r['smem']:>6} {r['ctas_fit']:>3} "
              f"{r['w_bufs']:>4} {r['async_copy']:>3}  {r['ptx_loads']}")


# ---- interpreter check of B's math (tiny shapes, CPU) ---------------------------------------------------------

def interp_check() -> None:
    import torch
    phases = [(16, 128), (8, 256), (24, 128)]
    BN, BK, G = 8, 64, 3
    tab, start, ybase, ny = build_table(phases, BN, BK, G, dummies=True)
    total = sum(n * k for n, k in phases)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(total, generator=g).to(torch.bfloat16)
    x = torch.randn(256, generator=g).to(torch.bfloat16)
    y = torch.zeros(ny + BN, dtype=torch.float32)
    cnt = torch.zeros(16, dtype=torch.int32)
    err = torch.zeros(G, dtype=torch.int32)
    rels = []
    for packed in (0, 1):
        y.zero_()
        wk = pack_weights(w, tab, BN, BK) if packed else w
        flat[(G,)](wk, x, y, torch.from_numpy(tab).reshape(-1), torch.from_numpy(start), cnt, err, len(phases), 2,
                   100, BN=BN, BK=BK, S=3, WAIT=0, XMODE=0, PACKED=packed)
        ref = _reference(w, x, phases)
        rels.append((y[:ny] - ref).abs().max().item() / ref.abs().max().item())
    rel = max(rels)
    print(f"interpreter check of B: {len(tab)} chunks over {G} CTAs, max rel err {rel:.2e}")
    assert rel < 1e-2, rel


def pack_weights(w, tab, BN: int, BK: int, batch: int = 8192):
    """Chunk-major copy of the weights: chunk c's [BN, BK] tile at c*BN*BK (the order the CTAs read them)."""
    import torch
    t = torch.as_tensor(tab, device=w.device)
    out = torch.empty(t.shape[0] * BN * BK, dtype=w.dtype, device=w.device)
    r = torch.arange(BN, device=w.device, dtype=torch.int64)[None, :, None]
    k = torch.arange(BK, device=w.device, dtype=torch.int64)[None, None, :]
    for b in range(0, t.shape[0], batch):
        e = t[b:b + batch].to(torch.int64)
        idx = e[:, 0, None, None] * 64 + r * ((e[:, 1] & 255) * 64)[:, None, None] + k
        out[b * BN * BK:(b + e.shape[0]) * BN * BK] = w[idx.reshape(-1)]
    return out


def _reference(w, x, phases):
    import torch
    out, o = [], 0
    for N, K in phases:
        out.append(w[o:o + N * K].view(N, K).float() @ x[:K].float())
        o += N * K
    return torch.cat(out)


# ---- device mode ----------------------------------------------------------------------------------------------

REGS_PER_SM, SMEM_PER_SM = 65536, 228 * 1024


def fits(k, warps: int, ctas: int) -> tuple[bool, str]:
    regs = int(k.n_regs)
    per_warp = -(-max(regs, 1) * 32 // 256) * 256
    by_regs = REGS_PER_SM // (per_warp * warps)
    smem = int(k.metadata.shared or 0)
    by_smem = SMEM_PER_SM // (smem + 1024)
    by_thr = 2048 // (32 * warps)
    n = min(by_regs, by_smem, by_thr)
    return ctas <= n, f"regs {regs} smem {smem} -> {n} CTAs/SM"


def device(a) -> None:
    import torch
    t_start = time.time()
    out_dir = os.environ.get("OUT", "/tmp")
    out_path = os.path.join(out_dir, "stream_pipelined.json")
    phases = llama_phases()
    total = sum(n * k for n, k in phases)
    torch.manual_seed(0)
    w = torch.randn(total, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(I, dtype=torch.bfloat16, device="cuda")
    offs, o = [], 0
    for n, k in phases:
        offs += [o, n, k]
        o += n * k
    tab_a = torch.tensor(offs, dtype=torch.int64, device="cuda")
    ref = _reference(w, x, phases)
    wbytes = total * 2
    cp_a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    cp_b = torch.empty_like(cp_a)
    for _ in range(3):
        cp_b.copy_(cp_a)
    torch.cuda.synchronize()
    t = time.time()
    for _ in range(20):
        cp_b.copy_(cp_a)
    torch.cuda.synchronize()
    copy = 2 * 20 * cp_a.numel() / (time.time() - t)
    del cp_a, cp_b
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    passes = 5
    res = {"device": torch.cuda.get_device_name(0), "triton": triton.__version__, "weight_bytes": wbytes,
           "copy_GBps": copy / 1e9, "limit_tok_s": copy / wbytes, "passes": passes, "rows": []}

    def save():
        with open(out_path + ".tmp", "w") as f:
            json.dump(res, f, indent=1)
        os.replace(out_path + ".tmp", out_path)

    def record(row):
        res["rows"].append(row)
        save()
        print(row, flush=True)

    def bench(fn):
        fn()
        torch.cuda.synchronize()
        return triton.testing.do_bench(fn, warmup=25, rep=a.rep_ms, return_mode="median")

    def late():
        return time.time() - t_start > a.deadline

    save()
    # A: the anchor kernel at its best tilings
    ya = torch.empty(V, dtype=torch.float32, device="cuda")
    for BN, BK, nw in ((4, 2048, 4), (8, 1024, 4)):
        for cps in (2, 4):
            for sync in (0, 1):
                if late():
                    break
                G = nsm * cps
                cnt = torch.zeros(1, dtype=torch.int32, device="cuda")
                row = dict(kernel="A", BN=BN, BK=BK, warps=nw, ctas_per_sm=cps, G=G, S=1, sync=sync)

                def run_a():
                    cnt.zero_()
                    stream[(G,)](w, x, ya, tab_a, cnt, len(phases), passes, BN=BN, BK=BK, SYNC=sync, STAGES=1,
                                 num_warps=nw, launch_cooperative_grid=True)
                try:
                    ms = bench(run_a)
                except Exception as e:
                    record({**row, "error": repr(e)[:200]})
                    continue
                tok = passes / (ms / 1e3)
                record({**row, "ms": round(ms, 3), "tok_s": round(tok, 1),
                        "pct_limit": round(100 * tok / res["limit_tok_s"], 1)})

    def run_flat(kind, S, BN, BK, nw, cps, G, packed):
        key = (BN, BK, G)
        if cur.get("key") != key:
            cur.clear()
            torch.cuda.empty_cache()
            tab, start, _, ny = build_table(phases, BN, BK, G, dummies=True)
            cur.update(key=key, tab=torch.from_numpy(tab).reshape(-1).cuda(), start=torch.from_numpy(start).cuda(),
                       ny=ny, n=len(tab), np_tab=tab)
        if packed and "wp" not in cur:
            cur["wp"] = pack_weights(w, cur["np_tab"], BN, BK)
        wk = cur["wp"] if packed else w
        tab_t, start_t, ny = cur["tab"], cur["start"], cur["ny"]
        y = torch.empty(ny + BN, dtype=torch.float32, device="cuda")
        cnt = torch.zeros(passes * len(phases) + 1, dtype=torch.int32, device="cuda")
        err = torch.zeros(G, dtype=torch.int32, device="cuda")
        xm = a.xmode if kind == "C" else 0
        row = dict(kernel=kind, BN=BN, BK=BK, warps=nw, ctas_per_sm=cps, G=G, S=S, packed=packed, XMODE=xm,
                   chunks=cur["n"])
        meta = dict(BN=BN, BK=BK, S=S, WAIT=1 if kind == "C" else 0, XMODE=xm, PACKED=packed, num_warps=nw,
                    launch_cooperative_grid=True)

        def launch(np_):
            cnt.zero_()
            flat[(G,)](wk, x, y, tab_t, start_t, cnt, err, len(phases), np_, a.max_spin, **meta)
        try:
            k = flat.warmup(wk, x, y, tab_t, start_t, cnt, err, len(phases), passes, a.max_spin, grid=(G,), **meta)
            k._init_handles()          # n_regs / n_spills are read when the binary is loaded
            ok, why = fits(k, nw, cps)
            row.update(regs=int(k.n_regs), spills=int(k.n_spills), smem=int(k.metadata.shared or 0))
            if not ok:
                record({**row, "skipped": why})
                return
            y.fill_(float("nan"))
            launch(1)
            torch.cuda.synchronize()
            if int(err.max()) != 0:
                record({**row, "error": f"wait timed out (first bad global phase {int(err.max())})"})
                return
            rel = ((y[:ref_n] - ref).abs().max() / ref.abs().max()).item()
            row["max_rel_err"] = float(f"{rel:.3g}")
            if not rel < 1e-2:
                record({**row, "error": "wrong result"})
                return
            ms = bench(lambda: launch(passes))
            if int(err.max()) != 0:
                record({**row, "error": f"wait timed out in timing (global phase {int(err.max())})"})
                return
        except Exception as e:
            record({**row, "error": repr(e)[:200]})
            return
        tok = passes / (ms / 1e3)
        record({**row, "ms": round(ms, 3), "tok_s": round(tok, 1),
                "pct_limit": round(100 * tok / res["limit_tok_s"], 1)})

    # B and C: the same table (with the dummy chunks C needs) and the same packed copy for both kinds.
    # Loop order = priority: the deadline cuts the outermost dimensions' tail first.
    cur: dict = {}
    ref_n = ref.numel()
    for nw in a.warps:
        for BK in a.bk:
            for BN in a.bn:
                for cps in a.ctas:
                    G = nsm * cps
                    for S in a.stages:
                        for packed in a.packed:
                            for kind in a.kinds:
                                if late():
                                    break
                                run_flat(kind, S, BN, BK, nw, cps, G, packed)

    res["wall_s"] = round(time.time() - t_start, 1)
    res["stopped_by_deadline"] = late()
    save()
    print(f"\ncopy {res['copy_GBps']:.0f} GB/s, limit {res['limit_tok_s']:.0f} tok/s; {len(res['rows'])} rows "
          f"in {res['wall_s']} s -> {out_path}")
    print(f"{'k':2} {'S':>2} {'BN':>3} {'BK':>5} {'nw':>2} {'cps':>3} {'regs':>4} {'smem':>6} {'tok/s':>7} {'%lim':>5}")
    for r in sorted(res["rows"], key=lambda r: -r.get("tok_s", 0)):
        tail = f"{r['tok_s']:>7} {r['pct_limit']:>5}" if "tok_s" in r else (r.get("skipped") or r.get("error", ""))
        print(f"{r['kernel'] + ('s' if r.get('sync') else 'p' if r.get('packed') else ''):2} {r['S']:>2} {r['BN']:>3} {r['BK']:>5} "
              f"{r['warps']:>2} {r['ctas_per_sm']:>3} {r.get('regs', ''):>4} {r.get('smem', ''):>6} {tail}")


def _ints(s: str) -> list[int]:
    return [int(v) for v in s.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compile-only", action="store_true", help="CPU: compile B and C for sm_90 and report")
    ap.add_argument("--variants", default="default",
                    help="compile-only: 'kind=B,BN=8,BK=512,S=3,XMODE=0,num_warps=4;...' (default: a fixed set)")
    ap.add_argument("--keep", default=None, help="compile-only: write each variant's ttgir/ptx here")
    ap.add_argument("--json", default=None, help="compile-only: write the rows here")
    ap.add_argument("--interp-check", action="store_true", help="CPU: TRITON_INTERPRET=1 check of B's math")
    ap.add_argument("--deadline", type=float, default=420, help="device: start no new variant after this many s")
    ap.add_argument("--stages", type=_ints, default=[3, 4, 1])
    ap.add_argument("--bn", type=_ints, default=[8, 16])
    ap.add_argument("--bk", type=_ints, default=[1024, 512])
    ap.add_argument("--warps", type=_ints, default=[4, 8])
    ap.add_argument("--ctas", type=_ints, default=[2, 1, 4])
    ap.add_argument("--packed", type=_ints, default=[0, 1], help="0 table offsets into row-major W, 1 chunk-major copy")
    ap.add_argument("--kinds", default="BC")
    ap.add_argument("--xmode", type=int, default=2, help="C's x load: 0 plain, 1 volatile, 2 inline asm")
    ap.add_argument("--max-spin", type=int, default=2_000_000)
    ap.add_argument("--rep-ms", type=int, default=100)
    a = ap.parse_args()
    if a.compile_only:
        compile_only(a)
    elif a.interp_check:
        interp_check()
    else:
        device(a)


if __name__ == "__main__":
    main()
