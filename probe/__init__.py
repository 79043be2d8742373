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
