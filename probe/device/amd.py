"""AMD inventory: torch's HIP build for what the runtime reports, amdsmi for the rest.

UNVERIFIED ON HARDWARE: kog has never run this module on an AMD GPU. It follows the documented
amdsmi Python API (ROCm 6.x) and torch's HIP device properties, is exercised on the CPU only through
the MI300X fake (kog.probe.device.fake.mi300x) and the pure helpers below, and every amdsmi call is
guarded so that a differing API leaves a field None instead of failing. amdsmi is imported only inside
functions, and only when it is installed (`pip install kog[amd]`).

Partition modes: amdsmi's compute partition (SPX / DPX / TPX / QPX / CPX: 1, 2, 3, 4 or 8 logical
devices per MI300X) and memory partition (NPS1 / NPS4: NUMA nodes) are read, normalised by
`partition_modes` whatever shape the installed amdsmi returns them in, and stored in DeviceInfo.partition
(the scan summary shows them under `partition`); a device in DPX / QPX / CPX mode has 4 / 2 / 1 XCDs.

MI300X facts this module relies on: 8 XCDs of 38 active CUs (304 CUs), 4 MiB L2 per XCD, a 256 MiB
Infinity Cache in front of HBM, and workgroups dispatched to XCDs round-robin (workgroup i runs on
XCD i % 8 in SPX mode), which is why `xcd_of_workgroup` exists: mapping code uses it to keep the
tiles that share data on one XCD's L2.
"""
from __future__ import annotations

import re
from typing import Any, Callable

from kog.probe.device.base import DeviceInfo

MiB = 1 << 20

# Active CUs per XCD by architecture (gfx942: MI300X/MI300A/MI325X; gfx950: MI350X/MI355X), and the
# L2 of one XCD. Used when amdsmi cannot say how many XCDs there are.
CUS_PER_XCD = {"gfx942": 38, "gfx950": 32}
L2_PER_XCD = {"gfx942": 4 * MiB, "gfx950": 4 * MiB}
INFINITY_CACHE = {"gfx942": 256 * MiB, "gfx950": 256 * MiB}


def xcd_of_workgroup(wg_id: int, num_xcds: int) -> int:
    """The XCD that runs workgroup `wg_id` under round-robin dispatch (MI300 series: wg_id % num_xcds).

    Pure arithmetic from AMD's documentation; not verified on hardware by kog.
    """
    if num_xcds < 1:
        raise ValueError(f"num_xcds must be >= 1, not {num_xcds}")
    if wg_id < 0:
        raise ValueError(f"wg_id must be >= 0, not {wg_id}")
    return wg_id % num_xcds


def workgroups_of_xcd(xcd: int, num_workgroups: int, num_xcds: int) -> list[int]:
    """The workgroup ids, in dispatch order, that round-robin dispatch sends to `xcd`."""
    if not 0 <= xcd < num_xcds:
        raise ValueError(f"xcd must be in [0, {num_xcds}), not {xcd}")
    return list(range(xcd, num_workgroups, num_xcds))


def xcds_from_cus(arch: str, cus: int) -> int:
    """Number of XCDs a device of `cus` CUs has, from the CUs per XCD of its architecture (1 if unknown)."""
    per = CUS_PER_XCD.get(arch.split(":")[0])
    if not per or cus < per:
        return 1
    return max(1, round(cus / per))


# Compute partition modes of MI300X and how many of its 8 XCDs one (logical) device then has; memory
# partition modes (NUMA nodes per socket). From AMD's MI300X partitioning documentation.
COMPUTE_MODES = {"SPX": 1, "DPX": 2, "TPX": 3, "QPX": 4, "CPX": 8}     # mode -> devices per GPU
MEMORY_MODES = ("NPS1", "NPS2", "NPS4", "NPS8")
_COMPUTE_RE = re.compile(r"(?<![A-Z])(SPX|DPX|TPX|QPX|CPX)(?![A-Z])")
_MEMORY_RE = re.compile(r"(?<![A-Z])NPS([1248])(?![0-9])")


def _mode_text(value: Any) -> str:
    """amdsmi gives a mode as a str, an enum (name: 'AMDSMI_COMPUTE_PARTITION_SPX' or 'SPX'), bytes or a
    dict of fields, depending on the ROCm version; this is the text to search in each case."""
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, dict):
        return " ".join(_mode_text(v) for v in value.values())
    name = getattr(value, "name", None)
    return f"{name} {value}" if isinstance(name, str) else str(value)


def compute_mode(value: Any) -> str | None:
    """'SPX' / 'DPX' / 'TPX' / 'QPX' / 'CPX' from whatever amdsmi returned; None when it names none."""
    m = _COMPUTE_RE.search(_mode_text(value).upper())
    return m.group(1) if m else None


def memory_mode(value: Any) -> str | None:
    """'NPS1' / 'NPS2' / 'NPS4' / 'NPS8' from whatever amdsmi returned; None when it names none."""
    m = _MEMORY_RE.search(_mode_text(value).upper())
    return f"NPS{m.group(1)}" if m else None


def partition_modes(compute: Any, memory: Any) -> dict[str, Any] | None:
    """DeviceInfo.partition: {'compute': 'SPX', 'memory': 'NPS1'} (a mode kog cannot read is None, and the
    raw value is kept under 'compute_raw' / 'memory_raw'); None when amdsmi said nothing at all."""
    if compute in (None, "") and memory in (None, ""):
        return None
    out: dict[str, Any] = {"compute": compute_mode(compute), "memory": memory_mode(memory)}
    for k, raw in (("compute", compute), ("memory", memory)):
        if out[k] is None and raw not in (None, ""):
            out[f"{k}_raw"] = _mode_text(raw)[:100]
    return out


def xcds_per_device(compute: str | None, total_xcds: int = 8) -> int | None:
    """XCDs one logical device holds in a compute partition mode (MI300X, 8 XCDs: SPX 8, DPX 4, QPX 2,
    CPX 1); None for an unknown mode or one that does not divide the XCDs evenly."""
    n = COMPUTE_MODES.get((compute or "").upper())
    if not n or total_xcds % n:
        return None
    return total_xcds // n


def _call(mod, name: str, *args, default=None):
    """mod.name(*args), or `default` when the library lacks that function or the call fails."""
    return _try(getattr(mod, name, None), *args, default=default)


def _try(fn: Callable[..., Any] | None, *args, default=None):
    if fn is None:
        return default
    try:
        return fn(*args)
    except Exception:
        return default


def _amdsmi():
    """The amdsmi module, initialised; None when it is not installed or cannot start."""
    try:
        import amdsmi  # noqa: PLC0415 - optional dependency, only on ROCm machines
        amdsmi.amdsmi_init()
        return amdsmi
    except Exception:
        return None


def _handle(smi, index: int, props):
    """The amdsmi processor handle of torch's device `index` (by PCI bus id when torch gives one)."""
    handles = _call(smi, "amdsmi_get_processor_handles", default=[]) or []
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        for h in handles:
            bdf = _call(smi, "amdsmi_get_gpu_device_bdf", h)
            if isinstance(bdf, str) and bdf.split(":")[-2:-1] == [f"{bus:02x}"]:
                return h
    return handles[index] if 0 <= index < len(handles) else None


def _smi_fields(smi, h) -> dict[str, Any]:
    d: dict[str, Any] = {}
    asic = _call(smi, "amdsmi_get_gpu_asic_info", h) or {}
    d["market_name"] = asic.get("market_name")
    d["cus"] = asic.get("num_compute_units")
    d["xcds"] = _call(smi, "amdsmi_get_gpu_xcd_counter", h)
    d["compute_partition"] = _call(smi, "amdsmi_get_gpu_compute_partition", h)
    d["memory_partition"] = _call(smi, "amdsmi_get_gpu_memory_partition", h)
    clk = getattr(smi, "AmdSmiClkType", None)
    if clk is not None:
        gfx = _call(smi, "amdsmi_get_clock_info", h, clk.GFX) or {}
        mem = _call(smi, "amdsmi_get_clock_info", h, clk.MEM) or {}
        d["sm_clock_max_mhz"] = gfx.get("max_clk")
        d["mem_clock_max_mhz"] = mem.get("max_clk")
    drv = _call(smi, "amdsmi_get_gpu_driver_info", h) or {}
    d["driver"] = drv.get("driver_version")
    vram = _call(smi, "amdsmi_get_gpu_vram_info", h) or {}
    if vram.get("vram_size"):
        d["mem_bytes"] = int(vram["vram_size"]) * MiB  # amdsmi reports MiB
    d["mem_bus_bits"] = vram.get("vram_bit_width")
    cap = _call(smi, "amdsmi_get_power_cap_info", h) or {}
    if cap.get("power_cap"):
        d["power_limit_w"] = cap["power_cap"] / 1e6  # microwatts
    d["uuid"] = _call(smi, "amdsmi_get_gpu_device_uuid", h)
    pcie = _call(smi, "amdsmi_get_pcie_info", h) or {}
    st = pcie.get("pcie_static", {}) if isinstance(pcie, dict) else {}
    if st:
        d["pcie"] = {"gen": st.get("pcie_interface_version"), "width": st.get("max_pcie_width")}
    caches = _call(smi, "amdsmi_get_gpu_cache_info", h) or {}
    for c in (caches.get("cache", []) if isinstance(caches, dict) else []):
        if c.get("cache_level") == 2 and c.get("cache_size"):
            d["l2_bytes"] = int(c["cache_size"]) * 1024  # KiB
        if c.get("cache_level") == 3 and c.get("cache_size"):
            d["llc_bytes"] = int(c["cache_size"]) * 1024
    return d


def inventory(index: int = 0) -> DeviceInfo:
    """DeviceInfo of HIP device `index`. Unverified on hardware (see the module docstring)."""
    import torch

    p = torch.cuda.get_device_properties(index)
    arch_full = str(getattr(p, "gcnArchName", "") or "gfx?")
    arch = arch_full.split(":")[0]
    cus = int(p.multi_processor_count)
    info = DeviceInfo(
        vendor="amd", index=index, name=str(p.name), arch=arch, sms=cus,
        dispatch="round-robin-xcd" if arch in CUS_PER_XCD else "unknown",
        l2_bytes=L2_PER_XCD.get(arch) or (int(getattr(p, "L2_cache_size", 0) or 0) or None),
        llc_bytes=INFINITY_CACHE.get(arch),
        mem_bytes=int(p.total_memory),
        runtime=f"hip {torch.version.hip}" if getattr(torch.version, "hip", None) else None,
        extra={"gcn_arch": arch_full, "verified_on_hardware": False},
    )
    xcds = None
    smi = _amdsmi()
    if smi is None:
        info.extra["amdsmi"] = "unavailable"
    else:
        try:
            h = _handle(smi, index, p)
            if h is not None:
                f = _smi_fields(smi, h)
                xcds = f.pop("xcds", None)
                info.partition = partition_modes(f.pop("compute_partition", None),
                                                 f.pop("memory_partition", None))
                for k in ("market_name", "cus"):
                    v = f.pop(k, None)
                    if v is not None:
                        info.extra[k] = v
                for k, v in f.items():
                    if v is not None:
                        setattr(info, k, v)
                info.extra["amdsmi"] = "ok"
            else:
                info.extra["amdsmi"] = "no handle for this device"
        finally:
            _call(smi, "amdsmi_shut_down")
    # In CPX mode each XCD is its own device of 38 CUs: torch's CU count then already says 1 XCD.
    if not isinstance(xcds, int) or xcds < 1:
        xcds = xcds_from_cus(arch, cus)
    # the partition mode, when known, says how many XCDs this device holds (8 XCDs on gfx942)
    mode = (info.partition or {}).get("compute")
    by_mode = xcds_per_device(mode, 8) if arch == "gfx942" else None
    if by_mode is not None and by_mode * CUS_PER_XCD["gfx942"] == cus and xcds != by_mode:
        info.extra["xcds_reported"] = xcds
        xcds = by_mode
    info.dies = xcds
    info.sms_per_die = cus // xcds if cus % xcds == 0 else None
    return info
