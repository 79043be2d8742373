"""Every probe kernel compiled to machine code for the GPUs kog targets, on the CPU (Triton's own ptxas for
sm_90, its AMD backend for gfx942): the interpreter runs the kernels' logic but never emits PTX, so a cache
or eviction modifier ptxas refuses, or inline asm one backend does not take, would otherwise surface only as
a failed probe on the GPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

# Compiled in a child process: tests/conftest.py switches this one to the interpreter, whose kernels cannot be
# compiled. The child prints one JSON line: {case: "ok" | error text, "ptx_loads/<kernel>": [load lines]}.
SCRIPT = r"""
import inspect, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kog.probe.probes import bandwidth, l2map, l2map_amd, latency, p2p, placement, signal, sync

H200 = GPUTarget("cuda", 90, 32)
MI300X = GPUTarget("hip", "gfx942", 64)
F32 = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32"}
I64_OUT = {"out_ptr": "*i64", "clk_ptr": "*i64"}
BW = dict(USE_ASM=True, BLOCK=bandwidth.BLOCK, UNROLL=bandwidth.UNROLL)


def compile_for(target, fn, constexprs, pointers=None, warps=4):
    # parameters named *_ptr: 16-byte-aligned pointers (int32 unless `pointers` says otherwise, as the host
    # passes them); the rest int32 scalars or the given constexprs
    pointers = pointers or {}
    sig, attrs = {}, {}
    for i, name in enumerate(inspect.signature(fn.fn).parameters):
        if name in constexprs:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = pointers.get(name, "*i32")
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "i32"
    return triton.compile(ASTSource(fn, sig, constexprs, attrs), target=target, options={"num_warps": warps})


CASES = {
    "sm90/bandwidth.read": (H200, bandwidth.read_kernel, BW, F32, 8),
    "sm90/bandwidth.copy": (H200, bandwidth.copy_kernel, BW, F32, 8),
    "sm90/sync.barrier": (H200, sync.barrier_kernel, dict(NPROG=132), None, 4),
    "sm90/sync.pingpong": (H200, sync.pingpong_kernel, {}, None, 1),
    "sm90/sync.poll": (H200, sync.poll_kernel, {}, None, 1),
    "sm90/sync.atomic": (H200, sync.atomic_kernel, {}, None, 1),
    "sm90/sync.noop": (H200, sync.noop_kernel, {}, None, 1),
    "sm90/latency.chase": (H200, latency.chase_kernel, dict(USE_ASM=True, AMD=False, CG=False), I64_OUT, 1),
    "sm90/latency.chase.cg": (H200, latency.chase_kernel, dict(USE_ASM=True, AMD=False, CG=True), I64_OUT, 1),
    "sm90/signal": (H200, signal.signal_kernel, dict(USE_ASM=True, AMD=False), I64_OUT, 1),
    **{f"sm90/l2map.{mode}": (H200, l2map.l2map_kernel, dict(USE_ASM=True, AMD=False, MODE=m), I64_OUT, 1)
       for mode, m in l2map.MODES.items()},
    "sm90/placement": (H200, placement.placement_kernel, dict(USE_ASM=True, AMD=False), None, 1),
    "sm90/p2p.ping": (H200, p2p.pingpong_kernel, dict(PING=True, USE_ASM=True), I64_OUT, 1),
    "sm90/p2p.pong": (H200, p2p.pingpong_kernel, dict(PING=False, USE_ASM=True), I64_OUT, 1),
    "gfx942/placement": (MI300X, placement.placement_kernel, dict(USE_ASM=True, AMD=True), None, 1),
    "gfx942/latency.chase": (MI300X, latency.chase_kernel, dict(USE_ASM=True, AMD=True, CG=True), I64_OUT, 1),
    "gfx942/signal": (MI300X, signal.signal_kernel, dict(USE_ASM=True, AMD=True), I64_OUT, 1),
    "gfx942/l2map.atomic": (MI300X, l2map.l2map_kernel, dict(USE_ASM=True, AMD=True, MODE=l2map.MODES["atomic"]),
                            I64_OUT, 1),
    "gfx942/l2map_amd.xcd_ladder": (MI300X, l2map_amd.xcd_ladder_kernel, dict(N_XCD=8, USE_ASM=True, AMD=True),
                                    I64_OUT, 1),
}
out = {}
for case, (target, fn, constexprs, pointers, warps) in CASES.items():
    try:
        k = compile_for(target, fn, constexprs, pointers, warps)
        out[case] = "ok" if k.asm.get("cubin") or k.asm.get("hsaco") else "no binary"
        if case.startswith("sm90/bandwidth"):
            out["ptx_loads/" + case] = [ln.strip() for ln in k.asm["ptx"].splitlines() if "ld.global" in ln]
    except Exception as e:
        out[case] = (type(e).__name__ + ": " + " | ".join(str(e).strip().splitlines()[:6]))[:800]
print("COMPILED " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=1200)
    line = [x for x in r.stdout.splitlines() if x.startswith("COMPILED ")]
    assert line, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(line[-1][9:])


def test_every_probe_kernel_compiles_for_sm90_and_gfx942(compiled):
    bad = {k: v for k, v in compiled.items() if not k.startswith("ptx_loads/") and v != "ok"}
    assert not bad, bad
    assert sum(k.startswith("sm90/") for k in compiled) >= 16 and sum(k.startswith("gfx942/") for k in compiled) >= 5


def test_bandwidth_loads_are_16_byte_vectors(compiled):
    # the probe reaches the copy's peak only with enough bytes in flight per thread
    for kernel in ("read", "copy"):
        loads = compiled[f"ptx_loads/sm90/bandwidth.{kernel}"]
        assert loads and all(".v4." in ln for ln in loads), loads[:4]
