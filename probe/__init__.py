"""kog.probe: the GPU as a persistent kernel sees it (device layer, probes, `kogprobe`)."""
from kog.probe.errors import KogError, NoGPUError, UsageError

__all__ = ["KogError", "NoGPUError", "UsageError", "__version__"]


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("kog")
    except Exception:  # running from a source tree that is not installed
        return "0+unknown"


__version__ = _version()


def __getattr__(name: str):
    # lazy: `kog.probe.bundled_scan_path()` without importing the scan machinery at package import
    if name == "bundled_scan_path":
        from kog.probe.scan import bundled_scan_path
        return bundled_scan_path
    raise AttributeError(name)
