"""Diagnostics for the L2 map: every access mode x region layout, with clustering statistics.

    python -m kog.probe.probes.diag OUT.json      (on a GPU; about a second per configuration)
"""
from __future__ import annotations

import json
import sys
import time


def main(path: str) -> None:
    import torch
    from kog.probe.probes import l2map
    from kog.probe.probes.common import ProbeContext
    p = torch.cuda.get_device_properties(0)
    ctx = ProbeContext(sms=p.multi_processor_count, l2_bytes=getattr(p, "L2_cache_size", None))
    res = {}
    base = None
    for mode in l2map.MODES:
        for rb, lpr in ((128, 1), (4096, 1), (4096, 8), (65536, 1)):
            key = f"{mode}_rb{rb}_l{lpr}"
            t0 = time.perf_counter()
            try:
                df, ghz = l2map.run_map(ctx, mode, 128, rb, lpr, 32, 2)
                r = l2map.cluster_partitions(l2map.to_matrix(df))
                part, _ = l2map.partition_tables(r)
                m = l2map.to_matrix(df)
                res[key] = {"k": r["k"], "near_ns": r["near_ns"], "far_ns": r["far_ns"], "gap": r["gap"],
                            "sil": r["silhouette"], "ghz": ghz, "median_ns": float(df.ns.median()),
                            "p05_ns": float(df.ns.quantile(0.05)), "p95_ns": float(df.ns.quantile(0.95)),
                            "sm_mean_range_ns": float(m.mean(1).max() - m.mean(1).min()),
                            "region_mean_range_ns": float(m.mean(0).max() - m.mean(0).min()),
                            "sizes": [len(x) for x in l2map.partitions_as_lists(part)],
                            "seconds": time.perf_counter() - t0}
                if base is None:
                    base = (df, part)
                else:
                    res[key]["vs_first"] = l2map.compare_maps(base[0], df, base[1], part)
            except Exception as e:
                res[key] = {"error": f"{type(e).__name__}: {e}"[:400]}
            print(key, json.dumps(res[key], default=str), flush=True)
    from kog.fsutil import atomic_write_text
    atomic_write_text(path, json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "l2diag.json")
