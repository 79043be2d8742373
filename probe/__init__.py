"""kog.probe: the GPU as a persistent kernel sees it (device layer, probes, `kogprobe`)."""


def __getattr__(name: str):
    # lazy: `kog.probe.bundled_scan_path()` without importing the scan machinery at package import
    if name == "bundled_scan_path":
        from kog.probe.scan import bundled_scan_path
        return bundled_scan_path
    raise AttributeError(name)
