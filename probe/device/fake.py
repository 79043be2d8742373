"""Recorded inventories for CPU tests: the lent H200 (measured) and an MI300X (from AMD's published specs).

    from kog.probe.device.fake import h200, mi300x, fake_device
    info = h200()                  # DeviceInfo as `python -m kog.probe.device` printed it on the H200
    KOG_FAKE_DEVICE=mi300x ...     # detect()/require_gpu() return mi300x() (test-only, see base.py)

The H200 inventory ships as package data (kog/probe/data/h200_inventory.json, a copy of
tests/fixtures/h200_inventory.json) so code outside the tests folder can use it. Each fake carries
extra["fake"] = <name> so a run made under it can never pass for a measurement.
"""
from __future__ import annotations

import json
from importlib import resources
from typing import Any, Callable

from kog.probe.device.base import DeviceInfo
from kog.errors import UsageError

MiB = 1 << 20


def _bundled_json(name: str) -> Any:
    return json.loads(resources.files("kog.probe").joinpath("data", name).read_text())


def h200() -> DeviceInfo:
    """The lent NVIDIA H200 (132 SMs, 60 MiB L2, 141 GB HBM3e), recorded by kog's device layer on it."""
    data = _bundled_json("h200_inventory.json")
    d = data[0] if isinstance(data, list) else data
    info = DeviceInfo.from_dict(d)
    info.extra = {**info.extra, "fake": "h200"}
    return info


def mi300x(compute: str = "SPX", memory: str = "NPS1") -> DeviceInfo:
    """An AMD Instinct MI300X from AMD's public figures (not measured by kog), in SPX/NPS1 mode unless
    told otherwise.

    304 CUs in 8 XCDs of 38, 4 MiB L2 per XCD, 256 MiB Infinity Cache, 192 GB HBM3 on an 8192-bit
    bus, gfx942; workgroups go to XCDs round-robin. In DPX / QPX / CPX mode one logical device holds
    4 / 2 / 1 XCDs (and its share of the CUs, HBM and Infinity Cache).
    """
    from kog.probe.device.amd import COMPUTE_MODES, xcds_per_device
    xcds = xcds_per_device(compute, 8)
    if xcds is None:
        raise UsageError(f"unknown MI300X compute partition mode {compute!r} "
                         f"(one of {', '.join(m for m in COMPUTE_MODES if xcds_per_device(m, 8))})")
    share = xcds / 8
    return DeviceInfo(
        vendor="amd", index=0, name="AMD Instinct MI300X", arch="gfx942", sms=38 * xcds, dies=xcds,
        sms_per_die=38, dispatch="round-robin-xcd", l2_bytes=4 * MiB, llc_bytes=int(256 * MiB * share),
        mem_bytes=int(192 * 1024**3 * share), mem_bus_bits=8192, sm_clock_max_mhz=2100,
        mem_clock_max_mhz=1300, driver=None, runtime="hip 6.4", ecc=True, power_limit_w=750.0,
        pcie={"gen": 5, "width": 16}, links=[{"type": "xgmi", "link": i} for i in range(7)],
        partition={"compute": compute.upper(), "memory": memory.upper()}, uuid=None,
        extra={"fake": "mi300x", "source": "AMD MI300X data sheet / CDNA3 white paper"},
    )


# ---- a fake MI300X topology (CPU tests of the AMD probes' host code; not hardware behaviour) ---------
MI300X_SES, MI300X_CU_SLOTS_PER_SE = 4, 10      # 4 shader engines x 10 CU slots = 40 per XCD, 38 active


def mi300x_cu_slots(n_xcd: int = 8, cus_per_xcd: int = 38, seed: int = 0) -> list[list[int]]:
    """Per XCD, the HW_ID slots (CU_ID | SH_ID << 4 | SE_ID << 5; SH_ID 0) of its active CUs, sorted:
    40 slots per XCD with 40 - cus_per_xcd of them harvested at random, like real parts."""
    import numpy as np
    rng = np.random.default_rng(seed)
    every = [(se << 5) | cu for se in range(MI300X_SES) for cu in range(MI300X_CU_SLOTS_PER_SE)]
    out = []
    for _ in range(n_xcd):
        off = set(rng.choice(len(every), len(every) - cus_per_xcd, replace=False).tolist())
        out.append([s for i, s in enumerate(every) if i not in off])
    return out


def mi300x_packed_ids(n_wg: int, dispatch: str = "round-robin", n_xcd: int = 8, cus_per_xcd: int = 38,
                      seed: int = 0) -> list[int]:
    """The packed ids (XCC_ID << 16 | HW_ID & 0xFFFF, as vendor_asm.sm_id(AMD=True) returns them) that
    workgroups 0..n_wg-1 would report on a fake MI300X. dispatch 'round-robin': wg i -> XCD i % n_xcd
    (MI300X, SPX); 'contiguous': wg i -> XCD (i // cus_per_xcd) % n_xcd (what round-robin is not). Within
    an XCD the workgroups fill its CUs in slot order, wrapping around; the low HW_ID bits (wave, SIMD)
    carry noise that decoding must ignore."""
    import numpy as np
    if dispatch not in ("round-robin", "contiguous"):
        raise ValueError(f"dispatch must be 'round-robin' or 'contiguous', not {dispatch!r}")
    slots = mi300x_cu_slots(n_xcd, cus_per_xcd, seed)
    rng = np.random.default_rng(seed + 1)
    used = [0] * n_xcd
    out = []
    for i in range(n_wg):
        x = i % n_xcd if dispatch == "round-robin" else (i // cus_per_xcd) % n_xcd
        slot = slots[x][used[x] % cus_per_xcd]
        used[x] += 1
        out.append((x << 16) | (slot << 8) | int(rng.integers(0, 256)))
    return out


FAKES: dict[str, Callable[[], DeviceInfo]] = {"h200": h200, "mi300x": mi300x}


def fake_device(name: str) -> DeviceInfo:
    """The fake named `name` ('h200' or 'mi300x'); UsageError for any other name."""
    try:
        return FAKES[name.strip().lower()]()
    except KeyError:
        raise UsageError(f"unknown fake device {name!r} (KOG_FAKE_DEVICE takes: "
                         f"{', '.join(FAKES)}, none)") from None
