"""Device layer on the CPU: the recorded H200, the MI300X fake, the vendor modules against stand-ins
for torch's properties and for pynvml/amdsmi, and the no-GPU path."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from kog.probe.device import DeviceInfo, detect, require_gpu
from kog.probe.device import amd, fake, nvidia
from kog.errors import NoGPUError, UsageError

FIXTURES = Path(__file__).parent / "fixtures"
MiB = 1 << 20


def test_recorded_h200_is_the_lent_gpu():
    info = fake.h200()
    assert info.vendor == "nvidia" and info.name == "NVIDIA H200" and info.arch == "sm_90"
    assert info.sms == 132 and info.dies == 1 and info.sms_per_die == 132
    assert info.l2_bytes == 60 * MiB
    assert 140 * 2**30 < info.mem_bytes < 144 * 2**30  # 143771 MiB of HBM3e
    assert info.driver == "580.159.04" and info.runtime.startswith("cuda ")
    assert info.dispatch == "breadth-first" and info.is_fake


def test_bundled_inventory_equals_the_test_fixture():
    bundled = Path(fake.__file__).resolve().parents[1] / "data" / "h200_inventory.json"
    assert json.loads(bundled.read_text()) == json.loads((FIXTURES / "h200_inventory.json").read_text())


def test_mi300x_fake():
    info = fake.mi300x()
    assert (info.vendor, info.arch, info.sms, info.dies, info.sms_per_die) == ("amd", "gfx942", 304, 8, 38)
    assert info.sms == info.dies * info.sms_per_die
    assert info.l2_bytes == 4 * MiB and info.llc_bytes == 256 * MiB and info.mem_bytes == 192 * 2**30
    assert info.dispatch == "round-robin-xcd" and info.partition == {"compute": "SPX", "memory": "NPS1"}


@pytest.mark.parametrize("make", [fake.h200, fake.mi300x])
def test_deviceinfo_round_trip(make):
    info = make()
    d = json.loads(json.dumps(info.to_dict()))
    assert DeviceInfo.from_dict(d) == info


def test_from_dict_keeps_unknown_keys_in_extra():
    d = fake.h200().to_dict()
    d["future_field"] = 7
    info = DeviceInfo.from_dict(d)
    assert info.extra["future_field"] == 7 and info.sms == 132


@pytest.mark.parametrize("name,slug", [("NVIDIA H200", "nvidia-h200"), ("AMD Instinct MI300X", "amd-instinct-mi300x"),
                                       ("NVIDIA H100 80GB HBM3", "nvidia-h100-80gb-hbm3"), ("???", "gpu")])
def test_slug(name, slug):
    assert DeviceInfo(vendor="nvidia", index=0, name=name, arch="sm_90", sms=1).slug == slug


def test_xcd_of_workgroup_is_round_robin():
    assert [amd.xcd_of_workgroup(i, 8) for i in range(10)] == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1]
    assert amd.xcd_of_workgroup(12345, 1) == 0
    assert amd.workgroups_of_xcd(3, 20, 8) == [3, 11, 19]
    with pytest.raises(ValueError):
        amd.xcd_of_workgroup(0, 0)
    with pytest.raises(ValueError):
        amd.xcd_of_workgroup(-1, 8)


def test_xcds_from_cus():
    assert amd.xcds_from_cus("gfx942", 304) == 8      # MI300X SPX
    assert amd.xcds_from_cus("gfx942:sramecc+:xnack-", 228) == 6  # MI300A
    assert amd.xcds_from_cus("gfx942", 38) == 1       # one XCD (CPX partition)
    assert amd.xcds_from_cus("gfx90a", 110) == 1      # unknown arch: one die


# ---- no GPU, and the test-only fake switch ------------------------------------------------------

def test_no_gpu_error_is_one_line(monkeypatch):
    monkeypatch.setenv("KOG_FAKE_DEVICE", "none")
    assert detect() == []
    with pytest.raises(NoGPUError) as e:
        require_gpu()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("no GPU")


def test_no_gpu_on_this_cpu_torch():
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert detect() == []
    with pytest.raises(NoGPUError, match=r"^no GPU: .*sees none$"):
        require_gpu()


@pytest.mark.parametrize("name,sms", [("h200", 132), ("mi300x", 304)])
def test_fake_switch(fake_device, name, sms):
    info = fake_device(name)
    assert info.sms == sms and require_gpu().sms == sms
    with pytest.raises(NoGPUError):
        require_gpu(1)


def test_fake_switch_rejects_unknown(monkeypatch):
    monkeypatch.setenv("KOG_FAKE_DEVICE", "tpu")
    with pytest.raises(UsageError, match="unknown fake device"):
        require_gpu()


# ---- the vendor modules against stand-ins ------------------------------------------------------

def _props(**kw):
    base = dict(name="NVIDIA H200", major=9, minor=0, multi_processor_count=132, L2_cache_size=60 * MiB,
                total_memory=150_109_880_320, uuid="fedd8f2c-0670-9980-b400-024569efb1fb",
                pci_domain_id=0, pci_bus_id=0, pci_device_id=6, warp_size=32)
    base.update(kw)
    return types.SimpleNamespace(**base)


class _NVMLError(Exception):
    pass


def _fake_pynvml(broken: bool = False):
    """A pynvml stand-in: every query raises unless defined below (and all raise when broken)."""
    nv = types.ModuleType("pynvml")
    nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM, nv.NVML_NVLINK_MAX_LINKS, nv.NVML_TEMPERATURE_GPU = 1, 2, 18, 0
    nv.NVMLError = _NVMLError

    def fail(*a):
        raise _NVMLError("Not Supported")

    if broken:
        nv.nvmlInit = fail
        return nv
    nv.__getattr__ = lambda name: fail  # any query not listed: unsupported
    nv.nvmlInit = nv.nvmlShutdown = lambda: None
    nv.nvmlSystemGetDriverVersion = lambda: "580.159.04"
    nv.nvmlSystemGetCudaDriverVersion = lambda: 13000
    nv.nvmlDeviceGetHandleByUUID = lambda u: "H0" if u == "GPU-fedd8f2c-0670-9980-b400-024569efb1fb" else fail()
    nv.nvmlDeviceGetMaxClockInfo = lambda h, c: {1: 1980, 2: 3201}[c]
    nv.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=150_754_820_096)
    nv.nvmlDeviceGetEccMode = lambda h: (1, 1)
    nv.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700_000
    nv.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 5
    nv.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 16
    nv.nvmlDeviceGetNvLinkState = lambda h, link: 1 if link < 2 else fail()
    nv.nvmlDeviceGetNvLinkVersion = lambda h, link: 4
    nv.nvmlDeviceGetNvLinkRemotePciInfo_v2 = lambda h, link: types.SimpleNamespace(busId=b"00000000:19:00.0")
    nv.nvmlDeviceGetUUID = lambda h: "GPU-fedd8f2c-0670-9980-b400-024569efb1fb"
    return nv


def _patch_torch(monkeypatch, props, cuda="13.0", hip=None):
    import torch
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", hip, raising=False)


def test_nvidia_inventory_with_nvml(monkeypatch):
    _patch_torch(monkeypatch, _props())
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    info = nvidia.inventory(0)
    assert (info.sms, info.l2_bytes, info.arch, info.dispatch) == (132, 60 * MiB, "sm_90", "breadth-first")
    assert info.driver == "580.159.04" and info.runtime == "cuda 13.0"
    assert info.mem_bytes == 150_754_820_096 and info.extra["mem_bytes_cuda"] == 150_109_880_320
    assert (info.sm_clock_max_mhz, info.mem_clock_max_mhz, info.ecc, info.power_limit_w) == (1980, 3201, True, 700.0)
    assert info.pcie["gen"] == 5 and info.pcie["width"] == 16
    assert [link["link"] for link in info.links] == [0, 1]
    assert info.links[0]["peer_pci_bus_id"] == "00000000:19:00.0" and info.links[0]["version"] == 4
    assert info.mem_bus_bits is None  # unsupported query: None, not a crash


@pytest.mark.parametrize("pynvml", [None, "broken"])
def test_nvidia_inventory_without_nvml(monkeypatch, pynvml):
    _patch_torch(monkeypatch, _props())
    monkeypatch.setitem(sys.modules, "pynvml", None if pynvml is None else _fake_pynvml(broken=True))
    info = nvidia.inventory(0)
    assert info.sms == 132 and info.l2_bytes == 60 * MiB and info.mem_bytes == 150_109_880_320
    assert info.driver is None and info.ecc is None and info.links == []
    assert info.extra["nvml"] == "unavailable"


def test_amd_inventory_without_amdsmi(monkeypatch):
    _patch_torch(monkeypatch, _props(name="AMD Instinct MI300X", gcnArchName="gfx942:sramecc+:xnack-",
                                     multi_processor_count=304, L2_cache_size=4 * MiB,
                                     total_memory=192 * 2**30), cuda=None, hip="6.4.0")
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    info = amd.inventory(0)
    assert (info.vendor, info.arch, info.sms, info.dies, info.sms_per_die) == ("amd", "gfx942", 304, 8, 38)
    assert info.dispatch == "round-robin-xcd" and info.l2_bytes == 4 * MiB and info.llc_bytes == 256 * MiB
    assert info.runtime == "hip 6.4.0" and info.extra["amdsmi"] == "unavailable"
    assert info.extra["verified_on_hardware"] is False


def test_amd_inventory_with_amdsmi(monkeypatch):
    _patch_torch(monkeypatch, _props(name="AMD Instinct MI300X", gcnArchName="gfx942", multi_processor_count=38,
                                     total_memory=24 * 2**30, pci_bus_id=0x0c), cuda=None, hip="6.4.0")
    smi = types.ModuleType("amdsmi")
    smi.amdsmi_init = smi.amdsmi_shut_down = lambda: None
    smi.amdsmi_get_processor_handles = lambda: ["A", "B"]
    smi.amdsmi_get_gpu_device_bdf = lambda h: {"A": "0000:0b:00.0", "B": "0000:0c:00.0"}[h]
    smi.amdsmi_get_gpu_asic_info = lambda h: {"market_name": "MI300X", "num_compute_units": 38}
    smi.amdsmi_get_gpu_xcd_counter = lambda h: 1
    smi.amdsmi_get_gpu_compute_partition = lambda h: "CPX"
    smi.amdsmi_get_gpu_memory_partition = lambda h: "NPS4"
    smi.AmdSmiClkType = types.SimpleNamespace(GFX="gfx", MEM="mem")
    smi.amdsmi_get_clock_info = lambda h, t: {"max_clk": 2100 if t == "gfx" else 1300}
    smi.amdsmi_get_gpu_driver_info = lambda h: {"driver_version": "6.8.5"}

    def unsupported(h):
        raise RuntimeError("AMDSMI_STATUS_NOT_SUPPORTED")
    smi.amdsmi_get_gpu_vram_info = unsupported
    monkeypatch.setitem(sys.modules, "amdsmi", smi)
    info = amd.inventory(0)
    assert info.partition == {"compute": "CPX", "memory": "NPS4"}
    assert (info.sms, info.dies, info.sms_per_die) == (38, 1, 38)
    assert (info.sm_clock_max_mhz, info.mem_clock_max_mhz, info.driver) == (2100, 1300, "6.8.5")
    assert info.mem_bytes == 24 * 2**30 and info.extra["amdsmi"] == "ok"
