"""Model shapes: one dataclass for every supported Llama-family architecture, and presets.

ModelConfig.from_hf(config.json dict) accepts LlamaForCausalLM (Llama 3.x, SmolLM2), Qwen2ForCausalLM
(q/k/v bias), Qwen3ForCausalLM (q/k RMSNorm) and MistralForCausalLM, and refuses anything else with a
ConfigError naming the field. PRESETS hold the exact shapes of real models; weights for them are seeded
random tensors (kog.engine.weights.random_weights), so benchmarks need no download.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from kog.errors import UsageError

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
DTYPES = ("bfloat16", "float16")
# float32 is a compute dtype for the reference oracle and CPU tests only (load_checkpoint(dtype=torch.float32));
# the engine runs the 16-bit DTYPES, and a float32 checkpoint is cast to bfloat16 by default.
COMPUTE_DTYPES = DTYPES + ("float32",)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


class ConfigError(UsageError):
    """A checkpoint or config kog cannot run; the message names the field or tensor."""


def check_checkpoint_file(path, what: str) -> None:
    """kog.fsutil.check_input_file for a file of a checkpoint: a FIFO or device node there is a ConfigError."""
    from kog.fsutil import InputPathError, check_input_file
    try:
        check_input_file(path, what)
    except InputPathError as e:
        raise ConfigError(str(e)) from None


@dataclass(frozen=True)
class ModelConfig:
    arch: str                         # "llama" | "mistral" | "qwen2" | "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None   # HF dict; rope_type "llama3" supported
    tie_word_embeddings: bool = False
    attention_bias: bool = False      # q/k/v projections carry a bias (Qwen2)
    qk_norm: bool = False             # per-head RMSNorm on q and k before RoPE (Qwen3)
    max_position_embeddings: int = 4096
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    dtype: str = "bfloat16"
    name: str = "custom"
    sliding_window: int | None = None  # Mistral: attend to the last `sliding_window` positions only

    # ---- derived shapes ---------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def qkv_size(self) -> int:
        return self.q_size + 2 * self.kv_size

    def matrices(self) -> list[tuple[str, int, int]]:
        """(name, rows N, cols K) of every matrix a decode step streams, in execution order."""
        H, I = self.hidden_size, self.intermediate_size
        out: list[tuple[str, int, int]] = []
        for layer in range(self.num_layers):
            out += [(f"layers.{layer}.qkv", self.qkv_size, H), (f"layers.{layer}.o", H, self.q_size),
                    (f"layers.{layer}.gate_up", 2 * I, H), (f"layers.{layer}.down", H, I)]
        out.append(("lm_head", self.vocab_size, H))
        return out

    def num_params(self) -> int:
        H = self.hidden_size
        n = sum(r * c for _, r, c in self.matrices())
        n += 0 if self.tie_word_embeddings else self.vocab_size * H     # embedding table
        n += self.num_layers * 2 * H + H                                # norms
        if self.attention_bias:
            n += self.num_layers * self.qkv_size
        if self.qk_norm:
            n += self.num_layers * 2 * self.head_dim
        return n

    @property
    def torch_dtype(self):
        import torch
        return getattr(torch, self.dtype)

    def weight_bytes_per_token(self) -> int:
        """Bytes a batch-1 decode step must read: every matrix once, plus one embedding row."""
        es = DTYPE_BYTES.get(self.dtype, 2)
        H = self.hidden_size
        n = sum(r * c for _, r, c in self.matrices()) + H + self.num_layers * 2 * H + H
        if self.attention_bias:
            n += self.num_layers * self.qkv_size
        if self.qk_norm:
            n += self.num_layers * 2 * self.head_dim
        return n * es

    def attention_span(self, max_seq: int) -> int:
        """Cache positions attention reads for a cache of max_seq: all of them, or the sliding window's."""
        return min(max_seq, self.sliding_window or max_seq)

    def replace(self, **kw) -> "ModelConfig":
        return dataclasses.replace(self, **kw)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["eos_token_id"] = list(self.eos_token_id)
        return d

    def validate(self) -> "ModelConfig":
        def need(cond: bool, field_: str, msg: str) -> None:
            if not cond:
                raise ConfigError(f"config field '{field_}': {msg}")
        need(self.arch in ARCHITECTURES.values(), "architectures", f"unsupported architecture {self.arch!r}")
        for f_ in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                   "num_kv_heads", "head_dim"):
            v = getattr(self, f_)
            need(isinstance(v, int) and v > 0, f_, f"must be a positive integer, got {v!r}")
        for f_ in ("rms_norm_eps", "rope_theta"):
            v = getattr(self, f_)
            need(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0, f_,
                 f"must be a finite number > 0, got {v!r}")
        mp = self.max_position_embeddings
        need(isinstance(mp, int) and mp > 0, "max_position_embeddings", f"must be a positive integer, got {mp!r}")
        need(self.num_heads % self.num_kv_heads == 0, "num_key_value_heads",
             f"{self.num_kv_heads} does not divide num_attention_heads {self.num_heads}")
        need(self.head_dim % 2 == 0, "head_dim", f"RoPE needs an even head_dim, got {self.head_dim}")
        need(self.dtype in COMPUTE_DTYPES, "torch_dtype",
             f"unsupported dtype {self.dtype!r} (supported: {', '.join(DTYPES)})")
        need(self.sliding_window is None or (isinstance(self.sliding_window, int) and self.sliding_window > 0),
             "sliding_window", f"must be a positive integer or null, got {self.sliding_window!r}")
        if self.rope_scaling is not None:
            rt = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            need(rt in ("llama3", "default", None), "rope_scaling",
                 f"rope_type {rt!r} is not supported (supported: llama3)")
            if rt == "llama3":
                for k in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
                    need(isinstance(self.rope_scaling.get(k), (int, float)), f"rope_scaling.{k}",
                         "missing or not a number (needed by rope_type llama3)")
        return self

    def _check_special_ids(self) -> "ModelConfig":
        """A checkpoint's eos/bos ids lie in its vocabulary (not part of validate(): a tensor-parallel shard's
        config has a slice of the vocabulary and the model's full-vocabulary ids)."""
        for f_, ids in (("eos_token_id", self.eos_token_id),
                        ("bos_token_id", () if self.bos_token_id is None else (self.bos_token_id,))):
            for t in ids:
                if not (isinstance(t, int) and 0 <= t < self.vocab_size):
                    raise ConfigError(f"config field '{f_}': token id {t!r} is outside the vocabulary "
                                      f"[0, {self.vocab_size})")
        return self

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], name: str = "custom") -> "ModelConfig":
        """Build from an HF config.json dict; ConfigError names the first bad or missing field."""
        if not isinstance(cfg, dict):
            raise ConfigError(f"config.json must hold a JSON object, not {type(cfg).__name__}")
        archs = cfg.get("architectures") or []
        if not archs:
            raise ConfigError("config field 'architectures' is missing")
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise ConfigError(f"config field 'architectures': must be a list of names, e.g. "
                              f"[\"LlamaForCausalLM\"], not {archs!r}")
        arch = ARCHITECTURES.get(archs[0])
        if arch is None:
            raise ConfigError(f"config field 'architectures': {archs[0]} is not supported "
                              f"(supported: {', '.join(ARCHITECTURES)})")

        def req(key: str):
            if key not in cfg or cfg[key] is None:
                raise ConfigError(f"config field '{key}' is missing")
            return cfg[key]

        def whole(key: str, v):
            """An integer field: 2048 or 2048.0, never 64.7 (int() would truncate it), a string or a bool."""
            if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not (
                    math.isfinite(v) and v.is_integer())):
                raise ConfigError(f"config field '{key}': must be an integer, got {v!r}")
            return int(v)

        def number(key: str, v):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ConfigError(f"config field '{key}': must be a number, got {v!r}")
            return float(v)

        if cfg.get("hidden_act", "silu") not in ("silu", "swish"):
            raise ConfigError(f"config field 'hidden_act': {cfg['hidden_act']!r} is not supported (supported: silu)")
        if cfg.get("mlp_bias"):
            raise ConfigError("config field 'mlp_bias': MLP biases are not supported")
        # Only Qwen2 carries q/k/v biases without an o_proj bias; in Llama/Mistral/Qwen3 attention_bias
        # would also add an o_proj bias, which no supported checkpoint has.
        attention_bias = bool(cfg.get("attention_bias", arch == "qwen2")) if arch == "qwen2" else bool(
            cfg.get("attention_bias", False))
        if attention_bias and arch != "qwen2":
            raise ConfigError(f"config field 'attention_bias': true is not supported for {archs[0]}")
        if cfg.get("use_sliding_window") and arch in ("qwen2", "qwen3"):
            raise ConfigError("config field 'use_sliding_window': per-layer sliding windows are not supported")
        sliding = cfg.get("sliding_window") if arch == "mistral" else None

        # transformers >= 5 writes rope_parameters {rope_theta, rope_type, ...} instead of rope_theta +
        # rope_scaling; read both layouts.
        rp = cfg.get("rope_parameters") or {}
        if not isinstance(rp, dict):
            raise ConfigError("config field 'rope_parameters': must be an object")
        rope_scaling = cfg.get("rope_scaling")
        if rope_scaling is None and rp.get("rope_type", "default") not in ("default", None):
            rope_scaling = {k: v for k, v in rp.items() if k != "rope_theta"}
        if rope_scaling is not None and not isinstance(rope_scaling, dict):
            raise ConfigError("config field 'rope_scaling': must be an object or null")
        if rope_scaling is not None and rope_scaling.get("rope_type", rope_scaling.get("type")) in ("default", None):
            rope_scaling = None
        rope_theta = cfg.get("rope_theta", rp.get("rope_theta", 10000.0))

        try:
            H, nh = whole("hidden_size", req("hidden_size")), whole("num_attention_heads", req("num_attention_heads"))
            eos = cfg.get("eos_token_id")
            eos_t = tuple(whole("eos_token_id", e) for e in eos) if isinstance(eos, list) else (
                (whole("eos_token_id", eos),) if eos is not None else ())
            bos = cfg.get("bos_token_id")
            dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
            head_dim = cfg.get("head_dim") or H // nh
            return cls(
                arch=arch, vocab_size=whole("vocab_size", req("vocab_size")), hidden_size=H,
                intermediate_size=whole("intermediate_size", req("intermediate_size")),
                num_layers=whole("num_hidden_layers", req("num_hidden_layers")),
                num_heads=nh, num_kv_heads=whole("num_key_value_heads", cfg.get("num_key_value_heads") or nh),
                head_dim=whole("head_dim", head_dim),
                rms_norm_eps=number("rms_norm_eps", cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=number("rope_theta", rope_theta),
                rope_scaling=rope_scaling,
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=attention_bias,
                qk_norm=arch == "qwen3",
                max_position_embeddings=whole("max_position_embeddings", cfg.get("max_position_embeddings", 4096)),
                bos_token_id=None if bos is None else whole("bos_token_id", bos), eos_token_id=eos_t,
                dtype=str(dtype), name=name,
                sliding_window=whole("sliding_window", sliding) if sliding is not None else None,
            ).validate()._check_special_ids()
        except (TypeError, ValueError) as e:
            raise ConfigError(f"config.json has a field of the wrong type: {e}") from None


_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}

PRESETS: dict[str, ModelConfig] = {
    # meta-llama/Llama-3.2-1B
    "llama-3.2-1b": ModelConfig("llama", 128256, 2048, 8192, 16, 32, 8, 64, 1e-5, 500000.0, _LLAMA3_ROPE,
                                True, False, False, 131072, 128000, (128001,), name="llama-3.2-1b"),
    # meta-llama/Llama-3.2-3B
    "llama-3.2-3b": ModelConfig("llama", 128256, 3072, 8192, 28, 24, 8, 128, 1e-5, 500000.0, _LLAMA3_ROPE,
                                True, False, False, 131072, 128000, (128001,), name="llama-3.2-3b"),
    # Qwen/Qwen2.5-1.5B
    "qwen2.5-1.5b": ModelConfig("qwen2", 151936, 1536, 8960, 28, 12, 2, 128, 1e-6, 1000000.0, None,
                                True, True, False, 131072, 151643, (151643,), name="qwen2.5-1.5b"),
    # Qwen/Qwen3-1.7B
    "qwen3-1.7b": ModelConfig("qwen3", 151936, 2048, 6144, 28, 16, 8, 128, 1e-6, 1000000.0, None,
                              True, False, True, 40960, 151643, (151645,), name="qwen3-1.7b"),
    # HuggingFaceTB/SmolLM2-1.7B
    "smollm2-1.7b": ModelConfig("llama", 49152, 2048, 8192, 24, 32, 32, 64, 1e-5, 130000.0, None,
                                True, False, False, 8192, 0, (0,), name="smollm2-1.7b"),
    # Qwen/Qwen2.5-3B
    "qwen2.5-3b": ModelConfig("qwen2", 151936, 2048, 11008, 36, 16, 2, 128, 1e-6, 1000000.0, None,
                              True, True, False, 32768, 151643, (151643,), name="qwen2.5-3b"),
    # meta-llama/Llama-3.1-8B
    "llama-3.1-8b": ModelConfig("llama", 128256, 4096, 14336, 32, 32, 8, 128, 1e-5, 500000.0,
                                {**_LLAMA3_ROPE, "factor": 8.0}, False, False, False, 131072, 128000, (128001,),
                                name="llama-3.1-8b"),
    # princeton-nlp/Sheared-LLaMA-2.7B: the ~2B-class model (2.7B, untied embeddings, head_dim 128)
    "sheared-llama-2.7b": ModelConfig("llama", 32000, 2560, 6912, 32, 20, 20, 128, 1e-5, 10000.0, None,
                                      False, False, False, 4096, 1, (2,), name="sheared-llama-2.7b"),
    # A tiny model for CPU tests and the interpreter (every code path, small shapes)
    "tiny": ModelConfig("llama", 512, 64, 128, 2, 4, 2, 16, 1e-5, 10000.0, None,
                        True, False, False, 256, 1, (2,), name="tiny"),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}: not a preset ({', '.join(PRESETS)}) "
                          f"and not a checkpoint directory") from None
