"""NVIDIA inventory: torch.cuda for what the CUDA runtime reports, pynvml (nvidia-ml-py) for the rest.

Every NVML call is guarded: NVML missing, too old, or refusing a query inside a container (gVisor,
Firecracker, MIG) leaves that field None and never stops the inventory. What torch reports
(name, SM count, L2, memory) is the floor that always comes back.
"""
from __future__ import annotations

from typing import Any, Callable

from kog.probe.device.base import DeviceInfo


def _nvml():
    """The pynvml module, initialised; None when NVML cannot be loaded or initialised."""
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml
    except Exception:
        return None


def _call(mod, name: str, *args, default=None):
    """mod.name(*args), or `default` when the library lacks that function or the call fails."""
    return _try(getattr(mod, name, None), *args, default=default)


def _try(fn: Callable[..., Any], *args, default=None):
    try:
        return fn(*args)
    except Exception:
        return default


def _text(v) -> str | None:
    if v is None:
        return None
    return v.decode() if isinstance(v, bytes) else str(v)


def _handle(nv, index: int, props):
    """The NVML handle of the same GPU torch calls `index`.

    NVML numbers every GPU on the host and ignores CUDA_VISIBLE_DEVICES, so look it up by UUID,
    then by PCI bus id, and only then by the index itself.
    """
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        u = str(uuid)
        for cand in (u if u.startswith(("GPU-", "MIG-")) else f"GPU-{u}", u):
            h = _call(nv, "nvmlDeviceGetHandleByUUID", cand)
            if h is None:
                h = _call(nv, "nvmlDeviceGetHandleByUUID", cand.encode())
            if h is not None:
                return h
    dom, bus, dev = (getattr(props, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    if None not in (dom, bus, dev):
        busid = f"{dom:08x}:{bus:02x}:{dev:02x}.0"
        h = _call(nv, "nvmlDeviceGetHandleByPciBusId", busid) or _call(nv, "nvmlDeviceGetHandleByPciBusId",
                                                                   busid.encode())
        if h is not None:
            return h
    return _call(nv, "nvmlDeviceGetHandleByIndex", index)


def _nvlinks(nv, h) -> list[dict[str, Any]]:
    """Active NVLink links with the PCI bus id of the peer at the other end (where NVML says)."""
    links = []
    n = getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)
    for link in range(n):
        state = _call(nv, "nvmlDeviceGetNvLinkState", h, link)
        if state is None:
            # Not supported on this board/driver: links beyond the last one answer with an error too.
            continue
        if not state:
            continue
        entry: dict[str, Any] = {"type": "nvlink", "link": link,
                                 "version": _call(nv, "nvmlDeviceGetNvLinkVersion", h, link)}
        rp = _call(nv, "nvmlDeviceGetNvLinkRemotePciInfo_v2", h, link)
        if rp is None:
            rp = _call(nv, "nvmlDeviceGetNvLinkRemotePciInfo", h, link)
        if rp is not None:
            entry["peer_pci_bus_id"] = _text(getattr(rp, "busId", None))
        rtype = _call(nv, "nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
        if rtype is not None:
            entry["peer_type"] = {0: "gpu", 1: "ibmnpu", 2: "switch"}.get(int(rtype), int(rtype))
        links.append(entry)
    return links


def _nvml_fields(nv, h) -> dict[str, Any]:
    """Everything NVML adds for one handle; a failed query is simply absent."""
    SM, MEM = getattr(nv, "NVML_CLOCK_SM", 1), getattr(nv, "NVML_CLOCK_MEM", 2)
    d: dict[str, Any] = {}
    d["nvml_name"] = _text(_call(nv, "nvmlDeviceGetName", h))
    d["uuid"] = _text(_call(nv, "nvmlDeviceGetUUID", h))
    d["sm_clock_max_mhz"] = _call(nv, "nvmlDeviceGetMaxClockInfo", h, SM)
    d["mem_clock_max_mhz"] = _call(nv, "nvmlDeviceGetMaxClockInfo", h, MEM)
    mem = _call(nv, "nvmlDeviceGetMemoryInfo", h)
    d["mem_bytes"] = int(mem.total) if mem is not None else None
    d["mem_bus_bits"] = _call(nv, "nvmlDeviceGetMemoryBusWidth", h)
    ecc = _call(nv, "nvmlDeviceGetEccMode", h)
    d["ecc"] = bool(ecc[0]) if ecc is not None else None
    pl = _call(nv, "nvmlDeviceGetEnforcedPowerLimit", h)
    if pl is None:
        pl = _call(nv, "nvmlDeviceGetPowerManagementLimit", h)
    d["power_limit_w"] = pl / 1000.0 if pl is not None else None
    pcie = {
        "gen": _call(nv, "nvmlDeviceGetCurrPcieLinkGeneration", h),
        "width": _call(nv, "nvmlDeviceGetCurrPcieLinkWidth", h),
        "gen_max": _call(nv, "nvmlDeviceGetMaxPcieLinkGeneration", h),
        "width_max": _call(nv, "nvmlDeviceGetMaxPcieLinkWidth", h),
    }
    d["pcie"] = pcie if any(v is not None for v in pcie.values()) else None
    d["links"] = _nvlinks(nv, h)
    # Useful context for a profiler, kept in `extra`: clocks now (a GPU idling at 345 MHz reads
    # differently from one at boost), application clocks, MIG and compute mode, persistence.
    extra: dict[str, Any] = {}
    for key, fn, args in (
        ("sm_clock_now_mhz", "nvmlDeviceGetClockInfo", (SM,)),
        ("mem_clock_now_mhz", "nvmlDeviceGetClockInfo", (MEM,)),
        ("sm_clock_app_mhz", "nvmlDeviceGetApplicationsClock", (SM,)),
        ("power_limit_default_w", "nvmlDeviceGetPowerManagementDefaultLimit", ()),
        ("compute_mode", "nvmlDeviceGetComputeMode", ()),
        ("persistence_mode", "nvmlDeviceGetPersistenceMode", ()),
        ("mig_mode", "nvmlDeviceGetMigMode", ()),
        ("board_part_number", "nvmlDeviceGetBoardPartNumber", ()),
        ("vbios", "nvmlDeviceGetVbiosVersion", ()),
        ("temperature_c", "nvmlDeviceGetTemperature", (getattr(nv, "NVML_TEMPERATURE_GPU", 0),)),
    ):
        f = getattr(nv, fn, None)
        v = _try(f, h, *args) if f is not None else None
        if v is None:
            continue
        if key == "mig_mode":
            v = int(v[0])
        elif key == "power_limit_default_w":
            v = v / 1000.0
        extra[key] = _text(v) if isinstance(v, bytes) else v
    d["extra"] = extra
    return d


def inventory(index: int = 0) -> DeviceInfo:
    """DeviceInfo of CUDA device `index` (as torch numbers it, after CUDA_VISIBLE_DEVICES)."""
    import torch

    p = torch.cuda.get_device_properties(index)
    sms = int(p.multi_processor_count)
    uuid = getattr(p, "uuid", None)
    info = DeviceInfo(
        vendor="nvidia", index=index, name=str(p.name), arch=f"sm_{p.major}{p.minor}", sms=sms,
        dies=1, sms_per_die=sms, dispatch="breadth-first",
        l2_bytes=int(getattr(p, "L2_cache_size", 0) or 0) or None,
        mem_bytes=int(p.total_memory),
        runtime=f"cuda {torch.version.cuda}" if torch.version.cuda else None,
        uuid=f"GPU-{uuid}" if uuid is not None and not str(uuid).startswith(("GPU-", "MIG-")) else (
            str(uuid) if uuid is not None else None),
    )
    info.extra["mem_bytes_cuda"] = int(p.total_memory)  # what a CUDA context can address
    for key in ("shared_memory_per_multiprocessor", "shared_memory_per_block_optin",
                "regs_per_multiprocessor", "max_threads_per_multi_processor", "warp_size"):
        v = getattr(p, key, None)
        if v is not None:
            info.extra[key] = int(v)

    nv = _nvml()
    if nv is None:
        info.extra["nvml"] = "unavailable"
        return info
    try:
        info.driver = _text(_call(nv, "nvmlSystemGetDriverVersion"))
        cuda_drv = _call(nv, "nvmlSystemGetCudaDriverVersion")
        if cuda_drv:
            info.extra["driver_cuda"] = f"{cuda_drv // 1000}.{cuda_drv % 1000 // 10}"
        h = _handle(nv, index, p)
        if h is None:
            info.extra["nvml"] = "no handle for this device"
            return info
        f = _nvml_fields(nv, h)
        info.uuid = f["uuid"] or info.uuid
        # torch's total_memory is what the context can address; NVML's total is the board's HBM.
        for key in ("mem_bytes", "mem_bus_bits", "sm_clock_max_mhz", "mem_clock_max_mhz", "ecc",
                    "power_limit_w", "pcie"):
            if f[key] is not None:
                setattr(info, key, f[key])
        info.links = f["links"]
        info.extra.update(f["extra"])
        info.extra["nvml"] = "ok"
    finally:
        _call(nv, "nvmlShutdown")
    return info
