"""Every vendor-specific inline-assembly string kog uses, in one place.

The kernels never spell asm themselves: they call the small @triton.jit readers below, chosen by a
constexpr (USE_ASM / AMD), so the CPU interpreter (TRITON_INTERPRET=1), which cannot run inline asm,
takes the program_id path instead.

NVIDIA (PTX): %smid is the SM a CTA runs on (stable for the CTA's life); %clock64 counts that SM's
cycles; %globaltimer is a chip-wide nanosecond clock (coarse: it may tick in steps of up to ~1 us,
so kog only divides it over long spans).
AMD (gfx9 / CDNA3): s_getreg of HW_REG_XCC_ID gives the XCD (die) a workgroup runs on and of HW_REG_HW_ID
the CU / SH / SE inside it; s_memtime counts shader cycles, s_memrealtime a constant 100 MHz clock.
The AMD strings are written to the ISA manual and checked only by the unit tests of their decoding
(no AMD GPU was available to run them).
"""
from __future__ import annotations

import triton
import triton.language as tl

NV_SMID = "mov.u32 $0, %smid;"
NV_CLOCK64 = "mov.u64 $0, %clock64;"
NV_GLOBALTIMER = "mov.u64 $0, %globaltimer;"

# XCC_ID is the register's low 4 bits (XCC_ID[3:0] in the CDNA3 ISA's hardware-id registers); reading
# only that field keeps any other bits of the register out of the XCD number.
AMD_XCC_ID = "s_getreg_b32 $0, hwreg(HW_REG_XCC_ID, 0, 4)"
AMD_HW_ID = "s_getreg_b32 $0, hwreg(HW_REG_HW_ID)"
AMD_MEMTIME = "s_memtime $0\ns_waitcnt lgkmcnt(0)"
AMD_MEMREALTIME = "s_memrealtime $0\ns_waitcnt lgkmcnt(0)"
AMD_REALTIME_HZ = 100_000_000


@triton.jit
def sm_id(USE_ASM: tl.constexpr, AMD: tl.constexpr = False):
    """The SM (NVIDIA) or packed XCC/SE/SH/CU id (AMD) of this program; program_id without asm."""
    if USE_ASM:
        if AMD:
            hw = tl.inline_asm_elementwise("s_getreg_b32 $0, hwreg(HW_REG_HW_ID)", "=s", [],
                                           dtype=tl.int32, is_pure=True, pack=1)
            xcc = tl.inline_asm_elementwise("s_getreg_b32 $0, hwreg(HW_REG_XCC_ID, 0, 4)", "=s", [],
                                            dtype=tl.int32, is_pure=True, pack=1)
            # packed as xcc << 16 | hw_id; decoded on the host (decode_amd_hw_id)
            return (xcc << 16) | (hw & 0xFFFF)
        else:
            return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32,
                                             is_pure=True, pack=1)
    else:
        return tl.program_id(0)


@triton.jit
def xcd_id(USE_ASM: tl.constexpr, AMD: tl.constexpr, N_XCD: tl.constexpr):
    """The XCD (XCC) this workgroup runs on: s_getreg of HW_REG_XCC_ID on AMD hardware. Without asm (the
    CPU interpreter) or off AMD it is *simulated* as round-robin dispatch, program_id % N_XCD, so the
    AMD probes' host code can be exercised on the CPU; nothing measured comes from the simulation."""
    if USE_ASM:
        if AMD:
            return tl.inline_asm_elementwise("s_getreg_b32 $0, hwreg(HW_REG_XCC_ID, 0, 4)", "=s", [],
                                             dtype=tl.int32, is_pure=True, pack=1)
        else:
            return tl.program_id(0) % N_XCD
    else:
        return tl.program_id(0) % N_XCD


@triton.jit
def cycles(USE_ASM: tl.constexpr, AMD: tl.constexpr = False):
    """This SM's cycle counter (0 without asm). Not pure: every call reads the clock again."""
    if USE_ASM:
        if AMD:
            return tl.inline_asm_elementwise("s_memtime $0\ns_waitcnt lgkmcnt(0)", "=s", [],
                                             dtype=tl.int64, is_pure=False, pack=1)
        else:
            return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64,
                                             is_pure=False, pack=1)
    else:
        return tl.program_id(0).to(tl.int64) * 0


@triton.jit
def nanoseconds(USE_ASM: tl.constexpr, AMD: tl.constexpr = False):
    """Chip-wide time in ns (NVIDIA %globaltimer; AMD s_memrealtime x 10); 0 without asm."""
    if USE_ASM:
        if AMD:
            return tl.inline_asm_elementwise("s_memrealtime $0\ns_waitcnt lgkmcnt(0)", "=s", [],
                                             dtype=tl.int64, is_pure=False, pack=1) * 10
        else:
            return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64,
                                             is_pure=False, pack=1)
    else:
        return tl.program_id(0).to(tl.int64) * 0


def amd_cu_slot(packed: int) -> int:
    """The CU's place inside its XCD from a packed id: HW_ID bits 8-15 (CU_ID | SH_ID << 4 | SE_ID << 5).
    Unique per CU of one XCD and stable across launches, but not dense (harvested CUs leave gaps):
    kog.probe.probes.l2map_amd.dense_cu_ids turns (xcd, slot) pairs into CU ids 0..CUs-1."""
    return (int(packed) >> 8) & 0xFF


def simulated_amd_id(pid: int, n_xcd: int, cus_per_xcd: int) -> int:
    """The packed id a round-robin MI300X would give workgroup `pid` if every XCD filled its CUs in
    order: XCD pid % n_xcd, slot (pid // n_xcd) % cus_per_xcd. Used only where no asm runs (the CPU
    interpreter), so AMD host code has ids of the right shape; never a measurement."""
    return ((pid % n_xcd) << 16) | (((pid // n_xcd) % cus_per_xcd) << 8)


def decode_amd_hw_id(packed: int, cus_per_se_sh: int = 16) -> dict[str, int]:
    """Split the packed AMD id that sm_id(AMD=True) returns into xcc / se / sh / cu (gfx9 HW_ID layout:
    CU_ID bits 8-11, SH_ID bit 12, SE_ID bits 13-14 (gfx942 has SE_ID bits 13-15)."""
    xcc = (packed >> 16) & 0xFFFF
    hw = packed & 0xFFFF
    cu = (hw >> 8) & 0xF
    sh = (hw >> 12) & 0x1
    se = (hw >> 13) & 0x7
    return {"xcc": xcc, "se": se, "sh": sh, "cu": cu,
            "cu_in_xcc": (se * 2 + sh) * cus_per_se_sh + cu}
