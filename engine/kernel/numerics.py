"""Where the kernel rounds: float32 activations by default, HF's model-dtype rounding points on request.

By default activations stay float32 from step to step (the model's math on the checkpoint's weights). What is
rounded to the model dtype is what must be: the KV cache, q for the tensor-core dot against it, and down's
input where the ring keeps it in registers as model-dtype words. The kernel's logits then sit close to the
float32 oracle (kog.engine.reference with compute_dtype=float32).

KOG_HF_ROUNDING=1 rounds wherever HF keeps a bf16 / fp16 tensor (norm outputs, projections, residuals, RoPE,
scores, logits): HF's function with its rounding noise. Read once at import, since Triton checks that a global
constexpr is unchanged since compile; the tensor-parallel engines share it, so TP and tp_compat stay equal.
"""
import os

import triton
import triton.language as tl

HF_ROUNDING: tl.constexpr = tl.constexpr(os.environ.get("KOG_HF_ROUNDING", "0") == "1")


@triton.jit
def rnd(x, DT: tl.constexpr):
    """Where HF keeps a bf16/fp16 tensor: round to the model dtype and back under HF_ROUNDING, else keep x."""
    if HF_ROUNDING:
        x = x.to(DT).to(tl.float32)
    return x
