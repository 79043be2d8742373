"""Every name the plan, the launcher and the kernel share, defined once.

The plan (plan.py, tp_plan.py) writes tables in these layouts, the launcher (monokernel.py) allocates the
buffers they index, and the kernel (kernel/) reads them through kernel/names.py, which binds each value below
to a Triton constexpr. Nothing else spells a column number or a sync-word index.

Plain Python: no torch or triton import, so the plan and its checker run anywhere.
"""
from __future__ import annotations

from collections import namedtuple

# ---- task types -------------------------------------------------------------------------------------------
T_QKV, T_ATTN, T_O, T_GU, T_DOWN, T_LM, T_BAR, T_XPUSH, T_XRED = range(9)
TASK_NAMES = {T_QKV: "qkv", T_ATTN: "attn", T_O: "o", T_GU: "gate_up", T_DOWN: "down", T_LM: "lm",
              T_BAR: "barrier", T_XPUSH: "xpush", T_XRED: "xred"}
GEMV_TYPES = (T_QKV, T_O, T_GU, T_DOWN, T_LM)

# ---- the task table: one row of ROW_WORDS int32 per task, each CTA's tasks in the order it runs them ------------
ROW_WORDS = 4
ROW_HEAD, ROW_TILE, ROW_RELEASE, ROW_WAIT = range(ROW_WORDS)
# ROW_HEAD = type | flags | layer << HEAD_LAYER_SHIFT
HEAD_TYPE_MASK = 63
HEAD_POINT_BIT = 6      # exchange tasks: 1 = after down, 0 = after O
HEAD_EARLY_BIT = 7      # O / down: the residual rows are proven ready before the input wait (plan.early_residual)
HEAD_LAYER_SHIFT = 8
# ROW_TILE: the row tile (attention: kv_head * splits + split; barrier: its number within the token; exchange:
# the chunk). ROW_RELEASE: the counter the task's output publishes (-1: none). ROW_WAIT: the first counter of
# the buffer the task reads (the counter of input row r is ROW_WAIT + r // rows_per_counter[that buffer]).

# ---- readiness-counter buffers of a layer (plan.layout columns, rows_per_counter entries) ---------------------
BUF_QKV, BUF_ATTN, BUF_HMID, BUF_ACT, BUF_HOUT, BUF_OPART, BUF_DPART = range(7)
BUF_NAMES = ("qkv", "attn", "hmid", "act", "h", "o_partial", "down_partial")
N_BUF_SINGLE = 5        # the single-GPU plan counts the first five; tensor parallelism adds the two partial sums
N_BUF = 7

# ---- activation vectors of a layer (monokernel.activation_offset, kernel/act.py) ------------------------------
# "Layer" L (the LM head's) has only ACT_H: the final hidden vector. ACT_HOUT of layer l is ACT_H of l + 1.
ACT_H, ACT_QKV, ACT_ATTN, ACT_HMID, ACT_MLP, ACT_HOUT, ACT_OPART, ACT_DPART = range(8)

# ---- weight offsets: woff[layer, column], elements into the packed weight buffer (the direct, ring-less path) --
W_QKV, W_O, W_GATE, W_UP, W_DOWN, W_LM = range(6)      # W_LM: on row L
WOFF_COLS = 8

# ---- small fp32 parameters: soff[layer, column], elements into the small buffer (0: absent) -------------------
P_BIAS, P_QNORM, P_KNORM, P_ATTN_NORM, P_FFN_NORM = range(5)
SOFF_COLS = 8

# ---- sync words (int32) --------------------------------------------------------------------------------------
S_ABORT = 0             # a wait timed out somewhere: every spin stops
S_TOK = 1               # tokens whose embedding is ready (the next token may start)
S_DONE = 2              # CTAs finished with the current token (monotonic)
S_BAR = 3               # grid-barrier arrivals (monotonic)
S_STOP = 4              # EOS seen
S_NTOK = 5              # tokens produced
S_SLOT = 16             # start-up rendezvous of the topology mapping
S_SAMPLE = 32           # SAMPLE_WORDS arrival words of the top-k / top-p search (kernel/sampling.py): round 0 (the
                        # grid's max logit and first draw), top-k's rounds (SAMPLE_ROUNDS words), then top-p's; the
                        # token's last CTA zeroes them
SAMPLE_WORDS = 32
S_ARR = 1024            # arrivals of attention splits, one word per (layer, KV head) (monotonic)

# ---- what a timed-out wait names in the error record (err = [1, what, task, target, value]) -----------------------
# what >= 0: a readiness counter. Peer flags of tensor parallelism: E_FLAG - flag index.
E_TOKEN, E_BARRIER, E_RENDEZVOUS, E_RING, E_TAG, E_SAMPLE = -1, -2, -3, -4, -5, -6
# not a wait: the token pick found no token (every logit NaN), err = [1, E_LOGITS, -1, step, picked id]
E_LOGITS = -7
E_FLAG = -16

# ---- the weight ring's shared memory (kernel/ring.py) ---------------------------------------------------------------
RING_BAR_BYTES = 1024   # the slots' mbarriers (8 bytes each) at the ring's start; the slots follow
ROW_BLOCK = 16          # task rows loaded per block into shared memory, two blocks in flight
ROW_AREA = 512          # byte offset of the two row blocks inside the mbarriers' region (<= 16 slots use 128 B)

# ---- the top-k / top-p search (kernel/sampling.py) -------------------------------------------------------------------
SAMPLE_CANDS = 32       # candidate thresholds per top-k round
SAMPLE_ROUNDS = 6       # top-k rounds at most
SAMPLE_P_ROUNDS = 12    # top-p rounds at most (each one draw tested against the nucleus)
SAMPLE_P_BOUNDS = 4     # per top-p round: the draw's value and 3 bounds above it, each with its mass and best score
# ActArgs.search (int64): top-k's rounds, SAMPLE_ROW each (per candidate its count, least value, greatest value
# below); round 0's best Gumbel score (one word at SAMPLE_PICK); top-p's rounds, SAMPLE_P_ROW each (the kept
# mass, then per bound the mass above it and the best score above it: one 128-byte line)
SAMPLE_ROW = 3 * SAMPLE_CANDS
SAMPLE_PICK = SAMPLE_ROUNDS * SAMPLE_ROW
SAMPLE_P_ROW = 16
SAMPLE_SEARCH = SAMPLE_PICK + SAMPLE_P_ROW + SAMPLE_P_ROUNDS * SAMPLE_P_ROW
assert 1 + SAMPLE_ROUNDS + SAMPLE_P_ROUNDS <= SAMPLE_WORDS and S_SAMPLE + SAMPLE_WORDS <= S_ARR
assert 1 + 2 * SAMPLE_P_BOUNDS <= SAMPLE_P_ROW

# ---- tensor parallelism: the per-rank peer table (int64), kernel/exchange.py ---------------------------------------
TP_RANK, TP_VOCAB_LO, TP_SAMPLE_FLAG = 0, 1, 2
TP_PEERS = 8            # first peer address; four blocks of G: receive buffers, flags, sample scores, sample tokens
TP_RECV, TP_FLAGS, TP_SCORES, TP_TOKENS = range(4)
FLAG_STRIDE = 32        # int32 per flag: one 128-byte line each (no false sharing between flags)

# ---- the kernel's argument groups (built by the launcher, read by field name in the kernel) ---------------------------
# Tensors and per-engine values; the per-launch run values are plain arguments (kernel/entry.py says why).
ModelArgs = namedtuple("ModelArgs", "w woff small soff embed cos sin cache")
ActArgs = namedtuple("ActArgs", "act part qkvt logits partial_v partial_i out forced eos search")
PlanArgs = namedtuple("PlanArgs", "rows cta_start rpc target cnt smid_tab ring_lo ring_sz gring grow peers")
SyncArgs = namedtuple("SyncArgs", "sync err timeout_ns")
TraceArgs = namedtuple("TraceArgs", "buf tokens cap atr atr_cap")
EngineArgs = namedtuple("EngineArgs", "max_seq window fnorm_off eps sm_scale attn_splits use_smid bar_per_tok")
# constexpr groups: the model's shape and the compiled configuration
Shape = namedtuple("Shape", "H I V L HD NKV G GP GH SP QS KVS HAS_BIAS QK_NORM")
# one GEMV phase: K, rows per task, columns per K step (the ring's chunk or the direct path's block), RMS-normed
# input, gate and up rows together, input kept in registers as float pairs (XRAW) or model-dtype words (XW),
# the weight matrix (woff column), the tensor-parallel slices its rows are reduced in (tp_compat), and the rows
# per readiness counter of its input buffer (the plan's rows_per_counter)
GemvSpec = namedtuple("GemvSpec", "K BN BK NORM GU XRAW XW WCOL RANKS R")
Tiling = namedtuple("Tiling", "WAIT QKV O GU DOWN LM BT SPLIT GPOW SAMPLE FILTER_BV TRACE ATRACE VENDOR TPC "
                    "RING SLOTB RING_SIZES BKC_X TAGQKV TP NR XR VR")
