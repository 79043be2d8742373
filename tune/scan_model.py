"""What the tuner reads from a kogprobe scan: bandwidth vs SMs, latency, barrier, flag and launch costs.

A scan directory (kog.probe.scan: Parquet tables bandwidth [sms, kind, GBps], barrier [ctas, warps, us],
flag [kind, us], launch [mode, us], latency [bytes, ns, cycles, level] and summary.json) becomes one
`ScanModel` with interpolating accessors. `load_scan()` reads the scan kog.probe.scan.find_scan finds (this
device's latest, else the bundled one); `synthetic_h200()` is a stand-in built from measurements of the H200
for tests and for machines with no scan: its `source` says so.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kog.errors import UsageError


@dataclass(frozen=True)
class ScanModel:
    sms: int
    bw_sms: tuple[int, ...]            # streaming-read bandwidth curve: active SMs ...
    bw_gbps: tuple[float, ...]         # ... -> GB/s
    latency_ns: float                  # loaded HBM latency a dependent load sees
    barrier_ctas: tuple[int, ...]      # grid-barrier cost curve: CTAs ...
    barrier_us_: tuple[float, ...]     # ... -> us
    flag_us: float                     # one-way flag (producer release -> consumer acquire)
    launch_us: float                   # one kernel launch
    device_name: str = "NVIDIA H200"
    dies: int = 1
    source: str = "synthetic"          # path of the scan, or "synthetic" (anchor numbers, no scan)
    smids: tuple[int, ...] = field(default=())   # CTA -> SM placement when the scan recorded it
    p2p_flag_us: float | None = None   # GPU -> GPU one-way flag (kogprobe p2p_latency, triton-flag rows), if scanned
    p2p_gbps: float | None = None      # GPU -> GPU peer copy bandwidth (kogprobe p2p_bandwidth, off-diagonal)

    def bandwidth_gbps(self, active_sms: float) -> float:
        """Streaming bandwidth with `active_sms` SMs reading (linear below the first point)."""
        x = np.asarray(self.bw_sms, float)
        y = np.asarray(self.bw_gbps, float)
        a = float(max(1.0, min(active_sms, self.sms)))
        if a <= x[0]:
            return float(y[0] * a / x[0])
        return float(np.interp(a, x, y))

    def barrier_us(self, ctas: int) -> float:
        x = np.asarray(self.barrier_ctas, float)
        y = np.asarray(self.barrier_us_, float)
        if ctas <= x[-1]:
            return float(np.interp(ctas, x, y))
        # beyond the measured CTA counts the barrier grows with the arrivals it serialises
        slope = (y[-1] - y[0]) / max(1.0, x[-1] - x[0])
        return float(y[-1] + slope * (ctas - x[-1]))

    @property
    def peak_gbps(self) -> float:
        return float(max(self.bw_gbps))

    @property
    def sms_to_saturate(self) -> int:
        peak = self.peak_gbps
        for s, g in zip(self.bw_sms, self.bw_gbps):
            if g >= 0.95 * peak:
                return int(s)
        return self.sms

    def to_dict(self) -> dict[str, Any]:
        import dataclasses
        return dataclasses.asdict(self)


def synthetic_h200() -> ScanModel:
    """Numbers measured on the lent H200 (copy 4.21 TB/s, barrier 0.92 us at 132 CTAs, flag 0.71 us); the
    bandwidth-vs-SMs curve is a saturating shape (saturates near 80 SMs), not a measurement."""
    sms = np.array([1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 132])
    peak = 4210.0
    per_sm = 62.0  # GB/s one SM can pull when alone (assumed)
    gbps = peak * (1 - np.exp(-sms * per_sm / peak)) / (1 - np.exp(-132 * per_sm / peak))
    return ScanModel(
        sms=132, bw_sms=tuple(int(s) for s in sms), bw_gbps=tuple(float(g) for g in gbps),
        latency_ns=820.0, barrier_ctas=(2, 16, 132), barrier_us_=(0.75, 0.80, 0.92),
        flag_us=0.71, launch_us=4.0, device_name="NVIDIA H200", dies=1, source="synthetic")


def scan_from_dir(path: str | Path) -> ScanModel:
    """Read a kogprobe scan directory (the Parquet tables and summary.json described above)."""
    import pandas as pd
    p = Path(path)
    if not p.is_dir():
        raise UsageError(f"no such scan directory: {p}")

    def table(name: str):
        f = p / f"{name}.parquet"
        if not f.exists():
            return None
        try:
            return pd.read_parquet(f)
        except Exception as e:
            raise UsageError(f"scan table {f} is unreadable: {type(e).__name__}: {e}") from None

    summary: dict[str, Any] = {}
    if (p / "summary.json").exists():
        try:
            summary = json.loads((p / "summary.json").read_text())
        except Exception as e:
            raise UsageError(f"scan summary {p / 'summary.json'} is not valid JSON: {e}") from None
    meta: dict[str, Any] = {}
    if (p / "meta.json").exists():
        try:
            meta = json.loads((p / "meta.json").read_text())
        except Exception:
            meta = {}
    base = synthetic_h200()
    dev = meta.get("device") or {}
    sms = int(dev.get("sms") or summary.get("sms") or base.sms)

    bw = table("bandwidth")
    if bw is not None and len(bw):
        kinds = list(bw["kind"].unique()) if "kind" in bw else []
        kind = next((k for k in ("read", "stream", "load") if k in kinds), kinds[0] if kinds else None)
        sub = bw[bw["kind"] == kind] if kind is not None else bw
        sub = sub.groupby("sms", as_index=False)["GBps"].median().sort_values("sms")
        bw_sms, bw_gbps = tuple(int(s) for s in sub["sms"]), tuple(float(g) for g in sub["GBps"])
    else:
        bw_sms, bw_gbps = base.bw_sms, base.bw_gbps

    lat = summary.get("latency_ns")
    lt = table("latency")
    if lat is None and lt is not None and len(lt):
        hbm = lt[lt["level"].astype(str).str.lower().isin(["hbm", "dram", "memory"])] if "level" in lt else lt
        lat = float((hbm if len(hbm) else lt)["ns"].max())
    if isinstance(lat, dict):   # per-level dict: take HBM
        lat = lat.get("hbm") or lat.get("HBM") or max(lat.values())

    br = table("barrier")
    if br is not None and len(br):
        sub = br.groupby("ctas", as_index=False)["us"].median().sort_values("ctas")
        b_ctas, b_us = tuple(int(c) for c in sub["ctas"]), tuple(float(u) for u in sub["us"])
    elif summary.get("barrier_us_all_ctas") is not None:
        b_ctas, b_us = (sms,), (float(summary["barrier_us_all_ctas"]),)
    else:
        b_ctas, b_us = base.barrier_ctas, base.barrier_us_
    if len(b_ctas) == 1:   # one point: flat curve
        b_ctas, b_us = (1, b_ctas[0]), (b_us[0], b_us[0])

    flag = summary.get("flag_oneway_us")
    fl = table("flag")
    if flag is None and fl is not None and len(fl):
        flag = float(fl["us"].median())
    # the GPU's own launch latency where the scan measured it, else the host's (older scans: launch_us)
    launch = next((summary[k] for k in ("launch_gpu_us", "launch_host_us", "launch_us") if summary.get(k)), None)
    la = table("launch")
    if isinstance(launch, dict):
        launch = launch.get("cooperative") or min(launch.values())
    if launch is None and la is not None and len(la):
        coop = la[la["mode"].astype(str).str.contains("coop")] if "mode" in la else la
        launch = float((coop if len(coop) else la)["us"].median())
    p2p_flag, p2p_bw = None, None      # multi-GPU scans only (kogprobe's p2p probe); medians over GPU pairs
    pl = table("p2p_latency")
    if pl is not None and len(pl):
        off = pl[pl["src"] != pl["dst"]]
        if "method" in off:
            flagged = off[off["method"].astype(str) == "triton-flag"]
            off = flagged if len(flagged) else off
        p2p_flag = float(off["us"].median()) if len(off) else None
    pb = table("p2p_bandwidth")
    if pb is not None and len(pb):
        off = pb[pb["src"] != pb["dst"]]
        p2p_bw = float(off["GBps"].median()) if len(off) else None
    return ScanModel(
        p2p_flag_us=p2p_flag, p2p_gbps=p2p_bw,
        sms=sms, bw_sms=bw_sms, bw_gbps=bw_gbps,
        latency_ns=float(lat if lat is not None else base.latency_ns),
        barrier_ctas=b_ctas, barrier_us_=b_us,
        flag_us=float(flag if flag is not None else base.flag_us),
        launch_us=float(launch if launch is not None else base.launch_us),
        device_name=str(dev.get("name") or summary.get("device") or base.device_name),
        dies=int(dev.get("dies") or 1), source=str(p))


def write_scan_dir(model: ScanModel, path: str | Path) -> Path:
    """Write `model` as a scan directory (the tables scan_from_dir reads): synthetic scans for tests."""
    import pandas as pd
    from kog.fsutil import atomic_write_table, atomic_write_text
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    atomic_write_table(p / "bandwidth.parquet",
                       pd.DataFrame({"sms": list(model.bw_sms), "kind": "read", "GBps": list(model.bw_gbps)}))
    atomic_write_table(p / "barrier.parquet",
                       pd.DataFrame({"ctas": list(model.barrier_ctas), "warps": 4, "us": list(model.barrier_us_)}))
    atomic_write_table(p / "flag.parquet", pd.DataFrame({"kind": ["oneway"], "us": [model.flag_us]}))
    atomic_write_table(p / "launch.parquet", pd.DataFrame({"mode": ["cooperative"], "us": [model.launch_us]}))
    atomic_write_table(p / "latency.parquet", pd.DataFrame({"bytes": [1 << 30], "ns": [model.latency_ns],
                                                            "cycles": [model.latency_ns * 1.98], "level": ["hbm"]}))
    atomic_write_text(p / "summary.json", json.dumps({
        "latency_ns": model.latency_ns, "barrier_us_all_ctas": model.barrier_us(model.sms),
        "flag_oneway_us": model.flag_us, "launch_us": model.launch_us,
        "sms_to_saturate_hbm": model.sms_to_saturate, "device": model.device_name, "sms": model.sms}))
    return p


def load_scan(path: str | Path | None = None, device_name: str | None = None) -> ScanModel:
    """The scan kog.probe.scan.find_scan(path, device_name) finds, else the synthetic H200 model. A scan
    given by `path` must read; a found one that does not is passed over for the synthetic model."""
    from kog.probe.scan import find_scan
    if path is not None:
        return scan_from_dir(find_scan(path))
    found = find_scan(None, device_name)
    if found is not None:
        try:
            return scan_from_dir(found)
        except UsageError:
            pass
    return synthetic_h200()
