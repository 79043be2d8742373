"""Where each activation vector of a layer lives in the activation buffer (float32 elements), computed from the
shape's constexprs: kog.engine.monokernel.activation_offset is the same layout in Python.

A layer holds, in order: its input h, qkv, the attention output, hmid, the SiLU product, and under tensor
parallelism O's and down's partial sums. ACT_HOUT of layer l is ACT_H of layer l + 1; "layer" L (the LM
head's) holds only the final hidden vector. Arithmetic, not a table: a table entry read right after a wait or
an arrival is an L2 round trip on the critical path (an acquire invalidates the SM's L1), the attention
merge's output address among them.
"""
import triton
import triton.language as tl

from kog.engine.kernel.names import ACT_ATTN, ACT_DPART, ACT_H, ACT_HMID, ACT_HOUT, ACT_MLP, ACT_OPART, ACT_QKV


@triton.jit
def act_offset(layer, col: tl.constexpr, M, C):
    """Element offset of vector `col` (layout.ACT_*) of `layer`."""
    QKVS: tl.constexpr = M.QS + 2 * M.KVS
    PARTS: tl.constexpr = 2 * M.H if C.TP else 0
    STRIDE: tl.constexpr = M.H + QKVS + M.QS + M.H + M.I + PARTS
    if col == ACT_H:
        o = layer * STRIDE
    elif col == ACT_QKV:
        o = layer * STRIDE + M.H
    elif col == ACT_ATTN:
        o = layer * STRIDE + (M.H + QKVS)
    elif col == ACT_HMID:
        o = layer * STRIDE + (M.H + QKVS + M.QS)
    elif col == ACT_MLP:
        o = layer * STRIDE + (M.H + QKVS + M.QS + M.H)
    elif col == ACT_HOUT:
        o = (layer + 1) * STRIDE
    elif col == ACT_OPART:
        o = layer * STRIDE + (M.H + QKVS + M.QS + M.H + M.I)
    else:
        tl.static_assert(col == ACT_DPART, "unknown activation column")
        o = layer * STRIDE + (M.H + QKVS + M.QS + M.H + M.I + M.H)
    return o
