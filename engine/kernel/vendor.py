"""The few places where NVIDIA, AMD and the CPU interpreter differ, behind one constexpr switch.

VENDOR is a tl.constexpr passed to every kernel: 0 = TRITON_INTERPRET (no inline asm; programs run one
after another), 1 = NVIDIA (PTX), 2 = AMD (GCN/CDNA asm). Triton compiles only the taken branch.
The AMD strings follow the CDNA3 ISA (s_memrealtime at 100 MHz; XCC_ID in hwreg 20) and are
UNVERIFIED on hardware: no MI300X was available to this project.
"""
from __future__ import annotations

import os
import time

import triton
import triton.language as tl

INTERPRET, NVIDIA, AMD = 0, 1, 2


@triton.jit
def dot(a, b, VENDOR: tl.constexpr):
    """tl.dot(a, b); in the interpreter, 16-bit operands are upcast to float32 first (exact: every 16-bit value
    is a float32 one, and the GPU's tensor cores accumulate in float32 too). The interpreter keeps bfloat16 as
    uint16 and multiplies the bit patterns in tl.dot (triton-lang/triton#11584: unsupported upstream), which
    made every bfloat16 model's attention garbage on the CPU."""
    if VENDOR == 0:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    return tl.dot(a, b)


def vendor_code() -> int:
    """The VENDOR constexpr for the current process."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return INTERPRET
    import torch
    return AMD if getattr(torch.version, "hip", None) else NVIDIA


def ctas_per_sm_fit(k, num_warps: int, regs_per_sm: int = 65536, smem_per_sm: int = 228 * 1024,
                    threads_per_sm: int = 2048) -> int:
    """How many CTAs of the loaded Triton kernel `k` fit on one SM at once. NVIDIA: the driver's own answer
    (cuOccupancyMaxActiveBlocksPerMultiprocessor on k.function with k.metadata.shared bytes of dynamic shared
    memory: it knows the register allocation granularity and the 1 KiB each CTA reserves, which a formula from
    n_regs alone missed: 5 CTAs/SM x 2 warps passed it and failed the cooperative launch). Elsewhere, or when
    the driver call is unavailable, the allocation-granular estimate below (AMD: UNVERIFIED on hardware)."""
    threads = 32 * num_warps
    shared = int(getattr(k.metadata, "shared", 0) or 0)
    if vendor_code() == NVIDIA:
        try:
            import ctypes
            cu = ctypes.CDLL("libcuda.so.1")
            n = ctypes.c_int(0)
            rc = cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), ctypes.c_void_p(int(k.function)),
                                                                ctypes.c_int(threads), ctypes.c_size_t(shared))
            if rc == 0:
                return int(n.value)
        except Exception:
            pass
    # registers: allocated per warp in units of 256 (n_regs rounded up to 8 per thread); shared memory: per
    # CTA in units of 128 B plus the 1 KiB the driver reserves for every CTA
    per_warp = -(-max(int(k.n_regs), 1) * 32 // 256) * 256
    fit = regs_per_sm // (per_warp * num_warps)
    if shared:
        fit = min(fit, smem_per_sm // ((-(-shared // 128) * 128) + 1024))
    return max(0, min(fit, threads_per_sm // threads, 32))


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


def host_clock_ns() -> int:
    """The host's monotonic clock: what a bounded wait reads in the interpreter (Python, never compiled)."""
    return time.monotonic_ns()


# Triton's dependency scan refuses a plain Python function named in a kernel; this one is only ever called in
# the interpreter (wait_clock_ns's VENDOR == 0 branch is pruned when compiling), so it is marked as one to skip.
host_clock_ns.__triton_builtin__ = True


@triton.jit
def wait_clock_ns(VENDOR: tl.constexpr):
    """The clock a bounded wait's deadline is read on, in ns: global_time_ns on a GPU; the host's clock in the
    interpreter (whose global_time_ns is 0, for reproducible traces)."""
    if VENDOR == 0:
        t = tl.full([], host_clock_ns(), tl.int64)
    else:
        t = global_time_ns(VENDOR)
    return t


@triton.jit
def global_time_after(x, VENDOR: tl.constexpr):
    """global_time_ns, read once the int32 scalar x exists (an unused asm input: the clock read waits for the
    value, e.g. a load's result, instead of issuing before it lands). Elsewhere: global_time_ns."""
    if VENDOR == 1:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [x], dtype=tl.int64, is_pure=False,
                                      pack=1)
    else:
        t = global_time_ns(VENDOR)
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


# ---- the weight ring (EngineConfig.weight_ring; kernel/ring.py) ------------------------------------------------
# NVIDIA (sm_90): a ring of shared-memory slots behind Triton's own shared memory, filled by one thread's
# cp.async.bulk copies (the TMA engine: no registers, no per-thread addresses) that complete on one mbarrier
# per slot. The interpreter (VENDOR 0) emulates it in global memory (kernel/ring.py); AMD has no ring
# (validate() refuses it there).

@triton.jit
def smem_base(VENDOR: tl.constexpr):
    """The shared-window address of the kernel's dynamic shared memory (Triton's `global_smem`)."""
    if VENDOR == 1:
        b = tl.inline_asm_elementwise("mov.u32 $0, global_smem;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)
    else:
        b = tl.full([], 0, tl.int32)
    return b


@triton.jit
def mbar_init(bar, VENDOR: tl.constexpr):
    """Thread 0: mbarrier at shared address `bar`, one expected arrival per phase (the producer's)."""
    if VENDOR == 1:
        tl.inline_asm_elementwise(
            "{\n.reg .pred %ip;\n.reg .u32 %it;\nmov.u32 %it, %tid.x;\nsetp.eq.u32 %ip, %it, 0;\n"
            "@%ip mbarrier.init.shared::cta.b64 [$1], 1;\nmov.u32 $0, 0;\n}",
            "=r,r", [bar], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def mbar_init_fence(VENDOR: tl.constexpr):
    """Make the initialized mbarriers visible to the async proxy (the bulk copies) before first use."""
    if VENDOR == 1:
        tl.inline_asm_elementwise("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;\n"
                                  "mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


# Thread 0 refills one slot: fence.proxy.async orders the CTA's earlier generic-proxy reads of the slot (made
# complete by the caller's bar.sync) before the copy engine's writes; arrive.expect_tx on the slot's mbarrier
# announces $3 bytes; cp.async.bulk copies them from global $2 to shared $1 and completes them on mbarrier $4.
# L2 evict_first: each weight is read once per token, so it should not push the activations, counters and
# tables every task re-reads out of L2 (as the per-task kernel's evict_first loads).
RING_COPY_PTX = tl.constexpr(
    "{\n.reg .pred %cp;\n.reg .u32 %ct;\n.reg .b64 %cs, %cq;\nmov.u32 $0, 0;\nmov.u32 %ct, %tid.x;\n"
    "setp.ne.u32 %cp, %ct, 0;\n@%cp bra C_END;\n"
    "createpolicy.fractional.L2::evict_first.b64 %cq, 1.0;\n"
    "fence.proxy.async.shared::cta;\n"
    "mbarrier.arrive.expect_tx.shared::cta.b64 %cs, [$4], $3;\n"
    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [$1], [$2], $3, [$4], %cq;\n"
    "C_END:\n}")


@triton.jit
def ring_copy(dst, src, nbytes, bar, VENDOR: tl.constexpr):
    """Thread 0: one bulk copy of nbytes (a multiple of 16, both ends 16-byte aligned) from global `src` into
    the shared slot `dst`, completing on the slot's mbarrier `bar` (RING_COPY_PTX). NVIDIA sm_90 only."""
    if VENDOR == 1:
        tl.inline_asm_elementwise(RING_COPY_PTX, "=r,r,l,r,r", [dst, src, nbytes, bar], dtype=tl.int32,
                                  is_pure=False, pack=1)


# Thread 0: ask the L2 to fetch $2 bytes at global $1 (cp.async.bulk.prefetch: one instruction for a whole
# chunk, no registers, no completion to wait for: a hint the copy that later reads them hits in L2).
RING_PREFETCH_PTX = tl.constexpr(
    "{\n.reg .pred %fp;\n.reg .u32 %ft;\nmov.u32 $0, 0;\nmov.u32 %ft, %tid.x;\nsetp.eq.u32 %fp, %ft, 0;\n"
    "@%fp cp.async.bulk.prefetch.L2.global [$1], $2;\n}")


@triton.jit
def ring_prefetch_l2(src, nbytes, VENDOR: tl.constexpr):
    """Thread 0: L2-prefetch nbytes (a multiple of 16, 16-byte aligned) at global `src`. NVIDIA sm_90 only;
    elsewhere nothing (a prefetch is only a hint)."""
    if VENDOR == 1:
        tl.inline_asm_elementwise(RING_PREFETCH_PTX, "=r,l,r", [src, nbytes], dtype=tl.int32, is_pure=False,
                                  pack=1)


@triton.jit
def prefetch_l1(base, lo, hi, VENDOR: tl.constexpr):
    """Prefetch the float32 elements base[lo:hi] (hi > lo) into L1, one 128-byte line per lane, lanes past
    the end repeating the last line (NVIDIA; elsewhere nothing: a prefetch is only a hint)."""
    if VENDOR == 1:
        ln = tl.arange(0, 64)
        last = (hi - 1) // 32
        for l0 in range(lo // 32, last + 1, 64):
            line = tl.minimum(l0 + ln, last)
            tl.inline_asm_elementwise("prefetch.global.L1 [$1];\nmov.u32 $0, 0;", "=r,l", [base + line * 32],
                                      dtype=tl.int32, is_pure=False, pack=1)


# Wait (bounded: $4 ns on the global timer, read only once the first try_wait failed) until the mbarrier at $2
# has completed its phase of parity $3. $0 = 1 if it timed out, $1 = an opaque 0 for the reads of the slot
# (keeps them below the wait).
MBAR_WAIT_PTX = tl.constexpr(
    "{\n.reg .pred %mp;\n.reg .u64 %m0, %m1;\nmov.u32 $0, 0;\nmov.u32 $1, 0;\n"
    "mbarrier.try_wait.parity.shared::cta.b64 %mp, [$2], $3;\n@%mp bra M_END;\n"
    "mov.u64 %m0, %globaltimer;\n"
    "M_POLL:\nmbarrier.try_wait.parity.shared::cta.b64 %mp, [$2], $3;\n@%mp bra M_END;\n"
    "mov.u64 %m1, %globaltimer;\nsub.u64 %m1, %m1, %m0;\nsetp.lt.u64 %mp, %m1, $4;\n@%mp bra M_POLL;\n"
    "mov.u32 $0, 1;\nM_END:\n}")


@triton.jit
def mbar_wait(bar, parity, timeout_ns, VENDOR: tl.constexpr):
    """(timed out 0/1, opaque 0): every thread waits until the slot's copies of phase `parity` landed."""
    if VENDOR == 1:
        f, dep = tl.inline_asm_elementwise(MBAR_WAIT_PTX, "=r,=r,r,r,l", [bar, parity, timeout_ns.to(tl.int64)],
                                           dtype=(tl.int32, tl.int32), is_pure=False, pack=1)
    else:
        f = parity * 0
        dep = parity * 0
    return f, dep


@triton.jit
def ld_shared_b32(addr, VENDOR: tl.constexpr):
    """32-bit words from shared addresses (a tensor of them); NVIDIA only."""
    return tl.inline_asm_elementwise("ld.shared.b32 $0, [$1];", "=r,r", [addr], dtype=tl.int32, is_pure=False,
                                     pack=1)


@triton.jit
def st_shared_b32(addr, v, VENDOR: tl.constexpr):
    """Store 32-bit words v at shared addresses addr (tensors of equal shape); NVIDIA only."""
    return tl.inline_asm_elementwise("st.shared.b32 [$1], $2;\nmov.u32 $0, 0;", "=r,r,r", [addr, v],
                                     dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def dyn_smem_size(VENDOR: tl.constexpr):
    """Bytes of dynamic shared memory this launch got (%dynamic_smem_size): the ring sits at its end."""
    if VENDOR == 1:
        n = tl.inline_asm_elementwise("mov.u32 $0, %dynamic_smem_size;", "=r", [], dtype=tl.int32, is_pure=True,
                                      pack=1)
    else:
        n = tl.full([], 0, tl.int32)
    return n

