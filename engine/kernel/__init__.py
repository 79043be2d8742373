"""The monokernel's Triton code, one module per idea.

    entry.py      the kernel: the token loop and the phase dispatch
    tasks.py      the GEMV tasks (qkv, O, gate_up, down, LM head) and their epilogues
    gemv.py       a task's GEMV, weights from the shared-memory ring or straight from global memory
    ring.py       the weight ring and the task rows in shared memory (bulk copies, mbarriers)
    attention.py  attention splits and their merge
    act.py        where each activation vector of a layer lives (offsets from the shape)
    sampling.py   in-kernel sampling (greedy, Gumbel-max, top-k / top-p)
    sync.py       bounded waits, readiness counters, tags, grid barriers
    exchange.py   tensor parallelism's cross-GPU exchange
    trace.py      instrumented launches' records
    numerics.py   where activations are rounded
    vendor.py     the NVIDIA / AMD / interpreter differences (inline asm)
    names.py      engine/layout.py's names as constexprs

Each part has its interpreter test (tests/test_kernel_parts.py); tests/test_monokernel.py runs the whole.
"""
from kog.engine.kernel.entry import monokernel

__all__ = ["monokernel"]
