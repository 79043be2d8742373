"""Instrumented launches (TRACE): one record per task, and (ATRACE) the sub-steps of each attention split.

kog.engine.trace turns the records into the time breakdown and a Perfetto trace. A task record is
[start ns, end ns, ns spent waiting, step << 40 | smid << 24 | task index, publish start ns, publish barrier
end ns]: the last two time the publish of held tiles right before the task (its CTA barrier, then the release's
fence; barrier end 0: nothing published). The default launch compiles none of this (TRACE and ATRACE are
constexprs).
"""
import triton
import triton.language as tl

from kog.engine.kernel.vendor import global_time_ns, sm_id


# int64 fields of a task record
TASK_RECORD = tl.constexpr(6)


@triton.jit
def trace_clock(TRACE: tl.constexpr, VENDOR: tl.constexpr):
    """The device clock in an instrumented launch; 0 in the others, which compile no clock read."""
    if TRACE:
        t = global_time_ns(VENDOR)
    else:
        t = tl.zeros([], dtype=tl.int64)
    return t


@triton.jit
def trace_task(tra, cta, n, t_start, waited, task, step, t_pub, t_bar, VENDOR: tl.constexpr):
    """The CTA's n-th task record of the launch."""
    t_end = global_time_ns(VENDOR)
    b = tra.buf + (tl.cast(cta, tl.int64) * tra.cap + n) * TASK_RECORD
    tl.store(b + 0, t_start)
    tl.store(b + 1, t_end)
    tl.store(b + 2, waited)
    tl.store(b + 3, (tl.cast(step, tl.int64) << 40) | (tl.cast(sm_id(VENDOR), tl.int64) << 24)
             | tl.cast(task, tl.int64))
    tl.store(b + 4, t_pub)
    tl.store(b + 5, t_bar)


@triton.jit
def attn_stamp(tra, cta, n, t, merged, step, task):
    """The CTA's n-th attention record: the split's start, input wait over, q/k/v read, split math done (its
    partials stored), arrival counted and end (after the merge if it merged) in t; 1 + whether it merged;
    step << 40 | task index. An empty split's wait / inputs / math stamps are its start."""
    b = tra.atr + (tl.cast(cta, tl.int64) * tra.atr_cap + n) * 8
    tl.store(b + 0, t[0])
    tl.store(b + 1, t[1])
    tl.store(b + 2, t[2])
    tl.store(b + 3, t[3])
    tl.store(b + 4, t[4])
    tl.store(b + 5, t[5])
    tl.store(b + 6, merged.to(tl.int64) + 1)     # 1: a record (clocks read 0 in the interpreter), 2: merged
    tl.store(b + 7, (tl.cast(step, tl.int64) << 40) | tl.cast(task, tl.int64))
