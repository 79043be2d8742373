"""What every probe shares: the context it runs in, timing, bounded-spin error records, co-residency."""
from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

from kog.errors import KogError

# Every spin-wait in a probe kernel stops after this many polls (~0.5 us each on an H200, so about
# 0.25 s) and writes an error record instead of hanging the GPU.
SPIN_CAP = 1 << 19

# Error-record codes a kernel writes into its err buffer (4 int32 per program: code, step, seen, wanted).
ERR_BARRIER = 1
ERR_FLAG = 2
ERR_NAMES = {ERR_BARRIER: "grid-barrier counter", ERR_FLAG: "signal flag"}


class ProbeTimeout(KogError):
    """A probe kernel's bounded spin-wait ran out: the scan records it and goes on."""


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass
class ProbeContext:
    """What a probe needs to know to run: device facts, the quick flag, and where to put extras."""

    sms: int
    vendor: str = "nvidia"
    quick: bool = False
    device_index: int = 0
    l2_bytes: int | None = None
    dies: int = 1
    llc_bytes: int | None = None     # AMD Infinity Cache (None on NVIDIA: no cache beyond L2)
    extras: dict[str, Any] = field(default_factory=dict)   # small JSON facts a probe adds to the summary
    progress: Callable[[str], None] | None = None

    @property
    def use_asm(self) -> bool:
        return not interpreting()

    @property
    def amd(self) -> bool:
        return self.vendor.endswith("amd")

    def say(self, msg: str) -> None:
        if self.progress:
            self.progress(msg)

    @property
    def torch_device(self) -> str:
        return "cpu" if interpreting() else f"cuda:{self.device_index}"


def check_errors(err, what: str, names: dict[int, str] | None = None) -> None:
    """Raise ProbeTimeout naming the first error record a kernel wrote (err: int tensor [n, 4])."""
    e = err.view(-1, 4).cpu()
    bad = (e[:, 0] != 0).nonzero().flatten().tolist()
    if not bad:
        return
    i = bad[0]
    code, step, seen, want = (int(x) for x in e[i].tolist())
    label = (names or ERR_NAMES).get(code, f"code {code}")
    raise ProbeTimeout(f"{what}: program {i} gave up waiting on the {label} at step {step} "
                       f"(saw {seen}, wanted {want}; {len(bad)} program(s) timed out)")


def cuda_time_ms(fn: Callable[[], Any], reps: int = 10, warm: int = 2) -> float:
    """Median wall time of fn() on the GPU stream in ms, by CUDA events."""
    import torch
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


# ---- co-residency --------------------------------------------------------------------------------
HOPPER_LIMITS = {"regs_per_sm": 65536, "smem_per_sm": 228 * 1024, "max_ctas_per_sm": 32,
                 "max_warps_per_sm": 64, "reg_alloc_unit": 256, "smem_reserved_per_cta": 1024}
CDNA3_LIMITS = {"regs_per_sm": 4 * 512 * 64, "smem_per_sm": 64 * 1024, "max_ctas_per_sm": 32,
                "max_warps_per_sm": 32, "reg_alloc_unit": 8 * 64, "smem_reserved_per_cta": 0,
                "warp_size": 64}


def co_resident_ctas(regs_per_thread: int, warps: int, smem_bytes: int,
                     limits: dict[str, int] | None = None) -> int:
    """How many CTAs of this footprint one SM holds at once (the occupancy calculation)."""
    lim = dict(HOPPER_LIMITS if limits is None else limits)
    ws = lim.get("warp_size", 32)
    unit = lim["reg_alloc_unit"]
    regs_warp = -(-max(regs_per_thread, 1) * ws // unit) * unit
    by_regs = lim["regs_per_sm"] // (regs_warp * warps)
    by_warps = lim["max_warps_per_sm"] // warps
    smem = smem_bytes + lim["smem_reserved_per_cta"]
    by_smem = lim["smem_per_sm"] // smem if smem > 0 else lim["max_ctas_per_sm"]
    return max(0, min(by_regs, by_warps, by_smem, lim["max_ctas_per_sm"]))


def kernel_footprint(compiled) -> dict[str, int]:
    """regs / spills / shared bytes / warps of a compiled Triton kernel (what a launch returns)."""
    md = getattr(compiled, "metadata", None)
    return {"regs": int(getattr(compiled, "n_regs", 0) or 0),
            "spills": int(getattr(compiled, "n_spills", 0) or 0),
            "smem": int(getattr(md, "shared", 0) or 0),
            "warps": int(getattr(md, "num_warps", 0) or 0)}
