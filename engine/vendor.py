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
