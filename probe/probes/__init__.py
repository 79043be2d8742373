"""The probes of `kogprobe scan`: one module each, holding its Triton kernel(s), its launcher
(`measure(ctx) -> {table name: DataFrame}`), its analysis (pure functions, tested on CPU) and its tables.

Tables (the names and columns the reports render; keep them):

    placement       [launch:int, pid:int, smid:int, die:int]          placement.py
    latency         [bytes:int, ns:float, cycles:float, level:str]    latency.py   (level: l1, l2_near,
                                                                                   l2_far, hbm, transition)
    l2map           [sm:int, region:int, ns:float]                    l2map.py
    l2_partition    [sm:int, partition:int]                           l2map.py
    l2_region_home  [region:int, partition:int]                       l2map.py
    signal          [src_sm:int, dst_sm:int, ns:float]                signal.py    (one-way = round trip / 2)
    barrier         [ctas:int, warps:int, us:float]                   sync.py
    flag            [kind:str, us:float]                              sync.py      (pingpong_oneway, poll_acquire)
    atomics         [ctas:int, mops_per_s:float]                      sync.py
    launch          [mode:str, us:float]                              sync.py      (plain, plain_sync, graph, gpu_queued)
    bandwidth       [sms:int, kind:str, GBps:float]                   bandwidth.py (read, copy)
    xcd_latency     [src_xcd:int, dst_xcd:int, level:str, ns:float]   l2map_amd.py (AMD only; level: l1,
                                                                                   l2, mall, hbm, cross)
    p2p_bandwidth   [src:int, dst:int, GBps:float, peer:bool]          p2p.py       (>= 2 GPUs only)
    p2p_latency     [src:int, dst:int, us:float, method:str]           p2p.py       (>= 2 GPUs only)

vendor_asm.py holds every inline-asm string (%smid, %clock64, %globaltimer; AMD s_getreg XCC_ID / HW_ID,
s_memtime); common.py the context, timing, co-residency and bounded-spin error records.
"""

# p2p (GPU x GPU copy bandwidth and flag latency) runs only on hosts with >= 2 GPUs; elsewhere it records why
# it skipped and adds no table.
PROBES = ("placement", "latency", "l2map", "signal", "sync", "bandwidth", "p2p")

TABLE_COLUMNS = {
    "placement": {"launch": "int", "pid": "int", "smid": "int", "die": "int"},
    "latency": {"bytes": "int", "ns": "float", "cycles": "float", "level": "str"},
    "l2map": {"sm": "int", "region": "int", "ns": "float"},
    "l2_partition": {"sm": "int", "partition": "int"},
    "l2_region_home": {"region": "int", "partition": "int"},
    "signal": {"src_sm": "int", "dst_sm": "int", "ns": "float"},
    "barrier": {"ctas": "int", "warps": "int", "us": "float"},
    "flag": {"kind": "str", "us": "float"},
    "atomics": {"ctas": "int", "mops_per_s": "float"},
    "launch": {"mode": "str", "us": "float"},
    "bandwidth": {"sms": "int", "kind": "str", "GBps": "float"},
}

# Tables only an AMD scan writes (l2map_amd.py; unverified on hardware). Kept apart from TABLE_COLUMNS,
# which every scan has.
AMD_TABLE_COLUMNS = {
    "xcd_latency": {"src_xcd": "int", "dst_xcd": "int", "level": "str", "ns": "float"},
}
