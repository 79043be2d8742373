"""Device layer: one inventory type, one small module per vendor behind it.

    from kog.probe.device import detect, require_gpu
    info = require_gpu()          # DeviceInfo of GPU 0, or NoGPUError with one clear line
    info.to_dict()                # what meta.json stores

nvidia.py reads torch.cuda + pynvml; amd.py reads torch's HIP build + amdsmi (imported only when
present; unverified on hardware); fake.py holds recorded inventories (the lent H200, an MI300X) for
CPU tests, which KOG_FAKE_DEVICE=h200|mi300x|none (test-only) puts behind detect()/require_gpu().

`python -m kog.probe.device` prints the inventory JSON of every visible GPU.
"""
from kog.probe.device.base import FAKE_ENV, DeviceInfo, detect, require_gpu, vendor_of

__all__ = ["FAKE_ENV", "DeviceInfo", "detect", "require_gpu", "vendor_of"]
