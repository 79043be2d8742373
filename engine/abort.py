"""The monokernel's error record: how a bounded wait that timed out stops every CTA instead of hanging.

sync word 0 is the abort flag every spin also polls; err holds [1, what, task, target, value], which
Monokernel._check_error turns into one clear line (what: a counter index, or -1 token flag, -2 grid barrier,
-3 start-up rendezvous, -4 weight-ring slot, -5 tagged qkv rows).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def record_abort(sync_ptr, err_ptr, what, task, target, value):
    """The first CTA to time out records [1, what, task, target, value] and raises the abort flag; a later
    one (or a wait that ended because another CTA aborted) records nothing."""
    if tl.atomic_cas(sync_ptr + 0, 0, 1) == 0:
        tl.store(err_ptr + 0, 1)
        tl.store(err_ptr + 1, what)
        tl.store(err_ptr + 2, task)
        tl.store(err_ptr + 3, target)
        tl.store(err_ptr + 4, value)
