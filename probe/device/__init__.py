"""Device layer: one inventory type, one small module per vendor behind it.

    from kog.probe.device import detect, require_gpu
    info = require_gpu()          # DeviceInfo of GPU 0, or NoGPUError with one clear line
    info.to_dict()                # what meta.json stores

nvidia.py reads torch.cuda + pynvml; amd.py reads torch's HIP build + amdsmi (imported only when
present); fake.py holds recorded inventories (the lent H200, an MI300X) for CPU tests.
"""
from kog.probe.device.base import DeviceInfo, detect, require_gpu, vendor_of

__all__ = ["DeviceInfo", "detect", "require_gpu", "vendor_of"]
