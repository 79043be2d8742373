"""The one inventory type every vendor module fills, and GPU detection.

Test-only switch: KOG_FAKE_DEVICE=h200|mi300x makes detect() and require_gpu() return the recorded
inventory of that device (kog.probe.device.fake) instead of asking torch; KOG_FAKE_DEVICE=none makes
them see no GPU even on a GPU machine. It exists so CPU tests can drive code that needs a DeviceInfo;
nothing outside tests should set it (a fake inventory carries extra["fake"] so runs made under it
are recognisable).
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any

from kog.errors import NoGPUError


@dataclass
class DeviceInfo:
    """What kog knows about one GPU. Units are in the names; unknown values are None.

    `sms` counts streaming multiprocessors on NVIDIA and compute units on AMD. `dies` is the number of
    compute dies that share nothing below HBM (1 on H200; 8 XCDs on MI300X); `sms_per_die` the SMs/CUs
    each holds. `dispatch` names how the hardware hands consecutive workgroups to dies
    ("round-robin-xcd" on MI300X, "breadth-first" on NVIDIA, as kog.probe.probes.placement names what it measures).
    """

    vendor: str                      # "nvidia" | "amd" (fakes keep their vendor; see is_fake)
    index: int
    name: str
    arch: str                        # "sm_90", "gfx942", ...
    sms: int
    dies: int = 1
    sms_per_die: int | None = None
    dispatch: str = "unknown"
    l2_bytes: int | None = None      # per die on AMD (XCD L2), whole chip on NVIDIA
    llc_bytes: int | None = None     # last-level cache beyond L2 (AMD Infinity Cache), None if absent
    mem_bytes: int | None = None
    mem_bus_bits: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_max_mhz: int | None = None
    driver: str | None = None
    runtime: str | None = None       # "cuda 13.0" / "hip 6.4"
    ecc: bool | None = None
    power_limit_w: float | None = None
    pcie: dict[str, Any] | None = None          # {"gen": 5, "width": 16}
    links: list[dict[str, Any]] = field(default_factory=list)  # NVLink / xGMI links
    partition: dict[str, Any] | None = None     # AMD compute/memory partition modes
    uuid: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        """File-name-safe device name: 'NVIDIA H200' -> 'nvidia-h200'."""
        return re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-") or "gpu"

    @property
    def is_fake(self) -> bool:
        """True for the recorded inventories of kog.probe.device.fake (CPU tests)."""
        return bool(self.extra.get("fake"))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DeviceInfo":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        known = {k: v for k, v in d.items() if k in names}
        info = cls(**known)
        if unknown:
            info.extra = {**info.extra, **{k: d[k] for k in unknown}}
        return info


FAKE_ENV = "KOG_FAKE_DEVICE"


def _fake_setting() -> str | None:
    v = os.environ.get(FAKE_ENV, "").strip().lower()
    return v or None


def vendor_of() -> str | None:
    """'nvidia', 'amd' or None: which GPU runtime this torch build can reach right now."""
    fake = _fake_setting()
    if fake is not None:
        if fake == "none":
            return None
        from kog.probe.device import fake as _fake
        return _fake.fake_device(fake).vendor
    try:
        import torch
    except Exception:
        return None
    try:
        if not torch.cuda.is_available():
            return None
    except Exception:
        return None
    return "amd" if getattr(torch.version, "hip", None) else "nvidia"


def detect() -> list[DeviceInfo]:
    """Inventory of every visible GPU (empty list when there is none)."""
    fake = _fake_setting()
    if fake is not None:
        if fake == "none":
            return []
        from kog.probe.device import fake as _fake
        return [_fake.fake_device(fake)]
    v = vendor_of()
    if v is None:
        return []
    import torch
    if v == "nvidia":
        from kog.probe.device import nvidia as mod
    else:
        from kog.probe.device import amd as mod
    return [mod.inventory(i) for i in range(torch.cuda.device_count())]


def require_gpu(index: int = 0) -> DeviceInfo:
    """DeviceInfo of GPU `index`, or NoGPUError naming exactly what is missing."""
    fake = _fake_setting()
    if fake is not None:
        devs = detect()
        if not devs:
            raise NoGPUError(f"no GPU: {FAKE_ENV}=none hides every GPU (a test setting)")
        if not 0 <= index < len(devs):
            raise NoGPUError(f"no GPU {index}: {len(devs)} visible ({FAKE_ENV}={fake})")
        return devs[index]
    try:
        import torch
    except Exception as e:  # pragma: no cover - torch is a dependency
        raise NoGPUError(f"no GPU: PyTorch cannot be imported ({e})") from None
    if not torch.cuda.is_available():
        build = "CPU-only build" if not (torch.version.cuda or getattr(torch.version, "hip", None)) else (
            f"CUDA {torch.version.cuda}" if torch.version.cuda else f"HIP {torch.version.hip}")
        raise NoGPUError(f"no GPU: this command needs a CUDA or ROCm GPU, and torch {torch.__version__} "
                         f"({build}) sees none")
    n = torch.cuda.device_count()
    if not 0 <= index < n:
        raise NoGPUError(f"no GPU {index}: {n} visible (CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES)")
    return detect()[index]
