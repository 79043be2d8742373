"""The few places where NVIDIA, AMD and the CPU interpreter differ, behind one constexpr switch.

VENDOR is a tl.constexpr passed to every kernel: 0 = TRITON_INTERPRET (no inline asm; programs run one
after another), 1 = NVIDIA (PTX), 2 = AMD (GCN/CDNA asm). Triton compiles only the taken branch.
The AMD strings follow the CDNA3 ISA (s_memrealtime at 100 MHz; XCC_ID in hwreg 20) and are
UNVERIFIED on hardware: no MI300X was available to this project.
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRET, NVIDIA, AMD = 0, 1, 2


def vendor_code() -> int:
    """The VENDOR constexpr for the current process."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return INTERPRET
    import torch
    return AMD if getattr(torch.version, "hip", None) else NVIDIA


@triton.jit
def global_time_ns(VENDOR: tl.constexpr):
    """A device-wide clock in ns (NVIDIA %globaltimer; AMD s_memrealtime * 10; 0 in the interpreter)."""
    if VENDOR == 1:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                      is_pure=False, pack=1)
    elif VENDOR == 2:
        t = tl.inline_asm_elementwise("s_memrealtime $0\ns_waitcnt lgkmcnt(0)", "=s", [], dtype=tl.int64,
                                      is_pure=False, pack=1) * 10
    else:
        t = tl.full([], 0, tl.int64)
    return t


@triton.jit
def sm_id(VENDOR: tl.constexpr):
    """Which SM (NVIDIA %smid) or XCD*64+CU (AMD) runs this program; program_id in the interpreter."""
    if VENDOR == 1:
        s = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    elif VENDOR == 2:
        # hwreg(HW_REG_XCC_ID) bits [3:0] = XCD; hwreg(HW_REG_HW_ID) bits [11:8] = CU id
        s = tl.inline_asm_elementwise(
            "s_getreg_b32 $0, hwreg(HW_REG_XCC_ID, 0, 4)\ns_getreg_b32 s0, hwreg(HW_REG_HW_ID, 8, 4)\n"
            "s_lshl_b32 $0, $0, 6\ns_or_b32 $0, $0, s0", "=s", [], dtype=tl.int32, is_pure=False, pack=1)
    else:
        s = tl.program_id(0)
    return s


@triton.jit
def poll_acquire(ptr, VENDOR: tl.constexpr, SYS: tl.constexpr):
    """One poll of an int32 readiness word with ACQUIRE semantics (gpu scope; system scope when SYS, for
    words that peer GPUs bump): the poll that sees a producer's release-increment makes everything the
    producer wrote before it visible, and later loads cannot be served from a stale L1 line.

    NVIDIA: ld.acquire (a load, so polling puts no atomic traffic on a counter producers increment). An
    acquire atomic_add(ptr, 0) whose result is unused is compiled to nothing by Triton 3.6, so the poll
    itself must carry the acquire. Elsewhere: the acquire RMW's result is the polled value."""
    if VENDOR == 1:
        if SYS:
            v = tl.inline_asm_elementwise("ld.acquire.sys.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                          is_pure=False, pack=1)
        else:
            v = tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                          is_pure=False, pack=1)
    elif SYS:
        v = tl.atomic_add(ptr, 0, sem="acquire", scope="sys")
    else:
        v = tl.atomic_add(ptr, 0, sem="acquire", scope="gpu")
    return v
