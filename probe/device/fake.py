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
from kog.probe.errors import UsageError

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


def mi300x() -> DeviceInfo:
    """An AMD Instinct MI300X in SPX/NPS1 mode, from AMD's public figures (not measured by kog).

    304 CUs in 8 XCDs of 38, 4 MiB L2 per XCD, 256 MiB Infinity Cache, 192 GB HBM3 on an 8192-bit
    bus, gfx942; workgroups go to XCDs round-robin.
    """
    return DeviceInfo(
        vendor="amd", index=0, name="AMD Instinct MI300X", arch="gfx942", sms=304, dies=8, sms_per_die=38,
        dispatch="round-robin-xcd", l2_bytes=4 * MiB, llc_bytes=256 * MiB, mem_bytes=192 * 1024**3,
        mem_bus_bits=8192, sm_clock_max_mhz=2100, mem_clock_max_mhz=1300, driver=None, runtime="hip 6.4",
        ecc=True, power_limit_w=750.0, pcie={"gen": 5, "width": 16},
        links=[{"type": "xgmi", "link": i} for i in range(7)],
        partition={"compute": "SPX", "memory": "NPS1"}, uuid=None,
        extra={"fake": "mi300x", "source": "AMD MI300X data sheet / CDNA3 white paper"},
    )


FAKES: dict[str, Callable[[], DeviceInfo]] = {"h200": h200, "mi300x": mi300x}


def fake_device(name: str) -> DeviceInfo:
    """The fake named `name` ('h200' or 'mi300x'); UsageError for any other name."""
    try:
        return FAKES[name.strip().lower()]()
    except KeyError:
        raise UsageError(f"unknown fake device {name!r} (KOG_FAKE_DEVICE takes: "
                         f"{', '.join(FAKES)}, none)") from None
