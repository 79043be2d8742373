# moved to kog.tune.bench; these names stay here while bench/*.py and tests/gpu/test_ring_gpu.py import them
from kog.tune.bench import copy_bandwidth_GBps, first_divergence, max_rel_err, reference_fp32_logits  # noqa: F401
